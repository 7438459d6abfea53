"""The off-policy run's metrics row and summary, from the roles' newest stats: counters that survive restarts and
resumes, rates over the last interval, the learner's own numbers, and per stage where the time went
(rlfarm/telemetry/stages.py)."""
from __future__ import annotations

import time

import numpy as np
import psutil

from rlfarm.loops.ledger import Ledger
from rlfarm.loops.progress import Progress
from rlfarm.loops.supervision import Supervisor, Worker
from rlfarm.telemetry.stages import KINDS, StageShares

# What a metrics row takes of the learner's own numbers: SAC's losses; an actor-learner's losses, V-trace's mean ρ
# and the policy lag of the chunks its batches took (weight versions), with what the lag bound dropped.
LEARNER_METRICS = ("critic_loss", "actor_loss", "alpha", "entropy", "policy_loss", "value_loss", "clip_fraction",
                   "rho_mean", "grad_norm", "policy_lag_mean", "policy_lag_max", "chunks_dropped_lag",
                   "transitions_dropped_lag", "learner_ranks")
SUMMARY_KEYS = ("env_steps", "transitions_produced", "transitions_labeled", "transitions_stored",
                "transitions_quarantined", "transitions_relabeled", "reward_retries", "reward_last_error", "updates",
                "episodes", "episode_return_mean", "duplicates", "policy_version", "worker_restarts")


class OffPolicyMetrics:
    def __init__(self, supervisor: Supervisor, ledger: Ledger, progress: Progress, total_env_steps: int):
        self.supervisor, self.ledger, self.progress, self.total = supervisor, ledger, progress, total_env_steps
        # What the learner had settled before this epoch: the runners' and labelers' own counts start at zero.
        self.offset = {"env_steps": 0, "produced": 0, "labeled": 0}
        self.stages = StageShares()
        self.first_step_at = float("inf")  # time.time() of the first env step any runner took (startup_s)
        self._previous: dict | None = None

    def resumed(self, learner: dict) -> int:
        """A resume: the counters continue from what the learner had settled (returned) and stored."""
        settled = accounted(learner)
        self.offset = {"env_steps": settled, "produced": settled, "labeled": learner["stored"]}
        return settled

    def row(self, fresh: list[Worker]) -> dict:
        """One metrics row from every role's newest counters (rates over the last interval); `fresh`: the roles at
        work that answered stats this tick (their stage times). Counters add up the live workers' own counts and,
        from the learner, what dead incarnations delivered."""
        sup, ledger, off = self.supervisor, self.ledger, self.offset
        learner = sup.learner.stats
        runners = [w.stats for w in sup.of("env_runner")]
        self.first_step_at = min([self.first_step_at, *(s["first_step_at"] for s in runners if s.get("first_step_at"))])
        labelers = [w.stats for w in sup.of("labeler")]
        live = lambda stats, key: sum(s.get(key, 0) for s in stats)  # noqa: E731 - a restarting worker has {}
        now, session_s = time.monotonic(), self.progress.session_s
        ledger.tighten_budgets(learner)
        counters = {"env_steps": off["env_steps"] + live(runners, "env_steps") + ledger.dead_env_steps(learner),
                    "produced": off["produced"] + live(runners, "produced") + ledger.settled_by_dead(learner),
                    "labeled": off["labeled"] + live(labelers, "labeled") + ledger.delivered_by_dead(learner)
                    - learner["duplicate_transitions"],
                    "stored": learner["stored"], "updates": learner["updates"], "t": now}
        start = {**counters, **off, "t": now - session_s}  # this epoch's start
        prev, self._previous = self._previous or start, counters
        dt = max(now - prev["t"], 1e-9)
        rate = lambda key: max(counters[key] - prev[key], 0) / dt  # noqa: E731
        lags = [l["labeling_lag_s"] for l in labelers if l.get("labeling_lag_s", 0) > 0]
        losses = {k: learner[k] for k in LEARNER_METRICS if k in learner}
        # per stored transition over the interval: the reward trained on beside the env's own (a learned reward's gap)
        rewards = {k: learner.get(k) for k in ("labeled_reward_mean", "env_reward_mean", "reward_gap_mean")}
        return {
            "env_steps": counters["env_steps"], "wall_s": round(self.progress.wall_s, 3),
            "env_steps_per_s": rate("env_steps"), "labeled_per_s": rate("labeled"), "updates_per_s": rate("updates"),
            "labeling_lag_s": float(np.mean(lags)) if lags else None,
            "labeled_fraction": counters["labeled"] / max(counters["produced"], 1),
            "transitions_produced": counters["produced"], "transitions_labeled": counters["labeled"],
            "transitions_stored": counters["stored"], "updates": counters["updates"],
            "transitions_relabeled": learner["duplicate_transitions"],
            "buffer_size": learner["buffer_size"], "policy_version": learner["policy_version"],
            "policy_staleness": learner["policy_staleness"], "duplicates": learner["duplicates"],
            "transitions_quarantined": learner["quarantined"],
            "reward_retries": live(labelers, "retries"),
            "reward_last_error": next((l["last_error"] for l in labelers if l.get("last_error")), None),
            "reward_call_s": max((l.get("in_call_s", 0.0) for l in labelers), default=0.0),  # the longest call now
            "worker_restarts": len(sup.recoveries),
            "episodes": self.progress["episodes"],
            "episode_return_mean": self.progress.window_mean(),
            "eta_s": (self.total - counters["env_steps"]) / max(counters["env_steps"] - off["env_steps"], 1) * session_s,
            **rewards, **losses, **reward_model_row(labelers),
            **self.stages.row({kind: [w.stats for w in fresh if w.kind == kind] for kind in KINDS},
                              late=self._late_kinds(fresh)),
        }

    def _late_kinds(self, fresh: list[Worker]) -> tuple[str, ...]:
        """Kinds of role at work none of which answered this tick's stats request in time."""
        at_work = self.supervisor.running([self.supervisor.learner, *self.supervisor.workers])
        answered = {w.kind for w in fresh}
        return tuple(kind for kind in KINDS if kind not in answered and any(w.kind == kind for w in at_work))

    def summary(self, row: dict, target: dict) -> dict:
        """summary.json's numbers from the last row; `target`: algo.target_return and whether it was reached."""
        unlabeled = row["transitions_produced"] - row["transitions_labeled"] - row["transitions_quarantined"]
        dropped = {k: row[k] for k in ("transitions_dropped_lag", "learner_ranks") if k in row}
        return {k: row[k] for k in SUMMARY_KEYS} | target | dropped | {
            "transitions_unlabeled": max(unlabeled, 0), "wall_s": round(self.progress.wall_s, 2),
            "restarts": self.progress["epoch"], "startup_s": startup_s(self.first_step_at),
            "recoveries": self.supervisor.recoveries}


def reward_model_row(labelers: list[dict]) -> dict:
    """The reward models' own numbers (`RewardModel.stats()`, under "reward_model" in each labeler's stats) across the
    labelers: counts summed, flags true only where every labeler's is, other numbers averaged over the labelers that
    have one (e.g. a distilled reward's agreement with its teacher)."""
    own = [l["reward_model"] for l in labelers if l.get("reward_model")]
    row = {}
    for key in dict.fromkeys(k for stats in own for k in stats):
        values = [stats[key] for stats in own if stats.get(key) is not None]
        if values and all(isinstance(v, bool) for v in values):
            row[key] = all(values)
        elif values and all(isinstance(v, int) for v in values):
            row[key] = sum(values)
        else:
            row[key] = float(np.mean(values)) if values else None
    return row


JOB_STARTED_AT: list[float] = []  # a sweep's job after its first: when it started (the process started with the sweep)


def job_started(at: float) -> None:
    """A later job of a sweep run in this process (Hydra's basic launcher) counts its start-up from `at`."""
    JOB_STARTED_AT[:] = [at]


def startup_s(first_step_at: float) -> float | None:
    """Seconds from the command's start (this process's, or its sweep job's: `job_started`) to the first env step
    of any runner."""
    if first_step_at == float("inf"):
        return None
    return round(first_step_at - (JOB_STARTED_AT or [psutil.Process().create_time()])[0], 2)


def accounted(learner_stats: dict) -> int:
    """Transitions the learner has settled: stored, or reported quarantined by a labeler."""
    return learner_stats["stored"] + learner_stats["quarantined"]
