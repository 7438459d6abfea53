"""Model-FLOPs utilization (MFU) of an LM policy update (issue 37): the update's useful work over the time it took
and the cards' dense bf16 peak (`rlfarm.cards`).

Useful work follows the 6·N·T convention (Kaplan et al. 2020; PaLM's MFU): N the model's matrix parameters (an
untied input embedding is a lookup, not a matmul, and is left out), T the real tokens trained (prompt + response,
no padding); a forward pass is 2·N·T, its backward 4·N·T. Under LoRA the frozen base still runs its backward's
activation GEMMs but not its weight-gradient ones: 4·N·T. Attention's own FLOPs are left out (under a tenth of a 7B
model's at ≤ 1,280 tokens; so a packed update, `algo.packed`, whose attention is per row, counts the same work as a
padded one), and so are passes that train nothing (old log-probs, the KL reference): padding and
those passes are what MFU should show as lost. Pure functions of the model and numbers."""
from __future__ import annotations

from torch import nn

from rlfarm.cards import DENSE_TFLOPS, card_figure
from rlfarm.memory_plan import measured_peak_gib


def matrix_params(model: nn.Module) -> int:
    """Parameters that multiply activations: the 2-D ones, an untied input embedding excluded."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embedding = base.get_input_embeddings().weight
    untied = embedding is not base.get_output_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and not (untied and p is embedding))


class UpdateFigures:
    """An update's useful FLOPs, their utilization of `world_size` cards like `device`'s (`peak_tflops` None: from
    the card's name; a CPU has none, so only `learner_tflops` is reported), the GPU memory it held, and two counts
    that tell a slow update's cause apart (issue 37: one 7B update in five or six ran at half speed, unexplained):
    the graphs compiled during it and the caching allocator's retries (a full card frees its cache and tries again)."""

    def __init__(self, model: nn.Module, device: str, world_size: int = 1, peak_tflops: float | None = None):
        lora = any(not p.requires_grad for p in model.parameters())
        self.flops_per_token = (4 if lora else 6) * matrix_params(model)
        self.peak = card_figure(DENSE_TFLOPS, device, peak_tflops)
        self.world_size, self.device = world_size, device
        self._graphs, self._retries = compiled_graphs(), allocator_retries(device)

    def of(self, tokens: int, seconds: float) -> dict[str, float | None]:
        """learner_tflops: the update's useful TFLOP/s (all ranks together); mfu: that over the ranks' peak;
        learner_peak_gib: rank 0's peak CUDA memory since the last update (None on a CPU; `rlfarm.memory_plan`
        estimates it before the run); learner_compiles: graphs dynamo compiled in this process since the last
        update (algo.compile_layers: the first update's, then 0 unless a piece's shape recompiles a block);
        learner_alloc_retries: the allocator's retries since the last update (None on a CPU)."""
        tflops = self.flops_per_token * tokens / max(seconds, 1e-9) / 1e12
        graphs, retries = compiled_graphs(), allocator_retries(self.device)
        figures = {"learner_tflops": tflops, "mfu": tflops / (self.peak * self.world_size) if self.peak else None,
                   "learner_peak_gib": measured_peak_gib(self.device), "learner_compiles": graphs - self._graphs,
                   "learner_alloc_retries": None if retries is None else retries - self._retries}
        self._graphs, self._retries = graphs, retries
        return figures


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def allocator_retries(device: str) -> int | None:
    """How often this process's CUDA caching allocator has freed its cache to retry an allocation (None on a CPU)."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    return int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
