"""What a setting may be, in one place, for every dataclass that holds settings.

The Hydra schemas (`rlfarm.schemas`, checked before a run starts) and the algorithms' own frozen configs
(`PPOConfig`, `GRPOConfig`, `VLAConfig`, built inside the run) call `check_ranges` from their `__post_init__`:
a setting is checked by its name wherever it appears, so its range is written once. Types
are the dataclasses' annotations (Hydra checks them at compose time); only ranges are checked here.
Plain Python: the algorithm modules import it, and nothing here imports torch or Hydra.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


class RangeError(ValueError):
    """A setting outside its range; `key` is the field name, `allowed` says what it must be."""

    def __init__(self, key: str, allowed: str, value: Any):
        self.key, self.allowed, self.value = key, allowed, value
        super().__init__(f"{key} must be {allowed}, got {value!r}")


POSITIVE = ("> 0", lambda v: v > 0)
NON_NEGATIVE = (">= 0", lambda v: v >= 0)
FRACTION = ("in [0, 1]", lambda v: 0 <= v <= 1)

# setting name → its range; None (where a setting is optional) always passes
RANGES = {
    **dict.fromkeys(("lr", "actor_lr", "critic_lr", "utd_ratio", "clip_eps", "value_clip_eps", "value_clip",
                     "target_kl", "max_grad_norm", "temperature", "batch_size", "buffer_size", "chunk_steps",
                     "credits", "publish_every", "rollout_steps", "epochs", "minibatches", "micro_batch_size",
                     "micro_batch_tokens",
                     "prompts_per_step", "group_size", "groups_per_update", "max_new_tokens", "max_updates", "batch_chunks",
                     "rho_bar", "c_bar"),
                    POSITIVE),
    **dict.fromkeys(("learning_starts", "vf_coef", "value_coef", "ent_coef", "kl_coef", "clip_low", "clip_high", "max_staleness",
                     "max_policy_lag", "target_update_every"),
                    NON_NEGATIVE),
    **dict.fromkeys(("gamma", "gae_lambda", "lam", "top_p", "accuracy_low", "accuracy_high"), FRACTION),
    "is_cap": (">= 1", lambda v: v >= 1),
    # the run's own settings (conf/train.yaml) and a gymnasium env's
    **dict.fromkeys(("total_env_steps", "num_envs", "bus_items", "metrics_interval_s", "max_wall_s",
                     "restart_timeout_s", "role_timeout_s", "num_cpus", "ready_timeout_s"), POSITIVE),
    **dict.fromkeys(("seed", "bus_timeout_s", "max_restarts", "num_gpus", "checkpoint_every_updates",
                     "checkpoint_every_min"), NON_NEGATIVE),
    # rlfarm fit-reward (conf/fit_reward.yaml)
    **dict.fromkeys(("frames", "frame_size", "frame_stack"), POSITIVE),
    **dict.fromkeys(("weight_decay", "report_frames"), NON_NEGATIVE),
    "holdout": ("in (0, 1)", lambda v: 0 < v < 1),
    # reward=distilled (rlfarm/rewards/distilled.py)
    "teacher_fraction": ("in (0, 1]", lambda v: 0 < v <= 1),
    "warm_agreement": ("in [-1, 1]", lambda v: -1 <= v <= 1),
    **dict.fromkeys(("min_teacher_labels", "agreement_window"), (">= 2", lambda v: v >= 2)),
    **dict.fromkeys(("replay_frames", "student_frame_size", "max_batch"), POSITIVE),
    "train_steps": NON_NEGATIVE,
}


def check_ranges(settings) -> None:
    """Raise RangeError for the first field of the dataclass instance `settings` outside its range."""
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        allowed, test = RANGES.get(field.name, (None, None))
        if test is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and not test(value):
            raise RangeError(field.name, allowed, value)


def known_fields(settings_class, values: Mapping) -> dict:
    """The entries of `values` that are fields of the dataclass `settings_class` (a config group holds keys
    that belong to the loop, e.g. rollout_steps, or to no dataclass, e.g. name)."""
    names = {field.name for field in dataclasses.fields(settings_class)}
    return {key: value for key, value in values.items() if key in names}
