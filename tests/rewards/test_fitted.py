"""Fitted rewards (rlfarm/rewards/fitted.py, rlfarm/reward_fitting/): a fit learns a function of the frames, the
file it writes labels exactly as the fitted network scores, and a frozen tower stays out of the file."""
import numpy as np
import pytest
import torch

from rlfarm.reward_fitting.collect import LabeledFrames, collect, load_labels
from rlfarm.reward_fitting.fit import fit, held_out_metrics, score, split_by_episode
from rlfarm.reward_fitting.report import calibration_bins
from rlfarm.rewards import ModuleReward, RewardModelError
from rlfarm.rewards.fitted import GoalBaselineHead, PixelCNN, read_fitted, save_fitted


def bright_square_frames(n: int, size: int = 16, seed: int = 0) -> LabeledFrames:
    """Frames with a white square at a random height on black; the target is how high it sits (0 bottom, 1 top),
    10 frames per episode."""
    rng = np.random.default_rng(seed)
    heights = rng.integers(0, size - 4, n)
    frames = np.zeros((n, size, size, 3), np.uint8)
    for i, h in enumerate(heights):
        frames[i, size - 4 - h : size - h, 6:10] = 255
    targets = (heights / (size - 5)).astype(np.float32)
    return LabeledFrames(frames, targets, targets.copy(), np.arange(n) // 10)


def test_a_stack_of_two_frames_lets_the_cnn_see_motion(one_torch_thread):
    """The target is how far the square moved between two frames: invisible in one frame, plain in a stack."""
    before, after = bright_square_frames(600, seed=1), bright_square_frames(600, seed=2)
    stacked = LabeledFrames(np.concatenate([before.frames, after.frames], axis=-1), after.targets - before.targets,
                            after.targets - before.targets, before.episode)
    one_frame = LabeledFrames(after.frames, stacked.targets, stacked.targets, before.episode)
    fits = {k: fit(PixelCNN(frame_size=16, channels=(8, 16), hidden=32, frame_stack=k), data, epochs=15,
                   batch_size=32, lr=3e-3, weight_decay=0.0, holdout=0.2, seed=0).held_out["r2"]
            for k, data in ((1, one_frame), (2, stacked))}
    assert fits[2] > 0.8 and fits[1] < 0.6, fits


def test_split_holds_out_whole_episodes():
    episode = np.repeat(np.arange(10), 7)
    train, held = split_by_episode(episode, 0.3, seed=0)
    assert len(set(episode[held])) == 3 and not set(episode[train]) & set(episode[held])
    assert sorted(np.concatenate([train, held])) == list(range(70))
    with pytest.raises(ValueError, match="at least 2 episodes"):
        split_by_episode(np.zeros(5, int), 0.2, seed=0)


def test_held_out_metrics_and_calibration_by_hand():
    true, predicted = np.array([0.0, 1.0, 2.0, 3.0]), np.array([0.0, 1.0, 2.0, 5.0])
    metrics = held_out_metrics(predicted, true)
    assert metrics["mse"] == pytest.approx(1.0) and metrics["mae"] == pytest.approx(0.5)
    assert metrics["r2"] == pytest.approx(1 - 1.0 / 1.25)
    assert calibration_bins(predicted, true, bins=2) == [{"true": 0.5, "predicted": 0.5, "frames": 2},
                                                         {"true": 2.5, "predicted": 3.5, "frames": 2}]


def test_spearman_gives_tied_values_their_mean_rank():
    """A thresholded teacher (0/1) against scores that separate its classes: the same rho whatever order the frames of
    a class came in (ranks broken by position gave 1.0 for one order, 0.52 for the other)."""
    true = np.array([0.0, 0, 0, 0, 1, 1, 1, 1])
    for predicted in ([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [0.4, 0.3, 0.2, 0.1, 0.8, 0.7, 0.6, 0.5]):
        assert held_out_metrics(np.array(predicted), true)["spearman"] == pytest.approx(np.sqrt(48 / 63))


def test_cnn_fits_a_function_of_the_pixels_and_its_file_labels_as_it_scores(tmp_path, one_torch_thread):
    data = bright_square_frames(400)
    net = PixelCNN(frame_size=16, channels=(8, 16), hidden=32)
    result = fit(net, data, epochs=15, batch_size=32, lr=3e-3, weight_decay=0.0, holdout=0.2, seed=0)
    assert result.held_out["r2"] > 0.9, result.held_out  # the height of a square: an easy, exact function
    assert result.curve[result.best_epoch]["held_out_mse"] == min(c["held_out_mse"] for c in result.curve)

    node = {"_target_": "rlfarm.rewards.fitted.PixelCNN", "frame_size": 16, "channels": [8, 16], "hidden": 32}
    path = save_fitted(tmp_path / "reward_model.pt", node, net, 16, {"target": "env_reward"})
    reward = ModuleReward(model=str(path), frame_size=84)  # the file's frame size wins over the config's
    assert reward.frame_size == 16 and reward.needs == ("frames",)
    reward.setup("cpu")
    np.testing.assert_allclose(reward({"frames": data.frames[:50]}), score(net, data.frames[:50], "cpu"), atol=1e-6)


def test_a_file_that_is_not_a_fitted_reward_is_one_line(tmp_path):
    plain = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, plain)
    with pytest.raises(RewardModelError, match="not a fitted-reward file"):
        read_fitted(plain)
    (tmp_path / "junk.pt").write_text("junk")
    with pytest.raises(RewardModelError, match="cannot read fitted reward"):
        ModuleReward(model=str(tmp_path / "junk.pt"))


def test_goal_baseline_head_on_a_frozen_tower_keeps_the_tower_out_of_the_file(tmp_path, one_torch_thread):
    from rlfarm.rewards.clip_factory import save_random_clip

    tower = save_random_clip(tmp_path / "clip", "tiny")
    data = bright_square_frames(200, size=32)
    net = GoalBaselineHead(str(tower), alpha=0.5)
    result = fit(net, data, epochs=20, batch_size=64, lr=1e-2, weight_decay=0.0, holdout=0.2, seed=0)
    # the learned goal/baseline improve on their data-dependent start (epoch 0) on frames never fitted to
    assert result.curve[result.best_epoch]["held_out_mse"] < result.curve[0]["held_out_mse"], result.curve
    node = {"_target_": "rlfarm.rewards.fitted.GoalBaselineHead", "tower": str(tower), "alpha": 0.5}
    path = save_fitted(tmp_path / "reward_model.pt", node, net, 32, {"target": "env_reward"})
    saved = read_fitted(path)["state"]
    assert set(saved) == {"target_mean", "target_std", "goal", "baseline", "gain", "bias"}
    reward = ModuleReward(model=str(path))
    reward.setup("cpu")
    np.testing.assert_allclose(reward({"frames": data.frames[:20]}), score(net, data.frames[:20], "cpu"), atol=1e-5)


def test_collect_pairs_each_frame_with_its_steps_reward_and_episode():
    data = collect("Pendulum-v1", {"max_episode_steps": 5}, count=23, frame_size=24, target="env_reward", num_envs=2)
    assert data.frames.shape == (23, 24, 24, 3) and data.frames.dtype == np.uint8
    assert np.array_equal(data.targets, data.env_reward) and (data.targets <= 0).all()
    # two sub-envs stepped in turn, 5-step episodes: episodes 0 and 1 first, then 2 and 3, ...
    assert data.episode[:10].tolist() == [0, 1] * 5 and data.episode[10:12].tolist() == [2, 3]
    with pytest.raises(Exception, match="reports no success"):
        collect("Pendulum-v1", {}, count=4, frame_size=8, target="success", num_envs=1)


def test_labels_from_a_file_are_resized_and_checked(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (12, 32, 32, 3), dtype=np.uint8)
    np.savez(tmp_path / "labels.npz", frames=frames, rewards=np.arange(12.0))
    data = load_labels(tmp_path / "labels.npz", 16)
    assert data.frames.shape == (12, 16, 16, 3) and data.targets.tolist() == list(range(12))
    assert len(set(data.episode.tolist())) == 12  # no episodes given: each frame is its own
    np.savez(tmp_path / "bad.npz", frames=frames, rewards=np.arange(3.0))
    with pytest.raises(Exception, match="rewards \\[n\\]"):
        load_labels(tmp_path / "bad.npz", 16)
