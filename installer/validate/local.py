"""`gpu-install validate --local`: the node (and runtime) layer on THIS machine, with NVML in-process.

The GPU facts come from NVML through nvidia-ml-py (pynvml) instead of `nvidia-smi -q -x`, and are mapped onto the
same typed facts (installer/validate/nvsmi.py: NvidiaSmi / DriverNotLoaded), so the same node checks
(installer/validate/node.py) judge them. The rest of what the remote probe reads (NVIDIA GPUs on PCI, loaded modules,
Secure Boot, a pending reboot, the runtime's effective configuration) comes from running the same probe script
locally (installer/validate/probe.py PROBE), so a machine is judged the same way whether validate reaches it over SSH
or runs on it.

NVML errors are facts, not crashes: the library missing (no driver installed) is NvidiaSmiError with the fix;
NVML_ERROR_DRIVER_NOT_LOADED is DriverNotLoaded (the same finding as nvidia-smi's exit 9); a value a GPU does not
support (NVML_ERROR_NOT_SUPPORTED and the like) is None, as "N/A" is in the XML.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

from installer.validate.nvsmi import (
    DriverNotLoaded,
    EccErrors,
    Fabric,
    Gpu,
    MigDevice,
    NvidiaSmi,
    NvidiaSmiError,
    RemappedRows,
    RetiredPages,
    mig_profile,
)
from installer.validate.report import Check

#: NVML's clock event / throttle reason bits (nvml.h nvmlClocksEventReason*), named as nvidia-smi's XML names them.
REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
           0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
DRIVER_NOT_LOADED_EXIT = 9  # what nvidia-smi exits with in the same state; the finding names it so


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml(nvml: Any = None) -> NvidiaSmi | DriverNotLoaded:
    """This machine's GPUs through NVML. Raises NvidiaSmiError when NVML cannot be used at all (library missing,
    no permission, an unexpected NVML error), with the fix."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError_DriverNotLoaded as exc:
        return DriverNotLoaded(DRIVER_NOT_LOADED_EXIT, f"NVML: {exc}")
    except nvml.NVMLError_LibraryNotFound:
        raise NvidiaSmiError("NVML (libnvidia-ml.so.1) is not installed: no NVIDIA driver on this machine",
                             hint="install the driver (gpu-install apply with driver.mode host or runfile), or run "
                                  "validate against the nodes with -s/-i") from None
    except nvml.NVMLError as exc:
        raise NvidiaSmiError(f"NVML could not start: {exc}",
                             hint="run as a user that may open /dev/nvidia* (root), and check `dmesg` for NVRM "
                                  "messages") from None
    try:
        return _read(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _read(nvml: Any) -> NvidiaSmi:
    def get(fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args), or None when NVML says the GPU cannot tell (not supported, no permission, N/A)."""
        try:
            return fn(*args)
        except nvml.NVMLError:
            return None

    cuda = get(nvml.nvmlSystemGetCudaDriverVersion_v2) or get(nvml.nvmlSystemGetCudaDriverVersion)
    count = int(nvml.nvmlDeviceGetCount())
    gpus = tuple(_gpu(nvml, get, i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count))
    driver = get(nvml.nvmlSystemGetDriverVersion)
    return NvidiaSmi(dtd_version=None, timestamp=time.strftime("%a %b %d %H:%M:%S %Y"),
                     driver_version=_text(driver) if driver is not None else None,
                     cuda_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
                     attached_gpus=count, gpus=gpus)


def _pair(value: Any) -> tuple[Any, Any]:
    return (value[0], value[1]) if isinstance(value, list | tuple) and len(value) == 2 else (None, None)


def _flag(value: Any, enabled: int = 1) -> bool | None:
    return None if value is None else value == enabled


def _gpu(nvml: Any, get: Callable[..., Any], index: int, h: Any) -> Gpu:
    name = get(nvml.nvmlDeviceGetName, h)
    product = _text(name) if name is not None else None
    pci = get(nvml.nvmlDeviceGetPciInfo, h)
    bus_id = _text(pci.busId) if pci is not None else None
    mig_cur, mig_pend = _pair(get(nvml.nvmlDeviceGetMigMode, h))
    ecc_cur, ecc_pend = _pair(get(nvml.nvmlDeviceGetEccMode, h))
    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    retired = None
    single = get(nvml.nvmlDeviceGetRetiredPages, h, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    double = get(nvml.nvmlDeviceGetRetiredPages, h, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    pending = get(nvml.nvmlDeviceGetRetiredPagesPendingStatus, h)
    if single is not None or double is not None or pending is not None:  # else not supported: None, as the XML's N/A
        retired = RetiredPages(len(single) if single is not None else None,
                               len(double) if double is not None else None, _flag(pending))
    rows = get(nvml.nvmlDeviceGetRemappedRows, h)
    remapped = RemappedRows(int(rows[0]), int(rows[1]), bool(rows[2]), bool(rows[3])) \
        if isinstance(rows, list | tuple) and len(rows) == 4 else None
    reasons = get(nvml.nvmlDeviceGetCurrentClocksEventReasons, h)
    if reasons is None:
        reasons = get(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    temp = get(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    power = get(nvml.nvmlDeviceGetPowerUsage, h)
    limit = get(nvml.nvmlDeviceGetEnforcedPowerLimit, h)
    uuid = get(nvml.nvmlDeviceGetUUID, h)
    mem_info = get(nvml.nvmlDeviceGetMemoryInfo, h)
    gpu_mem = int(mem_info.total) // (1024 * 1024) if mem_info is not None else None
    return Gpu(
        index=index,
        minor_number=get(nvml.nvmlDeviceGetMinorNumber, h),
        uuid=_text(uuid) if uuid is not None else None,
        product_name=product,
        pci_bus_id=bus_id,
        persistence_mode=_flag(get(nvml.nvmlDeviceGetPersistenceMode, h)),
        mig_current=_flag(mig_cur),
        mig_pending=_flag(mig_pend),
        mig_devices=_mig_devices(nvml, get, h, product, gpu_mem) if mig_cur == 1 else (),
        ecc_current=_flag(ecc_cur),
        ecc_pending=_flag(ecc_pend),
        ecc_errors=EccErrors(get(nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_VOLATILE_ECC),
                             get(nvml.nvmlDeviceGetTotalEccErrors, h, unc, nvml.NVML_AGGREGATE_ECC)),
        retired_pages=retired,
        remapped_rows=remapped,
        throttle_reasons=None if reasons is None else tuple(n for bit, n in REASONS.items() if int(reasons) & bit),
        temperature_c=temp,
        slowdown_temp_c=get(nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
        shutdown_temp_c=get(nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
        max_operating_temp_c=get(nvml.nvmlDeviceGetTemperatureThreshold, h, nvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX),
        power_draw_w=power / 1000 if power is not None else None,
        power_limit_w=limit / 1000 if limit is not None else None,
        fan_speed_pct=get(nvml.nvmlDeviceGetFanSpeed, h),
        fabric=_fabric(nvml, h),
    )


#: nvmlGpuFabricState_t -> what nvidia-smi prints as the fabric State (0, not supported: N/A)
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}


def _fabric(nvml: Any, h: Any) -> Fabric | None:
    """The GPU's NVSwitch fabric registration as nvmlDeviceGetGpuFabricInfo reports it, in nvidia-smi's words (state,
    and once Completed the status: Success, else NVML's error string); N/A (Fabric(None, None)) when the GPU is on no
    fabric or cannot tell; None when this NVML has no such call (as a document without the fabric element)."""
    import ctypes

    fn, info_type = getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None), getattr(nvml, "c_nvmlGpuFabricInfo_t", None)
    if fn is None or info_type is None:
        return None
    info = info_type()
    try:
        fn(h, ctypes.byref(info))
    except nvml.NVMLError_FunctionNotFound:
        return None
    except nvml.NVMLError:
        return Fabric(None, None)
    state = FABRIC_STATES.get(int(info.state))
    if state is None:
        return Fabric(None, None)
    status = None
    if state == "Completed":
        code = int(info.status)
        status = "Success" if code == nvml.NVML_SUCCESS else _text(nvml.nvmlErrorString(code))
    return Fabric(state, status)


def _mig_devices(nvml: Any, get: Callable[..., Any], h: Any, product: str | None,
                 gpu_memory_mib: int | None) -> tuple[MigDevice, ...]:
    out = []
    for i in range(get(nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
        m = get(nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i)
        if m is None:
            continue  # no MIG device at this slot
        mem = get(nvml.nvmlDeviceGetMemoryInfo, m)
        attrs = get(nvml.nvmlDeviceGetAttributes, m)
        memory_mib = int(mem.total) // (1024 * 1024) if mem is not None else None
        sms = int(attrs.multiprocessorCount) if attrs is not None else None
        uuid = get(nvml.nvmlDeviceGetUUID, m)
        out.append(MigDevice(index=i, gpu_instance_id=get(nvml.nvmlDeviceGetGpuInstanceId, m),
                             compute_instance_id=get(nvml.nvmlDeviceGetComputeInstanceId, m),
                             multiprocessors=sms, memory_mib=memory_mib,
                             profile=mig_profile(product, memory_mib, sms, gpu_memory_mib),
                             uuid=_text(uuid) if uuid is not None else None))
    return tuple(out)


def run(expect: Any, runtime_expect: Any | None, layers: tuple[str, ...], timeout: float = 60.0,
        nvml: Any = None) -> list[Check]:
    """This machine's checks, one row named after its host name: the probe script run here (PCI, modules, Secure
    Boot, reboot, runtime) and NVML for the GPUs."""
    from installer.validate import probe

    host = socket.gethostname()
    t0 = time.monotonic()
    try:
        proc = subprocess.run(["sh", "-c", probe.PROBE], capture_output=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        facts = probe.parse_probe(proc.stdout.decode("utf-8", "replace"))
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return [Check("node", "node.probe", host, "fail", f"the local probe did not finish: {exc}",
                      "run validate --local again; check that `sh` and coreutils work here")]
    target = probe.Target(host, host, {})
    out: list[Check] = []
    if "node" in layers:
        try:
            result: NvidiaSmi | DriverNotLoaded | NvidiaSmiError = read_nvml(nvml)
        except NvidiaSmiError as exc:
            result = exc
        out += probe.checks_for(target, facts, expect, time.monotonic() - t0, result=result, via="NVML")
    if "runtime" in layers and runtime_expect is not None:
        out += probe.runtime_checks_for(target, facts, runtime_expect, time.monotonic() - t0)
    return out
