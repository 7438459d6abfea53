"""What `rlfarm report` draws of a family's runs: panels (metrics over a clock) grouped into figures, the panels drawn
as mean ± std across seeds, and the columns of report.md's table. One `Report` per family, named by its record
(rlfarm/families.py: `report`), drawn by rlfarm/telemetry/plots.py. A family lists every panel any of its algorithms
logs: a panel for which no run of the report has a value is left out (SAC logs no policy_loss, IMPALA no
critic_loss), and so is a figure left with nothing new. Plain data: no import of matplotlib."""
from __future__ import annotations

from dataclasses import dataclass

from rlfarm.telemetry.columns import Field


@dataclass(frozen=True)
class Panel:
    keys: tuple[str, ...]  # the metrics drawn (several: one line style each), read from metrics.jsonl rows
    x: str                 # the row key on the x axis
    title: str
    x_label: str


STEPS, WALL, UPDATES = ("env_steps", "env steps"), ("wall_s", "wall time (s)"), ("updates", "updates")


def _panel(keys: str | tuple[str, ...], clock: tuple[str, str], title: str) -> Panel:
    return Panel(keys if isinstance(keys, tuple) else (keys,), clock[0], title, clock[1])


# Rates are smoothed when drawn (per-window counts spike as chunks land).
PANELS: dict[str, Panel] = {
    # the env's return, every gymnasium family
    "return_vs_steps": _panel("episode_return_mean", STEPS, "episode return (mean of last 10)"),
    "return_vs_wall": _panel("episode_return_mean", WALL, "episode return (mean of last 10)"),
    # off-policy stages
    "env_steps_per_s": _panel("env_steps_per_s", WALL, "acting: env steps / s"),
    "labeled_per_s": _panel("labeled_per_s", WALL, "labeling: transitions / s"),
    "updates_per_s": _panel("updates_per_s", WALL, "learning: updates / s"),
    "labeling_lag_s": _panel("labeling_lag_s", WALL, "labeling lag (s, produced → labeled)"),
    "buffer_size": _panel("buffer_size", WALL, "replay buffer size"),
    "labeled_reward": _panel("labeled_reward_mean", STEPS, "reward trained on (labeled, mean per step)"),
    "env_reward": _panel("env_reward_mean", STEPS, "env's own reward (mean per step)"),
    # losses of the gymnasium learners (SAC; IMPALA/APPO and PPO)
    "critic_loss": _panel("critic_loss", STEPS, "critic loss"),
    "actor_loss": _panel("actor_loss", STEPS, "actor loss"),
    "alpha": _panel("alpha", STEPS, "entropy temperature (alpha)"),
    "policy_loss": _panel("policy_loss", STEPS, "policy loss"),
    "value_loss": _panel("value_loss", STEPS, "value loss"),
    "entropy": _panel("entropy", STEPS, "policy entropy"),
    "approx_kl": _panel("approx_kl", STEPS, "approx. KL to the behaviour policy"),
    "clip_fraction": _panel("clip_fraction", STEPS, "clipped fraction"),
    "explained_variance": _panel("explained_variance", STEPS, "value: explained variance"),
    # how old the acting policy was
    "policy_lag": _panel(("policy_lag_mean", "policy_lag_max"), STEPS, "policy lag (versions, mean / max)"),
    "dropped_lag": _panel("transitions_dropped_lag", STEPS, "transitions dropped for lag"),
    "ppo_staleness": _panel("staleness", STEPS, "staleness of the rollout (versions)"),
    "ppo_times": _panel(("rollout_s", "update_s"), STEPS, "cycle: rollout / update (s)"),
    # LLM and VLA rows, by update
    "reward": _panel(("reward", "reward_mean"), UPDATES, "reward: per update / mean of last 10"),
    "reward_mean_vs_updates": _panel("reward_mean", UPDATES, "reward (mean of last 10)"),
    "reward_mean_vs_wall": _panel("reward_mean", WALL, "reward (mean of last 10)"),
    "response_len": _panel("response_len", UPDATES, "response length (tokens)"),
    "kl": _panel(("approx_kl", "engine_kl_k3"), UPDATES, "KL: to the old policy / engine vs learner (k3)"),
    "update_entropy": _panel("entropy", UPDATES, "policy entropy"),
    "update_loss": _panel(("loss", "policy_loss"), UPDATES, "loss"),
    "update_value_loss": _panel(("value_loss", "value_rmse"), UPDATES, "value: loss / RMSE"),
    "kept_groups": _panel("kept_groups", UPDATES, "groups kept (with a learning signal)"),
    "staleness": _panel("staleness", UPDATES, "staleness (versions behind the learner)"),
    "dropped_stale": _panel("dropped_stale", UPDATES, "steps dropped as too stale"),
    "stage_times": _panel(("generate_s", "score_s", "update_s", "sync_s", "wait_s", "step_s"), UPDATES,
                          "stage times (s): generate, score, update, sync, wait, step"),
    "samples_per_s": _panel("samples_per_s", WALL, "samples / s"),
    "generated_tokens_per_s": _panel("generated_tokens_per_s", UPDATES, "generated tokens / s"),
    # VLA
    "success": _panel(("success_rate", "success_rate_mean"), UPDATES, "success: per update / mean of last 10"),
    "success_vs_updates": _panel("success_rate_mean", UPDATES, "success (mean of last 10)"),
    "success_vs_wall": _panel("success_rate_mean", WALL, "success (mean of last 10)"),
    "chunks": _panel(("inference_calls", "policy_calls"), UPDATES,
                     "action chunks: inferred per rollout / trained per update"),
    "episode_steps": _panel("episode_steps", UPDATES, "episode length (env steps)"),
    "rollout_times": _panel(("rollout_s", "env_s", "infer_s", "overlap_s", "update_s"), UPDATES,
                            "stage times (s): rollout, env, inference, overlap, update"),
    "vla_env_steps_per_s": _panel("env_steps_per_s", UPDATES, "env steps / s in the rollout"),
}


@dataclass(frozen=True)
class Report:
    figures: tuple[tuple[str, tuple[str, ...]], ...]  # (figure name, its panels), in the order drawn
    across_seeds: tuple[str, ...]                      # the panels of returns_across_seeds.png (one key each)
    table: tuple[Field, ...]                           # report.md's columns after run, dir and status
    headline: Field                                    # the column "Across seeds" averages


RETURN: Field = ("episode_return_mean", "return (last 10)", ".1f")
OFFPOLICY_REPORT = Report(
    figures=(("returns", ("return_vs_steps", "return_vs_wall")),
             ("throughput", ("env_steps_per_s", "labeled_per_s", "updates_per_s")),
             ("labeling", ("labeling_lag_s", "buffer_size")),
             ("losses", ("critic_loss", "actor_loss", "alpha", "policy_loss", "value_loss", "entropy")),
             ("lag", ("policy_lag", "dropped_lag")),
             # the true return beside the reward the learner trained on: where a learned reward and the task part ways
             ("rewards", ("return_vs_steps", "labeled_reward", "env_reward"))),
    across_seeds=("return_vs_steps", "return_vs_wall"),
    table=(("env_steps", "env steps", ",.0f"), ("updates", "updates", ",.0f"), RETURN, ("wall_s", "wall s", ".1f"),
           ("env_steps_per_s", "env steps/s", ",.1f"), ("transitions_stored", "stored", ",.0f")),
    headline=RETURN)
PPO_REPORT = Report(
    figures=(("returns", ("return_vs_steps", "return_vs_wall")),
             ("losses", ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance")),
             ("pipeline", ("env_steps_per_s", "ppo_times", "ppo_staleness"))),
    across_seeds=("return_vs_steps", "return_vs_wall"),
    table=(("env_steps", "env steps", ",.0f"), ("updates", "updates", ",.0f"), RETURN, ("wall_s", "wall s", ".1f"),
           ("env_steps_per_s", "env steps/s", ",.1f")),
    headline=RETURN)
REWARD: Field = ("reward_mean", "reward (last 10)", ".3f")
LLM_REPORT = Report(
    figures=(("rewards", ("reward", "response_len")),
             ("policy", ("kl", "update_entropy", "update_loss", "update_value_loss", "kept_groups")),
             ("pipeline", ("stage_times", "staleness", "dropped_stale", "samples_per_s", "generated_tokens_per_s"))),
    across_seeds=("reward_mean_vs_updates", "reward_mean_vs_wall"),
    table=(("updates", "updates", ",.0f"), ("samples", "samples", ",.0f"), REWARD,
           ("response_len", "response length", ".1f"), ("policy_staleness_max", "staleness max", ".0f"),
           ("wall_s", "wall s", ".1f"), ("samples_per_s", "samples/s", ",.1f")),
    headline=REWARD)
SUCCESS: Field = ("success_rate_mean", "success (last 10)", ".3f")
VLA_REPORT = Report(
    figures=(("success", ("success", "chunks", "episode_steps")),
             ("policy", ("update_entropy", "update_loss", "update_value_loss", "kl", "kept_groups")),
             ("pipeline", ("rollout_times", "vla_env_steps_per_s", "staleness"))),
    across_seeds=("success_vs_updates", "success_vs_wall"),
    table=(("updates", "updates", ",.0f"), ("env_steps", "env steps", ",.0f"), SUCCESS, ("wall_s", "wall s", ".1f"),
           ("env_steps_per_s", "env steps/s", ",.1f")),
    headline=SUCCESS)
