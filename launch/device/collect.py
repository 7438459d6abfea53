"""Condense run directories + GPU samples from a device session into one JSON (few files come back)."""
import json
import statistics
import sys
from pathlib import Path


def steady(rows, key, skip_s=30.0):
    """Median of a rate after the first `skip_s` seconds (torch.compile warm-up, Ray start)."""
    values = [r[key] for r in rows if r.get(key) is not None and r.get("wall_s", 0) >= skip_s]
    return statistics.median(values) if values else None


def steady_rates(rows, skip_s=30.0):
    """Counters' growth per second from the first row after `skip_s` to the last row: rates of a whole window,
    not of one row (per-row rates jump with whole buses and credit rounds, so their median can mislead)."""
    window = [r for r in rows if r.get("wall_s", 0) >= skip_s]
    if len(window) < 2:
        return None
    first, last = window[0], window[-1]
    seconds = last["wall_s"] - first["wall_s"]
    counters = {"env_steps_per_s": "env_steps", "labeled_per_s": "transitions_labeled", "updates_per_s": "updates"}
    return {name: round((last.get(key, 0) - first.get(key, 0)) / seconds, 1) for name, key in counters.items()
            if key in first} | {"window_s": round(seconds, 1)}


def gpu_busy(path):
    per_gpu = {}
    for line in Path(path).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[2].isdigit():
            per_gpu.setdefault(parts[1], []).append(int(parts[2]))
    # drop the first 30 samples (start-up), report the mean utilization of the rest
    return {gpu: round(statistics.mean(v[30:] or v), 1) for gpu, v in per_gpu.items()}


def summarize(run_dir, gpu_csv):
    rows = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    keys = ["env_steps_per_s", "labeled_per_s", "updates_per_s", "labeling_lag_s", "policy_staleness"]
    keys += sorted({k for r in rows for k in r if k.endswith("_fraction")})  # where each role's time went
    out = {k: steady(rows, k) for k in keys}
    out["steady"] = steady_rates(rows)
    # Which kind of role the rows name as the bottleneck, and how often (the text's numbers vary row to row).
    named = [r["bottleneck"].split()[0].rstrip(":") for r in rows if r.get("bottleneck") and r.get("wall_s", 0) >= 30]
    out["bottleneck_counts"] = {kind: named.count(kind) for kind in sorted(set(named))}
    summary_path = Path(run_dir) / "summary.json"
    out["summary"] = json.loads(summary_path.read_text()) if summary_path.exists() else None
    out["gpu_util_percent"] = gpu_busy(gpu_csv) if Path(gpu_csv).exists() else None
    out["final_row"] = rows[-1] if rows else None
    return out


if __name__ == "__main__":
    phase, dirs = sys.argv[1], sys.argv[2:]
    if phase == "scaling":
        result = {f"reward_gpus_{i + 1}": summarize(d, f"/tmp/gpu_{i + 1}.csv") for i, d in enumerate(dirs)}
    else:
        result = summarize(dirs[0], dirs[1] if len(dirs) > 1 else "/tmp/gpu_main.csv")
    print(json.dumps(result, indent=1, default=str))
