"""Node checks: parsed `nvidia-smi -q -x` facts + what the site expects → findings (pure functions).

check_node() takes what was read on one host (an NvidiaSmi document or DriverNotLoaded), the NVIDIA GPUs the
host's PCI bus shows (`lspci` lines, see nvidia_pci_devices()) and the site's expectations, and returns findings.
Check ids and fixes are listed in docs/validate.md ("Node checks").

The NVSwitch fabric (node.fabric) is checked on a node the site says has NVSwitches (Expectations.nvswitch:
gpu_install_nvswitch, the facts file, or nvidia_driver_fabric_manager: true) and on any node one of whose GPUs reports a
fabric state: every GPU must say Completed / Success, the state in which Fabric Manager has set the fabric up and CUDA
can start. A node without NVSwitches reports N/A and is not checked. Pre-Hopper GPUs (HGX A100) report N/A even with
Fabric Manager running: on a node said to have NVSwitches that is a warning naming the service to look at.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from installer.validate.nvsmi import DriverNotLoaded, Gpu, NvidiaSmi

Severity = Literal["error", "warning", "info"]

#: Active throttle reasons worth a warning (gpu_idle, sw_power_cap, applications/display clocks, sync boost are
#: normal operation).
HARDWARE_THROTTLE = {
    "hw_slowdown": "HW slowdown (the board asserted slowdown: overheating, power brake or a PSU fault)",
    "hw_thermal_slowdown": "HW thermal slowdown (the GPU is too hot)",
    "hw_power_brake_slowdown": "HW power brake (the system asked the GPU to cut power)",
    "sw_thermal_slowdown": "SW thermal slowdown (the driver holds clocks down to stay under the temperature limit)",
}

#: Every check id check_node() can report (docs/validate.md, "Node checks"); the report lists the others as passed.
#: node.fabric is not among them: it applies to NVSwitch nodes only, and says itself that it passed (FABRIC).
CHECKS = (
    "node.driver.not-loaded", "node.driver.version", "node.gpu.count", "node.gpu.persistence", "node.mig.pending",
    "node.mig.layout", "node.gpu.ecc-pending", "node.gpu.ecc-dbe", "node.gpu.retired-pages-pending",
    "node.gpu.row-remap-pending", "node.gpu.row-remap-failure", "node.gpu.throttle", "node.gpu.temperature",
    "node.gpu.power",
)
FABRIC = "node.fabric"

_PCI_LINE = re.compile(
    r"^(?P<addr>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r"(?P<cls>[^:\[]*?)\s*(?:\[(?P<code>[0-9a-fA-F]{4})\])?:\s*(?P<rest>.*)$")
_GPU_CLASSES = ("vga compatible controller", "3d controller", "display controller")


@dataclass(frozen=True)
class Finding:
    check: str  # e.g. "node.gpu.ecc-dbe"
    severity: Severity
    host: str
    message: str  # names the host and, where it is about one, the GPU
    fix: str
    gpu_index: int | None = None
    gpu_uuid: str | None = None


@dataclass(frozen=True)
class Expectations:
    """What the site says a GPU node should look like. None: not checked."""

    driver_version: str | None = None  # an exact version (535.54.03) or a branch (535)
    mig_config: str | None = None  # the node's nvidia.com/mig.config (all-disabled, all-1g.10gb, all-balanced, …)
    nvswitch: bool | None = None  # the node has NVSwitches (fabric_expected()); None: unknown
    signer: SignerExpectation | None = None  # driver.secureBoot: who must have signed the nvidia module; None: unchecked


def normalize_bus_id(bus_id: str) -> str:
    """00000000:01:00.0 (nvidia-smi), 0000:01:00.0 (lspci -D) and 01:00.0 (lspci) → 0000:01:00.0."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:
        return f"0000:{text}"
    domain, rest = parts[0], ":".join(parts[1:])
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def nvidia_pci_devices(lspci: str | Iterable[str]) -> tuple[str, ...]:
    """The NVIDIA GPUs in `lspci` / `lspci -D` / `lspci -Dnn` output, as normalized bus ids.

    Counted: VGA/3D/display controllers made by NVIDIA (vendor 10de or "NVIDIA Corporation"); not counted: the audio,
    USB and serial functions of the same cards, NVSwitch bridges."""
    lines = lspci.splitlines() if isinstance(lspci, str) else list(lspci)
    out = []
    for line in lines:
        m = _PCI_LINE.match(line.strip())
        if not m:
            continue
        cls = m.group("cls").strip().lower()
        code = (m.group("code") or "").lower()
        rest = m.group("rest").lower()
        is_gpu = cls in _GPU_CLASSES or code in ("0300", "0302", "0380")
        is_nvidia = "nvidia" in rest or "[10de:" in rest
        if is_gpu and is_nvidia:
            out.append(normalize_bus_id(m.group("addr")))
    return tuple(out)


def _where(host: str, gpu: Gpu) -> str:
    return f"{host} {gpu.label}"


def _finding(check: str, severity: Severity, host: str, message: str, fix: str,
             gpu: Gpu | None = None) -> Finding:
    return Finding(check, severity, host, message, fix,
                   gpu.index if gpu else None, gpu.uuid if gpu else None)


def driver_not_loaded(host: str, result: DriverNotLoaded, *, pci_gpus: int | None = None,
                      nouveau_loaded: bool | None = None, secure_boot: bool | None = None,
                      reboot_required: bool | None = None) -> Finding:
    """The finding for a host whose nvidia-smi cannot reach the driver, with the likely causes first."""
    causes = []
    if reboot_required:
        causes.append("a reboot is pending after the driver install: reboot the node "
                      "(or set driver.rebootPolicy: if-needed and run apply again)")
    if nouveau_loaded:
        causes.append("nouveau holds the GPU: blacklist it (/etc/modprobe.d/blacklist-nouveau.conf: "
                      "`blacklist nouveau`, `options nouveau modeset=0`), rebuild the initramfs, reboot")
    if secure_boot:
        causes.append("Secure Boot is on and the nvidia module is not signed by an enrolled key: sign the DKMS module "
                      "and enroll the key with `mokutil --import`, or use signed precompiled modules, or turn off "
                      "Secure Boot")
    generic = ("check `lsmod | grep nvidia`, `dmesg | grep -i -e nvrm -e nvidia`; if the install just ran, reboot; "
               "if nouveau is loaded (`lsmod | grep nouveau`), blacklist it and rebuild the initramfs; if Secure Boot "
               "is on (`mokutil --sb-state`), the module must be signed by an enrolled key; after a kernel upgrade, "
               "the running kernel's headers must be installed for DKMS to rebuild the module")
    gpus = f" ({pci_gpus} NVIDIA GPU(s) on PCI)" if pci_gpus else ""
    first = result.message.splitlines()[0] if result.message else "no output"
    how = first if first.startswith("NVML") else f"nvidia-smi exited {result.exit_code}: {first}"
    return Finding("node.driver.not-loaded", "error", host,
                   f"{host}: the NVIDIA driver is not loaded{gpus}: {how}",
                   "; ".join(causes) + ("; otherwise " if causes else "") + generic)


def _driver_version(host: str, facts: NvidiaSmi, pin: str | None) -> list[Finding]:
    if not pin:
        return []
    have = facts.driver_version
    exact = "." in pin
    ok = have is not None and (have == pin if exact else have.split(".")[0] == pin)
    if ok:
        return []
    want = f"driver {pin}" if exact else f"a driver of the {pin} branch"
    return [_finding("node.driver.version", "error", host,
                     f"{host}: driver {have or 'unknown'} is loaded, the site pins {want} (driver.version)",
                     "run `gpu-install apply` to install the pinned driver and reboot the node so the new module "
                     "loads; if the site pin is what is stale, change driver.version")]


def _gpu_count(host: str, facts: NvidiaSmi, pci: tuple[str, ...] | None) -> list[Finding]:
    if pci is None:
        return []
    seen = {normalize_bus_id(g.pci_bus_id) for g in facts.gpus if g.pci_bus_id}
    if len(facts.gpus) == len(pci):
        return []
    if len(facts.gpus) < len(pci):
        missing = sorted(set(pci) - seen)
        where = f": not visible: {', '.join(missing)}" if missing else ""
        return [_finding("node.gpu.count", "error", host,
                         f"{host}: nvidia-smi shows {len(facts.gpus)} GPU(s), the PCI bus has {len(pci)} NVIDIA "
                         f"GPU(s){where}",
                         "check `dmesg | grep -i -e nvrm -e xid` for the missing GPU (fallen off the bus, "
                         "unsupported by this driver branch, or excluded); reseat or reset it, or RMA")]
    return [_finding("node.gpu.count", "warning", host,
                     f"{host}: nvidia-smi shows {len(facts.gpus)} GPU(s), the given PCI device list only "
                     f"{len(pci)}",
                     "list the NVIDIA devices again with `lspci -Dnn -d 10de:`; the list given was incomplete")]


def _mig_layout(host: str, gpu: Gpu, config: str | None) -> list[Finding]:
    if not config or gpu.mig_current is None:
        return []  # nothing expected, or a GPU without MIG (its config is refused by `gpu-install mig label`)
    where = _where(host, gpu)
    if config == "all-disabled":
        if gpu.mig_current:
            return [_finding("node.mig.layout", "error", host,
                             f"{where}: MIG is enabled, the node's MIG config is all-disabled",
                             "check the mig-manager pod and `nvidia.com/mig.config.state` on the node; "
                             "disable MIG with `nvidia-smi -i <gpu> -mig 0` and reset the GPU", gpu)]
        return []
    if not gpu.mig_current:
        return [_finding("node.mig.layout", "error", host,
                         f"{where}: MIG is disabled, the node's MIG config is {config}",
                         "check the mig-manager pod and `nvidia.com/mig.config.state` on the node "
                         "(`kubectl describe node`); a GPU reset or reboot may be pending", gpu)]
    if not gpu.mig_devices and config != "all-enabled":
        return [_finding("node.mig.layout", "error", host,
                         f"{where}: MIG is enabled but no MIG devices exist (config {config})",
                         "check the mig-manager pod's log and `nvidia.com/mig.config.state` on the node", gpu)]
    m = re.fullmatch(r"all-([0-9]+g\.[0-9]+gb)(\.me)?", config)
    if m:
        want = m.group(1)
        other = sorted({d.profile or "unknown" for d in gpu.mig_devices if d.profile != want})
        if other:
            return [_finding("node.mig.layout", "error", host,
                             f"{where}: MIG devices {', '.join(other)} found, config {config} wants only {want}",
                             "check the mig-manager pod and `nvidia.com/mig.config.state`; relabel the node "
                             "(`gpu-install mig label`) to let mig-manager apply the layout again", gpu)]
    return []


def _gpu_checks(host: str, gpu: Gpu, expect: Expectations) -> list[Finding]:
    where = _where(host, gpu)
    out: list[Finding] = []
    if gpu.persistence_mode is False:
        out.append(_finding("node.gpu.persistence", "warning", host, f"{where}: persistence mode is off",
                            "enable nvidia-persistenced (`systemctl enable --now nvidia-persistenced`); without it "
                            "the driver tears the GPU down between clients, slowing every start", gpu))
    if gpu.mig_current is not None and gpu.mig_pending is not None and gpu.mig_current != gpu.mig_pending:
        state = {True: "enabled", False: "disabled"}
        out.append(_finding("node.mig.pending", "error", host,
                            f"{where}: MIG mode is {state[gpu.mig_current]}, {state[gpu.mig_pending]} is pending",
                            "a GPU reset or reboot is pending: drain the node, then `nvidia-smi -i <gpu> -r` "
                            "(stop GPU clients first) or reboot", gpu))
    if gpu.ecc_current is not None and gpu.ecc_pending is not None and gpu.ecc_current != gpu.ecc_pending:
        out.append(_finding("node.gpu.ecc-pending", "warning", host,
                            f"{where}: ECC mode change pending ({'on' if gpu.ecc_current else 'off'} → "
                            f"{'on' if gpu.ecc_pending else 'off'})",
                            "reboot the node (or reset the GPU) to apply the ECC mode", gpu))
    ecc = gpu.ecc_errors
    if ecc.volatile_double_bit:
        out.append(_finding("node.gpu.ecc-dbe", "error", host,
                            f"{where}: {ecc.volatile_double_bit} double-bit (uncorrectable) ECC error(s) since the "
                            f"driver loaded ({ecc.aggregate_double_bit if ecc.aggregate_double_bit is not None else '?'}"
                            " over its lifetime)",
                            "drain the node, reset the GPU (`nvidia-smi -i <gpu> -r`) or reboot, and run the "
                            "vendor diagnostics (dcgmi diag -r 3); if errors come back, RMA the GPU", gpu))
    elif ecc.aggregate_double_bit:
        out.append(_finding("node.gpu.ecc-dbe", "warning", host,
                            f"{where}: {ecc.aggregate_double_bit} double-bit ECC error(s) over the GPU's lifetime "
                            "(none since the driver loaded)",
                            "watch the count; if it grows, drain the node and RMA the GPU", gpu))
    rp = gpu.retired_pages
    if rp is not None and rp.pending:
        out.append(_finding("node.gpu.retired-pages-pending", "error", host,
                            f"{where}: page retirement pending ({rp.double_bit or 0} page(s) retired for double-bit "
                            f"errors, {rp.single_bit or 0} for single-bit)",
                            "drain the node and reset the GPU or reboot so the pages are retired; RMA the GPU if "
                            "pages keep being retired", gpu))
    rr = gpu.remapped_rows
    if rr is not None and rr.failure:
        out.append(_finding("node.gpu.row-remap-failure", "error", host,
                            f"{where}: row remapping failed (uncorrectable remaps: {rr.uncorrectable})",
                            "the GPU is out of spare memory rows: drain the node and RMA the GPU", gpu))
    elif rr is not None and rr.pending:
        out.append(_finding("node.gpu.row-remap-pending", "error", host,
                            f"{where}: a memory row remap is pending",
                            "drain the node and reset the GPU (`nvidia-smi -i <gpu> -r`) or reboot to apply the "
                            "remap", gpu))
    for reason in gpu.throttle_reasons or ():
        if reason in HARDWARE_THROTTLE:
            out.append(_finding("node.gpu.throttle", "warning", host,
                                f"{where}: clocks held down: {HARDWARE_THROTTLE[reason]}",
                                "check cooling (fans, airflow, inlet temperature) and the power supply; "
                                "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` shows the cause", gpu))
    t = gpu.temperature_c
    if t is not None and gpu.shutdown_temp_c is not None and t >= gpu.shutdown_temp_c:
        out.append(_finding("node.gpu.temperature", "error", host,
                            f"{where}: {t} C, at or over the shutdown threshold {gpu.shutdown_temp_c} C",
                            "drain the node now and fix cooling (fans, airflow, inlet temperature)", gpu))
    elif t is not None and gpu.slowdown_temp_c is not None and t >= gpu.slowdown_temp_c:
        out.append(_finding("node.gpu.temperature", "warning", host,
                            f"{where}: {t} C, at or over the slowdown threshold {gpu.slowdown_temp_c} C",
                            "fix cooling (fans, airflow, inlet temperature); the GPU runs throttled", gpu))
    if gpu.power_draw_w is not None and gpu.power_limit_w and gpu.power_draw_w > gpu.power_limit_w:
        out.append(_finding("node.gpu.power", "warning", host,
                            f"{where}: drawing {gpu.power_draw_w:g} W, over its {gpu.power_limit_w:g} W limit",
                            "check the power limit (`nvidia-smi -q -d POWER`) and the PSU; the GPU will be "
                            "power-capped", gpu))
    out += _mig_layout(host, gpu, expect.mig_config)
    return out


#: nvidia_driver_fabric_manager as the nvidia_driver role reads it (tasks/fabric.yml), as text: -> forced or None (auto)
FABRIC_MANAGER_VALUES: dict[str, bool | None] = {"auto": None, "true": True, "yes": True, "false": False, "no": False}


def fabric_setting(value: object) -> bool | None:
    """nvidia_driver_fabric_manager: True or False (Fabric Manager installed or not, whatever the node has), None for
    auto (where the node has NVSwitches). Raises ValueError for another value."""
    text = str(value).strip().lower()
    if text not in FABRIC_MANAGER_VALUES:
        raise ValueError(value)
    return FABRIC_MANAGER_VALUES[text]


def fabric_expected(nvswitch: bool | None, fabric_manager: object = "auto") -> bool | None:
    """Whether a node is expected on an NVSwitch fabric: nvidia_driver_fabric_manager true or false decides (the site
    installs Fabric Manager there, or not), else the node's NVSwitches (gpu_install_nvswitch or the facts file; None:
    unknown). A value the role would refuse counts as auto here (validate reads, it does not refuse)."""
    try:
        forced = fabric_setting(fabric_manager)
    except ValueError:
        forced = None
    return nvswitch if forced is None else forced


FABRIC_FIX = ("Fabric Manager sets the NVSwitch fabric up; until it has, CUDA fails (error 802, system not yet "
              "initialized). On the node: `systemctl status nvidia-fabricmanager` and `journalctl -u "
              "nvidia-fabricmanager`; it refuses to start unless its version is the driver's exactly (\"fabric manager "
              "NVIDIA GPU driver interface version X don't match with driver version Y\": compare the Fabric Manager "
              "package's version, `dpkg -l 'nvidia-fabricmanager*'` or `rpm -qa '*fabric*manager*'`, with `nvidia-smi "
              "--query-gpu=driver_version --format=csv,noheader`) -- `gpu-install apply` "
              "installs the driver's version with driver.mode host/runfile; Blackwell HGX boards also need nvlsm")


def _fabric(host: str, facts: NvidiaSmi, nvswitch: bool | None) -> list[Finding]:
    """node.fabric: on a node expected on an NVSwitch fabric, or whose GPUs report a fabric state, every GPU Completed
    with status Success (one finding per GPU that is not; an info finding when all are)."""
    read = [(g, g.fabric) for g in facts.gpus if g.fabric is not None]
    reporting = [(g, f) for g, f in read if f.reported]
    if not read or not (reporting or nvswitch):
        return []  # the fabric was not read (an older document, NVML), or no NVSwitch and no GPU on a fabric
    if not reporting:
        return [_finding(FABRIC, "warning", host,
                         f"{host}: the node has NVSwitches, and its {len(read)} GPU(s) report no fabric state (N/A): "
                         "GPUs before Hopper (HGX A100) do not report it, so whether Fabric Manager set the fabric up "
                         "cannot be read here",
                         "check that `systemctl is-active nvidia-fabricmanager` says active on the node, and that a "
                         "CUDA sample runs; if the node has no NVSwitches, correct gpu_install_nvswitch")]
    out = []
    for gpu, f in reporting:
        if f.initialised:
            continue
        state = f.state or "N/A"
        what = (f"fabric registration completed with status {f.status or 'N/A'}" if state.lower() == "completed"
                else f"fabric state {state}" + (" (Fabric Manager has not set the fabric up)"
                                                if state.lower() in ("in progress", "not started") else ""))
        out.append(_finding(FABRIC, "error", host, f"{_where(host, gpu)}: {what}; CUDA cannot use the GPU",
                            FABRIC_FIX, gpu))
    return out or [_finding(FABRIC, "info", host,
                            f"{host}: NVSwitch fabric initialised on all {len(reporting)} GPU(s) (Completed, Success)",
                            "")]


def check_node(host: str, result: NvidiaSmi | DriverNotLoaded, expect: Expectations | None = None, *,
               pci_devices: Iterable[str] | None = None, nouveau_loaded: bool | None = None,
               secure_boot: bool | None = None, reboot_required: bool | None = None) -> list[Finding]:
    """Findings for one host. pci_devices: normalized bus ids of the NVIDIA GPUs on the host's PCI bus
    (nvidia_pci_devices()), None: not checked. nouveau_loaded / secure_boot / reboot_required: what else is known
    about the host, used to put the likely cause first when the driver is not loaded."""
    expect = expect or Expectations()
    pci = None if pci_devices is None else tuple(normalize_bus_id(p) for p in pci_devices)
    if isinstance(result, DriverNotLoaded):
        return [driver_not_loaded(host, result, pci_gpus=len(pci) if pci is not None else None,
                                  nouveau_loaded=nouveau_loaded, secure_boot=secure_boot,
                                  reboot_required=reboot_required)]
    out = _driver_version(host, result, expect.driver_version)
    out += _gpu_count(host, result, pci)
    for gpu in result.gpus:
        out += _gpu_checks(host, gpu, expect)
    out += _fabric(host, result, expect.nvswitch)
    return out


# --- node.driver.signer: who signed the nvidia module (driver.secureBoot) ---------------------------------------------

SIGNER = "node.driver.signer"
#: What `modinfo -F signer` prints for modules Canonical signs: the prebuilt `linux-modules-nvidia-<branch>-*`
#: packages report "Canonical Ltd. Kernel Module Signing"; Ubuntu's in-tree modules "Canonical Ltd. Secure Boot
#: Signing (<year>)". Accepted only when the site allows Canonical's modules (canonical_ok).
CANONICAL_SIGNERS = ("Canonical Ltd. Kernel Module Signing", "Canonical Ltd. Secure Boot Signing")
SIGNER_FIX = ("rebuild and sign the module with the site key: `gpu-install apply` with driver.mode host and "
              "driver.secureBoot.certificate/signingKey (DKMS signs with /etc/dkms/framework.conf mok_signing_key / "
              "mok_certificate); `modinfo -F signer nvidia` and `modinfo -F sig_key nvidia` on the node show what "
              "signed it")
_MAX_CERT = 64 * 1024


@dataclass(frozen=True)
class SiteCertificate:
    """What modinfo can show of the site's module signing certificate: its subject CN and the key ids `sig_key`
    prints (colon-separated upper-case hex): the serial number (sign-file's default PKCS#7 signer id, issuer and
    serial) and the Subject Key Identifier (sign-file -k)."""

    cn: str
    serial: tuple[str, ...]  # the serial's bytes, minimal and as DER encodes it (a leading 00 when the top bit is set)
    ski: str | None

    def key_ids(self) -> tuple[str, ...]:
        return self.serial + ((self.ski,) if self.ski else ())


@dataclass(frozen=True)
class SignerExpectation:
    """node.driver.signer is checked: the module must be signed by certificate (None: no site certificate) or, when
    canonical_ok, by Canonical."""

    certificate: SiteCertificate | None
    canonical_ok: bool = False


def colon_hex(data: bytes) -> str:
    """b'\\x3f\\x45' -> '3F:45', the form modinfo prints sig_key in."""
    return ":".join(f"{b:02X}" for b in data)


def site_certificate(data: bytes, name: str = "driver.secureBoot.certificate") -> SiteCertificate:
    """Parse the site's certificate (DER or PEM, at most 64 KiB) with `cryptography`. Raises ValueError naming
    <name> when it is not one X.509 certificate with a subject CN."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    if len(data) > _MAX_CERT:
        raise ValueError(f"{name}: {len(data)} bytes, more than a certificate ({_MAX_CERT})")
    try:
        cert = (x509.load_pem_x509_certificate(data) if data.lstrip().startswith(b"-----BEGIN")
                else x509.load_der_x509_certificate(data))
    except ValueError as e:
        raise ValueError(f"{name}: not an X.509 certificate in DER or PEM ({e})") from None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not cns:
        raise ValueError(f"{name}: the certificate's subject has no CN, which modinfo shows as the signer")
    try:
        ski: str | None = colon_hex(cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest)
    except x509.ExtensionNotFound:
        ski = None
    n = cert.serial_number
    serials = {colon_hex(n.to_bytes(max(1, (n.bit_length() + extra) // 8), "big")) for extra in (7, 8)}
    return SiteCertificate(str(cns[0].value), tuple(sorted(serials, key=len)), ski)


def _key_id(text: str) -> str:
    return text.strip().upper()


def signer_check(host: str, modinfo_signer: str, modinfo_sig_key: str, cert: SiteCertificate | None, loaded: bool,
                 *, canonical_ok: bool = False) -> list[Finding]:
    """node.driver.signer for one host: the nvidia module must be loaded (/sys/module/nvidia) and signed by the site
    certificate (signer == its CN and sig_key == its serial or Subject Key Identifier), or by Canonical when
    canonical_ok. Exactly one finding: error when not, info naming the signer and key when it is."""
    signer, sig_key = modinfo_signer.strip()[:256], _key_id(modinfo_sig_key)[:512]
    said = f"signer {signer!r}, sig_key {sig_key or '(none)'}"
    if not loaded:
        return [_finding(SIGNER, "error", host, f"{host}: the nvidia module is not loaded (no /sys/module/nvidia); "
                         f"the module on disk has {said}",
                         "with Secure Boot on the kernel refuses a module signed by a key it does not trust "
                         "(dmesg: 'Key was rejected by service'): check `mokutil --test-key` for the site certificate, "
                         "then " + SIGNER_FIX)]
    if not signer:
        return [_finding(SIGNER, "error", host, f"{host}: the nvidia module is not signed (modinfo shows no signer)",
                         SIGNER_FIX)]
    if cert is not None and signer == cert.cn and sig_key in cert.key_ids():
        return [_finding(SIGNER, "info", host, f"{host}: nvidia module signed by the site certificate ({said})", "")]
    if canonical_ok and any(signer.startswith(c) for c in CANONICAL_SIGNERS):
        return [_finding(SIGNER, "info", host, f"{host}: nvidia module signed by Canonical ({said})", "")]
    want = (f"the site certificate (CN {cert.cn!r}, key {' or '.join(cert.key_ids())})"
            if cert is not None else "no site certificate given")
    if canonical_ok:
        want += " or Canonical (" + " / ".join(CANONICAL_SIGNERS) + ")"
    return [_finding(SIGNER, "error", host, f"{host}: nvidia module has {said}; expected {want}", SIGNER_FIX)]
