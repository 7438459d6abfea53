"""What only building things can tell, found in the driver before any role starts, each as one ConfigError line:
the env's spaces and whether it renders (one throwaway env, no reset), the policy built for those spaces on CPU,
the reward model constructed (its constructor's own error), and `probe_reward`: a reward module of the user's own
(reward=model) built on CPU and run on a probe batch. Without these, each mistake surfaced inside a Ray worker as
a long stack (SAC's actor on a Discrete space: "must be real number, not NoneType"; frames of an env that does not
render: "'NoneType' object has no attribute 'shape'")."""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from rlfarm.errors import ConfigError

MODULE_REWARD = "rlfarm.rewards.model.ModuleReward"


def innermost(error: BaseException) -> BaseException:
    """Hydra wraps a target's exception (InstantiationException): the cause is what the user must read."""
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def one_line(error: BaseException) -> str:
    """An exception as `Type: first line`, its innermost cause."""
    error = innermost(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def reward_problem(cfg: DictConfig, error: BaseException, fix: str) -> ConfigError:
    """A reward model's error as one line: a RewardModelError says its own problem and fix ("problem; fix")."""
    from rlfarm.rewards.base import RewardModelError

    error = innermost(error)
    if isinstance(error, RewardModelError):
        problem, _, own_fix = str(error).rpartition("; ")
        key = "reward.model: " if OmegaConf.select(cfg, "reward.model", default=None) is not None else ""
        return ConfigError(f"{key}{problem or error}", own_fix if problem else fix)
    return ConfigError(f"reward._target_={cfg.reward._target_} cannot be constructed: {one_line(error)}", fix)


def built_reward(cfg: DictConfig):
    """The reward model as the run constructs it (no weights loaded), or its constructor's error in one line."""
    from hydra.utils import instantiate

    try:
        return instantiate(cfg.reward)
    except Exception as error:
        raise reward_problem(cfg, error, "fix the reward's settings (rlfarm train --cfg job shows them)") from None


def check_env_fits(cfg: DictConfig, continuous_only: str | None = None) -> None:
    """The env, made once here: its action space suits the algorithm (`continuous_only`: why it needs Box
    actions), it renders frames when the reward reads them, and the policy builds for its spaces. The `_target_`s
    are checked first (validate checks them after the family's rules): a typo is named as one, not as a failure
    to build."""
    from rlfarm.config.validation import check_targets
    from rlfarm.envs.rendering import make_env
    from rlfarm.envs.spaces import policy_dims

    check_targets(cfg)
    env_id = str(cfg.env.id)
    kwargs = OmegaConf.to_container(cfg.env.kwargs, resolve=True) if cfg.env.get("kwargs") else {}
    try:
        env = make_env(env_id, None, kwargs)
    except Exception as error:
        raise ConfigError(f"env.id={env_id} cannot be made: {one_line(error)}",
                          "fix env.kwargs, or the env's constructor") from None
    try:
        action_space, render_modes = env.action_space, env.metadata.get("render_modes") or []
        dims = policy_dims(env.observation_space, action_space)
    except ValueError as error:
        raise ConfigError(f"env.id={env_id}: {error}", "use an env with Box or Discrete actions") from None
    finally:
        env.close()
    if continuous_only and dims["action_low"] is None:
        raise ConfigError(f"algo={cfg.algo.name} {continuous_only}, but {env_id} has discrete actions ({action_space})",
                          "use algo=ppo|impala|appo for discrete actions, or an env with Box actions (env=pendulum)")
    needs = getattr(built_reward(cfg), "needs", ()) if "reward" in cfg else ()
    if "frames" in needs and "rgb_array" not in render_modes:
        raise ConfigError(f"reward._target_={cfg.reward._target_} reads frames, but {env_id} does not render them "
                          f"(its metadata['render_modes'] is {list(render_modes)})",
                          "use reward=env, or make the env render: metadata = {'render_modes': ['rgb_array']} "
                          "and render() returning an RGB array")
    build_policy(cfg, dims, env_id)


def build_policy(cfg: DictConfig, dims: dict, env_id: str) -> None:
    """model.actor (and SAC's model.critic) built for the env's spaces on CPU, as the learner builds them."""
    from hydra.utils import instantiate

    for key, args in (("actor", (dims["obs_dim"], dims["act_dim"], dims["action_low"], dims["action_high"])),
                      ("critic", (dims["obs_dim"], dims["act_dim"]))):
        node = cfg.model.get(key)
        if node is None or node.get("_target_") is None:
            continue
        try:
            instantiate(node)(*args)
        except Exception as error:
            raise ConfigError(f"model.{key} ({node._target_}) cannot be built for {env_id}: {one_line(error)}",
                              f"fix model.{key}'s settings (rlfarm train --cfg job shows them)") from None


def probe_reward(cfg: DictConfig) -> None:
    """reward=model: the module built on CPU and run on a probe batch (ModuleReward.probe), as each labeler will
    on its device; its own error in one line. Other reward models load their weights only in the labelers."""
    if OmegaConf.select(cfg, "reward._target_", default=None) != MODULE_REWARD:
        return
    from rlfarm.rewards.base import RewardModelError

    model = built_reward(cfg)
    try:
        model.setup("cpu")
    except Exception as error:
        if isinstance(innermost(error), RewardModelError):
            raise reward_problem(cfg, error, "fix the reward module") from None
        key = "reward.module" if model.module is not None else "reward.model"
        raise ConfigError(f"{key}: {model.name} cannot be built: {one_line(error)}",
                          f"fix {key}'s arguments (+reward.module.<arg>=...) or the module") from None
