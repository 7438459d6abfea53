"""What every bench shares: the device, the sizes, timing, ratios to baselines, bench.json and the table.

A bench is a module `rlfarm.bench.<name>` with `run(cfg, device) -> list[dict]`, where `cfg` is the bench's
own config node (conf/bench/<name>.yaml after overrides: `cfg.name`, `cfg.sizes`, ...) and `device` is
"cpu" or "cuda". Each row is `{"case", "value", "unit", "baseline"}` plus any extra keys; a row whose
"baseline" names the "case" of another row gets `"ratio": value / that value` here, so every figure
sits next to a baseline measured in the same run on the same device.
"""
from __future__ import annotations

import importlib
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from rlfarm.errors import ConfigError

REQUIRED_ROW_KEYS = ("case", "value", "unit", "baseline")
VERSIONED_PACKAGES = ("torch", "transformers", "ray")


def resolve_device(requested: str) -> str:
    """auto → cuda when a GPU is visible, else cpu; cuda without a GPU is the user's mistake (one line)."""
    import torch

    if requested not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be auto, cpu or cuda, got {requested!r}", "set device=auto|cpu|cuda")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but no CUDA device is visible", "run on a GPU machine, or pass device=cpu")
    return requested


def sizes(cfg: DictConfig, device: str) -> DictConfig:
    """The bench's sizes for this device: `sizes_cpu` on CPU (seconds, for CI), `sizes` on a GPU."""
    return cfg.sizes_cpu if device == "cpu" and "sizes_cpu" in cfg else cfg.sizes


def use_cpu_threads(cfg: DictConfig, device: str) -> None:
    """`cpu_threads` torch threads on CPU, as the roles run (threads: 1): on a shared 2-core machine more threads
    mostly wait on each other."""
    if device == "cpu":
        import torch

        torch.set_num_threads(int(cfg.cpu_threads))


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def median_rate(work: Callable[[], object], items: float, device: str, repeats: int = 5, warmup: int = 1) -> float:
    """Items per second of `work()` (which does `items` items): median over `repeats` timed calls after
    `warmup` untimed ones, with the device synchronized around each call so queued kernels are counted."""
    for _ in range(warmup):
        work()
    synchronize(device)
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        synchronize(device)
        rates.append(items / (time.perf_counter() - started))
    return statistics.median(rates)


def add_ratios(rows: list[dict]) -> list[dict]:
    """Copies of the rows, each with "ratio" = value / its baseline's value where it names a baseline."""
    for row in rows:
        missing = [key for key in REQUIRED_ROW_KEYS if key not in row]
        if missing:
            raise ValueError(f"bench row {row!r} lacks {', '.join(missing)}")
    by_case = {row["case"]: row for row in rows}
    if len(by_case) != len(rows):
        raise ValueError(f"bench rows repeat a case: {[row['case'] for row in rows]}")
    out = []
    for row in rows:
        row = dict(row)
        baseline = row["baseline"]
        if baseline is not None:
            if baseline not in by_case:
                raise ValueError(f"row {row['case']!r} names baseline {baseline!r}, which is no row's case")
            reference = float(by_case[baseline]["value"])
            row["ratio"] = float(row["value"]) / reference if reference else float("inf")
        out.append(row)
    return out


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    return f"cpu: {cpu_model()}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:  # e.g. unpacked without metadata on the GPU machine: ask the module
            module = sys.modules.get(package)
            found[package] = getattr(module, "__version__", None) if module else None
    return found


def run_bench(cfg: DictConfig, run_dir: str | Path, command: str) -> dict:
    """Run the bench `cfg.bench.name` on `cfg.device`; write <run_dir>/bench.json; return its content."""
    device = resolve_device(str(cfg.device))
    name = str(cfg.bench.name)
    module = importlib.import_module(f"rlfarm.bench.{name}")
    rows = add_ratios(module.run(cfg.bench, device))
    result = {"bench": name, "device": device, "device_name": device_name(device), "versions": versions(),
              "command": command, "config": OmegaConf.to_container(cfg, resolve=True), "rows": rows}
    path = Path(run_dir) / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
    tmp.replace(path)
    return result


def results_table(result: dict) -> Table:
    rows = result["rows"]
    extra = [key for key in dict.fromkeys(k for row in rows for k in row)
             if key not in (*REQUIRED_ROW_KEYS, "ratio")]
    table = Table(title=f"rlfarm bench {result['bench']} · {result['device_name']}", title_justify="left")
    for column in ("case", "value", "unit", "baseline", "ratio", *extra):
        table.add_column(column, justify="left" if column in ("case", "unit", "baseline") else "right")
    for row in rows:
        ratio = f"{row['ratio']:.2f}×" if "ratio" in row else ""
        table.add_row(str(row["case"]), format_value(row["value"]), str(row["unit"]), str(row["baseline"] or ""),
                      ratio, *(format_value(row[key]) if key in row else "" for key in extra))
    return table


def format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def print_table(result: dict) -> None:
    console = Console()
    if not console.is_terminal:  # a log or a pipe: do not squeeze the columns into 80 characters
        console = Console(width=200)
    console.print(results_table(result))
