"""vLLM adapter with the `Engine` interface (optional extra, CUDA only).

vLLM's wheels are CUDA-only, several GB, and pin their own torch, so it is installed neither on the CPU
machines nor on the GPU machine this project is tested on: nothing below has run here. It uses vLLM's
public API (`LLM.generate` on token ids, `sleep`/`wake_up`, `collective_rpc`) as documented for
vLLM ≥ 0.10. Differences from the built-in engine, stated rather than hidden:
- log-probabilities are vLLM's "processed" ones (after temperature and nucleus renormalization); they
  equal the built-in engine's convention when top_p = 1, and are bf16-model values, not fp32;
- weight loading runs a function inside each worker, which vLLM's V1 engine accepts only with
  VLLM_ALLOW_INSECURE_SERIALIZATION=1.
"""
from __future__ import annotations

import torch

from rlfarm.data import Rollout, StopIds, stop_ids
from rlfarm.engines.base import Engine
from rlfarm.engines.hf import left_pad

MISSING_VLLM = "engine=vllm needs the vllm extra: pip install 'rlfarm[vllm]' on a CUDA machine; use engine=hf"


def _load_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    worker.model_runner.model.load_weights(weights)


class VLLMEngine(Engine):
    """Generation on a vLLM `LLM` holding the model at `model` (path or hub id)."""

    def __init__(self, model: str, pad_id: int, seed: int = 0, dtype: str = "bfloat16",
                 gpu_memory_utilization: float = 0.5):
        try:
            import vllm
        except ImportError:
            raise ImportError(MISSING_VLLM) from None
        self._vllm = vllm
        self._llm = vllm.LLM(model=model, seed=seed, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                             enable_sleep_mode=True, logprobs_mode="processed_logprobs")
        self.pad_id = pad_id
        self.weight_version = 0

    def generate(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, eos_id: StopIds = None) -> Rollout:
        stops = list(stop_ids(eos_id))
        params = self._vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
            stop_token_ids=stops or None, ignore_eos=not stops)
        requests = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        outputs = self._llm.generate(requests, params, use_tqdm=False)
        responses, logprobs = [], []
        for output in outputs:
            for completion in output.outputs:
                responses.append(list(completion.token_ids))
                logprobs.append([step[token].logprob for step, token in zip(completion.logprobs, completion.token_ids)])
        prompt, prompt_mask = left_pad([list(p) for p in prompt_ids for _ in range(n)], self.pad_id)
        width = max(map(len, responses))
        response_ids = torch.full((len(responses), width), self.pad_id, dtype=torch.long)
        response_mask = torch.zeros((len(responses), width), dtype=torch.long)
        response_logprobs = torch.zeros((len(responses), width), dtype=torch.float32)
        for row, (ids, lps) in enumerate(zip(responses, logprobs)):
            response_ids[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
            response_mask[row, :len(ids)] = 1
            response_logprobs[row, :len(ids)] = torch.tensor(lps, dtype=torch.float32)
        return Rollout(prompt, prompt_mask, response_ids, response_mask, response_logprobs, group_size=n,
                       temperature=temperature if temperature > 0 else 1.0, weight_version=self.weight_version)

    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self._llm.collective_rpc(_load_weights, args=(list(state_dict.items()),))
        self.weight_version = version

    def sleep(self) -> None:
        self._llm.sleep(level=1)

    def wake(self) -> None:
        self._llm.wake_up()
