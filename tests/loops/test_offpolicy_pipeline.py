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
