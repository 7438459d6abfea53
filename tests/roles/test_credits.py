"""A runner's credits without Ray: spent per chunk, back on ack (once), waited for, handed again on redispatch."""
import threading

from rlfarm.roles.credits import Credits


class FakeLabeler:
    def __init__(self):
        self.got = []
        outer = self

        class Submit:
            def remote(self, meta, ref):
                outer.got.append((meta["seq"], ref))

        self.submit = Submit()


def test_credits_are_spent_per_chunk_returned_on_ack_and_chunks_resent_to_a_restarted_labeler():
    credits, labelers, stop = Credits(2), [FakeLabeler(), FakeLabeler()], threading.Event()
    for seq in range(2):
        assert credits.take(stop)
        credits.send({"seq": seq}, f"ref{seq}", labelers)
    assert len(credits) == 2 and labelers[0].got == [(0, "ref0")] and labelers[1].got == [(1, "ref1")]
    stop.set()
    assert not credits.take(stop)  # none left: the wait ends only with the stop
    credits.acked([0, 0, 7])  # a seq acked twice and one never sent give back one credit
    assert len(credits) == 1 and credits.take(stop)
    assert not credits.take(stop)
    assert credits.redispatch(1, labelers) == 1 and labelers[1].got == [(1, "ref1"), (1, "ref1")]
    assert credits.redispatch(0, labelers) == 0  # chunk 0 was acked: nothing to resend
    credits.give_back()
    assert credits.take(stop)
