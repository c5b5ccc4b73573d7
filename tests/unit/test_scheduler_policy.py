"""scheduler_policy: rendering per version/format, site validation, manifest patch/unpatch, the role in check mode,
and the lab kubelet stand-in's manifest -> argv/mount plan. (Against the real kube-scheduler 1.20:
tests/integration/test_scheduler_policy.py.)"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

from gpu_install_lab import kube, staticpods
from installer import content
from installer.config import parse_site
from installer.errors import ConfigError
from tests.conftest import plan_of
from tests.unit.library_modules import load_module as _module

pol = _module("scheduler_policy")
man = _module("scheduler_manifest")
wait = _module("scheduler_wait")

MANIFEST = yaml.safe_load(kube.scheduler_manifest(10259, Path("/etc/kubernetes/scheduler.conf")))
EXT = {"urlPrefix": "https://ext.kube-system.svc:3456/sched", "filterVerb": "filter", "prioritizeVerb": "prio",
       "weight": 2, "bindVerb": "bind", "enableHTTPS": True, "httpTimeout": "1m30s", "nodeCacheCapable": True,
       "ignorable": True, "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]}


# ---------------------------------------------------------------- versions, formats, rendering
@pytest.mark.parametrize("version,fmt,want_fmt,api", [
    ("v1.20.2", "auto", "policy", "v1"),
    ("v1.22.17", "auto", "policy", "v1"),
    ("v1.20.2", "config", "config", "kubescheduler.config.k8s.io/v1beta1"),
    ("1.21", "config", "config", "kubescheduler.config.k8s.io/v1beta1"),
    ("v1.22.0", "config", "config", "kubescheduler.config.k8s.io/v1beta2"),
    ("v1.23.4", "auto", "config", "kubescheduler.config.k8s.io/v1beta3"),
    ("v1.24.0", "auto", "config", "kubescheduler.config.k8s.io/v1beta3"),
    ("v1.25.0", "auto", "config", "kubescheduler.config.k8s.io/v1"),
    ("v1.31.1", "config", "config", "kubescheduler.config.k8s.io/v1"),
    ("v1.18.6", "policy", "policy", "v1"),
])
def test_format_and_api_version_per_minor(version, fmt, want_fmt, api):
    p = pol.plan(MANIFEST, [EXT], fmt, version)
    assert (p["format"], p["api_version"], p["kubernetes_version"]) == (want_fmt, api, version)
    if want_fmt == "policy":
        assert p["flags"] == ["--policy-config-file=/etc/kubernetes/gpu-install-scheduler-policy.json",
                              "--use-legacy-policy-config=true"]
        assert json.loads(p["content"])["kind"] == "Policy"
    else:
        assert p["flags"] == ["--config=/etc/kubernetes/gpu-install-scheduler-config.yaml"]
        assert yaml.safe_load(p["content"])["apiVersion"] == api


@pytest.mark.parametrize("version,fmt,match", [("v1.23.0", "policy", "removed in 1.23"),
                                               ("v1.18.0", "config", "1.19"), ("latest", "auto", "not a Kubernetes")])
def test_impossible_format_version_pairs_fail_clearly(version, fmt, match):
    with pytest.raises(pol.PolicyError, match=match):
        pol.plan(MANIFEST, [EXT], fmt, version)


def test_version_from_the_image_tag_else_a_clear_failure():
    assert pol.plan(MANIFEST, [EXT])["kubernetes_version"] == "v1.20.2"
    untagged = copy.deepcopy(MANIFEST)
    untagged["spec"]["containers"][0]["image"] = "registry.k8s.io/kube-scheduler@sha256:abc"
    with pytest.raises(pol.PolicyError, match="kubernetesVersion"):
        pol.plan(untagged, [EXT])
    assert pol.plan(untagged, [EXT], kubernetes_version="v1.25.3")["format"] == "config"


def test_field_spellings_differ_between_policy_and_config():
    """Checked against the 1.20 binary: KubeSchedulerConfiguration is decoded strictly (enableHttps there is
    'found unknown field'), the legacy Policy's JSON tag is enableHttps and its httpTimeout is nanoseconds."""
    legacy = json.loads(pol.render([EXT], "policy", "v1", []))["extenders"][0]
    assert legacy["enableHttps"] is True and "enableHTTPS" not in legacy
    assert legacy["httpTimeout"] == 90 * 10 ** 9
    cfg = yaml.safe_load(pol.render([EXT], "config", "kubescheduler.config.k8s.io/v1beta1", []))["extenders"][0]
    assert cfg["enableHTTPS"] is True and "enableHttps" not in cfg
    assert cfg["httpTimeout"] == "90s"
    for doc in (legacy, cfg):
        assert doc["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]
        assert (doc["weight"], doc["bindVerb"], doc["nodeCacheCapable"], doc["ignorable"]) == (2, "bind", True, True)
    assert pol.duration_ns("500ms") == 5 * 10 ** 8


def test_config_carries_what_1_20_ignores_as_flags_once_config_is_given():
    cmd = MANIFEST["spec"]["containers"][0]["command"]
    cfg = yaml.safe_load(pol.render([EXT], "config", "kubescheduler.config.k8s.io/v1beta1", cmd, "127.0.0.1:4242"))
    assert cfg["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert cfg["leaderElection"] == {"leaderElect": False}
    # --port=0 cannot be expressed in v1beta1 (port 0 is invalid, empty means 0.0.0.0:10251): loopback instead
    assert cfg["healthzBindAddress"] == cfg["metricsBindAddress"] == "127.0.0.1:4242"
    v1 = yaml.safe_load(pol.render([EXT], "config", "kubescheduler.config.k8s.io/v1", cmd))
    assert "healthzBindAddress" not in v1 and v1["leaderElection"] == {"leaderElect": False}
    kubeadm = ["kube-scheduler", "--kubeconfig=/etc/kubernetes/scheduler.conf", "--leader-elect=true"]
    assert yaml.safe_load(pol.render([], "config", "kubescheduler.config.k8s.io/v1beta3", kubeadm))["leaderElection"] == {"leaderElect": True}


def test_a_foreign_config_flag_is_refused():
    doc = copy.deepcopy(MANIFEST)
    doc["spec"]["containers"][0]["command"].append("--config=/etc/kubernetes/their-own.yaml")
    with pytest.raises(pol.PolicyError, match="their-own.yaml"):
        pol.plan(doc, [EXT])
    with pytest.raises(man.ManifestError, match="their-own.yaml"):
        man.patch(doc, ["--config=/x"], "/h", "/x", "sha")
    # our own flags from an earlier apply (other format) are not foreign
    patched = man.patch(MANIFEST, ["--policy-config-file=/etc/kubernetes/gpu-install-scheduler-policy.json",
                                   "--use-legacy-policy-config=true"], "/h/p.json", "/etc/kubernetes/p.json", "s")
    assert pol.plan(patched, [EXT], "config")["format"] == "config"


# ---------------------------------------------------------------- manifest patch / unpatch
FLAGS = ["--policy-config-file=/etc/kubernetes/gpu-install-scheduler-policy.json", "--use-legacy-policy-config=true"]


@pytest.mark.parametrize("variant", ["lab", "dns-set", "args", "annotated"])
def test_patch_unpatch_round_trip_and_idempotence(variant):
    original = copy.deepcopy(MANIFEST)
    if variant == "dns-set":
        original["spec"]["dnsPolicy"] = "Default"
    elif variant == "args":
        c = original["spec"]["containers"][0]
        c["command"], c["args"] = ["kube-scheduler"], c["command"][1:]
    elif variant == "annotated":
        original["metadata"]["annotations"] = {"kubeadm.kubernetes.io/etcd": "x"}
    frozen = copy.deepcopy(original)
    patched = man.patch(original, FLAGS, "/lab/etc/p.json", "/etc/kubernetes/p.json", "abc")
    assert original == frozen  # pure
    c = patched["spec"]["containers"][0]
    assert man.command_of(patched)[-2:] == FLAGS
    assert {"name": "gpu-install-scheduler-policy", "mountPath": "/etc/kubernetes/p.json", "readOnly": True} in c["volumeMounts"]
    assert {"name": "gpu-install-scheduler-policy", "hostPath": {"path": "/lab/etc/p.json", "type": "File"}} \
        in patched["spec"]["volumes"]
    assert patched["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert patched["metadata"]["annotations"]["gpu-install.io/scheduler-policy-sha256"] == "abc"
    assert man.patch(patched, FLAGS, "/lab/etc/p.json", "/etc/kubernetes/p.json", "abc") == patched  # idempotent
    assert man.unpatch(patched) == original
    assert yaml.safe_load(man.dump(man.unpatch(patched))) == original
    assert list(man.unpatch(patched)["spec"]) == list(original["spec"])  # key order kept
    # a new policy replaces the old marks instead of stacking them
    other = man.patch(patched, ["--config=/etc/kubernetes/c.yaml"], "/lab/etc/c.yaml", "/etc/kubernetes/c.yaml", "def")
    assert man.command_of(other)[-1] == "--config=/etc/kubernetes/c.yaml" and FLAGS[0] not in man.command_of(other)
    assert len([v for v in other["spec"]["volumes"] if v["name"] == "gpu-install-scheduler-policy"]) == 1
    assert man.unpatch(other) == original
    assert man.unpatch(original) == original


def test_serving_address_from_the_command():
    assert man.serving(man.command_of(MANIFEST)) == ("127.0.0.1", 10259)
    assert man.serving(["kube-scheduler"]) == ("0.0.0.0", 10259)
    assert man.serving(["kube-scheduler", "--secure-port", "10300"]) == ("0.0.0.0", 10300)


# ---------------------------------------------------------------- site model + role_vars
def role_vars_of(s) -> dict:
    return dict(plan_of(s).role_vars)


def _site(**scheduler):
    return parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "r.lab:5000"}, "scheduler": scheduler})


@pytest.mark.parametrize("ext,path", [
    ({"urlPrefix": "ftp://x/y"}, "scheduler.extenders.0.urlPrefix"),
    ({"urlPrefix": "http://x", "prioritizeVerb": "p", "weight": 0}, "scheduler.extenders.0.weight"),
    ({"urlPrefix": "http://x", "prioritizeVerb": "p"}, "scheduler.extenders.0.weight"),
    ({"urlPrefix": "http://x", "httpTimeout": "30 seconds"}, "scheduler.extenders.0.httpTimeout"),
    ({"urlPrefix": "http://x", "managedResources": [{"name": "gpu"}]}, "scheduler.extenders.0.managedResources.0.name"),
    ({"urlPrefix": "http://x", "managedResources": [{"name": "kubernetes.io/x"}]}, "scheduler.extenders.0.managedResources.0.name"),
    ({"urlPrefix": "http://x", "managedResources": [{"name": "a.io/g"}, {"name": "a.io/g"}]}, "scheduler.extenders.0.managedResources"),
    ({"urlPrefix": "http://x", "enableHttps": True}, "scheduler.extenders.0.enableHttps: unknown field; did you mean 'enableHTTPS'"),
])
def test_site_validation_names_the_field(ext, path):
    with pytest.raises(ConfigError) as exc:
        _site(extenders=[ext])
    assert path in exc.value.message and exc.value.exit_code == 2


def test_site_validation_across_extenders():
    with pytest.raises(ConfigError, match="at most one extender may set bindVerb"):
        _site(extenders=[{"urlPrefix": "http://a", "bindVerb": "b"}, {"urlPrefix": "http://b", "bindVerb": "b"}])
    with pytest.raises(ConfigError, match="policy is gone from Kubernetes 1.23"):
        _site(format="policy", kubernetesVersion="v1.24.1", extenders=[])
    with pytest.raises(ConfigError, match="scheduler.kubernetesVersion"):
        _site(kubernetesVersion="1.x")


def test_role_vars_carry_the_scheduler_block():
    ev = role_vars_of(_site(extenders=[EXT], format="config", kubernetesVersion="v1.20.2"))
    assert ev["scheduler_policy_extenders"] == [EXT]
    assert (ev["scheduler_policy_format"], ev["scheduler_policy_kubernetes_version"]) == ("config", "v1.20.2")
    ev = role_vars_of(_site())
    assert ev["scheduler_policy_extenders"] == [] and ev["scheduler_policy_kubernetes_version"] == ""
    # what the role renders from them is what Kubernetes wants (no None fields, site spelling in)
    doc = json.loads(pol.render(role_vars_of(_site(extenders=[{"urlPrefix": "http://a"}]))["scheduler_policy_extenders"],
                                "policy", "v1", []))
    assert doc["extenders"] == [{"urlPrefix": "http://a"}]


def test_sample_site_has_the_scheduler_block():
    from installer.config import sample_site

    data = yaml.safe_load(sample_site())
    assert data["scheduler"] == {"extenders": [], "format": "auto", "kubernetesVersion": None}
    parse_site(data)


# ---------------------------------------------------------------- the role through the seam (no scheduler here)
def _role(tmp_path, variables, check=False, diff=False):
    from installer import ansible as seam

    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump([{"name": "T", "hosts": "all", "gather_facts": False, "roles": [content.fqcn("scheduler_policy")]}]))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"cp": {"ansible_connection": "local",
                                                             "ansible_python_interpreter": sys.executable}}}}))
    return seam.run_playbook(pb, inv, variables, check=check, diff=diff)


def _paths(tmp_path):
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    text = kube.scheduler_manifest(10259, tmp_path / "scheduler.conf")
    (manifests / "kube-scheduler.yaml").write_text(text)
    return {"scheduler_policy_manifest": str(manifests / "kube-scheduler.yaml"),
            "scheduler_policy_config_dir": str(tmp_path / "etc"),
            "scheduler_policy_backup_dir": str(tmp_path / "backups")}, text


def test_role_without_extenders_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))
    paths, text = _paths(tmp_path)
    res = _role(tmp_path, paths)
    assert res.exit_code() == 0 and res.hosts["cp"].changed == 0
    assert Path(paths["scheduler_policy_manifest"]).read_text() == text and not (tmp_path / "etc").exists()


def test_role_check_mode_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))
    paths, text = _paths(tmp_path)
    res = _role(tmp_path, {**paths, "scheduler_policy_extenders": [EXT]}, check=True, diff=True)
    assert res.exit_code() == 0 and res.hosts["cp"].changed == 2, res.recap()
    assert Path(paths["scheduler_policy_manifest"]).read_text() == text
    assert not (tmp_path / "etc").exists() and not (tmp_path / "backups").exists()


def test_role_refuses_a_backup_dir_inside_the_manifests_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))
    paths, text = _paths(tmp_path)
    paths["scheduler_policy_backup_dir"] = str(tmp_path / "manifests")
    res = _role(tmp_path, {**paths, "scheduler_policy_extenders": [EXT]})
    assert res.exit_code() == 4 and "manifests directory" in res.failures[0].message
    assert Path(paths["scheduler_policy_manifest"]).read_text() == text


def test_wait_complaint_reads_only_new_error_lines(tmp_path):
    log = tmp_path / "kube-scheduler.log"
    log.write_text("E1122 12:00:00.0 1 x.go:1] old failure\n")
    sizes = wait.log_sizes(str(log))
    with open(log, "a") as fh:
        fh.write("---- kubelet-standin: starting ----\nI1122 12:00:01.0 1 a.go:1] fine\n"
                 "E1122 12:00:02.0 1 configmap_cafile_content.go:243] noise\n"
                 "couldn't create scheduler from policy: weight\ncouldn't create scheduler from policy: weight\n")
    assert wait.complaint(str(log), sizes) == "couldn't create scheduler from policy: weight"


# ---------------------------------------------------------------- the lab's kubelet stand-in
def test_standin_plan_from_the_lab_manifest(tmp_path):
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "kube-scheduler").write_text("#!/bin/sh\n")
    (bins / "kube-scheduler").chmod(0o755)
    conf = tmp_path / "scheduler.conf"
    conf.write_text("kubeconfig")
    doc = staticpods.parse_manifest(kube.scheduler_manifest(4321, conf))
    p = staticpods.plan(doc, bins)
    assert p.pod == "kube-scheduler" and p.binary == str(bins / "kube-scheduler")
    assert p.argv[0] == "/usr/local/bin/kube-scheduler"
    assert "--secure-port=4321" in p.argv and "--kubeconfig=/etc/kubernetes/scheduler.conf" in p.argv
    assert [(m.source, m.target, m.read_only, m.is_file) for m in p.mounts] == \
        [(str(conf), "/etc/kubernetes/scheduler.conf", True, True)]
    script = staticpods.mount_script(p)
    assert "mount -o remount,bind,ro ./etc/kubernetes/scheduler.conf" in script
    assert script.rstrip().endswith('exec chroot "$root" "$@"')
    argv = staticpods.launch_argv(p, tmp_path / "root")
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"] and argv[-len(p.argv):] == p.argv
    assert staticpods.image_binary_name("registry.k8s.io/kube-scheduler:v1.20.2") == "kube-scheduler"


@pytest.mark.parametrize("change,match", [
    (lambda d: d["spec"]["volumes"].clear(), "no volume of that name"),
    (lambda d: d["spec"]["volumes"][0]["hostPath"].update(path="/nonexistent/conf"), "type check failed"),
    (lambda d: d["spec"].update(hostNetwork=False), "host-network pods only"),
    (lambda d: d["spec"]["containers"][0].update(image="registry.k8s.io/etcd:3.4"), "no binary"),
    (lambda d: d["spec"]["containers"][0]["command"].__setitem__(0, "/bin/kube-scheduler"), "no such file in image"),
    (lambda d: d["spec"]["containers"][0].update(command=[]), "command is empty"),
])
def test_standin_refuses_what_the_kubelet_would_fail(tmp_path, change, match):
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "kube-scheduler").write_text("#!/bin/sh\n")
    (bins / "kube-scheduler").chmod(0o755)
    conf = tmp_path / "scheduler.conf"
    conf.write_text("k")
    doc = staticpods.parse_manifest(kube.scheduler_manifest(1, conf))
    change(doc)
    with pytest.raises(staticpods.ManifestError, match=match):
        staticpods.plan(doc, bins)


def test_standin_reads_only_manifest_files(tmp_path):
    d = tmp_path / "manifests"
    d.mkdir()
    for name in ("a.yaml", "b.yml", "c.json", "kube-scheduler.yaml.bak", ".hidden.yaml", "notes.txt"):
        (d / name).write_text("x")
    sup = staticpods.Supervisor(d, tmp_path / "logs", tmp_path)
    assert sorted(p.name for p in sup._manifest_files()) == ["a.yaml", "b.yml", "c.json"]
    with pytest.raises(staticpods.ManifestError, match="kind"):
        staticpods.parse_manifest("kind: Deployment\napiVersion: apps/v1\n")
