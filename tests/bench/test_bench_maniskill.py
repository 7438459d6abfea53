"""`rlfarm bench maniskill` on CPU: ManiSkill's CPU backend (one scene), the env stage alone next to the rollout with
the tiny VLA and the policy's sampling alone, from the real config (a smoke test: no timing assertions)."""
import importlib.util
import json

import pytest

from helpers import rlfarm

# Present, not imported: importing ManiSkill here would cost every test worker that collects this file seconds
if importlib.util.find_spec("mani_skill") is None:
    pytest.skip("the bench steps ManiSkill3 scenes: pip install -e .[sim]", allow_module_level=True)


@pytest.mark.slow
def test_bench_maniskill_on_cpu_reports_the_rollout_next_to_the_env_stage(tmp_path):
    from rlfarm.envs.maniskill_tasks import rendering_problem

    problem = rendering_problem("cpu")
    if problem:
        pytest.skip(problem)
    out = rlfarm("bench", "maniskill", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {row["case"]: row for row in json.loads((tmp_path / "run" / "bench.json").read_text())["rows"]}
    cases = ("env alone", "rollout tiny_vla", "tiny_vla alone")
    env, rollout, policy = (f"PushCube-v1 16px x1 {case}" for case in cases)
    assert set(rows) == {env, rollout, policy}
    assert rows[env]["baseline"] is None and rows[rollout]["baseline"] == env and rows[rollout]["ratio"] > 0
    for row in rows.values():
        assert row["value"] > 0 and row["unit"] == "env steps/s" and row["sim_backend"] == "cpu"
    for case in (env, rollout):
        # every episode ran to max_steps (4) or ended earlier on success
        assert 1 <= rows[case]["episode_steps"] <= 4 and 0 <= rows[case]["success_rate"] <= 1
