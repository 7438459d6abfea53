import math

import numpy as np
import pytest
import torch

from rlfarm.models.vla import InstructionTokenizer, TinyVLA

VOCAB = ["push", "the", "cube", "to", "left", "right"]


def _policy(**kwargs):
    torch.manual_seed(0)
    return TinyVLA(VOCAB, action_dim=2, chunk_size=4, proprio_dim=4, image_size=32, **kwargs)


def _obs(policy, batch=5, instruction="push the cube to the left"):
    gen = torch.Generator().manual_seed(1)
    image = torch.randint(0, 256, (batch, 3, 32, 32), generator=gen, dtype=torch.uint8)
    words = torch.as_tensor(policy.tokenizer.encode([instruction] * batch))
    return image, words, torch.randn(batch, 4, generator=gen) * 0.1


def _randomize_head(policy):
    with torch.no_grad():
        for layer in (policy.head, policy.shape_head):
            if layer is not None:
                layer.weight.normal_(0, 0.3)
                layer.bias.normal_(0, 0.3)


def test_tokenizer_pads_and_marks_unknown_words():
    tokenizer = InstructionTokenizer(VOCAB, max_words=6)
    ids = tokenizer.encode(["push the cube", "push the sphere"])
    assert ids.shape == (2, 6) and ids[0, 3:].tolist() == [0, 0, 0]
    assert ids[1, 2] == 1 and ids[0, 2] > 1  # <unk> for a word outside the vocabulary


def test_starts_uniform_over_bins():
    policy = _policy()
    logits = policy.logits(*_obs(policy))
    assert logits.shape == (5, 8, 256)
    tokens, logprobs = policy.sample(*_obs(policy), temperature=1.6)
    assert tokens.shape == (5, 8) and tokens.max() < 256
    torch.testing.assert_close(logprobs, torch.full_like(logprobs, -math.log(256)))


@pytest.mark.parametrize("bin_features", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 1.6])
def test_sampled_logprobs_equal_recomputed_ones(bin_features, temperature):
    policy = _policy(bin_features=bin_features)
    _randomize_head(policy)
    obs = _obs(policy)
    tokens, logprobs = policy.sample(*obs, temperature=temperature, generator=torch.Generator().manual_seed(3))
    recomputed = policy.token_logprobs(*obs, tokens, temperature=temperature)
    assert (logprobs - recomputed).abs().max() < 1e-5
    assert logprobs.std() > 0.01  # not the uniform start: the check can fail


def test_temperature_spreads_samples_and_zero_is_greedy():
    policy = _policy()
    _randomize_head(policy)
    obs = _obs(policy, batch=1)
    greedy, _ = policy.sample(*obs, temperature=0)
    torch.testing.assert_close(greedy, policy.logits(*obs).argmax(-1))
    gen = torch.Generator().manual_seed(0)
    image, words, proprio = (x.expand(400, *x.shape[1:]) for x in obs)
    spread = {t: float(-policy.sample(image, words, proprio, temperature=t, generator=gen)[1].mean())
              for t in (0.5, 1.6)}
    assert spread[1.6] > spread[0.5] + 0.2  # entropy estimate grows with temperature


def test_instruction_changes_the_action_distribution():
    policy = _policy()
    _randomize_head(policy)
    image, _, proprio = _obs(policy)
    left = policy.logits(image, torch.as_tensor(policy.tokenizer.encode(["push the cube to the left"] * 5)), proprio)
    right = policy.logits(image, torch.as_tensor(policy.tokenizer.encode(["push the cube to the right"] * 5)), proprio)
    assert (left - right).abs().max() > 1e-3


def test_gradient_steps_raise_a_chosen_tokens_logprob():
    policy = _policy()
    obs = _obs(policy)
    target = torch.full((5, 8), 200)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    before = policy.token_logprobs(*obs, target).mean().item()
    for _ in range(20):
        loss = -policy.token_logprobs(*obs, target).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = policy.token_logprobs(*obs, target).mean().item()
    assert after > before + 1.0
    assert np.isclose(before, -math.log(256), atol=1e-5)


# ---- HF image-text-to-text checkpoints by path (OpenVLA-style action tokens), with LoRA


@pytest.fixture(scope="module")
def saved_llava(tmp_path_factory):
    """A ~50k-parameter Llava (CLIP vision + Qwen2 text) and its tokenizer, from configs, in a folder: no download."""
    from rlfarm.models.lm_factory import save_random_llava

    return str(save_random_llava(tmp_path_factory.mktemp("tiny_llava")))


def _prompt(batch=3):
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.full((batch, 16), 2), torch.randint(3, 40, (batch, 5), generator=gen)], dim=1)  # 16 image tokens
    return torch.randn(batch, 3, 32, 32, generator=gen), ids


def test_hf_vla_logprobs_are_exact_and_tokens_are_action_bins(saved_llava):
    from rlfarm.models.vla import load_hf_vla

    policy = load_hf_vla(saved_llava, num_tokens=8).eval()
    assert policy.first_action_id == 300 - 256
    pixels, ids = _prompt()
    tokens, logprobs = policy.sample(pixels, ids, temperature=1.6, generator=torch.Generator().manual_seed(1))
    assert tokens.shape == (3, 8) and 0 <= tokens.min() and tokens.max() < 256
    recomputed = policy.token_logprobs(pixels, ids, tokens, temperature=1.6)
    assert (recomputed - logprobs).abs().max() < 1e-4
    greedy, _ = policy.sample(pixels, ids, temperature=0)
    assert (policy.token_logprobs(pixels, ids, greedy) >= policy.token_logprobs(pixels, ids, tokens) - 1e-6).all()


def test_hf_vla_lora_trains_only_the_adapters(saved_llava):
    from rlfarm.models.vla import load_hf_vla

    policy = load_hf_vla(saved_llava, num_tokens=4, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    pixels, ids = _prompt()
    target = torch.full((3, 4), 7)
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    before = policy.token_logprobs(pixels, ids, target).mean().item()
    for _ in range(10):
        loss = -policy.token_logprobs(pixels, ids, target).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert policy.token_logprobs(pixels, ids, target).mean().item() > before + 0.1
    assert all(torch.equal(frozen[n], p) for n, p in policy.named_parameters() if n in frozen)


def test_hf_vla_behind_the_roles_interface_reads_pictures_and_instructions(saved_llava):
    """What the VLA roles call: uint8 pictures of any size and instructions of any length in, action bins out,
    with the same log-probabilities when the learner recomputes them; padding changes nothing."""
    from rlfarm.models.vla import load_hf_vla_actions

    policy = load_hf_vla_actions(saved_llava, num_tokens=6, max_words=8).eval()
    assert policy.image_tokens == 16 and policy.image_size == 32 and policy.num_tokens == 6
    words = torch.as_tensor(policy.tokenizer.encode(["push the cube left", "right", "push the cube to the left"]))
    assert words.shape == (3, 8) and (words[1] == -1).sum() > (words[0] == -1).sum()  # left-padded, shorter
    image = torch.randint(0, 256, (3, 3, 48, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    proprio = torch.zeros(3, 4)
    tokens, logprobs = policy.sample(image, words, proprio, 1.6, torch.Generator().manual_seed(1))
    assert tokens.shape == (3, 6) and 0 <= tokens.min() and tokens.max() < 256
    recomputed = policy.token_logprobs(image, words, proprio, tokens, 1.6)
    assert (recomputed - logprobs).abs().max() < 1e-4
    # one row alone, without the others' padding around it: the same log-probabilities
    alone = policy.token_logprobs(image[1:2], torch.as_tensor(policy.tokenizer.encode(["right"])), proprio[1:2],
                                  tokens[1:2], 1.6)
    torch.testing.assert_close(alone, recomputed[1:2], atol=1e-4, rtol=0)


def test_hf_vla_source_must_be_a_folder():
    from rlfarm.models.vla import load_hf_vla_actions

    with pytest.raises(FileNotFoundError, match="no such folder"):
        load_hf_vla_actions("/nonexistent/llava", num_tokens=4)


def test_value_head_shares_the_trunk_and_starts_at_zero():
    """value_head=True (algo=ppo_vla): one pass gives the same log-probabilities as `token_logprobs` and the values
    `values` gives; the head starts at zero, so the first critic predicts 0 everywhere."""
    policy = _policy(value_head=True)
    image, words, proprio = _obs(policy)
    tokens, _ = policy.sample(image, words, proprio, 1.0, torch.Generator().manual_seed(2))
    logprobs, values = policy.token_logprobs_and_values(image, words, proprio, tokens, 1.0)
    torch.testing.assert_close(logprobs, policy.token_logprobs(image, words, proprio, tokens, 1.0))
    assert values.shape == (5,) and torch.equal(values, torch.zeros(5))
    with torch.no_grad():
        policy.value_head.bias.fill_(0.5)
    torch.testing.assert_close(policy.values(image, words, proprio), torch.full((5,), 0.5))
    with pytest.raises(ValueError, match="no value head"):
        _policy().values(image, words, proprio)


def test_hf_vla_value_head_reads_the_prompt_and_trains_beside_lora(saved_llava):
    """An HF VLA with a value head: V comes from the prompt's last hidden state (the same with or without action
    tokens after it), and under LoRA the head trains with the adapters while the base stays frozen."""
    from rlfarm.models.vla import load_hf_vla_actions

    policy = load_hf_vla_actions(saved_llava, num_tokens=4, max_words=8, value_head=True,
                                 lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert {"value_head.weight", "value_head.bias"} <= trainable
    assert all("lora_" in n or n.startswith("value_head") for n in trainable)
    words = torch.as_tensor(policy.tokenizer.encode(["push the cube left", "right"]))
    image = torch.randint(0, 256, (2, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    proprio = torch.zeros(2, 4)
    tokens = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    with torch.no_grad():
        policy.value_head.weight.normal_(0, 1.0)
    logprobs, values = policy.token_logprobs_and_values(image, words, proprio, tokens, 1.6)
    torch.testing.assert_close(logprobs, policy.token_logprobs(image, words, proprio, tokens, 1.6))
    torch.testing.assert_close(values, policy.values(image, words, proprio), atol=1e-5, rtol=0)
    assert values.shape == (2,) and values[0] != values[1]
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    target = torch.tensor([1.0, -1.0])
    before = float((policy.values(image, words, proprio) - target).pow(2).mean())
    for _ in range(20):
        loss = (policy.values(image, words, proprio) - target).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert float((policy.values(image, words, proprio) - target).pow(2).mean()) < before / 4
