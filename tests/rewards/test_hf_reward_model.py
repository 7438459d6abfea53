import numpy as np
import pytest
import torch

from rlfarm.rewards.hf_reward_model import HFRewardModel

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "what", "is", "two", "plus", "three", "five", "six",
         "maybe", "it"]


def save_tiny_reward_model(directory, num_labels: int = 1) -> str:
    """A word-piece tokenizer from a 14-word vocabulary and a 2-layer Qwen2 classifier, built offline
    and saved as a hub model is."""
    from transformers import AutoModelForSequenceClassification, BertTokenizer, Qwen2Config

    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    tokenizer = BertTokenizer(str(directory / "vocab.txt"))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=num_labels)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    return HFRewardModel(save_tiny_reward_model(tmp_path_factory.mktemp("rm")), max_length=16, batch_size=2)


def test_scores_are_float32_per_pair_and_independent_of_batching(reward_model):
    prompts = ["what is two plus three", "what is two plus two", "what is six"]
    completions = ["five", "maybe it is five five five", "six"]
    rewards = reward_model.score(prompts, completions)
    assert rewards.dtype == np.float32 and rewards.shape == (3,) and np.isfinite(rewards).all()
    # (No "all three differ" check: this tiny random classifier scores every pair within ~1e-6 of the others,
    # so with one torch thread two of them can come out equal.)
    # alone (no padding) each pair scores the same as inside a padded batch
    alone = np.concatenate([reward_model.score([p], [c]) for p, c in zip(prompts, completions)])
    np.testing.assert_allclose(rewards, alone, atol=1e-4)  # summation order differs with padding: 1e-5 failed once in a full CI run


def test_long_pairs_are_truncated_not_rejected(reward_model):
    rewards = reward_model.score(["what is two plus three " * 10], ["maybe it is five " * 10])
    assert rewards.shape == (1,) and np.isfinite(rewards).all()


def test_errors(reward_model, tmp_path):
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        reward_model.score(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="has 2"):
        HFRewardModel(save_tiny_reward_model(tmp_path, num_labels=2))
