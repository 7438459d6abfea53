"""Issue 35 item 6: a resume loses nothing that learning depends on. A GRPO run resumed from its step-4 checkpoint
(two engines, synchronous: no rollout in flight at the checkpoint) makes the same updates as the run that went on
uninterrupted — the same rewards, losses and entropies row for row, and the same final weights and AdamW state —
because the checkpoint holds, besides the weights, AdamW and the version, where the random streams stood after the
step trained last: each engine's prompt and sampling streams, and the learner's generators (its minibatch
permutation), `rlfarm.engines.streams`. A resumed run that drew new streams learned from other prompts and samples
than the uninterrupted one: another trajectory, which on this task may end on or off the plateau of runs that
never learn to stop (test_grpo_resume.py)."""
import shutil

import torch

from helpers import metrics_rows, rlfarm, shared_ray_address, train

RUN = ["experiment=grpo_digits", "logger=none", "algo.max_updates=8", "algo.target_reward=null",
       "algo.prompts_per_step=8", "topology.roles.engine.count=2", "run.checkpoint_every_updates=4", "seed=1"]
COMPARED = ("reward", "loss", "entropy", "grad_norm", "kept_groups", "response_len", "approx_kl", "clip_fraction")


def test_a_resumed_run_makes_the_uninterrupted_runs_updates(tmp_path):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    out = train(whole, *RUN)
    assert out.returncode == 0, out.stderr[-3000:]
    # the same run stopped after update 4: its directory as it stood then (later rows are dropped on resume)
    shutil.copytree(whole, resumed)
    for later in ("summary.json", "checkpoints/final.pt", "checkpoints/step_000000008.pt"):
        for path in (resumed / later, resumed / f"{later}.sha256"):
            path.unlink(missing_ok=True)
    address = shared_ray_address()
    out = rlfarm("train", f"hydra.run.dir={resumed}", "run.live=false", *RUN, "resume=auto",
                 *([f"ray.address={address}"] if address else []))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step_000000004.pt after update 4" in (resumed / "train.log").read_text()

    rows, again = metrics_rows(whole), metrics_rows(resumed)
    assert [row["updates"] for row in again] == list(range(1, 9))
    assert min(row["kept_groups"] for row in rows[4:]) > 0  # every compared update did train
    for before, after in zip(rows[4:], again[4:]):
        assert {key: after[key] for key in COMPARED} == {key: before[key] for key in COMPARED}, after["updates"]
    final, final_again = (torch.load(run / "checkpoints" / "final.pt", weights_only=True) for run in (whole, resumed))
    for name, tensor in final["model"].items():
        assert torch.equal(final_again["model"][name], tensor), name
    for index, state in final["optimizer"]["state"].items():
        assert all(torch.equal(final_again["optimizer"]["state"][index][key], value) for key, value in state.items())
