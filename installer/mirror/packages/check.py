"""The site's package repository as the nodes read it (packages.url): each OS's index fetched, its signature checked
with the site key (packages.key), and what it lists compared with a bundle's lock or the plan's package roots
(`mirror verify`, apply's package check); for dnf, also the module streams its modules metadata publishes."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import ssl
import tempfile
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError
from installer.mirror.packages import modulemd
from installer.mirror.packages.tools import APT_ARCH, BASE, COMPONENT, PACKAGES, SETS, SUITE, _errors, _run, _tool

if TYPE_CHECKING:
    from installer.config import Site
    from installer.mirror.plan import OsPackages


def _get(url: str, ca: Path | None = None) -> bytes:
    ctx = ssl.create_default_context()
    if ca:
        ctx.load_verify_locations(cafile=str(ca))
    with urllib.request.urlopen(url, timeout=60, context=ctx) as resp:  # noqa: S310 - the site's own repository
        data: bytes = resp.read()
    return data


def _gpgv(key: Path, *files: Path, output: Path | None = None) -> str | None:
    """None when gpgv accepts the signature with exactly this (armored) key, else why not. output: where gpgv writes
    the signed content it verified (of a clear-signed file: the text inside the signature, nothing around it)."""
    gpgv = _tool("gpgv", "the site repository's signature is checked with it", "install gpgv (apt-get install gpgv)")
    with tempfile.TemporaryDirectory(prefix="gpu-install-gpgv-") as tmp:
        ring = Path(tmp) / "site.gpg"
        proc = _run(["gpg", "--batch", "--quiet", "--homedir", tmp, "--dearmor", "--output", str(ring), str(key)])
        if proc.returncode != 0:
            raise ConfigError(f"packages.key {key}: not an armored OpenPGP public key ({_errors(proc.stderr)})",
                              hint="give DIR/gpu-install-site.asc as `mirror push` exported it")
        out = ["--output", str(output)] if output is not None else []
        proc = _run([gpgv, "--keyring", str(ring), *out, *map(str, files)], env={**os.environ, "LC_ALL": "C"})
    if proc.returncode == 0:
        return None
    return "signature not made by the site key (" + _errors(proc.stderr).split(";")[0] + ")"


def _sha256_of(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def repo_index(url: str, os_tag: str, manager: str, key: Path) -> dict[str, dict[str, str]]:
    """The site repository <url>/packages/<os_tag> as a node reads it, its index's signature checked with the site
    key: {file name: {name, version, sha256}}. Raises ValueError saying what is wrong."""
    base = f"{url.rstrip('/')}/{PACKAGES}/{os_tag}"
    with tempfile.TemporaryDirectory(prefix="gpu-install-repo-") as tmp:
        work = Path(tmp)
        try:
            if manager == "apt":
                (work / "InRelease").write_bytes(_get(f"{base}/dists/{SUITE}/InRelease"))
                why = _gpgv(key, work / "InRelease", output=work / "Release.verified")
                if why:
                    raise ValueError(f"{base}/dists/{SUITE}/InRelease: {why}")
                # only what the signature covers: gpgv's output, never the text around the signed block
                text = (work / "Release.verified").read_text(errors="replace")
                want = re.search(rf"^ ([0-9a-f]{{64}})\s+\d+\s+{COMPONENT}/binary-{APT_ARCH}/Packages$", text.split(
                    "SHA256:", 1)[-1], re.M)
                if not want:
                    raise ValueError(f"{base}: InRelease lists no {COMPONENT}/binary-{APT_ARCH}/Packages")
                data = _get(f"{base}/dists/{SUITE}/{COMPONENT}/binary-{APT_ARCH}/Packages")
                if _sha256_of(data) != want[1]:
                    raise ValueError(f"{base}: Packages does not match its signed InRelease")
                out: dict[str, dict[str, str]] = {}
                for stanza in data.decode(errors="replace").split("\n\n"):
                    f = dict(re.findall(r"^([A-Za-z0-9-]+): (.*)$", stanza, re.M))
                    if "Filename" in f:
                        out[f["Filename"].rsplit("/", 1)[-1]] = {"name": f.get("Package", ""),
                                                                 "version": f.get("Version", ""),
                                                                 "sha256": f.get("SHA256", ""),
                                                                 "href": f["Filename"]}
                return out
            (work / "repomd.xml").write_bytes(_get(f"{base}/repodata/repomd.xml"))
            (work / "repomd.xml.asc").write_bytes(_get(f"{base}/repodata/repomd.xml.asc"))
            why = _gpgv(key, work / "repomd.xml.asc", work / "repomd.xml")
            if why:
                raise ValueError(f"{base}/repodata/repomd.xml: {why}")
            ns = {"r": "http://linux.duke.edu/metadata/repo", "c": "http://linux.duke.edu/metadata/common"}
            primary = ET.fromstring((work / "repomd.xml").read_bytes()).find("r:data[@type='primary']", ns)
            loc = primary.find("r:location", ns) if primary is not None else None
            csum = primary.find("r:checksum", ns) if primary is not None else None
            if loc is None or csum is None or csum.get("type") != "sha256":
                raise ValueError(f"{base}: repomd.xml names no primary metadata with a sha256")
            data = _get(f"{base}/{loc.get('href')}")
            if _sha256_of(data) != (csum.text or "").strip():
                raise ValueError(f"{base}: the primary metadata does not match its signed repomd.xml")
            out = {}
            for pkg in ET.fromstring(gzip.decompress(data)).findall("c:package", ns):
                v = pkg.find("c:version", ns)
                href = pkg.find("c:location", ns)
                sha = pkg.find("c:checksum", ns)
                if v is None or href is None:
                    continue
                epoch = v.get("epoch") or "0"
                version = f"{'' if epoch == '0' else epoch + ':'}{v.get('ver')}-{v.get('rel')}"
                out[str(href.get("href")).rsplit("/", 1)[-1]] = {
                    "name": (pkg.findtext("c:name", "", ns)), "version": version,
                    "sha256": (sha.text or "") if sha is not None and sha.get("type") == "sha256" else "",
                    "href": str(href.get("href"))}
            return out
        except (OSError, ssl.SSLError, SyntaxError, EOFError) as exc:  # SyntaxError: ElementTree's ParseError
            raise ValueError(f"{base}: cannot be read ({getattr(exc, 'reason', None) or exc})") from None


def repo_streams(url: str, os_tag: str, key: Path) -> set[str]:
    """The dnf module streams (name:stream) the site repository <url>/packages/<os_tag> publishes, as a node reads
    them: repomd.xml's signature checked with the site key, the modules metadata it names checked against its
    checksum, read bounded (modulemd); empty when it names none. Raises ValueError saying what is wrong."""
    base = f"{url.rstrip('/')}/{PACKAGES}/{os_tag}"
    with tempfile.TemporaryDirectory(prefix="gpu-install-repo-") as tmp:
        work = Path(tmp)
        try:
            (work / "repomd.xml").write_bytes(_get(f"{base}/repodata/repomd.xml"))
            (work / "repomd.xml.asc").write_bytes(_get(f"{base}/repodata/repomd.xml.asc"))
            why = _gpgv(key, work / "repomd.xml.asc", work / "repomd.xml")
            if why:
                raise ValueError(f"{base}/repodata/repomd.xml: {why}")
            found = modulemd.repomd_modules((work / "repomd.xml").read_bytes(), f"{base}/repodata/repomd.xml")
            if found is None:
                return set()
            href, kind, value = found
            data = _get(f"{base}/{href}")
            if len(data) > modulemd.MAX_COMPRESSED:
                raise ValueError(f"{base}/{href}: more than {modulemd.MAX_COMPRESSED} bytes")
            if hashlib.new(kind, data).hexdigest() != value:
                raise ValueError(f"{base}/{href}: does not match its signed repomd.xml")
            path = work / href.rsplit("/", 1)[-1]
            path.write_bytes(data)
            return {s.spec for s in modulemd.read_file(path)}
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{base}: cannot be read ({getattr(exc, 'reason', None) or exc})") from None


def _missing_streams(url: str, key: Path, want: Mapping[str, Sequence[str]], strict: bool) -> list[str]:
    """One line per dnf module stream of want (os -> name:stream) the site repository does not publish. strict (a
    bundle's lock: the streams it carried): every one; else (the plan's) only where the repository publishes the
    module without that stream: a repository without the module's metadata serves its packages as non-modular, and
    the driver role installs them without a stream."""
    out: list[str] = []
    for os_tag, specs in sorted(want.items()):
        if not specs:
            continue
        try:
            have = repo_streams(url, os_tag, key)
        except ValueError as exc:
            out.append(f"  {os_tag} module streams: {exc}")
            continue
        names = {h.split(":")[0] for h in have}
        for spec in specs:
            if spec in have or (not strict and spec.split(":")[0] not in names):
                continue
            same = sorted(h for h in have if h.split(":")[0] == spec.split(":")[0])
            out.append(f"  {os_tag}: dnf module stream {spec}: not in the site repository's modules metadata"
                       + (f" (it has {', '.join(same)})" if same else ""))
    return out


def _served(url: str, size: int) -> str | None:
    """None when the web server serves url with this size (a HEAD request), else what it says."""
    try:
        req = urllib.request.Request(url, method="HEAD")  # noqa: S310 - the site's own repository
        with urllib.request.urlopen(req, timeout=60, context=ssl.create_default_context()) as resp:  # noqa: S310
            length = resp.headers.get("Content-Length")
    except (OSError, ssl.SSLError) as exc:
        return f"not served ({getattr(exc, 'reason', None) or exc})"
    if length is not None and int(length) != size:
        return f"served with {length} bytes, the bundle has {size}"
    return None


def check_repo(site: Site, *, sets: Sequence[OsPackages] = (), lock: Mapping[str, Any] | None = None) -> list[str]:
    """What the site repository (packages.url, as the nodes read it) lacks: with a lock, every package of it by
    sha256; else every root of the plan's package sets (a package of that name whose version the pin matches). One
    line per finding (empty: all there)."""
    url, key = site.packages.url, site.packages.key
    if not url or key is None:
        return []
    wanted: dict[tuple[str, str], list[Any]] = {}
    streams: dict[str, list[str]] = {}
    if lock is not None:
        for e in [*(lock.get(PACKAGES) or []), *(lock.get(BASE) or [])]:
            if isinstance(e, dict) and not e.get("key") and not e.get("modules"):
                wanted.setdefault((str(e["os"]), str(e["manager"])), []).append(e)
        for r in lock.get(SETS) or []:
            if isinstance(r, dict) and r.get("manager") == "dnf" and not r.get("skipped"):
                streams[str(r.get("os"))] = [str(m) for m in r.get("modules") or [] if isinstance(m, str)]
    else:
        for s in sets:
            wanted.setdefault((s.os, s.manager), []).extend(s.packages)
            if s.manager == "dnf" and s.modules:
                streams[s.os] = list(s.modules)
    out: list[str] = _missing_streams(url, Path(key), streams, strict=lock is not None) if streams else []
    for (os_tag, manager), items in sorted(wanted.items()):
        try:
            index = repo_index(url, os_tag, manager, Path(key))
        except ValueError as exc:
            out.append(f"  {os_tag} packages: {exc}")
            continue
        if lock is not None:
            for e in items:
                name = Path(str(e["file"])).name
                got = index.get(name)
                if got is None:
                    out.append(f"  {os_tag}/{name}: not in the site repository")
                elif got["sha256"] != e["sha256"]:
                    out.append(f"  {os_tag}/{name}: sha256 {got['sha256']} in the site repository, the bundle "
                               f"{e['sha256']}")
                else:
                    why = _served(f"{url.rstrip('/')}/{PACKAGES}/{os_tag}/{got['href']}", int(e["size"]))
                    if why:
                        out.append(f"  {os_tag}/{name}: listed in the signed index but {why}")
            continue
        for p in items:
            have = [i for i in index.values() if i["name"] == p.name]
            ok = [i for i in have if not p.version or re.sub(r"^\d+:", "", i["version"]).startswith(p.version)]
            if not ok:
                out.append(f"  {os_tag}/{p.spec}: not in the site repository" + (
                    f" (it has {', '.join(sorted(i['version'] for i in have))})" if have else ""))
    return out
