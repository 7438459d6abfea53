"""Damaged checkpoints (rlfarm/checkpoint_files.py): every checkpoint is written with a sha256 sidecar; a resume or
an eval verifies before loading, falls back to the newest intact one with a warning line naming what it skipped,
and fails with one plain line when none is intact. Older runs without sidecars get a structural check instead."""
import contextlib
import logging
import os
import time
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from helpers import one_line_error, rlfarm
from rlfarm.checkpoint_files import damage, newest_intact, sidecar, write_checkpoint
from rlfarm.errors import RlfarmError
from rlfarm.loops.checkpoints import PeriodicCheckpoints

# The resume of a real run whose newest checkpoint is truncated: tests/loops/test_resume.py (the SIGKILL test).


def state(updates: int) -> dict:
    return {"agent": {"actor": {"weight": torch.full((64, 64), float(updates))}}, "updates": updates}


def truncate(path) -> None:
    with same_mtime(path):
        os.truncate(path, os.path.getsize(path) // 2)


def flip_a_bit(path, offset: int = 200) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    with same_mtime(path):
        path.write_bytes(bytes(data))


@contextlib.contextmanager
def same_mtime(path):
    """Damage as a disk or a partial copy does it: the checkpoints keep their order (newest = latest mtime)."""
    times = os.stat(path)
    yield
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))


def checkpoints_written(directory, *updates) -> list:
    """step_N.pt for each N, oldest first, with increasing mtimes."""
    directory.mkdir(exist_ok=True)
    paths = []
    for i, n in enumerate(updates):
        path = directory / f"step_{n:09d}.pt"
        write_checkpoint(state(n), str(path))
        os.utime(path, (time.time() + i, time.time() + i))  # the order does not hang on the clock's resolution
        paths.append(path)
    return paths


# -- the helper, on real torch.save files ---------------------------------------------------------------------
def test_a_checkpoint_is_written_whole_with_its_sha256_in_sha256sum_format(tmp_path):
    (path,) = checkpoints_written(tmp_path, 7)
    digest, name = sidecar(path).read_text().split()
    assert name == path.name and len(digest) == 64
    assert torch.load(path, weights_only=True)["updates"] == 7
    assert damage(path) is None
    write_checkpoint(state(8), str(path))  # the same name again (final.pt of a resumed run): a fresh sidecar
    assert damage(path) is None and sidecar(path).read_text().split()[0] != digest
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name, sidecar(path).name]  # no temp file left


@pytest.mark.parametrize("with_sidecar", [True, False], ids=["sidecar", "older run: no sidecar"])
@pytest.mark.parametrize("harm, reason", [(truncate, "truncated"), (flip_a_bit, "")], ids=["truncated", "bit flip"])
def test_damage_is_found_with_or_without_a_sidecar(tmp_path, with_sidecar, harm, reason):
    (path,) = checkpoints_written(tmp_path, 1)
    if not with_sidecar:
        sidecar(path).unlink()
    assert damage(path) is None
    harm(path)
    found = damage(path)
    assert found is not None and reason in found
    assert ("sha256 mismatch" in found) == with_sidecar


def test_a_plain_torch_save_file_and_a_meaningless_sidecar_get_the_structural_check(tmp_path):
    path = tmp_path / "final.pt"
    torch.save(state(3), path)  # as runs wrote them before sidecars
    assert damage(path) is None
    sidecar(path).write_text("not a hash\n")
    assert damage(path) is None
    truncate(path)
    assert damage(path).startswith("truncated")


def test_the_newest_intact_checkpoint_wins_and_each_skipped_one_is_named(tmp_path, caplog):
    directory = tmp_path / "checkpoints"
    oldest, previous, newest = checkpoints_written(directory, 100, 200, 300)
    truncate(newest)
    flip_a_bit(oldest)  # older than the one chosen: never read, never mentioned
    with caplog.at_level(logging.WARNING, logger="rlfarm"):
        assert newest_intact(directory, "resuming from", "fix it") == previous
    assert caplog.messages == [f"checkpoints/{newest.name} is damaged (truncated: sha256 mismatch): skipped, "
                               f"resuming from checkpoints/{previous.name}"]


def test_no_intact_checkpoint_is_one_line_naming_the_run_and_the_fix(tmp_path):
    directory = tmp_path / "checkpoints"
    assert newest_intact(directory, "resuming from", "fix it") is None  # no checkpoint at all: nothing to verify
    for path in checkpoints_written(directory, 100, 200):
        truncate(path)
    with pytest.raises(RlfarmError) as error:
        newest_intact(directory, "resuming from", "start a new run")
    assert str(error.value).startswith(f"no intact checkpoint in {tmp_path}: checkpoints/step_000000200.pt (trunc")
    assert str(error.value).endswith("start a new run") and "\n" not in str(error.value)


class Loop(PeriodicCheckpoints):
    """A loop whose learner writes real checkpoints, for retention."""

    def __init__(self, tmp_path):
        self.cfg = OmegaConf.create({"run": {"checkpoint_every_updates": 1, "checkpoint_every_min": None}})
        self.run = SimpleNamespace(dir=tmp_path, checkpoint_dir=tmp_path / "checkpoints")
        self.run.checkpoint_dir.mkdir()
        self._start_checkpoints()

    def checkpoint(self, name="final.pt"):
        return write_checkpoint(state(0), str(self.run.checkpoint_dir / name))


def test_retention_deletes_a_checkpoint_with_its_sidecar(tmp_path):
    loop = Loop(tmp_path)
    for updates in range(1, 5):
        loop._maybe_checkpoint(updates)
    assert sorted(p.name for p in loop.run.checkpoint_dir.iterdir()) == [
        "step_000000003.pt", "step_000000003.pt.sha256", "step_000000004.pt", "step_000000004.pt.sha256"]


# -- eval and resume --------------------------------------------------------------------------------------
def run_dir_with(tmp_path, *updates):
    """What resume= and eval read before loading anything: config.yaml and checkpoints/ (step_N.pt, oldest first)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("{}\n")
    return run_dir, checkpoints_written(run_dir / "checkpoints", *updates)


def test_eval_latest_skips_a_damaged_newest_checkpoint_and_a_damaged_named_one_is_one_line(tmp_path, caplog):
    from rlfarm.commands.eval import verified_checkpoint

    run_dir, (previous, newest) = run_dir_with(tmp_path, 100, 200)
    flip_a_bit(newest, offset=os.path.getsize(newest) // 2)
    with caplog.at_level(logging.WARNING, logger="rlfarm"):
        assert verified_checkpoint(OmegaConf.create({"run_dir": str(run_dir), "checkpoint": "latest"})) == previous.name
    assert caplog.messages == [f"checkpoints/{newest.name} is damaged (sha256 mismatch): skipped, "
                               f"evaluating checkpoints/{previous.name}"]
    with pytest.raises(RlfarmError, match=f"{newest.name} is damaged .sha256 mismatch. — pick another checkpoint"):
        verified_checkpoint(OmegaConf.create({"run_dir": str(run_dir), "checkpoint": newest.name}))


def test_resume_with_every_checkpoint_damaged_is_one_line_and_exit_2(tmp_path):
    run_dir, checkpoints = run_dir_with(tmp_path, 100, 200)
    for path in checkpoints:
        truncate(path)
    line = one_line_error(rlfarm("train", f"resume={run_dir}", "run.live=false"))
    assert f"no intact checkpoint in {run_dir}: checkpoints/step_000000200.pt (truncated" in line
    assert "start a new run" in line
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.pt")) == [p.name for p in checkpoints]  # kept
