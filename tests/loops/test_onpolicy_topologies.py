"""Placement must not change the math: GRPO's first update gives the same loss whether the engine shares
the learner's GPU (colocated: it sleeps while the learner trains) or has its own (split_1_1). On a CPU
machine the GPUs are declared to Ray, so the real placement groups are built and the roles run on CPU. Nor may
data parallelism: two FSDP learner ranks (split_2_1, gloo here) give the one learner's first loss."""
import pytest

from helpers import metrics_rows, read_summary, report_of_one_run, train

SHORT = ["experiment=grpo_digits", "algo.max_updates=2", "algo.prompts_per_step=4", "seed=3"]


RUNS: dict[str, list[dict]] = {}  # topology → metrics rows, one run each per session (split_1_1 serves two tests)


def first_rows(tmp_path, topology, gpus, *overrides):
    key = " ".join([topology, *overrides])
    if key in RUNS:
        return RUNS[key]
    run_dir = tmp_path / key.replace(" ", "_").replace("=", "-")
    out = train(run_dir, *SHORT, f"topology={topology}", f"ray.num_gpus={gpus}", "ray.num_cpus=8", *overrides)
    assert out.returncode == 0, out.stderr[-3000:]
    RUNS[key] = metrics_rows(run_dir)
    if topology == "colocated":  # what `rlfarm report` draws of a GRPO run
        report_of_one_run(run_dir, {"reward", "response_len", "kl", "update_entropy", "staleness", "stage_times"})
        # synchronous, fp32 engine and learner on CPU: every rollout came from the newest weights, and every update
        # starts on the engine's policy (logprob mismatch ~0); every sample counted once; the final weights saved
        rows, summary = metrics_rows(run_dir), read_summary(run_dir)
        assert [row["updates"] for row in rows] == [1, 2] and all(row["staleness"] == 0 for row in rows)
        assert all(0 <= row["engine_logprob_gap"] < 1e-4 for row in rows), rows
        assert summary["samples"] == 2 * 4 * 8 and (run_dir / "checkpoints" / "final.pt").exists()
    if topology == "split_2_1":
        assert read_summary(run_dir)["learner_ranks"] == 2
        assert (run_dir / "checkpoints" / "final.pt").exists()  # rank 0 wrote it (under FSDP: gathered)
    return RUNS[key]


def test_colocated_and_split_give_the_same_first_step_loss(tmp_path):
    colocated, split = first_rows(tmp_path, "colocated", 1), first_rows(tmp_path, "split_1_1", 2)
    assert len(colocated) == len(split) == 2
    for key in ("reward", "loss", "grad_norm", "entropy"):
        assert colocated[0][key] == split[0][key], key
    assert colocated[0]["loss"] != 0.0
    # and the second update too: the engine woke up with the learner's new weights in both cases
    assert colocated[1]["reward"] == split[1]["reward"]


@pytest.mark.slow
def test_two_fsdp_learner_ranks_give_the_one_learners_first_step(tmp_path):
    """Through the command, FSDP (the sharded path: its checkpoint is gathered on rank 0); DDP gives the one
    learner's update too, checked on the roles (tests/roles/test_learner_group.py)."""
    one = first_rows(tmp_path, "split_1_1", 2)
    two = first_rows(tmp_path, "split_2_1", 3, "algo.data_parallel=fsdp")
    assert len(two) == 2 and two[0]["reward"] == one[0]["reward"]  # same rollout from the same engine
    for key in ("loss", "grad_norm", "clip_fraction", "approx_kl"):
        assert two[0][key] == pytest.approx(one[0][key], rel=1e-5, abs=1e-6), key

