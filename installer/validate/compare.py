"""The two readers of a machine's GPUs, field by field: `nvidia-smi -q -x` parsed (installer/validate/nvsmi.py, what
validate reads from a remote node over SSH) against NVML (installer/validate/local.py, what `validate --local` reads).

Both give the same typed facts (NvidiaSmi / Gpu), so every field can be compared. A difference is either explained
(the field is a live reading and the two captures are moments apart, or one reader has no such fact: NVML has no
document version) or unexplained: then one reader reads the machine wrong, and scripts/gpu-check exits non-zero.

    python -m installer.validate.compare [--xml FILE] [--json FILE]

reads NVML in-process and the XML from FILE (else runs `nvidia-smi -q -x`), prints every field that differs, and
exits 0 when none is unexplained, 6 (EXIT_VALIDATION) otherwise, 8 when a reader cannot run at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from installer.errors import EXIT_ENVIRONMENT, EXIT_OK, EXIT_VALIDATION
from installer.validate.nvsmi import DriverNotLoaded, Gpu, NvidiaSmi, NvidiaSmiError, parse_output

#: document fields one reader does not have: field -> why
NOT_IN_BOTH = {
    "dtd_version": "NVML has no document (DTD) version; the XML names its DTD",
    "timestamp": "each reader stamps its own capture time",
}
#: live readings: they move between the two captures (seconds apart), so a difference is expected
READINGS = {
    "temperature_c": "a live reading (C); the captures are moments apart",
    "power_draw_w": "a live reading (W); the captures are moments apart (and the XML's instant vs NVML's figure)",
    "throttle_reasons": "live clock event reasons (gpu_idle comes and goes with load)",
    "fan_speed_pct": "a live reading (%)",
}


@dataclass(frozen=True)
class Difference:
    where: str          # "document" or "GPU <index> (<uuid>)"
    field: str          # e.g. "slowdown_temp_c", "mig_devices[0].profile"
    xml: Any
    nvml: Any
    explained: str | None  # why the difference is expected; None: unexplained

    def line(self) -> str:
        verdict = f"explained: {self.explained}" if self.explained else "UNEXPLAINED"
        return f"{self.where}: {self.field}: XML {self.xml!r} vs NVML {self.nvml!r} ({verdict})"


def _plain(value: Any) -> Any:
    """A value as JSON can hold it (dataclasses as dicts, tuples as lists)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _gpu_differences(where: str, x: Gpu, n: Gpu) -> list[Difference]:
    out = []
    for f in dataclasses.fields(Gpu):
        xv, nv = getattr(x, f.name), getattr(n, f.name)
        if f.name == "mig_devices" and len(xv) == len(nv):
            for i, (xd, nd) in enumerate(zip(xv, nv, strict=True)):
                for mf in dataclasses.fields(xd):
                    a, b = getattr(xd, mf.name), getattr(nd, mf.name)
                    if a != b:
                        out.append(Difference(where, f"mig_devices[{i}].{mf.name}", a, b, None))
            continue
        if xv == nv:
            continue
        if f.name in READINGS and xv is not None and nv is not None:
            out.append(Difference(where, f.name, _plain(xv), _plain(nv), READINGS[f.name]))
        else:
            out.append(Difference(where, f.name, _plain(xv), _plain(nv), None))
    return out


def compare(xml: NvidiaSmi, nvml: NvidiaSmi) -> list[Difference]:
    """Every field in which the two readers differ, each explained or not (module doc). GPUs are paired by UUID
    (else by position); a GPU only one reader sees is an unexplained difference."""
    out: list[Difference] = []
    for f in dataclasses.fields(NvidiaSmi):
        if f.name == "gpus":
            continue
        xv, nv = getattr(xml, f.name), getattr(nvml, f.name)
        if xv != nv:
            out.append(Difference("document", f.name, xv, nv, NOT_IN_BOTH.get(f.name)))
    by_uuid = {g.uuid: g for g in nvml.gpus if g.uuid}
    paired: set[int] = set()
    for i, g in enumerate(xml.gpus):
        other = by_uuid.get(g.uuid) if g.uuid else None
        if other is None and i < len(nvml.gpus) and not nvml.gpus[i].uuid:
            other = nvml.gpus[i]
        where = f"GPU {g.index} ({g.uuid or g.pci_bus_id})"
        if other is None:
            out.append(Difference(where, "gpu", "present", "absent", None))
            continue
        paired.add(id(other))
        out += _gpu_differences(where, g, other)
    for g in nvml.gpus:
        if id(g) not in paired:
            out.append(Difference(f"GPU {g.index} ({g.uuid or g.pci_bus_id})", "gpu", "absent", "present", None))
    return out


def unexplained(differences: list[Difference]) -> list[Difference]:
    return [d for d in differences if d.explained is None]


def report(differences: list[Difference], fields_compared: int) -> str:
    lines = [d.line() for d in differences]
    bad = unexplained(differences)
    lines.append(f"compared {fields_compared} fields: {len(differences)} differ, "
                 f"{len(differences) - len(bad)} explained, {len(bad)} unexplained")
    return "\n".join(lines)


def fields_compared(xml: NvidiaSmi) -> int:
    """How many fields compare() looks at for this document (document fields, then each GPU's and MIG device's)."""
    n = len(dataclasses.fields(NvidiaSmi)) - 1
    for g in xml.gpus:
        n += len(dataclasses.fields(Gpu)) - 1
        n += sum(len(dataclasses.fields(d)) for d in g.mig_devices) or 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m installer.validate.compare",
                                 description="compare `nvidia-smi -q -x` (as validate parses it) with NVML, field by field")
    ap.add_argument("--xml", metavar="FILE", help="a saved `nvidia-smi -q -x` document (default: run nvidia-smi now)")
    ap.add_argument("--json", metavar="FILE", help="also write the differences as JSON")
    args = ap.parse_args(argv)
    from installer.validate import local

    try:
        if args.xml:
            with open(args.xml, "rb") as fh:
                raw = fh.read()
            xml_result: NvidiaSmi | DriverNotLoaded = parse_output(raw, 0)
        else:
            proc = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, timeout=120)
            xml_result = parse_output(proc.stdout, proc.returncode, proc.stderr)
        nvml_result = local.read_nvml()
    except (NvidiaSmiError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"compare: a reader cannot run: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    if isinstance(xml_result, DriverNotLoaded) or isinstance(nvml_result, DriverNotLoaded):
        print("compare: the NVIDIA driver is not loaded: "
              f"XML {type(xml_result).__name__}, NVML {type(nvml_result).__name__}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    diffs = compare(xml_result, nvml_result)
    print(report(diffs, fields_compared(xml_result)))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"differences": [dataclasses.asdict(d) for d in diffs],
                       "unexplained": len(unexplained(diffs)),
                       "xml": _plain(xml_result), "nvml": _plain(nvml_result)}, fh, indent=2, default=str)
            fh.write("\n")
    return EXIT_VALIDATION if unexplained(diffs) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
