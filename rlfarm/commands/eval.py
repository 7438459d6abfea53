"""`rlfarm eval run_dir=<run>`: play the run's trained policy, write <run>/eval/returns.json and MP4s, print a table.

The rollouts and video writing live in rlfarm/evaluation.py; this module reads the options, checks the
run directory before Hydra starts (bad run_dir → one line, exit 2, nothing written) and reports.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from rlfarm.cli import fail
from rlfarm.commands.options import check_bools, check_ints, compose_jobs
from rlfarm.errors import ConfigError, RlfarmError

log = logging.getLogger("rlfarm")


def preflight(config_name: str, args: list[str]) -> None:
    from rlfarm.evaluation import check_evaluable, check_run_dir, find_checkpoint

    # `reward` names a config group of conf/, so Hydra would read reward=true as a group choice.
    if any(a.split("=", 1)[0] == "reward" for a in args):
        raise ConfigError("eval has no option 'reward'", "score episodes with the run's reward model by reward_model=true")
    for cfg in compose_jobs(config_name, args, "run_dir"):
        check_options(cfg)
        run_dir = check_run_dir(cfg.run_dir)
        check_evaluable(run_dir)
        find_checkpoint(run_dir, str(cfg.checkpoint))


def check_options(cfg: DictConfig) -> None:
    """Values Hydra cannot type-check."""
    check_ints(cfg, episodes=1, video_episodes=0, video_size=16, seed=0)
    if cfg.video_size % 2:
        raise ConfigError(f"video_size must be even, got {cfg.video_size}",
                          "H.264 needs even frame sizes, e.g. video_size=256")
    if cfg.video_fps is not None and not (isinstance(cfg.video_fps, (int, float)) and cfg.video_fps > 0):
        raise ConfigError(f"video_fps must be a positive number or null, got {cfg.video_fps!r}", "e.g. video_fps=30")
    check_bools(cfg, "deterministic", "video", "reward_model")


def task(cfg: DictConfig) -> dict:
    logging.getLogger("OpenGL").setLevel(logging.WARNING)  # PyOpenGL announces a missing accelerator at INFO
    logging.getLogger("mujoco").addFilter(OncePerMessage())  # MuJoCo repeats its model-load warnings per episode env
    try:
        result = evaluate(cfg)
    except RlfarmError as error:
        fail(error)
    except Exception as error:  # e.g. a reward model that cannot load: one line here, the traceback in eval.log
        log.debug("eval failed", exc_info=True)
        fail(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
    Console().print(results_table(result))
    count = len(result["episodes"])
    log.info(f"eval: {count} episode{'s' if count != 1 else ''}, return {result['return_mean']:.1f} ± "
             f"{result['return_std']:.1f}; wrote {Path(result['run_dir']) / 'eval' / 'returns.json'}")
    return result


class OncePerMessage(logging.Filter):
    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def evaluate(cfg: DictConfig) -> dict:
    """Play cfg.episodes episodes of the run's policy; write <run>/eval/returns.json (+ MP4s); return its content."""
    import torch

    from rlfarm.evaluation import build_actor, load_trained_run
    from rlfarm.run import write_json_atomic

    started = time.monotonic()
    run = load_trained_run(cfg.run_dir, verified_checkpoint(cfg))
    out_dir = run.dir / "eval"
    out_dir.mkdir(exist_ok=True)
    for stale in out_dir.glob("episode_*.mp4"):  # from an earlier eval with more video episodes
        stale.unlink()
    torch.manual_seed(cfg.seed)  # only matters for deterministic=false
    actor = build_actor(run.cfg, run.state["agent"]["actor"], run.cfg.env)
    reward_model = load_reward_model(run.cfg) if cfg.reward_model else None
    episodes = play_episodes(cfg, run, actor, reward_model, out_dir)
    result = results_json(cfg, run, episodes, reward_model)
    result["wall_s"] = round(time.monotonic() - started, 3)
    write_json_atomic(out_dir / "returns.json", result)
    return result


def verified_checkpoint(cfg: DictConfig) -> str:
    """The checkpoint to load (as `load_trained_run` takes it), verified first: `latest` is the newest intact
    one (a warning line names each damaged newer one); a damaged one picked by name is one line."""
    from rlfarm.checkpoint_files import check_intact, newest_intact
    from rlfarm.evaluation import check_run_dir, find_checkpoint

    run_dir = check_run_dir(cfg.run_dir)
    fix = "pick another checkpoint=<file name> (or latest), or another run_dir"
    if str(cfg.checkpoint) == "latest":
        path = newest_intact(run_dir / "checkpoints", "evaluating", fix) or find_checkpoint(run_dir)
    else:
        path = check_intact(find_checkpoint(run_dir, str(cfg.checkpoint)), fix)
    return path.name if path.parent == run_dir / "checkpoints" else str(path)


def load_reward_model(run_cfg: DictConfig):
    from hydra.utils import instantiate

    model = instantiate(run_cfg.reward)
    model.setup("cpu")
    return model


def play_episodes(cfg: DictConfig, run, actor, reward_model, out_dir: Path) -> list:
    """Episode i in an env seeded cfg.seed + i; the first video_episodes filmed; each scored when reward_model."""
    from rlfarm.evaluation import play_episode, render_fps, score_with_reward_model, write_video

    filmed = min(cfg.video_episodes, cfg.episodes) if cfg.video else 0
    fps = (cfg.video_fps or render_fps(run.cfg.env)) if filmed else None
    reward_frame_size = reward_model.frame_size if reward_model is not None and "frames" in reward_model.needs else None
    episodes = []
    for i in range(cfg.episodes):
        frame_size = cfg.video_size if i < filmed else reward_frame_size
        episode = play_episode(actor, run.cfg.env, cfg.seed + i, cfg.deterministic, frame_size)
        if i < filmed:
            episode.video = str(write_video(out_dir / f"episode_{i:03d}.mp4", episode.frames, fps).relative_to(run.dir))
        if reward_model is not None:
            episode.reward_model_return = score_with_reward_model(reward_model, episode)
        episode.frames = None  # a long episode's frames are large; only the video keeps them
        episodes.append(episode)
    return episodes


def results_json(cfg: DictConfig, run, episodes: list, reward_model) -> dict:
    from rlfarm.evaluation import summarize

    checkpoint = run.checkpoint.relative_to(run.dir) if run.checkpoint.is_relative_to(run.dir) else run.checkpoint
    result = {
        "run_dir": str(run.dir.resolve()), "checkpoint": str(checkpoint), "checkpoint_updates": run.state.get("updates"),
        "env_id": run.cfg.env.id, "seed": cfg.seed, "deterministic": cfg.deterministic,
        "episodes": [{"episode": i, "seed": e.seed, "return": e.episode_return, "length": e.length,
                      **({"reward_model_return": e.reward_model_return} if reward_model is not None else {}),
                      **({"video": e.video} if e.video else {})} for i, e in enumerate(episodes)],
        "length_mean": sum(e.length for e in episodes) / len(episodes),
        "videos": [e.video for e in episodes if e.video],
    }
    result["return_mean"], result["return_std"] = summarize([e.episode_return for e in episodes])
    if reward_model is not None:
        result["reward_model"] = run.cfg.reward._target_
        result["reward_model_return_mean"], result["reward_model_return_std"] = \
            summarize([e.reward_model_return for e in episodes])
    return result


def results_table(result: dict) -> Table:
    scored = "reward_model_return_mean" in result
    table = Table(title=f"{result['env_id']} · {result['run_dir']} · {result['checkpoint']} "
                        f"({result['checkpoint_updates']} updates)", title_justify="left")
    for column in ("episode", "seed", "return", "length", *(["reward model"] if scored else []), "video"):
        table.add_column(column, justify="left" if column == "video" else "right")
    for e in result["episodes"]:
        table.add_row(str(e["episode"]), str(e["seed"]), f"{e['return']:.1f}", str(e["length"]),
                      *([f"{e['reward_model_return']:.2f}"] if scored else []), Path(e.get("video", "-")).name)
    table.add_section()
    table.add_row("mean", "", f"{result['return_mean']:.1f} ± {result['return_std']:.1f}", f"{result['length_mean']:.0f}",
                  *([f"{result['reward_model_return_mean']:.2f} ± {result['reward_model_return_std']:.2f}"] if scored else []),
                  "")
    return table
