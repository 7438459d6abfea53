"""Data-parallel learner ranks must not change the math: two ranks (real Ray actors on declared GPUs, a real gloo
group, DDP) updating on one scored batch give the loss, gradient norm and weights of one learner on the whole
batch. The batch is cut into uneven shards on purpose (9 rows, 2 minibatches of 5 and 4 rows → shards 3 + 2
(one padding row) and 2 + 2, and unequal token counts), so a per-shard token mean would show."""
import pytest
import torch

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.config import compose
from rlfarm.data_parallel import shard_rows
from rlfarm.families import LLM
from rlfarm.loops.llm import learner_rank_options
from rlfarm.loops.learner_group import start_learner_group
from rlfarm.roles.llm import EngineRole, LMLearner, TextLabeler
from rlfarm.topology import PlacedTopology, plan_topology

CFG = GRPOConfig(prompts_per_step=3, group_size=3, filter_groups=False, minibatches=2, seed=0)


def plan(name):
    return plan_topology(compose("train", ["experiment=grpo_digits", f"topology={name}"]).topology, LLM)


def parameters(model):
    return {name: t.detach().cpu().clone() for name, t in model.named_parameters()}


def test_shards_are_equal_sized_and_cover_each_row_once():
    rows = torch.tensor([4, 0, 7, 2, 9])
    (a, wa), (b, wb) = shard_rows(rows, 0, 2), shard_rows(rows, 1, 2)
    assert a.tolist() == [4, 0, 7] and b.tolist() == [2, 9, 4] and wb.tolist() == [1.0, 1.0, 0.0]
    assert wa.tolist() == [1.0, 1.0, 1.0]
    (c, wc) = shard_rows(torch.tensor([5]), 1, 2)  # a rank with no row still runs one (weight 0)
    assert c.tolist() == [5] and wc.tolist() == [0.0]


def test_learner_ranks_never_share_a_gpu():
    ranks = plan("colocated_2").of("learner")
    assert [(p.bundle, p.gpus) for p in ranks] == [(0, 0.5), (1, 0.5)]
    assert plan("colocated_2").of("engine")[0].bundle == 0  # time-shares GPU 0 with rank 0
    (learner,) = plan("split_2_1").of("learner")
    assert learner.gpus == 2.0 and plan("split_2_1").bundles["train"][0]["GPU"] == 2.0


@pytest.mark.parametrize("data_parallel,lora,micro_batch_tokens,packed", [
    ("ddp", None, None, False), ("fsdp", None, None, False),
    ("fsdp", {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}, None, False),
    ("fsdp", None, 30, False), pytest.param("fsdp", None, 30, True, marks=pytest.mark.slow)])  # ~14 s
def test_two_ranks_update_like_one_learner_on_the_whole_batch(ray_cpu, one_torch_thread, data_parallel, lora,
                                                              micro_batch_tokens, packed, tmp_path):
    """DDP (whole model per rank) and FSDP (weights, gradients, AdamW sharded over the ranks; with LoRA the
    frozen base is sharded too and only the adapters are published) alike; and FSDP ranks in pieces of ≤ 30 tokens
    (rows sorted by length and dealt to the ranks, as many pieces on each: FSDP gathers in every forward), also
    packed (`algo.packed`: each piece's real tokens as one sequence; the single learner runs padded)."""
    import dataclasses

    ray = ray_cpu
    cfg = dataclasses.replace(CFG, lora=lora, micro_batch_tokens=micro_batch_tokens, packed=packed)
    generated = EngineRole(cfg).generate()
    rewards = TextLabeler(cfg).score(generated)
    lengths = generated[0].response_mask.sum(1)
    assert lengths.min() < lengths.max()  # unequal token counts across shards
    single = LMLearner(dataclasses.replace(cfg, micro_batch_tokens=None, packed=False))  # whole minibatches, 1 process
    trainable = {name for name, p in single.model.named_parameters() if p.requires_grad}
    before = parameters(single.model)
    expected = single.update(generated, rewards)
    expected_weights = parameters(single.model)

    placed = PlacedTopology(plan("colocated_2"))
    group = start_learner_group(learner_rank_options(placed, placed.plan.of("learner")),
                                dataclasses.replace(cfg, data_parallel=data_parallel))
    try:
        assert len(group.ranks) == 2 and len(set(group.gpu_ids)) == 2 and min(group.gpu_ids) >= 0
        metrics = group.update(ray.put(generated), ray.put(rewards))
        # what rank 0 would send the engines, and each rank's own tensors (under FSDP: its shards)
        published, _ = ray.get(group.publish()[0])
        local = ray.get([rank.__ray_call__.remote(lambda self: {name: getattr(t, "_local_tensor", t).detach().clone()
                                                                for name, t in self.model.named_parameters()})
                         for rank in group.ranks])
        checkpoint = torch.load(group.save(str(tmp_path / "final.pt"), {"updates": 1}), weights_only=True)
        group.update(ray.put(generated), ray.put(rewards))  # move on, then go back to the checkpoint
        assert group.load(str(tmp_path / "final.pt")) == {"updates": 1}
        restored, version = ray.get(group.publish()[0])
    finally:
        group.kill()
        placed.remove()
    assert expected["loss"] != 0.0
    for key in ("reward", "loss", "grad_norm", "clip_fraction", "approx_kl", "entropy"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    assert max((before[name] - expected_weights[name]).abs().max() for name in before) > 1e-4  # it learned
    assert set(published) == trainable and set(before) <= set(checkpoint["model"])  # + tied weights' names
    for name in before:
        if name in trainable:
            torch.testing.assert_close(published[name], expected_weights[name], rtol=0, atol=1e-5)
        torch.testing.assert_close(checkpoint["model"][name], expected_weights[name], rtol=0, atol=1e-5)
        if name in trainable:  # every rank restored the checkpoint (under FSDP: its shards of it)
            assert torch.equal(restored[name], checkpoint["model"][name]), name
    assert version == checkpoint["version"] + 1
    if data_parallel == "ddp":  # every rank holds the whole model, and they step identically
        assert all(torch.equal(local[0][name], local[1][name]) for name in before)
    else:  # each rank holds a part of each weight
        assert all(local[0][name].numel() < before[name].numel() for name in before if before[name].shape[0] > 1)
        assert len(checkpoint["optimizer"]["state"]) == len(trainable)  # the whole AdamW state, gathered


def test_gradient_accumulation_in_micro_batches_updates_like_whole_minibatches(one_torch_thread):
    """micro_batch_size=2 cuts each minibatch (5 and 4 rows) into forward/backward pieces of 2, 2, 1 and 2, 2
    with one optimizer step per minibatch: the same loss, gradient norm and weights as whole minibatches."""
    import dataclasses

    generated = EngineRole(CFG).generate()
    rewards = TextLabeler(CFG).score(generated)
    whole, pieces = LMLearner(CFG), LMLearner(dataclasses.replace(CFG, micro_batch_size=2))
    torch.manual_seed(1)  # the same minibatch permutation for both
    expected = whole.update(generated, rewards)
    torch.manual_seed(1)
    got = pieces.update(generated, rewards)
    assert expected["loss"] != 0.0
    for key in ("loss", "grad_norm", "clip_fraction", "approx_kl"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for name, value in parameters(whole.model).items():
        torch.testing.assert_close(parameters(pieces.model)[name], value, rtol=0, atol=1e-5)


def test_two_engines_splitting_a_step_give_the_one_engines_update():
    """Data-parallel rollout, roles without Ray: two engines each generate half the step (their rows of its
    sampling noise), the learner joins the halves in order, and the update is the one engine's (same seed)."""
    cfg = GRPOConfig(prompts_per_step=4, group_size=4, seed=3)
    scorer = TextLabeler(cfg)
    whole = EngineRole(cfg).generate()
    halves = [EngineRole(cfg, shard=(index, 2)).generate() for index in (0, 1)]
    assert [len(answers) for _, answers in halves] == [2, 2] and halves[0][1] + halves[1][1] == whole[1]
    one, two = LMLearner(cfg), LMLearner(cfg)
    expected = one.update(whole, scorer.score(whole))
    got = two.update_parts(halves, [scorer.score(half) for half in halves])
    assert got["reward"] == expected["reward"] and got["response_len"] == expected["response_len"]
    for key in ("loss", "grad_norm", "entropy"):
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for name, tensor in parameters(two.model).items():
        # AdamW's first step divides by |g|: gradients 1e-7 apart move a near-zero-gradient weight by ~1e-6
        torch.testing.assert_close(tensor, parameters(one.model)[name], atol=1e-5, rtol=1e-5)
