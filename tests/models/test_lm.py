import copy

import pytest
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


@pytest.mark.parametrize("lora", [None, LORA])
def test_the_head_in_chunks_gives_the_same_logprobs_and_gradients(lora, monkeypatch):
    # a logit budget of 3 tokens' logits: the response's 2 × 5 tokens go through the head in 4 chunks, each
    # recomputed in the backward pass (issue 37: a 7B step's whole logits would be ~200 GB in fp32)
    import rlfarm.models.lm as lm

    torch.manual_seed(0)
    model = causal_lm(TINY, lora=lora)
    ids = torch.randint(1, 15, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding
    params = [p for p in model.parameters() if p.requires_grad]
    full = sequence_logprobs(model, ids, mask, response_start=4, temperature=0.7)
    full_grads = torch.autograd.grad((full * torch.arange(1.0, 6.0)).sum(), params)
    head = model.get_base_model().lm_head if lora else model.lm_head
    assert isinstance(head, lm.ScoringHead)
    calls, chunk = [], lm._head_logprobs
    monkeypatch.setattr(lm, "_head_logprobs", lambda *args: calls.append(args[2].shape[0]) or chunk(*args))
    chunked = sequence_logprobs(model, ids, mask, response_start=4, temperature=0.7, logit_budget=3 * 15)
    forward_calls = list(calls)
    chunked_grads = torch.autograd.grad((chunked * torch.arange(1.0, 6.0)).sum(), params)
    assert forward_calls == [3, 3, 3, 1] and calls[4:] == forward_calls[::-1]  # each run again in the backward
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=0)
    for got, expected in zip(chunked_grads, full_grads):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)


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


# ---- a pretrained model loaded by path (model.source), as `model=hf_lm` does


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    from rlfarm.models.lm_factory import save_random_lm

    return str(save_random_lm(tmp_path_factory.mktemp("lm") / "tiny-lm", seed=1))


def test_a_loaded_model_keeps_its_own_vocabulary_and_takes_lora(lm_folder):
    model = causal_lm(lm_folder, lora=LORA)
    assert model.get_input_embeddings().weight.shape[0] == 320  # the saved config's, not the tokenizer's 300
    trainable = trainable_state_dict(model)
    assert trainable and all("lora_" in name for name in trainable)
    assert next(causal_lm(lm_folder).parameters()).dtype == torch.float32


@pytest.mark.parametrize("lora", [None, LORA], ids=["full", "lora"])
def test_engine_and_learner_roles_load_the_same_policy_and_agree_on_logprobs(ray_cpu, one_torch_thread, lm_folder,
                                                                            tmp_path, lora):
    """EngineRole and LMLearner each load model.source; the engine's logprobs are π_old, so they must equal
    what the learner recomputes for the same tokens (the chat-templated prompts of a prompt file)."""
    from rlfarm.algos.grpo_lm import GRPOConfig
    from rlfarm.envs.text_tasks import TextTaskSpec
    from rlfarm.roles.llm import EngineRole, LMLearner

    path = tmp_path / "arith.jsonl"
    path.write_text("".join(f'{{"question": "What is {i} plus {i}?", "answer": "{2 * i}"}}\n' for i in range(6)))
    cfg = GRPOConfig(model=lm_folder, lora=lora, prompts_per_step=3, group_size=4, temperature=0.8, seed=2)
    task = TextTaskSpec("prompts", path=str(path), max_new_tokens=6, chat_template=True, tokenizer=lm_folder, seed=2)
    engine, learner = EngineRole(cfg, task=task), LMLearner(cfg)
    rollout, answers = engine.generate()
    assert rollout.response_ids.shape[0] == 12 and len(answers) == 3 and rollout.response_ids.shape[1] <= 6
    assert int(rollout.prompt_ids.max()) < 300 and int(rollout.response_ids.max()) < 320
    with torch.no_grad():
        recomputed = sequence_logprobs(learner.model, rollout.input_ids(), rollout.attention_mask(),
                                       rollout.prompt_ids.shape[1], rollout.temperature)
    mask = rollout.response_mask.bool()
    assert (recomputed[mask] - rollout.logprobs[mask]).abs().max().item() < 1e-4
    published = trainable_state_dict(learner.model)
    assert (all("lora_" in name for name in published) if lora else len(published) > 20)


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp"])
def test_the_head_in_chunks_runs_inside_ddp_and_fsdp_with_recomputed_blocks(wrapper, wrapped_policy, monkeypatch):
    """A 7B learner is FSDP-sharded and recomputes its blocks: the head scores in chunks inside the wrapper's own
    forward (its hooks gather and reduce), with the same values and gradients as the plain model's whole logits.
    One rank over gloo: the wrappers' code paths, not their communication."""
    import rlfarm.models.lm as lm
    from rlfarm.data_parallel import full_tensors

    plain, model, wrapped = wrapped_policy(TINY, wrapper)
    ids = torch.randint(1, 15, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    weights = torch.arange(1.0, 6.0)
    (sequence_logprobs(plain, ids, mask, response_start=4) * weights).sum().backward()
    calls, chunk = [], lm._head_logprobs
    monkeypatch.setattr(lm, "_head_logprobs", lambda *args: calls.append(args[2].shape[0]) or chunk(*args))
    chunked = sequence_logprobs(wrapped, ids, mask, response_start=4, logit_budget=4 * 15)
    (chunked * weights).sum().backward()
    assert calls == [4, 4, 2, 2, 4, 4]  # three chunks, each again in the backward (last first)
    with torch.no_grad():
        torch.testing.assert_close(chunked, sequence_logprobs(plain, ids, mask, response_start=4), atol=1e-6, rtol=0)
    grads = full_tensors({name: p.grad for name, p in model.named_parameters()})
    for name, p in plain.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-6, rtol=1e-5, msg=name)
