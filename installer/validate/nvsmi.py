"""`nvidia-smi -q -x` as typed facts.

The XML layout changes across driver releases (the DTD named in the DOCTYPE: nvsmi_device_v10 … v13, and
documents without a DOCTYPE from older drivers). Every element is optional here; a value nvidia-smi cannot give
("N/A", "Not Supported", "[N/A]", "Requested functionality has been deprecated", …) is None. Differences handled:
- throttle reasons: `clocks_throttle_reasons/clocks_throttle_reason_*` (≤ v12 on older drivers) and
  `clocks_event_reasons/clocks_event_reason_*` (v12 on driver 535+, v13);
- power: `power_readings` (power_draw, enforced_power_limit/power_limit) and `gpu_power_readings`
  (power_draw or instant_power_draw/average_power_draw, current_power_limit);
- ECC double-bit errors: `volatile|aggregate/double_bit/total` (Pascal/Volta layout) or the sum of the
  uncorrectable counters `dram_uncorrectable`, `sram_uncorrectable`, `sram_uncorrectable_parity`,
  `sram_uncorrectable_secded` (Turing and later);
- temperatures: absolute thresholds (`gpu_temp_slow_threshold`, `gpu_temp_max_threshold`,
  `gpu_temp_max_gpu_threshold`) where the document has them. Documents that give only T.Limit margins (driver 580's
  DTD v13 on H100/H200, GeForce RTX 4090 on 535: `gpu_temp_tlimit`, `gpu_temp_slow_tlimit_threshold`,
  `gpu_temp_max_tlimit_threshold`, `gpu_temp_max_gpu_tlimit_threshold`) get them derived (see _thresholds):
      T.Limit temperature = gpu_temp + gpu_temp_tlimit   (gpu_temp_tlimit: how far the GPU is below T.Limit)
      each threshold      = T.Limit temperature - its *_tlimit_threshold margin
  i.e. max operating = T.Limit - gpu_temp_max_gpu_tlimit_threshold, slowdown = T.Limit - gpu_temp_slow_tlimit_threshold,
  shutdown = T.Limit - gpu_temp_max_tlimit_threshold. Evidence (tests/fixtures/nvidia-smi/README.md): an H100 80GB
  HBM3 and an H200 on driver 580.159.04 (`h100-80gb-hbm3-580-v13.xml`: 36 C, T.Limit 51, margins -2/-8/0;
  `h200-580-v13.xml`: the same; `corpus/h200-580-v13-with-process.xml`: 37 C, T.Limit 50) give 87 + 2 = 89 C
  slowdown, 87 + 8 = 95 C shutdown and 87 C max operating, exactly what NVML read on the same machines at the same
  time (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN / _SHUTDOWN / _GPU_MAX). An absolute threshold, where present, wins.
- unsupported features: a `retired_pages` block whose every value is N/A (H100/H200: row remapping instead of page
  retirement) is None, as NVML's "not supported" is in installer/validate/local.py: the same shape from both readers.
- the NVSwitch fabric: `fabric/state` and `fabric/status` (DTD v12 on driver 535, v13), the GPU's registration with
  the NVLink fabric that Fabric Manager sets up on NVSwitch systems (Gpu.fabric; parse_fabric_text() reads the same
  two values from the "Fabric" sections of `nvidia-smi -q`'s text). A GPU that is on no such fabric says N/A (or
  Not Supported) for both; documents without the element (older drivers, NVML through validate --local) give None.
MIG devices carry no profile name in the XML: the profile is derived from the driver's facts (installer.mig.profile_of:
the device's SM count and memory against the driver's `mig -lgip` table of the model, values/mig/lgip.yaml, else
against the model's slices and the GPU's total memory), None when that is ambiguous or the model unknown.

The driver-not-loaded case (exit code 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA
driver") is a result of its own, DriverNotLoaded, not an error.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from installer.errors import EXIT_VALIDATION, GpuInstallError

#: nvidia-smi's exit code when the NVIDIA kernel driver is not loaded (nvidia-smi(1), RETURN VALUE).
EXIT_DRIVER_NOT_LOADED = 9
_NOT_LOADED_TEXT = "couldn't communicate with the nvidia driver"
_UNAVAILABLE = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]",
                "requested functionality has been deprecated", "none", "insufficient permissions",
                "[insufficient permissions]"}
_NUMBER = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z%/]*)\s*$")
_DTD = re.compile(r"<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+\"nvsmi_device(?:_v([0-9]+))?\.dtd\"")
_THROTTLE_BLOCKS = (("clocks_event_reasons", "clocks_event_reason_"),
                    ("clocks_throttle_reasons", "clocks_throttle_reason_"))
_UNCORRECTABLE = ("dram_uncorrectable", "sram_uncorrectable", "sram_uncorrectable_parity",
                  "sram_uncorrectable_secded")


class NvidiaSmiError(GpuInstallError):
    """nvidia-smi's output cannot be read: not XML, not an nvidia_smi_log, a value of the wrong kind, or a failure
    other than driver-not-loaded."""

    exit_code = EXIT_VALIDATION


@dataclass(frozen=True)
class MigDevice:
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    multiprocessors: int | None
    memory_mib: int | None
    profile: str | None  # e.g. "1g.20gb", derived (see module doc); None when it cannot be told
    uuid: str | None  # MIG-…, when the document carries it


@dataclass(frozen=True)
class EccErrors:
    volatile_double_bit: int | None  # uncorrectable errors since the driver loaded
    aggregate_double_bit: int | None  # over the GPU's lifetime


@dataclass(frozen=True)
class RetiredPages:
    single_bit: int | None  # pages retired for multiple single-bit errors
    double_bit: int | None  # pages retired for a double-bit error
    pending: bool | None  # a retirement waits for the next driver reload / GPU reset


@dataclass(frozen=True)
class RemappedRows:
    correctable: int | None
    uncorrectable: int | None
    pending: bool | None  # a remap waits for a GPU reset
    failure: bool | None  # a remap failed: the GPU is out of spare rows


@dataclass(frozen=True)
class Fabric:
    """A GPU's registration with the NVSwitch (NVLink) fabric as nvidia-smi reports it: state Not Started, In Progress
    or Completed, and, once Completed, the status (Success, or the error, e.g. Insufficient Resources). None: N/A or
    Not Supported (a GPU on no NVSwitch fabric, or one before Hopper, which does not report it)."""

    state: str | None
    status: str | None

    @property
    def reported(self) -> bool:
        """Whether the GPU reports a fabric state at all (it is on an NVSwitch fabric and can say so)."""
        return self.state is not None

    @property
    def initialised(self) -> bool:
        """Completed with status Success: the only state in which CUDA can use the GPU on an NVSwitch system."""
        return (self.state or "").lower() == "completed" and (self.status or "").lower() == "success"


@dataclass(frozen=True)
class Gpu:
    index: int  # position in the document (nvidia-smi's GPU index order)
    minor_number: int | None  # /dev/nvidia<minor>
    uuid: str | None
    product_name: str | None
    pci_bus_id: str | None  # as nvidia-smi writes it: 00000000:01:00.0
    persistence_mode: bool | None
    mig_current: bool | None
    mig_pending: bool | None
    mig_devices: tuple[MigDevice, ...]
    ecc_current: bool | None
    ecc_pending: bool | None
    ecc_errors: EccErrors
    retired_pages: RetiredPages | None  # None: no retired_pages block, or page retirement not supported (N/A)
    remapped_rows: RemappedRows | None  # None: no block, or N/A (GPUs without row remapping)
    throttle_reasons: tuple[str, ...] | None  # active reasons without prefix ("gpu_idle", "hw_slowdown"); None: no block
    temperature_c: int | None
    slowdown_temp_c: int | None
    shutdown_temp_c: int | None
    max_operating_temp_c: int | None  # gpu_temp_max_gpu_threshold (or derived from T.Limit margins)
    power_draw_w: float | None
    power_limit_w: float | None
    fan_speed_pct: int | None
    fabric: Fabric | None = None  # None: the document has no fabric element (see the module doc)

    @property
    def label(self) -> str:
        """How messages name this GPU: index, UUID (else PCI bus id) and product."""
        ident = self.uuid or self.pci_bus_id or f"minor {self.minor_number}"
        return f"GPU {self.index} ({ident}{', ' + self.product_name if self.product_name else ''})"


@dataclass(frozen=True)
class NvidiaSmi:
    dtd_version: int | None  # 12 for nvsmi_device_v12.dtd; None without a versioned DOCTYPE
    timestamp: str | None
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None  # as the document says (a trimmed document may hold fewer <gpu> elements)
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class DriverNotLoaded:
    """nvidia-smi ran but could not reach the kernel driver (exit code 9)."""

    exit_code: int
    message: str


def _text(el: ET.Element | None) -> str | None:
    if el is None:
        return None
    value = (el.text or "").strip()
    return None if value.lower() in _UNAVAILABLE else value


class _Reader:
    """Reads typed values under one element; errors name the GPU and the element."""

    def __init__(self, where: str):
        self.where = where

    def number(self, el: ET.Element | None, path: str) -> float | None:
        raw = _text(el.find(path) if el is not None else None)
        if raw is None:
            return None
        m = _NUMBER.match(raw)
        if not m:
            raise NvidiaSmiError(f"{self.where}: <{path}> is {raw!r}, not a number",
                                 hint="the document is not what `nvidia-smi -q -x` prints; capture it again")
        return float(m.group(1))

    def integer(self, el: ET.Element | None, path: str) -> int | None:
        v = self.number(el, path)
        return None if v is None else int(v)

    def flag(self, el: ET.Element | None, path: str) -> bool | None:
        raw = _text(el.find(path) if el is not None else None)
        if raw is None:
            return None
        low = raw.lower()
        if low in ("enabled", "yes", "active", "on"):
            return True
        if low in ("disabled", "no", "not active", "off"):
            return False
        raise NvidiaSmiError(f"{self.where}: <{path}> is {raw!r}, not Enabled/Disabled or Yes/No",
                             hint="the document is not what `nvidia-smi -q -x` prints; capture it again")


def _first_number(r: _Reader, el: ET.Element | None, *paths: str) -> float | None:
    for p in paths:
        v = r.number(el, p)
        if v is not None:
            return v
    return None


def _double_bit(r: _Reader, block: ET.Element | None) -> int | None:
    if block is None:
        return None
    if block.find("double_bit") is not None:
        return r.integer(block, "double_bit/total")
    counts = [r.integer(block, name) for name in _UNCORRECTABLE]
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _throttle(gpu: ET.Element) -> tuple[str, ...] | None:
    for block_name, prefix in _THROTTLE_BLOCKS:
        block = gpu.find(block_name)
        if block is not None:
            return tuple(child.tag.removeprefix(prefix) for child in block
                         if (_text(child) or "").lower() == "active")
    return None


def mig_profile(product_name: str | None, memory_mib: int | None, multiprocessors: int | None,
                gpu_memory_mib: int | None = None) -> str | None:
    """The MIG profile ("1g.18gb") of a MIG device of this memory and SM count on this GPU model, or None: derived from
    the driver's facts (installer.mig.profile_of), never from the number in a profile's name. gpu_memory_mib: the
    parent GPU's total memory (used for models without a recorded driver profile table)."""
    from installer import mig

    return mig.profile_of(product_name, memory_mib, multiprocessors, gpu_memory_mib)


def _mig_devices(r: _Reader, gpu: ET.Element, product: str | None) -> tuple[MigDevice, ...]:
    block = gpu.find("mig_devices")
    total = r.integer(gpu, "fb_memory_usage/total")
    if block is None:
        return ()
    out = []
    for dev in block.findall("mig_device"):
        memory = r.integer(dev, "fb_memory_usage/total")
        sms = r.integer(dev, "device_attributes/shared/multiprocessor_count")
        out.append(MigDevice(
            index=r.integer(dev, "index"),
            gpu_instance_id=r.integer(dev, "gpu_instance_id"),
            compute_instance_id=r.integer(dev, "compute_instance_id"),
            multiprocessors=sms,
            memory_mib=memory,
            profile=mig_profile(product, memory, sms, total),
            uuid=_text(dev.find("uuid")),
        ))
    return tuple(out)


def _thresholds(r: _Reader, temp: ET.Element | None) -> tuple[int | None, int | None, int | None]:
    """(slowdown, shutdown, max operating) in C: the absolute thresholds, else derived from the T.Limit margins (module
    doc): T.Limit = gpu_temp + gpu_temp_tlimit, each threshold = T.Limit - its margin."""
    slowdown = r.integer(temp, "gpu_temp_slow_threshold")
    shutdown = r.integer(temp, "gpu_temp_max_threshold")
    max_operating = r.integer(temp, "gpu_temp_max_gpu_threshold")
    current, headroom = r.integer(temp, "gpu_temp"), r.integer(temp, "gpu_temp_tlimit")
    if current is not None and headroom is not None:
        tlimit = current + headroom

        def derived(margin: str) -> int | None:
            m = r.integer(temp, margin)
            return None if m is None else tlimit - m

        slowdown = slowdown if slowdown is not None else derived("gpu_temp_slow_tlimit_threshold")
        shutdown = shutdown if shutdown is not None else derived("gpu_temp_max_tlimit_threshold")
        if max_operating is None:
            max_operating = derived("gpu_temp_max_gpu_tlimit_threshold")
    return slowdown, shutdown, max_operating


def _retired(r: _Reader, retired: ET.Element | None) -> RetiredPages | None:
    """The retired_pages block; None without one, or when every value is N/A (the GPU does not retire pages)."""
    if retired is None:
        return None
    pages = RetiredPages(single_bit=r.integer(retired, "multiple_single_bit_retirement/retired_count"),
                         double_bit=r.integer(retired, "double_bit_retirement/retired_count"),
                         pending=r.flag(retired, "pending_retirement"))
    return None if pages == RetiredPages(None, None, None) else pages


def _gpu(index: int, gpu: ET.Element) -> Gpu:
    bus_id = _text(gpu.find("pci/pci_bus_id")) or gpu.get("id")
    r = _Reader(f"nvidia-smi GPU {index} ({bus_id or 'no PCI bus id'})")
    product = _text(gpu.find("product_name"))
    ecc = gpu.find("ecc_errors")
    retired = gpu.find("retired_pages")
    remap = gpu.find("remapped_rows")
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    temp = gpu.find("temperature")
    slowdown, shutdown, max_operating = _thresholds(r, temp)
    return Gpu(
        index=index,
        minor_number=r.integer(gpu, "minor_number"),
        uuid=_text(gpu.find("uuid")),
        product_name=product,
        pci_bus_id=bus_id,
        persistence_mode=r.flag(gpu, "persistence_mode"),
        mig_current=r.flag(gpu, "mig_mode/current_mig"),
        mig_pending=r.flag(gpu, "mig_mode/pending_mig"),
        mig_devices=_mig_devices(r, gpu, product),
        ecc_current=r.flag(gpu, "ecc_mode/current_ecc"),
        ecc_pending=r.flag(gpu, "ecc_mode/pending_ecc"),
        ecc_errors=EccErrors(
            volatile_double_bit=_double_bit(r, ecc.find("volatile") if ecc is not None else None),
            aggregate_double_bit=_double_bit(r, ecc.find("aggregate") if ecc is not None else None),
        ),
        retired_pages=_retired(r, retired),
        remapped_rows=None if remap is None or len(remap) == 0 else RemappedRows(
            correctable=r.integer(remap, "remapped_row_corr"),
            uncorrectable=r.integer(remap, "remapped_row_unc"),
            pending=r.flag(remap, "remapped_row_pending"),
            failure=r.flag(remap, "remapped_row_failure"),
        ),
        throttle_reasons=_throttle(gpu),
        temperature_c=r.integer(temp, "gpu_temp"),
        slowdown_temp_c=slowdown,
        shutdown_temp_c=shutdown,
        max_operating_temp_c=max_operating,
        power_draw_w=_first_number(r, power, "power_draw", "instant_power_draw", "average_power_draw"),
        power_limit_w=_first_number(r, power, "current_power_limit", "enforced_power_limit", "power_limit"),
        fan_speed_pct=r.integer(gpu, "fan_speed"),
        fabric=_fabric(gpu.find("fabric")),
    )


#: what nvidia-smi prints for a fabric state/status it cannot give (a GPU on no NVSwitch fabric); "Unknown Error" is
#: not among them: as a fabric status it is the registration's failure (NVIDIA/NVSentinel#883)
_FABRIC_NA = {"", "n/a", "[n/a]", "not supported", "[not supported]"}


def _fabric_value(raw: str | None) -> str | None:
    value = (raw or "").strip()
    return None if value.lower() in _FABRIC_NA else _bounded(value)


def _fabric(block: ET.Element | None) -> Fabric | None:
    if block is None:
        return None
    state, status = block.find("state"), block.find("status")
    return Fabric(state=_fabric_value(state.text if state is not None else None),
                  status=_fabric_value(status.text if status is not None else None))


_FABRIC_VALUE = re.compile(r"^[\x20-\x7e]{1,80}$")


def _bounded(value: str | None) -> str | None:
    """A fabric state/status as the node printed it, kept only when it is short printable text (it is shown in
    messages)."""
    if value is None:
        return None
    if not _FABRIC_VALUE.match(value):
        raise NvidiaSmiError(f"nvidia-smi fabric state/status {value[:40]!r}: not a short printable value",
                             hint="the document is not what nvidia-smi prints; capture it again")
    return value


#: at most this many characters of `nvidia-smi -q` text are read by parse_fabric_text (an 8-GPU node prints ~80 kB)
MAX_QUERY_TEXT = 4 * 1024 * 1024
_KEY_VALUE = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]*?)\s*:\s*(?P<value>.*?)\s*$")


def parse_fabric_text(text: str) -> tuple[Fabric, ...]:
    """The Fabric sections of `nvidia-smi -q` text output, one per GPU in the order printed: the `State` and `Status`
    lines under a line `Fabric` (indented deeper than it; N/A, Not Supported -> None). Text after MAX_QUERY_TEXT
    characters is not read. Raises NvidiaSmiError for a value that is not short printable text."""
    out: list[Fabric] = []
    section: dict[str, str | None] | None = None
    depth = 0
    for line in text[:MAX_QUERY_TEXT].splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if section is not None and indent <= depth:
            out.append(Fabric(section.get("state"), section.get("status")))
            section = None
        if line.strip() == "Fabric":
            section, depth = {}, indent
            continue
        m = _KEY_VALUE.match(line)
        if section is not None and m and m["key"].lower() in ("state", "status") and m["key"].lower() not in section:
            section[m["key"].lower()] = _fabric_value(m["value"])
    if section is not None:
        out.append(Fabric(section.get("state"), section.get("status")))
    return tuple(out)


def parse_xml(document: str | bytes) -> NvidiaSmi:
    """Parse the output of `nvidia-smi -q -x`. Raises NvidiaSmiError naming what is wrong."""
    text = document.decode("utf-8", "replace") if isinstance(document, bytes) else document
    if "<!ENTITY" in text:
        raise NvidiaSmiError("nvidia-smi XML declares entities; nvidia-smi never does, refusing to expand them")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise NvidiaSmiError(f"nvidia-smi output is not well-formed XML: {e}",
                             hint="run `nvidia-smi -q -x` on the node; a truncated capture or mixed stderr does this"
                             ) from None
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError(f"not nvidia-smi -q -x output: the root element is <{root.tag}>, not <nvidia_smi_log>")
    dtd = _DTD.search(text)
    r = _Reader("nvidia-smi")
    return NvidiaSmi(
        dtd_version=int(dtd.group(1)) if dtd and dtd.group(1) else None,
        timestamp=_text(root.find("timestamp")),
        driver_version=_text(root.find("driver_version")),
        cuda_version=_text(root.find("cuda_version")),
        attached_gpus=r.integer(root, "attached_gpus"),
        gpus=tuple(_gpu(i, g) for i, g in enumerate(root.findall("gpu"))),
    )


def parse_output(stdout: str | bytes, exit_code: int, stderr: str | bytes = "") -> NvidiaSmi | DriverNotLoaded:
    """What a run of `nvidia-smi -q -x` says: the parsed document (exit 0), DriverNotLoaded (exit 9, or its message),
    else NvidiaSmiError with nvidia-smi's own words."""
    out = stdout.decode("utf-8", "replace") if isinstance(stdout, bytes) else stdout
    err = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    said = "\n".join(s for s in (out.strip(), err.strip()) if s)
    if exit_code == EXIT_DRIVER_NOT_LOADED or _NOT_LOADED_TEXT in said.lower().replace("\u2018", "'"):
        return DriverNotLoaded(exit_code, said)
    if exit_code != 0:
        first = said.splitlines()[0] if said else "no output"
        raise NvidiaSmiError(f"nvidia-smi exited with code {exit_code}: {first}",
                             hint="code 18 (Driver/library version mismatch) means the loaded kernel module and the "
                             "user-space driver differ: reboot the node after a driver upgrade")
    return parse_xml(out)
