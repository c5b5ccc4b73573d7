#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only node probe for gpu-install preflight: facts plus the problems they show, each with its fix."""

DOCUMENTATION = r"""
module: preflight
short_description: Read-only checks of a GPU node before gpu-install changes anything
description:
  - Reads os-release, /proc, /sys and the package manager's view; changes nothing (check mode safe).
  - Returns C(facts) and C(problems) (a list of messages, each with a fix); the role fails on problems.
options:
  root: {type: path, default: /, description: read /etc, /proc, /sys below this directory (tests)}
  runtime: {type: str, choices: [containerd, docker], default: containerd}
  driver_mode: {type: str, choices: [host, runfile, operator, precompiled, preinstalled], default: operator}
  supported_os: {type: dict, default: {}, description: os-release ID -> list of VERSION_IDs (or majors)}
  architectures: {type: list, elements: str, default: [x86_64, aarch64]}
  disk_path: {type: str, default: /var/lib}
  min_free_gb: {type: float, default: 10}
  require_gpu: {type: bool, default: true}
  secure_boot_mode: {type: str, choices: ["off", require, auto], default: "off", description: site.yaml driver.secureBoot.mode}
  secure_boot_certificate: {type: str, default: "", description: the site's MOK certificate (DER, base64); with Secure Boot on, driver_mode host or runfile and secure_boot_mode require or auto, `mokutil --test-key` checks it is enrolled}
  secure_boot_certificate_sha256: {type: str, default: "", description: its SHA-256 fingerprint (named in messages)}
  require_kernel_headers: {type: bool, default: true, description: with driver_mode host or runfile; false only where the module cannot be built anyway (the lab)}
  sharing: {type: str, choices: [none, gpumanager, hami], default: none, description: site.yaml sharing.mode; gpumanager needs the cgroup v1 memory controller}
  inventory:
    type: dict
    default: {}
    description:
      - The inventory's node variables set for this host (gpu_install_os, gpu_install_os_id, gpu_install_os_version,
        gpu_install_kernel, gpu_install_arch, gpu_install_nvswitch); each is compared with the node, one problem per
        difference. A variable not given is not compared.
  host: {type: str, default: "", description: the inventory host name the messages name}
author: gpu-install
"""

import glob
import os
import base64
import re
import shutil
import tempfile

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any, Callable  # noqa: F401

EFI_SB = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
RUNTIME_BINS = {"docker": ["dockerd", "docker"], "containerd": ["containerd"]}


def _read(root, rel, default=None, binary=False):
    # type: (str, str, str | None, bool) -> Any
    try:
        with open(os.path.join(root, rel), "rb" if binary else "r") as fh:
            return fh.read()
    except (IOError, OSError):
        return default


def os_release(root):
    # type: (str) -> dict[str, str]
    """/etc/os-release (else /usr/lib/os-release, os-release(5)) as installer/node_facts.py reads it: a variable's
    first assignment counts, its value "x", 'x' or x (never expanded)."""
    text = _read(root, "etc/os-release")
    if text is None:
        text = _read(root, "usr/lib/os-release", "")
    out = {}  # type: dict[str, str]
    for line in (text or "").splitlines():
        m = re.match(r"^([A-Z_]+)=([\"']?)(.*)\2$", line.strip())
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(3).replace('\\"', '"').replace("\\\\", "\\")
    return out


def pci_nvswitches(root):
    # type: (str) -> list[str]
    """NVIDIA NVSwitches on the PCI bus: vendor 0x10de, class 0x0680xx (what installer/node_facts.py SCRIPT reads)."""
    found = []
    for dev in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*"))):
        vendor = (_read(dev, "vendor", "") or "").strip().lower()
        klass = (_read(dev, "class", "") or "").strip().lower()
        if vendor == "0x10de" and klass.startswith("0x0680"):
            found.append(os.path.basename(dev))
    return found


def pci_gpus(root):
    # type: (str) -> list[str]
    gpus = []
    for dev in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*"))):
        vendor = (_read(dev, "vendor", "") or "").strip().lower()
        klass = (_read(dev, "class", "") or "").strip().lower()
        if vendor == "0x10de" and klass.startswith("0x03"):
            gpus.append("%s [10de:%s]" % (os.path.basename(dev), (_read(dev, "device", "") or "").strip()[2:]))
    return gpus


def free_gb(root, path):
    # type: (str, str) -> float
    p = os.path.join(root, path.lstrip("/"))
    while not os.path.exists(p) and p not in ("/", ""):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return round(st.f_bavail * st.f_frsize / 1024.0 ** 3, 1)


def which(root, name):
    # type: (str, str) -> str | None
    if root in ("", "/"):
        return shutil.which(name)
    for d in ("usr/local/sbin", "usr/local/bin", "usr/sbin", "usr/bin", "sbin", "bin"):
        if os.access(os.path.join(root, d, name), os.X_OK):
            return "/" + d + "/" + name
    return None


def headers(root, kernel, os_family, run):
    # type: (str, str, str, Callable[[list[str]], tuple[int, str, str]]) -> str
    if os.path.isdir(os.path.join(root, "lib/modules", kernel, "build")):
        return "installed"
    # only package tools the node has (RHEL 9 has dnf, yum is a link to it; CentOS 7 has yum only): running a missing
    # one fails the module instead of answering
    if os_family == "debian" and which(root, "apt-cache"):
        rc, out, _ = run(["apt-cache", "policy", "linux-headers-" + kernel])
        m = re.search(r"Candidate:\s*(\S+)", out or "")
        return "available" if rc == 0 and m and m.group(1) != "(none)" else "missing"
    if os_family == "redhat":
        tool = next((t for t in ("dnf", "yum") if which(root, t)), None)
        if tool:
            rc, out, _ = run([tool, "-q", "list", "--available", "kernel-devel-" + kernel])
            return "available" if rc == 0 and "kernel-devel" in (out or "") else "missing"
    return "unknown"


def efi_secure_boot(data):
    # type: (bytes | None) -> bool | None
    """The SecureBoot EFI variable (4 attribute bytes, then the value byte): on, off, or None when not readable."""
    return None if data is None else (len(data) > 0 and bytearray(data)[-1] == 1)


def mokutil_sb_state(out):
    # type: (str) -> bool | None
    """`mokutil --sb-state`'s answer: "SecureBoot enabled" / "SecureBoot disabled"; None for anything else."""
    low = (out or "").lower()
    return True if "secureboot enabled" in low else False if "secureboot disabled" in low else None


def mokutil_enrolled(out):
    # type: (str) -> bool | None
    """`mokutil --test-key FILE`'s answer ("FILE is already enrolled" / "FILE is not enrolled"; its exit status
    differs between versions, its words do not); None for anything else."""
    low = (out or "").lower()
    return True if "is already enrolled" in low else False if "is not enrolled" in low else None


def secure_boot_on(efivar, mokutil):
    # type: (bool | None, bool | None) -> bool | None
    """On when either the EFI variable or mokutil says on; off when one says off and none on; None when neither
    could be read."""
    said = [x for x in (efivar, mokutil) if x is not None]
    return None if not said else any(said)


def enrolment_procedure():
    # type: () -> str
    """The one-time enrolment, said in few words: a failed task's message is cut at 500 characters."""
    return ("enrol it once: `mokutil --import cert.der` (driver.secureBoot.certificate as DER; sets a one-time "
            "password), reboot, confirm the enrolment in the MOK manager at the console, then re-run; gpu-install "
            "never enrols keys itself")


def secure_boot_problems(host, f, driver_mode, mode, enrolled, sha256=""):
    # type: (str, dict[str, Any], str, str, bool | None, str) -> list[str]
    """What the node's Secure Boot state (f["secure_boot"], f["mokutil"]) means for the site's driver.secureBoot.mode
    and driver.mode; enrolled: `mokutil --test-key`'s answer for the site certificate (None: not asked or no answer).
    Pure: the module asks mokutil, this decides."""
    on = f["secure_boot"]
    name = "host %s: " % host if host else ""
    if mode == "require" and not on:
        state = "off" if on is False else "not readable (no EFI variable, no mokutil)"
        return [name + "Secure Boot is %s and driver.secureBoot.mode is require: enable Secure Boot in the firmware "
                "setup, or set driver.secureBoot.mode auto" % state]
    if not on:
        return []
    if mode == "off":
        if driver_mode in ("host", "runfile", "operator"):
            return [name + "Secure Boot is on and driver.secureBoot.mode is off: a driver built on the node (driver.mode "
                    "%s) will not load unsigned; set driver.secureBoot (mode auto with the site's certificate and "
                    "signingKey, driver.mode host or runfile), use driver.mode precompiled, or disable Secure Boot"
                    % driver_mode]
        return []
    if driver_mode not in ("host", "runfile"):
        return []
    if not f.get("mokutil"):
        return [name + "Secure Boot is on and mokutil is not installed: install the mokutil package on the node "
                "(preflight tests the site certificate's enrolment with `mokutil --test-key`)"]
    if enrolled is None:
        return [name + "`mokutil --test-key` gave no answer for the site certificate (SHA-256 %s): run it on the "
                "node to see why" % (sha256 or "?")]
    if not enrolled:
        return [name + "Secure Boot is on and the site certificate (SHA-256 %s) is not enrolled: the kernel would "
                "reject a module signed with it; " % (sha256 or "?") + enrolment_procedure()]
    return []


def test_key(root, run, mokutil, der):
    # type: (str, Callable[[list[str]], tuple[int, str, str]], str, bytes) -> bool | None
    """`mokutil --test-key` on the certificate written to a temporary file on the node, removed after."""
    fd, path = tempfile.mkstemp(prefix="gpu-install-mok-", suffix=".der")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(der)
        _, out, err = run([tool_path(root, mokutil), "--test-key", path])
        return mokutil_enrolled((out or "") + (err or ""))
    finally:
        os.unlink(path)


def tool_path(root, found):
    # type: (str, str) -> str
    """A tool which() found, as run on this machine: below root in tests."""
    return found if root in ("", "/") else os.path.join(root, found.lstrip("/"))


def probe(root, run, kernel=None, arch=None, check_headers=False):
    # type: (str, Callable[[list[str]], tuple[int, str, str]], str | None, str | None, bool) -> dict[str, Any]
    rel = os_release(root)
    os_id = rel.get("ID", "").lower()
    like = (os_id + " " + rel.get("ID_LIKE", "")).lower()
    family = "debian" if ("debian" in like or "ubuntu" in like) else "redhat" if re.search(r"rhel|fedora|centos", like) else ""
    kernel = kernel or os.uname()[2]
    modules = set(line.split(" ", 1)[0] for line in (_read(root, "proc/modules", "") or "").splitlines())
    efivar = efi_secure_boot(_read(root, EFI_SB, binary=True))
    mokutil = which(root, "mokutil")
    sb_state = None
    if mokutil:
        rc, out, err = run([tool_path(root, mokutil), "--sb-state"])
        sb_state = mokutil_sb_state((out or "") + (err or ""))
    facts = {
        "os_id": os_id, "os_version": rel.get("VERSION_ID", ""), "os_family": family,
        "arch": arch or os.uname()[4], "kernel": kernel,
        "secure_boot": secure_boot_on(efivar, sb_state),
        "secure_boot_efivar": efivar, "secure_boot_mokutil": sb_state, "mokutil": mokutil,
        "nouveau_loaded": "nouveau" in modules,
        "nvidia_loaded": "nvidia" in modules or os.path.exists(os.path.join(root, "proc/driver/nvidia/version")),
        "nvidia_driver": ((_read(root, "proc/driver/nvidia/version", "") or "").splitlines() or [""])[0],
        "gpus": pci_gpus(root),
        "nvswitches": pci_nvswitches(root),
        "runtimes": dict((n, which(root, RUNTIME_BINS[n][0])) for n in RUNTIME_BINS),
        "kernel_headers": headers(root, kernel, family, run) if check_headers else "not checked",
        # cgroup2fs: the unified hierarchy (v2); tmpfs with controller directories: v1 (or hybrid)
        "cgroup_v1_memory": os.path.isdir(os.path.join(root, "sys/fs/cgroup/memory")),
    }
    return facts


#: installer/facts.py split_os: gpu_install_os is ID followed by VERSION_ID (ubuntu22.04, rocky9.5, rocky-9.5)
OSTAG = re.compile(r"^([a-z][a-z-]*?)-?(\d[\w.\-]*)\Z")
FACTS_FIX = "correct the inventory, or regenerate it from `gpu-install nodes facts -i INV -o facts.json`"


def inventory_differences(host, given, f):
    # type: (str, dict[str, Any], dict[str, Any]) -> list[str]
    """One message per node variable the inventory sets for this host (given) whose value is not the node's (f,
    probe()'s facts), each naming the host, the variable and both values, all of them; the last one ends with the
    fix, said once (a failed task's message is cut at 500 characters: installer/progress.py). Variables not set
    (absent, None, empty) are not compared. The OS is compared as installer/facts.py reads it: ID lowercased, VERSION_ID verbatim."""
    out = []  # type: list[str]
    node_os = "%s%s" % (f["os_id"], f["os_version"])

    def differs(var, said, found, verb="runs", note=""):
        # type: (str, str, str, str, str) -> None
        out.append("host %s: %s is '%s' in the inventory, the node %s '%s'%s" % (host, var, said, verb, found, note))

    def text(var):
        # type: (str) -> str | None
        value = given.get(var)
        return None if value is None or value == "" else str(value)

    tag = text("gpu_install_os")
    if tag is not None:
        m = OSTAG.match(tag.strip().lower())
        if m is None:
            out.append("host %s: gpu_install_os '%s' is not an OS tag (ID followed by VERSION_ID, e.g. ubuntu22.04); the "
                       "node runs '%s'" % (host, tag, node_os))
        elif (m.group(1), m.group(2)) != (f["os_id"], f["os_version"]):
            differs("gpu_install_os", tag, node_os)
    os_id = text("gpu_install_os_id")
    if os_id is not None and os_id.lower() != f["os_id"]:
        differs("gpu_install_os_id", os_id, f["os_id"])
    os_version = text("gpu_install_os_version")
    if os_version is not None and os_version != f["os_version"]:
        differs("gpu_install_os_version", os_version, f["os_version"])
    for var, fact in (("gpu_install_kernel", "kernel"), ("gpu_install_arch", "arch")):
        value = text(var)
        if value is not None and value != f[fact]:
            differs(var, value, f[fact])
    nvswitch = given.get("gpu_install_nvswitch")
    if nvswitch is not None and nvswitch != "":
        count = len(f["nvswitches"])
        if not isinstance(nvswitch, bool):
            out.append("host %s: gpu_install_nvswitch must be true or false, not '%s'" % (host, nvswitch))
        elif nvswitch != (count > 0):
            note = " (%d NVSwitch on PCI)" % count if count else " (no NVSwitch on PCI)"
            differs("gpu_install_nvswitch", str(nvswitch).lower(), str(count > 0).lower(), verb="has", note=note)
    if out:
        out[-1] += ": " + FACTS_FIX
    return out


def problems(f, runtime, driver_mode, supported_os, architectures, min_free_gb, require_gpu,
             require_kernel_headers=True, sharing="none"):
    # type: (dict[str, Any], str, str, dict[str, list[object]], list[str], float, bool, bool, str) -> list[str]
    """The node's problems other than the inventory's (inventory_differences) and Secure Boot's (secure_boot_problems)."""
    out = []
    if sharing == "gpumanager" and not f.get("cgroup_v1_memory"):
        out.append("sharing.mode gpumanager: gpu-manager finds containers' cgroups under /sys/fs/cgroup/memory (cgroup "
                   "v1 only), and this node has no such directory (cgroup v2, the unified hierarchy): boot it with "
                   "systemd.unified_cgroup_hierarchy=0, or use another sharing mode for it")
    versions = [str(v) for v in supported_os.get(f["os_id"], [])]
    ver = f["os_version"]
    if not any(ver == v or ver.split(".")[0] == v for v in versions):
        known = ", ".join("%s %s" % (k, "/".join(str(x) for x in v)) for k, v in sorted(supported_os.items()))
        out.append("OS %s %s is not supported; supported: %s" % (f["os_id"] or "?", ver or "?", known))
    if f["arch"] not in architectures:
        out.append("architecture %s is not supported (%s)" % (f["arch"], ", ".join(architectures)))
    if f["disk_free_gb"] < min_free_gb:
        out.append("only %.1f GiB free under %s, need %s GiB: free space or set preflight_min_free_gb"
                   % (f["disk_free_gb"], f["disk_path"], min_free_gb))
    if driver_mode in ("host", "runfile") and f["kernel_headers"] == "missing" and require_kernel_headers:
        out.append("kernel headers for the running kernel %s are not installed nor available from the configured "
                   "repositories: add them to the (mirrored) repository or boot a kernel that has them" % f["kernel"])
    # host/runfile: the driver role blacklists nouveau, rebuilds the initramfs and reports (or, by rebootPolicy,
    # does) the reboot -- refusing here would block the very run that fixes it
    if driver_mode in ("operator", "precompiled") and f["nouveau_loaded"]:
        out.append("the nouveau driver is loaded and the driver container cannot load the NVIDIA driver beside it: "
                   "blacklist it (modprobe.d 'blacklist nouveau', rebuild the initramfs) and reboot, or use "
                   "driver.mode host/runfile (gpu-install then does the blacklisting)")
    if driver_mode in ("operator", "precompiled") and f["nvidia_loaded"]:
        out.append("an NVIDIA driver is already loaded on the host (%s) but driver.mode is %s: the driver container "
                   "would fight it; uninstall the host driver or set driver.mode: preinstalled"
                   % (f["nvidia_driver"] or "nvidia module", driver_mode))
    if driver_mode == "preinstalled" and not f["nvidia_loaded"]:
        out.append("driver.mode is preinstalled but no NVIDIA driver is loaded: install/load it or choose another mode")
    if not f["runtimes"].get(runtime):
        out.append("container runtime %s not found (%s): install it first or set runtime in site.yaml"
                   % (runtime, RUNTIME_BINS[runtime][0]))
    if require_gpu and not f["gpus"]:
        out.append("no NVIDIA GPU on PCI (vendor 10de, class 03xx): is this a GPU node? (preflight_require_gpu: false "
                   "to skip)")
    return out


def main():
    # type: () -> None
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            runtime=dict(type="str", choices=["containerd", "docker"], default="containerd"),
            driver_mode=dict(type="str", choices=["host", "runfile", "operator", "precompiled", "preinstalled"],
                             default="operator"),
            supported_os=dict(type="dict", default={}),
            architectures=dict(type="list", elements="str", default=["x86_64", "aarch64"]),
            disk_path=dict(type="str", default="/var/lib"),
            min_free_gb=dict(type="float", default=10),
            require_gpu=dict(type="bool", default=True),
            secure_boot_mode=dict(type="str", choices=["off", "require", "auto"], default="off"),
            secure_boot_certificate=dict(type="str", default=""),
            secure_boot_certificate_sha256=dict(type="str", default=""),
            require_kernel_headers=dict(type="bool", default=True),
            sharing=dict(type="str", choices=["none", "gpumanager", "hami"], default="none"),
            inventory=dict(type="dict", default={}),
            host=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    facts = probe(p["root"], module.run_command, check_headers=p["driver_mode"] in ("host", "runfile"))
    facts["disk_path"], facts["disk_free_gb"] = p["disk_path"], free_gb(p["root"], p["disk_path"])
    found = inventory_differences(p["host"], p["inventory"], facts)
    found += problems(facts, p["runtime"], p["driver_mode"], p["supported_os"], p["architectures"], p["min_free_gb"],
                     p["require_gpu"], p["require_kernel_headers"], p["sharing"])
    mode, enrolled = p["secure_boot_mode"], None
    if facts["secure_boot"] and mode != "off" and p["driver_mode"] in ("host", "runfile") and facts["mokutil"]:
        try:
            der = base64.b64decode(p["secure_boot_certificate"], validate=True)
        except (TypeError, ValueError):
            der = b""
        if not der:
            module.fail_json(msg="secure_boot_certificate: the site certificate (DER, base64) is required with "
                                 "secure_boot_mode %s and driver_mode %s" % (mode, p["driver_mode"]))
        enrolled = test_key(p["root"], module.run_command, facts["mokutil"], der)
    found += secure_boot_problems(p["host"], facts, p["driver_mode"], mode, enrolled,
                                  p["secure_boot_certificate_sha256"])
    module.exit_json(changed=False, facts=facts, problems=found)


if __name__ == "__main__":
    main()
