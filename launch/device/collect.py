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
    return window_rates(window)


def window_rates(window):
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


def acting_window(rows, max_wall_s, start_on="updates", settle_s=10.0):
    """The rows from `settle_s` after the first that counts `start_on` (the learner's first update: it has captured
    and compiled; or, for a reward slower than algo.learning_starts allows, the first labeled transitions) to
    `run.max_wall_s` (then the runners stop and the tail drains), whatever each run's start-up took."""
    first = next((r["wall_s"] for r in rows if r.get(start_on, 0) > 0), None)
    end = float("inf") if max_wall_s is None else float(max_wall_s)
    return [] if first is None else [r for r in rows if first + settle_s <= r["wall_s"] <= end]


def max_wall_s(run_dir):
    for line in (Path(run_dir) / "config.yaml").read_text().splitlines():  # the run's resolved config, one key
        if line.strip().startswith("max_wall_s:"):
            value = line.split(":", 1)[1].strip()
            return None if value in ("null", "") else float(value)
    return None


def run_figures(run_dir, gpu_csv, start_on="updates"):
    """One end-to-end run of issue 36: counter rates over the window after its first update, the busy shares there,
    its summary's counts (produced = labeled = stored) and the GPUs' mean utilization."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return {"error": f"no {path}"}
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
    window = acting_window(rows, max_wall_s(run_dir), start_on)
    shares = sorted({k for r in window for k in r if k.endswith("_fraction") and k != "labeled_fraction"})
    summary_path = Path(run_dir) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    counts = {k: summary.get(k) for k in ("transitions_produced", "transitions_labeled", "transitions_stored",
                                          "transitions_quarantined", "transitions_unlabeled", "updates", "env_steps",
                                          "startup_s", "wall_s", "worker_restarts")}
    named = [r["bottleneck"].split()[0].rstrip(":") for r in window if r.get("bottleneck")]
    return {"steady": window_rates(window), "window_from_s": window[0]["wall_s"] if window else None,
            "shares": {k: round(statistics.median(r[k] for r in window if r.get(k) is not None), 3)
                       for k in shares if any(r.get(k) is not None for r in window)},
            "labeling_lag_s": steady(window, "labeling_lag_s", 0.0), "bottleneck_counts":
            {kind: named.count(kind) for kind in sorted(set(named))}, "summary": counts,
            "produced_eq_labeled_eq_stored": bool(summary) and counts["transitions_produced"]
            == counts["transitions_labeled"] == counts["transitions_stored"],
            "gpu_util_percent": gpu_busy(gpu_csv) if Path(gpu_csv).exists() else None}


def distill_stats(run_dir):
    """The distilled reward's own numbers (distill_*) in the run's last metrics row."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return None
    last = json.loads(path.read_text().splitlines()[-1])
    return {k: v for k, v in last.items() if k.startswith("distill_")}


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def issue36(root):
    """Every figure of issue36_split_1_1.sh from its folder: the learner bench, the reward models' ceilings, the runs,
    and each acceptance ratio beside its two figures."""
    root = Path(root)
    bench_path = root / "bench_learner" / "bench.json"
    rows = json.loads(bench_path.read_text())["rows"] if bench_path.exists() else []
    role = next((r for r in rows if r["case"] == "halfcheetah/role"), {})
    ceilings = {case: json.loads(path.read_text() or "{}") for case in ("clip_bf16", "clip_fp8", "judge")
                if (path := root / f"ceiling_{case}.json").exists()}
    judged = ("judge", "judge_mps", "distilled")  # slower than learning_starts allows: windows from the first labels
    runs = {name: run_figures(root / "runs" / name, root / f"gpu_{name}.csv",
                              "transitions_labeled" if name in judged else "updates")
            for name in ("env_frames", "clip_bf16", "clip_mps", "clip_mps_r0", "clip_fp8", *judged)}
    rate = lambda run, key: (runs[run].get("steady") or {}).get(key)  # noqa: E731
    # whose ceiling a run is held to: its model's direct call on one GPU times the run's reward GPUs
    plain = {"clip_mps": "clip_bf16", "clip_mps_r0": "clip_bf16", "judge_mps": "judge", "distilled": "judge"}
    reward_gpus = int((root / "reward_gpus").read_text()) if (root / "reward_gpus").exists() else 1
    per_gpu = lambda name: ceilings.get(plain.get(name, name), {}).get("img_per_s")  # noqa: E731
    ceiling = lambda name: (one := per_gpu(name)) and round(one * reward_gpus, 1)  # noqa: E731
    env = rate("env_frames", "env_steps_per_s")
    checks = {
        "a_learner_in_pipeline_vs_bench": {"pipeline": rate("env_frames", "updates_per_s"), "bench": role.get("value"),
                                           "ratio": ratio(rate("env_frames", "updates_per_s"), role.get("value")),
                                           "target": 0.9},
        **{f"b_{run}_labeled_vs_direct": {"labeled_per_s": rate(run, "labeled_per_s"), "direct": ceiling(run),
                                          "ratio": ratio(rate(run, "labeled_per_s"), ceiling(run)), "target": 0.9}
           for run in ("clip_bf16", "clip_mps", "clip_mps_r0", "clip_fp8")},
        **{f"b_{run}_env_steps_vs_env_run": {"env_steps_per_s": rate(run, "env_steps_per_s"), "env_run": env,
                                             "ratio": ratio(rate(run, "env_steps_per_s"), env), "target": target}
           for run, target in (("clip_bf16", 0.75), ("clip_fp8", 0.9))},
        **{f"c_{run}_labeled_vs_direct": {"labeled_per_s": rate(run, "labeled_per_s"), "direct": ceiling(run),
                                          "ratio": ratio(rate(run, "labeled_per_s"), ceiling(run)), "target": 0.9,
                                          "produced_eq_labeled_eq_stored": runs[run].get("produced_eq_labeled_eq_stored")}
           for run in ("judge", "judge_mps")},
        # item 5 (no target): what labeling a tenth with the judge does to throughput, and the rewards the agent saw
        "d_distilled_vs_judge": {"labeled_per_s": rate("distilled", "labeled_per_s"), "judge_run": rate("judge", "labeled_per_s"),
                                 "ratio": ratio(rate("distilled", "labeled_per_s"), rate("judge", "labeled_per_s")),
                                 "target": None, "distill": distill_stats(root / "runs" / "distilled"),
                                 "produced_eq_labeled_eq_stored": runs["distilled"].get("produced_eq_labeled_eq_stored")},
    }
    for check in checks.values():
        check["met"] = None if check["ratio"] is None or check["target"] is None else check["ratio"] >= check["target"]
    return {"checks": checks, "reward_gpus": reward_gpus, "learner_bench": [{k: r.get(k) for k in ("case", "value", "ratio", "setup_s")} for r in rows],
            "ceilings": ceilings, "runs": runs}


if __name__ == "__main__":
    phase, dirs = sys.argv[1], sys.argv[2:]
    if phase == "issue36":
        print(json.dumps(issue36(dirs[0]), indent=1, default=str))
        sys.exit(0)
    if phase == "scaling":
        result = {f"reward_gpus_{i + 1}": summarize(d, f"/tmp/gpu_{i + 1}.csv") for i, d in enumerate(dirs)}
    else:
        result = summarize(dirs[0], dirs[1] if len(dirs) > 1 else "/tmp/gpu_main.csv")
    print(json.dumps(result, indent=1, default=str))
