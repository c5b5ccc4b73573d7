"""The private copy `mirror push` works from: every bundle file is read ONCE, copied while it is hashed into a fresh
0700 directory outside the bundle, compared with the signed lock, and only that copy is used from then on.

The bundle directory may be writable by someone who holds no signing key (a transfer share, a USB disk). A check of
a file by name followed by a second open of the same name lets such a writer swap the file in between: the check
sees the signed bytes, the use sees the writer's. Here the file is opened once (O_NOFOLLOW: a symlink is refused,
O_NONBLOCK: a FIFO cannot block the open; fstat: a regular file of the size the lock gives), its bytes are written to
the staging directory while they are hashed, and the digest of what was READ is compared with the lock's. What the
bundle holds afterwards no longer matters: packages, keys, the runfile, the chart and the image blobs are published
or pushed from the staged copy.

The staging directory is created with tempfile.mkdtemp (0700, a new name) under --staging-dir DIR, env
GPU_INSTALL_STAGING_DIR, else the system's temporary directory; it is removed when push ends, however it ends (an
error, Ctrl-C). It needs as much free space as the bundle's images, charts, files and packages take; too little is
EnvironmentProblem (exit 8) naming the directory, the bytes free there and the bytes needed, before anything is copied.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from installer.errors import ConfigError
from installer.mirror.common import HINT_DAMAGED, DiskFull, disk_full, inside_bundle

ENV = "GPU_INSTALL_STAGING_DIR"
CHUNK = 1 << 20

# Called with (the bundle's path, the staged copy) right after a file was staged and its digest matched: the point
# where a writer of the bundle directory would swap the file. None in normal runs; the tests set it.
after_check: Callable[[Path, Path], None] | None = None


class Mismatch(ValueError):
    """The bundle file cannot be staged as the lock names it. kind: "type" (missing, not a regular file), "size" (not
    the size the lock gives, or over the bound) or "digest" (other bytes); the message says what, without the file's
    name."""

    def __init__(self, kind: str, message: str, got: str = ""):
        super().__init__(message)
        self.kind = kind
        self.got = got


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, from its st_mode: how a refusal names it."""
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def copy_verified(src: Path, dest: Path, *, sha256: str, size: int | None = None, limit: int | None = None) -> None:
    """src copied to dest (created new, 0600) while it is hashed, src opened once: O_NOFOLLOW (a symlink is refused,
    not followed), O_NONBLOCK (a FIFO cannot block), fstat a regular file; of exactly size bytes when size is given,
    else at most limit (None: unbounded but the file system's space). The hex sha256 of the bytes READ must be sha256.
    Raises Mismatch (dest removed) otherwise; DiskFull (exit 8) when the staging file system fills up."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Mismatch("type", "a symbolic link, not a regular file") from None
        raise Mismatch("type", f"missing or unreadable ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Mismatch("type", f"{file_kind(st.st_mode)}, not a regular file")
        if size is not None and st.st_size != size:
            raise Mismatch("size", f"{st.st_size} bytes, the lock says {size}")
        bound = size if size is not None else limit
        if bound is not None and st.st_size > bound:
            raise Mismatch("size", f"{st.st_size} bytes, more than the {bound} it may have")
        os.set_blocking(fd, True)
        h = hashlib.sha256()
        total = 0
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(out, "wb") as fh:
                while True:
                    want = CHUNK if bound is None else min(CHUNK, bound + 1 - total)
                    chunk = os.read(fd, want) if want > 0 else b""
                    if not chunk:
                        break
                    total += len(chunk)
                    if bound is not None and total > bound:
                        raise Mismatch("size", f"grew past the {bound} bytes it may have while it was read")
                    h.update(chunk)
                    fh.write(chunk)
        except OSError as exc:
            dest.unlink(missing_ok=True)
            if exc.errno == errno.ENOSPC:
                raise disk_full(dest.parent, None, "the bundle's files") from None
            raise
        except BaseException:
            dest.unlink(missing_ok=True)
            raise
        if size is not None and total != size:
            dest.unlink(missing_ok=True)
            raise Mismatch("size", f"{total} bytes read, the lock says {size}")
        if h.hexdigest() != sha256:
            dest.unlink(missing_ok=True)
            raise Mismatch("digest", f"sha256 {h.hexdigest()}", got=h.hexdigest())
    finally:
        os.close(fd)
    if after_check is not None:
        after_check(src, dest)


class Staging:
    """A private staging directory (see the module): take() stages a bundle file the lock names, blob() an image
    blob; reserve() checks the free space first."""

    def __init__(self, path: Path):
        self.path = path
        self._taken: dict[str, str] = {}

    def reserve(self, need: int) -> None:
        """DiskFull (exit 8) naming the staging directory, the bytes free there and need, when need does not fit."""
        free = shutil.disk_usage(self.path).free
        if need > free:
            raise DiskFull(f"{self.path}: the staging directory has {free} bytes free, push needs {need} bytes "
                           f"({need / 2**20:.1f} MiB) to copy the bundle's files there before it uses them",
                           hint="give --staging-dir DIR (or GPU_INSTALL_STAGING_DIR) on a file system with that much "
                                "space free, or free space there; nothing was pushed or published")

    def take(self, bundle: Path, rel: Any, sha256: Any, size: Any, what: str) -> Path:
        """The staged copy of bundle/rel (a path inside the bundle, inside_bundle), whose bytes hash to sha256 and
        number size (an int > 0 from the lock; otherwise unbounded but the space): staged once, the same path again
        for the same rel. ConfigError (exit 2) naming the file otherwise; nothing of it stays staged then."""
        path = inside_bundle(bundle, rel, what)
        text = str(rel)
        if text in self._taken:
            if self._taken[text] != sha256:
                raise ConfigError(f"{bundle}: {text} is named twice in the lock with different sha256",
                                  hint=HINT_DAMAGED)
            return self.path / "files" / text
        dest = self.path / "files" / text
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        want = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None
        try:
            copy_verified(path, dest, sha256=str(sha256), size=want)
        except Mismatch as exc:
            if exc.kind == "type":
                raise ConfigError(f"{bundle}: {text} is missing or not a regular file ({exc})",
                                  hint=HINT_DAMAGED) from None
            if exc.kind == "digest":
                raise ConfigError(f"{bundle}: {text}: sha256 {exc.got}, the lock says {sha256}",
                                  hint=HINT_DAMAGED) from None
            raise ConfigError(f"{bundle}: {text}: {exc}", hint=HINT_DAMAGED) from None
        self._taken[text] = str(sha256)
        return dest


def default_base() -> Path:
    """Where staging directories are made: GPU_INSTALL_STAGING_DIR, else the system's temporary directory."""
    return Path(os.environ.get(ENV) or tempfile.gettempdir())


@contextlib.contextmanager
def staging(base: Path | None = None, bundle: Path | None = None) -> Iterator[Staging]:
    """A fresh 0700 staging directory under base (default_base()), removed when the block ends, whatever ends it
    (an exception, KeyboardInterrupt). ConfigError (exit 2) when base does not exist, is not a directory, or lies
    inside the bundle (the bundle's writer could reach the staged copies there)."""
    base = Path(base) if base is not None else default_base()
    if not base.is_dir():
        raise ConfigError(f"staging directory {base}: not an existing directory",
                          hint="give --staging-dir (or GPU_INSTALL_STAGING_DIR) an existing directory, e.g. /var/tmp")
    if bundle is not None:
        real, root = os.path.realpath(base), os.path.realpath(bundle)
        if os.path.commonpath([real, root]) == root:
            raise ConfigError(f"staging directory {base}: inside the bundle {bundle}",
                              hint="give --staging-dir a directory outside the bundle (only this user may write there)")
    try:
        path = Path(tempfile.mkdtemp(prefix="gpu-install-staging-", dir=base))
    except OSError as exc:
        raise ConfigError(f"staging directory {base}: cannot create a directory there ({exc.strerror})",
                          hint="give --staging-dir (or GPU_INSTALL_STAGING_DIR) a directory this user can write") \
            from None
    try:
        yield Staging(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)
