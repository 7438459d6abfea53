"""The live view as a user sees it: one steady table at the bottom of a real terminal, log lines above it, rates
over the last few seconds (issue 21, item 5).

The training run happens in a pseudo-terminal of 160x40; its output is replayed on a small terminal model (enough
of VT100 for what rich writes: cursor up/down/column, erase line/screen) into every line the terminal ever held,
scrollback included, so a header left behind by a torn redraw is counted."""
import fcntl
import logging
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from helpers import ENV, metrics_rows

from rich.console import Console

from rlfarm.families import FAMILIES, OFFPOLICY
from rlfarm.telemetry.live import RATES_NOTE, LiveView
from rlfarm.telemetry.rates import SmoothedRate

COLS, ROWS = 160, 40
TITLE = "rlfarm · sac · Pendulum-v1 · local"
CHECKPOINT = re.compile(r"\] - checkpoint\s+\S*(step_\d+\.pt)")  # the log line, however the path wraps
CSI = re.compile(r"\x1b\[([?0-9;]*)([A-Za-z])|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>78]")


class Terminal:
    """Lines written so far (scrollback + screen) and a cursor that cannot leave the screen (the last ROWS lines)."""

    def __init__(self, cols: int = COLS, rows: int = ROWS):
        self.cols, self.rows = cols, rows
        self.lines: list[list[str]] = [[]]
        self.row = self.col = 0

    @property
    def top(self) -> int:
        return max(len(self.lines) - self.rows, 0)

    def feed(self, text: str) -> None:
        at = 0
        for escape in CSI.finditer(text):
            self._write(text[at:escape.start()])
            if escape.group(2):
                self._control(escape.group(1), escape.group(2))
            at = escape.end()
        self._write(text[at:])

    def text(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.lines]

    def _write(self, chars: str) -> None:
        for char in chars:
            if char == "\r":
                self.col = 0
            elif char == "\n":
                self._line_feed()
            elif char == "\b":
                self.col = max(self.col - 1, 0)
            elif char.isprintable():
                if self.col >= self.cols:  # xterm wraps when the next character comes, not at the margin
                    self.col = 0
                    self._line_feed()
                line = self.lines[self.row]
                line.extend(" " * (self.col + 1 - len(line)))
                line[self.col] = char
                self.col += 1

    def _line_feed(self) -> None:
        self.row += 1
        if self.row == len(self.lines):
            self.lines.append([])

    def _control(self, params: str, command: str) -> None:
        if params.startswith("?"):  # cursor shown/hidden, modes: nothing to draw
            return
        numbers = [int(n) if n else 0 for n in params.split(";")]
        n = max(numbers[0], 1)
        line = self.lines[self.row]
        if command == "A":
            self.row = max(self.row - n, self.top)
        elif command == "B":
            self.row = min(self.row + n, len(self.lines) - 1)
        elif command == "C":
            self.col += n
        elif command == "D":
            self.col = max(self.col - n, 0)
        elif command == "G":
            self.col = n - 1
        elif command == "K":
            mode = numbers[0]
            if mode == 0:
                del line[self.col:]
            elif mode == 1:
                line[:self.col + 1] = " " * min(self.col + 1, len(line))
            else:
                line.clear()
        elif command == "J" and numbers[0] in (2, 3):
            for index in range(self.top, len(self.lines)):
                self.lines[index] = []


def run_in_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run `argv` with a pseudo-terminal of COLSxROWS as its stdin/stdout/stderr; its exit code and all it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
    env = {**ENV, "TERM": "xterm-256color", "COLUMNS": str(COLS), "LINES": str(ROWS)}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    output = bytearray()
    try:
        while chunk := _read(master):
            output += chunk
        code = proc.wait(timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, output.decode("utf-8", errors="replace")


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: every process holding the terminal has exited
        return b""


def table_cells(screen: list[str]) -> dict[str, str]:
    """Column title → value of the table's one row (the heavy ┃ rule marks the header, │ the row under it)."""
    header = next(i for i, line in enumerate(screen) if "┃" in line)
    row = next(line for line in screen[header + 1:] if "│" in line)
    titles = [cell.strip() for cell in screen[header].strip("┃").split("┃")]
    return dict(zip(titles, (cell.strip() for cell in row.strip("│").split("│"))))


def test_one_table_with_log_lines_above_it_in_a_real_terminal(tmp_path):
    run_dir = tmp_path / "run"
    code, output = run_in_terminal(
        [sys.executable, "-m", "rlfarm.cli", "train", f"hydra.run.dir={run_dir}", "run.live=true",
         "total_env_steps=192", "algo.learning_starts=64", "run.metrics_interval_s=0.25",
         "run.checkpoint_every_updates=32"], timeout=300)  # a checkpoint line every few redraws
    terminal = Terminal()
    terminal.feed(output)
    lines = terminal.text()
    assert code == 0, "\n".join(lines[-30:])
    rows = metrics_rows(run_dir)
    assert len(rows) >= 3, rows  # several redraws, each a chance to tear

    # one table, header once, in everything the terminal ever showed (a torn redraw leaves copies in scrollback)
    assert sum(TITLE in line for line in lines) == 1, "\n".join(lines)
    assert sum("┃" in line and "env steps/s" in line for line in lines) == 1, "\n".join(lines)
    title_at = next(i for i, line in enumerate(lines) if TITLE in line)
    logged_at = next(i for i, line in enumerate(lines) if "[rlfarm][INFO] - env steps=" in line)
    done_at = next(i for i, line in enumerate(lines) if "[rlfarm][INFO] - Done:" in line)
    assert logged_at < title_at < done_at, "\n".join(lines)  # run's log lines above the table, the summary below
    # every checkpoint train.log names is named on the terminal, above the table (a redraw erased them before)
    checkpoints = CHECKPOINT.findall((run_dir / "train.log").read_text())
    assert checkpoints and checkpoints == CHECKPOINT.findall("\n".join(lines[:title_at]))
    assert all("┃" not in line and "│" not in line for line in lines[:title_at]), "\n".join(lines)

    # the table on the final screen shows the rate over the last 5 s of the rows, not the last row's own rate
    screen = lines[-ROWS:]
    assert TITLE in "\n".join(screen) and RATES_NOTE in "\n".join(screen)
    smoothed = SmoothedRate()
    for row in rows:
        expected = smoothed.add(row["wall_s"], row["env_steps"])
    assert table_cells(screen)["env steps/s"] == f"{expected:,.0f}"


def chunked_counts(rate: float, chunk: int, interval_s: float, ticks: int) -> list[tuple[float, int]]:
    """(time, count) every `interval_s` of a count that grows at `rate` but arrives `chunk` at a time."""
    return [(i * interval_s, int(rate * i * interval_s // chunk) * chunk) for i in range(ticks)]


def test_a_rate_counted_in_whole_chunks_does_not_jump_by_2x():
    samples = chunked_counts(rate=48.0, chunk=32, interval_s=1.0, ticks=30)
    raw = [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(samples, samples[1:])]
    assert min(raw) == 32 and max(raw) == 64  # what one-interval rates showed (issue 21)
    rate = SmoothedRate(window_s=5.0)
    shown = [rate.add(t, count) for t, count in samples][6:]  # once the window is full
    assert max(shown) / min(shown) < 1.25
    assert all(abs(value - 48.0) / 48.0 < 0.15 for value in shown)


def test_rows_slower_than_the_window_get_the_rate_between_the_last_two():
    rate = SmoothedRate(window_s=5.0)
    assert rate.add(0.0, 0) is None
    assert rate.add(20.0, 400) == 20.0
    assert rate.add(30.0, 1000) == 60.0
    assert rate.add(1.0, 5000) is None  # the clock went back (a new process): no rate across the gap


def test_the_plain_log_line_shows_the_smoothed_rate_and_eta(caplog):
    view = LiveView("t", mode=False, log_every_s=0.0, columns=OFFPOLICY.columns, total_env_steps=10_000)
    caplog.set_level(logging.INFO, logger="rlfarm")
    with view:
        for t, count in chunked_counts(rate=48.0, chunk=32, interval_s=1.0, ticks=8):
            raw = 64.0 if t % 2 else 32.0
            view.update({"env_steps": count, "wall_s": t, "env_steps_per_s": raw, "eta_s": 1.0})
    last = caplog.records[-1].getMessage()
    # over 5 s: (320 - 96) env steps between t=2 and t=7; the ETA from that rate
    assert "env steps/s=45" in last and f"ETA s={(10_000 - 320) / 44.8:,.0f}" in last, last


def test_terminal_handlers_are_swapped_only_while_the_table_is_live(monkeypatch):
    logger = logging.getLogger("rlfarm.test_live_view")
    handler = logging.StreamHandler(sys.stdout)
    logger.addHandler(handler)
    try:
        # pytest's stdout is no terminal: the live region is not drawn
        with LiveView("t", mode=True, columns=OFFPOLICY.columns):
            assert logger.handlers == [handler]
        monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich: treat stdout as a terminal
        with LiveView("t", mode=True, columns=OFFPOLICY.columns):
            assert handler not in logger.handlers and type(logger.handlers[0]).__name__ == "RichHandler"
        assert logger.handlers == [handler]
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES)
def test_every_familys_table_fits_a_160_column_terminal(family):
    """Every family's columns (rlfarm/families.py): every title whole on the one header line."""
    view = LiveView("rlfarm · title", mode=False, columns=family.columns)
    columns = family.columns.shown
    console = Console(width=COLS, record=True, force_terminal=True)
    console.print(view.table(view.shown({key: 12345.678 for key, _, _ in columns} | {"wall_s": 1.0})))
    lines = console.export_text().splitlines()
    header = [line for line in lines if "┃" in line]
    assert len(header) == 1 and all(f" {title} ┃" in header[0] for _, title, _ in columns), "\n".join(lines)
    assert all(len(line) <= COLS for line in lines) and RATES_NOTE in lines[-1]


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES)
def test_at_80_columns_the_table_keeps_its_progress_and_return_whole(family):
    """A narrow terminal drops the columns that do not fit, never the family's kept ones (env steps and return)."""
    view = LiveView("rlfarm · title", mode=False, columns=family.columns)
    shown = view.shown({key: 12345.678 for key, _, _ in family.columns.shown} | {"wall_s": 1.0})
    console = Console(width=80, record=True, force_terminal=True)
    console.print(view.table(shown, width=80))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "┃" in line)
    kept = [title for key, title, _ in family.columns.shown if key in family.columns.kept]
    assert kept and all(f" {title} ┃" in header for title in kept), "\n".join(lines)
    assert all(len(line) <= 80 for line in lines) and "…" not in "\n".join(lines)
