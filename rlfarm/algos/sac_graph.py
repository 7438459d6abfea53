"""Fast SAC updates: several updates per call, captured whole (sampling included) in one CUDA graph.

Why: at batch 256 with 256×2 MLPs one SAC update is a couple of hundred tiny kernels. Launched one by one from
Python the GPU mostly waits for the launcher. Here the kernels of `updates_per_call`
updates — drawing the batch indices and the actor's noise on the device, gathering from the GPU-resident
replay storage, critic, actor and temperature losses, backward passes, capturable Adam, Polyak averaging —
are recorded once and replayed with one launch; with `compile=True` torch.compile (inductor) first fuses the
losses' forward and backward passes, the Adam steps and the Polyak update into fewer, wider kernels
(docs/benchmarks.md has the speeds).

The math is SACAgent's own (rlfarm/algos/sac.py): the same loss functions, the same schedule (critic every
update; `policy_frequency` actor and temperature steps every `policy_frequency` updates; Polyak every
update) and the agent's own networks and optimizers, so checkpoints, `policy_state()` and eager updates
keep working on the same agent. Three differences make it capturable and testable:
- the actor's standard-normal noise is an *input* (drawn for all updates of a call at once), so a test can
  feed it the draws an eager update makes and compare the results;
- actor and temperature losses share one backward pass (their gradients touch disjoint parameters:
  the actor loss sees α detached and the temperature loss sees log π detached, so the gradients are the same);
- on CUDA the optimizers run with capturable=True (the same Adam, its step count on the device); compiled,
  they also run in Adam's foreach form (see SACStep), which inductor fuses into kernels that fill the GPU.
On CPU nothing is captured or compiled: the same steps run in Python, so CI exercises the same code.

`ReplayUpdates` is what the SAC learner role (rlfarm/roles/sac_learner.py) holds on CUDA: it draws through the
replay buffer's sampler (`sample_into`, capturable) and mixes graph replays with eager updates as the count and
the actor's schedule allow. The agent knows nothing of graphs.
"""
from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable

import torch

from rlfarm.algos.sac import SACAgent, actor_loss, critic_loss, soft_q_target, temperature_loss

Batch = dict[str, torch.Tensor]
Draw = Callable[[], tuple[Batch, torch.Tensor]]

WARMUP_CALLS = 3  # before capture, on a side stream: cuBLAS workspaces, optimizer state, compilation


def squashed_sample(actor: torch.nn.Module, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """SquashedGaussianActor.sample(obs) with its standard-normal draw `noise` [B, act] given, not drawn inside.

    The same operations in the same order as rlfarm.models.mlp.SquashedGaussianActor.sample, so that equal
    noise gives equal results (tests/bench/test_learner.py checks it against the eager update)."""
    mean, log_std = actor._dist_params(obs)
    std = log_std.exp()
    pre_tanh = mean + std * noise
    squashed = torch.tanh(pre_tanh)
    # log N(u; μ, σ) − Σ log(scale · (1 − tanh²u)) : change of variables through tanh and the rescale.
    gaussian_logp = (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    correction = torch.log(actor.action_scale * (1 - squashed.pow(2)) + 1e-6).sum(-1)
    return squashed * actor.action_scale + actor.action_bias, gaussian_logp - correction


class SACStep:
    """One SAC update of `agent` from a batch and the actor's noise [1 + policy_frequency, B, act]
    (noise[0] samples a' for the critic target, noise[1 + i] the actor's i-th step). Host-sync free."""

    def __init__(self, agent: SACAgent, compile: bool = False, compile_optimizers: bool | None = None,
                 compile_options: dict | None = None):
        self.agent = agent
        self.critic_objective, self.actor_objective = self._critic_objective, self._actor_objective
        self.critic_optim_step, self.actor_optim_step = agent.critic_optim.step, agent.actor_optim.step
        self.alpha_optim_step, self.update_target = agent.alpha_optim.step, agent._update_target
        # dynamic=False: the shapes never change, so inductor may specialize every kernel to them.
        # compile_options: inductor settings for these functions only, e.g. {"combo_kernels": True}.
        compiled = functools.partial(torch.compile, dynamic=False, options=dict(compile_options or {}) or None)
        if compile:
            self.critic_objective = compiled(self._critic_objective)
            self.actor_objective = compiled(self._actor_objective)
        if compile if compile_optimizers is None else compile_optimizers:
            # Fused Adam and foreach lerp run as multi_tensor_apply kernels that give each block 65,536
            # elements: for these ~10^5-parameter networks that is 2-3 blocks on a 132-SM GPU, which leaves most
            # of it idle (docs/benchmarks.md, P3, has the time it costs). The same Adam (foreach form, its state
            # unchanged) compiled by inductor spreads over the whole GPU.
            for optimizer in (agent.critic_optim, agent.actor_optim, agent.alpha_optim):
                for group in optimizer.param_groups:
                    group["fused"], group["foreach"] = False, True
            self.critic_optim_step = compiled(_stepper(agent.critic_optim))
            self.actor_optim_step = compiled(_stepper(agent.actor_optim))
            self.alpha_optim_step = compiled(_stepper(agent.alpha_optim))
            self.update_target = compiled(agent._update_target)

    def _critic_objective(self, batch: Batch, noise: torch.Tensor) -> torch.Tensor:
        agent = self.agent
        with torch.no_grad():
            next_action, next_logp = squashed_sample(agent.actor, batch["next_obs"], noise)
            next_q = agent.critic_target(batch["next_obs"], next_action)
            target = soft_q_target(batch["reward"], batch["terminated"], next_q, next_logp, agent.alpha, agent.gamma)
        return critic_loss(agent.critic(batch["obs"], batch["action"]), target)

    def _actor_objective(self, obs: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(actor loss + temperature loss, actor loss, entropy estimate)."""
        agent = self.agent
        action, logp = squashed_sample(agent.actor, obs, noise)
        loss = actor_loss(agent.critic(obs, action), logp, agent.alpha)
        total = loss + temperature_loss(agent.log_alpha, logp, agent.target_entropy) if agent.autotune else loss
        return total, loss.detach(), -logp.detach().mean()

    def __call__(self, batch: Batch, noise: torch.Tensor, update_actor: bool) -> dict[str, torch.Tensor]:
        agent = self.agent
        loss = self.critic_objective(batch, noise[0])
        agent.critic_optim.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optim_step()
        metrics = {"critic_loss": loss.detach()}
        if update_actor:
            # The critic is a constant for the actor: skip its weight gradients (as SACAgent does).
            agent.critic.requires_grad_(False)
            for i in range(agent.policy_frequency):
                total, metrics["actor_loss"], metrics["entropy"] = self.actor_objective(batch["obs"], noise[1 + i])
                agent.actor_optim.zero_grad(set_to_none=True)
                agent.alpha_optim.zero_grad(set_to_none=True)
                total.backward()
                self.actor_optim_step()
                if agent.autotune:
                    self.alpha_optim_step()
            agent.critic.requires_grad_(True)
        self.update_target()
        metrics["alpha"] = agent.alpha
        return metrics


def _stepper(optimizer: torch.optim.Optimizer) -> Callable[[], None]:
    """A plain function around optimizer.step(), the form PyTorch's compiled-optimizer recipe compiles."""
    def step() -> None:
        optimizer.step()
    return step


class GraphedSACUpdates:
    """`updates_per_call` SAC updates per call on batches from `draw()`; one CUDA graph replay on CUDA.

    `draw()` returns (batches: each field [K, B, ...], noise [K, 1 + policy_frequency, B, act]) for the K
    updates of a call; it runs inside the graph, so it must draw on the device without host syncs
    (see `replay_draw`). Returns the metrics of the call's last update (tensors that the next call
    overwrites on CUDA: read them before calling again, or copy them)."""

    def __init__(self, step: SACStep, draw: Draw, updates_per_call: int = 8, graph: bool | None = None):
        agent = step.agent
        if updates_per_call < 1 or updates_per_call % agent.policy_frequency:
            raise ValueError(f"updates_per_call ({updates_per_call}) must be a positive multiple of "
                             f"policy_frequency ({agent.policy_frequency}): the actor's schedule is recorded")
        self.step, self.draw, self.updates_per_call = step, draw, updates_per_call
        self.graph = agent.device.type == "cuda" if graph is None else graph
        if self.graph and agent.device.type != "cuda":
            raise ValueError("CUDA graphs need the agent on a CUDA device")
        self._graph: torch.cuda.CUDAGraph | None = None
        self._metrics: dict[str, torch.Tensor] = {}

    def _updates(self) -> dict[str, torch.Tensor]:
        agent = self.step.agent
        batches, noise = self.draw()
        metrics: dict[str, torch.Tensor] = {}
        for k in range(self.updates_per_call):
            batch = {name: values[k] for name, values in batches.items()}
            metrics.update(self.step(batch, noise[k], update_actor=k % agent.policy_frequency == 0))
        return metrics

    def __call__(self) -> dict[str, torch.Tensor]:
        agent = self.step.agent
        if agent.updates % agent.policy_frequency:
            raise RuntimeError(f"the agent is at update {agent.updates}, not at a multiple of policy_frequency "
                               f"({agent.policy_frequency}): the recorded actor schedule would be off by one")
        if not self.graph:
            metrics = self._updates()
        else:
            if self._graph is None:
                self._capture()
            self._graph.replay()
            metrics = self._metrics
        agent.updates += self.updates_per_call
        return metrics

    def _capture(self) -> None:
        agent = self.step.agent
        optimizers = (agent.actor_optim, agent.critic_optim, agent.alpha_optim)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["capturable"] = True  # same fused kernel; only the capture check differs
            init_adam_state(optimizer)
        # Warm-up calls are real updates: put the agent back where it was, in place, before recording.
        state = mutable_state(agent)
        saved = [t.detach().clone() for t in state]
        stream = torch.cuda.Stream(device=agent.device)
        stream.wait_stream(torch.cuda.current_stream(agent.device))
        with torch.cuda.stream(stream), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*capturable=True.*")  # warm-up runs uncaptured, on purpose
            for _ in range(WARMUP_CALLS):
                self._updates()
        torch.cuda.current_stream(agent.device).wait_stream(stream)
        with torch.no_grad():
            torch._foreach_copy_(state, saved)
        self._graph = torch.cuda.CUDAGraph()
        # thread_local: the learner role's other threads (stats reading the metrics, a checkpoint snapshot, the
        # weight publisher) may use the device while this thread captures; in the default "global" mode a
        # synchronizing call from any of them would invalidate the capture.
        with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):
            self._metrics = self._updates()


def init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Create Adam's per-parameter state now, as its first step would (fused/capturable layout: the step
    count on the parameter's device), so that it exists before warm-up and is not first made inside a capture."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def mutable_state(agent: SACAgent) -> list[torch.Tensor]:
    """Every tensor an update writes: the weights, log α and the optimizers' state."""
    tensors = [*agent.actor.parameters(), *agent.critic.parameters(), *agent.critic_target.parameters(),
               agent.log_alpha]
    for optimizer in (agent.actor_optim, agent.critic_optim, agent.alpha_optim):
        for state in optimizer.state.values():
            tensors += [value for value in state.values() if torch.is_tensor(value)]
    return tensors


def replay_draw(buffer, size: torch.Tensor, updates: int, agent: SACAgent) -> Draw:
    """Draw for `updates` updates from a replay buffer on the agent's device (`storage.gather`, `sampler`), of
    which the first `size` rows are filled (`size` a 0-d float64 tensor on the device, updated in place by the
    caller as the buffer grows): the sampler's indices [updates, batch_size] and the actor's noise, then one
    gather per field. No host sync: it can run inside a CUDA graph."""
    index = torch.zeros(updates, buffer.sampler.batch_size, dtype=torch.long, device=size.device)
    noise_shape = (updates, 1 + agent.policy_frequency, buffer.sampler.batch_size, agent.act_dim)

    def draw() -> tuple[Batch, torch.Tensor]:
        batches = buffer.storage.gather(buffer.sampler.sample_into(index, size))
        return batches, torch.randn(noise_shape, device=size.device)
    return draw


def fixed_draw(batches: Batch, noise: torch.Tensor) -> Draw:
    """Always these tensors (the caller may refill them in place between calls): for tests and fixed batches."""
    return lambda: (batches, noise)


class ReplayUpdates:
    """`count` SAC updates of `agent` on batches from `buffer` (a ReplayBuffer on the agent's device) per call:
    groups of `graph_updates` updates as one GraphedSACUpdates call each (one CUDA-graph replay on CUDA, the
    losses torch.compile'd first when `compile`), wherever the count and the actor's schedule allow; the rest
    one by one, `agent.update(buffer.sample())`. Returns the last update's metrics (a replay's are overwritten
    by the next replay: read them before calling again).

    A graph reads fixed addresses: it is rebuilt when the storage's tensors move (first fill, a restored
    buffer); `reset()` drops it when the agent's state was restored (new optimizer state tensors)."""

    def __init__(self, agent: SACAgent, buffer, graph_updates: int, compile: bool = False):
        if graph_updates < 1:
            raise ValueError(f"graph_updates must be positive, got {graph_updates}")
        self.agent, self.buffer, self.graph_updates = agent, buffer, int(graph_updates)
        self.compile = compile and agent.device.type == "cuda"
        self._graphed: tuple | None = None  # (storage identity, GraphedSACUpdates, fill count)

    def __call__(self, count: int) -> dict[str, torch.Tensor]:
        agent, metrics, done = self.agent, {}, 0
        while done < count:
            if count - done >= self.graph_updates and agent.updates % agent.policy_frequency == 0:
                metrics = self._graph_call()()
                done += self.graph_updates
            else:
                metrics = agent.update(self.buffer.sample())
                done += 1
        return metrics

    def reset(self) -> None:
        self._graphed = None

    def _graph_call(self) -> GraphedSACUpdates:
        storage = self.buffer.storage
        identity = tuple(field.data_ptr() for field in storage.fields.values())
        if self._graphed is None or self._graphed[0] != identity:
            fill = torch.zeros((), dtype=torch.float64, device=self.agent.device)
            runner = GraphedSACUpdates(SACStep(self.agent, compile=self.compile),
                                       replay_draw(self.buffer, fill, self.graph_updates, self.agent),
                                       self.graph_updates)
            self._graphed = (identity, runner, fill)
        _, runner, fill = self._graphed
        fill.fill_(len(storage))
        return runner
