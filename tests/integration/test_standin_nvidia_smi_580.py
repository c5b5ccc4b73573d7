"""The lab's STAND-IN nvidia-smi playing the real H100 80GB HBM3 and H200 (driver 580.159.04) from their recorded
documents (tests/fixtures/nvidia-smi/README.md): what a lab node of `lab up --gpu-model "NVIDIA H100 80GB HBM3"` (or
"NVIDIA H200") prints is what the real machine printed, and validate's parser reads it as NVML read the real machine.

The real stand-in binary runs (scripts/build-lab-tools builds it, as for test_standin_device_plugin.py). No root, no
lab, no GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpu_install_lab import gpus
from installer.validate.nvsmi import parse_xml
from tests.integration.test_standin_device_plugin import smi, tools  # noqa: F401  (tools: the module's fixture)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"

# folder -> (model, the recorded document, its UUID and bus id)
MACHINES = {
    "h100-80gb-hbm3": ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3-580-v13.xml", "GPU-214dfeee-f8c8-f8d2-7e4e-f078d372d5a0"),
    "h200": ("NVIDIA H200", "h200-580-v13.xml", "GPU-af8d6c48-55af-fd5f-dead-4a982160bd0d"),
}


def _info(tmp_path: Path, folder: str, mig: list[dict[str, str]] | None = None) -> str:
    """The device-info file a lab node of that model gets (gpu_install_lab.gpus), with the real machine's UUID and
    bus id so that the output can be compared with the recording."""
    model, _, uuid = MACHINES[folder]
    cfg = gpus.node_config("lab", "node1", 1, model)
    info: dict[str, Any] = gpus.node_device_info(cfg)
    info["devices"][0].update(uuid=uuid, pciBusId="00000000:00:06.0", **({"mig": mig} if mig else {}))
    p = tmp_path / "devices.json"
    p.write_text(json.dumps(info))
    return str(p)


@pytest.mark.parametrize("folder", sorted(MACHINES))
def test_list_is_the_recorded_one(tools: Path, tmp_path: Path, folder: str) -> None:  # noqa: F811
    out = smi(tools, _info(tmp_path, folder), "all", "-L")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (FIXTURES / folder / "L.txt").read_text()


@pytest.mark.parametrize("folder", sorted(MACHINES))
def test_query_xml_is_the_recorded_document(tools: Path, tmp_path: Path, folder: str) -> None:  # noqa: F811
    """-q -x is the recorded document line for line, but for the stand-in's comment and the capture time."""
    _, doc, _ = MACHINES[folder]
    out = smi(tools, _info(tmp_path, folder), "all", "-q", "-x").stdout.splitlines()
    recorded = (FIXTURES / doc).read_text().splitlines()
    assert out[2] == f"<!-- gpu-install lab STAND-IN nvidia-smi: rendered from recorded document {doc}; no real GPU -->"
    del out[2]
    assert len(out) == len(recorded)
    differ = [(a, b) for a, b in zip(out, recorded, strict=True) if a != b]
    assert len(differ) == 1 and all("<timestamp>" in a for pair in differ for a in pair), differ
    # …and read as NVML read the real machine (README-h100-h200-580.md): 89 / 95 / 87 C, MIG off, no page retirement
    [gpu] = parse_xml("\n".join(out)).gpus
    assert (gpu.slowdown_temp_c, gpu.shutdown_temp_c, gpu.max_operating_temp_c) == (89, 95, 87)
    assert (gpu.mig_current, gpu.mig_pending, gpu.retired_pages) == (False, False, None)


@pytest.mark.parametrize("folder", sorted(MACHINES))
def test_plain_is_the_recorded_driver_580_table(tools: Path, tmp_path: Path, folder: str) -> None:  # noqa: F811
    """The plain table is the recorded one (driver 580's wider layout) but for the date line and two live readings:
    the recording's plain output and its XML were taken seconds apart (H100: 37 C and 36 C; H200: 81 W and 80.14 W),
    and the stand-in fills the table from the XML, so those two cells are the XML's."""
    _, doc, _ = MACHINES[folder]
    out = smi(tools, _info(tmp_path, folder), "all").stdout.splitlines()
    recorded = (FIXTURES / folder / "plain.txt").read_text().splitlines()
    gpu = parse_xml((FIXTURES / doc).read_bytes()).gpus[0]
    assert gpu.power_draw_w is not None
    recorded[9] = re.sub(r"^\| N/A   \d\dC    P0 +\d+W", lambda m: f"| N/A   {gpu.temperature_c}C    P0"
                         + f"{round(gpu.power_draw_w)}W".rjust(len(m.group(0)) - len("| N/A   37C    P0")),
                         recorded[9])
    assert out[1:] == recorded[1:]
    assert re.match(r"^\w{3} \w{3} [ 0-9]\d \d\d:\d\d:\d\d \d{4}       $", out[0])


def test_h200_mig_devices_are_named_by_the_drivers_table(tools: Path, tmp_path: Path) -> None:  # noqa: F811
    """MIG devices on a lab H200 carry the memory and SMs of the driver's profile table (h200/mig-lgip.txt), so the
    parser names them as the driver does, 1g.18gb included (16.00 GiB)."""
    mig = [{"uuid": f"MIG-{i}", "profile": p} for i, p in enumerate(["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb"])]
    out = smi(tools, _info(tmp_path, "h200", mig), "all", "-q", "-x")
    [gpu] = parse_xml(out.stdout).gpus
    assert gpu.mig_current is True
    assert [(d.profile, d.memory_mib, d.multiprocessors) for d in gpu.mig_devices] == [
        ("1g.18gb", 16384, 16), ("1g.35gb", 33280, 26), ("2g.35gb", 33280, 32), ("3g.71gb", 71424, 60)]
    listed = smi(tools, _info(tmp_path, "h200", mig), "all", "-L").stdout
    assert "  MIG 1g.18gb     Device  0: (UUID: MIG-0)" in listed
