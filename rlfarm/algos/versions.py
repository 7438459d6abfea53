"""What a step's weight versions say (partial rollouts: a sample's tokens may come from several versions, the
ones loaded into its engine while it was generated, `Rollout.token_versions`).

- staleness: the learner's version minus the oldest version of any token in the step — what `algo.max_staleness`
  bounds;
- token_staleness_mean: the same per generated token, averaged (how far behind the tokens trained on really are);
- partial_ratio: the share of samples whose tokens span more than one version (verl's `partial_ratio`);
- version_span_mean / _max: newest minus oldest version within a sample, over the samples.

The importance correction (`grpo_lm.update_policy`, `truncated_is_weights`) needs no version of its own: each token's
behaviour log-prob (`Rollout.logprobs`) is the one its engine sampled it from, under the version stamped on it, so
token_tis's learner/engine ratio is taken per token against the version that sampled it (seq_tis multiplies them).
"""
from __future__ import annotations

import torch

from rlfarm.data import Rollout


def version_metrics(rollout: Rollout, learner_version: int) -> dict[str, float]:
    valid = rollout.response_mask.bool()
    versions = rollout.versions()
    newest = versions.masked_fill(~valid, torch.iinfo(versions.dtype).min).amax(dim=1)
    oldest = versions.masked_fill(~valid, torch.iinfo(versions.dtype).max).amin(dim=1)
    span = torch.where(valid.any(dim=1), newest - oldest, 0).float()  # an empty sample spans nothing
    tokens = valid.sum().clamp(min=1)
    return {"staleness": learner_version - rollout.weight_version,
            "token_staleness_mean": float((learner_version - versions)[valid].sum() / tokens),
            "partial_ratio": float((span > 0).float().mean()), "version_span_mean": float(span.mean()),
            "version_span_max": float(span.max()) if len(span) else 0.0}
