"""The weight-version metrics of a step (partial rollouts) and the per-token versions through the `Rollout`'s
joins and selections."""
import pytest
import torch

from rlfarm.algos.versions import version_metrics
from rlfarm.data import Rollout, concat_rollouts


def rollout(versions, lengths, weight_version=None):
    versions = torch.tensor(versions)
    rows, width = versions.shape
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    return Rollout(prompt_ids=torch.ones(rows, 2, dtype=torch.long), prompt_mask=torch.ones(rows, 2, dtype=torch.long),
                   response_ids=torch.ones(rows, width, dtype=torch.long), response_mask=mask,
                   logprobs=torch.zeros(rows, width), group_size=2, temperature=1.0,
                   weight_version=int(versions[mask.bool()].min()) if weight_version is None else weight_version,
                   token_versions=versions)


def test_partial_ratio_spans_and_staleness_count_only_generated_tokens():
    # row 1 spans 3 → 5, but its version 9 is padding; row 3 generated nothing
    step = rollout([[3, 3, 3, 3], [3, 4, 5, 9], [4, 4, 0, 0], [7, 7, 7, 7]], lengths=[4, 3, 2, 0])
    metrics = version_metrics(step, learner_version=5)
    assert metrics["staleness"] == 2 and metrics["partial_ratio"] == 0.25
    assert metrics["version_span_max"] == 2 and metrics["version_span_mean"] == pytest.approx(0.5)
    assert metrics["token_staleness_mean"] == pytest.approx((4 * 2 + 2 + 1 + 0 + 2 * 1) / 9)


def test_versions_follow_the_samples_through_concat_and_group_selection():
    stamped = rollout([[1, 2], [2, 2]], lengths=[2, 2])
    plain = Rollout(prompt_ids=torch.ones(2, 3, dtype=torch.long), prompt_mask=torch.ones(2, 3, dtype=torch.long),
                    response_ids=torch.ones(2, 3, dtype=torch.long), response_mask=torch.ones(2, 3, dtype=torch.long),
                    logprobs=torch.zeros(2, 3), group_size=2, temperature=1.0, weight_version=0)
    joined = concat_rollouts([stamped, plain])
    assert joined.weight_version == 0 and joined.token_versions.shape == (4, 3)
    assert joined.token_versions[:2, :2].tolist() == [[1, 2], [2, 2]] and (joined.token_versions[2:] == 0).all()
    kept = joined.select_groups(torch.tensor([False, True]))
    assert torch.equal(kept.token_versions, joined.token_versions[2:])
    assert version_metrics(plain, 1) | {} == {"staleness": 1, "token_staleness_mean": 1.0, "partial_ratio": 0.0,
                                              "version_span_mean": 0.0, "version_span_max": 0.0}
