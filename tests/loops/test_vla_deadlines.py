"""The VLA driver's wait on the learner's update has a deadline on the learner's liveness: a long update goes on
while the learner answers `stats` (from its watch thread), a stopped learner is named within `run.role_timeout_s`."""
import os
import signal
import time
from types import SimpleNamespace

import pytest
import ray
from omegaconf import OmegaConf

from rlfarm.loops.deadlines import RoleUnresponsive
from rlfarm.loops.vla import VLALoop


@ray.remote(concurrency_groups={"watch": 1})
class SlowLearner:
    """Stands in for VLALearner: an update of `seconds`, stats answered meanwhile from the watch thread."""

    def update(self, seconds: float) -> dict:
        time.sleep(seconds)
        return {"success_rate": 1.0}

    @ray.method(concurrency_group="watch")
    def stats(self) -> dict:
        return {"pid": os.getpid()}


class UpdateOnly(VLALoop):
    """The loop's update wait alone, around one learner (no workers, no servers)."""

    def __init__(self, learner, role_timeout_s: float):
        self.cfg = OmegaConf.create({"run": {"role_timeout_s": role_timeout_s}})
        self.learner, self._preempt = learner, False
        self.supervisor = SimpleNamespace(learner=SimpleNamespace(name="learner 0"))


def test_a_long_update_of_a_live_learner_is_waited_for_and_a_stopped_one_is_named(ray_cpu):
    learner = SlowLearner.remote()
    loop = UpdateOnly(learner, role_timeout_s=2.0)
    assert loop._update([4.0]) == {"success_rate": 1.0}  # longer than the deadline: the learner is alive
    pid = ray.get(learner.stats.remote())["pid"]
    started = time.monotonic()
    stopper = learner.update.remote(0.5)  # noqa: F841 - keeps the actor busy while it is stopped
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(RoleUnresponsive, match="learner 0 did not answer stats during its update within 2 s"):
            loop._update([30.0])
        assert time.monotonic() - started < 2.0 + 5.0
    finally:
        os.kill(pid, signal.SIGKILL)
