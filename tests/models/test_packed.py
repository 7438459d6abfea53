"""Packed scoring (`algo.packed`, issue 37): each row's real tokens end to end in one sequence, block-diagonal causal
attention, the log-probs put back in their [rows, T] places — the padded path's values and gradients, without the
padding. On CPU the attention is SDPA with the block-diagonal mask spelled out (varlen flash is CUDA-only), so these
tests run the packing and unpacking the GPU runs."""
import pytest
import torch

import rlfarm.models.lm as lm
from rlfarm.algos.grpo import grpo_loss
from rlfarm.models.lm import causal_lm, sequence_logprobs
from rlfarm.models.packed import PACKED, packed_logprobs

QWEN2 = {"model_type": "qwen2", "vocab_size": 23, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}  # grouped K/V heads
LLAMA = {**QWEN2, "model_type": "llama", "num_key_value_heads": 4}
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _rows(prompt: int = 6, response: int = 7, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts then right-padded responses of varied lengths, one response of a single token."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lens, response_lens = [6, 3, 1, 5, 4], [7, 1, 4, 6, 2]
    ids = torch.randint(1, 23, (len(prompt_lens), prompt + response), generator=generator)
    mask = torch.zeros_like(ids)
    for row, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[row, prompt - p:prompt + r] = 1
    return ids * mask, mask


@pytest.mark.parametrize("config,lora,budget", [(QWEN2, None, None), (LLAMA, None, None), (QWEN2, LORA, None),
                                                (QWEN2, None, 3 * 23)],
                         ids=["qwen2_gqa", "llama", "lora", "head_in_chunks"])
def test_packed_logprobs_equal_the_padded_ones_at_every_response_token(one_torch_thread, config, lora, budget):
    torch.manual_seed(0)
    model = causal_lm(config, lora=lora).eval()
    ids, mask = _rows()
    response = mask[:, 6:].bool()
    with torch.no_grad():
        padded = sequence_logprobs(model, ids, mask, response_start=6, temperature=0.7)
        packed = packed_logprobs(model, ids, mask, response_start=6, temperature=0.7, logit_budget=budget)
        again = sequence_logprobs(model, ids, mask, response_start=6, temperature=0.7)
    assert packed.shape == padded.shape and packed.dtype == torch.float32
    torch.testing.assert_close(packed[response], padded[response], atol=1e-6, rtol=0)
    assert packed[~response].eq(0).all()  # 0 where the padded path has padding
    assert lm.base_model(model).config._attn_implementation == PACKED
    torch.testing.assert_close(again, padded, atol=0, rtol=0)  # a switched model's padded forward is SDPA's


def test_a_packed_row_sees_only_its_own_tokens(one_torch_thread):
    torch.manual_seed(0)
    model = causal_lm(QWEN2).eval()
    ids, mask = _rows()
    changed = ids.clone()
    changed[0, 6:] = changed[0, 6:] % 22 + 1  # row 0's response only
    with torch.no_grad():
        before, after = (packed_logprobs(model, rows, mask, response_start=6) for rows in (ids, changed))
    assert not torch.equal(before[0], after[0]) and torch.equal(before[1:], after[1:])


def test_the_gradients_of_a_grpo_loss_equal_the_padded_ones(one_torch_thread):
    torch.manual_seed(0)
    model = causal_lm(QWEN2).train()
    ids, mask = _rows()
    response = mask[:, 6:].float()
    old = -torch.rand(response.shape) * response
    advantages = torch.tensor([1.0, -0.5, 0.3, -1.2, 0.8])
    named = dict(model.named_parameters())
    grads = []
    for score in (sequence_logprobs, packed_logprobs):
        logprobs = score(model, ids, mask, 6, 0.9, logit_budget=4 * 23)  # the head in chunks, as a 7B step
        loss = grpo_loss(logprobs, old, advantages, response, ref_logprobs=old.detach() * 0.9, kl_coef=0.1)
        grads.append(torch.autograd.grad(loss, list(named.values())))
    for name, padded, packed in zip(named, *grads):
        torch.testing.assert_close(packed, padded, atol=1e-6, rtol=1e-5, msg=name)
    assert any(g.abs().sum() > 0 for g in grads[1])


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_packed_pieces_run_inside_ddp_and_fsdp_with_recomputed_blocks(wrapper, wrapped_policy):
    """Blocks recomputed in the backward pass meet the packed attention again (it is the model's implementation
    for good, not switched around the call): the plain padded model's gradients. One rank over gloo."""
    from rlfarm.data_parallel import full_tensors

    plain, model, wrapped = wrapped_policy(QWEN2, wrapper)
    ids, mask = _rows()
    weights = torch.arange(1.0, 8.0) * mask[:, 6:]
    (sequence_logprobs(plain, ids, mask, 6) * weights).sum().backward()
    (packed_logprobs(wrapped, ids, mask, 6, logit_budget=4 * 23) * weights).sum().backward()
    grads = full_tensors({name: p.grad for name, p in model.named_parameters()})
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_sliding_window_attention_is_refused_in_one_line(one_torch_thread):
    model = causal_lm({**QWEN2, "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 0})
    ids, mask = _rows()
    with pytest.raises(ValueError, match=r"^algo.packed: sliding-window attention .* set algo.packed=false"):
        packed_logprobs(model, ids, mask, response_start=6)


@pytest.mark.gpu
def test_on_cuda_in_bf16_packed_runs_varlen_flash_and_matches_the_padded_masked_path():
    """The GPU's path: torch's varlen flash attention (not the CPU's masked SDPA), bf16 weights and activations; its
    log-probs and gradients are the padded path's within bf16 noise (the two kernels sum in different orders)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    import rlfarm.models.packed as packed

    config = {**QWEN2, "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
              "num_key_value_heads": 2, "max_position_embeddings": 256}
    torch.manual_seed(0)
    model = causal_lm(config).to("cuda", torch.bfloat16)
    ids, mask = (t.cuda() for t in _rows())
    ids = ids * 20 % 512 * mask
    response = mask[:, 6:].bool()
    weights = torch.arange(1.0, 8.0, device="cuda") * response
    called = []
    varlen = packed._varlen
    packed._varlen = lambda *args, **kwargs: called.append(1) or varlen(*args, **kwargs)  # the kernel ran, not SDPA
    try:
        results = []
        for score in (sequence_logprobs, packed_logprobs):
            model.zero_grad()
            logprobs = score(model, ids, mask, 6, 0.9)
            (logprobs * weights).sum().backward()
            results.append((logprobs.detach(), {n: p.grad.float().clone() for n, p in model.named_parameters()}))
    finally:
        packed._varlen = varlen
    assert called
    (padded, padded_grads), (packed_out, packed_grads) = results
    torch.testing.assert_close(packed_out[response], padded[response], atol=0.05, rtol=0.02)
    for name, grad in padded_grads.items():
        cosine = torch.nn.functional.cosine_similarity(packed_grads[name].flatten(), grad.flatten(), dim=0)
        assert cosine > 0.99, (name, float(cosine))
