"""Facts read from a GPU node (`gpu-install nodes facts`): the read-only POSIX sh script run on the node, the pure
parser of what it prints, the typed result and the PCI id table that names NVIDIA GPUs and NVSwitches.

Bottom layer, beside installer/facts.py: the standard library only, so the plan, the mirror and preflight can all
read these facts.

The script (SCRIPT) needs no Python, no root and writes nothing: it prints one fact per line, each line
`__gpu_install_facts__ KEY VALUE`, read from /etc/os-release (else /usr/lib/os-release, as os-release(5) says),
`uname -r`/`uname -m`, /lib/modules and
/boot/vmlinuz-* (the kernels the node may boot next), the SecureBoot EFI variable (mokutil --sb-state when the
variable cannot be read), /sys/bus/pci/devices/*/{vendor,device,class} of vendor 0x10de (no driver needed) and the
container runtimes' versions. Test seam: GPU_INSTALL_FACTS_ROOT, when set, is put before every file path the script
reads (/etc, /usr/lib, /lib/modules, /boot, /sys), so a test can point it at a tree it made; uname and the runtimes' commands
are always the machine's own.

What the node prints is untrusted: parse() takes at most MAX_OUTPUT bytes (the reader stops there), at most
MAX_LINES lines of at most MAX_LINE characters, at most MAX_ITEMS kernels and PCI devices, and checks each value
against the form it must have; whatever does not fit is dropped and said in NodeFacts.problems, never raised.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Literal

MARK = "__gpu_install_facts__"
ROOT_ENV = "GPU_INSTALL_FACTS_ROOT"  # test seam: a prefix for every file the script reads
NVIDIA = "0x10de"
MAX_OUTPUT = 256 * 1024  # bytes read from a node at most
MAX_LINE = 1024
MAX_LINES = 4096
MAX_ITEMS = 256  # kernels, PCI devices, runtimes

SCRIPT = r"""
R=${GPU_INSTALL_FACTS_ROOT:-}
M=__gpu_install_facts__
echo "$M begin 1"
O="$R/etc/os-release"
[ -r "$O" ] || O="$R/usr/lib/os-release"
if [ -r "$O" ]; then
  grep -E '^(ID|VERSION_ID)=' "$O" 2>/dev/null | head -n 4 | while IFS= read -r l; do echo "$M os $l"; done
else echo "$M os-missing"; fi
echo "$M uname-r $(uname -r 2>/dev/null)"
echo "$M uname-m $(uname -m 2>/dev/null)"
for d in "$R"/lib/modules/*; do [ -d "$d" ] && echo "$M module ${d##*/}"; done
for f in "$R"/boot/vmlinuz-*; do [ -e "$f" ] && echo "$M vmlinuz ${f##*/vmlinuz-}"; done
E="$R/sys/firmware/efi"
V="$E/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
if [ ! -d "$E" ]; then echo "$M secureboot no-efi"
elif [ -r "$V" ] && b=$(od -An -tu1 -j4 -N1 "$V" 2>/dev/null) && [ -n "$b" ]; then echo "$M secureboot efivar $b"
elif command -v mokutil >/dev/null 2>&1; then echo "$M secureboot mokutil $(mokutil --sb-state 2>&1 | head -n 1)"
else echo "$M secureboot unreadable"; fi
for d in "$R"/sys/bus/pci/devices/*; do
  [ -r "$d/vendor" ] || continue
  v=$(cat "$d/vendor" 2>/dev/null)
  [ "$v" = 0x10de ] || continue
  echo "$M pci ${d##*/} $v $(cat "$d/device" 2>/dev/null) $(cat "$d/class" 2>/dev/null)"
done
if command -v containerd >/dev/null 2>&1; then echo "$M runtime containerd $(containerd --version 2>&1 | head -n 1)"; fi
if command -v docker >/dev/null 2>&1; then
  s=$(docker version --format '{{.Server.Version}}' 2>/dev/null | head -n 1)
  [ -n "$s" ] && echo "$M runtime docker $s"
fi
if command -v dockerd >/dev/null 2>&1; then echo "$M runtime dockerd $(dockerd --version 2>&1 | head -n 1)"; fi
if command -v crio >/dev/null 2>&1; then echo "$M runtime cri-o $(crio --version 2>&1 | grep -m1 -i '^version')"; fi
echo "$M end"
"""

SecureBoot = Literal["on", "off", "off (no EFI)", "unknown"]
DeviceKind = Literal["gpu", "nvswitch", "other"]

_OS_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}\Z")
_OS_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,63}\Z")
_KERNEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,127}\Z")  # as installer.facts reads gpu_install_kernel
_ARCH = re.compile(r"[a-z0-9_]{1,32}\Z")
_PCI_ADDR = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_HEX16 = re.compile(r"0x[0-9a-f]{4}\Z")
_CLASS = re.compile(r"0x[0-9a-f]{6}\Z")
_VERSION_TEXT = re.compile(r"[\x20-\x7e]{1,200}\Z")  # printable ASCII
# the release number (with a SemVer pre-release such as -rc.1); a distribution's suffix after it (~ds1, +deb12u3) is
# left to `text`: Debian's containerd prints 1.6.20~ds1 and reports 1.6.20 to the kubelet (CRI), as the lab shows
_RUNTIME_VERSION = re.compile(r"v?(\d+\.\d+(?:\.\d+)?(?:-[0-9A-Za-z.]+)?)(?:[+~][0-9A-Za-z.+~-]*)?")


@dataclass(frozen=True)
class PciDevice:
    """An NVIDIA PCI function as sysfs lists it (no driver needed)."""

    address: str  # 0000:17:00.0
    device_id: str  # 0x2335
    pci_class: str  # 0x030200
    kind: DeviceKind  # class 0x0300xx/0x0302xx: gpu; 0x0680xx: nvswitch (an NVIDIA "other bridge")
    name: str | None = None  # from the PCI id table (None: not a data-centre id it lists)
    chip: str | None = None  # the chip as pci.ids names it (GH100, GB100, ...)
    architecture: str | None = None  # Ampere, Hopper, Blackwell ... (architecture_of(chip))


@dataclass(frozen=True)
class Runtime:
    name: str  # containerd, docker (the daemon, as `docker version` reports it), dockerd, cri-o
    version: str | None  # the version number read from its --version text (None: none found in it)
    text: str  # the line it printed (bounded, printable)


@dataclass(frozen=True)
class NodeFacts:
    """What one read of a node found; a value the node did not give (or gave in a form refused) is None/empty and
    said in problems."""

    os_id: str | None
    os_version: str | None
    kernel: str | None  # `uname -r`
    kernels_installed: tuple[str, ...]  # /lib/modules/* and /boot/vmlinuz-*: the kernels it may boot next
    arch: str | None  # `uname -m`: x86_64, aarch64
    secure_boot: SecureBoot
    devices: tuple[PciDevice, ...]
    runtimes: tuple[Runtime, ...]
    problems: tuple[str, ...] = field(default=())

    @property
    def gpus(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "gpu")

    @property
    def nvswitches(self) -> tuple[PciDevice, ...]:
        return tuple(d for d in self.devices if d.kind == "nvswitch")

    @property
    def os_name(self) -> str | None:
        """ID+VERSION_ID as gpu_install_os writes it (ubuntu24.04, rocky9.4)."""
        return f"{self.os_id}{self.os_version}" if self.os_id and self.os_version else None


# ---------------------------------------------------------------- the PCI id table


#: pci.ids chip name prefix -> architecture. The chip is the first word of a device's pci.ids name ("GH100 [H200
#: SXM 141GB]"); NVIDIA's chip codes start with the architecture's letters: GA Ampere, GH Hopper, GB Blackwell, AD
#: Ada Lovelace, GV Volta, TU Turing. Grace is NVIDIA's CPU, not a PCI GPU: a Grace Hopper/Blackwell superchip shows
#: as a GH100/GB100 GPU (GH200, GB200 in its name) on an aarch64 node.
ARCHITECTURES = (("GA", "Ampere"), ("GH", "Hopper"), ("GB", "Blackwell"), ("AD", "Ada Lovelace"), ("GV", "Volta"),
                 ("TU", "Turing"))
#: the data-centre chips whose ids the table carries (HGX/SXM and PCIe data-centre boards), with every NVSwitch id
TABLE_CHIPS = re.compile(r"(GA100|GH100|GB100|GB102|GB110)(GL)?\Z")


def architecture_of(chip: str | None) -> str | None:
    if not chip:
        return None
    return next((arch for prefix, arch in ARCHITECTURES if chip.upper().startswith(prefix)), None)


def extract_pci_ids(pci_ids: str) -> dict[str, tuple[str, str]]:
    """The table from a pci.ids text: device id (0x2335) -> (chip, name) for every device of vendor 10de whose chip
    (the first word of its name) is a data-centre chip (TABLE_CHIPS), and every device named an NVSwitch. The name is
    what the bracket holds ("H200 SXM 141GB"), else the whole pci.ids name."""
    out: dict[str, tuple[str, str]] = {}
    inside = False
    for line in pci_ids.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            inside = line.startswith("10de ")
            continue
        if not inside or line.startswith("\t\t"):
            continue
        m = re.match(r"\t([0-9a-f]{4})\s+(.*)\Z", line)
        if not m:
            continue
        full = m[2].strip()
        chip = re.split(r"[\s\[]", full, maxsplit=1)[0]
        bracket = re.search(r"\[(.*)\]", full)
        name = bracket[1].strip() if bracket else full
        if TABLE_CHIPS.match(chip) or "NVSwitch" in full:
            out[f"0x{m[1]}"] = (chip, name)
    return out


def pci_table_text(table: Mapping[str, tuple[str, str]], *, source: str, version: str, sha256: str) -> str:
    """installer/data/nvidia-pci-ids.tsv as scripts/gen-nvidia-pci-ids.py writes it."""
    head = [
        "# NVIDIA data-centre GPU and NVSwitch PCI device ids (vendor 0x10de): id, chip, name.",
        "# Extracted by scripts/gen-nvidia-pci-ids.py (rule: installer.node_facts.extract_pci_ids) from pci.ids",
        f"# source: {source}",
        f"# pci.ids Version: {version}",
        f"# pci.ids sha256: {sha256}",
    ]
    rows = [f"{k}\t{chip}\t{name}" for k, (chip, name) in sorted(table.items())]
    return "\n".join(head + rows) + "\n"


@lru_cache(maxsize=1)
def pci_table() -> dict[str, tuple[str, str]]:
    """The shipped table (installer/data/nvidia-pci-ids.tsv): device id -> (chip, name)."""
    from importlib import resources

    text = (resources.files("installer") / "data" / "nvidia-pci-ids.tsv").read_text(encoding="utf-8")
    out: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            dev, chip, name = line.split("\t", 2)
            out[dev] = (chip, name)
    return out


def device_kind(pci_class: str) -> DeviceKind:
    if pci_class.startswith(("0x0300", "0x0302")):
        return "gpu"
    if pci_class.startswith("0x0680"):
        return "nvswitch"
    return "other"


# ---------------------------------------------------------------- the parser


def _unquote(value: str) -> str:
    """An os-release value: "x", 'x' or x (os-release(5): shell-style quoting; no expansion)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return value.replace('\\"', '"').replace("\\\\", "\\")


def _runtime(name: str, text: str) -> Runtime:
    if name == "docker":  # `docker version --format {{.Server.Version}}`: the number alone
        m = _RUNTIME_VERSION.fullmatch(text.strip())
    else:  # containerd github.com/containerd/containerd/v2 v2.1.9 <commit>; Docker version 27.5.1, build 4c9b3b0
        m = next((_RUNTIME_VERSION.fullmatch(w.rstrip(",")) for w in text.split()[1:]
                  if _RUNTIME_VERSION.fullmatch(w.rstrip(","))), None)
    return Runtime(name, m[1] if m else None, text)


def parse(raw: bytes | str) -> NodeFacts:
    """The facts in what SCRIPT printed. Pure and total: any input gives a NodeFacts (bounded as the module says);
    what is missing, malformed or over a bound is left out and named in problems."""
    problems: list[str] = []
    if isinstance(raw, bytes):
        if len(raw) > MAX_OUTPUT:
            problems.append(f"the node printed more than {MAX_OUTPUT} bytes: only the first {MAX_OUTPUT} were read")
            raw = raw[:MAX_OUTPUT]
        text = raw.decode("utf-8", "replace")
    else:
        text = raw[:MAX_OUTPUT]
    lines = text.splitlines()
    if len(lines) > MAX_LINES:
        problems.append(f"the node printed {len(lines)} lines: only the first {MAX_LINES} were read")
        lines = lines[:MAX_LINES]
    os_vars: dict[str, str] = {}
    kernel = arch = None
    installed: list[str] = []
    secure: SecureBoot = "unknown"
    devices: list[PciDevice] = []
    runtimes: list[Runtime] = []
    seen: set[str] = set()
    table = pci_table()

    def refuse(what: str, value: str) -> None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        problems.append(f"{what}: {shown!r} refused (not the form it must have)")

    for line in lines:
        if not line.startswith(MARK + " "):
            continue
        if len(line) > MAX_LINE:
            problems.append(f"a line of {len(line)} characters ignored (at most {MAX_LINE})")
            continue
        key, _, value = line[len(MARK) + 1:].partition(" ")
        value = value.strip()
        seen.add(key)
        if key == "os":
            var, _, val = value.partition("=")
            if var in ("ID", "VERSION_ID") and var not in os_vars:
                os_vars[var] = _unquote(val.strip())
        elif key == "os-missing":
            problems.append("no /etc/os-release (nor /usr/lib/os-release) on the node")
        elif key == "uname-r":
            if _KERNEL.match(value):
                kernel = value
            else:
                refuse("uname -r", value)
        elif key == "uname-m":
            if _ARCH.match(value):
                arch = value
            else:
                refuse("uname -m", value)
        elif key in ("module", "vmlinuz"):
            if not _KERNEL.match(value):
                refuse(f"installed kernel ({'/lib/modules' if key == 'module' else '/boot/vmlinuz-*'})", value)
            elif value not in installed:
                if len(installed) >= MAX_ITEMS:
                    problems.append(f"more than {MAX_ITEMS} installed kernels: the rest ignored")
                    continue
                installed.append(value)
        elif key == "secureboot":
            secure = _secure_boot(value)
        elif key == "pci":
            words = value.split()
            if len(words) != 4 or not _PCI_ADDR.match(words[0]) or words[1] != NVIDIA or not _HEX16.match(words[2]) \
                    or not _CLASS.match(words[3]):
                refuse("PCI device", value)
                continue
            if len(devices) >= MAX_ITEMS:
                problems.append(f"more than {MAX_ITEMS} NVIDIA PCI devices: the rest ignored")
                continue
            chip, name = table.get(words[2], (None, None))
            devices.append(PciDevice(words[0], words[2], words[3], device_kind(words[3]), name, chip,
                                     architecture_of(chip)))
        elif key == "runtime":
            name, _, version_text = value.partition(" ")
            if name not in ("containerd", "docker", "dockerd", "cri-o") or not _VERSION_TEXT.match(version_text):
                refuse("container runtime", value)
            elif len(runtimes) >= MAX_ITEMS:
                problems.append(f"more than {MAX_ITEMS} container runtimes: the rest ignored")
            else:
                runtimes.append(_runtime(name, version_text))
    if "end" not in seen:
        problems.append("the node's answer is incomplete (no end line: the script did not finish)")
    for var, where in (("ID", "os-release ID"), ("VERSION_ID", "os-release VERSION_ID")):
        given = os_vars.get(var)
        pattern = _OS_ID if var == "ID" else _OS_VERSION
        if given is None:
            if "os-missing" not in seen:
                problems.append(f"{where}: not given")
        elif not pattern.match(given.lower() if var == "ID" else given):
            refuse(where, given)
            os_vars.pop(var)
    for what, found in (("uname -r", kernel), ("uname -m", arch)):
        if found is None and not any(p.startswith(what) for p in problems):
            problems.append(f"{what}: not given")
    os_id = os_vars.get("ID")
    return NodeFacts(os_id.lower() if os_id else None, os_vars.get("VERSION_ID"), kernel, tuple(installed), arch,
                     secure, tuple(devices), tuple(runtimes), tuple(problems))


def _secure_boot(value: str) -> SecureBoot:
    how, _, rest = value.partition(" ")
    rest = rest.strip()
    if how == "no-efi":
        return "off (no EFI)"
    if how == "efivar":
        return "on" if rest == "1" else "off" if rest == "0" else "unknown"
    if how == "mokutil":
        low = rest.lower()
        return "on" if "secureboot enabled" in low else "off" if "secureboot disabled" in low else "unknown"
    return "unknown"


# ---------------------------------------------------------------- the document's per-host entry


def facts_json(f: NodeFacts) -> dict[str, object]:
    """The `facts` object of a host in gpu-install.node-facts/v1 (docs/json.md)."""
    models: dict[str, int] = {}
    for g in f.gpus:
        label = g.name or f"unknown NVIDIA GPU {g.device_id}"
        models[label] = models.get(label, 0) + 1
    return {
        "osId": f.os_id, "osVersion": f.os_version, "os": f.os_name, "kernel": f.kernel,
        "kernelsInstalled": list(f.kernels_installed), "architecture": f.arch, "secureBoot": f.secure_boot,
        "gpuCount": len(f.gpus), "gpuModels": models,
        "gpuArchitectures": sorted({g.architecture for g in f.gpus if g.architecture}),
        "nvswitchCount": len(f.nvswitches),
        "pciDevices": [{"address": d.address, "deviceId": d.device_id, "class": d.pci_class, "kind": d.kind,
                        "name": d.name, "chip": d.chip, "architecture": d.architecture} for d in f.devices],
        "runtimes": [{"name": r.name, "version": r.version, "text": r.text} for r in f.runtimes],
        "problems": list(f.problems),
    }


def summary(f: NodeFacts) -> str:
    """One line for the terminal."""
    gpus: dict[str, int] = {}
    for g in f.gpus:
        label = f"{g.name or 'NVIDIA ' + g.device_id}{f' ({g.architecture})' if g.architecture else ''}"
        gpus[label] = gpus.get(label, 0) + 1
    parts = [f"{f.os_id or '?'} {f.os_version or '?'}", f"kernel {f.kernel or '?'}"
             + (f" (+{len(set(f.kernels_installed) - {f.kernel})} installed)"
                if set(f.kernels_installed) - {f.kernel} else ""),
             f.arch or "?", f"Secure Boot {f.secure_boot}",
             ", ".join(f"{n}x {label}" for label, n in gpus.items()) or "no NVIDIA GPU"]
    if f.nvswitches:
        parts.append(f"{len(f.nvswitches)} NVSwitch")
    parts.append(", ".join(f"{r.name} {r.version or '?'}" for r in f.runtimes) or "no container runtime found")
    return "; ".join(parts) + (f"; {len(f.problems)} problem(s)" if f.problems else "")


# ---------------------------------------------------------------- reading a facts file back (mirror plan --facts)

SCHEMA = "gpu-install.node-facts/v1"
MAX_FILE = 16 * 1024 * 1024  # a facts file of thousands of nodes is a few MiB
_HOST = re.compile(r"[A-Za-z0-9_.@:\[\]-]{1,253}\Z")


@dataclass(frozen=True)
class FileFacts:
    """One host's facts as a facts file holds them, each value checked again (the file crossed the gap)."""

    host: str
    read_at: str | None
    facts: NodeFacts


def _problem(path: str, where: str, what: str) -> Exception:
    from installer.errors import ConfigError

    return ConfigError(f"facts file {path}: {where}: {what}",
                       hint="give the file `gpu-install nodes facts -i INVENTORY -o FILE` wrote, unedited; re-read "
                            "the nodes if it was changed")


def read_file(path: str) -> dict[str, FileFacts]:
    """The hosts of a gpu-install.node-facts/v1 file that were read (hosts with an error are left out), by host name.

    The file is untrusted input (it is carried across the air gap): read once and bounded (installer.safefile:
    MAX_FILE bytes, depth, no duplicate keys), its schema named, and every value checked against the form parse()
    accepts from a node; a PCI device's name, chip and architecture are taken from this installation's PCI id table,
    never from the file. Any refusal is a ConfigError (exit 2) naming the file, the host and the field."""
    from pathlib import Path

    from installer.safefile import read_json

    doc = read_json(Path(path).expanduser(), "facts file", MAX_FILE)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise _problem(path, "schema", f"{got!r}, not {SCHEMA}")
    hosts = doc.get("hosts")
    if not isinstance(hosts, list):
        raise _problem(path, "hosts", "not a list")
    table = pci_table()
    out: dict[str, FileFacts] = {}
    for i, entry in enumerate(hosts):
        if not isinstance(entry, dict) or not isinstance(entry.get("host"), str) or not _HOST.match(entry["host"]):
            raise _problem(path, f"hosts[{i}].host", "missing or not a host name")
        host = entry["host"]
        if host in out:
            raise _problem(path, f"host {host}", "listed twice")
        f = entry.get("facts")
        if f is None:
            continue  # it could not be read: nothing is known of it
        if not isinstance(f, dict):
            raise _problem(path, f"host {host}: facts", "not an object")

        def text(key: str, pattern: re.Pattern[str], f: dict[str, object] = f, host: str = host) -> str | None:
            value = f.get(key)
            if value is None:
                return None
            if not isinstance(value, str) or not pattern.match(value):
                raise _problem(path, f"host {host}: facts.{key}", f"{value!r} is not the form it must have")
            return value

        os_id = text("osId", _OS_ID)
        os_version = text("osVersion", _OS_VERSION)
        kernel = text("kernel", _KERNEL)
        arch = text("architecture", _ARCH)
        installed = f.get("kernelsInstalled") or []
        if not isinstance(installed, list) or len(installed) > MAX_ITEMS \
                or not all(isinstance(k, str) and _KERNEL.match(k) for k in installed):
            raise _problem(path, f"host {host}: facts.kernelsInstalled",
                           f"not a list of at most {MAX_ITEMS} kernel releases")
        secure = f.get("secureBoot", "unknown")
        if secure not in ("on", "off", "off (no EFI)", "unknown"):
            raise _problem(path, f"host {host}: facts.secureBoot", f"{secure!r} is not on, off, off (no EFI), unknown")
        raw_devices = f.get("pciDevices") or []
        if not isinstance(raw_devices, list) or len(raw_devices) > MAX_ITEMS:
            raise _problem(path, f"host {host}: facts.pciDevices", f"not a list of at most {MAX_ITEMS} devices")
        devices = []
        for j, d in enumerate(raw_devices):
            ok = isinstance(d, dict) and isinstance(d.get("address"), str) and _PCI_ADDR.match(d["address"]) \
                and isinstance(d.get("deviceId"), str) and _HEX16.match(d["deviceId"]) \
                and isinstance(d.get("class"), str) and _CLASS.match(d["class"])
            if not ok:
                raise _problem(path, f"host {host}: facts.pciDevices[{j}]", "not an address, deviceId and class")
            assert isinstance(d, dict)
            chip, name = table.get(d["deviceId"], (None, None))
            devices.append(PciDevice(d["address"], d["deviceId"], d["class"], device_kind(d["class"]), name, chip,
                                     architecture_of(chip)))
        read_at = entry.get("readAt")
        out[host] = FileFacts(host, read_at if isinstance(read_at, str) and len(read_at) <= 40 else None, NodeFacts(
            os_id.lower() if os_id else None, os_version, kernel, tuple(installed), arch, secure, tuple(devices), ()))
    return out
