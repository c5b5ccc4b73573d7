"""The GPU Operator's driver container behind a full air gap, on a real kubelet (`lab up --kubernetes --kubelet real`,
1 debian12 node), end to end.

The site repository: the STAND-IN linux-headers-<the node's kernel> and the real Debian libelf1 it depends on,
published into a signed repository by `mirror push --repo-dir`'s own code (real gpg key, apt-ftparchive) and served by
the lab's repository server (gpu_install_lab/standin_headers.py, docs/lab.md). `gpu-install apply` (driver.mode
operator, packages.url/packages.key; the lab's STAND-IN operator chart) renders driver.repoConfig and writes the
repository ConfigMap into the operator's namespace before the release. Then pods of the STAND-IN driver container
image (Debian userland, the real apt; the image's own sources.list unreachable as NVIDIA's archive.ubuntu.com is behind
an air gap) mount a ConfigMap as the operator mounts driver.repoConfig (one subPath mount per key under
/etc/apt/sources.list.d) and run `apt-get -qq update` and `apt-get install linux-headers-$(uname -r)`: it installs
from the site repository; a repository signed by another key is refused by apt; a repository without the kernel's
header package fails with apt's message, and the file gpu-install wrote names the fix. Tests run in file order.

STAND-INs here: the header package, the driver container image, the operator chart (tests/fixtures/charts), and the
pods' hostNetwork (the lab's pod network has no route off its node; a cluster's driver pods reach the repository
through the pod network).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import VENV_BIN
from tests.integration.test_lab_real_nodes import kubectl, real_lab
from tests.integration.test_runtime_roles import _ok, apply_inventory

pytestmark = [pytest.mark.lab, pytest.mark.kubernetes]
NODE = "node1"
OPNS = "gpu-operator"
CHART = Path(__file__).resolve().parents[1] / "fixtures" / "charts" / "gpu-operator-fixture"
DOCS = Path(__file__).resolve().parents[2] / "docs"


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), *args], capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def ag(tmp_path_factory):
    """The lab, the site repository (and two broken ones) on its repository server, the STAND-IN driver image in its
    registry, and one `gpu-install apply` with the site file."""
    from gpu_install_lab import standin_headers

    lab_gen = real_lab(tmp_path_factory, "airgap", 1)
    lab = next(lab_gen)
    try:
        h, work = lab["h"], lab["work"]
        t0 = time.monotonic()
        header = standin_headers.header_deb()
        depends = standin_headers.dependency_debs()
        repo_root = h.dir / "repo"  # the lab's repository server serves this directory at repo_url
        key = standin_headers.publish_site_repo([header, *depends], repo_root / "site", work / "signing",
                                                work / "publish-site")
        # the same packages signed by another key, and the site's key over a repository without the header package
        standin_headers.publish_site_repo([header, *depends], repo_root / "site-otherkey", work / "other-signing",
                                          work / "publish-otherkey")
        standin_headers.publish_site_repo(depends, repo_root / "site-noheaders", work / "signing",
                                          work / "publish-noheaders")
        image = standin_headers.push_driver_image(h.status["registry"], h.ca)
        print(f"BENCHMARK site repositories and the STAND-IN driver image: {time.monotonic() - t0:.1f}s", flush=True)
        site = work / "site.yaml"
        site.write_text(yaml.safe_dump({
            "operator": {"version": "v23.9.2"},  # the newest line the lab's Kubernetes 1.20 runs
            "registry": {"host": h.status["registry"], "ca": str(h.ca)}, "runtime": "containerd",
            "driver": {"mode": "operator", "customImageOs": ["debian12"]},
            "packages": {"url": f"{h.status['repo_url']}/site", "key": str(key)}}))
        inventory = apply_inventory(h, work)
        state = work / "state"
        env = {**os.environ, "GPU_INSTALL_STATE": str(state), "ANSIBLE_LOCAL_TEMP": str(state / "tmp")}
        kc = h.dir / "kube" / "kubeconfig"
        t0 = time.monotonic()
        applied = _cli(env, "apply", "-s", str(site), "-i", str(inventory), "--chart", str(CHART), "--kubeconfig",
                       str(kc), "--no-wait", "--skip-mirror-check", "--skip-validate")
        print(f"BENCHMARK apply (driver repository ConfigMap), 1 real node: {time.monotonic() - t0:.1f}s", flush=True)
        yield {**lab, "site": site, "inventory": inventory, "env": env, "kc": kc, "image": image, "key": key,
               "applied": applied, "kernel": standin_headers.kernel_release()}
    finally:
        lab_gen.close()  # the lab down, whatever happened above


def _plan(ag, **packages):
    from installer.config import load_site
    from tests.conftest import plan_of

    site = load_site(ag["site"])
    for k, v in packages.items():
        setattr(site.packages, k, v)
    return plan_of(site, inventory=str(ag["inventory"]))


def _configmap(ag, name: str, **packages) -> dict:
    """The repository ConfigMap installer.driver_repo renders for the site (packages.* changed as given), named name,
    created in the operator's namespace."""
    from installer import driver_repo

    plan = _plan(ag, **packages)
    (cm,) = driver_repo.configmaps(plan.site, plan.release, plan.nodes)
    cm["metadata"]["name"] = name
    kubectl(ag, "apply", "-f", "-", input=json.dumps(cm))
    return cm


def _driver_pod(ag, name: str, configmap: dict) -> tuple[str, str]:
    """A pod of the STAND-IN driver container on the real kubelet, the ConfigMap mounted as the operator mounts
    driver.repoConfig (createConfigMapVolumeMounts: a volume of the ConfigMap's keys, one subPath mount per key in the
    container's sources directory); its log once it ended, and its phase."""
    from installer.driver_repo import REPO_DIR

    cm = configmap["metadata"]["name"]
    keys = sorted(configmap["data"])
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": OPNS},
           "spec": {"restartPolicy": "Never", "hostNetwork": True, "dnsPolicy": "Default",
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "volumes": [{"name": cm, "configMap": {"name": cm, "items": [{"key": k, "path": k} for k in keys]}}],
                    "containers": [{"name": "nvidia-driver-ctr", "image": ag["image"], "args": ["init"],
                                    "volumeMounts": [{"name": cm, "mountPath": f"{REPO_DIR['apt']}/{k}", "subPath": k,
                                                      "readOnly": True} for k in keys]}]}}
    kubectl(ag, "apply", "-f", "-", input=json.dumps(pod))
    deadline = time.monotonic() + 240
    while (phase := kubectl(ag, "-n", OPNS, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout) \
            not in ("Succeeded", "Failed"):
        assert phase in ("", "Pending", "Running") and time.monotonic() < deadline, (
            phase, kubectl(ag, "-n", OPNS, "describe", "pod", name, check=False).stdout[-3000:])
        time.sleep(1)
    log = kubectl(ag, "-n", OPNS, "logs", name).stdout
    return phase, log


def test_apply_renders_repo_config_and_writes_the_configmap(ag):
    from installer import driver_repo, helm

    h = ag["h"]
    proc = ag["applied"]
    _ok(proc)
    assert "operator: ConfigMap gpu-operator/gpu-install-driver-repo (driver package sources): created" in proc.stderr
    # the values the release was deployed with name it, from the release's own keys
    found = helm.release_values("gpu-operator", OPNS, ag["kc"])
    assert found is not None
    assert found[1]["driver"]["repoConfig"] == {"configMapName": "gpu-install-driver-repo"}
    assert "certConfig" not in found[1]["driver"]  # http: no CA ConfigMap
    cm = json.loads(kubectl(ag, "-n", OPNS, "get", "configmap", "gpu-install-driver-repo", "-o", "json").stdout)
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-install"
    assert sorted(cm["data"]) == ["gpu-install-debian12.list", "gpu-install-site.asc"]
    assert cm["data"]["gpu-install-site.asc"] == ag["key"].read_text()
    deb = [ln for ln in cm["data"]["gpu-install-debian12.list"].splitlines() if not ln.startswith("#")]
    assert deb == [f"deb [signed-by=/etc/apt/sources.list.d/gpu-install-site.asc] {h.status['repo_url']}/site/packages/"
                   "debian12 gpu-install main"]
    assert not any("trusted=yes" in v for v in cm["data"].values())
    plan = _plan(ag)
    assert cm["data"] == driver_repo.configmaps(plan.site, plan.release, plan.nodes)[0]["data"]
    # the operator stage alone (`operator install -i`), again: the API server stores nothing new
    again = _ok(_cli(ag["env"], "operator", "install", "-s", str(ag["site"]), "-i", str(ag["inventory"]), "--chart",
                     str(CHART), "--kubeconfig", str(ag["kc"]), "--no-wait"))
    assert "ConfigMap gpu-operator/gpu-install-driver-repo (driver package sources): unchanged" in again


def test_the_driver_container_installs_the_header_package_from_the_site_repository(ag):
    cm = json.loads(kubectl(ag, "-n", OPNS, "get", "configmap", "gpu-install-driver-repo", "-o", "json").stdout)
    phase, log = _driver_pod(ag, "driver-site-repo", cm)
    header = f"linux-headers-{ag['kernel']}"
    assert phase == "Succeeded", log
    base = f"{ag['h'].status['repo_url']}/site/packages/debian12 gpu-install/main amd64"
    assert f"{base} {header} amd64 0.0-0gpuinstall.standin1" in log, log  # fetched from the site repository
    assert f"{base} libelf1 amd64" in log, log  # with the real dependency the image lacks
    assert f"{header} 0.0-0gpuinstall.standin1 install ok installed" in log, log
    # the image's own source is unreachable (the air gap): a warning, not a failure, as in NVIDIA's image
    assert "deb.debian.org" in log and "W: " in log, log


def test_a_repository_signed_by_another_key_is_refused_by_apt(ag):
    cm = _configmap(ag, "driver-repo-otherkey", url=f"{ag['h'].status['repo_url']}/site-otherkey")
    assert "signed-by=/etc/apt/sources.list.d/gpu-install-site.asc" in cm["data"]["gpu-install-debian12.list"]
    phase, log = _driver_pod(ag, "driver-otherkey", cm)
    assert phase == "Failed", log
    assert "NO_PUBKEY" in log and "is not signed" in log, log  # apt checked the signature with the site key only
    assert "ERROR: Failed to update package cache" in log and "Installing Linux kernel headers" not in log, log


def test_a_kernel_without_its_header_package_fails_with_apt_and_the_fix_is_named(ag):
    from installer.driver_repo import HEADERS_FIX

    cm = _configmap(ag, "driver-repo-noheaders", url=f"{ag['h'].status['repo_url']}/site-noheaders")
    phase, log = _driver_pod(ag, "driver-noheaders", cm)
    header = f"linux-headers-{ag['kernel']}"
    assert phase == "Failed", log
    assert f"E: Unable to locate package {header}" in log, log
    assert HEADERS_FIX in log, log  # the comment gpu-install wrote into the mounted .list
    # and troubleshooting's entry for apt's message names the same fix
    text = (DOCS / "troubleshooting.md").read_text()
    entry = text[text.index("E: Unable to locate package linux-headers-"):][:1500]
    assert "mirror plan --facts" in entry and "gpu_install_kernel" in entry, entry


def test_operator_uninstall_removes_the_configmap(ag):
    out = _ok(_cli(ag["env"], "operator", "uninstall", "-s", str(ag["site"]), "--kubeconfig", str(ag["kc"]), "--yes"))
    assert "driver package-source ConfigMaps: deleted gpu-operator/gpu-install-driver-repo" in out
    left = kubectl(ag, "-n", OPNS, "get", "configmaps", "-o", "name").stdout.split()
    assert "configmap/gpu-install-driver-repo" not in left, left
    assert "configmap/driver-repo-otherkey" in left  # another name: not one of the stage's, kept
