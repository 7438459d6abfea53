"""What the user watches: a rich live table on a terminal, a periodic log line elsewhere (CI, Slurm logs).
The off-policy view ends with where the time goes: the busy percent of runners/labelers/learner and the
bottleneck (rlfarm/telemetry/stages.py)."""
from __future__ import annotations

import logging
import sys
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rlfarm.telemetry.stages import busy_split

log = logging.getLogger("rlfarm")

ONPOLICY_COLUMNS = (
    ("updates", "updates", "{:,.0f}"), ("samples_per_s", "samples/s", "{:,.0f}"), ("reward", "reward", "{:.3f}"),
    ("reward_mean", "reward (last 10)", "{:.3f}"), ("kept_groups", "kept groups", "{:.2f}"),
    ("entropy", "entropy", "{:.2f}"), ("generated_tokens_per_s", "gen tok/s", "{:,.0f}"),
    ("step_s", "step s", "{:.2f}"), ("sync_s", "sync s", "{:.3f}"), ("wall_s", "wall s", "{:,.0f}"),
)
PPO_COLUMNS = (
    ("env_steps", "env steps", "{:,.0f}"), ("env_steps_per_s", "env steps/s", "{:,.0f}"), ("updates", "updates", "{:,.0f}"),
    ("episode_return_mean", "return (last 10)", "{:.1f}"), ("policy_loss", "policy loss", "{:.3f}"),
    ("value_loss", "value loss", "{:.3f}"), ("entropy", "entropy", "{:.2f}"), ("approx_kl", "KL", "{:.4f}"),
    ("eta_s", "ETA s", "{:,.0f}"),
)
COLUMNS = (  # (row key, title, format)
    ("env_steps", "env steps", "{:,.0f}"), ("env_steps_per_s", "env steps/s", "{:,.0f}"),
    ("labeled_per_s", "labeled/s", "{:,.0f}"), ("updates_per_s", "updates/s", "{:,.1f}"),
    ("labeling_lag_s", "label lag s", "{:.3f}"), ("buffer_size", "buffer", "{:,.0f}"),
    ("episode_return_mean", "return (last 10)", "{:.1f}"), ("transitions_quarantined", "quarantined", "{:,.0f}"),
    ("worker_restarts", "restarts", "{:,.0f}"), ("eta_s", "ETA s", "{:,.0f}"),
)
# Where the time goes (off-policy): under the table as one line, at the end of the plain log line.
STAGE_FIELDS = (("busy", "busy % run/lab/learn", "{}"), ("bottleneck", "bottleneck", "{}"))
DERIVED = {"busy": busy_split}  # fields computed from the row, not logged in it


def _fmt(fmt: str, value) -> str:
    return "-" if value is None else fmt.format(value)


class LiveView:
    def __init__(self, title: str, mode: str | bool = "auto", log_every_s: float = 10.0, columns: str = "offpolicy"):
        self.columns = {"onpolicy": ONPOLICY_COLUMNS, "ppo": PPO_COLUMNS}.get(columns, COLUMNS)
        self.footer = STAGE_FIELDS if self.columns is COLUMNS else ()
        console = Console(file=sys.stdout)
        self.enabled = console.is_terminal if mode == "auto" else bool(mode)
        self.title, self.log_every_s, self._last_log = title, log_every_s, 0.0
        self.live = Live(console=console, refresh_per_second=2, transient=False) if self.enabled else None

    def __enter__(self) -> "LiveView":
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)

    def update(self, row: dict) -> None:
        row = {**row, **{key: derive(row) for key, derive in DERIVED.items()}}
        if self.live:
            footer = " · ".join(f"{title}: {_fmt(fmt, row.get(key))}" for key, title, fmt in self.footer)
            table = Table(title=self.title, title_justify="left", caption=footer or None, caption_justify="left")
            for _, title, _ in self.columns:
                table.add_column(title, justify="right")
            table.add_row(*(_fmt(fmt, row.get(key)) for key, _, fmt in self.columns))
            self.live.update(table)
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s:  # also into train.log, on a terminal or not
            self._last_log = now
            log.info("  ".join(f"{title}={_fmt(fmt, row.get(key))}" for key, title, fmt in self.columns + self.footer))
