"""Site → the variables the Ansible roles get (pure). installer.plan.resolve calls role_vars() once per command;
tests/unit/test_ansible_apply.py keeps every variable declared in the roles' meta/argument_specs.yml.
"""

from __future__ import annotations

import base64
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from installer.catalog import Release
from installer.config import Site, runfile_version
from installer.errors import ConfigError
from installer.facts import Node

CERTS_D = "/etc/containerd/certs.d"
DOCKER_CERTS_D = "/etc/docker/certs.d"


_PKG_VERSION = re.compile(r"^v?(\d+(?:\.\d+)+(?:-\d[0-9A-Za-z.+~]*)?)(?:-[A-Za-z][0-9A-Za-z.+~-]*)?\Z")


def toolkit_package_version(tag: str) -> str:
    """The toolkit's package version from an image tag or version: v1.17.4-ubuntu20.04 -> 1.17.4, v1.18.0 -> 1.18.0,
    1.17.4-1 (a package revision) stays."""
    m = _PKG_VERSION.match(tag.strip())
    if not m:
        raise ConfigError(f"toolkit.version {tag!r} is not a toolkit version",
                          hint="use the toolkit release, e.g. 1.17.4 or v1.17.4-ubuntu20.04")
    return m.group(1)


def _toolkit_version(site: Site, release: Release) -> str:
    if site.toolkit.version:
        return toolkit_package_version(site.toolkit.version)
    comp = release.components.get("toolkit")
    if not comp or not comp.version:
        raise ConfigError(f"operator {site.operator.version}: the catalog pins no toolkit version",
                          hint="set toolkit.version in the site file")
    return toolkit_package_version(comp.version)


# ---------------------------------------------------------------- the host driver: branch and kernel modules

#: from R560 NVIDIA's installers install the open kernel modules by default (driver-facts.md, "Open and proprietary
#: kernel modules"); before, the proprietary ones
OPEN_DEFAULT_BRANCH = 560
#: the first branch with open GPU kernel modules (NVIDIA/open-gpu-kernel-modules starts at 515.43.04)
FIRST_OPEN_BRANCH = 515
#: GPU architectures the open kernel modules do not support (they need Turing or later)
NO_OPEN = ("Volta", "Pascal", "Maxwell", "Kepler")
KernelModuleType = Literal["open", "proprietary"]


@dataclass(frozen=True)
class HostDriver:
    """What driver.mode host/runfile installs on the nodes, and why (`config check` says both)."""

    version: str  # the role's nvidia_driver_package_version: a branch (580) or an exact version
    version_why: str
    module_type: KernelModuleType
    module_why: str
    release_driver: str | None = None  # the release's pinned driver the branch comes from (driver.version unset)


def _branch_number(version: str) -> int | None:
    head = version.split(".")[0]
    return int(head) if head.isdigit() else None


def needs_open(node: Node) -> str | None:
    """Why the node's GPUs need the open kernel modules (NVIDIA supports only those on Blackwell and on Grace Hopper,
    driver-facts.md), else None. From the node's facts (Node.gpu_architectures, Node.arch)."""
    archs = node.gpu_architectures
    if "Blackwell" in archs:
        return "Blackwell GPUs"
    if "Hopper" in archs and node.arch == "aarch64":
        return "a Grace Hopper superchip (a Hopper GPU on an aarch64 node: GH200)"
    return None


def no_open(node: Node) -> str | None:
    """Why the open kernel modules cannot drive the node's GPUs (architectures before Turing), else None."""
    old = [a for a in node.gpu_architectures if a in NO_OPEN]
    return f"{'/'.join(old)} GPUs" if old else None


def _facts_source(node: Node) -> str:
    return node.facts_from or "the node facts"


def _module_type(site: Site, branch: int | None, nodes: Sequence[Node]) -> tuple[KernelModuleType, str]:
    """driver.kernelModuleType for the host driver, checked against what the nodes' facts say of their GPUs and against
    the branch; raises ConfigError (exit 2) naming the host, its GPUs and the fix when the flavour cannot drive them."""
    asked = site.driver.kernelModuleType or "auto"
    need = [(n, why) for n in nodes if (why := needs_open(n))]
    old = [(n, why) for n in nodes if (why := no_open(n))]
    chosen: KernelModuleType
    if asked == "proprietary" and need:
        n, why = need[0]
        raise ConfigError(
            f"host {n.name}: driver.kernelModuleType is proprietary, and the node has {why} ({_facts_source(n)}), "
            "which NVIDIA supports only with the open GPU kernel modules",
            hint="set driver.kernelModuleType: open (or auto, or leave it unset: gpu-install then installs the open "
                 "modules on these GPUs)")
    if asked == "open" and old:
        n, why = old[0]
        raise ConfigError(
            f"host {n.name}: driver.kernelModuleType is open, and the node has {why} ({_facts_source(n)}), which the "
            "open GPU kernel modules do not support (they need Turing or later)",
            hint="set driver.kernelModuleType: proprietary (or auto, or leave it unset)")
    if asked in ("open", "proprietary"):
        chosen, why = ("open" if asked == "open" else "proprietary"), f"driver.kernelModuleType: {asked}"
    elif need and old:
        (a, why_a), (b, why_b) = need[0], old[0]
        raise ConfigError(
            f"host {a.name} has {why_a}, which need the open GPU kernel modules, and host {b.name} has {why_b}, which "
            "the open modules do not support: one driver.kernelModuleType cannot serve both",
            hint="install them separately: a site file per group of nodes (each with its own driver.kernelModuleType), "
                 "each applied with --limit to its group")
    elif need:
        n, why_n = need[0]
        chosen, why = "open", f"auto: host {n.name} has {why_n} ({_facts_source(n)}), which need the open modules"
    elif old:
        n, why_o = old[0]
        chosen, why = "proprietary", (f"auto: host {n.name} has {why_o} ({_facts_source(n)}), which the open modules "
                                      "do not support")
    elif branch is not None and branch >= OPEN_DEFAULT_BRANCH:
        chosen, why = "open", f"auto: branch {branch} >= {OPEN_DEFAULT_BRANCH}, where NVIDIA's default is the open modules"
    else:
        chosen, why = "proprietary", (f"auto: branch {branch} < {OPEN_DEFAULT_BRANCH}, where NVIDIA's default is the "
                                      "proprietary modules" if branch is not None else "auto: proprietary")
    if chosen == "open" and branch is not None and branch < FIRST_OPEN_BRANCH:
        raise ConfigError(f"the host driver's kernel modules are open ({why}), and driver branch {branch} has none "
                          f"(NVIDIA publishes open GPU kernel modules from R{FIRST_OPEN_BRANCH})",
                          hint=f"pin a branch from {FIRST_OPEN_BRANCH} on in driver.version"
                               + ("" if need else ", or set driver.kernelModuleType: proprietary"))
    return chosen, why


def host_driver(site: Site, release: Release, nodes: Sequence[Node] = ()) -> HostDriver | None:
    """driver.mode host/runfile: the version the role pins and the kernel modules' flavour, each with where it comes
    from (None in the other modes). host: driver.version, else the branch of the release's pinned driver (the
    catalog's driver component: the operator's own default); runfile: the runfile's exact version. The flavour:
    driver.kernelModuleType, auto (or unset) resolved from the branch and the nodes' GPUs (_module_type)."""
    mode = site.driver.mode
    if mode == "runfile":
        version = site.driver.version or runfile_version(site.driver.runfile or "") or ""
        why = "driver.version" if site.driver.version else "the version in driver.runfile's name"
    elif mode == "host":
        if site.driver.version:
            version, why = site.driver.version, "driver.version in the site pins it"
        else:
            comp = release.components.get("driver")
            pinned = comp.version if comp else None
            if not pinned or _branch_number(pinned) is None:
                raise ConfigError(f"operator {release.version}: the catalog pins no driver version to take the host "
                                  "driver's branch from", hint="set driver.version (a branch such as 580, or a version)")
            version = str(_branch_number(pinned))
            why = f"the release {release.version} pins driver {pinned}; driver.version unset"
            module_type, module_why = _module_type(site, _branch_number(version), nodes)
            return HostDriver(version, why, module_type, module_why, pinned)
    else:
        return None
    module_type, module_why = _module_type(site, _branch_number(version), nodes)
    return HostDriver(version, why, module_type, module_why)


def open_only_devices() -> tuple[dict[str, str], dict[str, str]]:
    """PCI device ids (0x2901) of the GPUs NVIDIA supports only with the open kernel modules, from the shipped PCI id
    table (installer/data/nvidia-pci-ids.tsv) -> what they are: Blackwell GPUs (chips GB*) anywhere, and Hopper GPUs
    (GH100) that are open-only on an aarch64 node (Grace Hopper). NVSwitches are not GPUs and are left out."""
    from installer.node_facts import architecture_of, pci_table

    anywhere: dict[str, str] = {}
    aarch64: dict[str, str] = {}
    for dev, (chip, name) in sorted(pci_table().items()):
        if "NVSwitch" in name:
            continue
        arch = architecture_of(chip)
        if arch == "Blackwell":
            anywhere[dev] = f"{name} ({chip}, Blackwell)"
        elif arch == "Hopper":
            aarch64[dev] = f"{name} ({chip}, Hopper: Grace Hopper on an aarch64 node)"
    return anywhere, aarch64


def _host_driver_vars(site: Site, release: Release, nodes: Sequence[Node]) -> dict[str, Any]:
    """The nvidia_driver role's version, kernel modules flavour and open-only device ids (host/runfile modes)."""
    hd = host_driver(site, release, nodes)
    if hd is None:
        # operator/precompiled/preinstalled: the role only checks for host drivers; driver.version as given
        return {"nvidia_driver_package_version": site.driver.version} if site.driver.version else {}
    anywhere, aarch64 = open_only_devices()
    return {"nvidia_driver_package_version": hd.version,
            "nvidia_driver_kernel_module_type": hd.module_type,
            "nvidia_driver_open_only_devices": anywhere,
            "nvidia_driver_open_only_aarch64_devices": aarch64}


#: a certificate or a private key larger than this is not one (an RSA-4096 PEM key is about 3.3 KB)
_KEY_FILE_MAX = 64 * 1024


@dataclass(frozen=True)
class SiteKey:
    """The site's MOK certificate, checked (driver.secureBoot.certificate): its DER bytes and fingerprints."""
    der: bytes
    sha1: str
    sha256: str


def _read_key_file(path: Path, field: str) -> bytes:
    """The file's bytes, read once and bounded; ConfigError naming the field when it is missing or too large."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(_KEY_FILE_MAX + 1)
    except OSError as exc:
        raise ConfigError(f"{field} {path}: cannot read it ({exc.strerror})",
                          hint=f"set {field} to an existing file on the controller (relative to the site file)") from None
    if len(data) > _KEY_FILE_MAX:
        raise ConfigError(f"{field} {path}: larger than {_KEY_FILE_MAX} bytes, not a key file",
                          hint=f"set {field} to the site's MOK file")
    return data


def site_key(site: Site) -> SiteKey:
    """driver.secureBoot's certificate (an X.509 certificate, DER or PEM) and signingKey (a regular file, no access
    for group or other, an unencrypted private key whose public key is the certificate's), checked; ConfigError (exit
    2) naming the field otherwise. The private key is read once here and never kept, logged nor passed on: only its
    path is named in messages."""
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes, serialization

    sb = site.driver.secureBoot
    if sb.certificate is None or sb.signingKey is None:
        raise ConfigError("driver.secureBoot needs certificate and signingKey",
                          hint="set both to the site's MOK files on the controller")
    cert_path = Path(sb.certificate).expanduser().absolute()
    data = _read_key_file(cert_path, "driver.secureBoot.certificate")
    try:
        cert = (x509.load_pem_x509_certificate(data) if b"-----BEGIN CERTIFICATE-----" in data
                else x509.load_der_x509_certificate(data))
    except ValueError:
        raise ConfigError(f"driver.secureBoot.certificate {cert_path}: not an X.509 certificate (DER or PEM)",
                          hint="give the MOK certificate, e.g. MOK.der from `openssl req -new -x509 -outform DER ...`"
                          ) from None
    key_path = Path(sb.signingKey).expanduser().absolute()
    field = "driver.secureBoot.signingKey"
    try:
        st = key_path.stat()
    except OSError as exc:
        raise ConfigError(f"{field} {key_path}: {exc.strerror}",
                          hint=f"set {field} to the private key of driver.secureBoot.certificate") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{field} {key_path}: not a regular file", hint=f"set {field} to the private key file")
    if st.st_mode & 0o077:
        raise ConfigError(f"{field} {key_path}: mode {stat.S_IMODE(st.st_mode):04o} lets group or other users access "
                          "the site's signing key", hint=f"chmod 600 {key_path}")
    raw = _read_key_file(key_path, field)
    try:
        key = (serialization.load_pem_private_key(raw, password=None) if b"-----BEGIN" in raw
               else serialization.load_der_private_key(raw, password=None))
    except TypeError:  # encrypted: DKMS and the runfile's sign-file read an unencrypted key
        raise ConfigError(f"{field} {key_path}: the private key is encrypted (a passphrase)",
                          hint="give the unencrypted key (kept 0600 on the controller): DKMS and the runfile sign "
                               "without a passphrase prompt") from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(f"{field} {key_path}: not a private key (PEM or DER)",
                          hint=f"set {field} to the private key of driver.secureBoot.certificate") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
        raise ConfigError(f"{field} {key_path} is not the private key of driver.secureBoot.certificate {cert_path}",
                          hint="give the key and the certificate of the same MOK pair")
    del raw, key
    return SiteKey(cert.public_bytes(serialization.Encoding.DER), cert.fingerprint(hashes.SHA1()).hex(),  # noqa: S303
                   cert.fingerprint(hashes.SHA256()).hex())


def _secure_boot_vars(site: Site) -> dict[str, Any]:
    """Preflight's Secure Boot inputs: the mode and, where the module is built on the node (host, runfile) with Secure
    Boot allowed, the site certificate's DER bytes (base64) and SHA-256 to test enrolment with -- never the key."""
    sb = site.driver.secureBoot
    checked = sb.mode != "off" and site.driver.mode in ("host", "runfile")
    key = site_key(site) if checked else None
    return {"preflight_secure_boot_mode": sb.mode,
            "preflight_secure_boot_certificate": base64.b64encode(key.der).decode() if key else "",
            "preflight_secure_boot_certificate_sha256": key.sha256 if key else ""}


def role_vars(site: Site, release: Release, nodes: Sequence[Node] = ()) -> dict[str, Any]:
    """The variables Python hands to the roles (each declared in a role's meta/argument_specs.yml). nodes: the GPU
    nodes of the plan (their facts decide the host driver's kernel modules, see host_driver)."""
    from installer import features

    host_toolkit = site.toolkit.mode == "host"  # operator mode: the toolkit container configures the runtime
    # with CDI, pods pick the runtime through a RuntimeClass; a feature may need plain runc as the default (its
    # default_runtime; one needing nvidia refuses CDI on in its conflicts)
    nvidia_default = site.cdi.enabled is not True and features.default_runtime(site) != "runc"
    trust = bool(site.registry.ca or site.registry.insecure)
    return {
        "gpu_install_action": "deploy",
        "preflight_runtime": site.runtime,
        "preflight_driver_mode": site.driver.mode,
        "preflight_sharing_mode": site.sharing.mode,
        **_secure_boot_vars(site),
        "docker_runtime_enabled": site.runtime == "docker" and host_toolkit,
        "docker_runtime_default_runtime": "nvidia" if nvidia_default else "",
        "docker_runtime_insecure_registries": [site.registry.host] if site.registry.insecure else [],
        "containerd_runtime_enabled": site.runtime == "containerd" and host_toolkit,
        "containerd_runtime_set_default": nvidia_default,
        "containerd_runtime_registry_config_path": CERTS_D if trust else "",
        "registry_trust_enabled": trust,
        "registry_trust_host": site.registry.host,
        # a path on the controller (load_site made a relative one relative to the site file)
        "registry_trust_ca_src": str(Path(site.registry.ca).expanduser().absolute()) if site.registry.ca else "",
        "registry_trust_insecure": site.registry.insecure,
        "registry_trust_docker_certs_d": DOCKER_CERTS_D if site.runtime == "docker" else "",
        "registry_trust_containerd_config_path": CERTS_D if site.runtime == "containerd" else "",
        "registry_trust_restart_containerd": site.runtime == "containerd",
        # every mode: host installs; operator/precompiled refuse host driver packages; preinstalled checks nvidia-smi
        "nvidia_driver_mode": site.driver.mode,
        "nvidia_driver_reboot": site.driver.rebootPolicy,
        "nvidia_driver_serial": str(site.driver.serial),
        # host: driver.version, else the branch of the release's pinned driver; runfile: the exact version (driver.version,
        # else the one in the file name; the site model checked they agree); with them the kernel modules' flavour
        **_host_driver_vars(site, release, nodes),
        # driver.mode runfile: the .run installer (URL in the site's file mirror or a controller path) and its sha256
        **({"nvidia_driver_runfile": site.driver.runfile,
            "nvidia_driver_runfile_sha256": site.driver.runfileSha256 or ""}
           if site.driver.mode == "runfile" else {}),
        # the site's signed package repository (mirror push --repo-dir) wherever the roles install packages
        "package_repo_enabled": bool(site.packages.url) and (host_toolkit or site.driver.mode in ("host", "runfile")),
        "package_repo_url": site.packages.url or "",
        "package_repo_key_src": str(Path(site.packages.key).expanduser().absolute()) if site.packages.key else "",
        "nvidia_container_toolkit_enabled": host_toolkit,
        **({"nvidia_container_toolkit_version": _toolkit_version(site, release)} if host_toolkit else {}),
        # the features' own (e.g. the mig_mode role's, for dynamic MIG)
        **features.role_vars(site),
        # control plane: no extenders -> the role does nothing; the site's, then the active features'
        "scheduler_policy_extenders": [e.model_dump(exclude_none=True, exclude_defaults=True) | {"urlPrefix": e.urlPrefix}
                                       for e in features.extenders(site)],
        "scheduler_policy_format": site.scheduler.format,
        "scheduler_policy_kubernetes_version": site.scheduler.kubernetesVersion or "",
    }
