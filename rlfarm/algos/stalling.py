"""A SAC agent that stalls on purpose, for chaos tests of the off-policy driver (and for users who want to see
what rlfarm does when the learner hangs: a deadlocked collective, a compile that never ends): update number
`stall_at` sleeps `stall_s` first, once per process; every update is otherwise plain SAC.

    rlfarm train algo.agent._target_=rlfarm.algos.stalling.StallingAgent +algo.agent.stall_at=300 \\
        +algo.agent.stall_s=120 run.role_timeout_s=10
        # the driver names the learner after 10 s without progress and keeps watching; SIGTERM and
        # run.max_wall_s still end the run in time

The learner calls `update` on its eager path (CPU, or algo.agent.graph_updates=0); CUDA-graph replays bypass it."""
from __future__ import annotations

import time

import torch

from rlfarm.algos.sac import SACAgent


class StallingAgent(SACAgent):
    def __init__(self, *args, stall_at: int = 1000, stall_s: float = 60.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.stall_at, self.stall_s = int(stall_at), float(stall_s)
        self._stalled = False

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._stalled and self.updates >= self.stall_at:
            self._stalled = True
            time.sleep(self.stall_s)
        return super().update(batch)
