"""The bench framework: ratios to baselines, sizes per device, timing, the table, and the command's bad input."""
import pytest
import torch
from omegaconf import OmegaConf
from rich.console import Console

from rlfarm.bench.common import add_ratios, median_rate, resolve_device, results_table, sizes
from rlfarm.commands.bench import bench_names, rewrite_args
from rlfarm.errors import ConfigError
from helpers import one_line_error, rlfarm


def row(case, value, baseline=None, **extra):
    return {"case": case, "value": value, "unit": "x/s", "baseline": baseline, **extra}


def test_ratio_is_value_over_the_named_baseline():
    rows = add_ratios([row("eager", 100.0), row("graph", 450.0, "eager", batch=256), row("other", 3.0)])
    assert "ratio" not in rows[0] and "ratio" not in rows[2]
    assert rows[1]["ratio"] == pytest.approx(4.5)
    assert rows[1]["batch"] == 256


def test_rows_are_copied_not_changed():
    given = [row("a", 1.0), row("b", 2.0, "a")]
    add_ratios(given)
    assert "ratio" not in given[1]


@pytest.mark.parametrize("rows, message", [
    ([row("a", 1.0), row("b", 2.0, "nope")], "names baseline 'nope'"),
    ([row("a", 1.0), row("a", 2.0)], "repeat a case"),
    ([{"case": "a", "value": 1.0}], "lacks unit, baseline"),
])
def test_malformed_rows_are_refused(rows, message):
    with pytest.raises(ValueError, match=message):
        add_ratios(rows)


def test_sizes_follow_the_device():
    cfg = OmegaConf.create({"name": "x", "sizes": {"batch": 256}, "sizes_cpu": {"batch": 8}})
    assert sizes(cfg, "cpu").batch == 8
    assert sizes(cfg, "cuda").batch == 256
    assert sizes(OmegaConf.create({"sizes": {"batch": 256}}), "cpu").batch == 256


def test_median_rate_counts_items_per_second_after_warmup():
    calls = []
    rate = median_rate(lambda: calls.append(sum(range(20000))), items=10, device="cpu", repeats=3, warmup=2)
    assert len(calls) == 5 and rate > 0


def test_device_resolution():
    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="device must be auto, cpu or cuda"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")


def test_table_shows_ratios_and_extra_columns():
    result = {"bench": "learner", "device_name": "cpu: test", "rows": add_ratios([
        row("eager", 137.0, batch=256), row("graph", 3200.0, "eager", batch=256)])}
    console = Console(record=True, width=200)
    console.print(results_table(result))
    text = console.export_text()
    assert "23.36×" in text and "3,200" in text and "batch" in text


def test_the_name_becomes_the_bench_group_choice():
    assert rewrite_args(["learner", "device=cpu"]) == ["bench=learner", "device=cpu"]
    assert rewrite_args(["device=cpu", "bench=sync"]) == ["device=cpu", "bench=sync"]


def test_unknown_bench_is_one_line_and_leaves_nothing(tmp_path):
    out = rlfarm("bench", "lerner", "device=cpu", cwd=tmp_path, timeout=120)
    line = one_line_error(out)
    assert "unknown bench 'lerner'" in line and "choose one of" in line
    assert all(name in line for name in bench_names())
    assert not (tmp_path / "runs").exists()


def test_missing_bench_name_is_one_line(tmp_path):
    line = one_line_error(rlfarm("bench", "device=cpu", cwd=tmp_path, timeout=120))
    assert "which bench?" in line and "rlfarm bench <" in line
    assert not (tmp_path / "runs").exists()
