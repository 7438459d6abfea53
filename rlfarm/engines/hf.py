"""Built-in generation engine on a Hugging Face causal LM: batched, left-padded prompts, a KV-cached
decoding loop of our own (not `model.generate`), so the log-probability of each sampled token is computed
from the very logits it was sampled from (see `rlfarm.data` for the convention).

Llama-family models (llama, qwen2, qwen3) decode through `StaticDecoder`: a slot-major KV cache, continuous
refill of finished rows (`max_batch` slots), attention over the columns written so far (context buckets), and on
CUDA one CUDA graph per decode step, active-batch bucket and context bucket.
Any other causal LM decodes through its own forward with a `DynamicCache` (slower, same results; every sample
in one batch, no refill). Sampling (`rlfarm.engines.sampling`) needs no host sync and its noise is keyed per
sample and token (`rlfarm.engines.noise`): one seed per call, drawn from the engine's generator; end of sequence
is tracked on the device and the host looks at it only every `stop_check_every` steps.

Partial rollouts: a weight sync may run while a generation is in flight (from another thread); it enters through
`gate` (`rlfarm.engines.weight_gate`) at the next host check, between decode steps, and every token records the
version of the weights whose logits it was sampled from (`Rollout.token_versions`). The KV cache of the tokens
before the swap is kept, not recomputed (as PipelineRL does): what a token's log-prob is under — new weights over
a prefix cached by old ones — is the distribution it was sampled from, the behaviour probability that the
learner's importance correction divides by, token by token.
"""
from __future__ import annotations

from collections.abc import Collection

import torch
from torch import nn

from rlfarm.data import Rollout, StopIds, stop_ids
from rlfarm.engines import static_decoder
from rlfarm.engines.base import Engine, hits_stop
from rlfarm.engines.noise import column_keys, race_noise
from rlfarm.engines.sampling import Rows, nucleus_filter, sample_tokens  # noqa: F401 (part of this module's API)
from rlfarm.engines.synthetic_lengths import SyntheticLengths
from rlfarm.engines.synthetic_lengths import synthetic_lengths as length_model
from rlfarm.engines.weight_gate import WeightGate
from rlfarm.models.lm import cache_kwarg, position_ids_from_mask


def left_pad(sequences: list[list[int]], pad_id: int, device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists → (ids [N, L], mask [N, L]) padded on the left, so every row ends at column L − 1."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        if sequence:
            ids[row, length - len(sequence):] = torch.tensor(sequence, dtype=torch.long)
            mask[row, length - len(sequence):] = 1
    return ids.to(device), mask.to(device)


class HFEngine(Engine):
    """Generates with its own copy of the policy; `update_weights` copies new tensors into it in place.

    decoder: "auto" (the static decoder when the model is Llama-family, else the HF-cache loop), "static"
    or "hf". cuda_graphs: capture the static decoder's step on CUDA. compile: torch.compile that step
    before capture (fewer, fused kernels, so a shorter step, paid for by a compilation on the first call;
    docs/benchmarks.md, P4, has both); None = on CUDA with graphs, off on CPU.
    max_batch: the static decoder's slots (rows decoded at once; None: every sample of a call at once).
    refill: a finished row takes the next queued sample at once (else the slots decode in waves, each to its
    longest sample: the fixed batch). synthetic_lengths: the speed-run length model
    (`rlfarm.engines.synthetic_lengths`: None, or {median_frac, p99_frac}); static decoder only.
    fuse_projections: the static decoder runs each layer's q/k/v, and its MLP's gate/up, as one GEMM over a buffer
    whose row blocks are the modules' own parameters (`rlfarm.engines.fused_projections`; in-place weight updates
    reach it); False: a GEMM per module (the comparison `rlfarm bench engine` draws). capture: when the static
    decoder's CUDA graphs are captured, "ahead" (before a call), "first_use" or "auto" (`rlfarm.engines.decode_graphs`).
    """

    def __init__(self, model: nn.Module, pad_id: int, device: torch.device | str = "cpu", seed: int = 0,
                 stop_check_every: int = 4, decoder: str = "auto", cuda_graphs: bool = True,
                 compile: bool | None = None, max_batch: int | None = None, refill: bool = True,
                 synthetic_lengths: SyntheticLengths | dict | bool | None = None, fuse_projections: bool = True,
                 capture: str = "ahead"):
        if decoder not in ("auto", "static", "hf"):
            raise ValueError(f"decoder must be auto, static or hf, got {decoder!r}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pad_id, self.stop_check_every = pad_id, stop_check_every
        self.weight_version = 0
        self.gate = WeightGate()  # where a weight sync enters a generation in flight
        self.pauses = 0  # pause points passed (where a sync may enter), over all calls
        self._named: dict[str, torch.Tensor] | None = None
        self._discarded: dict[str, tuple[torch.Size, torch.dtype]] = {}  # dropped while asleep
        self._cache_kwarg = cache_kwarg(model)
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        use_static = decoder == "static" or (decoder == "auto" and static_decoder.supports(self.model))
        if compile is None:
            compile = cuda_graphs and self.device.type == "cuda"
        self._static = (static_decoder.StaticDecoder(self.model, pad_id, cuda_graphs=cuda_graphs, compile=compile,
                                                     fuse_projections=fuse_projections, capture=capture)
                        if use_static else None)
        self.max_batch, self.refill = max_batch, refill
        self.lengths = length_model(synthetic_lengths)
        if self.lengths is not None and self._static is None:
            raise ValueError("synthetic_lengths needs the static decoder (a Llama-family model)")

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, eos_id: StopIds = None, rows: Rows | None = None) -> Rollout:
        """n samples of each prompt. rows: where they sit in a step split across engines (`Rows`; None: the
        whole step is here)."""
        if max_new_tokens < 1 or n < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got n={n}, max_new_tokens={max_new_tokens}")
        prompt, prompt_mask = left_pad([list(p) for p in prompt_ids], self.pad_id, self.device)
        seed = int(torch.randint(0, 2 ** 31, (), generator=self._generator, device=self._generator.device))
        first = rows.first if rows is not None else 0
        with self.gate.generating():
            if self._static is not None:
                tokens, logprobs, generated, versions = self._static.generate(
                    prompt, prompt_mask, n, max_new_tokens, self._sampling(temperature, top_p, eos_id),
                    self.stop_check_every, seed, first, max_batch=self.max_batch, refill=self.refill,
                    lengths=self.lengths, weights=self._weights_now)
            else:
                tokens, logprobs, generated, versions = self._generate_with_hf_cache(
                    prompt.repeat_interleave(n, dim=0), prompt_mask.repeat_interleave(n, dim=0), max_new_tokens,
                    temperature, top_p, stop_ids(eos_id), seed, first)
        versions = versions.cpu()
        valid = generated.cpu()
        return Rollout(prompt_ids=prompt.repeat_interleave(n, dim=0).cpu(),
                       prompt_mask=prompt_mask.repeat_interleave(n, dim=0).cpu(),
                       response_ids=tokens.cpu(), response_mask=valid.long(), logprobs=logprobs.cpu(),
                       group_size=n, temperature=temperature if temperature > 0 else 1.0,
                       weight_version=int(versions[valid].min()) if valid.any() else self.weight_version,
                       token_versions=versions)

    def wait_for_weights(self, version: int, timeout_s: float) -> None:
        """Block until weights of at least `version` are loaded (a sync running beside this call brings them)."""
        if not self.gate.wait_for(lambda: self.weight_version >= version, timeout_s):
            raise TimeoutError(f"the engine holds weights v{self.weight_version}, was asked to generate from "
                               f"v{version}, and they did not come within {timeout_s:.0f} s")

    def _weights_now(self) -> int:
        """Between decode steps: let a waiting weight sync in (partial rollouts); the version loaded now."""
        self.pauses += 1
        self.gate.pause_point()
        return self.weight_version

    def _sampling(self, temperature: float, top_p: float, eos_id: StopIds) -> static_decoder.Sampling:
        """What the static decoder samples by. Under synthetic lengths a sample ends only at its drawn length, where
        its end token is forced: an end token sampled before does not end it (with a small vocabulary, the digit
        tasks', random weights would end most samples within a few tokens)."""
        stops = stop_ids(eos_id)
        end = stops[0] if stops else None
        return static_decoder.Sampling(float(temperature), float(top_p), () if self.lengths else stops, end)

    @torch.no_grad()
    def prepare(self, num_prompts: int, n: int, prompt_len: int, max_new_tokens: int, temperature: float = 1.0,
                top_p: float = 1.0, eos_id: StopIds = None) -> None:
        """Allocate the cache of a call of this shape and, capturing "ahead", its CUDA graphs now
        (`StaticDecoder.prepare`), so the call itself does not pay for them. A no-op on the HF-cache path."""
        if self._static is not None:
            sampling = self._sampling(temperature, top_p, eos_id)
            self._static.prepare(num_prompts * n, prompt_len, max_new_tokens, sampling, self.max_batch, self.refill,
                                 ragged=bool(sampling.stop_ids) or self.lengths is not None)

    @property
    def last_call(self) -> static_decoder.Calls | None:
        """What the static decoder's last call did (decode steps, prefills, slots); None on the HF-cache path."""
        return self._static.last_call if self._static is not None else None

    def _generate_with_hf_cache(self, prompt: torch.Tensor, prompt_mask: torch.Tensor, max_new_tokens: int,
                                temperature: float, top_p: float, stops: tuple[int, ...], seed: int, first: int
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Any causal LM: its own forward with a DynamicCache, one step at a time; a weight sync may enter every
        `stop_check_every` steps."""
        from transformers import DynamicCache

        samples, prompt_len = prompt.shape
        attention = torch.zeros((samples, prompt_len + max_new_tokens), dtype=torch.long, device=self.device)
        attention[:, :prompt_len] = prompt_mask
        first_position = prompt_mask.sum(dim=1, keepdim=True)
        tokens = torch.full((samples, max_new_tokens), self.pad_id, dtype=torch.long, device=self.device)
        logprobs = torch.zeros((samples, max_new_tokens), dtype=torch.float32, device=self.device)
        generated = torch.zeros((samples, max_new_tokens), dtype=torch.bool, device=self.device)
        finished = torch.zeros(samples, dtype=torch.bool, device=self.device)
        versions = torch.zeros((samples, max_new_tokens), dtype=torch.long, device=self.device)

        cache = DynamicCache()
        logits_version = self._weights_now()
        logits = self._next_logits(prompt, prompt_mask, position_ids_from_mask(prompt_mask), cache)
        sample_ids = torch.arange(samples, device=self.device) + first
        seed_tensor = torch.tensor(seed, device=self.device)
        columns = column_keys(logits.shape[-1], self.device)
        for t in range(max_new_tokens):
            race = (race_noise(seed_tensor, sample_ids, torch.full_like(sample_ids, t), columns)
                    if temperature > 0 else None)
            token, logprob = sample_tokens(logits, temperature, top_p, race=race)
            generated[:, t] = ~finished
            tokens[:, t] = token.masked_fill(finished, self.pad_id)
            logprobs[:, t] = logprob.masked_fill(finished, 0.0)
            versions[:, t] = logits_version
            if stops:
                finished = finished | hits_stop(token, stops)
            if t + 1 == max_new_tokens or ((t + 1) % self.stop_check_every == 0 and bool(finished.all())):
                break
            attention[:, prompt_len + t] = generated[:, t]
            if (t + 1) % self.stop_check_every == 0:
                self._weights_now()
            logits_version = self.weight_version
            logits = self._next_logits(tokens[:, t:t + 1], attention[:, :prompt_len + t + 1],
                                       first_position + t, cache)
        width = max(int(generated.sum(dim=1).max()), 1)  # the longest sample, as the static decoder returns
        return tokens[:, :width], logprobs[:, :width], generated[:, :width], versions[:, :width]

    def _next_logits(self, input_ids, attention_mask, position_ids, cache) -> torch.Tensor:
        output = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=True, logits_to_keep=1, **{self._cache_kwarg: cache})
        return output.logits[:, -1]

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream (each call draws its seed from it, `generate`)."""
        self._generator.manual_seed(seed)

    def sampling_state(self) -> torch.Tensor:
        """Where the sampling stream is (a checkpoint keeps it: `rlfarm.engines.streams`)."""
        return self._generator.get_state()

    def set_sampling_state(self, state: torch.Tensor) -> None:
        self._generator.set_state(state)

    @torch.no_grad()
    def update_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        own = self._tensors()
        unknown = [name for name in state_dict if name not in own]
        if unknown:
            raise KeyError(f"engine model has no tensor {unknown[0]!r} ({len(unknown)} unknown names)")
        if state_dict:  # one multi-tensor copy instead of a kernel launch per tensor
            torch._foreach_copy_([own[name] for name in state_dict], list(state_dict.values()))
        self.weight_version = version

    def _tensors(self) -> dict[str, torch.Tensor]:
        """Name → parameter/buffer, built once: walking every module is slow next to a bucket's copy, and a
        bucketed sync calls `update_weights` once per bucket. Rebuilt after sleep/wake: moving a model replaces
        its buffers (its parameters stay the same objects)."""
        if self._named is None:
            self._named = dict(self.model.named_parameters()) | dict(self.model.named_buffers())
        return self._named

    def sleep(self, discard: Collection[str] = ()) -> None:
        """Give the device memory back: the decoder's cache and graphs, and the weights. Tensors named in
        `discard` are dropped, not kept on the host — for those the next weight sync rewrites anyway (what a
        full sync after the learner's update does): waking then allocates them instead of copying the whole
        model back from host memory."""
        named = self._tensors()
        unknown = sorted(set(discard) - set(named))
        if unknown:
            raise KeyError(f"engine model has no tensor {unknown[0]!r} to discard")
        if self._static is not None:
            self._static.release()  # the graphs point at the memory given back below
        self._discarded = {}
        for name in discard:
            tensor = named[name]
            self._discarded[name] = (tensor.shape, tensor.dtype)
            tensor.data = torch.empty(0, dtype=tensor.dtype)
        self.model.to("cpu")
        self._named = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def wake(self) -> None:
        """Back on the device; discarded tensors come back allocated but unset until the next weight sync."""
        self.model.to(self.device)
        self._named = None
        named = self._tensors()
        for name, (shape, dtype) in self._discarded.items():
            named[name].data = torch.empty(shape, dtype=dtype, device=self.device)
        self._discarded = {}
