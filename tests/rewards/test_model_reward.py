import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from rlfarm.config import compose
from rlfarm.rewards import BrightnessReward, ModuleReward, RewardModelError

BRIGHTNESS = "rlfarm.rewards.model.BrightnessReward"


def frames(*levels: int) -> dict[str, np.ndarray]:
    """One 8×8 frame per brightness level."""
    return {"frames": np.stack([np.full((8, 8, 3), level, np.uint8) for level in levels])}


def ready(reward: ModuleReward) -> ModuleReward:
    reward.setup("cpu")
    return reward


def test_module_node_maps_frames_to_rewards():
    reward = ready(ModuleReward(module={"_target_": BRIGHTNESS, "scale": 2.0}, frame_size=16, max_batch=2))
    assert reward.needs == ("frames",) and reward.frame_size == 16
    rewards = reward(frames(0, 255, 51))
    assert rewards.dtype == np.float32
    np.testing.assert_allclose(rewards, [0.0, 2.0, 0.4], rtol=1e-6)


def test_module_node_with_state_dict_checkpoint(tmp_path):
    checkpoint = tmp_path / "brightness.pt"
    torch.save(BrightnessReward(scale=3.0).state_dict(), checkpoint)
    reward = ready(ModuleReward(module={"_target_": BRIGHTNESS}, checkpoint=str(checkpoint)))
    np.testing.assert_allclose(reward(frames(255)), [3.0])


def test_torchscript_checkpoint(tmp_path):
    checkpoint = tmp_path / "brightness.ts"
    torch.jit.script(BrightnessReward(scale=0.5)).save(str(checkpoint))
    reward = ready(ModuleReward(checkpoint=str(checkpoint)))
    np.testing.assert_allclose(reward(frames(255, 0)), [0.5, 0.0])


def test_nan_rewards_raise_naming_the_module():
    reward = ready(ModuleReward(module={"_target_": BRIGHTNESS, "scale": float("nan")}))
    with pytest.raises(RewardModelError, match=f"{BRIGHTNESS} returned 2 NaN/inf rewards"):
        reward(frames(1, 2))


class TwoRewards(torch.nn.Module):
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return frames.float().mean(dim=(1, 2))[:, :2]


def test_wrong_output_shape_is_found_by_the_probe_at_setup(tmp_path):
    """Before the first bus: every bus of a module returning [n, 2] would be quarantined."""
    checkpoint = tmp_path / "two.ts"
    torch.jit.script(TwoRewards()).save(str(checkpoint))
    with pytest.raises(RewardModelError, match=r"reward module .*two.ts returned shape \[2, 2\] \(torch.float32\) for "
                       r"a probe batch of frames \[2, 84, 84, 3\] uint8; it must return \[n\] or \[n, 1\] floats"):
        ready(ModuleReward(model=str(checkpoint)))  # a TorchScript file through reward.model


def test_missing_checkpoint_and_missing_module_raise(tmp_path):
    with pytest.raises(RewardModelError, match="no checkpoint at"):
        ready(ModuleReward(checkpoint=str(tmp_path / "absent.ts")))
    with pytest.raises(RewardModelError, match="reward.module"):
        ModuleReward()


def test_model_config_builds_the_module_only_in_setup():
    cfg = compose("train", ["reward=model", "reward.frame_size=16", f"reward.module._target_={BRIGHTNESS}",
                            "+reward.module.scale=1.0"])
    reward = instantiate(cfg.reward)
    assert isinstance(reward, ModuleReward) and reward.frame_size == 16
    assert reward.module == {"_target_": BRIGHTNESS, "scale": 1.0}  # still a node: labelers build it on their device
    reward.setup("cpu")
    np.testing.assert_allclose(reward(frames(255)), [1.0])


@pytest.mark.gpu
def test_cuda_calls_are_queued_and_checked_when_taken():
    """On CUDA a call returns before its result is there (the labeler prepares its next bus meanwhile); a bus split
    across chunks gives what one array gives, and NaN rewards still raise naming the module, when taken."""
    reward = ModuleReward(module={"_target_": BRIGHTNESS, "scale": 2.0}, frame_size=8, max_batch=2)
    reward.setup("cuda:0")
    whole = frames(0, 255, 51, 102, 204)
    first = reward.start({"frames": [whole["frames"][:3], whole["frames"][3:]]})
    second = reward.start(whole)
    np.testing.assert_allclose(first.result(), [0.0, 2.0, 0.4, 0.8, 1.6], rtol=1e-2)
    np.testing.assert_allclose(second.result(), first.result())
    poisoned = ModuleReward(module={"_target_": BRIGHTNESS, "scale": float("nan")}, frame_size=8)
    poisoned.setup("cuda:0")
    pending = poisoned.start(frames(1, 2))
    with pytest.raises(RewardModelError, match=f"{BRIGHTNESS} returned 2 NaN/inf rewards"):
        pending.result()
