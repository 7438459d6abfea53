"""metrics.jsonl across a resume (rlfarm/telemetry/metrics.py): rows past the checkpoint are dropped, and the state
the stopped run logged last (the checkpoint's) is not logged again by the resumed run."""
import json

from rlfarm.telemetry.metrics import MetricsLogger


def test_a_resume_drops_the_rows_past_the_checkpoint_and_does_not_repeat_its_last_row(tmp_path):
    stopped = MetricsLogger(tmp_path)
    for steps, updates in ((100, 1), (200, 5), (300, 9), (400, 12)):
        stopped.log({"env_steps": steps, "updates": updates})
    stopped.close()
    resumed = MetricsLogger(tmp_path)
    resumed.truncate(after_step=300)  # the checkpoint was taken at 300 env steps, 9 updates
    for steps, updates in ((300, 9), (300, 9), (300, 10), (300, 10), (420, 12)):
        resumed.log({"env_steps": steps, "updates": updates})
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["env_steps"], r["updates"]) for r in rows] == [(100, 1), (200, 5), (300, 9), (300, 10), (300, 10),
                                                              (420, 12)]  # later repeats are the run's own
