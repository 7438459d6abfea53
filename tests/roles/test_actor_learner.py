"""The actor-learner role (IMPALA / APPO) in process, no Ray: batches of queued chunks, the policy-lag bound (stale
chunks dropped, counted and acked), credits back once a batch took a chunk, the last partial batch at a stop, and a
checkpoint round trip. Real CartPole trajectories from the real EnvRunner's collect path, a real actor-critic."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from helpers import RecordingRunner
from rlfarm.algos.vtrace_agent import VTraceAgent, VTraceConfig, trajectories
from rlfarm.config import compose
from rlfarm.models.actor_critic import ActorCritic
from rlfarm.roles.actor_learner import ActorLearner
from rlfarm.roles.env_runner import EnvRunner

STEPS, ENVS = 16, 4


@pytest.fixture(scope="module")
def cartpole():
    """(config, a real runner whose chunks carry the behaviour log-probs)."""
    cfg = compose("train", ["algo=impala", "env=cartpole", f"env.num_envs={ENVS}", f"algo.chunk_steps={STEPS}"])
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    runner = EnvRunner(0, as_dict(cfg.env), as_dict(cfg.model.actor), ["env_reward"], None, 0, STEPS, 2, 0,
                       behaviour=True)
    yield cfg, runner
    runner.close()


def labeled_chunk(runner, seq, version, steps=STEPS):
    """A chunk as a labeler hands it on: the runner's arrays (copies: collect reuses its buffers) + the reward."""
    chunk = {key: np.array(value) for key, value in runner.collect(steps).items()}
    chunk["reward"] = chunk["env_reward"]
    meta = {"runner": 0, "seq": seq, "size": steps * ENVS, "envs": ENVS, "policy_version": version, "incarnation": 0}
    return meta, chunk


def make_learner(cfg, *overrides):
    algo = OmegaConf.to_container(OmegaConf.merge(cfg.algo, OmegaConf.from_dotlist(list(overrides))), resolve=True)
    spaces = {"obs_dim": 4, "act_dim": 2, "action_low": None, "action_high": None}
    learner = ActorLearner(algo, OmegaConf.to_container(cfg.model, resolve=True), spaces, 0)
    runner = RecordingRunner()
    learner.set_runners([runner])
    return learner, runner


@pytest.mark.parametrize("groups", [1, 2])
def test_chunks_carry_behaviour_logprobs_of_the_actions_taken(cartpole, groups):
    """Also with double buffering (groups=2): each half's log-probs land in its own columns."""
    cfg, runner = cartpole
    if groups > 1:
        as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
        runner = EnvRunner(0, as_dict(cfg.env) | {"groups": groups}, as_dict(cfg.model.actor), ["env_reward"], None,
                           0, STEPS, 2, 0, behaviour=True)
    meta, chunk = labeled_chunk(runner, 0, 1)
    if groups > 1:
        runner.close()
    assert chunk["logprob"].shape == (STEPS * ENVS,) and chunk["action"].dtype == np.int64
    with torch.no_grad():  # the runner acted with its policy: log μ(a|s) is that policy's, step by step
        recomputed = runner.policy.distribution(torch.as_tensor(chunk["obs"])).log_prob(torch.as_tensor(chunk["action"]))
    np.testing.assert_allclose(chunk["logprob"], recomputed.numpy(), rtol=1e-5, atol=1e-6)


def test_batches_bound_the_policy_lag_and_ack_once_used(cartpole):
    cfg, _ = cartpole
    learner, runner_handle = make_learner(cfg, "batch_chunks=2", "max_policy_lag=3")
    _, runner = cartpole
    learner.version = 10  # the learner has published 10 versions
    # lags 9 and 7 (too old), then 3, 0, 2: the two stale ones are dropped on the way to a full batch
    learner._store([labeled_chunk(runner, seq, version) for seq, version in enumerate([1, 3, 7, 10, 8])])
    # owed counts whole batches of chunks within the bound (3 of the 5): the stale two are dropped on the way
    assert learner.stored == 5 * STEPS * ENVS and learner._updates_owed() == 1
    learner._update(1)
    assert learner.updates == 1 and learner.dropped_chunks == 2 and learner.dropped_transitions == 2 * STEPS * ENVS
    learner._ack_paid()
    assert sorted(runner_handle.acked) == [0, 1, 2, 3]  # the batch's two and the dropped two; seq 4 still queued
    stats = learner.stats()
    assert stats["policy_lag_max"] == 3 and stats["policy_lag_mean"] == 1.5 and stats["buffer_size"] == STEPS * ENVS
    assert stats["chunks_dropped_lag"] == 2 and np.isfinite(stats["value_loss"]) and stats["entropy"] > 0
    # Stopping: the one chunk left makes a last, smaller batch; then nothing is owed.
    assert learner._updates_owed() == 0
    learner.stop()
    assert learner._updates_owed() == 1
    learner._update(1)
    learner._ack_paid()
    assert learner.updates == 2 and sorted(runner_handle.acked) == [0, 1, 2, 3, 4] and learner._updates_owed() == 0


def test_checkpoint_round_trip(cartpole, tmp_path):
    cfg, runner = cartpole
    learner, _ = make_learner(cfg, "batch_chunks=1")
    learner._store([labeled_chunk(runner, 0, 1)])
    learner._update(1)
    path = learner.save(str(tmp_path / "a.pt"), extra={"episodes": 3})
    restored, handle = make_learner(cfg, "batch_chunks=1")
    assert restored.load(path) == {"episodes": 3}
    assert (restored.updates, restored.stored, restored.stored_ids) == (1, STEPS * ENVS, {(0, 0)})
    for name, tensor in learner.agent.actor.state_dict().items():
        torch.testing.assert_close(restored.agent.actor.state_dict()[name], tensor)
    # the restored policy is published as a new version, ahead of what the runners had
    assert restored.version == learner.version + 1


def test_next_values_follow_the_chunk_and_bootstrap_through_time_limits():
    """V of the state each step led to: the next row's inside a chunk, V(next_obs) after the last step and after a
    truncation (the reset obs follows it in obs); checked against the network on next_obs directly."""
    cfg = compose("train", ["algo=impala", "env=cartpole", "env.num_envs=3", "+env.kwargs.max_episode_steps=5"])
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    runner = EnvRunner(0, as_dict(cfg.env), as_dict(cfg.model.actor), ["env_reward"], None, 0, 12, 2, 0,
                       behaviour=True)
    try:
        chunk = {key: np.array(value) for key, value in runner.collect(12).items()}
    finally:
        runner.close()
    chunk["reward"] = chunk["env_reward"]
    meta = {"size": 36, "envs": 3}
    (group,) = trajectories([(meta, chunk)], "cpu")
    assert group["truncated"].any()  # 5-step time limits inside 12 steps
    model = ActorCritic(4, 2, hidden=(8,))
    agent = VTraceAgent(model, VTraceConfig(), "cpu")
    with torch.no_grad():
        values = model.value(group["obs"].reshape(-1, 4)).reshape(12, 3)
        direct = model.value(torch.as_tensor(chunk["next_obs"]).reshape(-1, 4)).reshape(12, 3)
    next_values = agent._next_values(group, values)
    live = ~group["terminated"]  # terminated steps do not bootstrap: their next value is unused
    torch.testing.assert_close(next_values[live], direct[live])


def test_chunks_of_two_lengths_train_in_one_batch(cartpole):
    """A runner's last chunk is cut short at its step budget: it joins the batch as its own group."""
    cfg, runner = cartpole
    learner, _ = make_learner(cfg, "batch_chunks=3")
    chunks = [labeled_chunk(runner, 0, 1), labeled_chunk(runner, 1, 1), labeled_chunk(runner, 2, 1, steps=5)]
    chunks[2][0]["size"] = 5 * ENVS
    groups = trajectories(chunks, "cpu")
    assert sorted(g["reward"].shape for g in groups) == [(5, ENVS), (STEPS, 2 * ENVS)]
    learner._store(chunks)
    learner._update(1)
    assert learner.updates == 1 and np.isfinite(float(learner._last_metrics["policy_loss"]))


def test_appo_target_network_is_refreshed_every_k_steps_and_checkpointed(cartpole, tmp_path):
    cfg, runner = cartpole
    appo = compose("train", ["algo=appo", "env=cartpole", f"env.num_envs={ENVS}", f"algo.chunk_steps={STEPS}"])
    learner, _ = make_learner(appo, "batch_chunks=1", "epochs=1", "target_update_every=2")
    agent = learner.agent
    initial = {k: v.clone() for k, v in agent.actor.state_dict().items()}
    same = lambda a, b: all(torch.equal(a[k], b[k]) for k in a)  # noqa: E731
    learner._store([labeled_chunk(runner, 0, 1)])
    learner._update(1)
    assert same(agent.target.state_dict(), initial) and not same(agent.actor.state_dict(), initial)  # 1 step: kept
    learner._store([labeled_chunk(runner, 1, 1)])
    learner._update(1)
    assert same(agent.target.state_dict(), agent.actor.state_dict())  # step 2: refreshed
    learner._store([labeled_chunk(runner, 2, 1)])
    learner._update(1)
    restored, _ = make_learner(appo, "batch_chunks=1", "epochs=1", "target_update_every=2")
    restored.load(learner.save(str(tmp_path / "t.pt")))
    assert restored.agent.steps == 3 and same(restored.agent.target.state_dict(), agent.target.state_dict())
    assert not same(restored.agent.target.state_dict(), restored.agent.actor.state_dict())
