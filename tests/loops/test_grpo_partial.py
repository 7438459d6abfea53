"""Partial rollouts through `rlfarm train` (algo.max_staleness=1): the learner's new weights enter the engine's
generation in flight (its receive runs in the engine's "sync" thread), so samples span two versions; the step's
staleness still counts from its oldest token, and the synthetic length model (a speed-run setting) reaches the
engine from the config and is named in the summary and the closing line."""
from helpers import metrics_rows, read_summary, train


def test_weights_enter_the_generation_in_flight_and_the_metrics_show_it(tmp_path):
    # generation is the long stage (few samples, a long cap: per-step cost), so each update's weights arrive
    # while the next step is being generated
    out = train(tmp_path, "experiment=grpo_digits", "algo.max_staleness=1", "algo.max_updates=6",
                "algo.target_reward=null", "algo.prompts_per_step=4", "algo.group_size=4", "algo.max_new_tokens=160",
                "algo.synthetic_lengths={median_frac:0.4,p99_frac:1.0}", "logger=none")
    assert out.returncode == 0, out.stderr[-3000:]
    rows, summary = metrics_rows(tmp_path), read_summary(tmp_path)
    assert len(rows) == 6 and summary["partial_rollouts"] and summary["dropped_stale"] == 0
    assert summary["synthetic_lengths"] == {"median_frac": 0.4, "p99_frac": 1.0, "note": "speed-run setting"}
    assert "SPEED RUN: synthetic lengths" in out.stdout + out.stderr
    assert all(row["staleness"] <= 1 and row["version_span_max"] <= 1 for row in rows)  # k = 1 bounds both
    assert rows[0]["partial_ratio"] == 0  # the first step is generated before any update
    partial = [row["partial_ratio"] for row in rows[1:]]
    assert sum(ratio > 0 for ratio in partial) >= 3, partial  # weights did reach steps in flight
    assert all(row["token_staleness_mean"] < row["staleness"] or row["partial_ratio"] == 0 for row in rows[1:])
    assert max(row["response_len"] for row in rows) > 40  # the long-tail lengths, not the digit task's 5 tokens
