import copy

import torch

from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import causal_lm, compute_dtype, sequence_logprobs, trainable_state_dict

TINY = {"model_type": "llama", "vocab_size": 15, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4}
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def test_sequence_logprobs_are_next_token_logprobs_of_the_response():
    torch.manual_seed(0)
    model = causal_lm(TINY).eval()
    ids = torch.tensor([[0, 1, 5, 6, 7, 8]])  # one left-pad token, prompt (1, 5, 6), response (7, 8)
    mask = torch.tensor([[0, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        got = sequence_logprobs(model, ids, mask, response_start=4, temperature=0.5)
        logits = model(input_ids=ids[:, 1:]).logits[0] / 0.5  # the same sequence unpadded
    expected = torch.log_softmax(logits, dim=-1)[[2, 3], [7, 8]]
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=0)


def test_lora_trains_and_publishes_only_adapters():
    torch.manual_seed(0)
    model = causal_lm(TINY, lora=LORA)
    engine = HFEngine(copy.deepcopy(model), pad_id=0)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.05)
    ids = torch.tensor([[1, 5, 6, 14, 5, 6]])
    for _ in range(3):
        optimizer.zero_grad()
        (-sequence_logprobs(model, ids, torch.ones_like(ids), 4).sum()).backward()
        optimizer.step()
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    published = trainable_state_dict(model)
    assert changed and all("lora_" in name for name in changed)
    assert set(published) >= changed and all("lora_" in name for name in published)
    assert sum(t.numel() for t in published.values()) < sum(p.numel() for p in model.parameters()) / 10
    model.eval()
    engine.update_weights(published, version=1)
    prompts = [[1, 5, 6, 14], [1, 9, 14]]
    with torch.no_grad():
        learner = [model(input_ids=torch.tensor([p])).logits[0, -1].argmax().item() for p in prompts]
    assert engine.generate(prompts, n=1, max_new_tokens=1, temperature=0.0).response_ids[:, 0].tolist() == learner


def test_compute_dtype_applies_on_cuda_and_cpu_stays_fp32():
    assert compute_dtype("bfloat16", "cuda:0") == torch.bfloat16
    assert compute_dtype("float32", "cuda:0") == torch.float32
    assert compute_dtype("bfloat16", "cpu") == torch.float32  # CPU runs and tests keep exact fp32 logprobs
