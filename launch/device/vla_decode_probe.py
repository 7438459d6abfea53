"""Where a VLA-sized policy's decode step spends its GPU time (issue 17): the server's graphed decoding at one batch
size, then eager decode steps under torch.profiler with the attention variants that could cut it (HF's SDPA with the
4-D boolean mask as the server runs it; the same mask as an additive float mask; no mask at all: the lower bound).
Standalone (torch + transformers only): python3 launch/device/vla_decode_probe.py [--shape vitb16-qwen0.5b] [--batch 256]"""
import argparse
import json
import os
import time

import torch

from rlfarm.models.lm_factory import save_random_llava
from rlfarm.models.vla import load_hf_vla_actions
from rlfarm.roles.vla_server import GraphedDecoding


def timed(fn, repeats=10):
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="vitb16-qwen0.5b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    folder = f"/tmp/rlfarm-vla-{args.shape}"
    if not os.path.isdir(folder):
        save_random_llava(folder, 0, args.shape, None, "cuda")
    actions = load_hf_vla_actions(folder, args.tokens).to("cuda").eval()
    actions.policy.model.to(torch.bfloat16)
    decoding = GraphedDecoding(actions, (args.batch,))
    step = decoding.step_for(args.batch, torch.device("cuda"))
    results = {"shape": args.shape, "batch": args.batch, "prompt": decoding.prompt,
               "attn_implementation": actions.policy.model.config._attn_implementation,
               "graph_step_ms": timed(lambda: step["graph"].replay(), 20)}
    eager = {"cache": step["cache"], "ids": step["ids"], "position": step["position"], "mask": step["mask"]}
    results["eager_step_ms"] = timed(lambda: decoding._forward(eager))
    float_mask = torch.zeros(step["mask"].shape, dtype=torch.bfloat16, device="cuda").masked_fill(~step["mask"], -1e30)
    results["eager_float_mask_ms"] = timed(lambda: decoding._forward(dict(eager, mask=float_mask)))
    model = decoding.model
    no_mask = lambda: model(input_ids=step["ids"], cache_position=step["position"], use_cache=True,  # noqa: E731
                            logits_to_keep=1, **{actions.policy._cache_kwarg: step["cache"]})
    results["eager_no_mask_ms"] = timed(no_mask)
    print(json.dumps(results), flush=True)
    from torch.profiler import ProfilerActivity, profile

    for name, fn in (("bool_mask", lambda: decoding._forward(eager)), ("no_mask", no_mask)):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=70)
        open(f"{args.out}/decode_profile_{name}.txt", "w").write(table)
        print(table)
    print(json.dumps(results, indent=1))
    json.dump(results, open(f"{args.out}/decode_probe.json", "w"), indent=1)


if __name__ == "__main__":
    with torch.no_grad():  # as the server decodes: no autograd history through the static cache
        main()
