"""VLA driver (SimpleVLA-RL's recipe, and PPO with a critic): rollout workers play episodes (GRPO groups) in the
simulator, the learner updates, weights go back to the workers, synchronously.

    publication → workers.receive_weights, seeds → workers.collect (pipelined env groups + policy inference)
    → learner.update (GRPO) → learner.publish

Each update draws `groups_per_update` initial-state seeds, split across the env-runner workers; every seed is
played `group_size` times (a GRPO group: the same initial state and instruction, different action samples).
Only object refs pass through here, apart from the workers' small timing stats and the learner's metrics. Every
wait has a deadline: a worker's rollout on its progress, a server's call and the learner's update on their liveness
(the learner answers `stats` during an update within `run.role_timeout_s`, or the run ends naming it).
"""
from __future__ import annotations

import logging
import time
from collections import Counter

import numpy as np
import ray
from omegaconf import DictConfig

from rlfarm.loops.deadlines import NO_PROGRESS, Interrupted, Watched, WorkerLost
from rlfarm.loops.progress import Progress
from rlfarm.loops.skeleton import SyncLoop
from rlfarm.loops.supervision import Supervisor
from rlfarm.roles.vla import InferenceServerLost, remote_learner_class, remote_worker_class
from rlfarm.roles.vla_server import remote_server_class
from rlfarm.roles.vla_settings import split_groups, vla_config
from rlfarm.run import Run
from rlfarm.topology import PlacedTopology

log = logging.getLogger("rlfarm")
SUCCESS_WINDOW = 10  # summary success_rate: mean over the last 10 updates' rollouts
SERVER_DIED_IN_ROLLOUT = "re-run by its workers"  # a server recovery's "rollouts" (summary.recoveries, the log line)
SERVER_DIED_BETWEEN = "none lost (it died between them)"
SERVER_CALLS = 64  # concurrent sample() calls a server takes (each waits for its batch): two per worker, with room
WATCH_S = 1.0  # while the workers play, look this often for a hung worker or server
TIME_KEYS = ("rollout_s", "env_s", "infer_s", "overlap_s", "update_s", "step_s", "env_steps_per_s")


class VLALoop(SyncLoop):
    """Seeds depend on the update number, so a resumed run draws the initial states the uninterrupted one would
    have; the learner restores weights, optimizer and version."""

    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        self.vla = vla_config(cfg)
        plan = placed.plan
        runners = plan.of("env_runner")
        self.shares = split_groups(self.vla.groups_per_update, len(runners))
        # Workers hold nothing a rebuild loses (envs, a policy copy): Ray restarts a dead one (its constructor again),
        # and the driver re-runs the rollout it was in the middle of (`_collect`). Calls are never retried by Ray.
        restartable = {"max_restarts": int(cfg.run.max_restarts), "max_task_retries": 0}
        self.workers = [remote_worker_class().options(**placed.options(p), **restartable).remote(
                            self.vla, share, p.index, p.threads)
                        for p, share in zip(runners, self.shares)]
        (learner,) = plan.of("learner")
        # Start-up waits include the roles' constructors (envs made, a policy built or loaded: no stats answered
        # meanwhile), so they have run.restart_timeout_s; every later wait has run.role_timeout_s.
        start_s = float(cfg.run.restart_timeout_s)
        shapes_call = self.workers[0].shapes.remote()  # sizes the learner's policy without an env of its own
        (shapes,) = self._ask([("env_runner 0", shapes_call)], "shapes", start_s)
        self.learner = remote_learner_class().options(**placed.options(learner)).remote(self.vla, shapes,
                                                                                        learner.threads)
        # An engine role: batching inference servers the workers share (worker i → server i mod S). A server holds
        # nothing the driver cannot give back (the newest weights): Ray restarts a dead one, the driver reloads it
        # and has its workers play the rollouts it broke again (`_recover_server`).
        self.servers = [remote_server_class().options(**placed.options(p), max_concurrency=SERVER_CALLS,
                                                         **restartable).remote(
                            self.vla, shapes, int(cfg.algo.server_max_batch), float(cfg.algo.server_max_wait_ms),
                            p.threads, dtype=str(cfg.algo.server_dtype), graphs=bool(cfg.algo.server_graphs))
                        for p in plan.of("engine")]
        self._ask([(f"env_runner {i}", self._wire(i)) for i in range(len(self.workers))], "set_server", start_s)
        self.supervisor = Supervisor(self.learner, self.workers, [], int(cfg.run.max_restarts), run.dir / "roles.json",
                                     engines=self.servers)
        self.title = f"rlfarm · {cfg.algo.name} · {cfg.env.id} · {cfg.topology.name}"
        self.target = cfg.algo.target_success
        self.weights = None  # the ref of the newest published weights
        # The skeleton's waits (start-up, the first weights, save, load) watch every role's liveness; the Supervisor
        # restarts workers and servers.
        self.watched = {"learner": Watched(self.learner), **{w.name: Watched(w.actor) for w in self.supervisor.workers}}
        self._begin(Progress(window=SUCCESS_WINDOW, timings=TIME_KEYS, updates=0, env_steps=0, episodes=0,
                             first_success=None), resume_from)

    # -- stages -------------------------------------------------------------------------------------
    def _wire(self, index: int) -> ray.ObjectRef:
        """Worker `index` sends its policy calls to server index mod S (a no-op without an engine role)."""
        server = self.servers[index % len(self.servers)] if self.servers else None
        return self.workers[index].set_server.remote(server)

    def _warm_up(self) -> None:
        """The first publication, and every worker's local policy (loading it may take long: the waits watch the
        roles' liveness, not the work); every role's pid."""
        self.weights = self.learner.publish.remote()
        workers = self.supervisor.of("env_runner")
        self._ask([("learner", self.weights), *((w.name, w.actor.receive_weights.remote(None)) for w in workers)],
                  "the first weights")
        timeout_s = float(self.cfg.run.role_timeout_s)
        self.supervisor.poll(timeout_s)  # every role's pid, for roles.json
        self.supervisor.write_roles_file()
        self._server_stats = [{"busy_s": 0.0, "wall_s": 0.0, "batches": 0, "observations": 0} for _ in self.servers]
        servers = self.supervisor.of("engine")
        started = self._ask([(server.name, server.actor.stats.remote()) for server in servers], "stats", timeout_s)
        for server, stats in zip(servers, started):  # in case poll() had no answer from it yet
            server.pid = server.pid or stats["pid"]
        self._server_decoding = {"dtype": started[0]["dtype"], "graphs": started[0]["graphs"]} if started else None

    def _step(self) -> dict:
        """One cycle: collect (workers) → update (learner) → publish; the workers' stats, the learner's metrics
        and the stages' wall times."""
        started = time.monotonic()
        seeds = self._seeds(self.progress["updates"] + 1)
        self._load_servers()                                                             # before any worker asks
        collected = self._collect(seeds)                                                 # 1. rollouts
        stats = [s for _, s in collected]
        rolled = time.monotonic()
        metrics = self._update([batch for batch, _ in collected])                        # 2. update
        self.weights = self.learner.publish.remote()                                    # 3. new weights
        self._ask([(self.supervisor.learner.name, self.weights)], "publishing its weights",
                  float(self.cfg.run.role_timeout_s))
        done = time.monotonic()
        return {"stats": stats, "learner": metrics, "rollout_s": rolled - started, "update_s": done - rolled,
                "step_s": done - started, "servers": self._server_deltas()}

    def _collect(self, seeds: list[list[int]]) -> list[tuple[ray.ObjectRef, dict]]:
        """Every worker's rollout of its seeds: (batch ref, stats) per worker. A worker that dies during its rollout is
        waited for (Ray restarts it, `run.restart_timeout_s`), re-wired to its server and plays its seeds again from
        the start: a rollout's batch is whole or absent, so no part of a group reaches the learner. Restarts beyond
        `run.max_restarts` end the run with one line naming the worker. An inference server that dies breaks the rollouts
        of its workers alike: Ray restarts it, it gets the newest weights, and they play their seeds again. SIGTERM ends
        the wait at once (a rollout of a big policy can take minutes): the rollouts in progress are dropped, and a
        resume plays them again (the seeds depend on the update number)."""
        calls = {i: self._send(i, seeds[i]) for i in range(len(self.workers))}
        done: dict[int, tuple[ray.ObjectRef, dict]] = {}
        lost = Counter()  # rollouts each worker lost to its server in this update
        while calls:
            waiting = {stats: i for i, (_, _, stats) in calls.items()}
            ready = self._wait_unless_preempted(list(waiting), num_returns=1, timeout_s=WATCH_S)
            if not ready:
                self._kill_hung(sorted(calls))
                continue
            for ref in ready:
                i = waiting[ref]
                received, batch, _ = calls.pop(i)
                try:
                    stats = ray.get(ref)
                    ray.get(received)  # a publication it could not load fails the run here
                except InferenceServerLost:  # the worker is alive; its server died (or came back without weights)
                    lost[i] += 1
                    if lost[i] > int(self.cfg.run.max_restarts) + 1:
                        raise WorkerLost(f"env_runner {i}'s inference server failed its rollout {lost[i]} times "
                                         "in one update; see the server's log") from None
                    self._recover_server(i % len(self.servers), SERVER_DIED_IN_ROLLOUT)
                    calls[i] = self._send(i, seeds[i])
                    continue
                except ray.exceptions.RayActorError:
                    self._recover(i, f"re-ran its {len(seeds[i])} groups")
                    calls[i] = self._send(i, seeds[i])
                    continue
                worker = self.supervisor.workers[i]
                if worker.pid is not None and stats["pid"] != worker.pid:  # died and came back between two rollouts
                    self._recover(i, "nothing lost")
                done[i] = (batch, stats)
        return [done[i] for i in range(len(self.workers))]

    def _kill_hung(self, busy: list[int]) -> None:
        """Hand a hung role to Ray for a restart: a busy worker whose rollout has not moved for `run.role_timeout_s`
        (or that does not answer stats at all), or the inference server such a worker has been waiting on. Its
        rollouts then fail and are played again, as after any death (`_collect`)."""
        self.supervisor.poll(0.0)
        timeout_s, warmup_s = float(self.cfg.run.role_timeout_s), float(self.cfg.run.restart_timeout_s)
        playing = {self.supervisor.workers[i].index for i in busy}
        for role, problem in self.supervisor.unresponsive(timeout_s, warmup_s):
            if role.kind == "env_runner" and role.index not in playing:
                continue  # idle: its stats request waits behind nothing it is doing for this update
            # A worker that answers but waits on its server: the server is what hangs. One that does not answer at
            # all is hung itself (its last stats are stale).
            if (role.kind == "env_runner" and problem.startswith(NO_PROGRESS) and role.stats.get("in_server_call")
                    and self.servers):
                server = self.supervisor.of("engine")[role.index % len(self.servers)]
                if not server.killed:
                    self.supervisor.kill(server, f"left {role.name} waiting on one call: {role.name} {problem}")
                continue
            if role.kind == "learner":
                continue  # not restartable; it has nothing to do while the workers play (its deadline is elsewhere)
            self.supervisor.kill(role, problem)

    def _send(self, index: int, seeds: list[int]) -> tuple[ray.ObjectRef, ray.ObjectRef, ray.ObjectRef]:
        """The newest weights, then the rollout (one caller's calls run in order): (received, batch, stats) refs."""
        worker = self.workers[index]
        return (worker.receive_weights.remote(self.weights), *worker.collect.options(num_returns=2).remote(seeds))

    def _update(self, batches: list[ray.ObjectRef]) -> dict:
        """The learner's update, however long it takes, while the learner is alive: it answers `stats` from its own
        thread during the update, asked every WATCH_S; one that does not answer within `run.role_timeout_s` (stopped,
        hung) ends the run with one line naming it. SIGTERM ends the wait."""
        learner, timeout_s = self.supervisor.learner.name, float(self.cfg.run.role_timeout_s)
        call = self.learner.update.remote(*batches)
        while not self._wait_unless_preempted([call], timeout_s=WATCH_S):
            self._ask([(learner, self.learner.stats.remote())], "stats during its update", timeout_s)
        return ray.get(call)

    def _recover(self, index: int, what: str) -> None:
        worker, started = self.supervisor.workers[index], time.monotonic()
        pid = self._back(worker)
        self._ask([(worker.name, self._wire(index))], "its server's address", float(self.cfg.run.role_timeout_s))
        self.supervisor.restarted(worker, pid, started, {"rollout": what})

    def _back(self, role) -> int:
        """The role's new pid once Ray has restarted it (`run.restart_timeout_s`; WorkerLost when restarts are used
        up); SIGTERM ends the wait, and preempted.pt holds the state before this cycle."""
        try:
            return self.supervisor.wait_until_back(role, float(self.cfg.run.restart_timeout_s), lambda: self._preempt)
        except Interrupted:
            raise self._preempted() from None

    def _load_servers(self) -> None:
        """The newest weights into every server, before any worker asks."""
        for index in range(len(self.servers)):
            self._load_server(index, SERVER_DIED_BETWEEN)

    def _load_server(self, index: int, what: str) -> None:
        """The newest weights into server `index` (a no-op for a server that holds them); one that died is waited
        for and loaded again, as often as restarts allow."""
        server = self.supervisor.of("engine")[index]
        while True:
            started = time.monotonic()
            try:  # a VLA-sized policy's weights may take a while to load: the restart deadline, not role_timeout_s
                self._ask([(server.name, server.actor.receive_weights.remote(self.weights))],
                          "loading the newest weights", float(self.cfg.run.restart_timeout_s))
                return
            except ray.exceptions.RayActorError:
                self._server_restarted(index, self._back(server), started, what)

    def _recover_server(self, index: int, what: str) -> None:
        """Server `index` failed a worker's call: wait for Ray's restart and load the newest weights into it. One death
        breaks the rollouts of all its workers; the first of them to report it records the restart."""
        server, started = self.supervisor.of("engine")[index], time.monotonic()
        try:
            pid = ray.get(server.actor.stats.remote(), timeout=1.0)["pid"]
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pid = None  # dead, or being restarted
        if pid != server.pid:
            self._server_restarted(index, self._back(server), started, what)
        self._load_server(index, what)

    def _ask(self, calls: list[tuple[str, ray.ObjectRef]], what: str, timeout_s: float | None = None,
             interruptible: bool = True) -> list:
        """The skeleton's wait (a role that does not answer ends the run with one line naming it), but SIGTERM ends
        it with the preemption checkpoint at once: a rollout in flight is dropped. A death raises RayActorError, for
        the caller's recovery."""
        try:
            return super()._ask(calls, what, timeout_s, interruptible)
        except Interrupted:
            raise self._preempted() from None

    def _server_restarted(self, index: int, pid: int, started: float, what: str) -> None:
        self._server_stats[index] = {key: 0.0 for key in self._server_stats[index]}  # a new process counts from 0
        self.supervisor.restarted(self.supervisor.of("engine")[index], pid, started, {"rollouts": what})

    def _server_deltas(self) -> dict:
        """Since the last step, over all servers: mean observations per batch and the policy thread's busy share.
        A server restarted since it last answered is recorded here (its next round loads the weights it lost)."""
        if not self.servers:
            return {}
        now = []
        for index, server in enumerate(self.supervisor.of("engine")):
            timeout_s = float(self.cfg.run.role_timeout_s)
            try:
                (stats,) = self._ask([(server.name, server.actor.stats.remote())], "stats", timeout_s)
            except ray.exceptions.RayActorError:
                self._recover_server(index, SERVER_DIED_BETWEEN)
                (stats,) = self._ask([(server.name, server.actor.stats.remote())], "stats", timeout_s)
            if server.pid is not None and stats["pid"] != server.pid:
                self._server_restarted(index, stats["pid"], time.monotonic(), SERVER_DIED_BETWEEN)
            now.append(stats)
        before, self._server_stats = self._server_stats, now
        delta = {k: sum(n[k] - b[k] for n, b in zip(now, before)) for k in ("busy_s", "wall_s", "batches", "observations")}
        return {"server_batch_mean": delta["observations"] / max(delta["batches"], 1),
                "server_busy": delta["busy_s"] / max(delta["wall_s"], 1e-9)}

    def _seeds(self, update: int) -> list[list[int]]:
        """Initial-state seeds of this update, one list per worker; distinct across updates and runs."""
        first = int(self.cfg.seed) * 1_000_003 + (update - 1) * self.vla.groups_per_update
        bounds = np.cumsum([0, *self.shares])
        return [list(range(first + lo, first + hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def _record(self, cycle: dict) -> dict:
        progress, stats, metrics = self.progress, cycle["stats"], cycle["learner"]
        steps = sum(s["env_steps"] for s in stats)
        progress.add(updates=1, env_steps=steps, episodes=sum(s["episodes"] for s in stats))
        progress.window.append(metrics["success_rate"])
        if progress["first_success"] is None:
            progress["first_success"] = metrics["success_rate"]
        # the slowest worker sets the pace; its breakdown is the one that matters
        slowest = max(stats, key=lambda s: s["rollout_s"])
        rollout_s = cycle["rollout_s"]
        timing = {"rollout_s": rollout_s, "env_s": slowest["env_s"], "infer_s": slowest["infer_s"],
                  "overlap_s": slowest["overlap_s"], "update_s": cycle["update_s"], "step_s": cycle["step_s"],
                  "env_steps_per_s": steps / max(rollout_s, 1e-9)}
        progress.record_timings(timing)
        update, wall, success = progress["updates"], progress.wall_s, progress.window_mean()
        row = {"updates": update, "env_steps": progress["env_steps"], "samples": progress["episodes"],
               "wall_s": round(wall, 3), "success_rate_mean": success, "reward": metrics["success_rate"],
               "reward_mean": success, "inference_calls": slowest["inference_calls"],
               "inference_busy": slowest["infer_s"] / max(slowest["rollout_s"], 1e-9), **timing, **metrics,
               **cycle["servers"]}
        if self.servers:  # a restarted worker is wired to its server again before its next rollout
            row["workers_on_server"] = sum(bool(s["served"]) for s in stats)
        if update % 10 == 0 or update == 1:
            # GRPO: the share of groups dynamic sampling kept; PPO: how much of the return the critic explains
            signal = (f"kept {metrics['kept_groups']:.2f}" if "kept_groups" in metrics
                      else f"value EV {metrics.get('explained_variance', 0.0):.2f}")
            log.info("update %d success %.3f (last %d: %.3f) entropy %.2f %s rollout %.2fs (env %.2fs, "
                     "inference %.2fs, overlap %.2fs) wall %.0fs", update, metrics["success_rate"],
                     len(progress.window), success, metrics["entropy"], signal, rollout_s,
                     timing["env_s"], timing["infer_s"], timing["overlap_s"], wall)
        return row

    def _summary(self, row: dict) -> dict:
        progress, target = self.progress, self.target
        success = progress.window_mean(empty=0.0)
        return {"success_rate": success, "success_rate_start": progress["first_success"], "reward_mean": success,
                "updates": progress["updates"], "samples": progress["episodes"], "env_steps": progress["env_steps"],
                "wall_s": round(progress.wall_s, 2), "target_success": target,
                "reached_target": bool(target is not None and success >= target),
                "target_reward": target, "pipeline": self.vla.pipeline, "rollout_workers": len(self.workers),
                "inference_servers": len(self.servers), "server_decoding": self._server_decoding,
                "recoveries": self.supervisor.recoveries,
                "median": progress.timing_medians()}
