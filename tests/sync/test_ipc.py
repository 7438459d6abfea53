"""CUDA IPC weight sync (learner and engine colocated on one GPU, in two processes): the engine process maps
the learner's buffers once and, sync after sync, ends up with exactly the learner's weights (full and LoRA);
an engine on another GPU is refused with the fix named. The learner is this process; the engine a spawned one."""
import copy

import pytest
import torch
import torch.multiprocessing as mp
from test_broadcast import PROMPTS, from_bytes, learner_snapshot, perturb, policy, probe_logits, to_bytes

from rlfarm.engines.hf import HFEngine
from rlfarm.models.lm import trainable_state_dict
from rlfarm.engines.base import load_into
from rlfarm.sync import IpcReceiver, IpcSender


def test_the_sender_needs_a_gpu():
    with pytest.raises(ValueError, match="needs a GPU"):
        IpcSender({"w": torch.zeros(3)}, "cpu")


def engine_peer(lora: bool, device: str, payloads, results) -> None:
    """The engine: starts from other weights (other adapters under LoRA), loads every payload it is handed."""
    model = policy(seed=0 if lora else 99, lora=lora)
    if lora:
        perturb(model, seed=123)
    engine = HFEngine(model, pad_id=0, device=device, compile=False)
    receiver = IpcReceiver(device)
    first_mapping = None
    while (payload := payloads.get(timeout=120)) is not None:
        version, sent = payload
        try:
            moved = load_into(engine, receiver, sent, version)
        except RuntimeError as error:
            results.put(to_bytes({"error": str(error)}))
            return
        first_mapping = first_mapping or receiver._mapped
        greedy = engine.generate(PROMPTS, n=1, max_new_tokens=6, temperature=0.0).response_ids
        results.put(to_bytes({"version": engine.weight_version, "moved": moved, "greedy": greedy,
                              "state": {name: t.detach().cpu().clone() for name, t in engine.model.state_dict().items()},
                              "after": probe_logits(engine.model),
                              "same_mapping": receiver._mapped is first_mapping}))


def run_ipc(lora: bool, engine_device: str = "cuda:0", syncs: int = 2):
    context = mp.get_context("spawn")
    payloads, results = context.Queue(), context.Queue()
    peer = context.Process(target=engine_peer, args=(lora, engine_device, payloads, results))
    peer.start()
    try:
        learner = policy(seed=0, lora=lora).to("cuda:0")
        sender = IpcSender(trainable_state_dict(learner), "cuda:0")
        received = []
        for version in range(1, syncs + 1):
            perturb(learner, seed=version)
            payloads.put((version, sender.send(trainable_state_dict(learner))))
            reference = HFEngine(copy.deepcopy(learner), pad_id=0, device="cuda:0", compile=False)
            greedy = reference.generate(PROMPTS, n=1, max_new_tokens=6, temperature=0.0).response_ids
            received.append((learner_snapshot(learner), greedy, from_bytes(results.get(timeout=120))))
            if "error" in received[-1][2]:
                break
        payloads.put(None)
        peer.join(timeout=60)
        return sender, received
    finally:
        if peer.is_alive():
            peer.kill()


def needs_gpus(count: int):
    return pytest.mark.skipif(torch.cuda.device_count() < count, reason=f"needs {count} GPU(s)")


@pytest.mark.gpu
@needs_gpus(1)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_engine_process_gets_the_learners_weights_exactly(lora):
    sender, received = run_ipc(lora)
    for version, (learner, learner_greedy, engine) in enumerate(received, start=1):
        assert engine["version"] == version
        for name, tensor in learner["state"].items():
            assert torch.equal(engine["state"][name], tensor), name
        assert engine["moved"] == sum(t.numel() * t.element_size() for t in learner["trainable"].values())
        assert torch.equal(engine["greedy"], learner_greedy)
        torch.testing.assert_close(engine["after"], learner["logits"], rtol=0, atol=1e-6)
    assert all(engine["same_mapping"] for _, _, engine in received)  # mapped at the first sync only
    if lora:
        assert all("lora_" in name for name in sender.layout.names)


@pytest.mark.gpu
@needs_gpus(2)
def test_an_engine_on_another_gpu_is_refused():
    _, received = run_ipc(lora=False, engine_device="cuda:1", syncs=1)
    error = received[0][2]["error"]
    assert "needs the engine on the learner's GPU" in error and "algo.weight_sync=broadcast" in error


@pytest.mark.gpu
@needs_gpus(1)
def test_an_fsdp_learner_gathers_straight_into_the_ipc_buffers():
    """GatheredWeights.adopt (rank 0 of an FSDP learner): after it, a gather writes each whole tensor into the
    sender's shared buffers — one copy of the weights on the GPU, not two — and what the engine maps is the newest
    version; `send` then copies each slot onto itself, unchanged."""
    from rlfarm.roles.gathered_weights import GatheredWeights

    model = policy(seed=0, lora=False).cuda()
    gathered = GatheredWeights(rank=0, dtype=torch.bfloat16)
    gathered.gather(model)  # plain tensors pass through the all-gather: one rank
    sender = IpcSender(gathered.tensors, "cuda")
    gathered.adopt(sender)
    starts = [buffer.data_ptr() for buffer in sender.buffers]
    ends = [start + buffer.numel() for start, buffer in zip(starts, sender.buffers)]
    assert all(any(a <= t.data_ptr() < b for a, b in zip(starts, ends)) for t in gathered.tensors.values())
    perturb(model, seed=5)
    gathered.gather(model)
    sender.send(gathered.tensors)
    for name, tensor in trainable_state_dict(model).items():
        assert torch.equal(sender.views()[name], tensor.to(torch.bfloat16)), name
