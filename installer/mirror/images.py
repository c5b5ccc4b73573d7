"""`mirror pull` / `mirror push` for images: skopeo does the transfers, this module orchestrates, verifies and records.

pull: every image of the artifact plan (exactly Plan.images) from its upstream -- or from the mirror that site
`mirror.upstream` names for that registry -- into ONE OCI image layout, DIR/images (a blob shared by several images is
stored once), one reference name per image (its canonical source reference). Manifests are copied byte for byte
(`skopeo copy --preserve-digests`): with `--platform linux/amd64` (default) the instance of that platform (the
single-platform manifest an amd64 node pulls), with `--all-platforms` the manifest list / index as published. The
result is recorded in DIR/bundle.lock.json (SCHEMA) as it goes, with the checksum DIR/bundle.lock.json.sha256 over it.
A re-run skips what the lock and the layout already hold; a failed image is named with skopeo's message and leaves
the bundle marked incomplete, which push refuses. `jobs` images are copied at a time (one skopeo process each); each
pull writes its own index.json (skopeo's oci: destination does not lock it) next to the shared blob store, and one
thread merges the entries and writes the lock, after each image: a pull killed mid-way keeps every finished image
and every complete blob, and the next run copies neither again. A full disk (skopeo's write or ours) ends the pull
with DiskFull (exit 8) naming the bundle, the bytes free and the bytes the images not pulled yet need (their upstream
manifests' blob sizes less the blobs the bundle holds); the lock on disk is the last one written whole.

push: the lock (signed, installer.mirror.bundle) is untrusted input all the same: every entry is checked against the
site first (check_images: the source an image of the site's plan, the destination the one the site computes for it;
the layout inside the bundle; every blob a regular file matching its digest, manifests bounded and hashed before they
are parsed), then every image goes from the layout to its recomputed destination in registry.host, digests preserved
and checked after the copy (`skopeo inspect --raw`); an image whose destination already has the lock's digest is
skipped; once the registry stops answering (connection refused, no route), the images not started yet are named as
not tried instead of each retrying against it. Credentials come from registry.pullSecret (env vars or docker config file) through a temporary
0600 authfile, never on a command line; the site CA (registry.ca) through a temporary cert dir.

Before the first image is pushed, every blob of every image is read ONCE from the bundle and copied, while it is
hashed, into a private staging directory outside the bundle (installer.mirror.staging; stage()): manifests and indexes
bounded and parsed only from the staged copy, configs and layers of exactly the size their manifest gives. A blob that
does not match its digest stops push with exit 2 before anything reached the registry; skopeo reads only the staged
copy, so a file of the bundle swapped after its check is never pushed.

skopeo 1.9 reads only OCI-typed manifests back from an OCI layout; push therefore hands skopeo each image as a
`dir:` directory made of hard links into the STAGED layout (any manifest type; both lie in the private staging
directory, nothing there is the bundle's).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from installer.errors import ConfigError, PreflightError
from installer.mirror import staging
from installer.mirror.bundle import IMAGE, SCHEMA, bundle_for_push, catalog_record, load_for_update, write_lock
from installer.mirror.common import ALL_PLATFORMS as ALL_PLATFORMS
from installer.mirror.common import DEFAULT_JOBS as DEFAULT_JOBS
from installer.mirror.common import DEFAULT_PLATFORM as DEFAULT_PLATFORM
from installer.mirror.common import (
    NO_SPACE,
    cert_dir,
    copy_argv,
    disk_full,
    inside_bundle,
    manifest_digest,
    raw_manifest,
    read_since,
    run_skopeo,
)
from installer.mirror.common import TransferFailures as TransferFailures
from installer.mirror.common import authfile as authfile
from installer.mirror.common import secrets_of as secrets_of
from installer.mirror.lock import DIGEST, LAYOUT, BaseEntry, FailedImage, ImageEntry
from installer.mirror.lock import check_images as check_images
from installer.mirror.lock import expected_destination as expected_destination
from installer.mirror.lock import planned_sources as planned_sources
from installer.mirror.lock import ref_name as ref_name
from installer.mirror.registry import Wanted, check

if TYPE_CHECKING:
    from installer.config import Site
    from installer.mirror.plan import ImageArtifact
    from installer.plan import Plan

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
REF_NAME = "org.opencontainers.image.ref.name"
MAX_JSON = 4 << 20  # bytes: the largest manifest, index or index.json a layout may hold (real ones: a few KiB)
MAX_DEPTH = 8  # indexes nested in indexes: real images have 1 or 2 levels
# skopeo's message when the registry does not answer at all (Go's net errors): push tries no further image after one
UNREACHABLE = re.compile(r"connection refused|no route to host|no such host|network is unreachable")


@dataclass(frozen=True)
class Event:
    """Progress of one image: kind is start | copied | skipped | failed | verified."""

    kind: str
    index: int
    total: int
    ref: str
    detail: str = ""


Progress = Callable[[Event], None]


@dataclass
class Outcome:
    copied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- references


def split_registry(ref: str) -> tuple[str, str]:
    """(registry, rest) of an image reference as docker reads it: the first component names a registry when it has a
    '.' or ':' or is localhost; otherwise the image is on docker.io (a single name under library/)."""
    first, slash, rest = ref.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return "docker.io", ref if slash else f"library/{ref}"


def pull_from(source: str, upstream: Mapping[str, str]) -> str:
    """Where `mirror pull` reads source: the mirror site `mirror.upstream` gives for its registry, else itself."""
    registry, rest = split_registry(source)
    mirror = upstream.get(registry.lower())
    return f"{mirror}/{rest}" if mirror else source


def platform_digest(raw: bytes, platform: str) -> tuple[str | None, str]:
    """The digest skopeo copies of this manifest for platform (ALL_PLATFORMS: the manifest itself; a list/index:
    its entry for OS/ARCH[/VARIANT]); (None, why) when the list has no such entry."""
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    try:
        doc = json.loads(raw)
    except ValueError:
        return None, "the manifest is not JSON"
    if platform == ALL_PLATFORMS or not isinstance(doc, dict) or not (
            doc.get("mediaType") in INDEX_TYPES or "manifests" in doc):
        return digest, ""
    os_, _, arch = platform.partition("/")
    arch, _, variant = arch.partition("/")
    for m in doc.get("manifests") or []:
        p = m.get("platform") or {} if isinstance(m, dict) else {}
        if p.get("os") == os_ and p.get("architecture") == arch and (not variant or p.get("variant") == variant):
            return str(m.get("digest")), ""
    return None, f"the manifest list has no {platform} image; pull with --platform of one it has or --all-platforms"


# ---------------------------------------------------------------- the layout


class LayoutError(ValueError):
    """A blob or index of an OCI layout that cannot be used: missing, not a regular file, too large, not matching its
    digest, not the JSON it must be, a cycle. The message names the blob and what is wrong."""


def _lstat_regular(path: Path, what: str) -> os.stat_result:
    """lstat of path, which must be a regular file (a symlink, FIFO or device is refused without being opened);
    LayoutError naming what otherwise."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise LayoutError(f"{what}: missing or unreadable ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise LayoutError(f"{what}: {staging.file_kind(st.st_mode)}, not a regular file")
    return st


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of path, which must be a regular file (lstat: a symlink, FIFO or device is refused without being
    opened) of at most limit bytes; LayoutError naming what otherwise. Opened O_NOFOLLOW|O_NONBLOCK and checked again
    on the descriptor, so a file swapped for a FIFO in between cannot block the read."""
    st = _lstat_regular(path, what)
    if st.st_size > limit:
        raise LayoutError(f"{what}: {st.st_size} bytes, more than the {limit} a manifest or index may have")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise LayoutError(f"{what}: cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LayoutError(f"{what}: not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise LayoutError(f"{what}: more than the {limit} bytes a manifest or index may have")
    return data


def _descriptor(d: Any, where: str) -> tuple[str, int | None]:
    """(digest, size) of an OCI descriptor read from a manifest; LayoutError when it is not one."""
    if not isinstance(d, dict) or not isinstance(d.get("digest"), str):
        raise LayoutError(f"{where}: a descriptor without a digest")
    digest = d["digest"]
    if not DIGEST.fullmatch(digest):
        raise LayoutError(f"{where}: {digest[:80]!r} is not a sha256 digest")
    size = d.get("size")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
        raise LayoutError(f"{where}: descriptor {digest} has size {size!r}")
    return digest, size


def _enter(digest: str, path: tuple[str, ...]) -> None:
    """A walk of a layout's indexes entering digest from path (the indexes above it): LayoutError on a cycle (an
    index that lists itself, through any depth) or nesting deeper than MAX_DEPTH."""
    if digest in path:
        raise LayoutError(f"blob {digest}: an index that lists itself (through {' -> '.join((*path, digest))})")
    if len(path) >= MAX_DEPTH:
        raise LayoutError(f"blob {digest}: indexes nested more than {MAX_DEPTH} deep ({' -> '.join(path)})")


class Layout:
    """An OCI image layout directory (index.json, blobs/sha256/…).

    root: the directory every blob must resolve inside (push: the bundle); a blob whose real path leads elsewhere
    (a symlinked blobs/ directory, a symlinked blob) is refused. Manifests and indexes are read only from regular
    files of at most MAX_JSON bytes, their sha256 checked before they are parsed; the traversal of indexes is bounded
    (MAX_DEPTH) and an index that lists itself or an ancestor is an error."""

    def __init__(self, path: Path, root: Path | None = None):
        self.path = path
        self.root = root

    def blob(self, digest: str) -> Path:
        algo, _, hexpart = digest.partition(":")
        if algo != "sha256" or not re.fullmatch(r"[a-f0-9]{64}", hexpart):
            raise LayoutError(f"not a sha256 digest: {digest[:80]!r}")
        path = self.path / "blobs" / "sha256" / hexpart
        if self.root is not None:
            real, root = os.path.realpath(path), os.path.realpath(self.root)
            if os.path.commonpath([real, root]) != root:
                raise LayoutError(f"blob {digest}: leads outside the bundle (to {real})")
        return path

    def _regular(self, digest: str) -> os.stat_result:
        """lstat of the blob, which must be a regular file (LayoutError naming it otherwise)."""
        return _lstat_regular(self.blob(digest), f"blob {digest}")

    def read_index(self) -> list[dict[str, Any]]:
        """index.json's manifest descriptors; LayoutError when it is missing, not a regular file, too large or not
        an OCI index."""
        data = read_regular(self.path / "index.json", MAX_JSON, f"{self.path / 'index.json'}")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise LayoutError(f"{self.path / 'index.json'}: not valid JSON") from None
        manifests = doc.get("manifests") if isinstance(doc, dict) else None
        if not isinstance(manifests, list):
            raise LayoutError(f"{self.path / 'index.json'}: not an OCI index (no manifests list)")
        return [m for m in manifests if isinstance(m, dict)]

    def index(self) -> list[dict[str, Any]]:
        try:
            return self.read_index()
        except LayoutError:
            return []

    def digest_of(self, name: str) -> str | None:
        for m in self.index():
            if (m.get("annotations") or {}).get(REF_NAME) == name:
                return str(m.get("digest"))
        return None

    def descriptor(self, name: str) -> dict[str, Any] | None:
        for m in self.index():
            if (m.get("annotations") or {}).get(REF_NAME) == name:
                return m
        return None

    def _json(self, digest: str) -> dict[str, Any]:
        """The manifest or index stored as digest: a regular file of at most MAX_JSON bytes, whose sha256 is checked
        BEFORE it is parsed; a JSON object."""
        data = read_regular(self.blob(digest), MAX_JSON, f"blob {digest}")
        if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise LayoutError(f"blob {digest} does not match its digest")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            raise LayoutError(f"blob {digest}: not valid JSON (a manifest or index was expected)") from None
        if not isinstance(doc, dict):
            raise LayoutError(f"blob {digest}: not a JSON object (a manifest or index was expected)")
        return doc

    @staticmethod
    def _is_index(doc: Mapping[str, Any]) -> bool:
        return doc.get("mediaType") in INDEX_TYPES or "manifests" in doc

    def _children(self, digest: str, doc: Mapping[str, Any]) -> tuple[list[str], list[tuple[str, int | None]]]:
        """(manifests an index lists, blobs (digest, size) a manifest references), checked for shape."""
        where = f"blob {digest}"
        if self._is_index(doc):
            manifests = doc.get("manifests")
            if not isinstance(manifests, list):
                raise LayoutError(f"{where}: an index whose manifests is not a list")
            return [_descriptor(m, where)[0] for m in manifests], []
        config, layers = doc.get("config"), doc.get("layers")
        if config is not None and not isinstance(config, dict):
            raise LayoutError(f"{where}: config is not a descriptor")
        if layers is not None and not isinstance(layers, list):
            raise LayoutError(f"{where}: layers is not a list")
        blobs = [_descriptor(d, where) for d in [*([config] if config and config.get("digest") else []),
                                                 *(layers or [])]]
        return [], blobs

    def closure(self, digest: str) -> dict[str, int]:
        """Every blob the manifest (or manifest list) digest references, itself included: {digest: size}.
        Raises LayoutError (a ValueError) naming the blob that is missing, not a regular file, of another size than
        its descriptor says, not matching its digest, or an index cycle or nesting deeper than MAX_DEPTH."""
        out: dict[str, int] = {}
        done: set[str] = set()

        def walk(d: str, path: tuple[str, ...]) -> None:
            _enter(d, path)
            if d in done:
                return
            doc = self._json(d)
            out[d] = self._regular(d).st_size
            manifests, blobs = self._children(d, doc)
            for m in manifests:
                walk(m, (*path, d))
            for b, size in blobs:
                have = self._regular(b).st_size
                if size is not None and have != size:
                    raise LayoutError(f"blob {b} does not match its digest ({have} bytes, manifest {d} says {size})")
                out[b] = have
            done.add(d)

        walk(digest, ())
        return out

    def complete(self, name: str, digest: str) -> bool:
        """The layout names digest as name and holds every blob of it (sizes as the manifest says)."""
        if self.digest_of(name) != digest:
            return False
        try:
            self.closure(digest)
        except (OSError, ValueError):
            return False
        return True

    def verify(self, digest: str) -> str | None:
        """None when every blob of digest is present, a regular file inside the layout's root, and hashes to its
        name; else what is wrong."""
        try:
            blobs = self.closure(digest)
        except LayoutError as exc:
            return str(exc) if "does not match its digest" in str(exc) else f"blob missing or unreadable ({exc})"
        except OSError as exc:
            return f"blob missing or unreadable ({exc})"
        for d in blobs:
            h = hashlib.sha256()
            try:
                self._regular(d)
                fd = os.open(self.blob(d), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except (OSError, LayoutError) as exc:
                return f"blob missing or unreadable ({exc})"
            with os.fdopen(fd, "rb") as fh:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return f"blob {d}: not a regular file"
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
            if "sha256:" + h.hexdigest() != d:
                return f"blob {d} does not match its digest"
        return None

    @contextlib.contextmanager
    def as_dir(self, digest: str) -> Iterator[Path]:
        """The image as a skopeo `dir:` directory next to the layout, made of hard links (copies across file systems)
        into it: push calls it on the staged layout only (never the bundle's). Every blob is checked as closure()
        checks it before it is linked."""
        self.closure(digest)
        with tempfile.TemporaryDirectory(prefix="gpu-install-image-", dir=self.path.parent) as tmp:
            root = Path(tmp)
            (root / "version").write_text("Directory Transport Version: 1.1\n")

            def link(d: str, dst: Path) -> None:
                self._regular(d)
                src = self.blob(d)
                try:
                    os.link(src, dst, follow_symlinks=False)
                except OSError:
                    shutil.copyfile(src, dst, follow_symlinks=False)

            def put(d: str, top: bool) -> None:
                doc = self._json(d)
                hexpart = d.split(":", 1)[1]
                link(d, root / ("manifest.json" if top else f"{hexpart}.manifest.json"))
                manifests, blobs = self._children(d, doc)
                for m in manifests:
                    put(m, top=False)
                for b, _ in blobs:
                    target = root / b.split(":", 1)[1]
                    if not target.exists():
                        link(b, target)

            put(digest, top=True)
            yield root


# ---------------------------------------------------------------- pull


PARTIAL = ".pulling"


def _jobs(jobs: int) -> int:
    if jobs < 1:
        raise ConfigError(f"--jobs {jobs}: at least 1 image at a time", hint="give --jobs 1 or more (default 4)")
    return jobs


def _private_layout(bundle: Path, layout: Layout, name: str) -> Path:
    """A fresh OCI layout of its own for one image being pulled, whose blobs/ is a link to the bundle layout's blobs/.

    skopeo's oci: destination rewrites index.json read-modify-write with no lock, so concurrent copies into ONE
    layout lose each other's entries; each copy therefore gets its own index.json, while the blobs go straight into
    the shared store (skopeo writes a blob to a temporary file and renames it into place: atomic, and a blob another
    image already brought is found there and not fetched again). Our code merges the index entries, one thread."""
    root = bundle / PARTIAL / hashlib.sha256(name.encode()).hexdigest()[:16]
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "blobs").symlink_to(os.path.relpath(layout.path / "blobs", root))
    return root


def _merge_index(layout: Layout, name: str, descriptor: Mapping[str, Any]) -> None:
    """Name descriptor as name in the bundle layout's index.json (replacing an older entry), written atomically."""
    from installer.util import atomic_write

    entries = [m for m in layout.index() if (m.get("annotations") or {}).get(REF_NAME) != name]
    entries.append(dict(descriptor))
    atomic_write(layout.path / "index.json", json.dumps({"schemaVersion": 2, "manifests": entries}) + "\n")


@dataclass(frozen=True)
class _Pulled:
    n: int
    img: ImageArtifact
    src: str
    rc: int
    err: str
    digest: str
    private: Path
    base: bool = False


def pull(plan: Plan, images: Sequence[ImageArtifact], bundle: Path, *, platform: str = DEFAULT_PLATFORM,
         progress: Progress = lambda e: None, finish: bool = True, jobs: int = DEFAULT_JOBS,
         since: Path | None = None) -> Outcome:
    """Copy images (ImageArtifacts of the mirror plan) into bundle/images and record bundle/bundle.lock.json, jobs
    images at a time. since: an older bundle's lock; an image whose upstream digest (for platform) that lock already
    has at the same destination is not copied but listed in the lock's "base" section (an incremental bundle, which
    push accepts only where the registry holds that base). Raises TransferFailures (exit 4) naming every image that failed, after trying all of them.
    finish=False leaves the bundle incomplete for the other kinds' pulls (the caller ends with bundle.finish).
    progress is called from the copying threads (start) and the recording thread (the rest)."""
    if ":" in str(bundle.resolve()):
        raise ConfigError(f"-o {bundle}: skopeo's oci: references cannot name a directory whose path has a ':'",
                          hint="choose another directory")
    jobs = _jobs(jobs)
    site = plan.site
    bundle.mkdir(parents=True, exist_ok=True)
    layout = Layout(bundle / LAYOUT)
    (layout.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    if not (layout.path / "oci-layout").exists():
        (layout.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    shutil.rmtree(bundle / PARTIAL, ignore_errors=True)  # a killed run's private layouts: their blobs are kept
    old: dict[str, Any] = {}
    prev = load_for_update(bundle)
    if prev.get("platform") == platform:
        old = {str(i["source"]): i for i in prev.get("images") or [] if isinstance(i, dict) and "source" in i}
    # the other kinds' sections (charts, files, packages) stay for their own pull to complete; images start afresh
    kept = {k: v for k, v in prev.items() if k not in ("schema", "complete", "release", "catalog", "registry",
                                                         "platform", "layout", "images", "failed")} \
        if prev.get("release") == plan.release.version and prev.get("registry") == site.registry.host else {}
    lock: dict[str, Any] = {
        "schema": SCHEMA, "complete": False, "release": plan.release.version, "catalog": catalog_record(plan),
        "registry": site.registry.host, "platform": platform, "layout": LAYOUT, "images": [],
        "failed": [f for f in prev.get("failed") or [] if kept and isinstance(f, dict)
                   and f.get("kind", IMAGE) != IMAGE], **kept}
    base_of: dict[str, str] = {}
    if since is not None:
        old_lock, old_sha = read_since(since)
        if old_lock.get("platform") != platform or old_lock.get("registry") != site.registry.host:
            raise ConfigError(f"--since {since}: that bundle was pulled for platform {old_lock.get('platform')} and "
                              f"registry {old_lock.get('registry')}, this pull is for {platform} and "
                              f"{site.registry.host}", hint="give the lock of this site's last bundle, same platform")
        base_of = {str(e.get("destination")): str(e.get("digest")) for e in old_lock["images"] if isinstance(e, dict)}
        base_of |= {str(e.get("destination")): str(e.get("digest")) for e in old_lock.get("base") or []
                    if isinstance(e, dict)}
        lock["incremental"] = {"since": old_sha, "release": old_lock.get("release")}
        lock["base"] = []
    else:
        lock.pop("incremental", None)
        lock.pop("base", None)
    outcome = Outcome()
    total = len(images)
    order = {img.source: n for n, img in enumerate(images)}
    upstream = dict(site.mirror.upstream)
    todo: list[tuple[int, ImageArtifact]] = []
    for n, img in enumerate(images, 1):
        prev_entry = old.get(img.source)
        if prev_entry and layout.complete(ref_name(img.source), str(prev_entry.get("digest"))):
            lock["images"].append({**prev_entry, "destination": img.destination, "component": img.component})
            outcome.skipped.append(img.source)
            progress(Event("skipped", n, total, img.source, str(prev_entry.get("digest"))))
        else:
            todo.append((n, img))
    write_lock(bundle, lock)

    def copy(n: int, img: ImageArtifact, certs: str | None) -> _Pulled:
        name = ref_name(img.source)
        src = pull_from(img.source, upstream)
        private = _private_layout(bundle, layout, name)
        if img.destination in base_of:
            raw, err = raw_manifest(src, cert=certs)
            have, _ = platform_digest(raw, platform) if raw is not None else (None, err)
            if have is not None and have == base_of[img.destination]:
                return _Pulled(n, img, src, 0, "", have, private, base=True)
        progress(Event("start", n, total, img.source, src if src != img.source else ""))
        digestfile = private / "digest"
        rc, _, err = run_skopeo(copy_argv(f"docker://{src}", f"oci:{private}:{name}", platform=platform,
                                          digestfile=digestfile, src_certs=certs))
        digest = digestfile.read_text().strip() if rc == 0 and digestfile.exists() else ""
        return _Pulled(n, img, src, rc, err, digest, private)

    def record(r: _Pulled, layout_error: str = "") -> None:
        img, src, digest, name = r.img, r.src, r.digest, ref_name(r.img.source)
        mine = Layout(r.private)
        msg = f"the bundle's layout, read back after the copy: {layout_error}" if layout_error else ""
        if r.base:
            based: BaseEntry = {"source": img.source, "destination": img.destination, "digest": digest}
            lock["base"].append(based)
            outcome.skipped.append(img.source)
            progress(Event("skipped", r.n, total, img.source, f"{digest}, in the base bundle"))
            shutil.rmtree(r.private, ignore_errors=True)
            write_lock(bundle, lock)
            return
        if msg:
            pass
        elif r.rc != 0 or not digest:
            msg = r.err if r.rc != 0 else "skopeo wrote no digest"
            msg += f" (read from {src})" if src != img.source and src not in msg else ""
        elif "@" in img.source and img.source.rpartition("@")[2] != digest:
            msg = (f"pinned by digest to {img.source.rpartition('@')[2]}, a multi-platform image of which --platform "
                   f"{platform} copied the instance {digest}: its destination (by digest) could not hold it; pull "
                   "with --all-platforms")
        elif mine.digest_of(name) != digest:
            msg = f"the layout names {mine.digest_of(name)} for it, skopeo copied {digest}"
        if msg:
            outcome.failed[img.source] = msg
            failure: FailedImage = {"source": img.source, "pulledFrom": src, "error": msg}
            lock["failed"].append(failure)
            progress(Event("failed", r.n, total, img.source, msg))
        else:
            descriptor = mine.descriptor(name) or {}
            _merge_index(layout, name, descriptor)
            blobs = layout.closure(digest)
            size = sum(blobs.values())
            entry: ImageEntry = {"source": img.source, "pulledFrom": src, "destination": img.destination,
                                 "component": img.component, "refName": name, "digest": digest, "size": size,
                                 "blobs": sorted(blobs)}
            lock["images"].append(entry)
            outcome.copied.append(img.source)
            progress(Event("copied", r.n, total, img.source, f"{digest} {size}"))
        shutil.rmtree(r.private, ignore_errors=True)
        write_lock(bundle, lock)

    # Read back while other copies run, an image's closure can fail its digest check without anything being wrong:
    # skopeo writes a manifest blob in place (not through a temporary file like layers), so a manifest that two
    # images share (the same bytes under two names) is briefly truncated while the second copy rewrites it. Such an
    # image is read back again once no copy is running; what still fails then is a real failure of that image.
    deferred: list[_Pulled] = []

    def not_pulled() -> list[ImageArtifact]:
        have = {str(e.get("source")) for e in lock["images"]} | {str(e.get("source")) for e in lock.get("base") or []}
        return [img for img in images if img.source not in have]

    try:
        with cert_dir(site.mirror.upstreamCa) as certs, ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(copy, n, img, certs) for n, img in todo]
            try:
                for fut in as_completed(futures):
                    r = fut.result()
                    try:
                        record(r)  # this thread alone writes index.json and the lock
                    except LayoutError:
                        deferred.append(r)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
        for r in deferred:
            try:
                record(r)
            except LayoutError as exc:
                record(r, layout_error=str(exc))
        shutil.rmtree(bundle / PARTIAL, ignore_errors=True)
        lock["images"].sort(key=lambda e: order.get(str(e.get("source")), total))
        lock["complete"] = finish and not lock["failed"]
        write_lock(bundle, lock)
    except OSError as exc:  # our own write (index.json, the lock) found the disk full: the lock on disk is the last
        if exc.errno != errno.ENOSPC:  # one written whole (atomic writes), and the next run resumes from it
            raise
        shutil.rmtree(bundle / PARTIAL, ignore_errors=True)
        raise disk_full(bundle, space_needed(layout, not_pulled(), upstream, platform, site.mirror.upstreamCa)) \
            from None
    if any(NO_SPACE.search(m) for m in outcome.failed.values()):  # skopeo's writes found the disk full
        raise disk_full(bundle, space_needed(layout, not_pulled(), upstream, platform, site.mirror.upstreamCa))
    if outcome.failed:
        raise TransferFailures(
            f"{len(outcome.failed)} of {total} images could not be pulled; the bundle is incomplete (push refuses "
            "it):\n" + "\n".join(f"  {s}: {m}" for s, m in sorted(outcome.failed.items(),
                                                                  key=lambda kv: order.get(kv[0], total))),
            hint="fix the cause (tag missing upstream, auth, TLS: mirror.upstreamCa, mirror.upstream) and run pull "
                 "again: the images already in the bundle are not copied again")
    return outcome




def _repository(ref: str) -> str:
    """ref without its tag or digest: what ref@sha256:… reads another manifest of."""
    name = ref.partition("@")[0]
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.partition(':')[0]}"


def space_needed(layout: Layout, images: Sequence[ImageArtifact], upstream: Mapping[str, str], platform: str,
                 ca: Path | None) -> int | None:
    """The bytes the blobs of images (for platform) that layout does not hold yet take, read from their upstream
    manifests (sizes as the manifests give them); None when a manifest cannot be read."""
    need: dict[str, int] = {}
    with cert_dir(ca) as certs:

        def walk(src: str, raw: bytes, depth: int) -> bool:
            try:
                doc = json.loads(raw)
            except ValueError:
                return False
            need["sha256:" + hashlib.sha256(raw).hexdigest()] = len(raw)
            if not isinstance(doc, dict) or depth > MAX_DEPTH:
                return False
            if doc.get("mediaType") in INDEX_TYPES or "manifests" in doc:
                chosen, _ = platform_digest(raw, platform)
                for m in doc.get("manifests") or []:
                    d = m.get("digest") if isinstance(m, dict) else None
                    if not isinstance(d, str) or (platform != ALL_PLATFORMS and d != chosen):
                        continue
                    child, _ = raw_manifest(f"{_repository(src)}@{d}", cert=certs)
                    if child is None or not walk(src, child, depth + 1):
                        return False
                return True
            for d in [doc.get("config"), *(doc.get("layers") or [])]:
                if isinstance(d, dict) and isinstance(d.get("digest"), str) and isinstance(d.get("size"), int):
                    need[d["digest"]] = d["size"]
            return True

        for img in images:
            src = pull_from(img.source, upstream)
            raw, _ = raw_manifest(src, cert=certs)
            if raw is None or not walk(src, raw, 0):
                return None
    total = 0
    for digest, size in need.items():
        try:
            present = layout.blob(digest).is_file()
        except LayoutError:
            present = False
        total += 0 if present else size
    return total


# ---------------------------------------------------------------- push


@dataclass(frozen=True)
class StagedImages:
    """The lock's image entries (check_images) and the staged layout holding every blob of each, each blob read once
    from the bundle, copied and matched with its digest (stage)."""

    entries: list[ImageEntry]
    layout: Layout


def _stage_blob(src: Layout, dst: Layout, digest: str, *, size: int | None, limit: int | None) -> None:
    """The blob digest of the bundle's layout src copied into the staged layout dst (staging.copy_verified: opened
    once, a regular file inside the bundle, size bytes or at most limit, its bytes hashing to digest); nothing when dst
    holds it already (staged and checked before). LayoutError naming the blob otherwise."""
    target = dst.blob(digest)
    if os.path.lexists(target):
        return
    path = src.blob(digest)  # inside the bundle, symlinks resolved
    try:
        staging.copy_verified(path, target, sha256=digest.split(":", 1)[1], size=size, limit=limit)
    except staging.Mismatch as exc:
        if exc.kind == "digest":
            raise LayoutError(f"blob {digest} does not match its digest") from None
        if exc.kind == "size" and size is not None:
            raise LayoutError(f"blob {digest} does not match its digest ({exc})") from None
        raise LayoutError(f"blob {digest}: {exc}" if exc.kind == "type" else
                          f"blob {digest}: {str(exc).replace('it may have', 'a manifest or index may have')}") \
            from None


def _stage_manifests(src: Layout, dst: Layout, digest: str, blobs: dict[str, int]) -> None:
    """Every manifest and index of digest (itself included) staged from src into dst and parsed from the staged copy,
    as Layout.closure walks them (bounded depth, no cycles); the blobs the manifests reference, with their sizes,
    added to blobs (staged later: _stage_blob). LayoutError naming the blob that is wrong."""
    done: set[str] = set()

    def walk(d: str, path: tuple[str, ...]) -> None:
        _enter(d, path)
        if d in done:
            return
        _stage_blob(src, dst, d, size=None, limit=MAX_JSON)
        manifests, refs = dst._children(d, dst._json(d))
        for m in manifests:
            walk(m, (*path, d))
        for b, size in refs:
            if size is None:
                raise LayoutError(f"blob {b}: manifest {d} gives no size for it")
            if blobs.setdefault(b, size) != size:
                raise LayoutError(f"blob {b}: manifests give it {blobs[b]} and {size} bytes")
        done.add(d)

    walk(digest, ())


def stage(site: Site, bundle: Path, lock: Mapping[str, Any], into: staging.Staging, *,
          also_needs: int = 0) -> StagedImages:
    """Every image of the lock (check_images first: exit 2 before anything is read) staged into a layout of its own
    under into.path: the bundle's index.json read once and required to name each entry's digest as its refName; then
    every manifest and index (at most MAX_JSON bytes each) copied and hashed, parsed only from the staged copy; then,
    after into.reserve() of the referenced blobs' sizes plus also_needs (what the charts, files and packages will
    need: exit 8 when it does not fit), every config and layer copied while it is hashed, exactly the size its
    manifest gives. Nothing is hard-linked to the bundle; nothing of the bundle is read again afterwards.
    ConfigError (exit 2) naming the image and the blob when anything is not what its digest says."""
    entries = check_images(site, lock, bundle)  # every destination recomputed from the site, before anything else
    src = Layout(inside_bundle(bundle, lock.get("layout") or LAYOUT, "layout"), root=bundle)
    dst = Layout(into.path / "images", root=into.path)
    (dst.path / "blobs" / "sha256").mkdir(parents=True, mode=0o700)
    hint = "the bundle was damaged in transit: pull it again and carry the whole directory"
    names: dict[str, str] = {}
    try:
        if entries:  # a bundle without images (charts and files only) has no index.json
            names = {str((m.get("annotations") or {}).get(REF_NAME)): str(m.get("digest")) for m in src.read_index()}
    except LayoutError as exc:
        raise ConfigError(f"{bundle}: {exc}", hint=hint) from None
    blobs: dict[str, int] = {}
    owner: dict[str, ImageEntry] = {}

    def problem(exc: Exception) -> str:
        return str(exc) if "does not match its digest" in str(exc) else f"blob missing or unreadable ({exc})"

    for e in entries:
        if names.get(str(e["refName"])) != e["digest"]:
            raise ConfigError(f"{bundle}: image {e['source']}: the layout does not name {e['digest']} as "
                              f"{e['refName']}", hint=hint)
        known = set(blobs)
        try:
            _stage_manifests(src, dst, e["digest"], blobs)
        except (LayoutError, OSError) as exc:
            raise ConfigError(f"{bundle}: image {e['source']}: {problem(exc)}", hint=hint) from None
        owner.update({b: e for b in blobs if b not in known})
    into.reserve(sum(size for d, size in blobs.items() if not os.path.lexists(dst.blob(d))) + also_needs)
    for b, size in blobs.items():
        try:
            _stage_blob(src, dst, b, size=size, limit=None)
        except (LayoutError, OSError) as exc:
            raise ConfigError(f"{bundle}: image {owner[b]['source']}: {problem(exc)}", hint=hint) from None
    return StagedImages(entries, dst)


def push(site: Site, bundle: Path, *, config_json: bytes | None, progress: Progress = lambda e: None,
         jobs: int = DEFAULT_JOBS, lock: Mapping[str, Any] | None = None, staged: StagedImages | None = None,
         staging_dir: Path | None = None) -> Outcome:
    """Every image of a complete, verified bundle to its destination in registry.host -- recomputed from the site for
    each entry's source (check_images: a lock naming another destination is refused, exit 2, before anything is
    copied) --, digests preserved and checked, jobs images at a time. skopeo reads each image from the STAGED copy
    (stage: every blob read once from the bundle, copied and matched with its digest before the first image is
    pushed): what the bundle holds after that is never read. staged: what `mirror push` staged with the charts and
    packages; else staged here, in a staging directory under staging_dir removed afterwards. lock: the lock the
    command verified (bundle_for_push: its signature and completeness), else read here with bundle_for_push. Raises
    TransferFailures (exit 4)."""
    jobs = _jobs(jobs)
    lock = bundle_for_push(bundle) if lock is None else lock
    if staged is None:
        with staging.staging(staging_dir, bundle) as into:
            return push(site, bundle, config_json=config_json, progress=progress, jobs=jobs, lock=lock,
                        staged=stage(site, bundle, lock, into))
    entries, layout = staged.entries, staged.layout
    reg = site.registry
    secrets = secrets_of(config_json)
    outcome = Outcome()
    total = len(entries)
    tls = not reg.insecure
    whole = ALL_PLATFORMS if lock.get("platform") == ALL_PLATFORMS else None  # a dir: copy holds what pull took
    if lock.get("incremental"):
        base = [Wanted(str(e.get("source")), str(e.get("destination")), str(e.get("digest")))
                for e in lock.get("base") or [] if isinstance(e, dict)]
        missing = check(site, base, config_json=config_json, jobs=jobs)
        if missing:
            inc = lock["incremental"]
            raise PreflightError(
                f"{bundle} is an incremental bundle on top of release {inc.get('release')} (lock sha256 "
                f"{inc.get('since')}); {reg.host} lacks {len(missing)} of the {len(base)} images it builds on:\n"
                + "\n".join(f.line() for f in missing),
                hint="push the bundle that lock belongs to first (or pull a full bundle, without --since)")

    down: list[str] = []  # the first message saying the registry does not answer at all (connection refused, …)

    def one(n: int, e: ImageEntry, certs: str | None, auth: str | None) -> tuple[str, str, str]:
        """(outcome kind, destination, message) of one image. Once the registry stopped answering, an image not
        started yet is not tried (each try would retry and fail the same way): named as not copied, with why."""
        digest, dest = str(e["digest"]), str(e["destination"])
        if down:
            msg = f"not tried: {reg.host} stopped answering ({down[0]})"
            progress(Event("failed", n, total, dest, msg))
            return "failed", dest, msg
        have, _ = manifest_digest(dest, cert=certs, auth=auth, tls_verify=tls, secrets=secrets)
        if have == digest:
            progress(Event("skipped", n, total, dest, digest))
            return "skipped", dest, ""
        progress(Event("start", n, total, dest, ""))
        with layout.as_dir(digest) as d:
            rc, _, err = run_skopeo(copy_argv(f"dir:{d}", f"docker://{dest}", platform=whole, dest_certs=certs,
                                              dest_auth=auth, dest_tls=tls), secrets)
        if rc != 0:
            if UNREACHABLE.search(err):
                down.append(err)
            progress(Event("failed", n, total, dest, err))
            return "failed", dest, err
        got, err = manifest_digest(dest, cert=certs, auth=auth, tls_verify=tls, secrets=secrets)
        if got != digest:
            msg = f"after the copy the registry has {got or 'nothing'} ({err})" if got is None else \
                f"after the copy the registry has {got}, the bundle {digest}"
            progress(Event("failed", n, total, dest, msg))
            return "failed", dest, msg
        progress(Event("copied", n, total, dest, f"{digest} {e.get('size') or 0}"))
        return "copied", dest, ""

    with cert_dir(reg.ca) as certs, authfile(config_json) as auth, ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(one, n, e, certs, auth): e for n, e in enumerate(entries, 1)}
        results = {id(futures[f]): f.result() for f in as_completed(futures)}
    done = [(kind, e["source"], dest, msg) for e in entries for kind, dest, msg in [results[id(e)]]]
    return _tally(outcome, done,
                  f"{total} images could not be pushed to {reg.host}",
                  hint="check registry.host, the credentials registry.pullSecret names (they need push rights) and "
                       "registry.ca; run push again: images already there with the bundle's digest are skipped")


def _tally(outcome: Outcome, results: Sequence[tuple[str, str, str, str]], what: str, hint: str) -> Outcome:
    """outcome with each image's result, (kind, source, the reference a failure is named by, message), in order;
    TransferFailures (exit 4) naming every failed one: "<n> of <what>:"."""
    for kind, source, ref, msg in results:
        if kind == "failed":
            outcome.failed[ref] = msg
        else:
            (outcome.copied if kind == "copied" else outcome.skipped).append(source)
    if outcome.failed:
        raise TransferFailures(f"{len(outcome.failed)} of {what}:\n"
                               + "\n".join(f"  {r}: {m}" for r, m in outcome.failed.items()), hint=hint)
    return outcome


# ---------------------------------------------------------------- sync


def layer_digests(raw: bytes) -> frozenset[str]:
    """The layer digests a single-image manifest names (empty for a list/index or anything else)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return frozenset()
    layers = doc.get("layers") if isinstance(doc, dict) else None
    return frozenset(str(d["digest"]) for d in layers or [] if isinstance(d, dict) and d.get("digest"))


@dataclass(frozen=True)
class _Copy:
    """An image sync must copy: its number, the image, where from and to, the digest it must get, its layers."""

    n: int
    img: ImageArtifact
    src: str
    dest: str
    want: str | None
    layers: frozenset[str]


def _layers(src: str, raw: bytes | None, want: str | None, cert: str | None) -> frozenset[str]:
    """The layers the copy of src brings: those of its manifest, or of the platform's instance (want) when src is a
    list/index (one more manifest read); none when a manifest cannot be read (the copy then takes no turn)."""
    if raw is None or want is None:
        return frozenset()
    layers = layer_digests(raw)
    if layers or "sha256:" + hashlib.sha256(raw).hexdigest() == want:
        return layers
    instance, _ = raw_manifest(f"{_repository(src)}@{want}", cert=cert)
    return layer_digests(instance) if instance is not None else frozenset()


K = TypeVar("K")
R = TypeVar("R")


def take_turns(pool: ThreadPoolExecutor, jobs: int, tasks: Sequence[tuple[K, frozenset[str]]],
               run: Callable[[K], R]) -> dict[K, R]:
    """Runs run(key) for every task on pool, at most jobs at once, never two at once that would both bring a layer: a
    copy whose layers a running copy is bringing waits for it (then finds them at the destination: skopeo skips a blob
    the registry has) while copies with other layers take the free slots, so a shared layer crosses the upstream link
    once. A layer stops holding anyone back once a copy that brought it has ended: two copies that share only layers
    already at the destination run side by side. Tasks start in their order as far as their layers let them. Returns
    key -> run's result."""
    pending = list(tasks)
    running: dict[Future[R], tuple[K, frozenset[str]]] = {}
    crossed: set[str] = set()  # layers of copies that ended (a failed copy's too: the next one just brings them)
    out: dict[K, R] = {}
    while pending or running:
        busy: set[str] = set().union(*(layers for _, layers in running.values())) - crossed
        for task in list(pending):
            if len(running) >= jobs:
                break
            if task[1] & busy:
                continue
            pending.remove(task)
            running[pool.submit(run, task[0])] = task
            busy |= task[1] - crossed
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for f in finished:
            key, layers = running.pop(f)
            crossed |= layers
            out[key] = f.result()
    return out


def sync(plan: Plan, images: Sequence[ImageArtifact], *, config_json: bytes | None, platform: str = DEFAULT_PLATFORM,
         progress: Progress = lambda e: None, jobs: int = DEFAULT_JOBS) -> Outcome:
    """Registry to registry, for a host that sees both: every image from its upstream (through mirror.upstream /
    mirror.upstreamCa, as pull reads it) straight to its destination in registry.host (credentials and CA as push),
    digests preserved (the digest skopeo wrote must be the upstream's). An image whose destination already has the
    upstream's digest (for platform) is skipped after one manifest read on each side, so a re-sync of a mirrored
    release copies nothing. The upstream manifest is read for every image (for a list, also the platform's instance):
    its layers let copies that share one take turns (take_turns), so a shared layer crosses the upstream link once
    instead of once per concurrent copy -- what -j buys on an upstream that limits each connection.
    Raises TransferFailures (exit 4) naming every image that failed, after trying all of them."""
    jobs = _jobs(jobs)
    site = plan.site
    reg = site.registry
    secrets = secrets_of(config_json)
    upstream = dict(site.mirror.upstream)
    tls = not reg.insecure
    total = len(images)
    outcome = Outcome()

    def one(n: int, img: ImageArtifact, up: str | None, certs: str | None,
            auth: str | None) -> tuple[str, str] | _Copy:
        """The image's verdict without a copy (failed, skipped), or the copy it needs with the layers it brings."""
        src, dest = pull_from(img.source, upstream), img.destination
        have, _ = manifest_digest(dest, cert=certs, auth=auth, tls_verify=tls, secrets=secrets)
        raw, err = raw_manifest(src, cert=up)
        want, why = platform_digest(raw, platform) if raw is not None else (None, err)
        if have is not None or "@" in img.source:  # the upstream digest decides (a fresh destination: the copy does)
            if want is None:
                msg = why + (f" (read from {src})" if src != img.source and src not in why else "")
                progress(Event("failed", n, total, img.source, msg))
                return "failed", msg
            if "@" in img.source and img.source.rpartition("@")[2] != want:
                msg = (f"pinned by digest to {img.source.rpartition('@')[2]}, a multi-platform image of which "
                       f"--platform {platform} is the instance {want}: its destination (by digest) could not hold it; "
                       "sync with --all-platforms")
                progress(Event("failed", n, total, img.source, msg))
                return "failed", msg
            if have == want:
                progress(Event("skipped", n, total, dest, want))
                return "skipped", ""
        return _Copy(n, img, src, dest, want, _layers(src, raw, want, up))

    def copy(n: int, img: ImageArtifact, src: str, dest: str, want: str | None, up: str | None, certs: str | None,
             auth: str | None) -> tuple[str, str]:
        """skopeo copy; the digest it wrote (--digestfile) must be the upstream's (as read before, when it was)."""
        progress(Event("start", n, total, dest, src))
        with tempfile.TemporaryDirectory(prefix="gpu-install-sync-") as tmp:
            digestfile = Path(tmp) / "digest"
            rc, _, err = run_skopeo(copy_argv(f"docker://{src}", f"docker://{dest}", platform=platform,
                                              digestfile=digestfile, src_certs=up, dest_certs=certs, dest_auth=auth,
                                              dest_tls=tls), secrets)
            got = digestfile.read_text().strip() if rc == 0 and digestfile.exists() else None
        if rc != 0:
            progress(Event("failed", n, total, dest, err))
            return "failed", err
        if got is None or (want is not None and got != want):
            msg = f"skopeo wrote {got or 'no digest'}, upstream has {want}"
            progress(Event("failed", n, total, dest, msg))
            return "failed", msg
        progress(Event("copied", n, total, dest, got))
        return "copied", ""

    with cert_dir(site.mirror.upstreamCa) as up, cert_dir(reg.ca) as certs, authfile(config_json) as auth, \
            ThreadPoolExecutor(max_workers=jobs) as pool:
        checked = list(pool.map(lambda a: one(a[0], a[1], up, certs, auth), enumerate(images, 1)))
        todo = {c.n: c for c in checked if isinstance(c, _Copy)}
        copied = take_turns(pool, jobs, [(n, c.layers) for n, c in todo.items()],
                            lambda n: copy(n, todo[n].img, todo[n].src, todo[n].dest, todo[n].want, up, certs, auth))
    results = [copied[c.n] if isinstance(c, _Copy) else c for c in checked]
    done = [(kind, img.source, img.source, msg) for img, (kind, msg) in zip(images, results, strict=True)]
    return _tally(outcome, done,
                  f"{total} images could not be synced to {reg.host}",
                  hint="fix the cause (tag missing upstream, mirror.upstream / mirror.upstreamCa, the credentials "
                       "registry.pullSecret names, registry.ca) and run sync again: images already there are skipped")
