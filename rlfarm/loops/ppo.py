"""PPO driver (on-policy family on gymnasium envs): act → learn → publish, synchronously.

Each cycle every env runner collects a fixed-length rollout with the newest weights, the learner computes GAE
and runs the PPO epochs on all of them, then publishes the next weight version. Only object refs pass
through here: rollouts go runner → learner and weights learner → runners straight through the object store;
the driver receives the finished episodes' returns and the learner's loss metrics.
A runner that dies is restarted by Ray (`run.max_restarts`): it gets the newest weights and collects its rollout
again; the learner updates only once every rollout of the cycle is in (`rlfarm.loops.skeleton`).
"""
from __future__ import annotations

import ray
from omegaconf import DictConfig, OmegaConf

from rlfarm.envs.spaces import env_policy_dims
from rlfarm.loops.deadlines import WATCH, RoleDied, Watched
from rlfarm.loops.progress import Progress
from rlfarm.loops.skeleton import SyncLoop
from rlfarm.roles.ppo_learner import PPOLearner
from rlfarm.roles.rollout import RolloutRunner
from rlfarm.run import Run
from rlfarm.topology import PlacedTopology

RETURN_WINDOW = 10  # episode_return_mean is over the last 10 finished episodes, as in the off-policy family
LEARNER_KEYS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "explained_variance",
                "grad_norm", "gradient_steps", "lr", "staleness", "update_s")


class PPOLoop(SyncLoop):
    """Episodes that were running at a checkpoint are lost on resume: the runners start fresh ones."""

    def __init__(self, cfg: DictConfig, run: Run, placed: PlacedTopology, resume_from: str | None = None):
        self.cfg, self.run = cfg, run
        as_dict = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731 - plain dicts travel to actors
        plan, seed = placed.plan, int(cfg.seed)
        restartable = {"max_restarts": int(cfg.run.max_restarts), "max_task_retries": 0}
        self.runners = [
            ray.remote(concurrency_groups=WATCH)(RolloutRunner).options(**placed.options(p), **restartable).remote(
                p.index, as_dict(cfg.env), as_dict(cfg.model.actor), seed, int(cfg.algo.rollout_steps), p.threads)
            for p in plan.of("env_runner")]
        # The spaces come from the env id, not from a runner, so the learner starts while the runners do.
        spaces = env_policy_dims(str(cfg.env.id), as_dict(cfg.env.kwargs) if cfg.env.get("kwargs") else {})
        (learner,) = plan.of("learner")
        self.learner = ray.remote(concurrency_groups=WATCH)(PPOLearner).options(**placed.options(learner)).remote(
            as_dict(cfg.algo), as_dict(cfg.model.actor), spaces, seed, learner.threads)
        self.envs_per_step = len(self.runners) * int(cfg.env.num_envs)  # env steps per vector step of all runners
        self.title = f"rlfarm · ppo · {cfg.env.id} · {cfg.topology.name}"
        self.target = cfg.algo.target_return
        self.weights = None  # the ref of the newest published weights
        self.watched = {"learner": Watched(self.learner), **{f"env_runner {i}": Watched(r)
                                                               for i, r in enumerate(self.runners)}}
        self.restartable = {f"env_runner {i}" for i in range(len(self.runners))}
        self._begin(Progress(window=RETURN_WINDOW, updates=0, env_steps=0, episodes=0), resume_from)

    # -- stages -------------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        self._publish()  # the runners start from the learner's weights

    def _has_work(self) -> bool:
        return self._rollout_steps() > 0

    def _step(self) -> dict:
        """One cycle: every runner collects a rollout with the newest weights → GAE + PPO epochs → publish."""
        steps = self._rollout_steps()
        budget_spent = self.progress["env_steps"] / int(self.cfg.total_env_steps)
        collected = self._each_runner(lambda r: r.collect.options(num_returns=2).remote(steps), "collect",
                                      lambda call: call[1])                                          # 1. act
        update = self.learner.update.remote(budget_spent, *(rollout for rollout, _ in collected))   # 2. GAE + PPO
        (metrics,) = self._ask([("learner", update)], "update")
        self._publish()                                                                              # 3. publish
        return {"steps": steps, "finished": [ray.get(episodes) for _, episodes in collected], "learner": metrics}

    def _publish(self) -> None:
        """The learner's newest weights, to every runner."""
        self.weights = self.learner.publish.remote()
        self._ask([("learner", self.weights)], "publish")
        self._each_runner(lambda r: r.receive_weights.remote(self.weights), "receive_weights")

    def _each_runner(self, call, what: str, answer=lambda call: call) -> list:
        """`call(runner)` on every runner, waited for (`answer(call)`: the ref to wait on); a runner that dies is
        restarted, given the newest weights, and called again. Returns the calls."""
        calls = [call(runner) for runner in self.runners]
        while True:
            try:
                self._ask([(f"env_runner {i}", answer(c)) for i, c in enumerate(calls)], what)
                return calls
            except RoleDied as death:
                self._restarted(death.role)
                index = int(death.role.split()[-1])
                calls[index] = call(self.runners[index])

    def _rewire(self, name: str) -> None:
        runner = self.watched[name]
        self._ask([(name, runner.actor.receive_weights.remote(self.weights))], "receive_weights")

    def _rollout_steps(self) -> int:
        """Vector steps for the next cycle: rollout_steps, fewer at the end so env_steps never passes the budget."""
        left = int(self.cfg.total_env_steps) - self.progress["env_steps"]
        return min(int(self.cfg.algo.rollout_steps), left // self.envs_per_step)

    def _record(self, cycle: dict) -> dict:
        progress, learner = self.progress, cycle["learner"]
        for finished in cycle["finished"]:
            progress.window.extend(finished["returns"])
            progress.add(episodes=len(finished["returns"]))
        progress.add(env_steps=cycle["steps"] * self.envs_per_step)
        progress["updates"] = learner["updates"]
        wall, env_steps = progress.wall_s, progress["env_steps"]
        rate = env_steps / max(wall, 1e-9)
        return {"env_steps": env_steps, "updates": learner["updates"], "wall_s": round(wall, 3),
                "env_steps_per_s": rate, "episodes": progress["episodes"],
                "episode_return_mean": progress.window_mean(), "policy_version": learner["policy_version"],
                "rollout_s": max(e["collect_s"] for e in cycle["finished"]),
                "eta_s": (int(self.cfg.total_env_steps) - env_steps) / max(rate, 1e-9),
                **{k: learner[k] for k in LEARNER_KEYS if k in learner}}

    def _summary(self, row: dict) -> dict:
        progress, target = self.progress, self.target
        ret = progress.window_mean()
        return {"env_steps": progress["env_steps"], "updates": progress["updates"],
                "gradient_steps": row.get("gradient_steps", 0), "episodes": progress["episodes"],
                "episode_return_mean": ret, "policy_version": row.get("policy_version", 0),
                "wall_s": round(progress.wall_s, 2), "env_steps_per_s": row.get("env_steps_per_s", 0.0),
                "target_return": target,
                "reached_target": bool(target is not None and ret is not None and ret >= target)}
