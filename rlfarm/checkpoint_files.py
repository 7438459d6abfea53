"""Checkpoint files on disk, for every family: how a role writes one and how the driver trusts one.

Writing (`write_checkpoint`, by the role that saves): torch.save streams into a temp file while the bytes are
hashed (no second read), fsync, rename to the checkpoint's name; then `<name>.pt.sha256`, in `sha256sum` format
(so `cd checkpoints && sha256sum -c *.sha256` checks a run by hand), written the same way, last. A crash between
the two renames leaves a checkpoint without its sidecar, which the structural check below then covers.

Reading (`damage`, `newest_intact`, `check_intact`): with a sidecar, the file's sha256 must match it; without
one (runs written before sidecars, or that crash window), torch's zip archive must open and every record must
pass the CRC32 that torch wrote for it. Either way the file is read once, in the driver, before any role is
asked to load it; the role's own read then comes from the page cache. The cost per GiB is in
docs/benchmarks.md.

No Ray and no torch at import: the driver imports this module before anything starts.
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import zipfile
from pathlib import Path

from rlfarm.errors import RlfarmError

log = logging.getLogger("rlfarm")
SIDECAR_SUFFIX = ".sha256"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def sidecar(path: str | Path) -> Path:
    """`step_000000200.pt` → `step_000000200.pt.sha256`."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


# -- writing ---------------------------------------------------------------------------------------------
class _HashingWriter:
    """The file object torch.save writes to: every byte goes to the file and into the hash."""

    def __init__(self, file):
        self.file, self.sha256 = file, hashlib.sha256()

    def write(self, data) -> int:
        self.sha256.update(data)  # releases the GIL for large buffers, as the file write does
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def write_checkpoint(state: dict, path: str) -> str:
    """torch.save `state` to `path` so that `path` is always either absent, the previous file, or the whole new
    one, then record its sha256 next to it. Returns `path`."""
    import torch  # here, not at import: the driver only reads checkpoints

    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as file:
        hashing = _HashingWriter(file)
        torch.save(state, hashing)
        file.flush()
        os.fsync(file.fileno())
    sidecar(target).unlink(missing_ok=True)  # an older file's checksum must never sit next to the new file
    os.replace(tmp, target)
    _write_durably(sidecar(target), f"{hashing.sha256.hexdigest()}  {target.name}\n")
    _fsync_directory(target.parent)  # the renames themselves survive a power loss
    return path


def _write_durably(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def remove_checkpoint(path: str | Path) -> None:
    """Delete a checkpoint and its sidecar (retention)."""
    Path(path).unlink(missing_ok=True)
    sidecar(path).unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------------------------
def newest_first(directory: str | Path) -> list[Path]:
    """The checkpoints in `directory`, the one with the most updates first (final > preempted > step_N by
    mtime; the name breaks a tie)."""
    directory = Path(directory)
    found = directory.glob("*.pt") if directory.is_dir() else []
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)


def file_sha256(path: str | Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def damage(path: str | Path) -> str | None:
    """Why the checkpoint at `path` cannot be loaded (a few words), or None when it is intact."""
    try:
        recorded = _recorded_sha256(path)
        if recorded is None:  # an older run, or a crash before the sidecar landed
            return _zip_damage(path)
        if file_sha256(path) == recorded:
            return None
        return "sha256 mismatch" if _zip_directory_present(path) else "truncated: sha256 mismatch"
    except OSError as error:
        return f"unreadable: {error.strerror or error}"


def _recorded_sha256(path: str | Path) -> str | None:
    """The sha256 in the sidecar, or None when there is none (or it holds no hash: then the file is checked
    as if it had none, rather than condemned by a bad sidecar)."""
    try:
        words = sidecar(path).read_text().split()
    except FileNotFoundError:
        return None
    return words[0].lower() if words and _SHA256_HEX.fullmatch(words[0].lower()) else None


def _zip_damage(path: str | Path) -> str | None:
    """torch.save writes a zip archive with a CRC32 per record: it must open and every record must match."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return "truncated: no zip directory at its end"
    with archive:
        try:
            bad_record = archive.testzip()
        except (zipfile.BadZipFile, EOFError, ValueError, RuntimeError) as error:  # a damaged record header
            return f"unreadable: {error}"
    return f"bad record {bad_record} (CRC32 or header)" if bad_record else None


def _zip_directory_present(path: str | Path) -> bool:
    """Cheap (reads the end of the file only): does the archive still end with its directory?"""
    try:
        zipfile.ZipFile(path).close()
        return True
    except zipfile.BadZipFile:
        return False


def shown(path: Path) -> str:
    """`checkpoints/step_000000200.pt`: the name as a user finds it in the run directory."""
    return f"{path.parent.name}/{path.name}"


def newest_intact(directory: str | Path, doing: str, fix: str) -> Path | None:
    """The newest intact checkpoint in `directory`, or None when it holds no checkpoint at all. Each newer
    damaged one is named in a warning line ("... is damaged (why): skipped, <doing> <chosen>"); when every one is
    damaged, RlfarmError names them and `fix`. Verification stops at the first intact one."""
    skipped: list[tuple[Path, str]] = []
    for path in newest_first(directory):
        reason = damage(path)
        if reason is None:
            for bad, why in skipped:
                log.warning("%s is damaged (%s): skipped, %s %s", shown(bad), why, doing, shown(path))
            return path
        skipped.append((path, reason))
    if skipped:
        damaged = "; ".join(f"{shown(bad)} ({why})" for bad, why in skipped)
        raise RlfarmError(f"no intact checkpoint in {Path(directory).parent}: {damaged}", fix)
    return None


def check_intact(path: Path, fix: str) -> Path:
    """`path`, or RlfarmError naming why it is damaged (a checkpoint the user picked by name)."""
    reason = damage(path)
    if reason is not None:
        raise RlfarmError(f"{path} is damaged ({reason})", fix)
    return path
