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
    """The run was told to stop and wrote a checkpoint first: SIGTERM (Slurm's preemption or time limit; exit 75,
    and the Slurm scripts requeue it with resume=auto) or the first Ctrl-C (`interrupted`; exit 130). The message
    is the command that continues it, as typed."""

    def __init__(self, checkpoint: str | None, run_dir=None, interrupted: bool = False):
        how = "interrupted" if interrupted else "preempted"
        super().__init__(f"{how}: checkpoint {checkpoint} written; continue with: rlfarm train resume={run_dir}"
                         if checkpoint else f"{how} before the first checkpoint; a rerun starts over")
        self.checkpoint, self.interrupted = checkpoint, interrupted
