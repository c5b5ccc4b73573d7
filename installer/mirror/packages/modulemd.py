"""dnf module streams in the OS packages' mirror (RHEL 8/9: NVIDIA ships the driver as streams of the module
nvidia-driver, e.g. nvidia-driver:580-open).

A repository's modules metadata is a YAML stream of documents (`document: modulemd`, version 2: a module's stream at a
version and context, with the packages it holds under artifacts.rpms; also modulemd-defaults and others). dnf hides a
modular package unless its stream is enabled, so `mirror pull` resolves with the plan's streams enabled and carries
the documents of exactly those streams; `mirror push` publishes them in the site repository (modifyrepo_c), merged
with what earlier pushes published there; the package check reads them back from the signed repository.

What an upstream repository (or a bundle) holds is untrusted: read bounded (compressed and expanded), split into
documents without parsing them, and only the documents of the wanted module parsed, strictly (a key twice or an alias
refused) and checked field by field. A carried document keeps its upstream text verbatim (re-dumping would change
values YAML reads loosely, such as a context of 00000000)."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import lzma
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from installer.errors import ConfigError

MAX_EXPANDED = 64 << 20  # a distribution's whole modules.yaml (every module of AppStream) is a few MB
MAX_COMPRESSED = 32 << 20
MAX_DOCUMENT = 2 << 20  # one module stream's document: a few KB, a few hundred artifacts at most
MAX_DOCUMENTS = 50_000
MAX_ARTIFACTS = 20_000
MAX_REPOMD = 1 << 20
FILE = "modules.yaml"  # BUNDLE/packages/<os>/modules/<FILE>; DIR/packages/<os>/<FILE> (what push merged so far)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
STREAM_SPEC = re.compile(rf"({NAME.pattern}):({NAME.pattern})")
NEVRA = re.compile(r"[A-Za-z0-9._+-]{1,200}-[0-9]{1,10}:[A-Za-z0-9._+~^]{1,100}-[A-Za-z0-9._+~^]{1,100}"
                   r"\.[A-Za-z0-9_]{1,20}")
_BOUNDARY = re.compile(r"^(---|\.\.\.)(?=\s|$)", re.M)  # YAML document markers: only ever at column 0


@dataclass(frozen=True)
class Stream:
    """One modulemd document of a module's stream: name:stream at a version and context, and its text verbatim."""

    name: str
    stream: str
    version: int
    context: str
    arch: str
    artifacts: tuple[str, ...]
    text: str

    @property
    def spec(self) -> str:
        return f"{self.name}:{self.stream}"

    @property
    def key(self) -> tuple[str, str, int, str, str]:
        return (self.name, self.stream, self.version, self.context, self.arch)


def split_spec(spec: str) -> tuple[str, str]:
    """'nvidia-driver:580-open' -> ('nvidia-driver', '580-open'); ValueError for anything else."""
    m = STREAM_SPEC.fullmatch(spec)
    if m is None:
        raise ValueError(f"{spec!r} is not a dnf module stream (name:stream)")
    return m[1], m[2]


def documents(text: str) -> list[str]:
    """The documents of a YAML stream as text, split at the document markers (`---`, `...` at the start of a line:
    YAML allows them nowhere else), without parsing; empty ones dropped. ValueError past MAX_DOCUMENTS."""
    out: list[str] = []
    start = 0
    for m in _BOUNDARY.finditer(text):
        part = text[start:m.start()]
        if part.strip():
            out.append(part)
        start = text.find("\n", m.start())
        start = len(text) if start < 0 else start + 1
        if len(out) > MAX_DOCUMENTS:
            raise ValueError(f"more than {MAX_DOCUMENTS} YAML documents")
    if text[start:].strip():
        out.append(text[start:])
    return out


def _str(value: Any) -> str | None:
    """A scalar YAML may have read as a number (stream: 580, context: 00000000) as its text; None otherwise."""
    if isinstance(value, bool) or value is None:
        return None
    return str(value) if isinstance(value, (str, int)) else None


def parse(text: str, where: str, module: str | None = None) -> list[Stream]:
    """The modulemd (version 2) documents of `module` (None: of every module) in a modules.yaml text, each checked:
    ValueError naming the document and the field when one of them is not what dnf would read as a module stream. The
    other documents (with a module: those that do not name it; defaults, translations) are not parsed."""
    from installer.safefile import parse_yaml

    if len(text) > MAX_EXPANDED:
        raise ValueError(f"{where}: more than {MAX_EXPANDED} bytes of modules metadata")
    word = re.compile(rf"(?<![A-Za-z0-9._+-]){re.escape(module or 'modulemd')}(?![A-Za-z0-9._+-])")
    out: list[Stream] = []
    for i, doc in enumerate(documents(text)):
        if not word.search(doc):
            continue
        at = f"{where}: document {i + 1}"
        if len(doc) > MAX_DOCUMENT:
            raise ValueError(f"{at}: {len(doc)} bytes, more than a module stream's document ({MAX_DOCUMENT})")
        try:
            data = parse_yaml(doc, at, aliases=False)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        if not isinstance(data, dict) or data.get("document") != "modulemd":
            continue
        body = data.get("data")
        if not isinstance(body, dict) or (module is not None and _str(body.get("name")) != module):
            continue
        if data.get("version") != 2:
            raise ValueError(f"{at}: modulemd version {data.get('version')!r}; repositories carry version 2")
        out.append(_stream(body, at, doc))
    return out


def _stream(body: dict[str, Any], at: str, text: str) -> Stream:
    name, stream = _str(body.get("name")), _str(body.get("stream"))
    if not name or not NAME.fullmatch(name) or not stream or not NAME.fullmatch(stream):
        raise ValueError(f"{at}: data.name/data.stream {name!r}:{stream!r} is not a module stream name")
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"{at} ({name}:{stream}): data.version {version!r} is not a non-negative integer")
    context = _str(body.get("context")) or ""
    arch = _str(body.get("arch")) or ""
    if (context and not NAME.fullmatch(context)) or (arch and not NAME.fullmatch(arch)):
        raise ValueError(f"{at} ({name}:{stream}): data.context/arch {context!r}/{arch!r} is not a plain name")
    artifacts = body.get("artifacts") or {}
    rpms = artifacts.get("rpms") if isinstance(artifacts, dict) else None
    if rpms is None:
        rpms = []
    if not isinstance(rpms, list) or len(rpms) > MAX_ARTIFACTS or not all(
            isinstance(r, str) and NEVRA.fullmatch(r) for r in rpms):
        raise ValueError(f"{at} ({name}:{stream}): data.artifacts.rpms is not a list of package NEVRAs "
                         "(name-epoch:version-release.arch)")
    profiles = body.get("profiles") or {}
    if not isinstance(profiles, dict) or not all(
            isinstance(p, dict) and all(isinstance(r, str) and NAME.fullmatch(r) for r in (p.get("rpms") or []))
            for p in profiles.values()):
        raise ValueError(f"{at} ({name}:{stream}): data.profiles is not a map of profiles listing package names")
    return Stream(name, stream, version, context, arch, tuple(rpms), text)


def render(streams: Iterable[Stream]) -> str:
    """A modules.yaml of these documents (their text verbatim), each once (the last of one key wins), in a stable
    order."""
    by_key = {s.key: s for s in streams}
    return "".join(f"---\n{by_key[k].text.rstrip()}\n...\n" for k in sorted(by_key))


def merge(old: Sequence[Stream], new: Sequence[Stream]) -> list[Stream]:
    """What a site repository publishes after a push: the documents it had and the new ones (a new one replaces an
    old one of the same name, stream, version, context and arch)."""
    by_key = {s.key: s for s in [*old, *new]}
    return [by_key[k] for k in sorted(by_key)]


# ---------------------------------------------------------------- reading repodata


def _bounded(fh: IO[bytes], limit: int, what: str) -> bytes:
    data = fh.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{what}: more than {limit} bytes")
    return data


def expand(path: Path, what: str) -> str:
    """A metadata file's text, expanded by its suffix (.gz, .xz, .bz2, .zst through the zstd tool, else plain): at
    most MAX_COMPRESSED read, MAX_EXPANDED expanded, UTF-8; ValueError saying what is wrong."""
    size = path.stat().st_size
    if size > MAX_COMPRESSED:
        raise ValueError(f"{what}: {size} bytes, more than {MAX_COMPRESSED}")
    try:
        if path.suffix == ".zst":
            zstd = shutil.which("zstd")
            if zstd is None:
                raise ValueError(f"{what} is zstd-compressed and zstd is not installed (apt-get install zstd)")
            with subprocess.Popen([zstd, "-dcq", "--", str(path)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL) as proc:
                assert proc.stdout is not None
                try:
                    data = _bounded(proc.stdout, MAX_EXPANDED, what)
                except ValueError:
                    proc.kill()
                    raise
                if proc.wait(timeout=60) != 0:
                    raise ValueError(f"{what}: zstd cannot expand it (exit {proc.returncode})")
        else:
            opener: Any = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}.get(path.suffix, open)
            with opener(path, "rb") as fh:
                data = _bounded(fh, MAX_EXPANDED, what)
    except (OSError, EOFError, lzma.LZMAError) as exc:
        raise ValueError(f"{what}: cannot be expanded ({exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what}: not UTF-8 text (byte {exc.start})") from None


_REPO_NS = {"r": "http://linux.duke.edu/metadata/repo"}


def repomd_modules(repomd: bytes, where: str) -> tuple[str, str, str] | None:
    """(location href, checksum type, checksum) of the modules metadata a repomd.xml names; None when it has none.
    ValueError for a repomd.xml that is not one, or a location outside repodata/."""
    if len(repomd) > MAX_REPOMD:
        raise ValueError(f"{where}: more than {MAX_REPOMD} bytes")
    try:
        root = ET.fromstring(repomd)
    except ET.ParseError as exc:
        raise ValueError(f"{where}: not XML ({exc})") from None
    data = root.find("r:data[@type='modules']", _REPO_NS)
    if data is None:
        return None
    loc, csum = data.find("r:location", _REPO_NS), data.find("r:checksum", _REPO_NS)
    href = loc.get("href") if loc is not None else None
    kind = csum.get("type") if csum is not None else None
    value = (csum.text or "").strip() if csum is not None else ""
    if not href or not re.fullmatch(r"repodata/[A-Za-z0-9][A-Za-z0-9._-]{0,200}", href):
        raise ValueError(f"{where}: the modules metadata's location {str(href)[:200]!r} is not a file in repodata/")
    if kind not in ("sha1", "sha224", "sha256", "sha384", "sha512") or not re.fullmatch(r"[0-9a-f]{40,128}", value):
        raise ValueError(f"{where}: the modules metadata's checksum ({kind}) is not one dnf checks")
    return href, kind, value


def cached_streams(cache_dir: Path, repo_ids: Sequence[str], module: str) -> list[tuple[str, list[Stream]]]:
    """The streams of `module` each repository's modules metadata holds, read from dnf's cache of that repository
    (what dnf resolved with: <cachedir>/<repo id>-<hash>/repodata/, the file checked against repomd.xml's checksum
    here again); [(repo id, streams)], a repository without modules metadata with none."""
    out: list[tuple[str, list[Stream]]] = []
    for repo_id in repo_ids:
        dirs = sorted(d for d in cache_dir.glob(f"{repo_id}-*") if (d / "repodata" / "repomd.xml").is_file())
        if not dirs:
            out.append((repo_id, []))
            continue
        base = dirs[-1]
        repomd = base / "repodata" / "repomd.xml"
        with open(repomd, "rb") as fh:
            found = repomd_modules(_bounded(fh, MAX_REPOMD, str(repomd)), str(repomd))
        if found is None:
            out.append((repo_id, []))
            continue
        href, kind, value = found
        path = base / href
        digest = hashlib.new(kind)
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        if digest.hexdigest() != value:
            raise ValueError(f"{path}: does not match the {kind} its repomd.xml names")
        out.append((repo_id, parse(expand(path, str(path)), str(path), module)))
    return out


def read_file(path: Path, module: str | None = None) -> list[Stream]:
    """The module stream documents of a modules.yaml (a bundle's, a site repository's; compressed by its suffix):
    every modulemd document, or only those of `module`. ValueError naming the file and the document otherwise."""
    return parse(expand(path, str(path)), str(path), module)
