"""Which platforms a GPU Operator release works on: node operating systems and Kubernetes versions.

Data: values/catalog/platforms.yaml (per release series v<major>.<minor>, with its sources):
  kubernetes.min        the oldest Kubernetes minor whose API server accepts every object the release's chart
                        renders (the charts' own `kubeVersion: >= 1.16` is not true for newer ones) — enforced
  kubernetes.max        optional: the newest minor that still serves the APIs it uses — enforced
  kubernetes.validated  [lowest, highest] minor NVIDIA's platform-support page lists — outside it: a note
  driverOs              os-release ID → VERSION_IDs NVIDIA publishes driver images for (the `-<osTag>` suffix)
The OS the node roles have a path for (ROLE_OS) is the same list the preflight role checks on the node itself
(roles/preflight/defaults/main.yml preflight_supported_os; a unit test keeps them equal).

Pure functions of the data; the plan (installer.plan) and the cluster stages call them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, PreflightError
from installer.safefile import shipped_yaml

PLATFORMS_FILE = "platforms.yaml"

# os-release ID → VERSION_IDs the node roles support (major versions for the RHEL family and Debian)
ROLE_OS: Mapping[str, tuple[str, ...]] = {
    "centos": ("7",),
    "rhel": ("8", "9"),
    "rocky": ("8", "9"),
    "ubuntu": ("18.04", "20.04", "22.04", "24.04"),
    "debian": ("12",),
}
_BY_MAJOR = {"centos", "rhel", "rocky", "debian"}
# os-release ID → (Ansible's ansible_facts['distribution'], ansible_facts['os_family']): the names the roles' OS maps
# (roles/<role>/vars/<distribution>-<major>.yml, <distribution>.yml, <os_family>.yml) are looked up by, on the node by
# Ansible and before any node is contacted by installer.mirror (the same files, the same order)
ANSIBLE_OS: Mapping[str, tuple[str, str]] = {
    "centos": ("CentOS", "RedHat"),
    "rhel": ("RedHat", "RedHat"),
    "rocky": ("Rocky", "RedHat"),
    "ubuntu": ("Ubuntu", "Debian"),
    "debian": ("Debian", "Debian"),
}
_MINOR = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?\Z")

Minor = tuple[int, int]


def kube_minor(text: str, where: str = "--kube-version") -> Minor:
    """'1.20', 'v1.20.2', 'v1.29.0-rc.1', 'v1.24.3+k3s1' → (1, 20)."""
    m = _MINOR.match(str(text).strip())
    if not m or len(str(text)) > 64:
        shown = str(text)[:40]
        raise ConfigError(f"{where}: {shown!r} is not a Kubernetes version", hint="e.g. 1.27 or v1.27.3")
    return int(m[1]), int(m[2])


def show_minor(v: Minor) -> str:
    return f"{v[0]}.{v[1]}"


def series_of(release: str) -> str:
    """'v24.9.2' → 'v24.9'."""
    parts = release.lstrip("v").split(".")
    return f"v{parts[0]}.{parts[1]}"


@dataclass(frozen=True)
class KubeSupport:
    series: str
    min: Minor | None
    max: Minor | None
    reason: str
    validated: tuple[Minor, Minor] | None
    source: str

    def fits(self, v: Minor) -> bool:
        return (self.min is None or v >= self.min) and (self.max is None or v <= self.max)

    def works_text(self) -> str:
        lo = f"≥ {show_minor(self.min)}" if self.min else ""
        hi = f"≤ {show_minor(self.max)}" if self.max else ""
        return ", ".join(x for x in (lo, hi) if x) or "any"

    def validated_text(self) -> str:
        if not self.validated:
            return "-"
        return f"{show_minor(self.validated[0])}–{show_minor(self.validated[1])}"


@dataclass(frozen=True)
class Series:
    name: str
    kube: KubeSupport
    driver_os: Mapping[str, tuple[str, ...]]  # empty: not recorded (no check)
    driver_os_source: str


@cache
def _load(path: Path) -> dict[str, Series]:
    doc = shipped_yaml(path.read_text()) or {}
    out = {}
    for name, entry in (doc.get("series") or {}).items():
        k = entry.get("kubernetes") or {}
        val = k.get("validated")
        kube = KubeSupport(
            series=name,
            min=kube_minor(k["min"], f"{path}: {name}.kubernetes.min") if k.get("min") else None,
            max=kube_minor(k["max"], f"{path}: {name}.kubernetes.max") if k.get("max") else None,
            reason=str(k.get("minReason") or k.get("maxReason") or ""),
            validated=(kube_minor(val[0]), kube_minor(val[1])) if val else None,
            source=str(k.get("source") or ""),
        )
        dos = dict(entry.get("driverOs") or {})
        source = str(dos.pop("source", "") or "")
        driver_os = {str(i).lower(): tuple(str(v) for v in vs) for i, vs in dos.items()}
        out[str(name)] = Series(str(name), kube, driver_os, source)
    return out


def table(catalog_dir: Path | None = None) -> dict[str, Series]:
    from installer import content

    return _load((catalog_dir or content.catalog_dir()) / PLATFORMS_FILE)


def series(release: str, catalog_dir: Path | None = None) -> Series | None:
    return table(catalog_dir).get(series_of(release))


# --- node operating systems ------------------------------------------------------------------------------------


def _version_matches(os_id: str, version: str, allowed: Iterable[str]) -> bool:
    for a in allowed:
        if "*" in a:
            if fnmatch.fnmatchcase(version, a):
                return True
        elif version == a or (os_id in _BY_MAJOR and version.split(".")[0] == a):
            return True
    return False


def _list(os_map: Mapping[str, Sequence[str]]) -> str:
    return ", ".join(f"{i} {'/'.join(vs)}" for i, vs in sorted(os_map.items()))


def check_role_os(host: str, os_id: str, version: str, where: str) -> None:
    """The node roles have a path for this OS (what preflight checks on the node, checked here from what the
    inventory or --os says, before anything is contacted)."""
    if os_id not in ROLE_OS or not _version_matches(os_id, version, ROLE_OS[os_id]):
        raise ConfigError(f"{where}: {os_id}{version} is not an OS gpu-install supports on GPU nodes "
                          f"(supported: {_list(ROLE_OS)})",
                          hint="give the node's os-release ID and VERSION_ID, e.g. ubuntu22.04 or rocky9.4")


def check_driver_os(release: str, os_id: str, version: str, tag: str, where: str,
                    custom: Iterable[str] = (), catalog_dir: Path | None = None) -> None:
    """NVIDIA publishes driver images of this release for the node's OS (driver tag <version>-<osTag>), unless the
    site builds its own for that OS (driver.customImageOs)."""
    if tag in set(custom):
        return
    s = series(release, catalog_dir)
    if s is None or not s.driver_os:
        return  # nothing recorded for the series: nothing to hold it against
    allowed = s.driver_os.get(os_id)
    if allowed and _version_matches(os_id, version, allowed):
        return
    raise ConfigError(
        f"{where}: NVIDIA publishes no driver images of GPU Operator {release} for {os_id}{version} "
        f"(driver tag …-{tag}); published for: {_list(s.driver_os)}",
        hint="use driver.mode host or runfile (the roles install the driver on the node), or, if the site builds "
             f"its own driver images for this OS, list it in driver.customImageOs: [{tag}]")


# --- Kubernetes ------------------------------------------------------------------------------------------------


def kube_support(release: str, catalog_dir: Path | None = None) -> KubeSupport | None:
    s = series(release, catalog_dir)
    return s.kube if s else None


def newest_fitting(releases: Sequence[str], v: Minor, catalog_dir: Path | None = None) -> str | None:
    """The newest catalog release whose Kubernetes range holds v (releases in ascending order)."""
    for rel in reversed(releases):
        ks = kube_support(rel, catalog_dir)
        if ks is not None and ks.fits(v):
            return rel
    return None


def newest_validated(releases: Sequence[str], v: Minor, catalog_dir: Path | None = None) -> str | None:
    """The newest catalog release that runs on v AND that NVIDIA validated on v (releases in ascending order)."""
    for rel in reversed(releases):
        ks = kube_support(rel, catalog_dir)
        if ks is not None and ks.fits(v) and ks.validated and ks.validated[0] <= v <= ks.validated[1]:
            return rel
    return None


def suggest_for(releases: Sequence[str], v: Minor, catalog_dir: Path | None = None) -> str:
    """The hint for a release that cannot run on Kubernetes v: the newest release NVIDIA validated on v, or, when
    there is none, the nearest validated Kubernetes version to upgrade the cluster to."""
    best = newest_validated(releases, v, catalog_dir)
    if best:
        return (f"the newest catalog release that runs on Kubernetes {show_minor(v)} and that NVIDIA validated on it "
                f"is {best}: set operator.version: {best}")
    ranges = [ks.validated for r in releases if (ks := kube_support(r, catalog_dir)) and ks.validated]
    above = sorted(lo for lo, _ in ranges if lo > v)
    highest = max((hi for _, hi in ranges), default=None)
    fix = (f"upgrade the cluster to Kubernetes {show_minor(above[0])} or newer, the oldest a catalog release is "
           f"validated on" if above else "the newest Kubernetes a catalog release is validated on is "
           f"{show_minor(highest)}" if highest else "upgrade the cluster")
    runs = newest_fitting(releases, v, catalog_dir)
    ks = kube_support(runs, catalog_dir) if runs else None
    unvalidated = f" ({runs} would start on it, but is validated on {ks.validated_text()} only)" if runs and ks else ""
    return f"no catalog release is validated by NVIDIA on Kubernetes {show_minor(v)}{unvalidated}: {fix}"


def check_kubernetes(release: str, version: str, releases: Sequence[str], where: str,
                     catalog_dir: Path | None = None) -> str | None:
    """Raise PreflightError (exit 3) when the release does not work on this Kubernetes version, naming the newest
    release that does; return a note when it works but is outside NVIDIA's validated range (else None)."""
    v = kube_minor(version, where)
    ks = kube_support(release, catalog_dir)
    if ks is None:
        return None
    if not ks.fits(v):
        why = f" ({ks.reason})" if ks.reason else ""
        raise PreflightError(
            f"{where}: Kubernetes {show_minor(v)} cannot run GPU Operator {release}: it needs Kubernetes "
            f"{ks.works_text()}{why}", hint=suggest_for(releases, v, catalog_dir))
    if ks.validated and not ks.validated[0] <= v <= ks.validated[1]:
        return (f"Kubernetes {show_minor(v)} is outside the range NVIDIA validated GPU Operator {ks.series} on "
                f"({ks.validated_text()}); it is expected to work ({ks.works_text()})")
    return None


def as_dict(s: Series) -> dict[str, Any]:
    return {"series": s.name, "kubernetes": {"works": s.kube.works_text(), "validated": s.kube.validated_text()},
            "driverOs": {k: list(v) for k, v in s.driver_os.items()}}
