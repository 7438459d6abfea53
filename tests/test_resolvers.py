"""`hydra/launcher=slurm` asks Slurm for what the run will place: the resolvers in conf/hydra/launcher/slurm.yaml
plan the topology for the run's own algorithm family (an on-policy topology has engines, no env runners)."""
import pytest
from omegaconf import OmegaConf

import rlfarm.resolvers  # noqa: F401 - registers the resolvers
from rlfarm.config import CONF_DIR, compose
from rlfarm.errors import RlfarmError


def slurm_request(overrides: list[str]) -> tuple[int, int | None]:
    """(cpus_per_task, gpus_per_node) as the launcher file resolves them for this run's config."""
    launcher = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "hydra" / "launcher" / "slurm.yaml"), resolve=False)
    cfg = compose("train", overrides)
    OmegaConf.set_struct(cfg, False)
    probe = OmegaConf.merge(cfg, {"probe": {"cpus": launcher["cpus_per_task"], "gpus": launcher["gpus_per_node"]}})
    return probe.probe.cpus, probe.probe.gpus


def test_an_offpolicy_topology_asks_for_its_gpus_and_role_cpus():
    assert slurm_request(["topology=split_1_3"])[1] == 4
    cpus, gpus = slurm_request(["topology=local"])
    assert gpus is None and cpus >= 2


@pytest.mark.parametrize("overrides, gpus", [(["experiment=grpo_digits"], None),
                                              (["experiment=grpo_qwen05b_shape", "topology=split_2_1"], 3),
                                              (["experiment=grpo_qwen05b_shape", "topology=colocated_2"], 2),
                                              (["experiment=simplevla", "topology=vla_1gpu"], 1)])
def test_other_families_are_planned_as_themselves(overrides, gpus):
    cpus, asked = slurm_request(overrides)
    assert asked == gpus and cpus >= 1


def test_planning_split_2_1_as_offpolicy_is_what_failed_before():
    from rlfarm.families import OFFPOLICY
    from rlfarm.resolvers import slurm_gpus

    cfg = compose("train", ["experiment=grpo_qwen05b_shape", "topology=split_2_1"])
    with pytest.raises(RlfarmError):
        slurm_gpus(cfg.topology, OFFPOLICY.name)  # what the launcher asked before: no env_runner role in this file
    assert slurm_gpus(cfg.topology, cfg.algo.family) == 3
