"""The real off-policy pipeline on Ray (CPU): runners → labelers → learner, with accounting and credits."""
import time

from helpers import wait_for
from rlfarm.config import compose
from rlfarm.roles.env_runner import EnvRunner
from rlfarm.roles.labeler import Labeler
from rlfarm.roles.sac_learner import SACLearner


def test_runner_stops_at_its_credits_and_resumes_on_ack(ray_cpu):
    ray = ray_cpu
    cfg = compose("train", [])
    from omegaconf import OmegaConf
    runner = ray.remote(EnvRunner).options(max_concurrency=4).remote(
        0, OmegaConf.to_container(cfg.env), OmegaConf.to_container(cfg.model.actor), ["env_reward"], None,
        0, 8, 2, 10_000, 1)
    labeler = ray.remote(Labeler).options(max_concurrency=4).remote(
        0, OmegaConf.to_container(cfg.reward), 8, 0.01, 1)
    # A real learner whose update loop is not started: it receives chunks but never acks them.
    spaces = ray.get(runner.spaces.remote())
    learner = ray.remote(SACLearner).options(max_concurrency=4).remote(
        OmegaConf.to_container(cfg.algo, resolve=True), OmegaConf.to_container(cfg.model), spaces, 0, 1)
    ray.get([runner.set_labelers.remote([labeler]), labeler.set_learner.remote(learner)])
    labeler.run.remote()
    done = runner.run.remote(1000)
    assert wait_for(lambda: ray.get(labeler.stats.remote())["labeled"] == 16, 30)  # both chunks were labeled
    time.sleep(0.5)  # room for a chunk the credits should not allow
    stats = ray.get(runner.stats.remote())
    assert stats["chunks"] == 2 and stats["in_flight"] == 2  # two credits, both spent, no more acting
    ray.get(runner.ack.remote([0]))
    assert wait_for(lambda: ray.get(runner.stats.remote())["chunks"] == 3, 30)
    time.sleep(0.5)
    assert ray.get(runner.stats.remote())["chunks"] == 3       # one credit back → exactly one more chunk
    ray.get(runner.stop.remote())
    ray.get(done, timeout=10)
    ray.get(labeler.stop.remote())


def test_labeler_starts_the_next_bus_while_the_model_works_on_the_last(ray_cpu):
    """A model that queues its work (a GPU model; here the fixed-cost stand-in of a remote one, 200 ms a call) gets
    the next bus while it runs: chunks arriving every 50 ms are labeled in overlapping calls, each exactly once."""
    ray = ray_cpu
    import numpy as np
    from omegaconf import OmegaConf
    cfg = compose("train", ["reward=fixed_cost", "reward.batch_ms=200", "reward.item_us=0"])
    runner = ray.remote(EnvRunner).remote(
        0, OmegaConf.to_container(cfg.env), OmegaConf.to_container(cfg.model.actor), ["env_reward"], None, 0, 8, 2, 0, 1)
    learner = ray.remote(SACLearner).options(max_concurrency=4).remote(  # stores what arrives; its loop is not run
        OmegaConf.to_container(cfg.algo, resolve=True), OmegaConf.to_container(cfg.model), ray.get(runner.spaces.remote()), 0, 1)
    labeler = ray.remote(Labeler).options(max_concurrency=4).remote(0, OmegaConf.to_container(cfg.reward), 8, 0.01, 1)
    ray.get(labeler.set_learner.remote(learner))
    labeler.run.remote()
    for seq in range(8):
        meta = {"runner": 0, "seq": seq, "size": 8, "produced_at": time.time()}
        labeler.submit.remote(meta, {"env_reward": np.full(8, seq, np.float32)})
        time.sleep(0.05)
    assert wait_for(lambda: ray.get(labeler.stats.remote())["labeled"] == 64, 30)
    stats = ray.get(labeler.stats.remote())
    assert stats["batches"] >= 3 and stats["overlapped"] >= 2  # buses started while the one before was in the model
    assert set(stats["stage_s"]) == {"gather", "launch", "upload", "upload_wait", "model", "send", "idle"}
    assert stats["stage_s"]["model"] >= 0.2 * 2  # the calls ran one after another: the labeler waited for them
    ray.get(labeler.stop.remote())
    ray.kill(runner)
