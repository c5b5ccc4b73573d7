"""mig.dynamic nos without a cluster: the site block, the plan (operator values, images, chart, role variables,
conflicts), nos' values (through the real chart when GPU_INSTALL_NOS_CHART names it), and the mig_mode module
against the lab's STAND-IN nvidia-smi playing the driver's MIG mode protocol (pending, refused reset, reboot)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from installer import features
from installer.config import parse_site
from installer.errors import ConfigError, PreflightError
from installer.facts import Node
from installer.features import nos as nos_feature
from tests.conftest import ROOT, UPSTREAM, need, plan_of

NODES = [Node("gpu1", "ubuntu", "22.04", None, "gpu1"), Node("gpu2", "ubuntu", "22.04", None, "gpu2", {}, False)]


def site(mig=None, **extra):
    doc = {"operator": {"version": "v24.9.2"},
           "registry": {"host": "registry.example.com:5000", "pullSecret": {"name": "site-pull"}},
           "driver": {"mode": "host"},
           "mig": {"dynamic": "nos", "nos": {"chart": "oci://registry.example.com:5000/charts/nos"}, **(mig or {})},
           **extra}
    return parse_site(doc)


@pytest.mark.parametrize("mig,expect", [
    ({"strategy": "single"}, "dynamic nos needs strategy mixed"),
    ({"config": "all-1g.10gb"}, "static MIG layouts (mig.config) exclude each other"),
    ({"configMap": "mine"}, "drop configMap"),
    ({"nos": {"namespace": "default"}}, "nos refuses the default namespace"),
    ({"nos": {"releaseName": "Nos_1"}}, "mig.nos.releaseName"),
    ({"nos": {"reboot": "yes"}}, "mig.nos.reboot"),
    ({"dynamic": "kubevirt"}, "mig.dynamic"),
])
def test_bad_nos_block_is_exit_2_naming_the_field(mig, expect):
    with pytest.raises(ConfigError) as exc:
        site(mig)
    assert exc.value.exit_code == 2 and expect in exc.value.message, exc.value.message


def test_operator_runs_mixed_without_mig_manager():
    plan = plan_of(site(), NODES)
    assert plan.site.mig.strategy == "mixed" and plan.values["mig"]["strategy"] == "mixed"
    assert plan.values["migManager"]["enabled"] is False
    assert not [i for i in plan.images if i.component == "migManager"]  # not deployed: not mirrored either
    static = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"}}),
                     NODES)
    assert static.values["mig"]["strategy"] == "single" and "enabled" not in static.values["migManager"]
    with pytest.raises(ConfigError, match=r"components.migManager.enabled: true contradicts mig.dynamic: nos"):
        plan_of(site(components={"migManager": {"enabled": True}}), NODES)


def test_images_chart_and_role_variables():
    plan = plan_of(site(), NODES)
    by = {i.component: (i.source, i.destination) for i in plan.images if i.component.startswith("nos.")}
    assert by == {
        "nos.operator": ("ghcr.io/nebuly-ai/nos-operator:0.1.2", "registry.example.com:5000/nebuly-ai/nos-operator:0.1.2"),
        "nos.scheduler": ("ghcr.io/nebuly-ai/nos-scheduler:0.1.2", "registry.example.com:5000/nebuly-ai/nos-scheduler:0.1.2"),
        "nos.gpuPartitioner": ("ghcr.io/nebuly-ai/nos-gpu-partitioner:0.1.2",
                               "registry.example.com:5000/nebuly-ai/nos-gpu-partitioner:0.1.2"),
        "nos.migAgent": ("ghcr.io/nebuly-ai/nos-mig-agent:0.1.2", "registry.example.com:5000/nebuly-ai/nos-mig-agent:0.1.2"),
        "nos.gpuAgent": ("ghcr.io/nebuly-ai/nos-gpu-agent:0.1.2", "registry.example.com:5000/nebuly-ai/nos-gpu-agent:0.1.2"),
        "nos.kubeRbacProxy": ("gcr.io/kubebuilder/kube-rbac-proxy:v0.13.0",
                              "registry.example.com:5000/kubebuilder/kube-rbac-proxy:v0.13.0"),
    }
    arts = plan.artifacts()
    assert {a.component: [n.setting for n in a.needs] for a in arts.images}["nos.migAgent"] == ["mig.dynamic=nos"]
    nos = [c for c in arts.charts if c.name == "nos"]
    assert [(c.version, c.repository) for c in nos] == [("0.1.2", "oci://ghcr.io/nebuly-ai/helm-charts")]
    rv = plan.role_vars
    assert (rv["mig_mode_enabled"], rv["mig_mode_reset"], rv["mig_mode_reboot"]) == (True, True, False)
    assert plan_of(site({"nos": {"reboot": True, "reset": False}}), NODES).role_vars["mig_mode_reboot"] is True
    # the stage: only nodes taking part get the label
    assert features.sharing(plan.site) is nos_feature.FEATURE and nos_feature.FEATURE.stage_nodes(plan) == ["gpu1"]
    assert nos_feature.FEATURE.node_label(plan.site) == ("nos.nebuly.com/gpu-partitioning", "mig")
    assert nos_feature.FEATURE.workloads(plan.site) == ("nos-mig-agent", "nos-gpu-partitioner")
    off = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"}}), NODES)
    assert off.role_vars["mig_mode_enabled"] is False and features.sharing(off.site) is None
    assert not [c for c in off.artifacts().charts if c.name == "nos"]


def test_values_put_every_image_in_the_site_registry_and_telemetry_off():
    s = site()
    v = nos_feature.values(s)
    assert v["shareTelemetry"] is False
    dest = set(nos_feature.FEATURE.destinations(s).values())
    found = set()

    def walk(node):
        if isinstance(node, dict):
            if "repository" in node and "tag" in node:
                found.add(f"{node['repository']}:{node['tag']}")
            for x in node.values():
                walk(x)

    walk(v)
    assert found == dest


def test_missing_chart_is_exit_2():
    s = site({"nos": {}})
    with pytest.raises(ConfigError, match="mig.nos.chart is not set"):
        nos_feature.FEATURE.check_stage_inputs(s)
    s = site({"nos": {"chart": "/nowhere/nos-0.1.2.tgz"}})
    with pytest.raises(ConfigError, match=r"mig.nos.chart /nowhere/nos-0.1.2.tgz: no such file"):
        nos_feature.FEATURE.check_stage_inputs(s)


def test_conflicts_are_exit_3_listing_each_with_its_fix(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "gpu1": {"gpu_install_os": "ubuntu22.04", "gpu_install_mig_config": "all-1g.10gb"},
        "gpu2": {"gpu_install_os": "ubuntu22.04", "gpu_install_mig_dynamic": False}}}}}}))
    bad = site(driver={"mode": "operator"}, components={"devicePlugin": {"enabled": False}},
               sharing={"mode": "hami", "hami": {"kubernetesVersion": "v1.27.4", "chart": "x.tgz"}},
               cdi={"enabled": False})
    plan = plan_of(bad, inventory=inv)
    with pytest.raises(PreflightError) as exc:
        features.check(plan)
    msg = exc.value.message
    assert exc.value.exit_code == 3 and msg.startswith("mig.dynamic nos conflicts with the site:")
    for part in ("sharing.mode hami with mig.dynamic nos", "static MIG layout (gpu_install_mig_config) is set for gpu1",
                 "components.devicePlugin.enabled: false: nos relies", "driver.mode operator: gpu-install turns MIG"):
        assert part in msg, msg
    assert features.conflicts(plan_of(site(), NODES)) == []


def test_host_var_must_be_a_boolean(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {
        "gpu1": {"gpu_install_os": "ubuntu22.04", "gpu_install_mig_dynamic": "no"}}}}}}))
    with pytest.raises(ConfigError, match=r"host gpu1: gpu_install_mig_dynamic must be true or false, not 'no'"):
        plan_of(site(), inventory=inv)


def test_real_nos_chart_renders_only_site_images(tmp_path):
    """NVIDIA-independent: nos' own chart (tag 0.1.2) with our values renders only the plan's images, no telemetry Pod;
    runs where GPU_INSTALL_NOS_CHART names the chart (directory or .tgz), e.g. `git archive 0.1.2 helm-charts/nos`."""
    chart = os.environ.get("GPU_INSTALL_NOS_CHART") or str(UPSTREAM.parent / "charts" / "nos-0.1.2.tgz")
    need(Path(chart).exists(), f"nos' chart {chart} not found (../shared/upstream/charts, or GPU_INSTALL_NOS_CHART)")
    from installer.tools import find_helm

    helm = find_helm()
    need(helm, "helm not installed (scripts/bootstrap installs it)")
    s = site()
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(nos_feature.values(s)))
    out = subprocess.run([str(helm), "template", "nos", chart, "-n", "nebuly-nos", "-f", str(values),
                          "--api-versions", "cert-manager.io/v1"], capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    images = set()
    for d in docs:
        spec = (d.get("spec") or {}).get("template", {}).get("spec") or (d.get("spec") if d["kind"] == "Pod" else {})
        for c in (spec or {}).get("containers", []) + (spec or {}).get("initContainers", []):
            images.add(c["image"])
    assert images and images <= set(nos_feature.FEATURE.destinations(s).values()), images
    assert not [d for d in docs if d["kind"] == "Pod"], "the telemetry Pod is rendered"
    ds = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    assert ds["nos-mig-agent"]["spec"]["template"]["spec"]["nodeSelector"] == dict([nos_feature.LABEL])
    assert {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"} >= {"nos-gpu-partitioner"}


# ---------------------------------------------------------------- the mig_mode module and the STAND-IN nvidia-smi


@pytest.fixture(scope="module")
def smi():
    from gpu_install_lab.gpus import SMI, tools_dir

    try:
        return tools_dir(progress=lambda _m: None) / SMI
    except Exception as exc:  # noqa: BLE001
        need(False, f"lab tools not built: {exc}")


@pytest.fixture
def node(tmp_path, smi):
    """A fake node: 2 A100s, the STAND-IN nvidia-smi as `nvidia-smi` on PATH, its MIG state file."""
    devices = {"driverVersion": "535.54.03", "devices": [
        {"uuid": f"GPU-{i}", "index": i, "model": "NVIDIA A100-SXM4-80GB", "memoryMiB": 81920, "migCapable": True,
         "pciBusId": f"00000000:3{6 + i}:00.0"} for i in range(2)]}
    (tmp_path / "devices.json").write_text(json.dumps(devices))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(smi)
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_STANDIN_DEVICE_INFO": str(tmp_path / "devices.json"),
           "NVIDIA_STANDIN_MIG_STATE": str(tmp_path / "state" / "mig.json")}
    return tmp_path, env, bindir / "nvidia-smi"


def run_module(node, **args):
    tmp, env, smi = node
    params = {"ANSIBLE_MODULE_ARGS": {"nvidia_smi": str(smi), "record": str(tmp / "record.json"), **args}}
    proc = subprocess.run([sys.executable, "-c", "from ansible_collections.gpu_install.node.plugins.modules.mig_mode "
                           "import main; main()"], input=json.dumps(params), capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONPATH": str(_collections())})
    return json.loads(proc.stdout)


def _collections() -> Path:
    from installer import content

    return content.collections_path()


def state(node) -> dict:
    return json.loads((node[0] / "state" / "mig.json").read_text())


def set_busy(node, busy):
    st = state(node)
    st["busy"] = busy
    (node[0] / "state" / "mig.json").write_text(json.dumps(st))


def test_module_turns_mig_mode_on_records_it_and_is_idempotent(node):
    r = run_module(node, state="enabled", _ansible_check_mode=True)
    assert r["changed"] and r["switched"] == ["00000000:36:00.0", "00000000:37:00.0"], r
    assert not (node[0] / "record.json").exists()
    r = run_module(node, state="enabled")
    assert r["changed"] and not r["pending"], r
    assert {g["index"]: g["current"] for g in r["gpus"]} == {0: "Enabled", 1: "Enabled"}
    assert json.loads((node[0] / "record.json").read_text())["switched"] == ["00000000:36:00.0", "00000000:37:00.0"]
    again = run_module(node, state="enabled")
    assert not again["changed"] and not again["switched"], again
    off = run_module(node, state="disabled")
    assert off["changed"] and {g["current"] for g in off["gpus"]} == {"Disabled"} and not off["pending"], off
    assert not (node[0] / "record.json").exists()
    assert not run_module(node, state="disabled")["changed"]


def test_busy_gpu_stays_pending_with_the_drivers_words_and_reset_clears_it_once_free(node):
    st_path = node[0] / "state" / "mig.json"  # the STAND-IN writes its state on the first mode change
    subprocess.run([str(node[2]), "-i", "0", "-mig", "0"], env={**os.environ, **node[1]}, check=True, capture_output=True)
    assert st_path.exists()
    set_busy(node, [1])
    r = run_module(node, state="enabled")
    assert [p["index"] for p in r["pending"]] == [1], r
    reason = r["pending"][0]["reason"]
    assert "pending enable state" in reason and "GPU reset refused: Unable to reset GPU 00000000:37:00.0" in reason
    assert {g["index"]: (g["current"], g["pending"]) for g in r["gpus"]} == {0: ("Enabled", "Enabled"),
                                                                          1: ("Disabled", "Enabled")}
    # without reset: no reset tried
    set_busy(node, [])
    r = run_module(node, state="enabled", reset=False)
    assert r["changed"] and r["pending"] == [], r  # nvidia-smi -mig 1 again: applied at once on a free GPU
    assert {g["current"] for g in r["gpus"]} == {"Enabled"}, r


def test_reboot_applies_a_pending_mode(node):
    set_state = {"bootId": "an-earlier-boot", "gpus": {"0": {"current": "Disabled", "pending": "Enabled"},
                                                       "1": {"current": "Enabled", "pending": "Enabled"}}}
    path = node[0] / "state" / "mig.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(set_state))
    r = run_module(node, state="enabled", _ansible_check_mode=True)
    assert not r["changed"] and {g["current"] for g in r["gpus"]} == {"Enabled"}, r  # booted since: applied


def test_a_gpu_refusing_after_another_switched_fails_changed_with_the_record_and_uninstall_reverses_it(node):
    tmp, _env, smi = node
    real = smi.resolve()
    smi.unlink()
    # fault injection over the real STAND-IN: GPU 1's `-mig 1` is refused the way the driver refuses a switch it may
    # not make (nvidia-smi's words, exit 4); every other call, GPU 0's switch included, is the STAND-IN's protocol
    smi.write_text('#!/bin/sh\nif [ "$*" = "-i 1 -mig 1" ]; then\n'
                   '  echo "Unable to enable MIG Mode for GPU 00000000:37:00.0: Insufficient Permissions"\n'
                   '  echo "Terminating early due to previous errors."\n  exit 4\nfi\n'
                   f'exec {real} "$@"\n')
    smi.chmod(0o755)
    r = run_module(node, state="enabled")
    assert r.get("failed") and r["changed"] is True, r
    assert ("GPU 1 (00000000:37:00.0): nvidia-smi -mig 1 failed (exit 4): Unable to enable MIG Mode for GPU "
            "00000000:37:00.0: Insufficient Permissions; switched before it: 00000000:36:00.0") in r["msg"], r
    assert r["switched"] == ["00000000:36:00.0"], r
    assert json.loads((tmp / "record.json").read_text())["switched"] == ["00000000:36:00.0"]
    assert stat.S_IMODE((tmp / "record.json").stat().st_mode) == 0o600
    assert {k: g["current"] for k, g in state(node)["gpus"].items()} == {"0": "Enabled", "1": "Disabled"}
    # uninstall (roles/mig_mode remove.yml: the record exists, state disabled): GPU 0 back off, GPU 1 left alone
    off = run_module(node, state="disabled")
    assert off["changed"] and off["switched"] == ["00000000:36:00.0"] and not off["pending"], off
    assert {k: g["current"] for k, g in state(node)["gpus"].items()} == {"0": "Disabled", "1": "Disabled"}
    assert not (tmp / "record.json").exists()
    assert not run_module(node, state="disabled")["changed"]


def test_first_gpu_refusing_is_a_failure_without_change_or_record(node):
    tmp, _env, smi = node
    real = smi.resolve()
    smi.unlink()
    smi.write_text('#!/bin/sh\ncase "$*" in "-i "?" -mig 1") echo "Unable to enable MIG Mode: Insufficient Permissions";'
                   f' exit 4;; esac\nexec {real} "$@"\n')
    smi.chmod(0o755)
    r = run_module(node, state="enabled")
    assert r.get("failed") and r["changed"] is False and r["switched"] == [], r
    assert "switched before it" not in r["msg"] and not (tmp / "record.json").exists()


def test_module_refuses_mixed_models_and_non_mig_gpus(node):
    tmp = node[0]
    doc = json.loads((tmp / "devices.json").read_text())
    doc["devices"][1].update(model="Tesla T4", migCapable=False, memoryMiB=15360)
    (tmp / "devices.json").write_text(json.dumps(doc))
    r = run_module(node, state="enabled")
    assert r.get("failed") and "not MIG-capable: GPU 1 00000000:37:00.0 (Tesla T4)" in r["msg"], r
    doc["devices"][1].update(model="NVIDIA A30", migCapable=True, memoryMiB=24576)
    (tmp / "devices.json").write_text(json.dumps(doc))
    r = run_module(node, state="enabled")
    assert r.get("failed") and "GPUs of 2 models on one node" in r["msg"], r
    assert not (tmp / "record.json").exists()


def test_role_spec_lists_every_variable_role_vars_sets():
    spec = yaml.safe_load((ROOT / "roles/mig_mode/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    rv = plan_of(site(), NODES).role_vars
    assert {k for k in rv if k.startswith("mig_mode_")} <= set(options)
