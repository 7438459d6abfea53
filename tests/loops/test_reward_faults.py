"""Reward-model faults: a retry absorbs transient ones; persistent ones are quarantined, counted and reported —
never a silent zero reward."""
import json

import numpy as np

from helpers import TINY_SAC
from helpers import train as rlfarm_train

TINY = ["total_env_steps=400", *TINY_SAC, "labeler.bus_items=16"]


def train(run_dir, *overrides):
    return rlfarm_train(run_dir, *TINY, *overrides, timeout=300)


def test_transient_failures_are_retried_and_nothing_is_lost(tmp_path):
    out = train(tmp_path / "run", "reward=faulty", "reward.fail_every=3", "reward.fail_times=1")
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["reward_retries"] > 0 and s["transitions_quarantined"] == 0
    assert s["transitions_produced"] == s["transitions_labeled"] == s["transitions_stored"] == 400


def test_poisoned_chunks_are_quarantined_not_zeroed(tmp_path):
    # Pendulum rewards lie in [-16.3, 0]; chunks holding a step near the top (upright) fail every time, as NaN.
    out = train(tmp_path / "run", "reward=faulty", "reward.fail_every=0", "reward.mode=nan",
                "reward.poison_env_reward_above=-0.5")
    assert out.returncode == 0, out.stderr[-2000:]
    run = tmp_path / "run"
    s = json.loads((run / "summary.json").read_text())
    assert s["transitions_quarantined"] > 0 and "NaN" in s["reward_last_error"]
    assert s["transitions_produced"] == s["transitions_labeled"] + s["transitions_quarantined"]
    assert s["transitions_labeled"] == s["transitions_stored"]
    records = sorted((run / "quarantine").glob("*.json"))
    assert sum(json.loads(p.read_text())["size"] for p in records) == s["transitions_quarantined"]
    chunk = np.load(records[0].with_suffix(".npz"))
    assert (chunk["env_reward"] > -0.5).any()  # the poisoned data itself is kept for inspection
    assert "quarantined" in (run / "train.log").read_text()
