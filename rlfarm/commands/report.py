"""`rlfarm report path=<run or multirun dir>`: PNG figures under <path>/report/ and a table in <path>/report.md.

The figures and the table come from rlfarm/telemetry/plots.py; this module checks the path before Hydra
starts (a bad path → one line, exit 2, nothing written) and says what it wrote.
"""
from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from rlfarm.cli import fail
from rlfarm.commands.options import check_ints, compose_jobs
from rlfarm.errors import RlfarmError

log = logging.getLogger("rlfarm")


def preflight(config_name: str, args: list[str]) -> None:
    for cfg in compose_jobs(config_name, args, "path"):
        check_ints(cfg, smooth=1, dpi=20)
        check_report_root(cfg.path)


def check_report_root(path: str) -> Path:
    from rlfarm.telemetry.plots import find_runs

    root = Path(path).expanduser()
    if not root.is_dir():
        raise RlfarmError(f"path '{path}' is not a directory", "pass path=<a run directory or a multirun directory>")
    if not find_runs(root):
        raise RlfarmError(f"no run under '{path}' (no metrics.jsonl)",
                          "pass path=<a directory written by rlfarm train, or its sweep dir>")
    return root


def task(cfg: DictConfig) -> dict:
    from rlfarm.telemetry.plots import write_report

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font-cache notice is not ours to show
    try:
        result = write_report(check_report_root(cfg.path), int(cfg.smooth), int(cfg.dpi))
    except RlfarmError as error:
        fail(error)
    log.info(f"report: {result['runs']} run{'s' if result['runs'] != 1 else ''}; "
             f"figures in {Path(cfg.path) / 'report'}: {', '.join(p.name for p in result['figures'])}; "
             f"table in {result['markdown']}")
    return result
