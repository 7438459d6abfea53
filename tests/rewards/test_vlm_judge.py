"""reward=vlm_judge: a tiny random-weight LLaVA saved as a hub folder; its rewards against transformers' own processor
and forward, its one-line errors, and a SAC run it labels end to end."""
import json

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from helpers import rlfarm
from rlfarm.config import compose
from rlfarm.rewards import RewardModelError
from rlfarm.rewards.vlm_factory import OPENAI_STATS, save_random_judge
from rlfarm.rewards.vlm_judge import VlmJudgeReward

SIDE = 32  # the tiny shape's input: frames at this size go in unresized, as the processor below takes them
QUESTION = "Is the robot running fast?"


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory) -> str:
    return str(save_random_judge(tmp_path_factory.mktemp("tiny_judge"), "tiny_shape"))


def hf_answer_logits(path: str, frames: np.ndarray, template: str, images_per_row: int = 1) -> torch.Tensor:
    """The next-token logits after the prompt, as transformers' LlavaProcessor and forward compute them."""
    from transformers import AutoTokenizer, LlavaForConditionalGeneration, LlavaProcessor
    try:  # transformers without torchvision: the PIL backend (the GPU machine's may have either)
        from transformers import CLIPImageProcessorPil as CLIPImageProcessor
    except ImportError:
        from transformers import CLIPImageProcessor

    model = LlavaForConditionalGeneration.from_pretrained(path).eval()
    images = CLIPImageProcessor(size={"shortest_edge": SIDE}, crop_size={"height": SIDE, "width": SIDE},
                                do_resize=False, do_center_crop=False, **OPENAI_STATS)
    processor = LlavaProcessor(image_processor=images, tokenizer=AutoTokenizer.from_pretrained(path),
                               patch_size=model.config.vision_config.patch_size, image_token="<image>",
                               num_additional_image_tokens=1,  # the class token, as llava-hf checkpoints set it
                               vision_feature_select_strategy=model.config.vision_feature_select_strategy)
    prompt = template.format(question=QUESTION)
    inputs = processor(text=[prompt] * (len(frames) // images_per_row), images=list(frames), return_tensors="pt")
    with torch.inference_mode():
        return model(**inputs).logits[:, -1]


def judge(path: str, **overrides) -> VlmJudgeReward:
    reward = VlmJudgeReward(path, **({"question": QUESTION, "max_batch": 2} | overrides))
    reward.setup("cpu")
    return reward


def test_judge_rewards_are_the_hf_models_answer_log_odds_and_p_yes(tiny_judge):
    frames = np.random.default_rng(0).integers(0, 256, size=(5, SIDE, SIDE, 3), dtype=np.uint8)
    reward = judge(tiny_judge)
    logits = hf_answer_logits(tiny_judge, frames, reward.template)
    yes, no = reward._yes, reward._no
    expected = (logits.log_softmax(-1)[:, yes] - logits.log_softmax(-1)[:, no]).numpy()
    parts = [frames[:3], frames[3:4], frames[4:]]  # as a labeler hands over its chunks; sub-batches of 2 span them
    rewards = reward({"frames": parts})
    assert rewards.shape == (5,) and rewards.dtype == np.float32 and len(np.unique(rewards)) == 5
    np.testing.assert_allclose(rewards, expected, rtol=1e-4, atol=1e-4)
    p_yes = judge(tiny_judge, score="p_yes")({"frames": frames})
    np.testing.assert_allclose(p_yes, logits.softmax(-1)[:, yes].numpy(), rtol=1e-4, atol=1e-6)


def test_a_frame_pair_is_two_images_in_one_prompt(tiny_judge):
    template = "USER: <image> <image>\n{question} Answer yes or no. ASSISTANT:"
    renders = np.random.default_rng(1).integers(0, 256, size=(3, 2, SIDE, SIDE, 3), dtype=np.uint8)
    stacked = renders.transpose(0, 2, 3, 1, 4).reshape(3, SIDE, SIDE, 6)  # the runners' [n, S, S, 3k], oldest first
    logits = hf_answer_logits(tiny_judge, renders.reshape(6, SIDE, SIDE, 3), template, images_per_row=2)
    reward = judge(tiny_judge, template=template, frame_stack=2)
    np.testing.assert_allclose(reward({"frames": stacked}), (logits[:, reward._yes] - logits[:, reward._no]).numpy(),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("overrides, message", [
    ({"yes_word": "Absolutely"}, "reward.yes_word='Absolutely' is 1 tokens (unknown)"),
    ({"template": "USER: {question} ASSISTANT:"}, "reward.template holds 0 <image> for frame_stack=1"),
    ({"score": "logit"}, "reward.score='logit' is not a judge score"),
    ({"model": "/nonexistent/judge"}, "no VLM folder at '/nonexistent/judge'"),
    ({"model": "huge_shape"}, "unknown judge shape 'huge_shape'"),
])
def test_bad_settings_are_one_line_errors(tiny_judge, overrides, message):
    with pytest.raises(RewardModelError) as error:
        judge(overrides.pop("model", tiny_judge), **overrides)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_shape_builds_without_a_folder_and_the_config_instantiates(tiny_judge):
    frames = np.zeros((2, 48, 48, 3), np.uint8)  # resized to the tower's 32 px on the device
    assert judge("tiny_shape")({"frames": frames}).shape == (2,)
    cfg = compose("train", ["reward=vlm_judge", f"reward.model={tiny_judge}", "reward.frame_size=32"])
    reward = instantiate(cfg.reward)
    assert isinstance(reward, VlmJudgeReward) and reward.needs == ("frames",) and reward.frame_size == 32


@pytest.mark.slow  # a SAC run through Ray with a judge in the labeler
def test_sac_with_the_judge_labels_every_transition(tmp_path, tiny_judge):
    run_dir = tmp_path / "run"
    out = rlfarm("train", f"hydra.run.dir={run_dir}", "env=halfcheetah", "reward=vlm_judge", f"reward.model={tiny_judge}",
                 "reward.frame_size=32", "total_env_steps=256", "algo.learning_starts=64", "algo.batch_size=32",
                 "algo.chunk_steps=32", "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]", "run.live=false")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 256
    assert "VlmJudgeReward" in (run_dir / "train.log").read_text()


@pytest.mark.gpu
def test_bf16_judge_on_cuda_is_the_hf_forward_within_bf16_noise(tiny_judge):
    frames = np.random.default_rng(4).integers(0, 256, size=(70, SIDE, SIDE, 3), dtype=np.uint8)
    reward = VlmJudgeReward(tiny_judge, question=QUESTION, max_batch=32)
    reward.setup("cuda:0")
    logits = hf_answer_logits(tiny_judge, frames, reward.template)  # float32 on CPU
    expected = (logits[:, reward._yes] - logits[:, reward._no]).numpy()
    first, second = reward.start({"frames": [frames[:40], frames[40:]]}), reward.start({"frames": frames[::-1]})
    np.testing.assert_allclose(first.result(), expected, atol=0.05 * max(1.0, np.abs(expected).max()))
    np.testing.assert_allclose(second.result(), expected[::-1], atol=0.05 * max(1.0, np.abs(expected).max()))
