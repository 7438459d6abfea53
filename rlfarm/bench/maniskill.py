"""`rlfarm bench maniskill`: ManiSkill3 scenes batched in one process, the env stage alone next to the rollout.

Per picture size S and env count N (conf/bench/maniskill.yaml), one `ManiSkillGPUTasks` (rlfarm/envs/maniskill_gpu.py)
and one tiny VLA at S px on the same device; every case plays whole rollouts (reset N envs in GRPO groups, then
action chunks until every episode has ended), and counts the env steps the episodes took:
- env alone (baseline): random action chunks; each chunk ends with the batched picture taken, as a policy would read it.
- rollout tiny_vla: the tiny VLA samples each chunk from the batched picture, proprio and instruction words, its
  tokens decode to actions on the device, the call's inputs, tokens and log-probabilities are recorded on the device
  (what a GRPO batch holds), then `step_chunk`. Its ratio to env alone is what inference and recording cost.
- tiny_vla alone: the policy's sampling on the same batch, as env steps/s it could feed (N x K per call).
Values are medians over `repeats` timed rollouts after one warm-up; the cases of one (S, N) are timed in turns.
Rows also hold the GPU memory in use on the device (everything: physics, renderer, torch) and the success rate.
"""
from __future__ import annotations

import statistics
import time

import torch
from omegaconf import DictConfig

from rlfarm.bench.common import sizes, synchronize
from rlfarm.envs.maniskill_gpu import ManiSkillGPUTasks
from rlfarm.envs.maniskill_tasks import instruction_vocabulary
from rlfarm.models.vla import tiny_vla

UNIT = "env steps/s"


def run(cfg: DictConfig, device: str) -> list[dict]:
    size = sizes(cfg, device)
    rows = []
    for image_size in size.image_sizes:
        for num_envs in size.num_envs:
            rows += measure(cfg, size, device, int(image_size), int(num_envs))
    return rows


def measure(cfg: DictConfig, size: DictConfig, device: str, image_size: int, num_envs: int) -> list[dict]:
    group = int(size.group_size)
    if num_envs % group:
        raise ValueError(f"num_envs {num_envs} is not a multiple of group_size {group}")
    started = time.perf_counter()
    tasks = ManiSkillGPUTasks(str(cfg.task), num_envs, image_size, int(size.max_steps), str(cfg.control_mode),
                              render_device=device, sim_backend=str(size.sim_backend))
    build_s = time.perf_counter() - started
    torch.manual_seed(int(cfg.seed))
    policy = tiny_vla(instruction_vocabulary((str(cfg.task),)), tasks.action_dim, int(size.chunk_size),
                      tasks.proprio_dim, image_size=image_size, bins=int(cfg.bins), **size.model).to(device).eval()
    rollout = Rollout(tasks, policy, int(size.chunk_size), float(cfg.temperature), device)
    name = f"{cfg.task} {image_size}px x{num_envs}"
    cases = {f"{name} env alone": rollout.env_alone, f"{name} rollout tiny_vla": rollout.with_policy}
    try:
        for work in cases.values():
            work(seeds(cfg, num_envs, group, 0))  # warm-up: first resets, first pictures and policy kernels
        timings: dict[str, list[dict]] = {case: [] for case in cases}
        for repeat in range(int(size.repeats)):
            for case, work in cases.items():  # in turns, on the same seeds
                timings[case].append(work(seeds(cfg, num_envs, group, repeat + 1)))
        policy_rate = rollout.policy_alone(int(size.repeats))
        used_gib = gpu_memory_gib(device)
    finally:
        tasks.close()
    common = {"unit": UNIT, "num_envs": num_envs, "image_size": image_size, "chunk_size": int(size.chunk_size),
              "sim_backend": str(size.sim_backend), "gpu_mem_gib": used_gib}
    rows, env_case = [], f"{name} env alone"
    for case, runs in timings.items():
        rate = statistics.median(run["steps"] / run["seconds"] for run in runs)
        rows.append({"case": case, "value": rate, "baseline": None if case == env_case else env_case, **common,
                     "reset_s": round(statistics.median(run["reset_s"] for run in runs), 4),
                     "episode_steps": statistics.median(run["steps"] / num_envs for run in runs),
                     "success_rate": statistics.median(run["success_rate"] for run in runs),
                     **({"build_s": round(build_s, 1)} if case == env_case else {})})
    rows.append({"case": f"{name} tiny_vla alone", "value": policy_rate, "baseline": None, **common})
    return rows


def seeds(cfg: DictConfig, num_envs: int, group: int, round_: int) -> list[int]:
    """GRPO groups: `group` envs per seed, fresh seeds every round."""
    first = int(cfg.seed) + round_ * (num_envs // group)
    return [first + i // group for i in range(num_envs)]


def gpu_memory_gib(device: str) -> float | None:
    """Memory in use on the whole GPU (physics and renderer allocate outside torch's allocator)."""
    if not device.startswith("cuda"):
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2**30, 2)


class Rollout:
    """Whole rollouts of the batched tasks, with random chunks or with the tiny VLA's (see the module docstring)."""

    def __init__(self, tasks: ManiSkillGPUTasks, policy, chunk_size: int, temperature: float, device: str):
        self.tasks, self.policy, self.chunk_size, self.temperature = tasks, policy, chunk_size, temperature
        self.device = device
        self.calls = -(-tasks.max_steps // chunk_size)
        self.generator = torch.Generator(device).manual_seed(0)
        n, tokens = tasks.num_envs, policy.num_tokens
        self.record = {"image": torch.zeros(n, self.calls, 3, tasks.image_size, tasks.image_size, dtype=torch.uint8,
                                            device=device),
                       "proprio": torch.zeros(n, self.calls, tasks.proprio_dim, device=device),
                       "tokens": torch.zeros(n, self.calls, tokens, dtype=torch.int64, device=device),
                       "logprobs": torch.zeros(n, self.calls, tokens, device=device)}

    def env_alone(self, seeds: list[int]) -> dict:
        def act(obs, call):
            obs.image.sum()  # the picture is read, as the policy would read it
            return torch.rand(self.tasks.num_envs, self.chunk_size, self.tasks.action_dim, device=self.device,
                              generator=self.generator) * 2 - 1

        return self._play(seeds, act)

    def with_policy(self, seeds: list[int]) -> dict:
        words = {}

        def act(obs, call):
            if "words" not in words:
                words["words"] = torch.as_tensor(self.policy.tokenizer.encode(obs.instructions), device=self.device)
            image, proprio = obs.image.to(self.device), obs.proprio.to(self.device)
            tokens, logprobs = self.policy.sample(image, words["words"], proprio, self.temperature, self.generator)
            for name, value in (("image", image), ("proprio", proprio), ("tokens", tokens), ("logprobs", logprobs)):
                self.record[name][:, call] = value
            return decode(tokens, self.policy.bins).view(self.tasks.num_envs, self.chunk_size, -1)

        return self._play(seeds, act)

    def _play(self, seeds: list[int], act) -> dict:
        synchronize(self.device)
        started = time.perf_counter()
        obs = self.tasks.reset(seeds)
        synchronize(self.device)
        reset_s = time.perf_counter() - started
        steps = torch.zeros((), dtype=torch.int64, device=self.tasks.device)
        for call in range(self.calls):
            result = self.tasks.step_chunk(act(obs, call))
            obs, steps = result.obs, steps + result.steps.sum()
            if bool(result.done.all()):
                break
        synchronize(self.device)
        return {"seconds": time.perf_counter() - started, "reset_s": reset_s, "steps": int(steps),
                "success_rate": float(self.tasks.success.float().mean())}

    def policy_alone(self, repeats: int) -> float:
        """Env steps/s the tiny VLA could feed: N x K per sampling call on the last observations."""
        obs = self.tasks.observations()
        image, proprio = obs.image.to(self.device), obs.proprio.to(self.device)
        words = torch.as_tensor(self.policy.tokenizer.encode(obs.instructions), device=self.device)
        calls = 20
        rates = []
        for _ in range(repeats + 1):
            synchronize(self.device)
            started = time.perf_counter()
            for _ in range(calls):
                self.policy.sample(image, words, proprio, self.temperature, self.generator)
            synchronize(self.device)
            rates.append(calls * self.tasks.num_envs * self.chunk_size / (time.perf_counter() - started))
        return statistics.median(rates[1:])


def decode(tokens: torch.Tensor, bins: int) -> torch.Tensor:
    """Action tokens → actions at the bins' centres in [-1, 1] (`ActionTokenizer.decode` with low -1, high 1)."""
    return (tokens.float() + 0.5) / bins * 2 - 1
