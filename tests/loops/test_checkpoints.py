"""The checkpoint side every resumable loop shares (rlfarm/loops/checkpoints.py): periodic checkpoints (written at
once, or requested and landed later while the loop goes on), and SIGTERM → preemption even when a role died of the
same signal (Slurm signals every process of the job)."""
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from helpers import wait_for
from rlfarm.errors import Preempted
from rlfarm.loops.checkpoints import PeriodicCheckpoints


class Loop(PeriodicCheckpoints):
    def __init__(self, tmp_path, learner_alive=True, every_updates=2):
        self.cfg = OmegaConf.create({"run": {"checkpoint_every_updates": every_updates, "checkpoint_every_min": None}})
        self.run = SimpleNamespace(dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
        self.run.checkpoint_dir.mkdir()
        self.learner_alive = learner_alive
        self._start_checkpoints()

    def checkpoint(self, name="final.pt", with_buffer=False):
        if not self.learner_alive:
            raise RuntimeError("ActorUnavailableError: the actor is temporarily unavailable")
        path = self.run.checkpoint_dir / name
        path.write_text(f"buffer={with_buffer}")
        return str(path)


class WritingElsewhere(Loop):
    """The off-policy loop's way: `start_checkpoint` asks for the save, which is written on another thread (the
    learner's) once `may_write` is set, while the loop goes on."""

    def __init__(self, tmp_path):
        super().__init__(tmp_path)
        self.writer = ThreadPoolExecutor(1)
        self.may_write = threading.Event()
        self.requested: list[str] = []

    def start_checkpoint(self, name):
        self.requested.append(name)
        return self.writer.submit(lambda: self.may_write.wait(30) and self.checkpoint(name))


def test_periodic_checkpoints_keep_the_newest_two(tmp_path):
    loop = Loop(tmp_path)
    for updates in range(1, 9):
        loop._maybe_checkpoint(updates)
        time.sleep(0.01)
    assert sorted(p.name for p in loop.run.checkpoint_dir.iterdir()) == ["step_000000006.pt", "step_000000008.pt"]


def test_a_resumed_loop_counts_the_next_checkpoint_from_the_checkpoint_it_resumed(tmp_path):
    loop = Loop(tmp_path, every_updates=4)
    loop.schedule_checkpoints_from(8)  # what a resume from a checkpoint at update 8 does
    for updates in range(9, 13):
        loop._maybe_checkpoint(updates)
    assert sorted(p.name for p in loop.run.checkpoint_dir.iterdir()) == ["step_000000012.pt"]


def test_a_checkpoint_in_flight_does_not_hold_the_loop_and_lands_later(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rlfarm")
    loop = WritingElsewhere(tmp_path)
    loop.checkpoint_late_s = 0.0  # warn about it at once
    began = time.monotonic()
    for updates in range(1, 9):
        loop._maybe_checkpoint(updates)
    assert time.monotonic() - began < 5  # the loop never waited for the write (it is held back)
    assert loop.requested == ["step_000000002.pt"]  # one in flight at most
    assert caplog.text.count("the learner has not written it after") == 1
    assert not any(loop.run.checkpoint_dir.iterdir())

    loop.may_write.set()
    assert wait_for(lambda: loop._in_flight[1].done(), 10)
    loop._maybe_checkpoint(9)  # lands step 2, then asks for step 9 (due: 2 updates since step 2)
    assert "checkpoint " + str(loop.run.checkpoint_dir / "step_000000002.pt") in caplog.text
    assert wait_for(lambda: loop._in_flight[1].done(), 10)
    loop._maybe_checkpoint(10)
    assert loop.requested == ["step_000000002.pt", "step_000000009.pt"] and loop._in_flight is None
    assert sorted(p.name for p in loop.run.checkpoint_dir.iterdir()) == ["step_000000002.pt", "step_000000009.pt"]
    loop.writer.shutdown()


def test_a_failure_after_sigterm_is_a_preemption_with_preempted_pt(tmp_path):
    loop = Loop(tmp_path)
    loop.request_preemption()
    with pytest.raises(Preempted) as caught:
        with loop.until_preempted(with_buffer=True):
            raise RuntimeError("a runner died with the job's SIGTERM")
    assert caught.value.checkpoint.endswith("preempted.pt")
    assert (loop.run.checkpoint_dir / "preempted.pt").read_text() == "buffer=True"


def test_a_learner_killed_by_the_signal_resumes_from_the_newest_checkpoint_on_disk(tmp_path):
    loop = Loop(tmp_path)
    loop._maybe_checkpoint(2)
    loop.learner_alive = False
    # the role's failure reaches the loop before this process's own SIGTERM handler has run
    threading.Timer(0.3, loop.request_preemption).start()
    with pytest.raises(Preempted) as caught:
        with loop.until_preempted():
            raise RuntimeError("the learner's socket closed")
    assert caught.value.checkpoint.endswith("step_000000002.pt")
    assert not (loop.run.checkpoint_dir / "preempted.pt").exists()


def test_a_failure_without_sigterm_stays_a_failure(tmp_path):
    loop = Loop(tmp_path)
    with pytest.raises(RuntimeError, match="reward model"):
        with loop.until_preempted():
            raise RuntimeError("the reward model raised")


def test_preempted_before_any_checkpoint_says_a_resume_starts_over(tmp_path):
    loop = Loop(tmp_path, learner_alive=False)
    loop.request_preemption()
    with pytest.raises(Preempted, match="starts over"):
        with loop.until_preempted():
            raise RuntimeError("everything died")


def test_the_first_ctrl_c_checkpoints_and_a_second_stops_at_once(tmp_path):
    import os
    import signal

    loop = Loop(tmp_path)
    before = signal.getsignal(signal.SIGINT)
    with loop.stopping_on_signals():
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: a flag, as SIGTERM sets; the loop goes on to its checkpoint
        with pytest.raises(Preempted, match=f"interrupted: checkpoint .*preempted.pt written; continue with: "
                                            f"rlfarm train resume={tmp_path}$") as caught:
            loop._after_update(1)
        assert caught.value.interrupted
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the second: now
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before  # the next run of a sweep starts with the handlers it had


def test_sigterm_advice_is_the_command_that_resumes(tmp_path):
    loop = Loop(tmp_path)
    loop.request_preemption()
    with pytest.raises(Preempted, match=f"^preempted: .* continue with: rlfarm train resume={tmp_path}$") as caught:
        loop._after_update(1)
    assert not caught.value.interrupted
