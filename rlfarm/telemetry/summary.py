"""The paragraph printed at the end of a run, one per family (named by its record in rlfarm/families.py)."""
from __future__ import annotations

from omegaconf import DictConfig


def offpolicy_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    ret = s.get("episode_return_mean")
    ret_text = f"{ret:.1f}" if ret is not None else "n/a"
    rate = s["env_steps"] / max(s["wall_s"], 1e-9)
    quarantined = s.get("transitions_quarantined", 0)
    unlabeled = s.get("transitions_unlabeled", 0)  # still in the farm when the end-of-run flush ran out of time
    exact = ("exactly once" if s["transitions_produced"] == s["transitions_labeled"] + quarantined + unlabeled
             and s["transitions_labeled"] == s["transitions_stored"] else "MISMATCH")
    if unlabeled:
        exact += f"; {unlabeled:,} left unlabeled when the run's time ran out"

    faults = (f" Reward-model faults: {quarantined:,} transitions quarantined in {run_dir}/quarantine/, "
              f"{s.get('reward_retries', 0)} retried batches; last error: {s.get('reward_last_error')}."
              if quarantined or s.get("reward_retries") else "")
    restarts = "".join(f" {r['role']} {r['index']} died and was back in {r['recovery_s']:.1f} s." for r in s.get("recoveries", []))
    relabeled = f", {s['transitions_relabeled']:,} relabeled after a restart" if s.get("transitions_relabeled") else ""
    return (f"Done: {cfg.algo.name} on {cfg.env.id} ({cfg.topology.name}, reward={cfg.reward._target_.rsplit('.', 1)[-1]}) "
            f"ran {s['env_steps']:,} env steps in {s['wall_s']:.0f} s ({rate:,.0f}/s) with {s['updates']:,} updates; "
            f"mean return of the last 10 episodes {ret_text}. Transitions produced {s['transitions_produced']:,}, "
            f"labeled {s['transitions_labeled']:,}, stored {s['transitions_stored']:,} ({exact}, "
            f"{s.get('duplicates', 0)} duplicates dropped{relabeled}).{faults}{restarts}{_startup(s)} Run dir: {run_dir} "
            f"(curves: tensorboard --logdir {run_dir}/tb).")


def llm_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    return (f"Done: {cfg.algo.name} on the '{cfg.env.task}' task ({cfg.topology.name}) ran {s['updates']:,} updates "
            f"({s['samples']:,} samples) in {s['wall_s']:.0f} s; mean reward of the last 10 updates "
            f"{s['reward_mean']:.3f}{_target(s, 'target_reward')}.{_step_against_stages(s.get('median') or {})}"
            f"{_learner_work(s.get('median') or {})} "
            f"{_speed_run(s)}Run dir: {run_dir}.")


def _speed_run(s: dict) -> str:
    """Synthetic lengths make a run a speed run: its rewards say nothing about learning."""
    lengths = s.get("synthetic_lengths")
    if not lengths:
        return ""
    return (f"SPEED RUN: synthetic lengths (median {lengths['median_frac']:.3g}·cap, p99 {lengths['p99_frac']:.3g}·cap) "
            "end the samples, not the policy. ")


def _learner_work(median: dict) -> str:
    """The learner's useful TFLOP/s per update, and its MFU where the card's peak is known (`model_flops`)."""
    if not median.get("learner_tflops"):
        return ""
    mfu = f", MFU {100 * median['mfu']:.1f} % of the cards' dense bf16 peak" if median.get("mfu") else ""
    peak = f", {median['learner_peak_gib']:.1f} GiB at most on its GPU" if median.get("learner_peak_gib") else ""
    return f" Learner {median['learner_tflops']:.3g} TFLOP/s of model FLOPs (6·N·T){mfu}{peak}."


def _step_against_stages(median: dict) -> str:
    """The median step next to its slowest stage, which names the bottleneck."""
    stages = {name: median[key] for name, key in (("generate", "generate_s"), ("update", "update_s"))
              if median.get(key)}
    if not median.get("step_s") or not stages:
        return ""
    name = max(stages, key=stages.get)
    return (f" Median step {median['step_s']:.3f} s = {median['step_s'] / stages[name]:.2f}× its slowest stage "
            f"({name} {stages[name]:.3f} s: the bottleneck).")


def ppo_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    ret = s.get("episode_return_mean")
    reached = _target(s, "target_return")
    return (f"Done: {cfg.algo.name} on {cfg.env.id} ({cfg.topology.name}) ran {s['env_steps']:,} env steps in "
            f"{s['wall_s']:.0f} s ({s['env_steps_per_s']:,.0f}/s) with {s['updates']:,} updates "
            f"({s['gradient_steps']:,} gradient steps); mean return of the last 10 episodes "
            f"{'n/a' if ret is None else f'{ret:.1f}'}{reached}. Run dir: {run_dir} "
            f"(curves: tensorboard --logdir {run_dir}/tb).")


def vla_paragraph(cfg: DictConfig, s: dict, run_dir: str) -> str:
    reached = _target(s, "target_success")
    return (f"Done: {cfg.algo.name} on {cfg.env.id} ({cfg.topology.name}) ran {s['updates']:,} updates "
            f"({s['samples']:,} episodes, {s['env_steps']:,} env steps) in {s['wall_s']:.0f} s; success rate "
            f"{_rate(s.get('success_rate_start'))} at the start → {_rate(s.get('success_rate'))} over the last "
            f"updates{reached}. "
            f"Run dir: {run_dir}.")


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _target(s: dict, key: str) -> str:
    """The " (reached the target 0.95)" part of a summary line, or nothing when the run had no target."""
    target = s.get(key)
    if target is None:
        return ""
    return f" ({'reached' if s.get('reached_target') else 'did not reach'} the target {target})"


def _startup(s: dict) -> str:
    return f" First env step {s['startup_s']:.1f} s after the command started." if s.get("startup_s") else ""
