"""Where the 7B decode step's kernels stand against the card (issue 35, item 3), in one device call:

1. the per-row flash-decoding kernel (`rlfarm.engines.decode_attention`) at Qwen2.5-7B's layout and batch 256, for
   each launch choice (`Launch`: block, warps, stages, busy_programs), 28 launches (one
   per layer, each its own cache) in a CUDA graph — K/V read rate in TB/s beside a plain copy of the same bytes
   (the card's copy rate, same call);
2. the step's weight GEMMs at 256 rows (fused q/k/v, o, fused gate/up, down, the head), each layer its own weight,
   through cuBLAS as torch calls them, through cuBLAS with the operands swapped, and with `--autotune` through
   inductor's max-autotune (Triton templates) — TFLOP/s each (`--gemms`: these alone).

Usage (device tool): source .devpkgs/setup.sh && python launch/device/decode_attention_sweep.py [--autotune] [--gemms]
Writes $OUT/decode_attention_sweep.json and prints a table."""
from __future__ import annotations

import argparse
import itertools
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from rlfarm.engines.decode_attention import LAUNCH, Launch, decode_attention

ROWS, KV_HEADS, GROUPS, DIM, LAYERS = 256, 4, 7, 128, 28
HIDDEN, INTER, VOCAB, CACHE = 3584, 18944, 152064, 1281  # P 256 + cap 1,024, one column spare
GEMMS = {"qkv": (HIDDEN + 2 * KV_HEADS * DIM, HIDDEN, True), "o": (HIDDEN, HIDDEN, False),
         "gate_up": (2 * INTER, HIDDEN, False), "down": (HIDDEN, INTER, False), "head": (VOCAB, HIDDEN, False)}


def graph_ms(work, replays: int = 20) -> float:
    """Mean ms of one replay of `work` captured in a CUDA graph (after warm-up)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            work()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / replays


def attention_sweep(context: str, quick: bool) -> list[dict]:
    """Every launch choice on 28 caches (quick: `LAUNCH` and the even batch's best, (128, 4, 2)). Context "even":
    every row's newest column at 767 (the bench's mean context P + cap/2), "ragged": newest columns spread over
    [0, CACHE - 1) (a refilled batch)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    shape = (ROWS, KV_HEADS, CACHE, DIM)
    keys = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(LAYERS)]
    values = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(LAYERS)]
    column = (torch.full((ROWS,), 767, device="cuda") if context == "even"
              else torch.randint(0, CACHE - 1, (ROWS,), device="cuda", generator=gen))
    valid = torch.arange(CACHE, device="cuda")[None, :] <= column[:, None]
    query = torch.randn(ROWS, KV_HEADS * GROUPS, 1, DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    read = 2 * int((column + 1).sum()) * KV_HEADS * DIM * 2 * LAYERS  # K and V, bf16, every layer
    # the card's copy rate over the same bytes: each layer's attended K/V as one contiguous block, copied
    flat = read // LAYERS // 2  # elements of bf16 per layer
    sources = [torch.empty(flat, device="cuda", dtype=torch.bfloat16) for _ in range(LAYERS)]
    targets = [torch.empty_like(source) for source in sources]
    copy_ms = graph_ms(lambda: [target.copy_(source) for target, source in zip(targets, sources)])
    rows = [{"case": f"copy of the attended K/V ({context})", "ms": round(copy_ms, 3),
             "read_tb_s": round(read / copy_ms / 1e9, 2)}]
    del sources, targets
    choices = list(dict.fromkeys([LAUNCH, Launch(128, 4, 2)]))
    if not quick:
        choices += [Launch(*choice) for choice in itertools.product((32, 64, 128), (2, 4, 8), (1, 2, 3, 4), (528, 2048))
                    if Launch(*choice) not in choices]
    for launch in choices:
        def work():
            for layer in range(LAYERS):
                decode_attention(query, keys[layer], values[layer], valid, column, GROUPS, DIM ** -0.5, launch)
        try:
            ms = graph_ms(work)
        except Exception as error:  # a choice the card cannot hold (shared memory): say so, go on
            rows.append({"case": f"attention {context}", **launch.__dict__,
                         "error": str(error).splitlines()[0][:120]})
            continue
        rows.append({"case": f"attention {context}", **launch.__dict__, "ms_per_step": round(ms, 3),
                     "read_tb_s": round(read / ms / 1e9, 2), "vs_copy": round(copy_ms / ms, 3),
                     "default": launch == LAUNCH})
    return rows


def gemm_rows(autotune: bool) -> list[dict]:
    """Each GEMM once per layer, each layer its own weight (as in the model: a weight shared by 28 launches would
    sit in L2 for the small ones), through cuBLAS as torch calls it (`cublas`: x @ W^T), through cuBLAS with the
    operands swapped (`cublas_swapped`: (W @ x^T)^T, the 256 rows as the product's narrow side, which can pick other
    tiles; the result's layout is transposed and left so), and with `autotune` through inductor's max-autotune."""
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = {k: torch.randn(ROWS, k, device="cuda", dtype=torch.bfloat16, generator=gen) for k in (HIDDEN, INTER)}
    rows = []
    for name, (out, inner, biased) in GEMMS.items():
        layers = 1 if name == "head" else LAYERS
        weights = [torch.randn(out, inner, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.02
                   for _ in range(layers)]
        bias = torch.zeros(out, device="cuda", dtype=torch.bfloat16) if biased else None
        flop = 2 * ROWS * out * inner * layers
        paths = {"cublas": lambda w: F.linear(x[inner], w, bias),
                 "cublas_swapped": lambda w: torch.addmm(bias[:, None], w, x[inner].t()) if bias is not None
                 else w @ x[inner].t()}
        if autotune:
            tuned = torch.compile(lambda a, w: F.linear(a, w, bias), mode="max-autotune-no-cudagraphs", dynamic=False)
            paths["max-autotune"] = lambda w: tuned(x[inner], w)
        for path, call in paths.items():
            ms = graph_ms(lambda: [call(w) for w in weights])
            rows.append({"case": f"gemm {name}", "path": path, "m_n_k": [ROWS, out, inner], "layers": layers,
                         "ms_per_step": round(ms, 3), "tflop_s": round(flop / ms / 1e9, 1)})
        del weights
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--autotune", action="store_true", help="also inductor's max-autotune GEMMs (minutes)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--quick", action="store_true", help="two launch choices, no GEMMs")
    only.add_argument("--gemms", action="store_true", help="the GEMMs alone, no attention")
    args = parser.parse_args()
    rows = [] if args.gemms else attention_sweep("even", args.quick) + attention_sweep("ragged", args.quick)
    rows += [] if args.quick else gemm_rows(args.autotune)
    out = Path(os.environ.get("OUT", ".")) / "decode_attention_sweep.json"
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    for context in () if args.gemms else ("even", "ragged"):
        timed = sorted((row for row in rows if row["case"] == f"attention {context}" and "ms_per_step" in row),
                       key=lambda row: row["ms_per_step"])
        default = next((row for row in timed if row["default"]), None)
        print(f"attention {context}: default {default}")
        for row in timed[:8] if len(timed) > 8 else timed:
            print("  ", row)
        print("  ", next(row for row in rows if row["case"].startswith("copy") and context in row["case"]))
    for row in rows:
        if row["case"].startswith("gemm"):
            print(row)


if __name__ == "__main__":
    main()
