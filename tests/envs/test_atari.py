"""env=atari (ale-py, ROMs in its wheel) with the standard preprocessing, and the conv actor-critic that reads it:
uint8 [4, 84, 84] observations kept uint8 in the runners' step buffers, behaviour log-probs recorded per step, both
encoders' forward passes, and a real learner update on a real chunk."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlfarm.algos.vtrace_agent import VTraceAgent, VTraceConfig, trajectories
from rlfarm.config import compose
from rlfarm.envs.atari import check_game
from rlfarm.errors import RlfarmError
from rlfarm.models.conv_actor_critic import ConvActorCritic
from rlfarm.roles.env_runner import EnvRunner

pytest.importorskip("ale_py")
STEPS, ENVS, OBS = 8, 2, 4 * 84 * 84


def test_unknown_game_names_the_closest():
    with pytest.raises(RlfarmError, match="unknown Atari game 'Breakoutt' \\(closest: Breakout"):
        check_game("Breakoutt")


def test_a_runner_records_uint8_frames_and_behaviour_logprobs_and_the_learner_trains_on_them():
    cfg = compose("train", ["algo=appo", "env=atari", "model=cnn_actor_critic", f"env.num_envs={ENVS}"])
    as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    runner = EnvRunner(0, as_dict(cfg.env), as_dict(cfg.model.actor), ["env_reward"], None, 0, STEPS, 2, 0,
                       behaviour=True)
    try:
        chunk = {key: np.array(value) for key, value in runner.collect(STEPS).items()}
    finally:
        runner.close()
    assert chunk["obs"].shape == (STEPS * ENVS, 4, 84, 84) and chunk["obs"].dtype == np.uint8
    assert chunk["next_obs"].dtype == np.uint8 and chunk["obs"].max() > 0  # real screens, not blanks
    assert chunk["action"].dtype == np.int64 and chunk["logprob"].shape == (STEPS * ENVS,)
    # 6 actions in Pong, a near-uniform first policy: log μ ≈ log(1/6)
    np.testing.assert_allclose(chunk["logprob"], np.log(1 / 6), atol=0.05)
    chunk["reward"] = chunk["env_reward"]
    meta = {"size": STEPS * ENVS, "envs": ENVS}
    model = runner.policy
    agent = VTraceAgent(model, VTraceConfig(loss="appo"), "cpu")
    before = [p.detach().clone() for p in model.parameters()]
    parts = agent.update(trajectories([(meta, chunk)], "cpu"))
    assert all(torch.isfinite(v) for v in parts.values())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("encoder", ["nature", "impala"])
def test_conv_actor_critic_takes_flat_uint8_images(encoder):
    model = ConvActorCritic(OBS, 6, encoder=encoder)
    obs = torch.randint(0, 256, (3, OBS), dtype=torch.uint8)
    action, logprob, value = model.sample(obs)
    assert action.shape == (3,) and logprob.shape == (3,) and value.shape == (3,)
    logprob2, entropy, value2 = model.evaluate(obs, action)
    torch.testing.assert_close(logprob2, logprob)
    torch.testing.assert_close(value2, value)
    assert (entropy > 1.7).all()  # near-uniform over 6 actions (ln 6 = 1.79)
    assert model.act(obs, deterministic=True).shape == (3,)


def test_conv_actor_critic_refuses_images_it_cannot_square():
    with pytest.raises(ValueError, match="square images"):
        ConvActorCritic(4 * 84 * 80, 6)
