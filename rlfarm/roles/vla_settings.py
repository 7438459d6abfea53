"""A VLA run's frozen settings from the composed Hydra config, and how its GRPO groups split across the rollout
workers: what the VLA loop and `rlfarm bench vla` both need, kept below both (a bench imports no loop)."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.ppo_vla import PPOVLAConfig
from rlfarm.algos.vla import VLAConfig
from rlfarm.envs.vla_tasks import check_vla_task
from rlfarm.errors import ConfigError
from rlfarm.settings import known_fields


def vla_config(cfg: DictConfig) -> VLAConfig:
    """The frozen settings of one VLA run, from the composed Hydra config."""
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    settings = PPOVLAConfig if algo["name"] == "ppo_vla" else VLAConfig
    fields = known_fields(settings, algo)
    env = OmegaConf.to_container(cfg.env, resolve=True)
    check_vla_task(str(env["id"]))
    return settings(**fields, env_id=str(env["id"]), env=dict(env.get("kwargs") or {}), chunk_size=int(env["chunk_size"]),
                    bins=int(env.get("bins", 256)), model=vla_model(cfg.model), seed=int(cfg.seed))


def vla_model(model: DictConfig) -> dict:
    """`model.config` for the roles, with `model.source` (an HF checkpoint folder, model=hf_vla) when set."""
    config = OmegaConf.to_container(model.config, resolve=True)
    return config | ({"source": str(model.source)} if model.get("source") else {})


def split_groups(groups: int, workers: int) -> list[int]:
    """Groups per worker, as even as possible; every worker gets at least one."""
    if groups < workers:
        raise ConfigError(f"algo.groups_per_update={groups} is fewer than the {workers} env runners",
                          f"set algo.groups_per_update >= {workers} or fewer topology.roles.env_runner.count")
    return [len(part) for part in np.array_split(np.arange(groups), workers)]
