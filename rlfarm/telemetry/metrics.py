"""metrics.jsonl: one JSON line per row, always; each row also goes to the run's other sinks
(TensorBoard, W&B: `rlfarm.telemetry.sinks`)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path


class MetricsLogger:
    """Appends rows to <run_dir>/metrics.jsonl (non-finite floats as null) and hands each row, so cleaned,
    to every sink in `sinks`; closing it closes them. step_key: the row field that orders the rows."""

    def __init__(self, run_dir: Path, sinks: Sequence = (), step_key: str = "env_steps"):
        self.step_key, self.sinks = step_key, list(sinks)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.file = self.path.open("a", buffering=1)  # line-buffered: a crash loses at most one row
        self._resumed_at: tuple | None = None  # the counters of the last row kept on resume

    def log(self, row: dict) -> None:
        """Append the row; but a resumed run's first rows that repeat the counters the file ends with (the state
        the checkpoint was taken at, which the stopped run already logged) are not written twice."""
        if self._resumed_at is not None:
            if self._counters(row) == self._resumed_at:
                return
            self._resumed_at = None
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        self.file.write(json.dumps(clean) + "\n")
        for sink in self.sinks:
            sink.log(clean)

    def truncate(self, after_step: int) -> None:
        """Drop the rows logged after `after_step` (on resume from a checkpoint, so steps never repeat)."""
        self.file.close()
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get(self.step_key, 0) <= after_step]
        self.path.write_text("".join(line + "\n" for line in kept))
        self.file = self.path.open("a", buffering=1)
        self._resumed_at = self._counters(json.loads(kept[-1])) if kept else None

    def _counters(self, row: dict) -> tuple:
        return row.get(self.step_key), row.get("updates")

    def close(self) -> None:
        self.file.close()
        for sink in self.sinks:
            sink.close()
