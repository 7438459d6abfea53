import json
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from rlfarm.config import compose
from rlfarm.envs import VectorEnv
from rlfarm.rewards.graphed import GraphedRows
from rlfarm.rewards import ClipReward, RewardModelError, goal_baseline_reward

IMAGE_SIZE = 32


@pytest.fixture(scope="module")
def tiny_clip(tmp_path_factory) -> str:
    """A randomly initialised CLIP (32 px input) with a character-level tokenizer, saved as a hub folder would be."""
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for char in string.ascii_lowercase:
        vocab[char] = len(vocab)
        vocab[char + "</w>"] = len(vocab)
    tower = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(
        text_config=dict(tower, vocab_size=len(vocab), max_position_embeddings=32, bos_token_id=0, eos_token_id=1),
        vision_config=dict(tower, image_size=IMAGE_SIZE, patch_size=8),
        projection_dim=8,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_clip")
    CLIPModel(config).save_pretrained(path)
    CLIPTokenizer(vocab=vocab, merges=[]).save_pretrained(path)
    stats = {"image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28]}
    (path / "preprocessor_config.json").write_text(json.dumps(stats))
    return str(path)


def make_reward(model: str, **overrides) -> ClipReward:
    kwargs = dict(goal_prompts=["a cheetah running fast"], baseline_prompts=["a cheetah"], alpha=0.5)
    reward = ClipReward(model=model, **(kwargs | overrides))
    reward.setup("cpu")
    return reward


def test_goal_baseline_reward_matches_hand_computed_values():
    g, b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    x = torch.tensor([[0.6, 0.8], [1.0, 0.0]])
    # d = (1, -1); x - g = (-0.4, 0.8): alpha 0 → 1 − ½·0.8 = x·g = 0.6; alpha 1 → its part along d is
    # (-0.6, 0.6), 1 − ½·0.72 = 0.64; alpha ½ → ½(-0.6, 0.6) + ½(-0.4, 0.8) = (-0.5, 0.7), 1 − ½·0.74 = 0.63.
    for alpha, expected in [(0.0, 0.6), (1.0, 0.64), (0.5, 0.63)]:
        torch.testing.assert_close(goal_baseline_reward(x, g, b, alpha), torch.tensor([expected, 1.0]))


def test_goal_baseline_reward_alpha_0_is_cosine_and_1_is_at_goal():
    x, g, b = torch.nn.functional.normalize(torch.randn(3, 5, 16), dim=-1)
    torch.testing.assert_close(goal_baseline_reward(x, g[0], b[0], 0.0), x @ g[0])
    torch.testing.assert_close(goal_baseline_reward(x, g[0], b[0], 0.0), 1 - 0.5 * (x - g[0]).pow(2).sum(-1))
    for alpha in (0.0, 0.3, 1.0):
        torch.testing.assert_close(goal_baseline_reward(g[:1], g[0], b[0], alpha), torch.ones(1))


def test_clip_reward_on_frames_is_finite_per_frame_and_batch_independent(tiny_clip):
    frames = np.random.default_rng(0).integers(0, 256, size=(5, 40, 48, 3), dtype=np.uint8)  # non-square: cropped
    rewards = make_reward(tiny_clip)({"frames": frames})
    assert rewards.shape == (5,) and rewards.dtype == np.float32
    assert np.isfinite(rewards).all() and len(np.unique(rewards)) == 5
    np.testing.assert_allclose(make_reward(tiny_clip, max_batch=2)({"frames": frames}), rewards, rtol=1e-5, atol=1e-6)
    # a labeler hands over its chunks' frames as they came (takes_parts): sub-batches of 2 span the chunks
    parts = [frames[:3], frames[3:4], frames[4:]]
    np.testing.assert_allclose(make_reward(tiny_clip, max_batch=2)({"frames": parts}), rewards, rtol=1e-5, atol=1e-6)


def test_clip_reward_matches_transformers_clip_features(tiny_clip):
    """Same numbers as embedding with transformers' own CLIP API and applying the projection reward."""
    from transformers import AutoTokenizer, CLIPModel

    frames = np.random.default_rng(1).integers(0, 256, size=(3, IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    clip, tokenizer = CLIPModel.from_pretrained(tiny_clip).eval(), AutoTokenizer.from_pretrained(tiny_clip)
    stats = json.loads((Path(tiny_clip) / "preprocessor_config.json").read_text())
    mean, std = (torch.tensor(stats[key]).view(1, 3, 1, 1) for key in ("image_mean", "image_std"))
    pixels = (torch.from_numpy(frames).permute(0, 3, 1, 2) / 255 - mean) / std
    with torch.inference_mode():
        x = clip.get_image_features(pixel_values=pixels).pooler_output
        g, b = (clip.get_text_features(**tokenizer([p], return_tensors="pt")).pooler_output[0] for p in ("go", "stay"))
    normalize = torch.nn.functional.normalize
    expected = goal_baseline_reward(normalize(x, dim=-1), normalize(g, dim=0), normalize(b, dim=0), 0.5)
    reward = make_reward(tiny_clip, goal_prompts=["go"], baseline_prompts=["stay"])
    np.testing.assert_allclose(reward({"frames": frames}), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_clip_reward_on_rendered_halfcheetah_frames(tiny_clip):
    env = VectorEnv("HalfCheetah-v5", num_envs=2, frame_size=48)  # resized to the model's 32 px
    env.reset()
    frames = np.concatenate([env.step(np.ones((2, 6), np.float32)).frames for _ in range(3)])
    env.close()
    reward = make_reward(tiny_clip, frame_size=48)
    assert reward.needs == ("frames",) and reward.frame_size == 48
    rewards = reward({"frames": frames})
    assert rewards.shape == (6,) and np.isfinite(rewards).all()


@pytest.mark.gpu
@pytest.mark.parametrize("compile, graphs", [(False, False), (True, False), (False, True), (True, True)])
def test_cuda_bf16_rewards_agree_with_cpu_fp32(tiny_clip, compile, graphs):
    frames = np.random.default_rng(2).integers(0, 256, size=(300, 48, 48, 3), dtype=np.uint8)
    reference = make_reward(tiny_clip)({"frames": frames})
    reward = ClipReward(tiny_clip, ["a cheetah running fast"], ["a cheetah"], compile=compile, max_batch=128,
                        frame_size=48, cuda_graphs=graphs)
    reward.setup("cuda:0")
    assert isinstance(reward._rewards_of, GraphedRows) == graphs
    np.testing.assert_allclose(reward({"frames": frames}), reference, atol=5e-3)
    # a second call reuses the pinned staging buffers: nothing of the first call's frames may leak into it
    np.testing.assert_allclose(reward({"frames": frames[::-1]}), reference[::-1], atol=5e-3)
    # calls started back to back, as a labeler overlaps buses: the second fills the staging buffers while the first
    # may still read them on the device
    first, second = reward.start({"frames": [frames[:100], frames[100:]]}), reward.start({"frames": frames[::-1]})
    np.testing.assert_allclose(second.result(), reference[::-1], atol=5e-3)
    np.testing.assert_allclose(first.result(), reference, atol=5e-3)


@pytest.mark.gpu
def test_compiled_tower_compiles_at_setup_and_never_again(tiny_clip):
    """reward.compile=true: the compile happens in setup (labeler start-up), with the batch dimension dynamic, so buses
    of any size (full sub-batches, tails, a single frame) run without another compile and agree with eager."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # another test of this process may have compiled the same tower already
    frames = np.random.default_rng(3).integers(0, 256, size=(300, 48, 48, 3), dtype=np.uint8)
    eager = ClipReward(tiny_clip, ["a cheetah running fast"], ["a cheetah"], max_batch=128, cuda_graphs=False)
    eager.setup("cuda:0")
    # replayed as CUDA graphs (the default): captured in setup too, so no call compiles or captures
    reward = ClipReward(tiny_clip, ["a cheetah running fast"], ["a cheetah"], compile=True, max_batch=128, frame_size=48)
    before = counters["stats"]["unique_graphs"]
    reward.setup("cuda:0")
    compiled = counters["stats"]["unique_graphs"]
    assert compiled > before  # compiled in setup
    for size in (300, 128, 77, 9, 2, 1):  # sub-batches of 128 + tails of every kind (padded to their size class)
        np.testing.assert_allclose(reward({"frames": frames[:size]}), eager({"frames": frames[:size]}), atol=5e-3)
    assert counters["stats"]["unique_graphs"] == compiled  # no compile after setup


def test_missing_model_path_is_one_line_error(tmp_path):
    missing = tmp_path / "no_such_clip"
    with pytest.raises(RewardModelError) as error:
        make_reward(str(missing))
    message = str(error.value)
    assert "\n" not in message and str(missing) in message and "reward.model=/path/to/clip" in message


def test_folder_without_model_is_one_line_error(tmp_path):
    with pytest.raises(RewardModelError) as error:
        make_reward(str(tmp_path))
    assert "\n" not in str(error.value) and str(tmp_path) in str(error.value)


def test_identical_goal_and_baseline_prompts_are_refused(tiny_clip):
    with pytest.raises(RewardModelError, match="embed identically"):
        make_reward(tiny_clip, goal_prompts=["a cheetah"], baseline_prompts=["a cheetah"])


def test_clip_config_composes_and_instantiates(tiny_clip):
    cfg = compose("train", ["reward=clip", f"reward.model={tiny_clip}", "reward.frame_size=32"])
    reward = instantiate(cfg.reward)
    assert isinstance(reward, ClipReward) and reward.frame_size == 32
    reward.setup("cpu")
    assert reward({"frames": np.zeros((2, 32, 32, 3), np.uint8)}).shape == (2,)
