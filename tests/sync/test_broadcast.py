"""Broadcast weight sync between two real processes on CPU (gloo): the learner here (rank 0), an engine in
a spawned process (rank 1). The same code runs NCCL between GPUs (`gpu` test below)."""
import copy
import io

import pytest
import torch
import torch.multiprocessing as mp

from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import causal_lm, trainable_state_dict
from rlfarm.engines.base import load_into
from rlfarm.sync import BroadcastReceiver, BroadcastSender, join_group, plan_layout, serve_rendezvous

TINY = {"model_type": "qwen2", "vocab_size": 40, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
LORA = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
PROMPTS = [[1, 5, 6, 7, 8, 14], [1, 9, 14], [3, 4, 5, 6, 7, 8, 9, 30]]
PROBE = torch.tensor([[1, 5, 6, 7, 8, 14, 20, 21]])


def policy(seed: int, lora: bool):
    torch.manual_seed(seed)
    return causal_lm(TINY, lora=LORA if lora else None).eval()


def perturb(model, seed: int) -> None:
    """A stand-in for an optimizer step on whatever the learner trains (adapters only under LoRA)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator).to(param.device) * 0.3)


def probe_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=PROBE.to(next(model.parameters()).device)).logits[0].cpu()


def engine_peer(address: str, lora: bool, syncs: int, device: str, results) -> None:
    """Rank 1: an engine whose model starts from other weights (full sync) or other adapters (LoRA; the
    frozen base is the learner's, as both load the same checkpoint)."""
    torch.set_num_threads(1)
    group = join_group(address, rank=1, world_size=2, device=device)
    model = policy(seed=0 if lora else 99, lora=lora)
    if lora:
        perturb(model, seed=123)
    engine = HFEngine(model, pad_id=0, device=device, compile=False)  # compiling is not under test here
    receiver = BroadcastReceiver(group)
    before = probe_logits(engine.model)
    for version in range(1, syncs + 1):
        moved = load_into(engine, receiver, None, version)
        greedy = engine.generate(PROMPTS, n=1, max_new_tokens=6, temperature=0.0).response_ids
        state = {name: t.detach().cpu().clone() for name, t in engine.model.state_dict().items()}
        results.put(to_bytes({"version": engine.weight_version, "moved": moved, "greedy": greedy, "state": state,
                     "names": receiver.layout.names, "buckets": len(receiver.layout.buckets),
                     "before": before, "after": probe_logits(engine.model)}))
    group.close()


def to_bytes(result: dict) -> bytes:
    """Tensors cross the process boundary as bytes: the queue's shared-memory handles die with the peer."""
    buffer = io.BytesIO()
    torch.save(result, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes) -> dict:
    return torch.load(io.BytesIO(data), weights_only=False)


def run_sync(lora: bool, device: str = "cpu", syncs: int = 2, bucket_bytes: int = 2048, edge_bytes: int | None = None):
    torch.set_num_threads(1)
    context = mp.get_context("spawn")
    results = context.Queue()
    store = serve_rendezvous(world_size=2)
    peer = context.Process(target=engine_peer, args=(f"127.0.0.1:{store.port}", lora, syncs, device, results))
    peer.start()
    try:
        group = join_group(store, rank=0, world_size=2, device=device)
        learner = policy(seed=0, lora=lora).to(device)
        sender = BroadcastSender(group, plan_layout(trainable_state_dict(learner), bucket_bytes, edge_bytes))
        received = []
        for version in range(1, syncs + 1):
            perturb(learner, seed=version)
            sender.send(trainable_state_dict(learner))
            reference = HFEngine(copy.deepcopy(learner), pad_id=0, device=device, compile=False)
            received.append((learner_snapshot(learner), reference.generate(PROMPTS, n=1, max_new_tokens=6,
                                                                           temperature=0.0).response_ids,
                             from_bytes(results.get(timeout=120))))
        group.close()
        peer.join(timeout=60)
        assert peer.exitcode == 0
        return sender, received
    finally:
        if peer.is_alive():
            peer.kill()


def learner_snapshot(model) -> dict:
    return {"state": {name: t.detach().cpu().clone() for name, t in model.state_dict().items()},
            "trainable": {name: t.cpu().clone() for name, t in trainable_state_dict(model).items()},
            "logits": probe_logits(model)}


def test_full_weights_arrive_exactly_and_the_engine_then_decodes_as_the_learner():
    sender, received = run_sync(lora=False)
    assert len(sender.layout.buckets) > 4  # small buckets: both buffers are reused several times
    for version, (learner, learner_greedy, engine) in enumerate(received, start=1):
        assert engine["version"] == version
        assert set(engine["names"]) == set(learner["trainable"]) == set(learner["state"])
        for name, tensor in learner["state"].items():
            assert torch.equal(engine["state"][name], tensor), name
        assert engine["moved"] == sum(t.numel() * t.element_size() for t in learner["trainable"].values())
        assert torch.equal(engine["greedy"], learner_greedy)
        torch.testing.assert_close(engine["after"], learner["logits"], rtol=0, atol=1e-6)
    assert not torch.allclose(received[0][2]["before"], received[0][0]["logits"], atol=1e-3)


def test_lora_moves_only_the_adapters_and_they_are_what_makes_the_engine_match():
    sender, received = run_sync(lora=True)
    learner, learner_greedy, engine = received[-1]
    names = engine["names"]
    assert names and all("lora_" in name for name in names)
    adapter_bytes = sum(t.numel() * t.element_size() for t in learner["trainable"].values())
    model_bytes = sum(t.numel() * t.element_size() for t in learner["state"].values())
    assert engine["moved"] == sender.layout.nbytes == adapter_bytes < model_bytes / 10
    for name, tensor in learner["state"].items():  # adapters moved; the base was the same all along
        assert torch.equal(engine["state"][name], tensor), name
    assert torch.equal(engine["greedy"], learner_greedy)
    # the engine's own adapters made it differ before the sync; the received ones make it equal after
    assert not torch.allclose(engine["before"], learner["logits"], atol=1e-3)
    torch.testing.assert_close(engine["after"], learner["logits"], rtol=0, atol=1e-6)


def test_small_edge_buckets_take_small_tensors_out_of_order_and_the_weights_still_arrive_exactly():
    sender, received = run_sync(lora=False, syncs=1, bucket_bytes=8192, edge_bytes=1024)
    layout, state = sender.layout, received[0][0]["trainable"]
    assert sorted(layout.names) == sorted(state) and len(layout.names) == len(set(layout.names))
    assert layout.buckets[0].nbytes <= 1024 and layout.buckets[-1].nbytes <= 1024
    assert max(bucket.nbytes for bucket in layout.buckets) > 1024  # the middle ones stay large
    assert layout.names[0] != next(iter(state))  # the embedding (first, and too large) went to the middle
    _, _, engine = received[0]
    for name, tensor in received[0][0]["state"].items():
        assert torch.equal(engine["state"][name], tensor), name


def test_a_state_that_does_not_match_the_layout_is_refused():
    state = {"a": torch.zeros(3), "b": torch.zeros(2, 2, dtype=torch.bfloat16)}
    layout = plan_layout(state, bucket_bytes=1 << 20)
    assert [b.dtype for b in layout.buckets] == ["float32", "bfloat16"]
    layout.check(state)
    with pytest.raises(KeyError, match="missing"):
        layout.check({"a": torch.zeros(3)})
    with pytest.raises(ValueError, match="does not match"):
        layout.check({"a": torch.zeros(4), "b": state["b"]})


@pytest.mark.gpu
def test_nccl_between_two_gpus_moves_bf16_weights_exactly():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    # rank 0 on cuda:0 here, rank 1 on cuda:1 in the peer: the device string names each side's GPU
    _, received = run_sync_cuda()
    learner, learner_greedy, engine = received[-1]
    for name, tensor in learner["state"].items():
        assert torch.equal(engine["state"][name], tensor), name
    assert torch.equal(engine["greedy"], learner_greedy)


def run_sync_cuda():
    context = mp.get_context("spawn")
    results = context.Queue()
    store = serve_rendezvous(world_size=2)
    peer = context.Process(target=engine_peer, args=(f"127.0.0.1:{store.port}", False, 2, "cuda:1", results))
    peer.start()
    try:
        group = join_group(store, rank=0, world_size=2, device="cuda:0")
        learner = policy(seed=0, lora=False).to("cuda:0")
        sender = BroadcastSender(group, plan_layout(trainable_state_dict(learner), 4096))
        received = []
        for version in (1, 2):
            perturb(learner, seed=version)
            sender.send(trainable_state_dict(learner))
            reference = HFEngine(copy.deepcopy(learner), pad_id=0, device="cuda:0", compile=False)
            greedy = reference.generate(PROMPTS, n=1, max_new_tokens=6, temperature=0.0).response_ids
            received.append((learner_snapshot(learner), greedy, from_bytes(results.get(timeout=120))))
        group.close()
        peer.join(timeout=60)
        assert peer.exitcode == 0
        return sender, received
    finally:
        if peer.is_alive():
            peer.kill()
