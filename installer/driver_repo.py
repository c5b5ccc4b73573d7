"""The package sources of the GPU Operator's driver container in a full air gap (driver.mode operator).

NVIDIA's driver container (not precompiled) installs the node kernel's packages when it starts: Ubuntu
`linux-headers-<kernel>` (and downloads linux-image/linux-modules), RHEL `kernel-devel-<kernel>`, `kernel-headers`,
`elfutils-libelf-devel` (../shared/upstream/driver-facts.md). Behind an air gap it reaches only what the chart's
`driver.repoConfig.configMapName` points it at: a ConfigMap in the operator's namespace whose every key the operator
mounts (one subPath mount per key, `createConfigMapVolumeMounts`) into the container's sources directory
(REPO_DIR: Debian/Ubuntu /etc/apt/sources.list.d, RHEL family /etc/yum.repos.d, every release v1.11 … v26.x), and
`driver.certConfig.name` the CA certificates of an https repository (CA_DIR).

gpu-install writes both ConfigMaps from the site file (configmaps(); installer.operator.install applies them before
the release, installer.operator.uninstall removes them):
  - packages.url: the site's own repository as `mirror push --repo-dir` published it, one file per GPU node OS --
    apt `gpu-install-<os>.list`: `deb [signed-by=<dir>/gpu-install-site.asc] <url>/packages/<os> gpu-install main`
    (the suite and component publish writes), the site key mounted beside it (KEY_FILE); dnf
    `gpu-install-<os>.repo` with gpgcheck=1, repo_gpgcheck=1 and every gpgkey a file:// of a key mounted with it
    (the site key, and the upstream keys the packages keep their signatures of, DIR/packages/<os>/
    RPM-GPG-KEYS-upstream.asc beside packages.key). Never trusted=yes, never gpgcheck=0.
  - packages.osMirror: the site's existing OS mirror (apt archive roots / dnf repositories), written into the same
    ConfigMap, checked with the archive keys the driver image carries (apt signed-by its archive keyring, dnf
    gpgcheck=1 with the distribution's key file).
  - packages.ca with an https source: the CA ConfigMap, and each .repo names it as sslcacert.
The operator mounts ONE repository ConfigMap into every driver container, whatever its OS: a container reads every
node OS's file (apt ignores .repo and .asc files, dnf everything but .repo); the site repository's per-OS paths hold
only the kernel packages of that OS's nodes, so a container finds its own kernel's. A generic OS mirror would mix
releases' packages, so osMirror with GPU nodes on two releases of one package family is refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.catalog import Release
from installer.config import Site
from installer.errors import ConfigError
from installer.facts import Node

REPO_CONFIGMAP = "gpu-install-driver-repo"  # driver.repoConfig.configMapName
CA_CONFIGMAP = "gpu-install-driver-ca"  # driver.certConfig.name
REPO_VALUE, CA_VALUE = "driver.repoConfig.configMapName", "driver.certConfig.name"
#: the site key's key in the repository ConfigMap, mounted as <REPO_DIR>/gpu-install-site.asc (publish's SITE_KEY)
KEY_FILE = "gpu-install-site.asc"
#: where the operator mounts the repository ConfigMap's keys in the driver container (RepoConfigPathMap)
REPO_DIR = {"apt": "/etc/apt/sources.list.d", "dnf": "/etc/yum.repos.d"}
#: where it mounts the CA ConfigMap's keys (CertConfigPathMap): Ubuntu's moved to /usr/local/share/ca-certificates
#: (update-ca-certificates adds what is there) in v23.3.0; RHEL's is the extracted PEM directory in every release
CA_DIR_UBUNTU_OLD, CA_DIR_UBUNTU, CA_DIR_RHEL = ("/etc/ssl/certs", "/usr/local/share/ca-certificates",
                                                  "/etc/pki/ca-trust/extracted/pem")
CA_DIR_MOVED = "v23.3.0"
MAX_KEY_BYTES = 256 << 10  # an OpenPGP public key (or a few) is a few KiB
MAX_CONFIGMAP_BYTES = 1_000_000  # the API server stores at most 1 MiB per object
ARMORED = re.compile(r"-----BEGIN PGP PUBLIC KEY BLOCK-----\r?\n.*?-----END PGP PUBLIC KEY BLOCK-----", re.S)
CERT = re.compile(r"-----BEGIN CERTIFICATE-----\r?\n.*?-----END CERTIFICATE-----", re.S)
#: osMirror, apt: the release's codename (its suites) and the archive keyring the image's apt depends on
APT_CODENAMES = {"ubuntu20.04": "focal", "ubuntu22.04": "jammy", "ubuntu24.04": "noble",
                 "debian11": "bullseye", "debian12": "bookworm", "debian13": "trixie"}
APT_ARCHIVE_KEYRING = {"ubuntu": "/usr/share/keyrings/ubuntu-archive-keyring.gpg",
                       "debian": "/usr/share/keyrings/debian-archive-keyring.gpg"}
#: osMirror, dnf: the distribution key file of a RHEL-family driver image
DNF_DISTRIBUTION_KEY = {"rhel": "/etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release",
                        "centos": "/etc/pki/rpm-gpg/RPM-GPG-KEY-centosofficial",
                        "rocky": "/etc/pki/rpm-gpg/RPM-GPG-KEY-Rocky-{major}"}
HEADERS_FIX = ("the site repository has no packages of this node's kernel: record the kernel (`gpu-install nodes "
               "facts -o facts.json` and `mirror plan/pull --facts facts.json`, or gpu_install_kernel in the "
               "inventory), pull and push again")


def os_mirror(site: Site) -> list[str]:
    """packages.osMirror: the site's OS mirror entries for the driver container (empty: none)."""
    return list(site.packages.osMirror)


def wanted(site: Site) -> bool:
    """The driver container builds the driver on the node and the site names where it gets the packages."""
    return site.driver.mode == "operator" and bool(site.packages.url or os_mirror(site))


def _https(site: Site) -> bool:
    """A source the driver container reads is https (osMirror when given, else packages.url)."""
    return any(u.startswith("https://") for u in os_mirror(site) or [site.packages.url or ""])


def site_ca(site: Site) -> Path | None:
    """packages.ca: the CA of the https package sources."""
    return site.packages.ca


def wants_ca(site: Site) -> bool:
    """The CA ConfigMap is rendered: a driver repository with an https source and packages.ca."""
    return wanted(site) and _https(site) and site_ca(site) is not None


def ca_key(release: Release) -> str:
    """The CA's key in the CA ConfigMap. Releases from v23.3.0 mount it into /usr/local/share/ca-certificates (Ubuntu:
    update-ca-certificates adds any *.crt there); older ones into /etc/ssl/certs, where apt reads only the bundle
    ca-certificates.crt -- so there the key IS the bundle's name (the site CA replaces the image's bundle)."""
    return "gpu-install-packages-ca.crt" if release.at_least(CA_DIR_MOVED) else "ca-certificates.crt"


# ---------------------------------------------------------------- values


def value_paths(site: Site, release: Release) -> dict[str, str]:
    """The values wanted() calls for: driver.repoConfig.configMapName (and driver.certConfig.name with a CA), {} when
    none. ConfigError (exit 2) when the release's chart lacks a key, or the site's own `values:` set them too."""
    if not wanted(site):
        return {}
    if site_ca(site) is not None and not _https(site):
        raise ConfigError("packages.ca is set, but no package source of the driver container is https "
                          f"({(os_mirror(site) or [site.packages.url or ''])[0]})",
                          hint="drop packages.ca, or give packages.url/osMirror as https:// URLs")
    own = site.values.get("driver")
    for key in ("repoConfig", "certConfig"):
        if isinstance(own, dict) and key in own:
            raise ConfigError(
                f"values.driver.{key}: gpu-install renders it from packages.url/packages.osMirror in driver.mode "
                "operator (its ConfigMap holds the site's repository and key); a values override would point the "
                "driver container elsewhere",
                hint=f"drop values.driver.{key} (or packages.url/osMirror, to manage the ConfigMap yourself)")
    out = {REPO_VALUE: REPO_CONFIGMAP, **({CA_VALUE: CA_CONFIGMAP} if wants_ca(site) else {})}
    missing = [p for p in out if not release.has_key(p)]
    if missing:
        raise ConfigError(
            f"packages.url/osMirror with driver.mode operator: GPU Operator {release.version}'s chart has no "
            f"{' or '.join(missing)}, so its driver container cannot be pointed at the site's package repository",
            hint="choose an operator.version whose chart has driver.repoConfig/driver.certConfig, or use "
                 "driver.mode precompiled (no packages needed) or host")
    return out


# ---------------------------------------------------------------- the ConfigMaps


@dataclass(frozen=True)
class NodeOs:
    tag: str  # ubuntu22.04, rocky9.5: the site repository's directory
    os_id: str
    version: str
    manager: str  # apt | dnf


def node_oses(nodes: Sequence[Node]) -> list[NodeOs]:
    """The GPU nodes' OSes, each once (sorted); ConfigError when there is none, or a node's is unknown or of a family
    without a package manager the driver container uses."""
    from installer import platforms

    if not nodes:
        raise ConfigError(
            "packages.url with driver.mode operator: the driver repository ConfigMap has one file per GPU node OS, "
            "and no GPU node is known",
            hint="give the inventory (-i) whose gpu_nodes say gpu_install_os (or --facts), or --os OSTAG")
    out: dict[str, NodeOs] = {}
    for node in nodes:
        if node.os_id is None or node.os_version is None:
            raise ConfigError(f"host {node.name}: OS unknown (gpu_install_os is not set), and the driver container "
                              "of driver.mode operator reads <packages.url>/packages/<os>",
                              hint="set gpu_install_os (e.g. ubuntu22.04) for the host or its group, or give "
                                   "--facts from `gpu-install nodes facts`")
        family = platforms.ANSIBLE_OS.get(node.os_id, ("", ""))[1]
        manager = {"Debian": "apt", "RedHat": "dnf"}.get(family)
        if manager is None:
            raise ConfigError(f"host {node.name}: {node.os_id}{node.os_version} has no apt or dnf repository format")
        tag = f"{node.os_id}{node.os_version}"
        out[tag] = NodeOs(tag, node.os_id, node.os_version, manager)
    return [out[k] for k in sorted(out)]


def _armored(path: Path, what: str, hint: str) -> str:
    """The armored OpenPGP public key block(s) of a key file, nothing around them."""
    from installer.safefile import read_text

    blocks = ARMORED.findall(read_text(path, what, limit=MAX_KEY_BYTES))
    if not blocks:
        raise ConfigError(f"{what} {path}: no armored OpenPGP public key in it", hint=hint)
    return "\n".join(b.replace("\r\n", "\n") for b in blocks) + "\n"


def _ca_text(path: Path) -> str:
    """packages.ca: its PEM certificates, each one parsed (ssl), nothing around them."""
    import ssl

    from installer.safefile import read_text

    hint = "give the CA certificate (PEM) that signed the package server's TLS certificate"
    certs = CERT.findall(read_text(path, "packages.ca", limit=MAX_KEY_BYTES))
    if not certs:
        raise ConfigError(f"packages.ca {path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)", hint=hint)
    text = "\n".join(c.replace("\r\n", "\n") for c in certs) + "\n"
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"packages.ca {path}: not a valid PEM certificate ({exc})", hint=hint) from None
    return text


def _site_files(site: Site, oses: list[NodeOs], sslcacert: str | None) -> dict[str, str]:
    from installer.mirror.packages.tools import COMPONENT, PACKAGES, SUITE, UPSTREAM_KEYS

    url = site.packages.url
    assert url and site.packages.key is not None  # the model requires the key with the url
    files = {KEY_FILE: _armored(Path(site.packages.key), "packages.key",
                                "give the key `gpu-install mirror push --repo-dir DIR` exported: "
                                "DIR/gpu-install-site.asc")}
    for o in oses:
        base = f"{url}/{PACKAGES}/{o.tag}"
        where = REPO_DIR[o.manager]
        head = (f"# Written by gpu-install: the site's package repository for {o.tag} GPU nodes (gpu-install mirror "
                f"push --repo-dir), signed by the site key.\n# A missing linux-headers/kernel-devel of a node's "
                f"kernel: {HEADERS_FIX}.\n")
        if o.manager == "apt":
            files[f"gpu-install-{o.tag}.list"] = (head + f"deb [signed-by={where}/{KEY_FILE}] {base} {SUITE} "
                                                  f"{COMPONENT}\n")
            continue
        upstream = Path(site.packages.key).parent / PACKAGES / o.tag / UPSTREAM_KEYS
        key_name = f"gpu-install-{o.tag}-upstream.asc"
        files[key_name] = _armored(upstream, f"the upstream keys of {o.tag}",
                                   f"copy DIR/{PACKAGES}/{o.tag}/{UPSTREAM_KEYS} of what `gpu-install mirror push "
                                   "--repo-dir DIR` published beside packages.key (the RHEL packages keep their "
                                   "upstream signatures)")
        files[f"gpu-install-{o.tag}.repo"] = (
            head + f"[gpu-install-{o.tag}]\nname=gpu-install site repository ({o.tag})\nbaseurl={base}\nenabled=1\n"
            f"gpgcheck=1\nrepo_gpgcheck=1\ngpgkey=file://{where}/{KEY_FILE} file://{where}/{key_name}\n"
            + (f"sslcacert={sslcacert}\n" if sslcacert and base.startswith("https://") else ""))
    return files


def _mirror_files(site: Site, oses: list[NodeOs], sslcacert: str | None) -> dict[str, str]:
    """packages.osMirror as the driver container reads it: apt the release's suites (<codename>, -updates, -security;
    Debian's security archive is elsewhere) of every archive root, signed-by the image's archive keyring; dnf one
    repository per URL, gpgcheck=1 with the distribution's key file. One node OS release only (see the module)."""
    if len(oses) > 1:
        raise ConfigError(
            f"packages.osMirror: the GPU nodes run {', '.join(o.tag for o in oses)}; the operator mounts one "
            "repository ConfigMap into every driver container, whatever its OS, so each container would read the "
            "mirror's suites of the other releases too and could install their packages",
            hint="use the site repository instead (packages.url without osMirror: each node OS's kernel packages "
                 "under its own path, `mirror pull` carries them), or one OS release on the GPU nodes")
    (o,) = oses
    urls = os_mirror(site)
    head = ("# Written by gpu-install: the site's OS mirror (packages.osMirror), checked with the OS vendor's keys the "
            "driver image holds.\n")
    if o.manager == "apt":
        codename = APT_CODENAMES.get(o.tag)
        keyring = APT_ARCHIVE_KEYRING.get(o.os_id)
        if codename is None or keyring is None:
            raise ConfigError(f"packages.osMirror: gpu-install knows no apt suites for {o.tag} nodes (known: "
                              f"{', '.join(sorted(APT_CODENAMES))})",
                              hint="use the site repository (packages.url without osMirror) instead")
        pockets = ("", "-updates") if o.os_id == "debian" else ("", "-updates", "-security")
        lines = [f"deb [signed-by={keyring}] {u} {codename}{p} main" for u in urls for p in pockets]
        return {f"gpu-install-os-mirror-{o.tag}.list": head + "\n".join(lines) + "\n"}
    key = DNF_DISTRIBUTION_KEY.get(o.os_id, "").format(major=o.version.split(".")[0])
    if not key:
        raise ConfigError(f"packages.osMirror: gpu-install knows no distribution key for {o.tag} nodes",
                          hint="use the site repository (packages.url without osMirror) instead")
    return {f"gpu-install-os-mirror-{o.tag}.repo": head + "\n".join(
        f"[gpu-install-os-mirror-{i}]\nname=site OS mirror {i} ({o.tag})\nbaseurl={u}\nenabled=1\ngpgcheck=1\n"
        f"gpgkey=file://{key}\n" + (f"sslcacert={sslcacert}\n" if sslcacert and u.startswith("https://") else "")
        for i, u in enumerate(urls, 1))}


def configmaps(site: Site, release: Release, nodes: Sequence[Node]) -> list[dict[str, Any]]:
    """The repository ConfigMap (and the CA ConfigMap) wanted() calls for, in the operator's namespace; [] when the
    driver container needs none. Every file read once, bounded, checked (an armored key, PEM certificates): ConfigError
    (exit 2) naming the file or host otherwise -- before anything is touched."""
    from installer import kube

    if not wanted(site):
        return []
    value_paths(site, release)  # the site's checks (resolve made them already)
    ca = site_ca(site)
    oses = node_oses(nodes)
    ca_text = _ca_text(ca) if ca is not None and wants_ca(site) else None
    sslcacert = f"{CA_DIR_RHEL}/{ca_key(release)}" if ca_text else None
    # osMirror instead of the site repository: `mirror pull` carries no kernel packages then
    data = _mirror_files(site, oses, sslcacert) if os_mirror(site) else _site_files(site, oses, sslcacert)
    wanted_data = {REPO_CONFIGMAP: data, **({CA_CONFIGMAP: {ca_key(release): ca_text}} if ca_text else {})}
    labels = {**kube.MANAGED_BY, "app.kubernetes.io/part-of": "gpu-install-driver"}
    out = []
    for name, items in wanted_data.items():
        size = sum(len(k) + len(v.encode()) for k, v in items.items())
        if size > MAX_CONFIGMAP_BYTES:
            raise ConfigError(f"ConfigMap {name}: {size} bytes, more than the API server stores",
                              hint="check packages.key, the upstream key files and packages.ca: a few KiB each")
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": site.operator.namespace, "labels": labels},
                    "data": items})
    return out


def removal_targets(site: Site) -> list[dict[str, Any]]:
    """The ConfigMaps uninstall removes when gpu-install made them (both names, whatever the site says now)."""
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n, "namespace": site.operator.namespace}}
            for n in (REPO_CONFIGMAP, CA_CONFIGMAP)]
