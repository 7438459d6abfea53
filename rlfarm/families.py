"""The algorithm families, one record each: the one place a family is named or told apart from another.

A family is one data path through the roles: which roles it places, the driver (loop) that runs them, what it
asks of a config beyond the schemas, what the run says at its end, the live view's columns, the counter that
orders its metrics rows and what `rlfarm report` draws of them. `algo.family` in conf/algo/*.yaml names one (the
schema refuses any other name). Code elsewhere asks the record (`family_of(cfg)`, `run.family`) and never compares
names, so adding a family is adding a record here and its loop, nothing else.

A record names its code as "module:attribute", imported when first used: this module imports only data, so
every floor (topology, config, telemetry, commands) reads a record without an import circle, and a loop's torch
import waits until a run starts. tests/test_families.py imports every name and checks the rule above.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from omegaconf import DictConfig

from rlfarm.errors import ConfigError
from rlfarm.telemetry.columns import OFFPOLICY_COLUMNS, PPO_COLUMNS, UPDATE_COLUMNS, Columns
from rlfarm.telemetry.panels import LLM_REPORT, OFFPOLICY_REPORT, PPO_REPORT, VLA_REPORT, Report


@dataclass(frozen=True)
class Family:
    name: str                  # algo.family
    about: str                 # what the family is, one line
    loop: str                  # its driver, "module:Class"; built as Class(cfg, run, placed, resume_from)
    roles: tuple[str, ...]     # the roles a topology must give it
    rules: str                 # "module:function" (cfg): the config checks across groups; raises ConfigError
    paragraph: str             # "module:function" (cfg, summary, run_dir) -> the run's closing paragraph
    columns: Columns           # what the live view shows of a row
    step_key: str              # the counter that orders metrics rows (a resume drops the rows past it)
    report: Report             # what `rlfarm report` draws and tabulates of its runs (rlfarm/telemetry/panels.py)
    optional_roles: tuple[str, ...] = ()  # roles it places only when the topology lists them
    learner_ranks: bool = False  # its learner may be several data-parallel ranks (topology.roles.learner.count)
    plan_rules: str | None = None  # "module:function" (cfg, plan): what it asks of the planned topology
    memory: str | None = None  # "module:function" (cfg, plan) -> lines: `rlfarm plan`'s GPU memory estimate
    not_evaluated: str | None = None  # why `rlfarm eval` does not play its runs and where their scores are
                                      # (None: eval plays its policy on its env)
    mps_clients: tuple[str, ...] = ()  # the roles its loop starts as clients of the run's MPS daemon
                                       # (`topology.mps`, rlfarm/mps.py); () refuses the option

    def places(self, role: str) -> bool:
        return role in self.roles or role in self.optional_roles

    def loop_class(self) -> type:
        return load(self.loop)

    def check_config(self, cfg: DictConfig) -> None:
        load(self.rules)(cfg)

    def check_plan(self, cfg: DictConfig, plan) -> None:
        """Before anything starts (preflight, then again in the run): the topology as planned (`rlfarm.topology.Plan`),
        and `topology.mps` only where a role of this family would be the daemon's client."""
        if cfg.topology.get("mps", False) and not self.mps_clients:
            raise ConfigError(f"topology.mps=true makes the labeling farm's labelers share their GPUs through MPS, and "
                              f"algo.family={self.name} has no role that would use it", "set topology.mps=false")
        if self.plan_rules:
            load(self.plan_rules)(cfg, plan)

    def memory_lines(self, cfg: DictConfig, plan) -> list[str]:
        return load(self.memory)(cfg, plan) if self.memory else []

    def closing_paragraph(self, cfg: DictConfig, summary: dict, run_dir: str) -> str:
        return load(self.paragraph)(cfg, summary, run_dir)


OFFPOLICY = Family(
    name="offpolicy",
    about="SAC, IMPALA, APPO: env runners → labelers (the reward) → learner, with credits and restarts",
    loop="rlfarm.loops.offpolicy:OffPolicyLoop",
    roles=("learner", "env_runner", "labeler"),
    learner_ranks=True,  # IMPALA/APPO's actor-learner ranks (rlfarm/roles/actor_learner.py); the rules refuse them for SAC
    mps_clients=("labeler",),  # the reward GPUs' sharers (rlfarm/loops/roles.py)
    rules="rlfarm.config.family_rules:check_offpolicy",
    paragraph="rlfarm.telemetry.summary:offpolicy_paragraph",
    columns=OFFPOLICY_COLUMNS,
    step_key="env_steps",
    report=OFFPOLICY_REPORT,
)
PPO = Family(
    name="ppo",
    about="PPO on gymnasium envs: the policy inside the env runners, the env's own reward (no labelers), "
          "act → learn → publish in turn",
    loop="rlfarm.loops.ppo:PPOLoop",
    roles=("learner", "env_runner"),
    rules="rlfarm.config.family_rules:check_ppo",
    paragraph="rlfarm.telemetry.summary:ppo_paragraph",
    columns=PPO_COLUMNS,
    step_key="env_steps",
    report=PPO_REPORT,
)
LLM = Family(
    name="llm",
    about="GRPO, PPO-LM on text: engines generate → scorers (the labelers) reward → learner ranks update → "
          "weights synced to the engines",
    loop="rlfarm.loops.llm:LLMLoop",
    roles=("learner", "engine", "labeler"),
    learner_ranks=True,  # data-parallel ranks (rlfarm/loops/learner_group.py)
    rules="rlfarm.config.family_rules:check_text_policy",
    plan_rules="rlfarm.loops.llm_layout:check_rollout_layout",
    memory="rlfarm.loops.llm_memory:plan_lines",
    paragraph="rlfarm.telemetry.summary:llm_paragraph",
    columns=UPDATE_COLUMNS,
    step_key="updates",
    report=LLM_REPORT,
    not_evaluated="its policy is scored while it trains: the reward on the task's prompts is in metrics.jsonl "
                  "and summary.json (reward_mean); draw it with rlfarm report path=<run dir>",
)
VLA = Family(
    name="vla",
    about="GRPO, PPO for vision-language-action policies on SAPIEN/ManiSkill: env runners play groups with a "
          "policy copy, or through a batching inference server (the optional engine)",
    loop="rlfarm.loops.vla:VLALoop",
    roles=("learner", "env_runner"),
    optional_roles=("engine",),  # rlfarm/roles/vla_server.py; without one, each worker infers with its own copy
    rules="rlfarm.config.family_rules:check_vla_policy",
    paragraph="rlfarm.telemetry.summary:vla_paragraph",
    columns=UPDATE_COLUMNS,
    step_key="env_steps",
    report=VLA_REPORT,
    not_evaluated="its policy is scored while it trains: the success rate of each update's episodes is in "
                  "metrics.jsonl and summary.json (success_rate); draw it with rlfarm report path=<run dir>",
)

FAMILIES: dict[str, Family] = {family.name: family for family in (OFFPOLICY, PPO, LLM, VLA)}

# Names a family had before: a run saved under one (its config.yaml) still resumes, renamed as it is loaded.
RENAMED = {"onpolicy": LLM.name, "onpolicy_env": PPO.name}


def named(name: str) -> Family:
    """The family called `name`; ConfigError (one line naming the families) for any other name."""
    name = str(name)
    if name in FAMILIES:
        return FAMILIES[name]
    if name in RENAMED:
        raise ConfigError(f"algo.family={name} is now called {RENAMED[name]}", f"set algo.family={RENAMED[name]}")
    raise ConfigError(f"unknown algo.family '{name}'", f"the families are {', '.join(FAMILIES)}")


def family_of(cfg: DictConfig) -> Family:
    return named(cfg.algo.family)


def current_name(saved: str) -> str:
    """A family name read from a saved run's config, as it is called today."""
    return RENAMED.get(str(saved), str(saved))


def load(reference: str):
    """The object a "module:attribute" reference names (its module imported now)."""
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)
