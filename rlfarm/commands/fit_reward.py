"""`rlfarm fit-reward`: collect frames, fit a reward model to them, write <run dir>/reward_model.pt and a report.

The run directory holds config.yaml, fit_reward.log (Hydra's), reward_model.pt (rlfarm/rewards/fitted.py:
what `rlfarm train reward=model reward.model=<it>` loads), report.json, calibration.png and frames.png.
report.json is written last: a directory without it is a fit that did not finish (its status.json says why).
The stages (collect, fit, report) are in rlfarm/reward_fitting/; this module checks the options before Hydra
starts (bad input → one line, exit 2, no directory) and runs them in order.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from rlfarm.cli import fail
from rlfarm.commands.common import compose_checked_with
from rlfarm.errors import ConfigError, RlfarmError

log = logging.getLogger("rlfarm")
MODEL_FILE, REPORT_FILE = "reward_model.pt", "report.json"


def preflight(config_name: str, args: list[str]) -> None:
    compose_checked_with(config_name, args, check_options)


def check_options(cfg: DictConfig) -> None:
    """What the schema cannot say: the env, labels file, policy run and tower a fit needs exist and fit together."""
    from rlfarm.config import check_env_id, path_problem
    from rlfarm.schemas import PathKind

    if str(cfg.target) == "file":
        if cfg.labels is None:
            raise ConfigError("target=file needs labels=<file.npz>", "pass labels=<an .npz with frames and rewards>")
        problem = path_problem(str(cfg.labels), PathKind.file)
        if problem:
            raise ConfigError(f"labels: {problem}", "pass labels=<an .npz with frames [n, H, W, 3] and rewards [n]>")
    else:
        check_env_id(str(cfg.env.id))
        for policy in policies(cfg):
            if policy != "random":
                policy_run(cfg, policy)
    if cfg.frames < 10:
        raise ConfigError(f"frames={cfg.frames} is too few to hold some out", "collect frames=1000 or more")
    tower = OmegaConf.select(cfg, "net.tower", default=None)
    if tower is not None:
        problem = path_problem(str(tower), PathKind.model)
        if problem or not Path(str(tower)).expanduser().is_dir():
            raise ConfigError(f"net.tower: {problem or f'no folder {tower!r} (a frozen tower must be local)'}",
                              "pass net.tower=<a CLIP save_pretrained folder>, e.g. from python -m "
                              "rlfarm.rewards.clip_factory --out DIR")
    if cfg.frame_stack > 1 and "frame_stack" not in cfg.net:
        raise ConfigError(f"net={cfg.net._target_.rsplit('.', 1)[-1]} reads one frame, not frame_stack={cfg.frame_stack}",
                          "use net=cnn for stacked frames, or frame_stack=1")
    if str(cfg.fit.device) not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"fit.device={cfg.fit.device}", "set fit.device=auto|cpu|cuda")


def policies(cfg: DictConfig) -> list[str]:
    """cfg.policy as a list: one policy, or several that each collect an equal share of the frames (e.g. a first
    fitted run's policy beside the env-reward run's, to refit on the states a policy found by exploiting the model)."""
    value = cfg.policy
    chosen = [str(p) for p in value] if OmegaConf.is_list(value) or isinstance(value, list) else [str(value)]
    if not chosen:
        raise ConfigError("policy=[] names no policy", "pass policy=random, a run dir, or a list of them")
    return chosen


def policy_run(cfg: DictConfig, policy: str):
    """The trained run whose actor collects frames (its newest intact checkpoint), checked against the env."""
    from rlfarm.checkpoint_files import newest_intact
    from rlfarm.evaluation import check_run_dir, load_trained_run

    try:
        run_dir = check_run_dir(policy)
    except RlfarmError as error:
        raise ConfigError(f"policy: {error.problem}", "pass policy=random or policy=<a run dir of rlfarm train>") from None
    checkpoint = newest_intact(run_dir / "checkpoints", "collecting with", "pass policy=random or another run dir")
    run = load_trained_run(run_dir, checkpoint.name if checkpoint else "latest")
    if str(run.cfg.env.id) != str(cfg.env.id):
        raise ConfigError(f"policy={policy} was trained on {run.cfg.env.id}, not {cfg.env.id}",
                          f"pass env.id={run.cfg.env.id} (or the env group it used)")
    return run


def task(cfg: DictConfig) -> dict:
    out = Path(HydraConfig.get().runtime.output_dir)
    if (out / REPORT_FILE).exists():
        fail(ConfigError(f"{out} already holds a finished fit ({REPORT_FILE})", "pick another hydra.run.dir"))
    try:
        report = fit_reward(cfg, out)
    except KeyboardInterrupt:
        _failed(out, "interrupted")
        fail("interrupted", code=130)
    except Exception as error:  # one line on screen, the traceback in fit_reward.log
        log.debug("fit failed", exc_info=True)
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        _failed(out, message)
        fail(error if isinstance(error, RlfarmError) else f"{type(error).__name__}: {message}")
    held = report["held_out"]
    log.info(f"fit-reward: {report['frames']} frames ({report['train_frames']} to fit, {held['frames']} held out, "
             f"whole episodes) in {report['collect_s'] + report['fit_s']:.0f} s; held-out R² {held['r2']:.3f}, "
             f"MAE {held['mae']:.3g} (target std {held['target_std']:.3g}); best epoch {report['best_epoch']}. "
             f"Train on it: rlfarm train reward=model reward.model={out / MODEL_FILE}")
    return report


def fit_reward(cfg: DictConfig, out: Path) -> dict:
    """Collect (or load) labelled frames, fit cfg.net to them, write the model file and the report."""
    import numpy as np
    import torch
    from hydra.utils import instantiate

    from rlfarm.evaluation import build_actor, env_kwargs
    from rlfarm.reward_fitting.collect import collect, concat_frames, load_labels
    from rlfarm.reward_fitting.fit import fit
    from rlfarm.reward_fitting.report import write_fit_report
    from rlfarm.rewards.fitted import save_fitted
    from rlfarm.run import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    (out / "status.json").unlink(missing_ok=True)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.fit.device == "auto" else str(cfg.fit.device)
    started = time.monotonic()
    if str(cfg.target) == "file":
        data = load_labels(cfg.labels, int(cfg.frame_size), int(cfg.frame_stack))
        source = {"labels": str(Path(cfg.labels).resolve())}
    else:
        chosen = policies(cfg)
        source = {"env": str(cfg.env.id), "policy": chosen if len(chosen) > 1 else chosen[0]}
        parts, checkpoints = [], []
        shares = [len(part) for part in np.array_split(np.arange(int(cfg.frames)), len(chosen))]
        for i, (policy, share) in enumerate(zip(chosen, shares)):
            actor = None
            if policy != "random":
                run = policy_run(cfg, policy)
                actor = build_actor(run.cfg, run.state["agent"]["actor"], run.cfg.env)
                checkpoints.append(str(run.checkpoint))
            log.info(f"fit-reward: collecting {share} frames of {cfg.env.id} at {cfg.frame_size} px ({policy} policy)")
            parts.append(collect(str(cfg.env.id), env_kwargs(cfg.env), share, int(cfg.frame_size), str(cfg.target),
                                 actor, int(cfg.num_envs), int(cfg.seed) + 1000 * i, int(cfg.frame_stack)))
        data = concat_frames(parts)
        if checkpoints:
            source["policy_checkpoint"] = checkpoints if len(checkpoints) > 1 else checkpoints[0]
    collect_s = round(time.monotonic() - started, 2)
    module_node = OmegaConf.to_container(cfg.net, resolve=True)
    net = instantiate(module_node)
    log.info(f"fit-reward: fitting {module_node['_target_'].rsplit('.', 1)[-1]} on {device} to {cfg.target}")
    result = fit(net, data, int(cfg.fit.epochs), int(cfg.fit.batch_size), float(cfg.fit.lr),
                 float(cfg.fit.weight_decay), float(cfg.fit.holdout), device, int(cfg.seed), bool(cfg.fit.compile))
    details = {"target": str(cfg.target), **source, "frames": len(data), "frame_size": int(cfg.frame_size),
               "frame_stack": int(cfg.frame_stack),
               "episodes": int(len(set(data.episode.tolist()))), "device": device, "collect_s": collect_s,
               "model_file": MODEL_FILE}
    net.cpu()
    save_fitted(out / MODEL_FILE, module_node, net, int(cfg.frame_size),
                {k: details[k] for k in ("target", "frames", "frame_size")} | source | {"held_out": result.held_out},
                int(cfg.frame_stack))
    report = write_fit_report(out, data, result, details, int(cfg.report_frames))
    write_json_atomic(out / REPORT_FILE, report)  # last: its presence marks a finished fit
    return report


def _failed(out: Path, message: str) -> None:
    from rlfarm.run import write_json_atomic

    if out.is_dir():
        write_json_atomic(out / "status.json", {"status": "failed", "error": message})
