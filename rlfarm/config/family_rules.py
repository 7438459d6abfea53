"""The config rules of each algorithm family: what its config must hold across groups (its env, reward, model
and topology), each problem one line with its fix. A family record names its function (`Family.rules`,
rlfarm/families.py); `validate` calls it."""
from __future__ import annotations

import json
import os

from omegaconf import DictConfig, OmegaConf

from rlfarm.config.paths import looks_local
from rlfarm.config.probes import check_env_fits
from rlfarm.config.validation import check_env_id
from rlfarm.errors import ConfigError

ENV_REWARD = "rlfarm.rewards.env.EnvReward"


def check_offpolicy(cfg: DictConfig) -> None:
    """The farm's data path: a registered env; learner ranks only for an actor-learner, whose batches the
    runners' credits must fill; the env made once: actions SAC's replay learner can take, frames for a frame
    reward, a policy that builds for its spaces."""
    check_env_id(str(cfg.env.id), cfg.env.get("kwargs"), cfg.env.get("imports"))
    check_learner_ranks(cfg)
    if "batch_chunks" in cfg.algo:
        check_actor_learner(cfg)
    check_env_fits(cfg, None if "batch_chunks" in cfg.algo else
                   "learns a squashed-Gaussian policy and Q(s, a): continuous (Box) actions only")


def check_learner_ranks(cfg: DictConfig) -> None:
    """Several learner ranks off-policy: only an actor-learner has them (SAC's replay learner is one process), and
    each rank needs runners of its own (runner i feeds rank i mod N)."""
    ranks = int(OmegaConf.select(cfg, "topology.roles.learner.count", default=1))
    if ranks <= 1:
        return
    if "batch_chunks" not in cfg.algo:
        raise ConfigError(f"algo={cfg.algo.name} has one learner, but topology.roles.learner.count={ranks}",
                          "set topology.roles.learner.count=1 (data-parallel learner ranks: algo=impala|appo)")
    runners = int(OmegaConf.select(cfg, "topology.roles.env_runner.count", default=1))
    if runners < ranks:
        raise ConfigError(f"{ranks} learner ranks need at least as many env runners (runner i feeds rank i mod "
                          f"{ranks}), got topology.roles.env_runner.count={runners}",
                          f"set topology.roles.env_runner.count>={ranks}")


def check_actor_learner(cfg: DictConfig) -> None:
    """IMPALA / APPO: one actor-critic network, and batches the runners' credits can fill (a chunk's credit returns
    only once a batch took it: fewer chunks in flight than a batch would wait forever)."""
    if OmegaConf.select(cfg, "model.actor._target_", default=None) is None or "critic" in cfg.model:
        raise ConfigError(f"algo={cfg.algo.name} needs one actor-critic network in model.actor, not "
                          f"{'a language model' if 'actor' not in cfg.model else 'an actor with separate critics'}",
                          "use model=actor_critic (or model=cnn_actor_critic for image observations)")
    if cfg.algo.loss == "impala" and int(cfg.algo.get("target_update_every", 0)):
        raise ConfigError("algo.target_update_every anchors APPO's clip to a target network; IMPALA's loss has no clip",
                          "use algo=appo, or set algo.target_update_every=0")
    runners = int(OmegaConf.select(cfg, "topology.roles.env_runner.count", default=1))
    ranks = int(OmegaConf.select(cfg, "topology.roles.learner.count", default=1))
    per_rank = runners // ranks  # the fewest runners a rank has (runner i feeds rank i mod N)
    in_flight = per_rank * int(cfg.algo.credits)
    if int(cfg.algo.batch_chunks) > in_flight:
        who = f"{runners} env runners" if ranks == 1 else f"{per_rank} env runners per learner rank"
        raise ConfigError(f"algo.batch_chunks={cfg.algo.batch_chunks} is more than the {in_flight} chunks the runners "
                          f"can have in flight ({who} × algo.credits={cfg.algo.credits})",
                          f"set algo.batch_chunks <= {in_flight}, or raise algo.credits")


def check_ppo(cfg: DictConfig) -> None:
    """PPO on gymnasium envs: a registered env, minibatches its rollouts can fill, the two choices it cannot
    take from another family (a reward model, separate critics), and a policy that builds for the env's spaces."""
    if OmegaConf.select(cfg, "env.task", default=None) is not None:
        raise ConfigError(f"algo={cfg.algo.name} runs on gymnasium envs, but env.id={cfg.env.id} is a text task",
                          "pick env=cartpole|pendulum|halfcheetah, or algo=grpo for text tasks")
    check_env_id(str(cfg.env.id), cfg.env.get("kwargs"), cfg.env.get("imports"))
    batch = int(cfg.algo.rollout_steps) * int(cfg.env.num_envs)
    if int(cfg.algo.minibatches) > batch:
        raise ConfigError(f"algo.minibatches={cfg.algo.minibatches} is more than the {batch} transitions a runner "
                          f"collects per cycle (algo.rollout_steps × env.num_envs)", f"set algo.minibatches <= {batch}")
    reward = OmegaConf.select(cfg, "reward._target_", default=None)
    if reward != ENV_REWARD:
        raise ConfigError(f"algo={cfg.algo.name} learns from the env's own reward, not "
                          f"{reward or 'a text verifier'}", "use reward=env (or pick algo=sac for a reward model)")
    if OmegaConf.select(cfg, "model.actor._target_", default=None) is None or "critic" in cfg.model:
        raise ConfigError(f"algo={cfg.algo.name} needs one actor-critic network in model.actor, "
                          f"not {'a language model' if 'actor' not in cfg.model else 'an actor with separate critics'}",
                          "use model=actor_critic")
    check_env_fits(cfg)


def check_vla_policy(cfg: DictConfig) -> None:
    """A VLA is the tiny built-in one (model.config) or an HF checkpoint folder (model=hf_vla model.source)."""
    if OmegaConf.select(cfg, "model.config", default=None) is None:
        raise ConfigError(f"algo={cfg.algo.name} needs a VLA policy, but this model has no model.config",
                          "use model=tiny_vla, or model=hf_vla model.source=<folder>")
    source = cfg.model.get("source")
    if source is not None and not os.path.isdir(os.path.expanduser(str(source))):
        raise ConfigError(f"model.source: no such folder '{source}' (VLA checkpoints load from a local folder)",
                          "set model.source=<a folder written by save_pretrained: model, tokenizer>")


def check_text_policy(cfg: DictConfig) -> None:
    """GRPO on text: a text task, a verifier to score it, one language model (built or loaded), and for a
    prompt file a tokenizer and a readable file with the named fields — all before Ray starts."""
    task = OmegaConf.select(cfg, "env.task", default=None)
    if task is None:
        raise ConfigError(f"algo={cfg.algo.name} generates text, but env={cfg.env.id} is not a text task",
                          "pick env=digits|prompts, or algo=ppo|sac for gymnasium envs")
    verifier = OmegaConf.select(cfg, "reward.verifier", default=None)
    if verifier is None:
        raise ConfigError(f"algo={cfg.algo.name} scores completions with a rule verifier, but this reward has none",
                          "use reward=verifier (reward.verifier=exact_match|last_number|partial_credit)")
    from rlfarm.rewards.verifiers import VERIFIERS  # numpy only: no torch import before the run starts
    if verifier not in VERIFIERS:
        raise ConfigError(f"unknown reward.verifier {verifier!r}", f"set reward.verifier={'|'.join(VERIFIERS)}")
    source, config = cfg.model.get("source"), cfg.model.get("config")
    if (source is None) == (config is None):
        raise ConfigError(f"algo={cfg.algo.name} needs one language model: model.config (build) or model.source "
                          f"(load), {'not both' if source is not None else 'found neither'}",
                          "use model=tiny_lm, or model=hf_lm model.source=<hub id or folder>")
    learner = cfg.topology.roles.learner
    if cfg.algo.advantage == "gae" and (int(learner.get("count", 1)) > 1 or float(learner.get("gpus", 0)) > 1):
        raise ConfigError(f"algo.advantage=gae trains its critic on one learner rank, but topology={cfg.topology.name} "
                          "gives the learner several GPUs", "use topology=colocated, split_1_1 or local_llm")
    if cfg.algo.weight_sync == "ipc":
        roles = cfg.topology.roles
        if roles.learner.pool is None or roles.learner.pool != roles.engine.pool or not roles.engine.gpus:
            raise ConfigError(f"algo.weight_sync=ipc needs the learner and the engine on one GPU, but topology="
                              f"{cfg.topology.name} puts them apart", "use topology=colocated, or algo.weight_sync=auto")
    lengths = cfg.algo.get("synthetic_lengths")
    if lengths:  # a speed-run setting; the model's own range check, here before Ray starts
        mapping = isinstance(lengths, DictConfig)
        unknown = sorted(set(lengths) - {"median_frac", "p99_frac"}) if mapping else ["?"]
        median, p99 = (float(lengths.get("median_frac", 1 / 3)), float(lengths.get("p99_frac", 1.0))) if mapping \
            else (1, 0)
        if unknown or not 0 < median < p99:
            shown = OmegaConf.to_container(lengths) if mapping else lengths
            raise ConfigError(f"algo.synthetic_lengths={shown} is not a length model "
                              "(keys median_frac, p99_frac with 0 < median_frac < p99_frac)",
                              "e.g. 'algo.synthetic_lengths={median_frac:0.333,p99_frac:1.0}', or null")
    if task == "prompts":
        if source is None:
            raise ConfigError("prompt files need a tokenizer, but model.config builds a model without one",
                              "use model=hf_lm model.source=<path>")
        if cfg.env.get("chat_template") and looks_local(str(source)) and not has_chat_template(str(source)):
            raise ConfigError(f"env.chat_template=true, but the tokenizer in '{source}' has no chat template",
                              "set env.chat_template=false (questions as plain text), or save a tokenizer with one")
        check_prompt_file(cfg.env)


def has_chat_template(folder: str) -> bool:
    """Whether a saved tokenizer has a chat template, read from its files (no transformers import): a
    `chat_template.jinja`/`.json` beside it (transformers ≥ 4.43 writes these) or the key in tokenizer_config.json."""
    folder = os.path.expanduser(folder)
    if any(os.path.exists(os.path.join(folder, name)) for name in ("chat_template.jinja", "chat_template.json")):
        return True
    try:
        with open(os.path.join(folder, "tokenizer_config.json")) as file:
            return bool(json.load(file).get("chat_template"))
    except (OSError, ValueError):
        return True  # no readable config: leave it to the tokenizer's own loading, which says what is wrong


def check_prompt_file(env: DictConfig) -> None:
    """The prompt file exists, has a known type, and every record holds the question and answer fields."""
    from rlfarm.envs.text_tasks import PromptDataset  # numpy + json only

    path = os.path.expanduser(str(env.path))
    try:
        PromptDataset.from_file(path, str(env.question_field), str(env.answer_field))
    except FileNotFoundError:
        raise ConfigError(f"env.path: no such file '{env.path}'",
                          "set env.path=<a .jsonl or .parquet file of question/answer records>") from None
    except KeyError as error:
        field = env.question_field if f"'{env.question_field}'" in str(error) else env.answer_field
        key = "env.question_field" if field == env.question_field else "env.answer_field"
        raise ConfigError(str(error.args[0]), f"set {key}=<the field that holds it>") from None
    except (ValueError, ImportError) as error:  # unsupported suffix, bad JSON, no records, no pyarrow
        raise ConfigError(f"env.path={env.path}: {str(error).splitlines()[0]}",
                          "give a .jsonl (one JSON record a line) or .parquet file of question/answer records") from None
