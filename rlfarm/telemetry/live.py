"""What the user watches: a rich live table on a terminal, a periodic log line elsewhere (CI, Slurm logs).
The columns are the family's (rlfarm/telemetry/columns.py, named by its record in rlfarm/families.py); the
off-policy view ends with where the time goes: the busy percent of runners/labelers/learner and the bottleneck
(rlfarm/telemetry/stages.py).

The table stays at the bottom of the terminal with everything else printed above it: while it is live, every
logging handler bound to the terminal (Hydra's console handler) is swapped for a rich handler on the live console
with the same format, level and filters; what looks up sys.stdout/stderr when it writes (print, warnings, Ray's
log_to_driver lines from the workers, Ray's own driver logger) goes through the live's redirection of both. A raw
write under the table would move the cursor the table redraws from, leaving copies of its header behind.

Rates and the ETA shown (table and periodic log line) are over the last few seconds (rlfarm/telemetry/rates.py);
the metrics rows keep the loops' own numbers."""
from __future__ import annotations

import logging
import sys
import time

import threading

from rich.console import Console
from rich.highlighter import NullHighlighter
from rich.live import Live
from rich.logging import RichHandler
from rich.table import Table

from rlfarm.telemetry.columns import Columns
from rlfarm.telemetry.rates import WINDOW_S, SmoothedRate
from rlfarm.telemetry.stages import busy_split

log = logging.getLogger("rlfarm")

DERIVED = {"busy": busy_split}  # fields computed from the row, not logged in it
# rate shown → the growing count it is the rate of (both in the row, with wall_s as the clock)
RATE_COUNTS = {"env_steps_per_s": "env_steps", "labeled_per_s": "transitions_labeled", "updates_per_s": "updates",
               "samples_per_s": "samples"}
RATES_NOTE = f"rates over the last {WINDOW_S:g} s"


def _fmt(fmt: str, value) -> str:
    return "-" if value is None else fmt.format(value)


class _OneWriterConsole(Console):
    """A console whose prints run one at a time, under the live's own lock. Rich computes a print's cursor-up over
    the table drawn last, then renders the table anew, outside any lock; a log line printed while the refresh thread
    draws could so move up over a table not yet drawn (or drawn at another height) and leave a torn copy of the
    header behind (seen under load in CI). One re-entrant lock for both keeps the order the live already takes:
    refresh → print."""

    lock: threading.RLock

    def print(self, *args, **kwargs) -> None:
        with self.lock:
            super().print(*args, **kwargs)


class LiveView:
    def __init__(self, title: str, mode: str | bool = "auto", log_every_s: float = 10.0, *, columns: Columns,
                 total_env_steps: int | None = None):
        """`mode`: run.live (auto: live when stdout is a terminal). `columns`: what to show of a row, the family's
        (`run.family.columns`). `total_env_steps`: the budget the ETA shown is counted towards (None: the row's own
        eta_s)."""
        self.columns, self.footer, self.kept = columns.shown, columns.footer, set(columns.kept)
        console = _OneWriterConsole(file=sys.stdout)
        self.enabled = console.is_terminal if mode == "auto" else bool(mode)
        self.title, self.log_every_s, self._last_log = title, log_every_s, 0.0
        self.total_env_steps = total_env_steps
        self.rates = {key: SmoothedRate() for key in RATE_COUNTS}
        self.live = Live(console=console, refresh_per_second=2, transient=False, redirect_stdout=True,
                         redirect_stderr=True) if self.enabled else None
        console.lock = getattr(self.live, "_lock", None) or threading.RLock()  # rich's Live has held one since 10.x
        self._swapped: list[tuple[logging.Logger, logging.Handler, logging.Handler]] = []

    def __enter__(self) -> "LiveView":
        if self.live:
            if self.live.console.is_terminal:  # a forced live view into a file (run.live=true) draws no region
                self._swapped = _route_terminal_logs(self.live.console)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)
            _restore_handlers(self._swapped)  # after the live stopped: a record from another thread meanwhile still
            self._swapped = []                # goes through the rich handler, which now prints plainly

    def update(self, row: dict) -> None:
        row = self.shown(row)
        if self.live:
            self.live.update(self.table(row, self.live.console.width))
        now = time.monotonic()
        if now - self._last_log >= self.log_every_s:  # also into train.log, on a terminal or not
            self._last_log = now
            log.info("  ".join(f"{title}={_fmt(fmt, row.get(key))}" for key, title, fmt in self.columns + self.footer))

    def table(self, shown: dict, width: int | None = None) -> Table:
        """The table of a shown row (`shown`), with the rates' window and, off-policy, where the time goes under it;
        its columns those that fit `width` (None: all)."""
        stages = (f"{title}: {_fmt(fmt, shown.get(key))}" for key, title, fmt in self.footer)
        table = Table(title=self.title, title_justify="left", caption=" · ".join([RATES_NOTE, *stages]),
                      caption_justify="left")
        columns = self.fitting(shown, width)
        for _, title, _ in columns:
            table.add_column(title, justify="right")
        table.add_row(*(_fmt(fmt, shown.get(key)) for key, _, fmt in columns))
        return table

    def fitting(self, shown: dict, width: int | None) -> tuple:
        """The columns whose title and value fit `width` whole: the family's kept ones (its progress and return),
        then the others in order, as far as they fit; a narrow terminal would otherwise cut every one short."""
        if width is None:
            return self.columns
        needs = {key: max(len(title), len(_fmt(fmt, shown.get(key)))) + 3 for key, title, fmt in self.columns}  # │ ·x·
        left = width - 1 - sum(needs[key] for key in self.kept if key in needs)
        chosen = set(self.kept)
        for key, _, _ in self.columns:
            if key not in chosen and needs[key] <= left:
                chosen.add(key)
                left -= needs[key]
        return tuple(field for field in self.columns if field[0] in chosen)

    def shown(self, row: dict) -> dict:
        """The row as shown: rates over the last few seconds (the row's own until two rows span some time), the ETA
        from the shown env-step rate, and the derived fields."""
        shown = dict(row)
        for rate_key, count_key in RATE_COUNTS.items():
            if rate_key in row and count_key in row and "wall_s" in row:
                rate = self.rates[rate_key].add(float(row["wall_s"]), float(row[count_key]))
                shown[rate_key] = row[rate_key] if rate is None else rate
        env_rate = shown.get("env_steps_per_s")
        if self.total_env_steps is not None and "eta_s" in row and env_rate:
            shown["eta_s"] = max(self.total_env_steps - row["env_steps"], 0) / env_rate
        return shown | {key: derive(shown) for key, derive in DERIVED.items()}


def _route_terminal_logs(console: Console) -> list[tuple[logging.Logger, logging.Handler, logging.Handler]]:
    """Swap every plain stream handler bound to stdout/stderr (on the root logger or a named one) for a rich handler
    on `console` that prints the same line above the live table; returns what to swap back. Subclasses are left
    alone: Ray's, for one, looks up sys.stderr when it writes, which the live redirects."""
    terminal = {id(stream) for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    loggers = [logging.getLogger(), *(logger for logger in logging.root.manager.loggerDict.values()
                                      if isinstance(logger, logging.Logger))]
    swapped = []
    for logger in loggers:
        for index, handler in enumerate(logger.handlers):
            if type(handler) is logging.StreamHandler and id(handler.stream) in terminal:
                twin = _rich_twin(handler, console)
                logger.handlers[index] = twin
                swapped.append((logger, handler, twin))
    return swapped


def _rich_twin(handler: logging.Handler, console: Console) -> RichHandler:
    """A rich handler that prints what `handler` would: its formatter (time, level, name) makes the line, so the
    terminal shows the same lines as train.log, uncoloured; level and filters as `handler`'s."""
    twin = RichHandler(level=handler.level, console=console, show_time=False, show_level=False, show_path=False,
                       markup=False, rich_tracebacks=False, highlighter=NullHighlighter())
    twin.setFormatter(handler.formatter or logging.Formatter())
    for kept in handler.filters:
        twin.addFilter(kept)
    return twin


def _restore_handlers(swapped: list[tuple[logging.Logger, logging.Handler, logging.Handler]]) -> None:
    for logger, handler, twin in swapped:
        if twin in logger.handlers:
            logger.handlers[logger.handlers.index(twin)] = handler
