"""The real lab nodes' STAND-IN GPU config (gpu_install_lab/gpus.py): what the device plugin is given."""

from __future__ import annotations

import pytest
import yaml

from gpu_install_lab import gpus


def test_uuids_stable_per_node_and_distinct_between_nodes_and_labs():
    a = gpus.node_config("lab1", "node1", 2)
    assert a == gpus.node_config("lab1", "node1", 2)
    uuids = [g["uuid"] for g in a["gpus"]]
    assert len(set(uuids)) == 2 and all(u.startswith("GPU-") for u in uuids)
    assert not set(uuids) & {g["uuid"] for g in gpus.node_config("lab1", "node2", 2)["gpus"]}
    assert not set(uuids) & {g["uuid"] for g in gpus.node_config("lab2", "node1", 2)["gpus"]}


def test_models_are_the_recorded_ones():
    t4 = gpus.node_config("lab", "node1", 1, "Tesla T4")["gpus"][0]
    assert (t4["model"], t4["memoryMiB"], t4["migCapable"]) == ("Tesla T4", 15360, False)
    with pytest.raises(ValueError, match="recorded"):
        gpus.node_config("lab", "node1", 1, "NVIDIA B200")
    # the real driver-580 machines (tests/fixtures/nvidia-smi/README-h100-h200-580.md): their memory and driver
    for model, mib in (("NVIDIA H100 80GB HBM3", 81559), ("NVIDIA H200", 143771)):
        cfg = gpus.node_config("lab", "node1", 1, model)
        g = cfg["gpus"][0]
        assert (g["model"], g["memoryMiB"], g["migCapable"]) == (model, mib, True)
        assert (cfg["driverVersion"], cfg["cudaVersion"]) == ("580.159.04", "13.0")
    a100 = gpus.node_config("lab", "node1", 1)
    assert (a100["driverVersion"], a100["cudaVersion"]) == ("535.54.03", "12.2")
    assert gpus.node_config("lab", "node1", 0)["gpus"] == []


def test_customise_writes_binaries_config_and_unit(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    for name in (gpus.PLUGIN, gpus.SMI):
        (tools / name).write_bytes(b"#!/bin/sh\n")
    merged = tmp_path / "merged"
    node = {"name": "node1", "gpus": 2, "gpu_model": "Tesla T4"}
    gpus.customise(merged, "lab", node, tools)
    cfg = yaml.safe_load((merged / gpus.CONFIG_PATH.lstrip("/")).read_text())
    assert [g["model"] for g in cfg["gpus"]] == ["Tesla T4", "Tesla T4"]
    assert (merged / gpus.NODE_LIB.lstrip("/") / gpus.PLUGIN).stat().st_mode & 0o111
    unit = (merged / "etc/systemd/system" / gpus.UNIT).read_text()
    assert f"--config={gpus.CONFIG_PATH}" in unit and "After=kubelet.service" in unit
    assert (merged / "etc/systemd/system/multi-user.target.wants" / gpus.UNIT).is_symlink()
    # a second `lab up` keeps an edited config
    (merged / gpus.CONFIG_PATH.lstrip("/")).write_text("edited\n")
    gpus.customise(merged, "lab", node, tools)
    assert (merged / gpus.CONFIG_PATH.lstrip("/")).read_text() == "edited\n"


def test_mig_layout_parsed_checked_and_advertised():
    assert gpus.parse_mig("1g.10gb=2, 2g.20gb=1") == {"1g.10gb": 2, "2g.20gb": 1}
    assert gpus.parse_mig(None) == {} == gpus.parse_mig("")
    for bad in ("1g.10gb", "1g.10gb=0", "1g.10gb=x", "=2", "1g.10gb=1,1g.10gb=2", "1g.10gb=٣"):
        with pytest.raises(ValueError, match="--mig"):
            gpus.parse_mig(bad)
    cfg = gpus.node_config("lab", "node1", 2, mig={"1g.10gb": 2, "2g.20gb": 1})
    assert gpus.expected_resources(cfg) == {"nvidia.com/mig-1g.10gb": 4, "nvidia.com/mig-2g.20gb": 2}
    uuids = [m["uuid"] for g in cfg["gpus"] for m in g["mig"]]
    assert len(set(uuids)) == 6 and all(u.startswith("MIG-") for u in uuids)
    cfg["gpus"][0]["mig"][0]["healthy"] = False
    cfg["gpus"][1]["healthy"] = False
    assert gpus.expected_resources(cfg) == {"nvidia.com/mig-1g.10gb": 1, "nvidia.com/mig-2g.20gb": 1}
    assert gpus.expected_resources(gpus.node_config("lab", "n", 3)) == {"nvidia.com/gpu": 3}


@pytest.mark.parametrize(("model", "mig", "why"), [
    ("Tesla T4", {"1g.10gb": 1}, "not MIG-capable"),
    ("NVIDIA A100-SXM4-80GB", {"1g.5gb": 1}, "no MIG profile 1g.5gb"),
    ("NVIDIA A100-SXM4-80GB", {"3g.40gb": 3}, "at most 2"),
    ("NVIDIA A100-SXM4-80GB", {"3g.40gb": 2, "2g.20gb": 1}, "8 compute slices"),
])
def test_impossible_mig_layouts_refused(model, mig, why):
    with pytest.raises(ValueError, match=why):
        gpus.node_config("lab", "node1", 1, model, mig)
