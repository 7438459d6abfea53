"""User-facing errors: one line that names the problem and the fix; the CLI prints it and exits 2."""
from __future__ import annotations


class RlfarmError(Exception):
    """A problem the user can fix. `str()` is the single line the CLI prints."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem, self.fix = problem, fix
        super().__init__(f"{problem} — {fix}" if fix else problem)


class ConfigError(RlfarmError):
    pass


class TopologyError(RlfarmError):
    pass


class JobFailed(RuntimeError):
    """A run inside a Slurm sweep job failed; the message is the one line the CLI printed."""


class Preempted(Exception):
    """SIGTERM arrived (Slurm preemption or time limit): a checkpoint was written; resume with resume=auto."""

    def __init__(self, checkpoint: str | None):
        super().__init__(f"preempted: checkpoint {checkpoint} written; rerun with resume=auto to continue"
                         if checkpoint else "preempted before the first checkpoint; resume=auto starts over")
        self.checkpoint = checkpoint
