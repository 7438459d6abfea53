"""`rlfarm report` as a user runs it, over a real (tiny) trained 2-seed sweep; open the figures it wrote."""

import pytest
from PIL import Image

from rlfarm.telemetry.plots import PANEL_INCHES

from helpers import one_line_error, read_summary, rlfarm


def expected_size(ncols, nrows, dpi=100):
    return round(PANEL_INCHES[0] * ncols * dpi), round((PANEL_INCHES[1] * nrows + 0.4) * dpi)


@pytest.mark.slow
def test_report_of_a_sweep_overlays_runs_and_averages_seeds(tiny_sweep, tmp_path):
    out = rlfarm("report", f"path={tiny_sweep}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    report = tiny_sweep / "report"
    # rewards: the true return beside the labeled and env reward per step (the runs log both; here they are equal)
    # losses: SAC's critic, actor, temperature and entropy (IMPALA's policy and value losses are not drawn: no data)
    sizes = {"returns": (2, 1), "throughput": (3, 1), "labeling": (2, 1), "losses": (4, 1), "rewards": (3, 1),
             "overview": (4, 4), "returns_across_seeds": (2, 1)}
    for name, (ncols, nrows) in sizes.items():
        with Image.open(report / f"{name}.png") as image:
            assert image.size == expected_size(ncols, nrows), name
            low, high = image.convert("L").getextrema()
            assert high - low > 100, name  # drawn, not blank
    markdown = (tiny_sweep / "report.md").read_text()
    rows = [line for line in markdown.splitlines() if line.startswith("| seed=")]
    assert len(rows) == 2 and "| done |" in rows[0]
    assert "## Across seeds" in markdown and "| 1, 2 |" in markdown
    assert "![returns_across_seeds](report/returns_across_seeds.png)" in markdown
    assert {p.name for p in report.glob("*.png")} == {f"{name}.png" for name in sizes}  # no lag.png: SAC has none
    assert list(tmp_path.iterdir()) == []  # nothing stray where the command ran
    # the sweep's jobs ran one after the other in one process: the second counts its start-up from its own start
    first, second = (read_summary(tiny_sweep / job) for job in ("0", "1"))
    assert second["startup_s"] < first["startup_s"] + first["wall_s"], (first["startup_s"], second["startup_s"])


@pytest.mark.slow
def test_report_of_one_run(tiny_sweep):
    run_dir = tiny_sweep / "1"
    out = rlfarm("report", f"path={run_dir}", "dpi=50")
    assert out.returncode == 0, out.stderr[-2000:]
    with Image.open(run_dir / "report" / "returns.png") as image:
        assert image.size == expected_size(2, 1, dpi=50)
    assert not (run_dir / "report" / "returns_across_seeds.png").exists()
    assert sum(line.startswith("| ") and "| done |" in line for line in (run_dir / "report.md").read_text().splitlines()) == 1


@pytest.mark.parametrize("args, needle", [
    ([], "path is required"),
    (["path=nope"], "path 'nope' is not a directory"),
    (["path=."], "no run under '.'"),
    (["runs/x"], "write rlfarm report path=runs/x"),
    (["path=.", "smooth=0"], "smooth must be an integer >= 1"),
])
def test_bad_path_is_one_line(tmp_path, args, needle):
    assert needle in one_line_error(rlfarm("report", *args, cwd=tmp_path))
    assert list(tmp_path.iterdir()) == []
