"""Give a restarted off-policy worker back what its death lost. Ray restarts a dead runner or labeler by running
its constructor again: it comes back without peers, policy or work. A labeler gets its learner ranks back and its
chunks again (every runner re-sends what it had sent it and not had acked); a runner gets its labelers, the newest
policy, and what is left of its share of the env steps (rlfarm/loops/ledger.py), its chunk ids in a range no
earlier incarnation used."""
from __future__ import annotations

from typing import Callable

from rlfarm.loops.ledger import Ledger
from rlfarm.loops.roles import OffPolicyRoles
from rlfarm.loops.supervision import Supervisor, Worker

Ask = Callable[[list[tuple[str, object]], str], list]  # named roles' answers to `what`, within the deadline


class Rewiring:
    def __init__(self, roles: OffPolicyRoles, supervisor: Supervisor, ledger: Ledger, ask: Ask):
        self.roles, self.supervisor, self.ledger, self.ask = roles, supervisor, ledger, ask

    def rewire(self, worker: Worker, incarnation: int) -> dict:
        """Re-wire `worker`'s new incarnation and start its run(); returns what the recovery record says of it."""
        return (self._labeler if worker.kind == "labeler" else self._runner)(worker, incarnation)

    def _labeler(self, worker: Worker, incarnation: int) -> dict:
        self.ask([(worker.name, worker.actor.set_learner.remote(self.roles.learner_ranks, incarnation))], "set_learner")
        worker.done = worker.actor.run.remote()
        runners = self.supervisor.of("env_runner")
        resent = self.ask([(r.name, r.actor.redispatch.remote(worker.index)) for r in runners], "redispatch")
        return {"chunks_resent": sum(resent)}

    def _runner(self, worker: Worker, incarnation: int) -> dict:
        ledger, learners = self.ledger, self.roles.learners
        ledger.runner_lost(worker)
        stats = learners.merged(self.ask(learners.stats_calls(), "stats"))  # every rank's chunks of the runner
        remaining = ledger.successor_budget(worker.index, stats)
        learning = stats["updates"] > 0  # past learning_starts: the successor acts with the policy at once
        self.ask([(worker.name, worker.actor.set_labelers.remote(self.roles.labelers))], "set_labelers")
        learners.lead.push_weights.remote()
        worker.done = worker.actor.run.remote(remaining, ledger.first_seq(incarnation),
                                              ledger.runner_key(worker, incarnation), 0 if learning else None)
        return {"env_steps_left": remaining}
