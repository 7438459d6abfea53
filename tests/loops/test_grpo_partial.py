"""Partial rollouts through `rlfarm train` (algo.max_staleness=1): the learner's new weights enter the engine's
generation in flight (its receive runs in the engine's "sync" thread), so samples span two versions; the step's
staleness still counts from its oldest token, and the synthetic length model (a speed-run setting) reaches the
engine from the config and is named in the summary and the closing line."""
from helpers import metrics_rows, read_summary, train


def test_weights_enter_the_generation_in_flight_and_the_metrics_show_it(tmp_path):
    # generation is the long stage (few samples, a long tail to a long cap: the step lasts as long as its longest
    # sample, the update is as long as their mean), so each update's weights arrive while the next step is being
    # generated; under a loaded CI machine one step in three saw them arrive late with median 0.4 of a 160 cap:
    # median 0.1 of 400 and 7 chances left 6-7 steps partial with three copies of the test at once (2 cores)
    out = train(tmp_path, "experiment=grpo_digits", "algo.max_staleness=1", "algo.max_updates=8",
                "algo.target_reward=null", "algo.prompts_per_step=4", "algo.group_size=4", "algo.max_new_tokens=400",
                "algo.synthetic_lengths={median_frac:0.1,p99_frac:1.0}", "logger=none")
    assert out.returncode == 0, out.stderr[-3000:]
    rows, summary = metrics_rows(tmp_path), read_summary(tmp_path)
    assert len(rows) == 8 and summary["partial_rollouts"] and summary["dropped_stale"] == 0
    assert summary["synthetic_lengths"] == {"median_frac": 0.1, "p99_frac": 1.0, "note": "speed-run setting"}
    assert "SPEED RUN: synthetic lengths" in out.stdout + out.stderr
    assert all(row["staleness"] <= 1 and row["version_span_max"] <= 1 for row in rows)  # k = 1 bounds both
    assert rows[0]["partial_ratio"] == 0  # the first step is generated before any update
    partial = [row["partial_ratio"] for row in rows[1:]]
    assert sum(ratio > 0 for ratio in partial) >= 3, partial  # weights did reach steps in flight
    assert all(row["token_staleness_mean"] < row["staleness"] or row["partial_ratio"] == 0 for row in rows[1:])
    assert max(row["response_len"] for row in rows) > 40  # the long-tail lengths, not the digit task's 5 tokens
