"""`rlfarm bench pipeline`: the command on CPU, the fixed-cost env stage, and the window arithmetic."""
import json
import time

import numpy as np
import pytest

from helpers import rlfarm
from rlfarm.bench.farm import steady_window
from rlfarm.bench.stand_ins import MODULE_ENV_ID
from rlfarm.envs.vector import VectorEnv


@pytest.mark.slow  # Ray and three phases of actors
def test_pipeline_bench_command_on_cpu_compares_the_pipeline_with_its_slower_stage(tmp_path):
    # One runner (a producer in the reward stage): three actors fewer to start, each a process importing torch;
    # 1 s windows: still about fifteen chunks (32 ms each) and buses (36 ms each) in each half-second slice
    out = rlfarm("bench", "pipeline", "device=cpu", "bench.sizes_cpu.runners=1", "bench.sizes_cpu.warmup_s=0.2",
                 "bench.sizes_cpu.window_s=1.0", f"hydra.run.dir={tmp_path / 'run'}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {row["case"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    assert list(rows) == ["reward stage alone", "env stage alone", "whole pipeline",
                          "labelers busy in the model (pipeline)"]  # no NVML row on CPU
    stages = {case: rows[case]["value"] for case in ("reward stage alone", "env stage alone")}
    whole = rows["whole pipeline"]
    assert whole["baseline"] == min(stages, key=stages.get)
    assert whole["value"] > 0 and whole["ratio"] == pytest.approx(whole["value"] / min(stages.values()))
    assert 0 < rows["labelers busy in the model (pipeline)"]["value"] <= 100
    # the stages' own limits are stated next to them: sleeping labelers and spinning runners cannot beat them
    assert rows["reward stage alone"]["value"] <= rows["reward stage alone"]["model_limit"] * 1.05
    assert rows["env stage alone"]["value"] <= rows["env stage alone"]["cpu_limit"] * 1.05


def test_fixed_cost_env_spends_its_step_time_and_truncates():
    env = VectorEnv(MODULE_ENV_ID, num_envs=2, seed=0, kwargs={"step_cpu_ms": 5.0, "max_episode_steps": 3})
    obs = env.reset()
    assert obs.shape == (2, 8) and obs.dtype == np.float32
    started = time.perf_counter()
    step = env.step(np.full((2, 2), 0.5, dtype=np.float32))
    assert time.perf_counter() - started >= 2 * 5e-3  # each sub-env spins its 5 ms
    np.testing.assert_allclose(step.env_reward, [-0.5, -0.5])
    for _ in range(2):
        step = env.step(np.zeros((2, 2), dtype=np.float32))
    assert step.truncated.all() and not step.terminated.any() and step.episode_lengths == [3, 3]


def test_steady_window_reports_the_median_slice_rate():
    counts = iter([0, 100, 300, 400])  # slices of 0.05 s: 2,000, 4,000 and 2,000 per s
    window = steady_window(lambda: {"n": next(counts)}, warmup_s=0.0, window_s=0.15, slices=3)
    rates = window.rates("n")
    assert len(rates) == 3 and rates[1] > rates[0] and rates[1] > rates[2]
    assert window.median_rate("n") == sorted(rates)[1]
    assert window.mean_rate("n") == pytest.approx(400 / (window.times[-1] - window.times[0]))
