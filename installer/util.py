"""Small shared helpers (no heavy imports)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], text: str, mode: int | None = None) -> None:
    """Write text to path atomically (temp file in the same directory + rename).

    A path that exists but is not a regular file (/dev/stdout, a FIFO, /dev/null) is written in
    place: renaming over it would replace the device or pipe with a plain file.
    """
    target = Path(path)
    if target.exists() and not target.is_file():
        with open(target, "w", encoding="utf-8") as fh:
            fh.write(text)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        elif target.exists():
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_dir() -> Path:
    """Per-user cache for downloaded tools and built binaries (outside the repository)."""
    base = os.environ.get("GPU_INSTALL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpu-install"
    )
    return Path(base)


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
