"""The bundle's lock as untrusted input: what a lock entry is (the TypedDicts below, one per kind) and the checks that
turn the JSON of a lock -- signed or not, it is what the bundle says -- into entries push, verify and publish may act
on. Every check is against the site (the plan it resolves, the destinations it computes) and against plain shapes
(references, digests, chart names and versions, OS tags, file names), BEFORE anything the entry names is read from
the bundle or written anywhere: a lock naming anything else is refused with ConfigError (exit 2) naming the entry.

The modules of the kinds (images, charts, packages) and `mirror verify` take their entries from here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from installer.errors import ConfigError
from installer.mirror.bundle import LOCK
from installer.mirror.common import HINT_FORGED, inside_bundle
from installer.mirror.common import Failure as Failure

if TYPE_CHECKING:
    from installer.config import Site

CHARTS, FILES = "charts", "files"
PACKAGES, SETS, BASE = "packages", "packageSets", "packageBase"


class ImageEntry(TypedDict):
    """An image the bundle carries (section "images"): copied from pulledFrom, at digest in the layout as refName."""

    source: str
    pulledFrom: str
    destination: str
    component: str
    refName: str
    digest: str
    size: int
    blobs: list[str]


class BaseEntry(TypedDict):
    """An image an incremental bundle builds on (section "base"): the registry must hold it already."""

    source: str
    destination: str
    digest: str


class ChartEntry(TypedDict):
    """A chart archive the bundle carries (section "charts"), file charts/<name>-<version>.tgz."""

    name: str
    version: str
    repository: str
    file: str
    sha256: str
    size: int


class FileEntry(TypedDict):
    """A file the bundle carries (section "files": the driver runfile), file files/<name>."""

    name: str
    source: str
    file: str
    sha256: str
    size: int


class _PackageRequired(TypedDict):
    os: str
    manager: str
    file: str
    source: str
    sha256: str
    size: int


class PackageEntry(_PackageRequired, total=False):
    """An OS package file (or, key: true, an upstream key; modules: true, the dnf modules metadata of the OS's streams,
    packages/<os>/modules/modules.yaml) of sections "packages" and "packageBase"."""

    name: str
    version: str
    arch: str
    key: bool
    modules: bool


class FailedImage(TypedDict):
    """An image pull could not copy (section "failed", no kind)."""

    source: str
    pulledFrom: str
    error: str


LAYOUT = "images"
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")


def ref_name(source: str) -> str:
    """The image's reference name inside the layout: its canonical source (a digest reference's '@' as ':', which
    the OCI layout's reference names allow)."""
    return source.replace("@", ":")


# an image reference as the distribution project's grammar has it: [domain[:port]/]path[:tag][@sha256:…]
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?)"
_PATH = r"(?:[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)"
REFERENCE = re.compile(rf"(?:{_DOMAIN}/)?{_PATH}(?:/{_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                       r"(?:@sha256:[a-f0-9]{64})?")


def safe_name(name: str, what: str) -> str:
    """A file name from the plan or a lock: one path component, no traversal."""
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise ConfigError(f"{what} {name!r} is not a plain file name", hint="check the site file / the bundle lock")
    return name


def _size(e: Mapping[str, Any]) -> int:
    size = e.get("size")
    return size if isinstance(size, int) else 0


def _bundle_file(bundle: Path, section: str, e: Any) -> str:
    """The file a charts or files entry names: <section>/<a plain file name> (ConfigError naming the entry
    otherwise)."""
    if not isinstance(e, dict):
        raise ConfigError(f"{bundle / LOCK}: a {section} entry is not an object")
    rel = str(e.get("file") or "")
    kind, _, name = rel.partition("/")
    if kind != section:
        raise ConfigError(f"{bundle / LOCK}: {section} entry names {rel!r}")
    safe_name(name, f"{section} entry")
    return rel


def chart_entry(bundle: Path, e: Any) -> ChartEntry:
    """A charts entry of the lock, its file charts/<a plain name> (the archive itself: charts.stage)."""
    rel = _bundle_file(bundle, CHARTS, e)
    return {"name": str(e.get("name")), "version": str(e.get("version")),
            "repository": str(e.get("repository") or ""), "file": rel, "sha256": str(e.get("sha256")),
            "size": _size(e)}


def file_entry(bundle: Path, e: Any) -> FileEntry:
    """A files entry of the lock, its file files/<a plain name>."""
    rel = _bundle_file(bundle, FILES, e)
    return {"name": str(e.get("name")), "source": str(e.get("source") or ""), "file": rel,
            "sha256": str(e.get("sha256")), "size": _size(e)}


def planned_sources(site: Site) -> Callable[[str], bool]:
    """Whether an image source is one this site's plan pulls: an image of a component the site deploys at its pinned
    version (a component whose tag names the node OS: that version with any -<suffix>, the nodes being unknown here),
    an image of an active feature (installer.features), or a Kata runtime class artifact of the release. Resolved from the site file and the
    catalog shipped with the installer; nothing of the bundle."""
    from installer import features
    from installer.plan import resolve

    plan = resolve(site)
    exact: set[str] = {i.source for i in features.images(plan.site)}
    prefixes: list[str] = []
    for comp in plan.components.values():
        if not comp.repository or not comp.version or not plan.deployed(comp):
            continue
        ref = comp.source_ref(comp.version)
        if comp.spec.os_suffix and not comp.version.startswith("sha256:"):
            prefixes.append(ref + "-")
        else:
            exact.add(ref)
        if comp.name == "kataManager":
            exact |= {str((rc.get("artifacts") or {}).get("url")) for rc in plan.release.kata_runtime_classes
                      if (rc.get("artifacts") or {}).get("url")}
    tag_rest = re.compile(r"[A-Za-z0-9_.-]{1,127}")
    return lambda source: source in exact or any(
        source.startswith(p) and bool(tag_rest.fullmatch(source[len(p):])) for p in prefixes)


def expected_destination(site: Site, source: str) -> str:
    """Where the site puts source in registry.host: what the plan computes (installer.render.values.destination_ref,
    registry.layout and registry.prefix)."""
    from installer.render.values import destination_ref

    return destination_ref(source, site.registry)


def check_images(site: Site, lock: Mapping[str, Any], bundle: Path) -> list[ImageEntry]:
    """The lock's image entries, each checked against the site BEFORE anything is copied (ConfigError, exit 2, naming
    the entry and the expected destination): its source is a well-formed reference that this site's plan pulls, its
    destination is the one the site computes for that source (another repository, another registry, a path with
    '..' is refused), its digest a sha256 and its reference name the layout's name for the source; the layout's path
    lies inside the bundle (inside_bundle). Each entry comes back with "destination" set to the recomputed one; push
    writes there and nowhere else. The lock's "base" entries (an incremental bundle: only read) must name references
    in registry.host, each at a sha256 digest."""
    where = f"{bundle}/{LOCK}"
    if lock.get("registry") != site.registry.host:
        raise ConfigError(f"{bundle}: the bundle was pulled for registry {lock.get('registry')}, the site file names "
                          f"{site.registry.host}",
                          hint="pull with the site file of this site (the destinations follow registry.host, layout "
                               "and prefix)")
    if not isinstance(lock.get("images"), list):
        raise ConfigError(f"{where}: no image list", hint=HINT_FORGED)
    planned = planned_sources(site)
    if lock.get("release") != site.operator.version:
        raise ConfigError(f"{bundle}: the bundle carries release {str(lock.get('release'))[:80]}, the site file names "
                          f"operator.version {site.operator.version}",
                          hint="push the bundle pulled for this release, with the site file it was pulled with")
    inside_bundle(bundle, lock.get("layout") or LAYOUT, "layout")
    host = site.registry.host
    out: list[ImageEntry] = []
    for i, e in enumerate(lock["images"]):
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: images[{i}] is not an object", hint=HINT_FORGED)
        source = e.get("source")
        if not isinstance(source, str) or not REFERENCE.fullmatch(source):
            raise ConfigError(f"{where}: images[{i}]: source {str(source)[:200]!r} is not an image reference",
                              hint=HINT_FORGED)
        if not planned(source):
            raise ConfigError(f"{where}: images[{i}]: {source} is not an image this site's plan pulls (release "
                              f"{site.operator.version}, the components the site deploys)", hint=HINT_FORGED)
        want = expected_destination(site, source)
        if not want.startswith(f"{host}/") or not REFERENCE.fullmatch(want):
            raise ConfigError(f"{where}: images[{i}]: {source} maps to {want}, not a reference in {host}",
                              hint=HINT_FORGED)
        if e.get("destination") != want:
            raise ConfigError(f"{where}: images[{i}] ({source}): destination {str(e.get('destination'))[:200]!r} is "
                              f"not where this site puts that image; expected {want}", hint=HINT_FORGED)
        digest = e.get("digest")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ConfigError(f"{where}: images[{i}] ({source}): digest {str(digest)[:100]!r} is not sha256:<64 hex>",
                              hint=HINT_FORGED)
        if e.get("refName") != ref_name(source):
            raise ConfigError(f"{where}: images[{i}] ({source}): refName {str(e.get('refName'))[:200]!r}, expected "
                              f"{ref_name(source)}", hint=HINT_FORGED)
        blobs = e.get("blobs")
        out.append({"source": source, "pulledFrom": str(e.get("pulledFrom") or source), "destination": want,
                    "component": str(e.get("component") or ""), "refName": ref_name(source), "digest": digest,
                    "size": _size(e),
                    "blobs": [b for b in blobs if isinstance(b, str)] if isinstance(blobs, list) else []})
    base = lock.get("base") or []
    if not isinstance(base, list):
        raise ConfigError(f"{where}: base is not a list", hint=HINT_FORGED)
    for i, e in enumerate(base):
        dest = e.get("destination") if isinstance(e, dict) else None
        if not isinstance(dest, str) or not dest.startswith(f"{host}/") or not REFERENCE.fullmatch(dest):
            raise ConfigError(f"{where}: base[{i}]: destination {str(dest)[:200]!r} is not a reference in {host}",
                              hint=HINT_FORGED)
        digest = e.get("digest")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ConfigError(f"{where}: base[{i}] ({dest}): digest {str(digest)[:100]!r} is not sha256:<64 hex>",
                              hint=HINT_FORGED)
    return out


CHART_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")  # helm's chart name rule, one path component
CHART_VERSION = re.compile(r"v?[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")  # SemVer 2


def check_charts(site: Site, bundle: Path, lock: Mapping[str, Any]) -> None:
    """Every chart and file entry of the lock is one this site's plan carries, BEFORE anything is pushed (ConfigError,
    exit 2, naming the entry): a chart's name and version are plain (helm's name rule, SemVer: nothing that could
    lead `helm push` elsewhere in the registry) and are a chart of the plan (the GPU Operator's at the release's chart
    version, HAMi's, nos'), with its file charts/<name>-<version>.tgz; a file is the plan's runfile."""
    from installer.mirror.plan import chart_artifacts, runfile_artifact
    from installer.plan import resolve

    where = bundle / LOCK
    plan = resolve(site)
    planned = {(c.name, c.version) for c in chart_artifacts(plan)}
    for i, e in enumerate(lock.get(CHARTS) or []):
        if not isinstance(e, dict):
            raise ConfigError(f"{where}: charts[{i}] is not an object", hint=HINT_FORGED)
        name, version = e.get("name"), e.get("version")
        if not isinstance(name, str) or not CHART_NAME.fullmatch(name):
            raise ConfigError(f"{where}: charts[{i}]: chart name {str(name)[:200]!r} is not a chart name (lower-case "
                              "letters, digits and '-')", hint=HINT_FORGED)
        if not isinstance(version, str) or not CHART_VERSION.fullmatch(version):
            raise ConfigError(f"{where}: charts[{i}] ({name}): version {str(version)[:200]!r} is not a SemVer "
                              "version", hint=HINT_FORGED)
        if (name, version) not in planned:
            raise ConfigError(f"{where}: charts[{i}]: chart {name} {version} is not a chart this site's plan carries "
                              f"({', '.join(f'{n} {v}' for n, v in sorted(planned))})", hint=HINT_FORGED)
        if e.get("file") != f"{CHARTS}/{name}-{version}.tgz":
            raise ConfigError(f"{where}: charts[{i}] ({name} {version}): file {str(e.get('file'))[:200]!r}, expected "
                              f"{CHARTS}/{name}-{version}.tgz", hint=HINT_FORGED)
    runfile = runfile_artifact(plan)
    for i, e in enumerate(lock.get(FILES) or []):
        name = e.get("name") if isinstance(e, dict) else None
        if runfile is None or name != runfile.name or e.get("file") != f"{FILES}/{runfile.name}":
            raise ConfigError(f"{where}: files[{i}]: {str(name)[:200]!r} is not a file this site's plan carries"
                              + (f" (the runfile {runfile.name})" if runfile else " (driver.mode is not runfile)"),
                              hint=HINT_FORGED)


OS_TAG = re.compile(r"([a-z][a-z0-9-]*?)([0-9]+(?:\.[0-9]+)*)")  # ID+VERSION_ID: ubuntu22.04, rocky9.4, centos7
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~%:@=-]{0,254}")  # a package file name (apt quotes an epoch: %3a)


def check_entry(where: Path, section: str, i: int, e: Any) -> PackageEntry:
    """A packages (or packageBase) entry of the lock names a plain OS tag of a supported OS, a package manager the
    roles use (apt, dnf) and a file packages/<os>/<name> (or packages/<os>/keys/<name>) with a plain file name:
    ConfigError (exit 2) naming the entry otherwise. Nothing of it can lead publish outside DIR/packages/<os>/."""
    from installer import platforms

    hint = ("the bundle's lock does not match what mirror pull writes: pull the bundle again (or check that the "
            "bundle comes from your connected side)")
    if not isinstance(e, dict):
        raise ConfigError(f"{where}: {section}[{i}] is not an object", hint=hint)
    os_tag = e.get("os")
    m = OS_TAG.fullmatch(os_tag) if isinstance(os_tag, str) else None
    if m is None or m[1] not in platforms.ANSIBLE_OS:
        raise ConfigError(f"{where}: {section}[{i}]: os {str(os_tag)[:100]!r} is not a node OS tag (ID+VERSION_ID of "
                          f"{', '.join(sorted(platforms.ANSIBLE_OS))})", hint=hint)
    if e.get("manager") not in ("apt", "dnf"):
        raise ConfigError(f"{where}: {section}[{i}] ({os_tag}): manager {str(e.get('manager'))[:50]!r} is not apt or "
                          "dnf", hint=hint)
    rel = e.get("file")
    parts = rel.split("/") if isinstance(rel, str) else []
    key = bool(e.get("key"))
    if e.get("modules") is True and not key and e.get("manager") == "dnf":
        if parts != [PACKAGES, os_tag, "modules", "modules.yaml"]:
            raise ConfigError(f"{where}: {section}[{i}] ({os_tag}): modules file {str(rel)[:200]!r} is not "
                              f"{PACKAGES}/{os_tag}/modules/modules.yaml", hint=hint)
        return {"os": str(os_tag), "manager": "dnf", "file": str(rel), "source": str(e.get("source") or ""),
                "sha256": str(e.get("sha256")), "size": _size(e), "modules": True}
    shape = [PACKAGES, os_tag, "keys", parts[-1] if parts else ""] if key else [PACKAGES, os_tag,
                                                                              parts[-1] if parts else ""]
    if parts != shape or not FILE_NAME.fullmatch(parts[-1]) or (
            not key and not parts[-1].endswith(".deb" if e.get("manager") == "apt" else ".rpm")):
        raise ConfigError(f"{where}: {section}[{i}] ({os_tag}): file {str(rel)[:200]!r} is not "
                          f"{PACKAGES}/{os_tag}/{'keys/' if key else ''}<a plain "
                          f"{'key file' if key else ('.deb' if e.get('manager') == 'apt' else '.rpm') + ' file'} "
                          "name>", hint=hint)
    entry: PackageEntry = {"os": str(os_tag), "manager": str(e["manager"]), "file": str(rel),
                           "source": str(e.get("source") or ""), "sha256": str(e.get("sha256")),
                           "size": _size(e)}
    if key:
        entry["key"] = True
    name, version, arch = e.get("name"), e.get("version"), e.get("arch")
    if isinstance(name, str):
        entry["name"] = name
    if isinstance(version, str):
        entry["version"] = version
    if isinstance(arch, str):
        entry["arch"] = arch
    return entry

