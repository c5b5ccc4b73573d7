"""The bundle's lock, bundle.lock.json (SCHEMA), and its checksum file: what `mirror pull` wrote, for push and verify.

One lock per bundle directory, with a section per artifact kind: "images" (installer.mirror.images), and the sections
the other kinds add through put_section ("charts", "files", "packages"). Failures of every kind share the "failed" list,
each entry with its "kind" (an entry without one is an image's). Only the orchestrating command (`mirror pull`) marks
a bundle complete, with finish(), after every kind it planned has run: a pull killed between two kinds leaves the
bundle incomplete, which push refuses. Every write rewrites the lock and then its checksum, each atomically.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, GpuInstallError
from installer.util import atomic_write

SCHEMA = "gpu-install.bundle-lock/v1"
LOCK = "bundle.lock.json"
CHECKSUM = LOCK + ".sha256"
IMAGE = "image"


def lock_text(lock: Mapping[str, Any]) -> str:
    return json.dumps(lock, indent=2, sort_keys=False) + "\n"


def write_lock(bundle: Path, lock: Mapping[str, Any]) -> None:
    """The lock and its checksum file (sha256sum format), each written atomically; checksum last."""
    text = lock_text(lock)
    atomic_write(bundle / LOCK, text)
    atomic_write(bundle / CHECKSUM, f"{hashlib.sha256(text.encode()).hexdigest()}  {LOCK}\n")


def read_lock(bundle: Path, *, verify: bool = True) -> dict[str, Any]:
    """The bundle's lock; with verify its checksum must match (ConfigError, exit 2, naming the problem)."""
    lock_path, sum_path = bundle / LOCK, bundle / CHECKSUM
    hint = "pull the bundle again (gpu-install mirror pull) and carry the whole directory across"
    try:
        raw = lock_path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{lock_path}: cannot read the bundle lock ({exc.strerror})", hint=hint) from None
    if verify:
        try:
            want = sum_path.read_text().split()[0].lower()
        except (OSError, IndexError):
            raise ConfigError(f"{sum_path}: the lock's checksum file is missing or empty", hint=hint) from None
        got = hashlib.sha256(raw).hexdigest()
        if got != want:
            raise ConfigError(f"{lock_path}: checksum mismatch (sha256 {got}, {CHECKSUM} says {want}): the lock was "
                              "changed after pull", hint=hint)
    try:
        lock = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{lock_path}: not valid JSON", hint=hint) from None
    if not isinstance(lock, dict) or lock.get("schema") != SCHEMA:
        raise ConfigError(f"{lock_path}: not a {SCHEMA} lock", hint=hint)
    return lock


def catalog_record(plan: Any) -> dict[str, Any]:
    """The catalog file the release was resolved from: name and sha256 (which pins every image of the release)."""
    path = Path(plan.release.catalog_dir) / f"{plan.release.version}.yaml"
    record: dict[str, Any] = {"release": plan.release.version, "file": path.name}
    with contextlib.suppress(OSError):
        record["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return record



def bundle_for_push(bundle: Path) -> dict[str, Any]:
    """The verified lock of a complete bundle (exit 2 naming the problem otherwise)."""
    lock = read_lock(bundle, verify=True)
    if lock.get("complete") is not True:
        failed = [str(f.get("source") or f.get("ref")) for f in lock.get("failed") or [] if isinstance(f, dict)]
        raise ConfigError(f"{bundle}: the bundle is incomplete" + (f" (failed: {', '.join(failed)})" if failed else ""),
                          hint="run gpu-install mirror pull again on the connected side until it exits 0")
    images = lock.get("images")
    if not isinstance(images, list):
        raise ConfigError(f"{bundle / LOCK}: no image list")
    return lock


def load_for_update(bundle: Path) -> dict[str, Any]:
    """The bundle's lock for a pull to resume from: verified by its checksum, else -- a pull killed between writing
    the lock and its checksum -- the lock as it reads (pull reuses an entry only after checking the layout holds that
    image whole, and a chart or file only after hashing it); {} for a new bundle or one whose lock cannot be read."""
    with contextlib.suppress(GpuInstallError):
        return read_lock(bundle, verify=True)
    with contextlib.suppress(GpuInstallError):
        return read_lock(bundle, verify=False)
    return {}


def put_section(bundle: Path, kind: str, section: str, entries: Sequence[Mapping[str, Any]],
                failed: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Replace the lock's section (a list of entries) and the failures of kind with these; marks the bundle
    incomplete until finish(). The lock must exist (the images' pull writes its header first)."""
    lock = read_lock(bundle, verify=True)
    lock[section] = [dict(e) for e in entries]
    lock["failed"] = [f for f in lock.get("failed") or [] if isinstance(f, dict) and f.get("kind", IMAGE) != kind]
    lock["failed"] += [{"kind": kind, **f} for f in failed]
    lock["complete"] = False
    write_lock(bundle, lock)
    return lock


def finish(bundle: Path) -> dict[str, Any]:
    """Mark the bundle complete when no artifact of any kind failed (else incomplete); the lock, as written."""
    lock = read_lock(bundle, verify=True)
    lock["complete"] = not lock.get("failed")
    write_lock(bundle, lock)
    return lock
