"""An off-policy run's ledger of runner incarnations: what dead ones did, so counters survive a restart and the
run never takes more than `total_env_steps`.

Ray restarts a dead actor by running its constructor again, so it comes back with empty state: no counters, no
chunks. What its dead incarnations did comes from two sources: the learner counts settled transitions per
(runner, incarnation key) and delivered ones per (labeler, incarnation), and a runner's last stats report says how
many env steps it took. `Ledger` adds those to the live incarnations' own counts (`dead_env_steps`,
`settled_by_dead`, `delivered_by_dead`) and gives a restarted runner what is left of its share of the env steps
(`successor_budget`, `tighten_budgets`).

Chunk ids (seqs) never collide: those of the k-th resume of a run begin at k·SEQS_PER_EPOCH, those of a runner's
i-th restart within it i·SEQS_PER_INCARNATION further on, and the learner files a chunk under its seq's
incarnation key (`incarnation_key`)."""
from __future__ import annotations

from rlfarm.loops.supervision import Supervisor, Worker

SEQS_PER_EPOCH = 10**9        # chunk seqs of the k-th resume of a run begin at k·10⁹ ...
SEQS_PER_INCARNATION = 10**7  # ... and those of a runner's i-th restart within it at i·10⁷: ids never collide
MAX_INCARNATIONS = SEQS_PER_EPOCH // SEQS_PER_INCARNATION


def first_seq(epoch: int, incarnation: int) -> int:
    return epoch * SEQS_PER_EPOCH + incarnation * SEQS_PER_INCARNATION


def incarnation_key(epoch: int, incarnation: int) -> int:
    """What the learner files a runner's chunks under: seq // SEQS_PER_INCARNATION."""
    return first_seq(epoch, incarnation) // SEQS_PER_INCARNATION


def even_shares(env_steps: int, runners: int) -> list[int]:
    """Each runner's share of `env_steps`: equal, the first ones one more where it does not divide."""
    return [env_steps // runners + (i < env_steps % runners) for i in range(runners)]


class Ledger:
    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.epoch = 0                          # the run's resume count: part of every runner incarnation key
        self.shares: list[int] = []             # env steps each runner index takes in this epoch
        # (runner index, incarnation key) of each dead runner incarnation → the env steps it last reported.
        self._reported_by_dead: dict[tuple[int, int], int] = {}
        self._budgets: dict[int, int] = {}      # runner index → the env-step budget its live incarnation got

    def start_epoch(self, epoch: int, shares: list[int]) -> None:
        """The run (or its `epoch`-th resume) starts: runner i takes shares[i] env steps."""
        self.epoch, self.shares = epoch, shares

    def runner_key(self, worker: Worker, incarnation: int | None = None) -> int:
        """The key the learner files this runner incarnation's chunks under (default: the live one)."""
        return incarnation_key(self.epoch, worker.incarnation if incarnation is None else incarnation)

    def first_seq(self, incarnation: int) -> int:
        """The first chunk seq of a runner incarnation in this epoch."""
        return first_seq(self.epoch, incarnation)

    # -- counts of dead incarnations ---------------------------------------------------------------------
    def runner_lost(self, worker: Worker) -> None:
        """A runner incarnation died: keep the env steps it last reported."""
        self._reported_by_dead[(worker.index, self.runner_key(worker))] = int(worker.stats.get("env_steps", 0))

    def successor_budget(self, index: int, learner: dict) -> int:
        """Env steps the next incarnation of runner `index` may take: its share less what the dead ones took."""
        self._budgets[index] = self._runner_budget(index, learner)
        return self._budgets[index]

    def tighten_budgets(self, learner: dict) -> None:
        """A dead runner's last chunks can reach the learner after its successor started: lower the
        successor's step budget by them, so the run never takes more than total_env_steps."""
        for worker in self.supervisor.of("env_runner"):
            if worker.index in self._budgets:
                budget = self._runner_budget(worker.index, learner)
                if budget < self._budgets[worker.index]:
                    self._budgets[worker.index] = budget
                    worker.actor.set_budget.remote(budget)

    def dead_env_steps(self, learner: dict) -> int:
        """Env steps all dead runner incarnations took (this epoch)."""
        return sum(self._dead_runner_steps(index, learner) for index in {i for i, _ in self._reported_by_dead})

    def settled_by_dead(self, learner: dict) -> int:
        """Transitions stored or quarantined that dead runner incarnations produced (this epoch)."""
        live = {(w.index, self.runner_key(w)) for w in self.supervisor.of("env_runner")}
        return sum(n for key, n in learner["settled_by_runner"].items() if key not in live)

    def delivered_by_dead(self, learner: dict) -> int:
        """Transitions dead labeler incarnations delivered to the learner."""
        live = {(w.index, w.incarnation) for w in self.supervisor.of("labeler")}
        return sum(n for key, n in learner["delivered_by_labeler"].items() if key not in live)

    def _dead_runner_steps(self, index: int, learner: dict) -> int:
        """Env steps the dead incarnations of runner `index` took: what they last reported, or more if more of
        their chunks reached the learner since (the report is up to one metrics interval old)."""
        settled = learner["settled_by_runner"]
        return sum(max(reported, settled.get(key, 0)) for key, reported in self._reported_by_dead.items()
                   if key[0] == index)

    def _runner_budget(self, index: int, learner: dict) -> int:
        return max(self.shares[index] - self._dead_runner_steps(index, learner), 0)

