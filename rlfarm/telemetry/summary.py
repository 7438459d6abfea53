"""The paragraph printed at the end of a run."""
from __future__ import annotations

from omegaconf import DictConfig


def summary_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    ret = s.get("episode_return_mean")
    ret_text = f"{ret:.1f}" if ret is not None else "n/a"
    rate = s["env_steps"] / max(s["wall_s"], 1e-9)
    quarantined = s.get("transitions_quarantined", 0)
    exact = ("exactly once" if s["transitions_produced"] == s["transitions_labeled"] + quarantined
             and s["transitions_labeled"] == s["transitions_stored"] else "MISMATCH")
    faults = (f" Reward-model faults: {quarantined:,} transitions quarantined in {run_dir}/quarantine/, "
              f"{s.get('reward_retries', 0)} retried batches; last error: {s.get('reward_last_error')}."
              if quarantined or s.get("reward_retries") else "")
    return (f"Done: {cfg.algo.name} on {cfg.env.id} ({cfg.topology.name}, reward={cfg.reward._target_.rsplit('.', 1)[-1]}) "
            f"ran {s['env_steps']:,} env steps in {s['wall_s']:.0f} s ({rate:,.0f}/s) with {s['updates']:,} updates; "
            f"mean return of the last 10 episodes {ret_text}. Transitions produced {s['transitions_produced']:,}, "
            f"labeled {s['transitions_labeled']:,}, stored {s['transitions_stored']:,} ({exact}, "
            f"{s.get('duplicates', 0)} duplicates dropped).{faults} Run dir: {run_dir} "
            f"(curves: tensorboard --logdir {run_dir}/tb).")


def onpolicy_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    reached = "reached" if s.get("reached_target") else "did not reach"
    return (f"Done: {cfg.algo.name} on the '{cfg.env.task}' task ({cfg.topology.name}) ran {s['updates']:,} updates "
            f"({s['samples']:,} samples) in {s['wall_s']:.0f} s; mean reward of the last 10 updates "
            f"{s['reward_mean']:.3f} ({reached} the target {s.get('target_reward')}). Run dir: {run_dir}.")
