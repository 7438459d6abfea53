"""Where weights come from for each engine (`plan_weight_sync`), from the GPUs Ray gave the roles — pure."""
import pytest

from rlfarm.errors import ConfigError
from rlfarm.loops.llm_layout import plan_weight_sync

NODE = "n1"


def gpus(*ids):
    return [(NODE, gpu) for gpu in ids]


def test_engines_on_gpus_of_their_own_get_one_broadcast_from_rank_0():
    sync = plan_weight_sync("auto", gpus(0, 1), gpus(2, 3), on_gpus=True)
    assert sync.transport == "broadcast" and sync.sources == (0, 0) and sync.engines_of(0) == [0, 1]


def test_each_time_shared_engine_reads_from_the_rank_on_its_gpu():
    sync = plan_weight_sync("auto", gpus(0, 1, 2, 3), gpus(0, 1, 2, 3), on_gpus=True)
    assert sync.transport == "ipc" and sync.sources == (0, 1, 2, 3) and sync.ranks == (0, 1, 2, 3)
    # under FSDP only rank 0 holds whole tensors: the others' engines cannot read from their rank
    assert plan_weight_sync("auto", gpus(0, 1), gpus(0, 1), on_gpus=True, sharded=True).transport == "object_store"
    assert plan_weight_sync("auto", gpus(0, 1), gpus(0, 0), on_gpus=True, sharded=True).sources == (0, 0)


def test_a_mix_and_cpu_roles_go_through_the_object_store():
    assert plan_weight_sync("auto", gpus(0), gpus(0, 1), on_gpus=True).transport == "object_store"
    assert plan_weight_sync("auto", gpus(0, 1), gpus(1), on_gpus=True).transport == "object_store"  # not rank 0's
    assert plan_weight_sync("auto", gpus(-1), gpus(-1, -1), on_gpus=False).transport == "object_store"
    assert plan_weight_sync("auto", gpus(0), gpus(0), on_gpus=False).transport == "object_store"  # declared GPUs


@pytest.mark.parametrize("choice, learners, engines, needle", [
    ("ipc", gpus(0), gpus(1), "needs the learner and the engine on one GPU"),
    ("broadcast", gpus(0), gpus(0), "NCCL needs one GPU per rank"),
    ("broadcast", gpus(0), gpus(0, 1), "cannot reach every engine"),
])
def test_a_transport_that_cannot_reach_an_engine_is_refused(choice, learners, engines, needle):
    with pytest.raises(ConfigError, match=needle):
        plan_weight_sync(choice, learners, engines, on_gpus=True)


@pytest.mark.parametrize("name, learners, engines, time_shared", [
    ("split_2_2", 2, 2, False), ("split_4_4", 4, 4, False), ("colocated_4", 4, 4, True)])
def test_the_scale_out_topologies_give_each_engine_and_each_rank_a_gpu_of_its_own_kind(name, learners, engines,
                                                                                         time_shared):
    """Placed dry (no Ray): one learner rank per GPU, one engine per GPU; split engines on GPUs no rank holds,
    colocated ones each on a rank's GPU; the scorers (rule verifiers) on CPU."""
    from rlfarm.config import compose
    from rlfarm.families import LLM
    from rlfarm.loops.llm_layout import time_shared_in_plan
    from rlfarm.topology import plan_topology

    plan = plan_topology(compose("train", ["experiment=grpo_digits", f"topology={name}"]).topology, LLM)
    ranks = [(p.pool, p.bundle) for p in plan.of("learner")]
    gens = [(p.pool, p.bundle) for p in plan.of("engine")]
    assert len(set(ranks)) == len(ranks) == learners and len(set(gens)) == len(gens) == engines
    assert bool(set(ranks) & set(gens)) == time_shared == time_shared_in_plan(plan)
    assert all(p.gpus == 0 for p in plan.of("labeler"))
