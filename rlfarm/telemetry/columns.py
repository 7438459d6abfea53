"""What the live view shows of a family's metrics rows: one `Columns` per kind of row, named by the family
records (rlfarm/families.py) and drawn by rlfarm/telemetry/live.py. Plain data: no import of the view."""
from __future__ import annotations

from dataclasses import dataclass

Field = tuple[str, str, str]  # (row key, title, format)


@dataclass(frozen=True)
class Columns:
    """The table's columns, and the fields under it (one line: where the time goes, when the rows say). On a
    narrow terminal the columns in `kept` stay and the others are shown as far as they fit."""
    shown: tuple[Field, ...]
    footer: tuple[Field, ...] = ()
    kept: tuple[str, ...] = ()


# Off-policy rows (runners → labelers → learner): throughput of each stage, the buffer, faults and restarts;
# under the table, the busy percent of runners/labelers/learner and the bottleneck (rlfarm/telemetry/stages.py).
OFFPOLICY_COLUMNS = Columns(
    shown=(("env_steps", "env steps", "{:,.0f}"), ("env_steps_per_s", "env steps/s", "{:,.0f}"),
           ("labeled_per_s", "labeled/s", "{:,.0f}"), ("updates_per_s", "updates/s", "{:,.1f}"),
           ("labeling_lag_s", "label lag s", "{:.3f}"), ("buffer_size", "buffer", "{:,.0f}"),
           ("episode_return_mean", "return (last 10)", "{:.1f}"),
           ("transitions_quarantined", "quarantined", "{:,.0f}"), ("worker_restarts", "restarts", "{:,.0f}"),
           ("eta_s", "ETA s", "{:,.0f}")),
    footer=(("busy", "busy % run/lab/learn", "{}"), ("bottleneck", "bottleneck", "{}")),
    kept=("env_steps", "episode_return_mean", "eta_s"))

# Gymnasium PPO's cycles: env steps, the return and the PPO losses.
PPO_COLUMNS = Columns(shown=(
    ("env_steps", "env steps", "{:,.0f}"), ("env_steps_per_s", "env steps/s", "{:,.0f}"), ("updates", "updates", "{:,.0f}"),
    ("episode_return_mean", "return (last 10)", "{:.1f}"), ("policy_loss", "policy loss", "{:.3f}"),
    ("value_loss", "value loss", "{:.3f}"), ("entropy", "entropy", "{:.2f}"), ("approx_kl", "KL", "{:.4f}"),
    ("eta_s", "ETA s", "{:,.0f}")), kept=("env_steps", "episode_return_mean", "eta_s"))

# Rows counted by update, of groups generated and rewarded (the LLM and VLA families): the reward, the groups kept,
# generation speed, staleness and where the step's time goes.
UPDATE_COLUMNS = Columns(shown=(
    ("updates", "updates", "{:,.0f}"), ("samples_per_s", "samples/s", "{:,.0f}"), ("reward", "reward", "{:.3f}"),
    ("reward_mean", "reward (last 10)", "{:.3f}"), ("kept_groups", "kept groups", "{:.2f}"),
    ("entropy", "entropy", "{:.2f}"), ("generated_tokens_per_s", "gen tok/s", "{:,.0f}"),
    ("step_s", "step s", "{:.2f}"), ("sync_s", "sync s", "{:.3f}"), ("staleness", "stale", "{:.0f}"),
    ("engine_busy", "engine busy", "{:.0%}"), ("learner_busy", "learner busy", "{:.0%}"), ("wall_s", "wall s", "{:,.0f}")),
    kept=("updates", "reward", "reward_mean"))
