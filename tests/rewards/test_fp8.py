"""reward.precision=fp8: FP8 linear layers through torch._scaled_mm (its CPU kernel checks the math here), and the
one-line refusal where a labeler has no FP8 GPU."""
import pytest
import torch
from torch import nn

from rlfarm.rewards import ClipReward, RewardModelError
from rlfarm.rewards.fp8 import Fp8Linear, to_fp8


def test_fp8_linear_is_the_linear_within_e4m3_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    x = torch.randn(3, 5, 64)
    expected, got = linear(x), Fp8Linear(linear)(x)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    error = (got - expected).norm() / expected.norm()
    assert 0 < error < 0.05  # e4m3 keeps 3 mantissa bits: a few percent, and never exact


def test_to_fp8_replaces_the_linears_the_fp8_matmul_takes_in_the_named_children_only():
    model = nn.ModuleDict({"tower": nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)),
                           "head": nn.Linear(32, 32)})
    assert to_fp8(model, only=("tower",)) == 1  # 64 -> 8 is no multiple of 16: it stays
    assert isinstance(model["tower"][0], Fp8Linear) and isinstance(model["tower"][2], nn.Linear)
    assert isinstance(model["head"], nn.Linear) and not isinstance(model["head"], Fp8Linear)


def test_clip_in_fp8_is_refused_on_cpu_in_one_line():
    reward = ClipReward("no/model/read", ["a cheetah running fast"], ["a cheetah"], precision="fp8")  # refused first
    with pytest.raises(RewardModelError) as error:
        reward.setup("cpu")
    assert str(error.value).startswith("reward.precision=fp8 needs an Ada or Hopper GPU, but this labeler runs on a CPU")
    assert "\n" not in str(error.value)
    with pytest.raises(RewardModelError, match="reward.precision='fp16' is not a tower precision"):
        ClipReward("unused", ["go"], ["stay"], precision="fp16")


@pytest.mark.gpu
def test_clip_in_fp8_keeps_the_bf16_rewards_order(tmp_path):
    from rlfarm.bench.labeler import rank_correlation, varied_frames
    from rlfarm.rewards.clip_factory import save_random_clip

    model = str(save_random_clip(tmp_path / "clip", "vit-b-16"))
    frames = varied_frames(512, 224)
    rewards = {}
    for precision in (None, "fp8"):
        reward = ClipReward(model, ["a cheetah running fast"], ["a cheetah"], precision=precision, max_batch=128)
        reward.setup("cuda:0")
        rewards[precision] = reward({"frames": frames})
    assert rank_correlation(rewards[None], rewards["fp8"]) > 0.8  # a wrong scale or layout gives about 0
