"""On-policy driver for LLM policies (GRPO, or token-level PPO with a critic: `algo=ppo_lm`): generate → score →
update → sync, synchronously, each stage in its own role.
Only object refs pass through here: the rollout goes engine → scorer and engine → learner; the new weights go
learner → engine by the weight sync chosen once at start (`algo.weight_sync`, see rlfarm/sync/).
A learner role holding N > 1 GPUs (one N-GPU bundle, or count N) runs N data-parallel ranks
(`rlfarm.roles.learner_group`); rank 0 publishes the weights. `model.dtype` is what GPU roles compute in.
Checkpoints (`run.checkpoint_every_*`, SIGTERM → preempted.pt) and `resume=` continue after the saved update."""
from __future__ import annotations

import logging
import time

import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.envs.text_tasks import TextTaskSpec
from rlfarm.loops.progress import Progress
from rlfarm.loops.skeleton import SyncLoop
from rlfarm.roles.learner_group import start_learner_group
from rlfarm.roles.llm import EngineRole, TextLabeler
from rlfarm.run import Run
from rlfarm.settings import known_fields
from rlfarm.sync.transport import pick_transport
from rlfarm.topology import Placement, PlacedTopology

log = logging.getLogger("rlfarm")
REWARD_WINDOW = 10  # summary reward_mean: mean over the last 10 updates
STAGE_KEYS = ("generate_s", "score_update_s", "sync_s", "step_s", "generated_tokens_per_s")  # medians in the summary


def grpo_config(cfg: DictConfig) -> GRPOConfig:
    """The frozen, derived settings of one GRPO run, from the composed Hydra config. `model` is the config
    dict to build (model.config) or the hub id / folder to load (model.source)."""
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    fields = known_fields(GRPOConfig, algo)
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


class LLMLoop(SyncLoop):
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
        self.scorer = ray.remote(TextLabeler).options(**placed.options(scorer)).remote(grpo, task)
        # Colocated (engine and learner on the same GPU): the engine sleeps while the learner trains.
        self.time_share = engine.gpus > 0 and (engine.pool, engine.bundle) == (learner.pool, learner.bundle)
        self.weight_sync = self._open_weight_sync(str(cfg.algo.get("weight_sync", "auto")))
        self.title = f"rlfarm · {cfg.algo.name} · {cfg.env.task} · {cfg.topology.name}"
        self.target = cfg.algo.target_reward
        self.samples_per_update = int(cfg.algo.prompts_per_step) * int(cfg.algo.group_size)
        self._begin(Progress(window=REWARD_WINDOW, timings=STAGE_KEYS, updates=0, samples=0, staleness_max=0),
                    resume_from)

    def _warm_up(self) -> None:
        self._sync()  # the engine starts from the learner's weights

    def _open_weight_sync(self, choice: str) -> str:
        """Pick the transport once and build both ends (a broadcast group is joined by both at the same time)."""
        on_gpus = all(device.startswith("cuda") for device in
                      ray.get([self.learner.device.remote(), self.engine.device.remote()]))
        transport = pick_transport(choice, on_gpus, self.time_share)
        address = ray.get(self.learner.open_sync.remote(transport))
        ray.get([self.learner.join_sync.remote(), self.engine.open_sync.remote(transport, address)])
        log.info("weight sync learner → engine: %s", transport)
        return transport

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
        tokens = metrics["response_len"] * self.samples_per_update
        return metrics | {"generate_s": generated_at - started, "score_update_s": updated_at - generated_at,
                          "sync_s": synced_at - updated_at, "step_s": synced_at - started,
                          "generated_tokens_per_s": tokens / max(generated_at - started, 1e-9)}

    def _sync(self) -> None:
        published = self.learners.publish()
        # boxed, so the engine's call starts at once: over a broadcast both calls must run to meet
        ray.get(self.engine.receive.remote([published]))

    def _record(self, metrics: dict) -> dict:
        progress = self.progress
        progress.window.append(metrics["reward"])
        progress.record_timings(metrics)
        progress.add(updates=1, samples=self.samples_per_update)
        progress["staleness_max"] = max(progress["staleness_max"], int(metrics["staleness"]))
        wall, samples = progress.wall_s, progress["samples"]
        return {"updates": progress["updates"], "samples": samples, "wall_s": round(wall, 3),
                "reward_mean": progress.window_mean(), "samples_per_s": samples / max(wall, 1e-9), **metrics}

    def _summary(self, row: dict) -> dict:
        progress, target = self.progress, self.target
        reward = progress.window_mean(empty=0.0)
        return {"updates": progress["updates"], "reward_mean": reward, "samples": progress["samples"],
                "median": progress.timing_medians(), "policy_staleness_max": progress["staleness_max"],
                "learner_ranks": len(self.learners.ranks), "wall_s": round(progress.wall_s, 2),
                "target_reward": target, "reached_target": bool(target is not None and reward >= target)}

    # -- checkpoints ---------------------------------------------------------------------------------
    def _save(self, path: str, extra: dict) -> str:
        return self.learners.save(path, extra)

    def _load(self, path: str) -> dict:
        """Every learner rank restores weights, AdamW state and version (the engine gets them at the first sync)."""
        return self.learners.load(path)

    def _resume(self, path: str) -> None:
        """The engine draws new prompt and sampling streams, seeded by the update it resumes after."""
        super()._resume(path)
        ray.get(self.engine.reseed.remote(int(self.cfg.seed) * 1_000_003 + self.progress["updates"]))
