"""`rlfarm bench sync`: broadcast (gloo between two processes on CPU), in place and host copies, each next to
a raw copy of the same bytes."""
import json

from helpers import rlfarm


def test_bench_sync_on_cpu_writes_every_transport_next_to_a_raw_copy(tmp_path):
    out = rlfarm("bench", "sync", "device=cpu", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "bench.json").read_text())
    rows = {row["case"]: row for row in result["rows"]}
    assert set(rows) == {"raw copy cpu→cpu", "broadcast (gloo)", "object store (host copies)", "in place (colocated)"}
    state_bytes = rows["raw copy cpu→cpu"]["bytes"]
    assert state_bytes > 0 and all(row["bytes"] == state_bytes for row in rows.values())
    assert rows["broadcast (gloo)"]["buckets"] > 1  # tiny buckets: the double-buffered path ran
    for case in ("broadcast (gloo)", "object store (host copies)", "in place (colocated)"):
        assert rows[case]["baseline"] == "raw copy cpu→cpu" and rows[case]["ratio"] > 0 and rows[case]["ms"] > 0
