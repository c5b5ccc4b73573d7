"""The lab's STAND-IN nvidia-smi on an NVSwitch node (gpus.yaml `nvswitch: true`): `-q -x` reports each GPU's fabric
In Progress while the node's Fabric Manager STAND-IN is not running and Completed / Success while it is (its state file,
gpu_install_lab.gpus.FABRIC_STATE), and validate's node.fabric check reads it so; a node without NVSwitches keeps the
recorded document's N/A. The real stand-in binary runs (scripts/build-lab-tools builds it). No root, no lab, no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from gpu_install_lab import gpus
from installer.validate.node import FABRIC, Expectations, check_node
from installer.validate.nvsmi import Fabric, parse_xml
from tests.integration.test_standin_device_plugin import tools  # noqa: F401  (the module's fixture)


def _smi(tools: Path, tmp_path: Path, nvswitch: bool, state: Path, model: str = "NVIDIA H100 80GB HBM3"):  # noqa: F811
    cfg = gpus.node_config("lab", "node1", 2, model, nvswitch=nvswitch)
    info = tmp_path / "devices.json"
    info.write_text(json.dumps(gpus.node_device_info(cfg)))
    env = {"PATH": "/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_STANDIN_DEVICE_INFO": str(info),
           "NVIDIA_STANDIN_FABRIC_STATE": str(state)}
    proc = subprocess.run([str(tools / gpus.SMI), "-q", "-x"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse_xml(proc.stdout)


def test_an_nvswitch_node_reports_its_fabric_as_the_fabric_manager_standin_left_it(tools: Path, tmp_path: Path):  # noqa: F811
    state = tmp_path / "fabric-manager.state"
    doc = _smi(tools, tmp_path, True, state)
    assert [g.fabric for g in doc.gpus] == [Fabric("In Progress", None)] * 2
    res = [f for f in check_node("node1", doc, Expectations(nvswitch=True)) if f.check == FABRIC]
    assert [(f.severity, f.gpu_index) for f in res] == [("error", 0), ("error", 1)]
    assert "fabric state In Progress (Fabric Manager has not set the fabric up)" in res[0].message

    state.write_text("Completed 535.309.01\n")  # what the STAND-IN unit writes when it starts
    doc = _smi(tools, tmp_path, True, state)
    assert [g.fabric for g in doc.gpus] == [Fabric("Completed", "Success")] * 2
    (ok,) = [f for f in check_node("node1", doc, Expectations(nvswitch=True)) if f.check == FABRIC]
    assert ok.severity == "info" and "initialised on all 2 GPU(s)" in ok.message

    os.unlink(state)  # ExecStopPost removes it
    assert _smi(tools, tmp_path, True, state).gpus[0].fabric == Fabric("In Progress", None)


def test_a_node_without_nvswitches_keeps_the_recorded_na(tools: Path, tmp_path: Path):  # noqa: F811
    state = tmp_path / "fabric-manager.state"
    state.write_text("Completed 535.309.01\n")  # a state file alone does not make a node an NVSwitch node
    for model in ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"):
        doc = _smi(tools, tmp_path, False, state, model)
        assert [g.fabric for g in doc.gpus] == [Fabric(None, None)] * 2
        assert [f for f in check_node("node1", doc, Expectations()) if f.check == FABRIC] == []
