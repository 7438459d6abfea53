"""Figures and a markdown table from run directories (metrics.jsonl, config.yaml, summary.json). No Hydra.

A *report root* is a run directory or any directory holding runs (a Hydra sweep dir, or a parent of several).
Runs of a root are labelled by the config keys that differ between them (e.g. `seed=2 algo.lr=0.001`), so
Hydra's long sweep subdir names never reach a legend. Runs whose configs are equal except for `seed` form a
*seed group*, drawn as mean ± std across seeds on a common x grid (each run interpolated, over the x range
that all of the group's runs cover).

What is drawn is the family's (`report` of its record in rlfarm/families.py, rlfarm/telemetry/panels.py), chosen
by what the runs logged: no panel without data, no figure that only repeats panels drawn before it.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlfarm.families import FAMILIES, current_name
from rlfarm.telemetry.panels import PANELS, Report
from rlfarm.telemetry.report_table import finite, group_label, report_markdown, reports_of

PANEL_INCHES = (4.8, 3.4)
IGNORED_KEYS = {"seed"}  # what may differ inside a seed group
LINE_STYLES = ("-", "--", ":", "-.")  # a panel of several metrics: one style per metric, one colour per run


@dataclass
class RunData:
    dir: Path
    config: dict                   # flattened: {"algo.lr": 0.001, ...}
    metrics: list[dict]
    summary: dict | None = None    # None: the run did not finish
    status: dict | None = None     # status.json of a failed run
    label: str = ""
    color: tuple = field(default=(0, 0, 0))

    @property
    def state(self) -> str:
        if self.summary is not None:
            return "done"
        if self.status is not None:
            return f"failed: {self.status.get('error', '?')}"
        return "unfinished"

    @property
    def final(self) -> dict:
        """The last metrics row, overridden by summary.json where the run finished; with the run's env step rate."""
        final = {**(self.metrics[-1] if self.metrics else {}), **(self.summary or {})}
        if finite(final.get("env_steps")) and final.get("wall_s"):
            final["env_steps_per_s"] = final["env_steps"] / final["wall_s"]
        return final

    @property
    def reports(self) -> list[Report]:
        """What its family draws; every family's (then chosen by the data) when its config names none."""
        family = FAMILIES.get(current_name(self.config.get("algo.family")))
        return [family.report] if family else [f.report for f in FAMILIES.values()]


def has_data(runs: list[RunData], panel: str) -> bool:
    """Some run logged a finite value of one of the panel's metrics at a finite x."""
    spec = PANELS[panel]
    return any(finite(row.get(spec.x)) and finite(row.get(key)) for run in runs for row in run.metrics
               for key in spec.keys)


def chosen_figures(runs: list[RunData]) -> dict[str, list[str]]:
    """Figure name → its panels with data, the runs' families' figures merged by name in order; a figure whose
    panels with data were all drawn before is left out (rewards.png without a labeled reward: returns.png again)."""
    merged: dict[str, list[str]] = {}
    for report in reports_of(runs):
        for name, panels in report.figures:
            merged.setdefault(name, [])
            merged[name] += [p for p in panels if p not in merged[name]]
    chosen, drawn = {}, set()
    for name, panels in merged.items():
        with_data = [p for p in panels if has_data(runs, p)]
        if set(with_data) - drawn:
            chosen[name] = with_data
            drawn.update(with_data)
    return chosen


def find_runs(root: Path) -> list[Path]:
    """Run directories under root (root itself when it is one): those holding metrics.jsonl, in natural order."""
    root = Path(root)
    if (root / "metrics.jsonl").is_file():
        return [root]
    return sorted((p.parent for p in root.rglob("metrics.jsonl")), key=lambda p: _natural_key(p.relative_to(root)))


def load_runs(root: Path) -> list[RunData]:
    """Every run under root, labelled by what differs between them and given a colour each."""
    import yaml

    runs = []
    for directory in find_runs(root):
        config_path = directory / "config.yaml"
        config = _flatten(yaml.safe_load(config_path.read_text()) or {}) if config_path.is_file() else {}
        runs.append(RunData(directory, config, _read_jsonl(directory / "metrics.jsonl"),
                            _read_json(directory / "summary.json"), _read_json(directory / "status.json")))
    keys = label_keys(runs)
    colors = _colors(len(runs))
    for run, color in zip(runs, colors):
        parts = [f"{k}={_short(run.config.get(k))}" for k in keys[:MAX_LABEL_KEYS]]
        more = f" +{len(keys) - MAX_LABEL_KEYS} more" if len(keys) > MAX_LABEL_KEYS else ""
        run.label = " ".join(parts) + more if parts else run.dir.name
        run.color = color
    return runs


MAX_LABEL_KEYS = 3  # a legend entry names at most this many differing keys (report.md's table has them all)


def label_keys(runs: list[RunData]) -> list[str]:
    """The varying keys a legend shows: first those all runs have; keys that only some runs have (the other settings
    of another group option, e.g. reward.model for reward=model vs reward=env) only as far as needed to tell runs
    apart."""
    keys = varying_keys(runs)
    chosen = [k for k in keys if all(r.config.get(k) is not None for r in runs)]

    def distinct(with_keys: list[str]) -> int:
        return len({tuple(json.dumps(r.config.get(k), default=str) for k in with_keys) for r in runs})

    rest = [k for k in keys if k not in chosen]
    while rest and distinct(chosen) < len(runs):  # greedily, the key that tells the most runs apart
        best = max(rest, key=lambda k: distinct([*chosen, k]))
        if distinct([*chosen, best]) == distinct(chosen):
            break
        chosen.append(best)
        rest.remove(best)
    return chosen


def varying_keys(runs: list[RunData]) -> list[str]:
    """Config keys whose value is not the same in every run (seed first)."""
    if len(runs) < 2:
        return []
    keys = sorted(set().union(*(r.config for r in runs)))
    varying = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True, default=str) for r in runs}) > 1]
    return sorted(varying, key=lambda k: (k != "seed", k))


def seed_groups(runs: list[RunData]) -> list[list[RunData]]:
    """Groups of ≥ 2 runs whose configs are equal except for the seed, and whose seeds all differ."""
    groups: dict[str, list[RunData]] = {}
    for run in runs:
        if not run.config:
            continue
        rest = {k: v for k, v in run.config.items() if k not in IGNORED_KEYS}
        groups.setdefault(json.dumps(rest, sort_keys=True, default=str), []).append(run)
    return [g for g in groups.values() if len(g) >= 2 and len({r.config.get("seed") for r in g}) == len(g)]


def series(run: RunData, key: str, x_key: str, smooth: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of one metric over the run's rows, rows without a finite value dropped; rates smoothed."""
    points = [(row[x_key], row[key]) for row in run.metrics
              if finite(row.get(x_key)) and finite(row.get(key))]
    if not points:
        return np.empty(0), np.empty(0)
    x, y = (np.asarray(v, dtype=np.float64) for v in zip(*points))
    if key.endswith("_per_s") and smooth > 1:
        y = moving_average(y, smooth)
    return x, y


def moving_average(y: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over up to `window` points (shorter at the start), same length as y."""
    cumulative = np.concatenate([[0.0], np.cumsum(y)])
    idx = np.arange(1, len(y) + 1)
    start = np.maximum(idx - window, 0)
    return (cumulative[idx] - cumulative[start]) / (idx - start)


def mean_spread(curves: list[tuple[np.ndarray, np.ndarray]], points: int = 200):
    """Mean and std of curves on a shared grid over the x range every curve covers; None if they share none."""
    curves = [(x, y) for x, y in curves if len(x)]
    if len(curves) < 2:
        return None
    low, high = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if not high > low:
        return None
    grid = np.linspace(low, high, points)
    stacked = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, stacked.mean(0), stacked.std(0)


def plot_panels(runs: list[RunData], panels: list[str], path: Path, smooth: int = 5, dpi: int = 100,
                title: str | None = None, ncols: int | None = None) -> Path:
    """One figure, one subplot per panel name (rlfarm/telemetry/panels.py), every run overlaid in its colour; the
    metrics of a panel of several in line styles named in its legend."""
    fig, axes = _figure(len(panels), ncols, title)
    key_colors = _colors(max(len(PANELS[name].keys) for name in panels))
    for ax, name in zip(axes, panels):
        spec = PANELS[name]
        keys_drawn: set[str] = set()
        for number, key in enumerate(spec.keys):
            style = LINE_STYLES[number % len(LINE_STYLES)]
            for index, run in enumerate(runs):
                x, y = series(run, key, spec.x, smooth)
                if not len(x):
                    continue
                keys_drawn.add(key)
                label = run.label if len(spec.keys) == 1 else key if index == 0 else None
                color = run.color if len(runs) > 1 or len(spec.keys) == 1 else key_colors[number]
                ax.plot(x, y, color=color, lw=1.4, ls=style, label=label)
        _style(ax, spec.title, spec.x_label, empty=not ax.lines)
        if len(keys_drawn) > 1:
            ax.legend(fontsize=6, loc="best")
    _legend(axes[0], runs, panels[0])
    return _save(fig, path, dpi)


def plot_seed_groups(groups: list[list[RunData]], path: Path, smooth: int = 5, dpi: int = 100,
                     title: str | None = None) -> Path:
    """The families' headline (return, reward, success) vs their step and vs wall time: each seed group's mean
    (line) ± std (band), its seeds faint."""
    runs = [run for group in groups for run in group]
    panels = [p for report in reports_of(runs) for p in report.across_seeds if has_data(runs, p)]
    panels = list(dict.fromkeys(panels))
    fig, axes = _figure(len(panels), None, title)
    for ax, name in zip(axes, panels):
        spec = PANELS[name]
        for group in groups:
            color = group[0].color
            curves = [series(run, spec.keys[0], spec.x, smooth) for run in group]
            for x, y in curves:
                ax.plot(x, y, color=color, lw=0.7, alpha=0.35)
            stats = mean_spread(curves)
            if stats is None:
                continue
            grid, mean, std = stats
            ax.plot(grid, mean, color=color, lw=2, label=group_label(group))
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2, lw=0)
        _style(ax, f"{spec.title}: mean ± std over seeds", spec.x_label, empty=not ax.lines)
    if any(ax.get_legend_handles_labels()[1] for ax in axes[:1]):
        axes[0].legend(fontsize=7, loc="best")
    return _save(fig, path, dpi)


def write_report(root: Path, smooth: int = 5, dpi: int = 100) -> dict:
    """PNGs under <root>/report/ and <root>/report.md. Returns {"runs": n, "figures": [paths], "panels": {figure
    name: [panels drawn]}, "markdown": path}."""
    root = Path(root)
    runs = load_runs(root)
    if not runs:
        raise FileNotFoundError(f"no run (a directory with metrics.jsonl) under {root}")
    out = root / "report"
    out.mkdir(parents=True, exist_ok=True)
    name = root.name if len(runs) == 1 else f"{root.name} ({len(runs)} runs)"
    drawn = chosen_figures(runs)
    figures = [plot_panels(runs, panels, out / f"{fig_name}.png", smooth, dpi, f"{fig_name}: {name}")
               for fig_name, panels in drawn.items()]
    overview = list(dict.fromkeys(p for names in drawn.values() for p in names))  # each panel once
    if overview:
        figures.append(plot_panels(runs, overview, out / "overview.png", smooth, dpi, name, ncols=4))
        drawn["overview"] = overview
    groups = seed_groups(runs)
    if groups and any(has_data(runs, p) for report in reports_of(runs) for p in report.across_seeds):
        figures.append(plot_seed_groups(groups, out / "returns_across_seeds.png", smooth, dpi, name))
    markdown = root / "report.md"
    markdown.write_text(report_markdown(root, runs, groups, figures))
    return {"runs": len(runs), "figures": figures, "panels": drawn, "markdown": markdown}


# -- helpers --------------------------------------------------------------------------------------
def _figure(panels: int, ncols: int | None, title: str | None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(ncols or panels, panels)
    nrows = math.ceil(panels / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(PANEL_INCHES[0] * ncols, PANEL_INCHES[1] * nrows + 0.4),
                             squeeze=False, layout="constrained")
    axes = list(axes.flat)
    for ax in axes[panels:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig, axes[:panels]


def _style(ax, title: str, x_label: str, empty: bool) -> None:
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(x_label, fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    if empty:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray")


def _legend(ax, runs: list[RunData], panel: str) -> None:
    """The runs' colours, on the first panel (when it draws one metric: a panel of several names its styles)."""
    if 1 < len(runs) <= 12 and len(PANELS[panel].keys) == 1:
        ax.legend(fontsize=7, loc="best")


def _save(fig, path: Path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _colors(n: int) -> list[tuple]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if n <= 10 else "viridis"]
    return [tuple(cmap(i if n <= 10 else i / max(n - 1, 1))) for i in range(n)]


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _short(value) -> str:
    """A config value for a legend: a `_target_` by its class name, a long path by its last two parts."""
    text = json.dumps(value, default=str) if isinstance(value, (list, dict)) else str(value)
    text = text.replace(" ", "")
    if isinstance(value, str) and "/" in text and len(text) > 32:
        return "…/" + "/".join(text.rstrip("/").split("/")[-2:])
    if isinstance(value, str) and text.count(".") >= 2 and text.replace(".", "").replace("_", "").isalnum():
        return text.rsplit(".", 1)[-1]  # rlfarm.rewards.model.ModuleReward → ModuleReward
    return text


def _natural_key(path: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a run killed mid-write leaves a partial last line
            continue
    return rows
