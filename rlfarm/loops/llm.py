"""On-policy driver for LLM policies (GRPO, or token-level PPO with a critic: `algo=ppo_lm`): generate → score →
update → sync, each stage in its own role.
Only object refs pass through here: the rollout goes engine → scorer and engine → learner; the new weights go
learner → engines by the weight sync chosen once at start (`algo.weight_sync`, `rlfarm.loops.llm_layout`).
N engines (`topology.roles.engine.count`) split each step's prompts (data-parallel rollout); the learner
joins their parts in engine order, and each part is scored by a scorer (labeler) of its own, round-robin.
A learner role holding N > 1 GPUs (one N-GPU bundle, or count N) runs N data-parallel ranks
(`rlfarm.loops.learner_group`); rank 0 publishes the weights. `model.dtype` is what GPU roles compute in.

`algo.max_staleness = k`: k = 0 runs the stages one after another. k > 0 keeps k steps of rollouts in flight:
the engines generate the next steps with the weights they hold while the learner updates, and new weights
reach them between steps (each engine takes its calls in order), so a step generated with version v is
trained on at learner version v + k; a step older than that would be dropped and counted (`dropped_stale`).
Partial rollouts (`algo.partial_rollouts`, k > 0): the new weights do not wait for the generation in flight; they
enter it between decode steps (`rlfarm.engines.weight_gate`), each token records the version it was sampled
under, and the learner reports `partial_ratio` and the samples' version spans (`rlfarm.algos.versions`); a step
launched after a push still starts from the pushed weights (its `min_version`), so the bound k holds.
`algo.synthetic_lengths` (a SPEED-RUN setting, `rlfarm.engines.synthetic_lengths`) ends each sample at a drawn
length; the summary names it.
Checkpoints (`run.checkpoint_every_*`, SIGTERM → preempted.pt) and `resume=` continue after the saved update. The
rollouts in flight, partial samples included, are not saved: they are dropped, and the resumed run generates those
steps again from the checkpoint's weights, from where the random streams stood after the step trained last (the
engines' prompt and sampling streams, the learner's generators: `rlfarm.engines.streams`). So at k = 0 a resumed
run's updates are the uninterrupted run's; at k > 0 it draws the dropped steps' prompts and noise again, with newer
weights. No sample is trained on twice.
An engine or scorer that dies is restarted by Ray (`run.max_restarts`, over the object store or CUDA IPC: a
broadcast group cannot take a new member): a restarted engine gets the newest publication, and every part of the
steps in flight that the dead role had not finished is generated (or scored) again before the learner sees the
step, so nothing is trained twice. A learner that dies or hangs ends the run (`rlfarm.loops.skeleton`)."""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass

import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.algos.grpo_lm import GRPOConfig
from rlfarm.engines.synthetic_lengths import synthetic_lengths
from rlfarm.envs.text_tasks import TextTaskSpec
from rlfarm.errors import ConfigError
from rlfarm.loops.deadlines import FED_BY_REFS, WATCH, RoleDied, Watched, died
from rlfarm.loops.llm_layout import WeightSyncPlan, plan_weight_sync, sharing_rank
from rlfarm.loops.llm_memory import shape_vocab
from rlfarm.loops.progress import Progress
from rlfarm.loops.skeleton import SyncLoop
from rlfarm.loops.learner_group import rank_name, start_learner_group
from rlfarm.roles.llm import EngineRole, TextLabeler
from rlfarm.run import Run
from rlfarm.settings import known_fields
from rlfarm.sync.transport import uses_group
from rlfarm.topology import Placement, PlacedTopology

log = logging.getLogger("rlfarm")
REWARD_WINDOW = 10  # summary reward_mean: mean over the last 10 updates
# medians in the summary: each stage's time (wait_s: the driver waiting for the rollout; publish_s: the learner's
# send), the engines' speed, the step's throughput, the share of each step the engines and the learner worked, and
# the share of samples whose tokens span several weight versions (partial rollouts)
STAGE_KEYS = ("step_s", "generate_s", "wait_s", "score_s", "update_s", "sync_s", "publish_s",
              "generated_tokens_per_s", "step_samples_per_s", "step_tokens_per_s", "engine_busy", "learner_busy",
              "partial_ratio", "learner_tflops", "mfu", "learner_peak_gib", "engine_peak_gib", "engine_capture_s")


def grpo_config(cfg: DictConfig) -> GRPOConfig:
    """The frozen, derived settings of one GRPO run, from the composed Hydra config. `model` is the config
    dict to build (model.config) or the hub id / folder to load (model.source)."""
    algo = OmegaConf.to_container(cfg.algo, resolve=True)
    fields = known_fields(GRPOConfig, algo)
    if fields.get("is_correction") == "auto":  # decoupled from the behaviour policy only where rollouts are stale
        fields["is_correction"] = "token_tis" if int(algo.get("max_staleness", 0)) > 0 else "none"
    source = cfg.model.get("source")
    return GRPOConfig(**fields, task=cfg.env.task, num_digits=int(cfg.env.get("num_digits", 4)),
                      vocab_size=shape_vocab(cfg),
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


def unfinished(ref: ray.ObjectRef) -> bool:
    """Not answered yet, or failed with its role's death."""
    return not ray.wait([ref], timeout=0)[0] or died(ref) is not None


@dataclass
class Launched:
    """One step's rollout in flight: each engine's part and its score, as refs. The weight version each part was
    generated with is the learner's (one counter per run: `LMLearner.publish` numbers the weights, an engine
    stamps the version it received on what it generates), read from the parts' stats."""
    generated: list[ray.ObjectRef]
    stats: list[ray.ObjectRef]          # per engine: {"generate_s", "tokens", "policy_version"}
    rewards: list[ray.ObjectRef]
    score_stats: list[ray.ObjectRef]    # per part: {"score_s"}


class LLMLoop(SyncLoop):
    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        grpo = grpo_config(cfg)
        plan = placed.plan  # `check_rollout_layout` passed before the roles started (rlfarm/commands/train.py)
        (learner, *_), engines, scorers = plan.of("learner"), plan.of("engine"), plan.of("labeler")
        dtype = str(cfg.model.get("dtype", "float32"))
        run_cfg = cfg.run
        self.learners = start_learner_group(learner_rank_options(placed, plan.of("learner")), grpo, learner.threads,
                                            dtype, float(run_cfg.role_timeout_s), float(run_cfg.restart_timeout_s),
                                            lambda: self._preempt)
        self.learner = self.learners.lead  # rank 0: publishes weights, saves
        log.info("learner: %d data-parallel rank(s), GPU ids %s; GPU compute dtype %s", len(self.learners.ranks),
                 self.learners.gpu_ids, dtype)
        task = text_task_spec(cfg)
        restartable = {"max_restarts": int(run_cfg.max_restarts), "max_task_retries": 0}
        self.max_staleness = int(cfg.algo.get("max_staleness", 0))
        self.partial = self.max_staleness > 0 and bool(cfg.algo.get("partial_rollouts", True))
        lengths = synthetic_lengths(OmegaConf.to_container(cfg.algo.synthetic_lengths)
                                    if cfg.algo.get("synthetic_lengths") else None)  # a mapping (`check_text_policy`)
        self.synthetic_lengths = asdict(lengths) if lengths else None  # a speed-run setting: the summary says so
        engine_options = {"synthetic_lengths": lengths, "capture": str(cfg.algo.get("engine_capture", "auto"))}
        self.engines = [
            ray.remote(concurrency_groups={**WATCH, "sync": 1})(EngineRole).options(
                **placed.options(place), **restartable).remote(
                grpo, place.threads, dtype, task, (index, len(engines)), engine_options)
            for index, place in enumerate(engines)]
        self.scorers = [
            ray.remote(concurrency_groups=WATCH)(TextLabeler).options(
                **placed.options(place), **restartable, **FED_BY_REFS).remote(grpo, task) for place in scorers]
        self.watched = {**self.learners.watched, **{f"engine {i}": Watched(e) for i, e in enumerate(self.engines)},
                        **{f"labeler {i}": Watched(s) for i, s in enumerate(self.scorers)}}
        self.sync_plan, self.time_shared = self._open_weight_sync(str(cfg.algo.get("weight_sync", "auto")))
        if self.time_shared and self.max_staleness:
            raise ConfigError(f"algo.max_staleness={self.max_staleness} needs engines on GPUs of their own",
                              "use a split topology or algo.max_staleness=0")
        # over a broadcast group a new engine cannot join: a dead engine ends the run there
        self.restartable = {f"labeler {i}" for i in range(len(self.scorers))} | (
            set() if uses_group(self.sync_plan.transport) else {f"engine {i}" for i in range(len(self.engines))})
        self.ahead: deque[Launched] = deque()  # rollouts in flight, oldest first
        self.streams: list[dict] | None = None  # each engine's random streams after the step trained last
        self._current: Launched | None = None  # the one popped off `ahead`, being waited for
        self.version = 0  # the learner's version of the weights pushed last (its counter: read, then followed)
        self._published: dict[int, ray.ObjectRef] = {}  # learner rank → its newest publication
        self._receiving: list[tuple[str, ray.ObjectRef]] = []  # the engines' last receive calls, not yet checked
        self.title = f"rlfarm · {cfg.algo.name} · {cfg.env.task} · {cfg.topology.name}"
        self.target = cfg.algo.target_reward
        self.samples_per_update = int(cfg.algo.prompts_per_step) * int(cfg.algo.group_size)
        self._begin(Progress(window=REWARD_WINDOW, timings=STAGE_KEYS, updates=0, samples=0, staleness_max=0,
                             dropped_stale=0), resume_from)

    def _warm_up(self) -> None:
        (self.version,) = self._ask([("learner", self.learner.weight_version.remote())], "weight_version")
        self._push(wait=True)  # the engines start from the learner's weights

    def _open_weight_sync(self, choice: str) -> tuple[WeightSyncPlan, list]:
        """Pick the transport once and build every end (a broadcast group is joined by all at the same time).
        Returns the plan and the engines that share a learner rank's GPU (they sleep while the ranks update)."""
        ranks, start_s = self.learners.ranks, float(self.cfg.run.restart_timeout_s)
        ask = lambda calls, what: self._ask(calls, what, start_s)  # noqa: E731 - within start-up's deadline
        named_ranks = lambda call: [(rank_name(i), call(rank)) for i, rank in enumerate(ranks)]  # noqa: E731
        named_engines = lambda call: [(f"engine {i}", call(e)) for i, e in enumerate(self.engines)]  # noqa: E731
        learners = ask(named_ranks(lambda rank: rank.location.remote()), "location")
        engines = ask(named_engines(lambda engine: engine.location.remote()), "location")
        devices = ask(named_ranks(lambda rank: rank.device.remote()) +
                      named_engines(lambda engine: engine.device.remote()), "device")
        sync = plan_weight_sync(choice, learners, engines, on_gpus=all(d.startswith("cuda") for d in devices),
                                sharded=str(self.cfg.algo.get("data_parallel", "ddp")) == "fsdp")
        opened = [(rank_name(rank), ranks[rank].open_sync.remote(sync.transport, len(sync.engines_of(rank))))
                  for rank in sync.ranks]
        self._sync_addresses = dict(zip(sync.ranks, ask(opened, "open_sync")))
        opening = [(rank_name(rank), ranks[rank].join_sync.remote()) for rank in sync.ranks]
        opening += [(f"engine {index}", self._open_engine_sync(sync, index)) for index in range(len(self.engines))]
        ask(opening, "open_sync")
        time_shared = [engine for engine, where in zip(self.engines, engines) if sharing_rank(where, learners) is not None]
        log.info("weight sync learner → %d engine(s): %s%s", len(self.engines), sync.transport,
                 f" (from ranks {list(sync.ranks)})" if sync.ranks != (0,) else "")
        return sync, time_shared

    def _open_engine_sync(self, sync: WeightSyncPlan, index: int) -> ray.ObjectRef:
        source = sync.sources[index]
        peers = sync.engines_of(source)
        return self.engines[index].open_sync.remote(sync.transport, self._sync_addresses[source],
                                                    1 + peers.index(index), 1 + len(peers))

    def _launch(self) -> Launched:
        """Every engine generates its part of the next step, and a scorer scores it as soon as it is there."""
        batch = Launched([], [], [], [])
        for index in range(len(self.engines)):
            for field in (batch.generated, batch.stats, batch.rewards, batch.score_stats):
                field.append(None)
            self._generate(batch, index)
        return batch

    def _generate(self, batch: Launched, index: int) -> None:
        """Engine `index`'s part of `batch`, generated (again) and scored."""
        # from the newest weights pushed: a step launched after a push never starts before they arrive
        batch.generated[index], batch.stats[index] = self.engines[index].generate_with_stats.options(
            num_returns=2).remote(self.version, float(self.cfg.run.role_timeout_s))
        self._score(batch, index)

    def _score(self, batch: Launched, index: int) -> None:
        """Part `index` of `batch` scored (again) by its scorer, round-robin."""
        batch.rewards[index], batch.score_stats[index] = self.scorers[index % len(self.scorers)].score_with_stats \
            .options(num_returns=2).remote(batch.generated[index])

    def _wait_for(self, batch: Launched) -> list[dict]:
        """Every part of `batch` generated and scored; a dead engine or scorer is restarted and what it had not
        finished of the steps in flight made again. Returns the engines' stats."""
        while True:
            calls = [(f"engine {i}", ref) for i, ref in enumerate(batch.stats)]
            calls += [(f"labeler {i % len(self.scorers)}", ref) for i, ref in enumerate(batch.score_stats)]
            try:
                return self._ask(calls, "generate and score")[:len(self.engines)]
            except RoleDied as death:
                self._restarted(death.role)

    def _rewire(self, name: str) -> None:
        """A restarted engine: its weight sync opened again, the newest weights, new prompt streams; then every
        part of the steps in flight that the dead engine (or scorer) had not finished is made again."""
        kind, index = name.split()[0], int(name.split()[-1])
        in_flight = [*([self._current] if self._current is not None else []), *self.ahead]  # oldest first
        if kind == "engine":
            start_s = float(self.cfg.run.restart_timeout_s)
            engine, source = self.engines[index], self.sync_plan.sources[index]
            self._ask([(name, self._open_engine_sync(self.sync_plan, index))], "open_sync", start_s)
            self._ask([(name, self._receive(engine, self._published[source]))], "receive_weights", start_s)
            self._ask([(name, engine.reseed.remote(int(self.cfg.seed) * 1_000_003 + 7919 * sum(self.restarts.values())
                                                     + self.progress["updates"]))], "reseed", start_s)
            self._receiving = [(n, ref) for n, ref in self._receiving if n != name]  # it holds the newest now
            for batch in in_flight:
                if unfinished(batch.stats[index]):
                    self._generate(batch, index)
        else:
            for batch in in_flight:
                for part in range(index, len(self.engines), len(self.scorers)):
                    if unfinished(batch.score_stats[part]):
                        self._score(batch, part)

    def _step(self) -> dict:
        """One update on the oldest usable rollout, the next rollouts already generating (k > 0); the learner's
        metrics plus each stage's time and the roles' busy fractions."""
        started = time.monotonic()
        while True:
            while len(self.ahead) <= self.max_staleness:                       # 1. generate (+ score) ahead
                self.ahead.append(self._launch())
            self._current = batch = self.ahead.popleft()
            stats = self._wait_for(batch)  # a long generation does not delay SIGTERM; a dead engine is restarted
            if self.version - min(s["policy_version"] for s in stats) <= self.max_staleness:
                break
            self.progress.add(dropped_stale=self.samples_per_update)  # too old: never trained on
        self._current = None
        generated_at = time.monotonic()
        if self.time_shared:  # colocated: these engines free the GPU while the learner trains
            self._ask([(self._name(e), e.sleep.remote()) for e in self.time_shared], "sleep")
        metrics = self.learners.update(batch.generated, batch.rewards)         # 2. advantages + update
        self.streams = [s.pop("streams") for s in stats]  # what a checkpoint after this update continues from
        updated_at = time.monotonic()
        if self.time_shared:
            self._ask([(self._name(e), e.wake.remote()) for e in self.time_shared], "wake")
        self._push(wait=self.max_staleness == 0)                               # 3. weights → engines
        synced_at = time.monotonic()
        step_s, generate = synced_at - started, [s["generate_s"] for s in stats]
        tokens = sum(s["tokens"] for s in stats)
        return metrics | {
            "step_s": step_s, "generate_s": max(generate), "wait_s": generated_at - started,
            "score_s": max(s["score_s"] for s in ray.get(batch.score_stats)),
            "sync_s": synced_at - updated_at, "generated_tokens_per_s": tokens / max(max(generate), 1e-9),
            "step_samples_per_s": self.samples_per_update / max(step_s, 1e-9),
            "step_tokens_per_s": tokens / max(step_s, 1e-9),
            "engine_busy": min(1.0, sum(generate) / (len(generate) * max(step_s, 1e-9))),
            "learner_busy": min(1.0, metrics["update_s"] / max(step_s, 1e-9)),
            # the largest engine's: its peak memory, its graph captures (`decode_graphs`)
            **{f"engine_{key}": max((s[key] for s in stats if s.get(key) is not None), default=None)
               for key in ("peak_gib", "capture_s", "graphs_captured", "eager_steps")}}

    def _name(self, engine) -> str:
        return f"engine {self.engines.index(engine)}"

    def _push(self, wait: bool) -> None:
        """The learner's newest weights to every engine: each engine takes them after the generate calls already
        queued on it, before any launched later. wait=False (k > 0): the driver goes on at once; the receive
        calls are checked at the next push (done by then: the learner's update after them needed them)."""
        self._check_receiving()
        self._published = self.learners.publish(self.sync_plan.ranks)
        # boxed, so each engine's call starts at once: over a broadcast both calls must run to meet
        self._receiving = [(f"engine {i}", self._receive(engine, self._published[source]))
                           for i, (engine, source) in enumerate(zip(self.engines, self.sync_plan.sources))]
        self.version += 1  # what the learner's publish numbers it (`LMLearner.weight_version`); read back when checked
        if wait:
            self._check_receiving()

    def _receive(self, engine, published: ray.ObjectRef) -> ray.ObjectRef:
        """An engine's receive call: with partial rollouts in its "sync" thread, so it enters the generation in
        flight; else behind the generate calls queued on it."""
        method = engine.receive_weights.options(concurrency_group="sync") if self.partial else engine.receive_weights
        return method.remote([published])

    def _check_receiving(self) -> None:
        """The engines' last receive calls answered (an engine that died meanwhile is restarted with the newest
        weights); the version they hold is the learner's."""
        while self._receiving:
            try:
                self.version = max(self._ask(self._receiving, "receive_weights"))
                self._receiving = []
            except RoleDied as death:
                self._receiving = [(name, ref) for name, ref in self._receiving if name != death.role]
                self._restarted(death.role)

    def _record(self, metrics: dict) -> dict:
        progress = self.progress
        progress.window.append(metrics["reward"])
        progress.record_timings(metrics)
        progress.add(updates=1, samples=self.samples_per_update)
        progress["staleness_max"] = max(progress["staleness_max"], int(metrics["staleness"]))
        wall, samples = progress.wall_s, progress["samples"]
        return {"updates": progress["updates"], "samples": samples, "wall_s": round(wall, 3), "time": time.time(),
                "reward_mean": progress.window_mean(), "samples_per_s": samples / max(wall, 1e-9),
                "dropped_stale": progress["dropped_stale"], **metrics}

    def _summary(self, row: dict) -> dict:
        progress, target = self.progress, self.target
        reward = progress.window_mean(empty=0.0)
        return {"updates": progress["updates"], "reward_mean": reward, "samples": progress["samples"],
                "median": progress.timing_medians(), "policy_staleness_max": progress["staleness_max"],
                "max_staleness": self.max_staleness, "dropped_stale": progress["dropped_stale"],
                "partial_rollouts": self.partial,
                "synthetic_lengths": self.synthetic_lengths and {**self.synthetic_lengths, "note": "speed-run setting"},
                "engines": len(self.engines), "learner_ranks": len(self.learners.ranks),
                "weight_sync": self.sync_plan.transport, "wall_s": round(progress.wall_s, 2),
                "target_reward": target, "reached_target": bool(target is not None and reward >= target)}

    # -- checkpoints ---------------------------------------------------------------------------------
    def _save(self, path: str, extra: dict) -> str:
        return self.learners.save(path, {**extra, "engine_streams": self.streams})

    def _load(self, path: str) -> dict:
        """Every learner rank restores weights, AdamW state, version and generators (the engines get the weights at
        the first sync); the engines' streams are kept for `_resume`."""
        extra = self.learners.load(path)
        self.streams = extra.get("engine_streams")
        return extra

    def _resume(self, path: str) -> None:
        """The engines continue their prompt and sampling streams from where the checkpoint's step left them; from
        a checkpoint without them (written before any update, or by an older rlfarm), new streams (all the same),
        seeded by the update it resumes after."""
        super()._resume(path)
        streams = self.streams if self.streams and len(self.streams) == len(self.engines) else None
        seed = int(self.cfg.seed) * 1_000_003 + self.progress["updates"]
        self._ask([(f"engine {i}", e.reseed.remote(streams[i] if streams else seed))
                   for i, e in enumerate(self.engines)], "reseed")
