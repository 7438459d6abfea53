"""An LLM update's forward/backward pieces keep few shapes whatever the number of groups dynamic sampling kept
(issue 35 item 5: a GPU pays once per new shape, so a step that dropped groups updated slower than a full one),
and the padding that makes the shapes changes no gradient."""
import copy
import dataclasses

import pytest
import torch

from rlfarm.algos.grpo import group_advantages
from rlfarm.algos.grpo_lm import TINY_QWEN2, GRPOConfig, update_policy
from rlfarm.algos.micro_batches import ROW_BUCKETS, padded_pieces, piece_rows, token_pieces
from rlfarm.data import Rollout
from rlfarm.envs.text_tasks import DigitTask
from rlfarm.models.lm import causal_lm, sequence_logprobs
from rlfarm.models.packed import PACKED


def test_pieces_cover_every_row_once_in_few_shapes_and_in_proportion():
    size = piece_rows(full_rows=32, minibatches=1, world_size=1, micro_batch_size=None)
    assert size == 32 and piece_rows(32, 2, 2, None) == 8 and piece_rows(32, 1, 1, 6) == 6
    shapes = set()
    for kept in range(1, 33):
        rows = torch.randperm(64)[:kept]
        pieces = padded_pieces(rows, torch.ones(kept), size)
        real = torch.cat([part[weights > 0] for part, weights in pieces])
        assert torch.equal(real, rows)  # every row once, in order, weighted 1; the padding weighted 0
        padded = sum(len(part) for part, _ in pieces)
        assert kept <= padded < kept + size / ROW_BUCKETS  # the rows computed follow the rows kept
        shapes |= {len(part) for part, _ in pieces}
    assert len(shapes) <= ROW_BUCKETS
    micro = [len(part) for part, _ in padded_pieces(torch.arange(13), torch.ones(13), 6)]
    assert micro == [6, 6, 1]  # micro-batches of 6, the last bucketed by ceil(6 / 8) = 1 row


def _random_rollout(model, prompts, group_size, response_len=5):
    """Responses of random tokens and lengths, with the model's own logprobs (cheaper than generating)."""
    prompts = prompts.repeat_interleave(group_size, dim=0)
    responses = torch.randint(0, model.config.vocab_size, (len(prompts), response_len))
    mask = (torch.arange(response_len) < torch.randint(1, response_len + 1, (len(prompts), 1))).long()
    with torch.no_grad():
        logprobs = sequence_logprobs(model, torch.cat([prompts, responses], 1),
                                     torch.cat([torch.ones_like(prompts), mask], 1), prompts.shape[1]) * mask
    return Rollout(prompts, torch.ones_like(prompts), responses * mask, mask, logprobs, group_size, 1.0, 0)


def test_an_update_runs_few_shapes_over_any_kept_group_count_and_padding_changes_no_gradient(one_torch_thread):
    cfg = GRPOConfig(prompts_per_step=16, group_size=2, seed=0)
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**TINY_QWEN2, "vocab_size": task.tokenizer.vocab_size}).eval()
    rollout = _random_rollout(model, torch.tensor(task.sample(cfg.prompts_per_step).prompt_ids), cfg.group_size)
    advantages, _ = group_advantages(torch.tensor([0.0, 1.0]).repeat(cfg.prompts_per_step), cfg.group_size)
    batch_rows = []
    model.register_forward_pre_hook(lambda _, args, kwargs: batch_rows.append(kwargs["input_ids"].shape[0]),
                                    with_kwargs=True)
    sgd = torch.optim.SGD(model.parameters(), lr=0.0)  # the shapes only: the policy stays as it is
    for kept in range(1, cfg.prompts_per_step + 1):
        keep = torch.arange(cfg.prompts_per_step) < kept
        update_policy(model, sgd, rollout.select_groups(keep), advantages[:kept * cfg.group_size], cfg)
    assert len(set(batch_rows)) <= ROW_BUCKETS, sorted(set(batch_rows))  # 16 kept-group counts, 8 shapes at most

    # 5 groups (10 rows) run as 12 rows, 2 of them padding: the same step as 10 rows alone
    keep = torch.arange(cfg.prompts_per_step) < 5
    kept, kept_advantages = rollout.select_groups(keep), advantages[:10]
    padded, exact = copy.deepcopy(model), copy.deepcopy(model)
    batch_rows.clear()
    update_policy(padded, torch.optim.SGD(padded.parameters(), lr=1.0), kept, kept_advantages, cfg)
    update_policy(exact, torch.optim.SGD(exact.parameters(), lr=1.0), kept, kept_advantages,
                  dataclasses.replace(cfg, micro_batch_size=10))
    assert batch_rows == [12, 10]
    for (name, a), b in zip(padded.named_parameters(), exact.parameters()):
        assert torch.allclose(a, b, atol=1e-6), name
    assert any(not torch.equal(a, b) for a, b in zip(padded.parameters(), model.parameters()))


def _spans(rows):
    """(first, end) columns of rows laid out as [prompt 4 | response 8]: left padding and long-tail lengths."""
    return [(4 - prompt, 4 + response) for prompt, response in rows]


def test_token_pieces_hold_the_budget_cover_every_row_once_and_match_across_ranks():
    spans = _spans([(3, 8), (4, 1), (2, 2), (4, 7), (1, 1), (4, 3), (3, 8), (2, 5), (4, 2)])
    rows = torch.tensor([8, 0, 3, 5, 1, 2, 7, 4])  # a minibatch: row 6 is in another
    for world in (1, 2, 3):
        shares = [token_pieces(rows, spans, rank, world, budget=24, response_start=4, width_step=1)
                  for rank in range(world)]
        assert len({len(share) for share in shares}) == 1  # FSDP: every rank runs as many forward passes
        real = []
        for share in shares:
            for part, weights, first, end in share:
                real += part[weights > 0].tolist()
                assert set(weights.tolist()) <= {0.0, 1.0} and (weights.sum() == len(part) or len(part) == 1)
                # the piece's own columns: every real column of its rows and the column predicting their first token
                assert first <= min(min(spans[r][0] for r in part.tolist()), 3) and end >= max(spans[r][1]
                                                                                              for r in part.tolist())
                assert len(part) * (end - first) <= 24 or len(part) == 1
        assert sorted(real) == sorted(rows.tolist())
    (longest, _, first, end), *_ = token_pieces(rows, spans, 0, 1, budget=24, response_start=4, width_step=1)
    assert longest.tolist() == [0, 3] and (first, end) == (0, 12)  # longest first: rows 0 and 3, 12 columns
    # columns rounded up to the width step: rows 2 and 8 span columns 0-5 → 8 columns
    (_, _, first, end), = token_pieces(torch.tensor([2, 8]), spans, 0, 1, budget=99, response_start=4, width_step=8)
    assert (first, end) == (0, 8)
    # ... never past the rollout's last column: row 0 spans 1-11, 16 columns would pass column 12, so 12, moved left
    (_, _, first, end), = token_pieces(torch.tensor([0]), spans, 0, 1, budget=99, response_start=4, width_step=8)
    assert (first, end) == (0, 12)


def test_packed_token_pieces_count_the_rows_real_tokens():
    """A packed piece computes its rows' real tokens only (`rlfarm.models.packed`): the budget counts those, not
    rows × the piece's width, so pieces hold more rows."""
    spans = _spans([(3, 8), (4, 1), (2, 2), (4, 7), (1, 1), (4, 3), (3, 8), (2, 5), (4, 2)])
    rows = torch.tensor([8, 0, 3, 5, 1, 2, 7, 4])
    packed = token_pieces(rows, spans, 0, 1, budget=24, response_start=4, width_step=1, packed=True)
    # longest first: rows 0, 3 (11 tokens each), then 5, 7, 8 (7 + 7 + 6), then 1, 2, 4 (5 + 4 + 2)
    assert [part.tolist() for part, *_ in packed] == [[0, 3], [5, 7, 8], [1, 2, 4]]
    # unpacked, rows 5, 7, 8 would be 3 × 9 columns (> 24): row 8 goes on to the next piece
    padded = token_pieces(rows, spans, 0, 1, budget=24, response_start=4, width_step=1)
    assert [part.tolist() for part, *_ in padded] == [[0, 3], [5, 7], [8, 1, 2, 4]]


@pytest.mark.parametrize("is_correction,packed,kl_coef", [("none", False, 0.0), ("token_tis", False, 0.0),
                                                          ("none", True, 0.1), ("token_tis", True, 0.0)])
def test_an_update_in_token_pieces_cut_to_their_columns_equals_the_whole_minibatch(one_torch_thread, monkeypatch,
                                                                                    is_correction, packed, kl_coef):
    """Rows sorted by length, pieces of ≤ 40 tokens, each computing only its own columns (left padding of
    different prompt lengths and right padding of long-tail responses cut), and the head in chunks: the same loss,
    gradient norm and weights as one forward/backward over the whole padded minibatch. With token TIS over two
    minibatches the learner's own logprobs before the update are scored in the same pieces first. `algo.packed`:
    each piece's rows' real tokens as one sequence (≤ 40 of them), the reference model's forward (KL) too."""
    import rlfarm.algos.micro_batches as micro_batches
    import rlfarm.models.lm as lm

    monkeypatch.setattr(micro_batches, "WIDTH_STEP", 1)  # tiny rows: cut to the column
    monkeypatch.setattr(lm, "LOGIT_BUDGET", 3 * 15)  # 3 tokens' logits at once
    cfg = GRPOConfig(prompts_per_step=8, group_size=2, seed=0, minibatches=2, is_correction=is_correction,
                     kl_coef=kl_coef)
    torch.manual_seed(cfg.seed)
    task = DigitTask(cfg.task, cfg.num_digits, seed=cfg.seed)
    model = causal_lm({**TINY_QWEN2, "vocab_size": task.tokenizer.vocab_size}).eval()
    rollout = _random_rollout(model, torch.tensor(task.sample(cfg.prompts_per_step).prompt_ids), cfg.group_size,
                              response_len=9)
    prompt_mask = rollout.prompt_mask.clone()
    prompt_mask[::3, :2] = 0  # a third of the prompts 2 tokens shorter (left padding)
    rollout = dataclasses.replace(rollout, prompt_ids=rollout.prompt_ids * prompt_mask, prompt_mask=prompt_mask)
    advantages = torch.randn(len(rollout.response_ids))
    whole, pieces = copy.deepcopy(model), copy.deepcopy(model)
    widths, bounds = [], []  # (rows, tokens computed) of each piece's forward; packed: the rows' boundaries

    def record(_, args, kwargs):
        rows, columns = kwargs["input_ids"].shape
        bounds.append(kwargs.get("cu_seq_lens_q"))  # packed: one sequence of the rows' real tokens
        widths.append((rows, rows * columns) if bounds[-1] is None else (len(bounds[-1]) - 1, columns))

    pieces.register_forward_pre_hook(record, with_kwargs=True)
    results, refs = [], [copy.deepcopy(model) for _ in range(2)]
    for policy, settings, ref in ((whole, cfg, refs[0]),
                                  (pieces, dataclasses.replace(cfg, micro_batch_tokens=40, packed=packed), refs[1])):
        torch.manual_seed(1)  # the same minibatch permutation
        results.append(update_policy(policy, torch.optim.SGD(policy.parameters(), lr=1.0), rollout, advantages,
                                     settings, ref_model=ref if kl_coef else None))
    expected, got = results
    if packed:  # the policy's forwards and, with a KL term, the reference's ran packed
        assert all(b is not None for b in bounds) and pieces.config._attn_implementation == PACKED
        assert (refs[1].config._attn_implementation == PACKED) == bool(kl_coef)
    assert len(widths) > 2 and all(tokens <= 40 or rows == 1 for rows, tokens in widths)
    width = rollout.input_ids().shape[1]
    assert min(tokens / rows for rows, tokens in widths) < width  # pieces were cut (packed: to their real tokens)
    assert set(got) == set(expected) and ("is_capped_fraction" in got) == (is_correction != "none")
    for key in got:
        assert got[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-6), key
    for (name, a), b in zip(whole.named_parameters(), pieces.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
    assert any(not torch.equal(a, b) for a, b in zip(pieces.parameters(), model.parameters()))  # it stepped
