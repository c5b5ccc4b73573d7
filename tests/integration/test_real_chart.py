"""The REAL GPU Operator charts (../shared/upstream/charts: data, not project code) installed with the values
gpu-install renders, through the real CLI -- `gpu-install operator install` and the operator stage of
`gpu-install apply` -- into the lab's kube-apiserver (Kubernetes 1.20).

For each release every object of `helm get manifest` is read back from the API server (none missing); the
ClusterPolicy reads back with every field helm sent (nothing pruned by the real CRD schema, the empty strings
kept) and with the repository/image/version gpu-install rendered for each component; every image of every pod
template (containers and initContainers) and every repository of the ClusterPolicy is in the site's registry,
and no string of any object names a public registry.

The lab's nodes are kubemark hollow nodes (nothing runs): --no-wait. The API server must keep empty strings in
custom resources (scripts/build-kubernetes recipe 4, see test_operator_crds.py); v24.9+ charts need Kubernetes
>= 1.24 and are refused (test_operator_install.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS, needs_upstream
from tests.integration.test_operator_crds import BUILD_INFO, EMPTY_STRINGS_FIXED, build_recipe, chart

pytestmark = [
    pytest.mark.lab, pytest.mark.kubernetes, needs_upstream,
    pytest.mark.skipif(build_recipe() < EMPTY_STRINGS_FIXED,
                       reason=f"the lab API server of build recipe {build_recipe()} ({BUILD_INFO}) refuses the real "
                              f"ClusterPolicy's empty strings; rebuild the lab binaries (scripts/build-kubernetes)"),
]

GPU_INSTALL = Path(sys.executable).parent / "gpu-install"
NS = "gpu-op-real"
RELEASE = "gpu-operator"
# operator.* values of the operator Deployment itself, not of the ClusterPolicy's spec.operator
OPERATOR_OWN = {"repository", "image", "version", "imagePullSecrets", "imagePullPolicy"}
# registries an air-gapped cluster cannot reach; a reference to one of them in a deployed object is a failed pull
PUBLIC = re.compile(r"(?<![\w.-])(nvcr\.io|registry\.k8s\.io|k8s\.gcr\.io|gcr\.io|docker\.io|quay\.io|ghcr\.io)/")


@pytest.fixture(scope="module")
def env(lab_kubernetes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real-chart")
    inv = tmp / "inventory"
    inv.mkdir()
    # the lab's inventory plus the bastion as control plane; apply runs with --limit bastion (no GPU node is touched:
    # the lab's nodes have no container runtime, which preflight would rightly refuse)
    (inv / "hosts.yml").write_text(lab_kubernetes.inventory.read_text())
    (inv / "zz-apply.yml").write_text(yaml.safe_dump({"all": {"children": {
        "kube_control_plane": {"hosts": {"bastion": {"ansible_connection": "local",
                                                     "ansible_python_interpreter": sys.executable}}}}}}))
    run_env = {**os.environ, "T_GI_REAL_USER": "mirror-user", "T_GI_REAL_PASSWORD": "not-a-secret",
               "GPU_INSTALL_STATE": str(tmp / "state"), "ANSIBLE_LOCAL_TEMP": str(tmp / "ansible-tmp")}
    return {"kubeconfig": lab_kubernetes.status["kubernetes"]["kubeconfig"],
            "registry": lab_kubernetes.status["registry"], "inventory": inv, "tmp": tmp, "env": run_env}


def write_site(env, version: str) -> Path:
    site = env["tmp"] / f"site-{version}.yaml"
    site.write_text(yaml.safe_dump({
        "operator": {"version": version, "namespace": NS, "releaseName": RELEASE},
        "registry": {"host": env["registry"], "prefix": "mirror",
                     "pullSecret": {"name": "gpu-registry", "usernameEnv": "T_GI_REAL_USER",
                                    "passwordEnv": "T_GI_REAL_PASSWORD"}},
        "runtime": "containerd",
        "driver": {"mode": "operator", "customImageOs": LAB_DRIVER_OS},
    }))
    return site


def run(env, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(GPU_INSTALL), *argv], capture_output=True, text=True, env=env["env"], timeout=timeout)


def api(env):
    from kubernetes import config

    return config.new_client_from_config(config_file=env["kubeconfig"])


def manifest(env) -> list[dict]:
    from installer.tools import ensure_helm

    proc = subprocess.run([str(ensure_helm()), "get", "manifest", RELEASE, "-n", NS, "--kubeconfig",
                           env["kubeconfig"]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def read_back(env, objs: list[dict]) -> list[tuple[dict, dict]]:
    """Each object of the release as the API server stores it; an object it does not have is an assertion."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(api(env))
    pairs, missing = [], []
    for obj in objs:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        name = obj["metadata"]["name"]
        ns = obj["metadata"].get("namespace") or NS if res.namespaced else None
        try:
            pairs.append((obj, res.get(name=name, namespace=ns).to_dict()))
        except ApiException as exc:
            missing.append(f"{obj['kind']}/{ns + '/' if ns else ''}{name}: {exc.status} {exc.reason}")
    assert not missing, "objects of the release the API server does not have:\n" + "\n".join(missing)
    return pairs


def pod_images(obj: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(where, image) of every container and initContainer of every pod spec inside an object."""
    if isinstance(obj, dict):
        if isinstance(obj.get("containers"), list):
            for key in ("initContainers", "containers"):
                for c in obj.get(key) or []:
                    yield f"{path}.{key}[{c.get('name')}]", c.get("image", "")
        for k, v in obj.items():
            yield from pod_images(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from pod_images(v, f"{path}[{i}]")


def triples(tree: Any, path: str = "") -> Iterator[tuple[str, dict]]:
    """(path, dict) of every mapping with a repository or a string image: the repository/image/version triples."""
    if isinstance(tree, dict):
        if "repository" in tree or isinstance(tree.get("image"), str):
            yield path, tree
        for k, v in tree.items():
            yield from triples(v, f"{path}.{k}" if path else k)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from triples(v, f"{path}[{i}]")


Keys = tuple[str | int, ...]


def leaves(tree: Any, path: Keys = ()) -> Iterator[tuple[Keys, Any]]:
    """(path as a tuple of keys and indexes, value) of every leaf; keys may hold dots (nvidia.com/cc.capable)."""
    if isinstance(tree, dict) and tree:
        for k, v in tree.items():
            yield from leaves(v, (*path, k))
    elif isinstance(tree, list) and tree:
        for i, v in enumerate(tree):
            yield from leaves(v, (*path, i))
    else:
        yield path, tree


def show(path: Keys) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def strings(tree: Any) -> Iterator[tuple[str, str]]:
    for p, v in leaves(tree):
        if isinstance(v, str):
            yield show(p), v


def lookup(tree: Any, path: Keys) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def check_release(env, site: Path, version: str) -> None:
    proc = run(env, "render", "-s", str(site))
    assert proc.returncode == 0, proc.stderr
    rendered = yaml.safe_load(proc.stdout)
    registry = env["registry"] + "/"

    sent = manifest(env)
    assert len(sent) >= 10, [f"{o['kind']}/{o['metadata']['name']}" for o in sent]
    stored = read_back(env, sent)
    assert any(o["kind"] == "DaemonSet" for o, _ in stored) and any(o["kind"] == "Deployment" for o, _ in stored)

    # the ClusterPolicy against the real CRD schema: every field helm sent is stored as sent (nothing pruned, no
    # empty string lost), and each component's repository/image/version is what gpu-install rendered
    [(cp_sent, cp)] = [(o, s) for o, s in stored if o["kind"] == "ClusterPolicy"]
    stored_leaves = dict(leaves(cp["spec"], ("spec",)))
    sent_leaves = dict(leaves(cp_sent["spec"], ("spec",)))
    # (a null helm sent means unset: the API server drops it, as for any object)
    lost = {show(p): v for p, v in sent_leaves.items() if v is not None and stored_leaves.get(p, object()) != v}
    assert not lost, f"ClusterPolicy fields not stored as sent (pruned or changed): {lost}"
    assert sum(v == "" for v in sent_leaves.values()) >= 3, "expected the real chart's empty-string fields"
    # every value gpu-install rendered for a ClusterPolicy field is there as rendered: each repository/image/version,
    # pull secret, enabled switch, runtime (the operator's own image and pull secret are its Deployment's: below)
    diffs, triples_seen = [], 0
    for path, value in leaves(rendered):
        if path[0] not in cp["spec"] or (path[0] == "operator" and path[1] in OPERATOR_OWN):
            continue
        try:
            got = lookup(cp["spec"], path)
        except (KeyError, IndexError, TypeError):
            got = "<missing>"
        triples_seen += path[-1] == "repository"
        if got != value:
            diffs.append(f"spec.{show(path)}: {got!r}, rendered {value!r}")
    assert not diffs, "ClusterPolicy fields that differ from the rendered values:\n" + "\n".join(diffs)
    assert triples_seen >= 8, triples_seen

    # images: every pod template's containers and initContainers, every ClusterPolicy triple, in the site registry
    wrong = []
    seen = 0
    for obj, got in stored:
        for where, image in pod_images(got.get("spec"), f"{obj['kind']}/{obj['metadata']['name']} spec"):
            seen += 1
            if not image.startswith(registry):
                wrong.append(f"{where}: {image}")
    assert seen >= 3, seen
    op = rendered["operator"]
    [dep] = [got for obj, got in stored if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "gpu-operator"]
    assert [c["image"] for c in dep["spec"]["template"]["spec"]["containers"]] == \
        [f"{op['repository']}/{op['image']}:{op['version']}"]
    spec = cp["spec"]
    for path, triple in triples(spec):
        enabled = spec.get(path.split(".")[0], {}).get("enabled", True)
        if not triple.get("repository") and not triple.get("version") and not enabled:
            continue  # no coordinates at all (the vGPU manager the site builds itself), and not deployed
        if not str(triple.get("repository", "")).startswith(registry) and not str(triple.get("image")).startswith(registry):
            wrong.append(f"ClusterPolicy spec.{path}: {triple.get('repository')}/{triple.get('image')}:{triple.get('version')}")
    # no public registry in any string of any object of the release (the Kata manager's runtime-class artifact URLs
    # in the v23.9.2 ClusterPolicy named nvcr.io until gpu-install rendered them: tests/unit/test_kata_artifacts.py)
    for obj, got in stored:
        for where, value in strings(got):
            if PUBLIC.search(value):
                wrong.append(f"{obj['kind']}/{obj['metadata']['name']} {where}: {value}")
    assert not wrong, f"{version}: references outside {registry}:\n" + "\n".join(wrong)


def uninstall(env, site: Path) -> None:
    """Release and CRDs gone (the next test installs another release's); the namespace stays for the next one."""
    version = yaml.safe_load(site.read_text())["operator"]["version"]
    proc = run(env, "operator", "uninstall", "-s", str(site), "--kubeconfig", env["kubeconfig"], "--yes",
               "--purge-crds", "--chart", str(chart(version)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("version", ["v1.11.0", "v22.9.2", "v23.9.2"])
def test_operator_install_real_chart(env, version):
    site = write_site(env, version)
    try:
        proc = run(env, "operator", "install", "-s", str(site), "--kubeconfig", env["kubeconfig"],
                   "--chart", str(chart(version)), "--no-wait", "--timeout", "120")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"release {RELEASE} (gpu-operator-{version}): revision 1 deployed" in proc.stdout, proc.stdout
        check_release(env, site, version)
    finally:
        uninstall(env, site)


def test_apply_operator_stage_real_chart(env):
    """`gpu-install apply` limited to the control-plane host (no GPU node touched) with --include-operator: the
    operator stage installs the real v23.9.2 chart."""
    version = "v23.9.2"
    site = write_site(env, version)
    argv = ["apply", "-s", str(site), "-i", str(env["inventory"]), "--kubeconfig", env["kubeconfig"], "--limit",
            "bastion", "--include-operator", "--chart", str(chart(version)), "--no-wait", "--operator-timeout", "120",
            "-q"]
    try:
        # the lab registry holds none of the release's images at the site's paths: apply's mirror check stops it
        # before any host (exit 3, the missing images named), and nothing is installed
        proc = run(env, *argv)
        assert proc.returncode == 3, proc.stdout + proc.stderr[-4000:]
        assert "images the release deploys are not in" in proc.stderr and f"{env['registry']}/mirror/" in proc.stderr, proc.stderr[-4000:]
        assert re.search(r"preflight +FAILED", proc.stdout) and re.search(r"nodes +not run", proc.stdout), proc.stdout
        assert run(env, "operator", "status", "-s", str(site), "--kubeconfig", env["kubeconfig"]).returncode == 6
        # the pods need not run here (--no-wait), so the check is skipped for this test
        proc = run(env, *argv, "--skip-mirror-check")
        assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
        assert re.search(rf"operator +changed +release {RELEASE} \(gpu-operator-{version}\): revision 1 deployed",
                         proc.stdout), proc.stdout
        check_release(env, site, version)
    finally:
        uninstall(env, site)
