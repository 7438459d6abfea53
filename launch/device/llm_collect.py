"""Condense launch/device/llm_async.sh's runs: per run, the medians of the step's stage times and throughput
after WARM updates (the first ones pay compilation and graph capture), step time against its slowest stage
(max of generate and update), and each GPU's mean utilisation over the same updates (nvidia-smi samples)."""
import json
import os
import statistics
import sys
from datetime import datetime
from pathlib import Path

WARM = int(os.environ.get("WARM", 5))  # updates left out (compile, graph capture)
KEYS = ("step_s", "generate_s", "update_s", "wait_s", "sync_s", "publish_s", "score_s", "step_samples_per_s",
        "step_tokens_per_s", "generated_tokens_per_s", "engine_busy", "learner_busy", "staleness", "partial_ratio",
        "kept_groups", "learner_tflops", "mfu", "learner_peak_gib", "engine_capture_s", "engine_graphs_captured",
        "engine_eager_steps")


def gpu_busy(csv: Path, start: float, end: float) -> dict:
    """Mean utilisation % per GPU index over [start, end] (unix seconds; the samples are the device's local time)."""
    per_gpu: dict[str, list[int]] = {}
    for line in csv.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        at = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        if start <= at <= end:
            per_gpu.setdefault(parts[1], []).append(int(parts[2]))
    return {gpu: round(statistics.mean(v), 1) for gpu, v in sorted(per_gpu.items())}


def condense(run: Path) -> dict:
    metrics = run / "metrics.jsonl"
    if not metrics.exists():
        return {"error": (run / "stdout.log").read_text()[-1500:] if (run / "stdout.log").exists() else "no output"}
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    steady = rows[WARM:] or rows
    out = {key: round(statistics.median(r[key] for r in steady), 4) for key in KEYS if key in steady[0]}
    out["updates_used"] = len(steady)
    # each update's own (a slow one's cause: rlfarm.algos.model_flops.UpdateFigures), the warm-up's included
    for key in ("update_s", "mfu", "learner_compiles", "learner_alloc_retries"):
        if key in rows[0]:
            out[f"{key}_per_update"] = [r.get(key) if not isinstance(r.get(key), float) else round(r[key], 3)
                                        for r in rows]
    out["step_over_slowest_stage"] = round(out["step_s"] / max(out["generate_s"], out["update_s"]), 3)
    start, end = steady[0]["time"] - steady[0]["step_s"], steady[-1]["time"]
    out["gpu_busy_percent"] = gpu_busy(run / "gpu.csv", start, end) if (run / "gpu.csv").exists() else None
    summary = run / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        out |= {key: s.get(key) for key in ("engines", "learner_ranks", "weight_sync", "max_staleness", "dropped_stale",
                                            "policy_staleness_max")}
    return out


if __name__ == "__main__":
    root = Path(sys.argv[1])
    runs = {run.name: condense(run) for run in sorted(root.iterdir()) if run.is_dir()}
    print(json.dumps(runs, indent=1))
