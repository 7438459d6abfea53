"""logger=wandb: the W&B sink beside metrics.jsonl, offline, and one clear line when wandb is missing."""
import sys

import pytest

from rlfarm.config import compose
from rlfarm.errors import RlfarmError
from rlfarm.run import Run
from rlfarm.telemetry.metrics import MetricsLogger
from rlfarm.telemetry.wandb_sink import WandbSink, wandb_options


def test_logger_wandb_config_gives_sink_options():
    assert wandb_options(compose("train", [])) is None  # logger=tensorboard: no W&B
    options = wandb_options(compose("train", ["logger=wandb", "seed=7"]))
    assert options["project"] == "rlfarm" and options["mode"] == "offline" and options["config"]["seed"] == 7


def test_missing_wandb_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(RlfarmError, match=r"^logger=wandb needs `pip install wandb`$"):
        Run(compose("train", ["logger=wandb"]), tmp_path)
    assert not (tmp_path / "metrics.jsonl").exists()  # failed before the run dir got content


def test_offline_run_records_the_rows(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    logger = MetricsLogger(tmp_path, [WandbSink(tmp_path, project="rlfarm", mode="offline", config={"seed": 1})])
    for i in range(3):
        logger.log({"env_steps": 10 * i, "env_steps_per_s": 5.0, "critic_loss": float("nan"), "labeling_lag_s": None})
    logger.close()
    wandb.teardown()  # wandb-core finishes writing the offline record file when its service stops
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
    [record] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    data = record.read_bytes()
    assert b"throughput/env_steps_per_s" in data and b"env_steps" in data
    assert b"loss/critic_loss" not in data  # NaN rows are dropped, as in TensorBoard
