"""rlfarm/evaluation.py alone: episodes, frames, reward-model scoring, videos and checkpoint choice (no Ray)."""
import os
import time

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlfarm.errors import RlfarmError
from rlfarm.evaluation import (find_checkpoint, play_episode, resize_frames, score_with_reward_model, stack_frames,
                               write_video)
from rlfarm.models.mlp import SquashedGaussianActor
from rlfarm.rewards import ModuleReward

PENDULUM = OmegaConf.create({"id": "Pendulum-v1", "num_envs": 1, "kwargs": {"max_episode_steps": 20}})


@pytest.fixture(scope="module")
def actor():
    torch.manual_seed(0)
    return SquashedGaussianActor(3, 1, np.array([-2.0], np.float32), np.array([2.0], np.float32), hidden=[16]).eval()


def test_episode_depends_only_on_its_seed(actor):
    first = play_episode(actor, PENDULUM, seed=5, frame_size=32)
    assert first.length == 20 and len(first.env_rewards) == 20 and first.frames.shape == (20, 32, 32, 3)
    assert first.episode_return == pytest.approx(float(first.env_rewards.sum()), rel=1e-5)
    unfilmed = play_episode(actor, PENDULUM, seed=5)
    assert unfilmed.frames is None and unfilmed.episode_return == first.episode_return
    assert play_episode(actor, PENDULUM, seed=6).episode_return != first.episode_return


def test_reward_model_scores_frames_at_its_own_size(actor):
    episode = play_episode(actor, PENDULUM, seed=1, frame_size=64)
    model = ModuleReward(module={"_target_": "rlfarm.rewards.model.BrightnessReward"}, frame_size=16)
    model.setup("cpu")
    expected = model({"frames": resize_frames(episode.frames, 16)}).sum()
    assert resize_frames(episode.frames, 16).shape == (20, 16, 16, 3)
    assert score_with_reward_model(model, episode) == pytest.approx(float(expected), rel=1e-6)


def test_stacked_frames_for_a_reward_that_reads_two_renders():
    frames = np.arange(4, dtype=np.uint8).reshape(4, 1, 1, 1).repeat(3, axis=-1)  # frame i is all i
    stacked = stack_frames(frames, 2)
    assert stacked.shape == (4, 1, 1, 6)
    assert stacked[:, 0, 0, 0].tolist() == [0, 0, 1, 2] and stacked[:, 0, 0, 3].tolist() == [0, 1, 2, 3]
    assert stack_frames(frames, 1) is frames


def test_video_has_one_frame_per_step(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, size=(12, 32, 48, 3), dtype=np.uint8)
    path = write_video(tmp_path / "v" / "episode.mp4", frames, fps=30)
    reader = imageio.get_reader(path)
    decoded = [frame for frame in reader]
    reader.close()
    assert len(decoded) == 12 and decoded[0].shape == (32, 48, 3)


def test_checkpoint_choice(tmp_path):
    with pytest.raises(RlfarmError, match="no checkpoint in"):
        find_checkpoint(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    final, older = tmp_path / "checkpoints" / "final.pt", tmp_path / "checkpoints" / "step_100.pt"
    final.write_bytes(b"x")
    older.write_bytes(b"x")
    os.utime(older, (time.time() - 60, time.time() - 60))
    assert find_checkpoint(tmp_path, "latest") == final
    assert find_checkpoint(tmp_path, "final") == final
    assert find_checkpoint(tmp_path, "step_100") == older == find_checkpoint(tmp_path, "step_100.pt")
    with pytest.raises(RlfarmError, match="one of: step_100.pt, final.pt"):
        find_checkpoint(tmp_path, "nope.pt")
