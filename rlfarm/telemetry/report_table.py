"""report.md: a table of each run's final numbers (summary.json over its last metrics row), the seed groups' means
of their family's headline (return, reward, success), and links to the figures. The columns are the families'
(`Report.table`, rlfarm/telemetry/panels.py), each shown only where some run has a value for it. Also the small
helpers the figures share with it (rlfarm/telemetry/plots.py, whose `RunData` the runs here are)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rlfarm.telemetry.panels import Report


def reports_of(runs: list) -> list[Report]:
    """What the runs' families draw, each once, in the runs' order."""
    return list(dict.fromkeys(report for run in runs for report in run.reports))


def group_label(group: list) -> str:
    others = [part for part in group[0].label.split(" ") if not part.startswith("seed=")]
    return f"{' '.join(others) or 'all runs'} ({len(group)} seeds)"


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def relative(path: Path, root: Path) -> str:
    try:
        return str(Path(path).relative_to(root)) or "."
    except ValueError:
        return str(path)


def report_markdown(root: Path, runs: list, groups: list[list], figures: list[Path]) -> str:
    lines = [f"# rlfarm report: `{root}`", "", f"{len(runs)} run{'s' if len(runs) != 1 else ''}.", ""]
    fields = list(dict.fromkeys(field for report in reports_of(runs) for field in report.table))
    fields = [field for field in fields if any(finite(run.final.get(field[0])) for run in runs)]
    columns = ["run", "dir", "status", *(title for _, title, _ in fields)]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for run in runs:
        final = run.final
        cells = [run.label, f"`{relative(run.dir, root)}`", run.state,
                 *(_fmt(final.get(key), spec) for key, _, spec in fields)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    if groups:
        headlines = list(dict.fromkeys(group[0].reports[0].headline for group in groups))
        title = headlines[0][1] if len(headlines) == 1 else "headline"
        lines += ["", "## Across seeds", "", f"| config | seeds | {title}, mean ± std | wall s, mean |",
                  "|---|---|---|---|"]
        for group in groups:
            key, _, spec = group[0].reports[0].headline
            values = [v for v in (r.final.get(key) for r in group) if finite(v)]
            walls = [r.final["wall_s"] for r in group if finite(r.final.get("wall_s"))]
            mean = (f"{format(np.mean(values), spec)} ± {format(np.std(values), spec)}" if values else "-")
            if len(headlines) > 1:
                mean = f"{key} {mean}"
            seeds = ", ".join(str(r.config.get("seed")) for r in group)
            lines.append(f"| {group_label(group)} | {seeds} | {mean} | {_fmt(np.mean(walls) if walls else None, '.1f')} |")
    lines += ["", "## Figures", ""]
    lines += [f"![{p.stem}]({relative(p, root)})" for p in figures]
    return "\n".join(lines) + "\n"


def _fmt(value, spec: str) -> str:
    return format(value, spec) if finite(value) else "-"
