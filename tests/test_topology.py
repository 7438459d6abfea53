"""Topology planning (pure) and real placement on Ray with declared GPUs."""
import pytest

from rlfarm.config import compose
from rlfarm.errors import TopologyError
from helpers import placement_probe
from rlfarm.commands.plan import placements_with_gpu_ids
from rlfarm.families import OFFPOLICY
from rlfarm.topology import PlacedTopology, check_cluster, plan_topology


def topology(name):
    return compose("train", [f"topology={name}"]).topology


def test_split_1_3_packs_two_labelers_per_reward_gpu():
    plan = plan_topology(topology("split_1_3"), OFFPOLICY)
    assert plan.pool_gpus == {"train": 1, "reward": 3}
    assert [(p.pool, p.bundle) for p in plan.of("labeler")] == [("reward", b) for b in (0, 0, 1, 1, 2, 2)]
    (learner,) = plan.of("learner")
    assert (learner.pool, learner.bundle, learner.gpus) == ("train", 0, 1.0)
    assert all(p.pool is None and p.gpus == 0 for p in plan.of("env_runner"))
    assert plan.bundles["reward"] == [{"GPU": 1.0, "CPU": 2.0}] * 3
    assert plan.total_gpus == 4 and plan.total_cpus == 15


def test_local_topology_needs_no_gpu():
    plan = plan_topology(topology("local"), OFFPOLICY)
    assert plan.total_gpus == 0
    check_cluster(plan, {"CPU": 2, "GPU": 0})


def test_cluster_too_small_is_one_line():
    plan = plan_topology(topology("split_1_3"), OFFPOLICY)
    with pytest.raises(TopologyError) as info:
        check_cluster(plan, {"CPU": 64, "GPU": 2})
    assert "needs 4 GPUs but the cluster has 2" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("change, message", [
    (lambda t: t["roles"]["labeler"].update(count=7), "ask for 3.5 GPUs but the pool has 3"),
    (lambda t: t["roles"]["labeler"].update(pool="nope"), "names pool 'nope'"),
    (lambda t: t["roles"]["env_runner"].update(count=-1), "must be at least 1"),
    (lambda t: t["roles"]["env_runner"].update(gpus=0.5), "has no pool"),
    (lambda t: t["roles"]["learner"].update(count=2), "ask for 2 GPUs but the pool has 1"),  # ranks: a GPU each
    (lambda t: t["roles"]["learner"].update(count=1.5), "must be a whole number"),
    (lambda t: t["pools"]["reward"].update(gpus=1.5), "whole number"),
    (lambda t: t["roles"].pop("labeler"), "has no role 'labeler'"),
])
def test_impossible_topologies_fail_with_one_line(change, message):
    from omegaconf import OmegaConf

    t = OmegaConf.to_container(topology("split_1_3"))
    change(t)
    with pytest.raises(TopologyError) as info:
        plan_topology(t, OFFPOLICY)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_placement_with_declared_gpus(ray_cpu):
    """Labelers land on the reward pool's GPUs, the learner on the train pool's, never shared (as `rlfarm plan`
    reads them: a probe task per placement); an actor placed as a labeler holds the GPU its probe saw."""
    ray = ray_cpu
    plan = plan_topology(topology("split_1_3"), OFFPOLICY)
    placed = PlacedTopology(plan, ready_timeout_s=30)
    try:
        ids = {(row["role"], row["index"]): [int(g) for g in row["gpu_ids"]]
               for row in placements_with_gpu_ids(plan, placed)}
        learner_gpus = set(ids[("learner", 0)])
        labeler_gpus = [tuple(ids[("labeler", i)]) for i in range(6)]
        assert len(learner_gpus) == 1
        assert len(set(labeler_gpus)) == 3 and all(len(g) == 1 for g in labeler_gpus)
        assert not learner_gpus & {g[0] for g in labeler_gpus}
        # two labelers per reward GPU, in bundle order
        assert labeler_gpus[0] == labeler_gpus[1] and labeler_gpus[2] == labeler_gpus[3] and labeler_gpus[4] == labeler_gpus[5]
        assert all(ids[("env_runner", i)] == [] for i in range(8))
        labeler = ray.remote(placement_probe()).options(**placed.options(plan.of("labeler")[5])).remote()
        assert [int(g) for g in ray.get(labeler.where.remote())["gpu_ids"]] == ids[("labeler", 5)]
        ray.kill(labeler)
    finally:
        placed.remove()


def test_local_resources_count_only_the_cpus_this_process_may_use():
    """Inside a Slurm job (or under taskset) a private Ray must not claim the whole node."""
    import subprocess
    import sys

    code = ("import os; os.sched_setaffinity(0, {0}); from rlfarm.topology import local_resources; "
            "print(local_resources(None, 0)['CPU'], local_resources(3, 0)['CPU'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1.0", "3.0"]


def _multi_gpu_learner():
    from omegaconf import OmegaConf

    t = OmegaConf.to_container(topology("split_1_3"))
    t["pools"]["train"]["gpus"] = 3
    t["roles"]["learner"].update(gpus=2)  # a DDP/FSDP learner holds two whole GPUs ...
    t["roles"]["labeler"].update(count=2, gpus=0.5, pool="train")  # ... next to a labeler GPU in the same pool
    t["roles"]["labeler"]["pool"] = "train"
    return t


def test_a_learner_with_two_gpus_gets_one_bundle_holding_both():
    plan = plan_topology(_multi_gpu_learner(), OFFPOLICY)
    (learner,) = plan.of("learner")
    assert plan.bundles["train"][learner.bundle]["GPU"] == 2.0
    assert sorted(b["GPU"] for b in plan.bundles["train"]) == [1.0, 2.0]  # 3 GPUs: one 2-GPU bundle + one
    assert {p.bundle for p in plan.of("labeler")} == {1 - learner.bundle}
    with pytest.raises(TopologyError, match="ask for 4 GPUs but the pool has 3"):
        t = _multi_gpu_learner()
        t["roles"]["labeler"].update(count=4)
        plan_topology(t, OFFPOLICY)


def test_a_two_gpu_learner_is_placed_on_two_gpus(ray_cpu):
    ray = ray_cpu
    t = _multi_gpu_learner()
    t["pools"].pop("reward")
    plan = plan_topology(t, OFFPOLICY)
    placed = PlacedTopology(plan, ready_timeout_s=30)
    try:
        learner = plan.of("learner")[0]
        probe = ray.remote(placement_probe()).options(**placed.options(learner)).remote()
        assert len(ray.get(probe.where.remote())["gpu_ids"]) == 2
        ray.kill(probe)
    finally:
        placed.remove()
