"""On-policy driver for LLM policies (GRPO, or token-level PPO with a critic: `algo=ppo_lm`): generate → score →
update → sync, synchronously, each stage in its own role.
Only object refs pass through here: the rollout goes engine → scorer and engine → learner; the weights go
learner → engine through the object store, or, when both roles hold a GPU, by NCCL broadcast between them
(`algo.weight_sync`: auto | object_store | broadcast; auto picks broadcast for GPU roles).
A learner role holding N > 1 GPUs (one N-GPU bundle, or count N) runs N data-parallel ranks
(`rlfarm.roles.learner_group`); rank 0 publishes the weights. `model.dtype` is what GPU roles compute in.
Checkpoints (`run.checkpoint_every_*`, SIGTERM → preempted.pt) and `resume=` continue after the saved update."""
from __future__ import annotations

import logging
import time
from collections import deque

import numpy as np
import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.grpo_trainer import GRPOConfig
from rlfarm.envs.text_tasks import TextTaskSpec
from rlfarm.errors import ConfigError
from rlfarm.loops.checkpoints import PeriodicCheckpoints
from rlfarm.roles.learner_group import start_learner_group
from rlfarm.roles.onpolicy import EngineRole, ScorerRole
from rlfarm.run import Run
from rlfarm.telemetry.live import LiveView
from rlfarm.topology import Placement, PlacedTopology

log = logging.getLogger("rlfarm")
REWARD_WINDOW = 10  # summary reward_mean: mean over the last 10 updates
STAGE_KEYS = ("generate_s", "score_update_s", "sync_s", "step_s", "generated_tokens_per_s")  # medians in the summary


def grpo_config(cfg: DictConfig) -> GRPOConfig:
    """The frozen, derived settings of one GRPO run, from the composed Hydra config. `model` is the config
    dict to build (model.config) or the hub id / folder to load (model.source)."""
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    fields = {k: v for k, v in algo.items() if k in GRPOConfig.__dataclass_fields__}
    source = cfg.model.get("source")
    return GRPOConfig(**fields, task=cfg.env.task, num_digits=int(cfg.env.get("num_digits", 4)),
                      model=str(source) if source else OmegaConf.to_container(cfg.model.config, resolve=True),
                      lora=OmegaConf.to_container(cfg.model.lora, resolve=True) if cfg.model.get("lora") else None,
                      verifier=cfg.reward.verifier, seed=int(cfg.seed))


def text_task_spec(cfg: DictConfig) -> TextTaskSpec:
    """What the engine prompts with and the scorer decodes with: the env's task in the policy's tokenizer
    (model.source's own; none for a model built from model.config: the digit tokenizer)."""
    env, source = cfg.env, cfg.model.get("source")
    return TextTaskSpec(task=str(env.task), num_digits=int(env.get("num_digits", 4)), path=env.get("path"),
                        question_field=str(env.get("question_field", "question")),
                        answer_field=str(env.get("answer_field", "answer")),
                        max_new_tokens=int(env.get("max_new_tokens", 256)),
                        chat_template=bool(env.get("chat_template", False)),
                        tokenizer=str(source) if source else None, seed=int(cfg.seed))


def learner_rank_options(placed: PlacedTopology, places: list[Placement]) -> list[dict]:
    """Ray options of each data-parallel learner rank, one GPU each: a k-GPU learner (one k-GPU bundle) runs k
    ranks in that bundle, a learner of count k one rank per placement; one placement of ≤ 1 GPU, one rank."""
    if len(places) == 1 and places[0].gpus > 1:
        (place,), ranks = places, int(places[0].gpus)
        return [placed.options(place) | {"num_gpus": 1.0, "num_cpus": place.cpus / ranks}] * ranks
    return [placed.options(place) for place in places]


class OnPolicyLoop(PeriodicCheckpoints):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        grpo = grpo_config(cfg)
        plan = placed.plan
        (learner, *_), (engine,), (scorer,) = plan.of("learner"), plan.of("engine")[:1], plan.of("labeler")[:1]
        dtype = str(cfg.model.get("dtype", "float32"))
        self.learners = start_learner_group(learner_rank_options(placed, plan.of("learner")), grpo, learner.threads,
                                            dtype)
        self.learner = self.learners.lead  # rank 0: publishes weights, saves
        log.info("learner: %d data-parallel rank(s), GPU ids %s; GPU compute dtype %s", len(self.learners.ranks),
                 self.learners.gpu_ids, dtype)
        task = text_task_spec(cfg)
        self.engine = ray.remote(EngineRole).options(**placed.options(engine)).remote(grpo, engine.threads, dtype,
                                                                                       task)
        self.scorer = ray.remote(ScorerRole).options(**placed.options(scorer)).remote(grpo, task)
        # Colocated (engine and learner on the same GPU): the engine sleeps while the learner trains.
        self.time_share = engine.gpus > 0 and (engine.pool, engine.bundle) == (learner.pool, learner.bundle)
        self.weight_sync = self._open_weight_sync(str(cfg.algo.get("weight_sync", "auto")))
        self.rewards: deque[float] = deque(maxlen=REWARD_WINDOW)
        self.stage_times: dict[str, list[float]] = {key: [] for key in STAGE_KEYS}
        self.staleness_max = 0
        self.started = time.monotonic()
        self.samples = self.updates = 0
        self.wall_offset = 0.0  # wall time of the runs before a resume
        self._start_checkpoints()
        if resume_from:
            self._resume(resume_from)

    def train(self) -> dict:
        self._sync()                                                  # engine starts from the learner's weights
        self.started = time.monotonic()  # the clock counts training, not the roles' start-up (imports, model build)
        total, target = int(self.cfg.algo.max_updates), self.cfg.algo.target_reward
        row: dict = self._last_row()
        with self.until_preempted(), LiveView(f"rlfarm · {self.cfg.algo.name} · {self.cfg.env.task} · {self.cfg.topology.name}",
                                              self.cfg.run.live, columns="onpolicy") as view:
            for update in range(self.updates + 1, total + 1):
                row = self._record(update, self._step())
                view.update(row)
                self._after_update(update)
                if self._done(row, target):
                    break
        stages = {key: round(float(np.median(self.stage_times[key])), 4) for key in self.stage_times}
        return {"updates": row["updates"], "reward_mean": row["reward_mean"], "samples": self.samples,
                "median": stages, "policy_staleness_max": self.staleness_max,
                "learner_ranks": len(self.learners.ranks),
                "wall_s": round(self.wall_offset + time.monotonic() - self.started, 2), "target_reward": target,
                "reached_target": bool(target is not None and row["reward_mean"] >= target)}

    def _open_weight_sync(self, choice: str) -> str:
        on_gpus = all(device.startswith("cuda") for device in
                      ray.get([self.learner.device.remote(), self.engine.device.remote()]))
        if choice == "ipc" and not (on_gpus and self.time_share):
            raise ConfigError("algo.weight_sync=ipc needs the learner and the engine on one GPU",
                              "use a colocated GPU topology, or algo.weight_sync=auto")
        if choice == "auto":  # NCCL needs one GPU per rank; roles that share one GPU map each other's memory
            choice = ("ipc" if self.time_share else "broadcast") if on_gpus else "object_store"
        if choice == "broadcast":
            address = ray.get(self.learner.open_weight_sync.remote(2))
            ray.get([self.learner.join_weight_sync.remote(2), self.engine.join_weight_sync.remote(address, 1, 2)])
        log.info("weight sync learner → engine: %s", choice)
        return choice

    def _step(self) -> dict:
        """One synchronous cycle; the learner's metrics plus each stage's wall time."""
        started = time.monotonic()
        generated = self.engine.generate.remote()                               # 1. generate
        ray.wait([generated], fetch_local=False)
        generated_at = time.monotonic()
        rewards = self.scorer.score.remote(generated)                           # 2. score (labeler)
        if self.time_share:  # colocated: the engine frees the GPU while the learner trains
            ray.get(self.engine.sleep.remote())
        metrics = self.learners.update(generated, rewards)                      # 3. advantages + update
        updated_at = time.monotonic()
        if self.time_share:
            ray.get(self.engine.wake.remote())
        self._sync()                                                            # 4. weights → engine
        synced_at = time.monotonic()
        tokens = metrics["response_len"] * int(self.cfg.algo.prompts_per_step) * int(self.cfg.algo.group_size)
        return metrics | {"generate_s": generated_at - started, "score_update_s": updated_at - generated_at,
                          "sync_s": synced_at - updated_at, "step_s": synced_at - started,
                          "generated_tokens_per_s": tokens / max(generated_at - started, 1e-9)}

    def _sync(self) -> None:
        if self.weight_sync == "broadcast":  # both calls run at once: they meet in the broadcast
            version = self.learner.broadcast_weights.remote()
            ray.get(self.engine.receive_weights.remote([version]))
            return
        if self.weight_sync == "ipc":
            payload, version = ray.get(self.learner.publish_shared.remote())
            ray.get(self.engine.load_shared.remote(payload, version))
            return
        box, version = ray.get(self.learner.publish.remote())
        ray.get(self.engine.update_weights.remote(box, version))

    def _record(self, update: int, metrics: dict) -> dict:
        self.rewards.append(metrics["reward"])
        for key in STAGE_KEYS:
            self.stage_times[key].append(metrics[key])
        self.staleness_max = max(self.staleness_max, int(metrics["staleness"]))
        self.samples += int(self.cfg.algo.prompts_per_step) * int(self.cfg.algo.group_size)
        self.updates = update
        wall = self.wall_offset + time.monotonic() - self.started
        row = {"updates": update, "samples": self.samples, "wall_s": round(wall, 3),
               "reward_mean": float(np.mean(self.rewards)), "samples_per_s": self.samples / max(wall, 1e-9),
               **metrics}
        self.run.log(row)
        return row

    def _done(self, row: dict, target) -> bool:
        over_time = self.cfg.run.max_wall_s and row["wall_s"] > self.cfg.run.max_wall_s
        reached = target is not None and len(self.rewards) == REWARD_WINDOW and row["reward_mean"] >= target
        return bool(over_time or reached)

    # -- checkpoints ---------------------------------------------------------------------------------
    def checkpoint(self, name: str = "final.pt") -> str:
        extra = {"updates": self.updates, "samples": self.samples, "rewards": list(self.rewards),
                 "stage_times": self.stage_times, "staleness_max": self.staleness_max,
                 "wall_s": self.wall_offset + time.monotonic() - self.started}
        return self.learners.save(str(self.run.checkpoint_dir / name), extra)

    def _resume(self, path: str) -> None:
        """Continue after the checkpoint's update: every learner rank restores weights, AdamW state and version
        (the engine gets them at the first sync); counters, the reward window and stage timings continue. The
        engine draws new prompt and sampling streams, seeded by the update it resumes after."""
        extra = self.learners.load(path)
        self.updates, self.samples = int(extra["updates"]), int(extra["samples"])
        self.rewards.extend(extra["rewards"])
        self.stage_times = {key: list(extra["stage_times"].get(key, [])) for key in STAGE_KEYS}
        self.staleness_max, self.wall_offset = int(extra["staleness_max"]), float(extra["wall_s"])
        ray.get(self.engine.reseed.remote(int(self.cfg.seed) * 1_000_003 + self.updates))
        self._start_checkpoints(self.updates)
        self.run.truncate_metrics(after_step=self.updates)
        log.info("resumed from %s after update %d", path, self.updates)

    def _last_row(self) -> dict:
        """The row a run that ends at once (resumed after its last update) reports."""
        if not self.updates:
            return {}
        return {"updates": self.updates, "reward_mean": float(np.mean(self.rewards)) if self.rewards else 0.0}
