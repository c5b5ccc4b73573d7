"""sharing.mode gpumanager without a cluster: the site block, the plan (images, extender, role variables,
conflicts), charts/gpu-manager through the real helm binary, the node preflight's cgroup check, validate's pod."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from installer import features
from installer.config import parse_site
from installer.errors import ConfigError, PreflightError
from installer.facts import Node
from installer.features import gpumanager, hami
from tests.conftest import ROOT, UPSTREAM, need, plan_of

GOOD = {"toolkit": {"mode": "host"}, "components": {"devicePlugin": {"enabled": False}}}
NODES = [Node("gpu1", "ubuntu", "22.04", None, "gpu1")]


def site(**extra):
    doc = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"},
           "sharing": {"mode": "gpumanager"}, **GOOD}
    for k, v in extra.items():
        doc[k] = v
    return parse_site(doc)


def gm(**fields):
    return site(sharing={"mode": "gpumanager", "gpumanager": fields})


@pytest.mark.parametrize("fields,expect", [
    ({"smoke": {"core": 150}}, "tencent.com/vcuda-core 150 is not possible"),
    ({"smoke": {"core": 250, "memory": 8}}, "(use 200 or 300, or a share below 100)"),
    ({"smoke": {"core": 50, "memory": 0}}, "needs tencent.com/vcuda-memory >= 1"),
    ({"smoke": {"core": 0}}, "sharing.gpumanager.smoke"),
    ({"runtimeEndpoint": "unix:///run/containerd/containerd.sock"}, "drop the unix:// prefix"),
    ({"runtimeEndpoint": "run/x.sock"}, "not an absolute socket path"),
    ({"gpuModelLabel": "Bad Label"}, "sharing.gpumanager.gpuModelLabel"),
    ({"namespace": "Kube_System"}, "sharing.gpumanager.namespace"),
    ({"extenderUrl": "gpu-quota-admission:3456"}, "not an http(s) URL"),
    ({"cgroupDriver": "cgroupv2"}, "sharing.gpumanager.cgroupDriver"),
])
def test_bad_gpumanager_block_is_exit_2_naming_the_field(fields, expect):
    with pytest.raises(ConfigError) as exc:
        gm(**fields)
    assert exc.value.exit_code == 2 and expect in str(exc.value.message), exc.value.message


def test_whole_gpus_and_shares_are_accepted():
    for core, mem in ((1, 1), (50, 4), (99, 1), (100, 0), (200, 0), (800, 64)):
        assert gm(smoke={"core": core, "memory": mem}).sharing.gpumanager.smoke.core == core


def test_images_join_the_plan_and_the_mirror_plan():
    plan = plan_of(site(registry={"host": "registry.example.com:5000", "layout": "keep-host", "prefix": "gpu"}),
                   NODES)
    by = {i.component: (i.source, i.destination) for i in plan.images}
    assert by["gpuManager"] == ("docker.io/tkestack/gpu-manager:v1.1.5",
                                "registry.example.com:5000/gpu/docker.io/tkestack/gpu-manager:v1.1.5")
    assert by["gpuQuotaAdmission"][0] == "docker.io/tkestack/gpu-quota-admission:v1.0.0"
    arts = {a.component: a for a in plan.artifacts().images}
    assert [n.setting for n in arts["gpuManager"].needs] == ["sharing.mode=gpumanager"]
    # site overrides per field; off: no image of it
    over = plan_of(site(sharing={"mode": "gpumanager", "gpumanager": {"manager": {"version": "v1.1.4"},
                                                                      "admission": {"repository": "quay.io/acme"}}}),
                   NODES)
    srcs = {i.component: i.source for i in over.images}
    assert srcs["gpuManager"] == "docker.io/tkestack/gpu-manager:v1.1.4"
    assert srcs["gpuQuotaAdmission"] == "quay.io/acme/gpu-quota-admission:v1.0.0"
    off = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"}}), NODES)
    assert not [i for i in off.images if i.component.startswith("gpu") and "tkestack" in i.source]


def test_extender_is_appended_last_and_runc_stays_default():
    own = {"urlPrefix": "http://127.0.0.1:9999/other", "filterVerb": "filter"}
    plan = plan_of(site(scheduler={"extenders": [own]}), NODES)
    ext = plan.role_vars["scheduler_policy_extenders"]
    assert ext[0]["urlPrefix"] == own["urlPrefix"]
    assert ext[1] == {"urlPrefix": "http://gpu-quota-admission.kube-system.svc:3456/scheduler",
                      "filterVerb": "predicates",
                      "managedResources": [{"name": "tencent.com/vcuda-core"}, {"name": "tencent.com/vcuda-memory"}]}
    rv = plan.role_vars
    assert rv["containerd_runtime_set_default"] is False and rv["preflight_sharing_mode"] == "gpumanager"
    docker = plan_of(site(runtime="docker"), NODES).role_vars
    assert docker["docker_runtime_default_runtime"] == ""
    plain = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
                                "toolkit": {"mode": "host"}}), NODES).role_vars
    assert plain["containerd_runtime_set_default"] is True and plain["scheduler_policy_extenders"] == []


def test_a_site_extender_at_the_same_url_is_refused():
    dup = {"urlPrefix": "http://gpu-quota-admission.kube-system.svc:3456/scheduler/", "filterVerb": "predicates"}
    with pytest.raises(ConfigError) as exc:
        plan_of(site(scheduler={"extenders": [dup]}), NODES)
    assert "scheduler.extenders.0" in exc.value.message and "already wires" in exc.value.message


def test_conflicts_are_listed_together_with_their_fixes():
    doc = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
                      "sharing": {"mode": "gpumanager"}, "devicePlugin": {"mps": {"replicas": 4}},
                      "mig": {"config": "all-1g.10gb"}})
    plan = plan_of(doc, NODES)
    found = features.conflicts(plan)
    assert len(found) == 4, found
    assert "components.devicePlugin.enabled: false" in found[0]
    assert "toolkit.mode: host" in found[1]
    assert "devicePlugin.mps.replicas 4" in found[2]
    assert "MIG layout" in found[3]
    with pytest.raises(PreflightError) as exc:
        features.check(plan)
    assert exc.value.exit_code == 3 and "nothing was changed" in (exc.value.hint or "")
    assert features.conflicts(plan_of(site(), NODES)) == []


def test_runtime_endpoint_and_its_mount():
    assert gpumanager.chart_values(site())["manager"]["runtimeEndpoint"] == "/var/run/containerd/containerd.sock"
    assert gpumanager.chart_values(site(runtime="docker"))["manager"]["runtimeEndpoint"] == "/var/run/dockershim.sock"
    v = gpumanager.chart_values(gm(runtimeEndpoint="/opt/cri/cri.sock"))["manager"]
    assert v["runtimeDir"] == "/opt/cri"
    assert gpumanager.runtime_dir("/run/containerd/containerd.sock") == ""  # under /run (= /var/run): mounted already


@pytest.mark.helm
def test_chart_renders_what_the_site_says():
    from installer import helm
    from installer.tools import find_helm

    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")
    s = site(registry={"host": "registry.example.com:5000",
                       "pullSecret": {"name": "regcred", "usernameEnv": "U", "passwordEnv": "P"}},
             sharing={"mode": "gpumanager", "gpumanager": {"cgroupDriver": "systemd", "runtimeEndpoint": "/opt/cri/c.sock",
                                                           "quotaConfigMapName": "quota", "logLevel": 2}})
    res = helm.template(gpumanager.chart_dir(), gpumanager.chart_values(s), release_name="gpu-manager",
                        namespace="kube-system")
    kinds = sorted(f"{r['kind']}/{r['metadata']['name']}" for r in res)
    assert kinds == ["ClusterRole/gpu-install:gpu-manager", "ClusterRole/gpu-install:gpu-quota-admission",
                     "ClusterRoleBinding/gpu-install:gpu-manager", "ClusterRoleBinding/gpu-install:gpu-quota-admission",
                     "ConfigMap/gpu-quota-admission", "DaemonSet/gpu-manager", "Deployment/gpu-quota-admission",
                     "Service/gpu-manager-metric", "Service/gpu-quota-admission", "ServiceAccount/gpu-manager",
                     "ServiceAccount/gpu-quota-admission"]
    by = {(r["kind"], r["metadata"]["name"]): r for r in res}
    ds = by[("DaemonSet", "gpu-manager")]["spec"]["template"]["spec"]
    assert ds["hostPID"] is True and ds["nodeSelector"] == {"nvidia-device-enable": "enable"}
    assert ds["imagePullSecrets"] == [{"name": "regcred"}]
    (c,) = ds["containers"]
    assert c["image"] == "registry.example.com:5000/tkestack/gpu-manager:v1.1.5" and c["securityContext"]["privileged"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["EXTRA_FLAGS"] == ("--logtostderr=true --container-runtime-endpoint=/opt/cri/c.sock "
                                  "--cgroup-driver=systemd") and env["LOG_LEVEL"] == "2"
    vols = {v["name"]: v["hostPath"]["path"] for v in ds["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert {mounts[n]: vols[n] for n in mounts} == {
        "/var/lib/kubelet/device-plugins": "/var/lib/kubelet/device-plugins",
        "/etc/gpu-manager/vdriver": "/etc/gpu-manager/vdriver", "/etc/gpu-manager/vm": "/etc/gpu-manager/vm",
        "/etc/gpu-manager/checkpoint": "/etc/gpu-manager/checkpoint", "/var/log/gpu-manager": "/var/log/gpu-manager",
        "/var/run": "/var/run", "/sys/fs/cgroup": "/sys/fs/cgroup", "/usr/local/host": "/usr", "/opt/cri": "/opt/cri"}
    dep = by[("Deployment", "gpu-quota-admission")]["spec"]["template"]["spec"]
    assert dep["containers"][0]["image"] == "registry.example.com:5000/tkestack/gpu-quota-admission:v1.0.0"
    import json

    cfg = json.loads(by[("ConfigMap", "gpu-quota-admission")]["data"]["gpu-quota-admission.config"])
    assert cfg["QuotaConfigMapName"] == "quota" and cfg["GPUPoolLabel"] == "gaia.tencent.com/gpu-pool"
    assert [p["port"] for p in by[("Service", "gpu-quota-admission")]["spec"]["ports"]] == [3456]
    # least privilege: no wildcard anywhere
    for name in ("gpu-install:gpu-manager", "gpu-install:gpu-quota-admission"):
        for rule in by[("ClusterRole", name)]["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule


def test_node_preflight_needs_the_cgroup_v1_memory_controller(tmp_path):
    sys.path.insert(0, str(ROOT / "plugins" / "modules"))
    try:
        import preflight as probe
    finally:
        sys.path.pop(0)
    facts = {"os_id": "ubuntu", "os_version": "22.04", "arch": "x86_64", "disk_free_gb": 50, "disk_path": "/var/lib",
             "kernel_headers": "installed", "secure_boot": False, "nouveau_loaded": False, "nvidia_loaded": False,
             "gpus": ["x"], "runtimes": {"containerd": "/usr/bin/containerd"}, "kernel": "6"}
    args = ("containerd", "operator", {"ubuntu": ["22.04"]}, ["x86_64"], 10, True)
    v2 = probe.problems({**facts, "cgroup_v1_memory": False}, *args, sharing="gpumanager")
    assert len(v2) == 1 and "systemd.unified_cgroup_hierarchy=0" in v2[0], v2
    assert probe.problems({**facts, "cgroup_v1_memory": True}, *args, sharing="gpumanager") == []
    assert probe.problems({**facts, "cgroup_v1_memory": False}, *args) == []  # only with gpumanager
    (tmp_path / "sys/fs/cgroup/memory").mkdir(parents=True)
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/os-release").write_text("ID=ubuntu\nVERSION_ID=22.04\n")
    assert probe.probe(str(tmp_path), lambda c: (0, "", ""))["cgroup_v1_memory"] is True


def test_smoke_pod_asks_the_vcuda_share_without_runtime_class():
    from installer.validate import smoke

    t = smoke.Target("gpu1", "tencent.com/vcuda-core 50",
                     limits={"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"}, pod="p")
    body = smoke.pod_body(t, "gpu-operator", "run", "reg/cuda:12", "reg/validator:v1", None, None)
    for c in body["spec"]["initContainers"] + body["spec"]["containers"]:
        assert c["resources"]["limits"] == {"tencent.com/vcuda-core": "50", "tencent.com/vcuda-memory": "4"}
    assert "runtimeClassName" not in body["spec"]


def test_validate_refuses_an_impossible_smoke_request_with_exit_2(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("operator: {version: v24.9.2}\nregistry: {host: r.example.com:5000}\nsharing: {mode: gpumanager}\n")
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu1: {gpu_install_os: ubuntu22.04}\n")
    proc = subprocess.run([sys.executable, "-m", "installer.cli", "validate", "-s", str(path), "-i", str(inv),
                           "--set", "sharing.gpumanager.smoke.core=150", "--only", "smoke"],
                          capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"}, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "sharing.gpumanager.smoke: tencent.com/vcuda-core 150 is not possible" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- sharing.mode hami

HAMI_OK = {"components": {"devicePlugin": {"enabled": False}}}


def hami_site(registry=None, **hami):
    doc = {"operator": {"version": "v24.9.2"}, "registry": registry or {"host": "registry.example.com:5000"},
           "sharing": {"mode": "hami", "hami": {"kubernetesVersion": "v1.27.4", **hami}}, **HAMI_OK}
    return parse_site(doc)


@pytest.mark.parametrize("hami,expect", [
    (None, "mode hami needs sharing.hami with at least kubernetesVersion"),
    ({"kubernetesVersion": "1.27"}, "give the cluster's exact version, e.g. v1.27.4"),
    ({"kubernetesVersion": "v1.27.4", "version": "2.6.1"}, "HAMi charts 2.7.0 and later"),
    ({"kubernetesVersion": "v1.27.4", "deviceSplitCount": 0}, "sharing.hami.deviceSplitCount"),
    ({"kubernetesVersion": "v1.27.4", "deviceMemoryScaling": 0}, "sharing.hami.deviceMemoryScaling"),
    ({"kubernetesVersion": "v1.27.4", "smoke": {"cores": 150}}, "sharing.hami.smoke.cores"),
])
def test_bad_hami_block_is_exit_2(hami, expect):
    doc = {"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
           "sharing": {"mode": "hami", **({"hami": hami} if hami is not None else {})}}
    with pytest.raises(ConfigError) as exc:
        parse_site(doc)
    assert exc.value.exit_code == 2 and expect in exc.value.message, exc.value.message


@pytest.mark.parametrize("kube,certgen", [("v1.27.4", "docker.io/liangjw/kube-webhook-certgen:v1.1.1"),
                                          ("v1.20.2", "docker.io/jettech/kube-webhook-certgen:v1.5.2")])
def test_hami_images_and_chart_join_the_plan(kube, certgen):
    plan = plan_of(hami_site(kubernetesVersion=kube), NODES)
    srcs = {i.component: i.source for i in plan.images if i.component.startswith("hami")}
    assert srcs == {"hami": "docker.io/projecthami/hami:v2.10.0",
                    "hami.kubeScheduler": f"registry.k8s.io/kube-scheduler:{kube}", "hami.certgen": certgen}
    charts = {c.name: c for c in plan.artifacts().charts}
    assert charts["hami"].version == "2.10.0" and charts["hami"].repository == "https://project-hami.github.io/HAMi"
    assert [n.setting for n in charts["hami"].needs] == ["sharing.mode=hami"]
    # a chart version of the site's: the hami image follows it
    other = plan_of(hami_site(kubernetesVersion=kube, version="2.9.0"), NODES)
    assert "docker.io/projecthami/hami:v2.9.0" in {i.source for i in other.images}
    assert {c.name: c.version for c in other.artifacts().charts}["hami"] == "2.9.0"


@pytest.mark.parametrize("layout,prefix", [("strip-host", ""), ("keep-host", "mirror/gpu")])
def test_hami_values_point_every_image_at_the_site_registry(layout, prefix):
    s = hami_site({"host": "registry.example.com:5000", "layout": layout, "prefix": prefix,
                   "pullSecret": {"name": "regcred", "usernameEnv": "U", "passwordEnv": "P"}},
                  deviceSplitCount=4, deviceMemoryScaling=1.5)
    v = hami.values(s)
    base = "registry.example.com:5000" + (f"/{prefix}" if prefix else "")
    assert v["global"] == {"imageRegistry": base, "imagePullSecrets": ["regcred"], "imageTag": "v2.10.0"}
    refs = set()
    for img in (v["scheduler"]["kubeScheduler"]["image"], v["scheduler"]["extender"]["image"],
                v["scheduler"]["patch"]["image"], v["scheduler"]["patch"]["imageNew"], v["devicePlugin"]["image"],
                v["devicePlugin"]["monitor"]["image"]):
        assert img["registry"] == base
        refs.add(f"{img['registry']}/{img['repository']}:{img['tag']}")
    assert refs == {i.destination for i in features.images(s)}
    dp = v["devicePlugin"]
    assert (dp["deviceSplitCount"], dp["deviceMemoryScaling"], dp["nvidiaNodeSelector"]) == (4, 1.5, {"gpu": "on"})


def test_hami_conflicts_and_runtime():
    doc = {"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"}, "cdi": {"enabled": True},
           "devicePlugin": {"timeSlicing": {"replicas": 2}},
           "sharing": {"mode": "hami", "hami": {"kubernetesVersion": "v1.27.4"}}}
    found = features.conflicts(plan_of(parse_site(doc), NODES))
    assert len(found) == 3, found
    assert "HAMi's device plugin advertises them itself" in found[0]
    assert "cdi.enabled: true" in found[1] and "HAMi needs it to be" in found[1]
    assert "devicePlugin.timeSlicing.replicas 2" in found[2] and "with HAMi" in found[2]
    plan = plan_of(hami_site(), NODES)
    assert features.conflicts(plan) == []
    assert plan.role_vars["scheduler_policy_extenders"] == []  # HAMi brings its own scheduler
    host = plan_of(parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.example.com:5000"},
                               "toolkit": {"mode": "host"}, "sharing": {"mode": "hami",
                                                                        "hami": {"kubernetesVersion": "v1.27.4"}},
                               **HAMI_OK}), NODES)
    assert host.role_vars["containerd_runtime_set_default"] is True  # nvidia the default runtime on HAMi nodes


def test_hami_chart_must_be_given_for_the_stage(tmp_path):
    with pytest.raises(ConfigError) as exc:
        hami.FEATURE.check_stage_inputs(hami_site())
    assert "sharing.hami.chart is not set" in exc.value.message
    with pytest.raises(ConfigError) as exc:
        hami.FEATURE.check_stage_inputs(hami_site(chart=str(tmp_path / "hami-2.10.0.tgz")))
    assert "no such file or directory" in exc.value.message
    hami.FEATURE.check_stage_inputs(hami_site(chart="oci://registry.example.com:5000/charts/hami:2.10.0"))
    assert hami.FEATURE.workloads(hami_site()) == ("hami-device-plugin", "hami-scheduler")
    assert hami.FEATURE.workloads(hami_site(releaseName="vgpu")) == ("vgpu-hami-device-plugin", "vgpu-hami-scheduler")


@pytest.mark.helm
def test_real_hami_chart_renders_only_site_images():
    """With HAMi's real chart (GPU_INSTALL_HAMI_CHART: its charts/hami directory or .tgz; not in this repository nor
    in ../shared/upstream): every container image is one of the plan's, the pull Secret is on every workload, the
    device config carries the site's split and scaling, the device plugin selects gpu=on -- for both of the chart's
    scheduler branches (Policy below Kubernetes 1.22, KubeSchedulerConfiguration from 1.22)."""
    import yaml

    from installer.tools import find_helm

    chart = os.environ.get("GPU_INSTALL_HAMI_CHART") or str(UPSTREAM.parent / "charts" / "hami-2.10.0.tgz")
    need(Path(chart).exists(), f"HAMi's chart {chart} not found (../shared/upstream/charts or GPU_INSTALL_HAMI_CHART)")
    helm = find_helm()
    need(helm, "helm not installed (scripts/bootstrap installs it)")
    for kube in ("v1.20.2", "v1.27.4"):
        s = hami_site({"host": "registry.example.com:5000", "layout": "keep-host",
                       "pullSecret": {"name": "regcred", "usernameEnv": "U", "passwordEnv": "P"}},
                      kubernetesVersion=kube, deviceSplitCount=4)
        values = ROOT / "build" / f"hami-values-{kube}.yaml"
        values.parent.mkdir(exist_ok=True)
        values.write_text(yaml.safe_dump(hami.values(s)))
        out = subprocess.run([str(helm), "template", "hami", str(chart), "-n", "kube-system", "-f", str(values),
                              "--kube-version", kube.lstrip("v")], capture_output=True, text=True, check=True).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        images, workloads = set(), 0
        for d in docs:
            pod = (d.get("spec") or {}).get("template", {}).get("spec")
            if pod:
                workloads += 1
                images |= {c["image"] for c in pod.get("containers", []) + pod.get("initContainers", [])}
                assert {"name": "regcred"} in pod.get("imagePullSecrets", []), d["metadata"]["name"]
                if d["kind"] == "DaemonSet":
                    assert pod["nodeSelector"] == {"gpu": "on"}
        assert workloads >= 4 and images == {i.destination for i in features.images(s)}, images
        (dev,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hami-scheduler-device"]
        assert "deviceSplitCount: 4" in dev["data"]["device-config.yaml"]
        sched = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "hami-scheduler")
        assert list(sched["data"]) == (["config.json"] if kube == "v1.20.2" else ["config.yaml"])


def test_every_sharing_mode_passes_the_roles_argument_specs():
    """The preflight role's argument spec and module accept every sharing.mode the site model has (hami was once
    refused there: found on real lab nodes)."""
    import typing

    import yaml

    from installer.config import Sharing

    modes = typing.get_args(Sharing.model_fields["mode"].annotation)
    spec = yaml.safe_load((ROOT / "roles" / "preflight" / "meta" / "argument_specs.yml").read_text())
    assert set(modes) == set(spec["argument_specs"]["main"]["options"]["preflight_sharing_mode"]["choices"])
    module = (ROOT / "plugins" / "modules" / "preflight.py").read_text()
    assert f'sharing=dict(type="str", choices={list(modes)!r}'.replace("'", '"') in module
