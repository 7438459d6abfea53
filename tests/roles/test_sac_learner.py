"""The SAC learner role in process (no Ray): checkpoints and loads are served between update bursts while data
keeps arriving, weights travel with the acks, exact update counts at any update-to-data ratio, stage times.

The learner is the real class on CPU with tiny networks. Its runners are `RecordingRunner`s: the learner only
calls `runner.ack.remote(seqs, published)` and `runner.receive_weights.remote(published)` (the EnvRunner side is
tested with the real runner in tests/loops); recording them in process keeps these tests at a few seconds."""
import math
import threading
import time
from fractions import Fraction

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import RecordingRunner, read_summary, train
from rlfarm.config import compose
from rlfarm.roles import chunk_learner
from rlfarm.roles.chunk_learner import UPDATES_PER_BURST
from rlfarm.roles.sac_learner import SACLearner
from rlfarm.sync.publisher import WeightPublisher

OBS, ACT, CHUNK = 5, 2, 32
TINY = ["algo.batch_size=32", "algo.buffer_size=20000", "algo.learning_starts=64",
        "model.actor.hidden=[16,16]", "model.critic.hidden=[16,16]"]


def make_learner(*overrides, runners=1, learner_class=SACLearner, device=None):
    cfg = compose("train", [*TINY, *overrides])
    spaces = {"obs_dim": OBS, "act_dim": ACT, "action_low": -np.ones(ACT, np.float32),
              "action_high": np.ones(ACT, np.float32)}
    learner = learner_class(OmegaConf.to_container(cfg.algo, resolve=True), OmegaConf.to_container(cfg.model),
                            spaces, 0, 1, **({"device": device} if device else {}))
    handles = [RecordingRunner() for _ in range(runners)]
    learner.set_runners(handles)
    return learner, handles


def chunk(seq, runner=0, size=CHUNK, version=0):
    """A labeled chunk as a labeler delivers it: float64 observations, bool terminations, as envs give them."""
    rng = np.random.default_rng(seq)
    meta = {"runner": runner, "seq": seq, "size": size, "policy_version": version, "incarnation": 0}
    return meta, {"obs": rng.standard_normal((size, OBS)), "next_obs": rng.standard_normal((size, OBS)),
                  "action": rng.uniform(-1, 1, (size, ACT)).astype(np.float32),
                  "reward": rng.standard_normal(size).astype(np.float32), "terminated": rng.random(size) < 0.05}


class SteadyFeed:
    """A labeler that keeps the learner owing updates: it stores a chunk whenever fewer than `owed` updates
    are owed, so updates are owed at every burst boundary for as long as it runs (a data path that keeps
    moving), while the backlog stays small enough to finish in a moment once it stops. It stops by itself
    after `max_s`, so that a learner that cannot answer while data flows (the old one) is not waited on forever."""

    def __init__(self, learner, owed=2 * CHUNK, max_s=20.0):
        self.learner, self.owed, self.max_s, self.seq = learner, owed, max_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)

    def _feed(self):
        deadline = time.monotonic() + self.max_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.learner._updates_owed() < self.owed and self.learner.inbox.qsize() < 2:
                self.learner.store([chunk(self.seq)])
                self.seq += 1
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def started(learner):
    """run() in a thread; returns a function that stops it and waits for it."""
    result = {}
    thread = threading.Thread(target=lambda: result.update(learner.run()), daemon=True)
    thread.start()

    def finish(timeout=30):
        learner.stop()
        thread.join(timeout)
        assert not thread.is_alive(), "run() did not return after stop()"
        return result
    return finish


def call_within(seconds, work):
    """work() in a thread: (returned in time, its result, seconds taken). A call that does not return in time
    is left to finish in the background (the caller then stops what blocks it)."""
    out, started_at = {}, time.monotonic()
    thread = threading.Thread(target=lambda: out.update(value=work()), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), out.get("value", (None, None)), time.monotonic() - started_at, thread


def wait_until(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_save_is_answered_at_the_next_burst_boundary_while_updates_are_owed(tmp_path):
    """The 4x H100 freeze (issue 15): save() waited on a lock that the update loop took again right after
    every burst while updates were owed, and got it only when a thread switch happened to fall between the
    loop's release and its next acquire: after 1 burst or after hundreds (on this CPU up to ~160, 2 s; on the
    GPU run, minutes). Now the loop serves the snapshot at its next burst boundary: a save sees at most the
    burst in progress (one more if one begins while it queues; the bound leaves room for a busy machine)."""
    learner, _ = make_learner()
    finish = started(learner)
    lags, took = [], []
    with SteadyFeed(learner, max_s=60):
        assert wait_until(lambda: learner.updates > 50), "the learner never started updating"
        for attempt in range(30):  # many: the old lock let one through now and then, by chance
            path = str(tmp_path / "step.pt")
            # From a thread of its own, as Ray runs an actor's calls (max_concurrency > 1)
            answered, (before, returned), seconds, _ = call_within(
                30, lambda: (learner.updates, learner.save(path, {"epoch": attempt}, with_buffer=True)))
            assert answered and returned == path
            took.append(seconds)
            state = torch.load(path, weights_only=True)
            lags.append(state["updates"] - before)
            assert state["extra"] == {"epoch": attempt} and not state.get("mid_update")
            # one consistent moment: the buffer holds exactly what the counters say was stored
            assert state["buffer"]["storage"]["size"] == state["stored"] == CHUNK * len(state["stored_ids"])
        owed = learner._updates_owed()
    finish()
    assert owed > 0, "the feed did not keep updates owed: the test did not test anything"
    assert max(took) < 10, f"save() took {max(took):.1f} s while updates were owed"
    assert max(lags) <= 4 * UPDATES_PER_BURST, f"snapshots came {lags} updates after the requests"


def test_a_loop_stuck_inside_a_burst_is_checkpointed_mid_update(tmp_path, monkeypatch):
    """A burst far longer than the snapshot wait (here: huge batches; on a GPU, compiling): the save does not
    wait for it, and the checkpoint says it was taken mid-update."""
    monkeypatch.setattr(chunk_learner, "SAVE_SNAPSHOT_WAIT_S", 0.1)
    learner, _ = make_learner("algo.batch_size=65536", "algo.utd_ratio=0.25")
    for seq in range(3):  # 96 transitions, 64 before learning starts: floor(0.25 * 33) = 8 updates, one burst
        learner.store([chunk(seq)])
    finish = started(learner)
    assert wait_until(lambda: learner.stored == 3 * CHUNK)
    time.sleep(0.05)  # into the burst (8 updates of ~0.1 s)
    started_at = time.monotonic()
    path = learner.save(str(tmp_path / "stuck.pt"), with_buffer=False)
    took = time.monotonic() - started_at
    updates_then = learner.updates
    finish()
    state = torch.load(path, weights_only=True)
    assert updates_then < 8, "the burst was over before the save gave up waiting: make the batch larger"
    assert state["mid_update"] is True and state["updates"] <= updates_then and "buffer" not in state
    assert took < 5
    assert learner.updates == 8


def test_load_is_served_while_updates_are_owed(tmp_path):
    source, _ = make_learner()
    for seq in range(4):
        source._store([chunk(1000 + seq)])
    source._update(10)
    path = source.save(str(tmp_path / "source.pt"), {"from": "source"}, with_buffer=True)
    learner, runners = make_learner()
    finish = started(learner)
    with SteadyFeed(learner):
        assert wait_until(lambda: learner.updates > 20)
        answered, extra, took, _ = call_within(10, lambda: learner.load(path))
        assert answered, f"load() did not return within 10 s while updates were owed (took {took:.1f} s)"
        assert {(0, 1000 + seq) for seq in range(4)} <= learner.stored_ids
    finish()
    assert extra == {"from": "source"}
    assert runners[0].pushed[-1] == source.version + 1  # the restored weights went out at once, to every runner


def test_weights_travel_with_acks_not_a_fan_out_per_publication():
    learner, runners = make_learner("algo.publish_every=4", runners=3)
    seq = 0
    for _ in range(6):
        for runner in range(3):
            learner.store([chunk(seq, runner=runner)])
            seq += 1
    finish = started(learner)
    assert wait_until(lambda: all(len(r.acked) == 6 for r in runners))
    result = finish()
    assert result["updates"] == 6 * 3 * CHUNK - 64 + 1
    for runner in runners:
        assert runner.pushed == [1]  # receive_weights: the initial weights only
        assert runner.carried and runner.carried == sorted(set(runner.carried))  # newer with each ack, never again
        assert runner.carried[-1] > 1
    assert max(r.newest for r in runners) <= learner.version
    stats = learner.stats()
    assert stats["policy_version"] == learner.version >= result["updates"] // (4 * UPDATES_PER_BURST)
    published = learner.publish()  # the learner role's newest publication: what the acks carried, or newer
    assert published is learner.publisher.published and max(r.newest for r in runners) <= published[1] <= learner.version


@pytest.mark.parametrize("utd, batch, chunks", [(0.25, 2048, 10), (0.1, 512, 10), (0.29, 64, 10), (2.0, 32, 3)])
def test_exact_update_counts_and_every_credit_back_at_any_ratio(utd, batch, chunks):
    """Large batches and ratios below one (many envs), or above: floor(ratio × (stored − learning_starts + 1))
    updates exactly (0.29 × 100 is 28.999999999999996 in floats), and every chunk acked."""
    learner, runners = make_learner(f"algo.utd_ratio={utd}", f"algo.batch_size={batch}", runners=2)
    finish = started(learner)
    for seq in range(chunks):
        for runner in range(2):
            learner.store([chunk(seq, runner=runner, size=CHUNK + 5 * runner)])
    result = finish(60)
    stored = chunks * (2 * CHUNK + 5)
    assert result == {"updates": math.floor(Fraction(str(utd)) * (stored - 64 + 1)), "stored": stored}
    assert [sorted(r.acked) for r in runners] == [list(range(chunks))] * 2


def test_stats_report_stage_times_progress_and_owed_updates():
    learner, _ = make_learner()
    stats = learner.stats()
    assert stats["owed"] == 0 and set(stats["stage_s"]) == {"update", "store", "publish", "idle", "checkpoint"}
    for seq in range(4):
        learner.store([chunk(seq)])
    finish = started(learner)
    assert wait_until(lambda: learner.stored == 4 * CHUNK)
    assert learner.stats()["owed"] <= 4 * CHUNK - 64 + 1
    finish()
    stats = learner.stats()
    assert stats["owed"] == 0 and stats["updates"] == 4 * CHUNK - 64 + 1
    assert stats["stage_s"]["update"] > 0 and stats["stage_s"]["store"] > 0 and stats["stage_s"]["publish"] > 0
    assert time.time() - 30 < stats["last_progress_at"] <= time.time()


def test_stored_rows_are_the_chunks_in_float32():
    learner, _ = make_learner()
    meta, data = chunk(7)
    learner._store([(meta, data)])
    fields = learner.buffer.storage.fields
    assert all(field.dtype == torch.float32 for field in fields.values())
    assert torch.equal(fields["obs"][:CHUNK], torch.from_numpy(data["obs"].astype(np.float32)))
    assert torch.equal(fields["terminated"][:CHUNK], torch.from_numpy(data["terminated"].astype(np.float32)))


def test_a_stage_in_progress_counts_up_to_now():
    """A burst longer than the driver's interval shows as time updating while it runs, and stage times never
    go back."""
    learner, _ = make_learner("algo.batch_size=65536", "algo.utd_ratio=0.25")
    for seq in range(3):
        learner.store([chunk(seq)])
    finish = started(learner)
    assert wait_until(lambda: learner.stats()["stage_s"]["update"] > 0.05)
    during = learner.stats()
    finish()
    assert during["updates"] < 8  # still inside the one burst (8 updates)
    after = learner.stats()["stage_s"]
    assert all(after[stage] >= during["stage_s"][stage] for stage in after)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_publisher_publishes_the_weights_as_of_the_offer(device):
    """The copy off the device is queued behind the updates and read later by the publishing thread: it holds
    the weights as they were at the offer, not as later updates left them; publish_now supersedes offers."""
    learner, _ = make_learner(device=device)
    actor, publisher = learner.agent.actor, WeightPublisher(learner.agent.actor.state_dict, learner.agent.device)
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.fill_(1.0)
        publisher.offer(5)
        for parameter in actor.parameters():
            parameter.fill_(2.0)  # an update after the offer
    assert wait_until(lambda: publisher.published is not None and publisher.published[1] == 5)
    (state,), _ = publisher.published
    assert all(bool((state[name] == 1.0).all()) for name, _ in actor.named_parameters())
    publisher.offer(6)
    publisher.publish_now(7)
    time.sleep(0.2)  # room for offer 6 to be (wrongly) published after 7
    (state,), version = publisher.published
    assert version == 7 and all(bool((state[name] == 2.0).all()) for name, _ in actor.named_parameters())
    publisher.close()


@pytest.mark.gpu
def test_graphed_learner_on_cuda_at_a_large_batch_and_low_ratio(tmp_path):
    """The CUDA-graph path at many-env settings: batch 4096, 0.25 updates per transition (2 graph groups of 8
    per 64-transition chunk), exact counts, every credit back, weights riding on the acks, a checkpoint."""
    learner, runners = make_learner("algo.utd_ratio=0.25", "algo.batch_size=4096", "algo.agent.compile=false",
                                    "algo.agent.graph_updates=8", device="cuda", runners=2)
    assert learner.graphed is not None
    finish = started(learner)
    for seq in range(20):
        for runner in range(2):
            learner.store([chunk(seq, runner=runner, size=64 + 3 * runner)])
    assert wait_until(lambda: learner.updates > 100, 120)
    path = learner.save(str(tmp_path / "cuda.pt"), with_buffer=True)
    result = finish(120)
    stored = 20 * (2 * 64 + 3)
    assert result == {"updates": (stored - 64 + 1) // 4, "stored": stored}
    assert learner.graphed._graphed is not None  # the groups ran as graph replays
    assert [sorted(r.acked) for r in runners] == [list(range(20))] * 2
    assert all(r.carried and r.carried[-1] > 1 for r in runners)
    state = torch.load(path, weights_only=True)
    assert state["updates"] > 100 and not state.get("mid_update")
    assert all(math.isfinite(learner.stats()[name]) for name in ("critic_loss", "actor_loss", "alpha"))


def test_large_batch_low_ratio_through_the_pipeline(tmp_path):
    """`rlfarm train` with many-env settings (update-to-data ratio 0.25, batch 2048): exact update count,
    every transition stored once, the run ends (credits came back)."""
    out = train(tmp_path / "run", "total_env_steps=1500", "algo.utd_ratio=0.25", "algo.batch_size=2048",
                "algo.learning_starts=500", "algo.chunk_steps=64", "model.actor.hidden=[32,32]",
                "model.critic.hidden=[32,32]", "run.checkpoint=false", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["transitions_produced"] == summary["transitions_stored"] == 1500
    assert summary["updates"] == (1500 - 500 + 1) // 4
