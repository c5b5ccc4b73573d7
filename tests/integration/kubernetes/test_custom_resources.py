"""Custom resources through the lab's kube-apiserver: what is sent is what is stored, zero values included.

A real API server stores "" / 0 / 0.0 / false / [] / {} in a custom resource as sent. The Debian 1.20.2
source built with Go >= 1.16 read every empty string as null in CR schema validation (the vendored
kube-openapi typeValidator; scripts/build-kubernetes, recipe 4, patches it) and refused the ClusterPolicy
of every real GPU Operator chart. These tests hold the lab's build to the real behaviour.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from installer.tools import find_helm
from tests.conftest import ROOT, need

pytestmark = pytest.mark.kubernetes

CHART = ROOT.parent / "shared" / "upstream" / "charts" / "gpu-operator-v23.9.2.tgz"
GROUP = "zerovalues.gpu-install.lab"

SCALARS = {
    "s": {"type": "string"},
    "i": {"type": "integer"},
    "n": {"type": "number"},
    "b": {"type": "boolean"},
    "strings": {"type": "array", "items": {"type": "string"}},
    "ints": {"type": "array", "items": {"type": "integer"}},
    "objs": {"type": "array", "items": {"type": "object", "properties": {"s": {"type": "string"}}}},
    "o": {"type": "object", "properties": {"s": {"type": "string"}}},
}
SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                **SCALARS,
                "sub": {
                    "type": "object",
                    "properties": {**SCALARS, "sub": {"type": "object", "properties": SCALARS}},
                },
            },
        },
    },
}
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"things.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Cluster",
        "names": {"plural": "things", "singular": "thing", "kind": "Thing"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": SCHEMA}}],
    },
}

ZEROS = {"s": "", "i": 0, "n": 0.0, "b": False, "strings": [], "ints": [], "objs": [], "o": {}}
NONZERO = {"s": "x", "i": 7, "n": 1.5, "b": True, "strings": ["a"], "ints": [1], "objs": [{"s": "y"}], "o": {"s": "z"}}
SPECS = {
    "zeros": ZEROS,
    "zeros-nested": {"sub": {**ZEROS, "sub": ZEROS}},
    "empty-strings-in-lists": {"strings": ["", "a", ""], "objs": [{"s": ""}, {}], "ints": [0, 0]},
    "mixed": {**NONZERO, "sub": {**ZEROS, "sub": {**NONZERO, "s": ""}}},
    "empty-object": {},
}


def strict(value):
    """value with its JSON types spelled out, so that False != 0 and "" != None compare unequal (Python's
    == says False == 0). Numbers compare by value: a real API server may return 0.0 as 0."""
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strict(v) for v in value]
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    return (type(value).__name__, value)


NOT_SERVED_YET = ("the server could not find the requested resource", "no matches for kind")


def create(kubectl, manifest: dict, attempts: int = 30):
    """kubectl create (server-side checks only: --validate=false), retrying while a fresh CRD's
    endpoint is not served yet (the API server's 404, or kubectl's discovery not knowing the kind yet).
    Returns the CompletedProcess of the last try."""
    proc = None
    for _ in range(attempts):
        proc = kubectl.run("create", "--validate=false", "-f", "-", input=json.dumps(manifest), check=False)
        if proc.returncode == 0 or not any(m in proc.stderr for m in NOT_SERVED_YET):
            return proc
        time.sleep(1)
    return proc


def establish(kubectl, crd: dict) -> None:
    proc = create(kubectl, crd)
    assert proc.returncode == 0, f"CRD {crd['metadata']['name']} refused: {proc.stderr}"
    kubectl.run("wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s")


@pytest.fixture(scope="module")
def things(kubectl):
    establish(kubectl, CRD)
    yield f"things.{GROUP}"
    kubectl.run("delete", "crd", f"things.{GROUP}", "--wait=false", check=False)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_custom_resource_zero_values_read_back_as_sent(kubectl, things, name):
    sent = {"apiVersion": f"{GROUP}/v1", "kind": "Thing", "metadata": {"name": name}, "spec": SPECS[name]}
    proc = create(kubectl, sent)
    assert proc.returncode == 0, f"the API server refused {json.dumps(sent['spec'])}: {proc.stderr}"
    got = kubectl.json("get", things, name)
    assert strict(got["spec"]) == strict(sent["spec"])


def test_custom_resource_update_to_zero_values(kubectl, things):
    name = "updated"
    proc = create(kubectl, {"apiVersion": f"{GROUP}/v1", "kind": "Thing", "metadata": {"name": name},
                            "spec": {**NONZERO, "sub": NONZERO}})
    assert proc.returncode == 0, proc.stderr
    patch = {"spec": {**ZEROS, "sub": {"s": "", "b": False, "o": {"s": ""}}}}
    proc = kubectl.run("patch", things, name, "--type=merge", "-p", json.dumps(patch), check=False)
    assert proc.returncode == 0, f"the API server refused the patch {json.dumps(patch)}: {proc.stderr}"
    spec = kubectl.json("get", things, name)["spec"]
    # a merge patch of {} onto an object changes nothing in it (RFC 7386): spec.o keeps its "s"
    want = {**ZEROS, "o": NONZERO["o"], "sub": {**NONZERO, "s": "", "b": False, "o": {"s": ""}}}
    assert strict(spec) == strict(want)


def test_custom_resource_wrong_types_are_still_refused(kubectl, things):
    """The fix must not make the schema lax: a value of the wrong type stays an error, "" included."""
    proc = create(kubectl, {"apiVersion": f"{GROUP}/v1", "kind": "Thing", "metadata": {"name": "wrong-types"},
                            "spec": {"s": 0, "i": "0", "b": "", "sub": {"o": ""}}})
    assert proc.returncode != 0
    for field, want, got in (("spec.s", "string", "integer"), ("spec.i", "integer", "string"),
                             ("spec.b", "boolean", "string"), ("spec.sub.o", "object", "string")):
        assert f'{field} in body must be of type {want}: "{got}"' in proc.stderr, proc.stderr


def test_custom_resource_null_is_pruned(kubectl, things):
    """null for a field that is not nullable is dropped (apiextensions.k8s.io/v1), not stored or refused."""
    proc = create(kubectl, {"apiVersion": f"{GROUP}/v1", "kind": "Thing", "metadata": {"name": "nulls"},
                            "spec": {"s": None, "i": 0, "sub": {"s": None, "o": {"s": ""}}}})
    assert proc.returncode == 0, proc.stderr
    assert strict(kubectl.json("get", things, "nulls")["spec"]) == strict({"i": 0, "sub": {"o": {"s": ""}}})


def empty_strings(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from empty_strings(v, f"{path}.{k}" if path else k)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from empty_strings(v, f"{path}[{i}]")
    elif obj == "":
        yield path


def lookup(obj, path: str):
    for part in path.replace("[", ".[").split("."):
        obj = obj[int(part[1:-1])] if part.startswith("[") else obj[part]
    return obj


def test_real_gpu_operator_cluster_policy_is_accepted(kubectl):
    """The ClusterPolicy CRD and ClusterPolicy of the real v23.9.2 chart, rendered by helm as an
    install would: the API server accepts it and stores its empty strings as empty strings."""
    need(CHART.is_file(), f"the real chart is not at {CHART}")
    helm = find_helm()
    need(helm, "helm not installed (scripts/bootstrap installs it)")
    out = subprocess.run(
        [str(helm), "template", "gpu-operator", str(CHART), "--namespace", "gpu-operator", "--include-crds",
         "--kube-version", "1.20.2"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition"
               and d["metadata"]["name"] == "clusterpolicies.nvidia.com")
    policy = next(d for d in docs if d["kind"] == "ClusterPolicy")
    blanks = list(empty_strings(policy["spec"]))
    assert "driver.certConfig.name" in blanks and len(blanks) >= 9, blanks  # what broke the old build

    establish(kubectl, crd)
    try:
        proc = create(kubectl, policy)
        assert proc.returncode == 0, f"the API server refused the real ClusterPolicy: {proc.stderr}"
        got = kubectl.json("get", "clusterpolicies.nvidia.com", policy["metadata"]["name"])
        for path in blanks:
            assert lookup(got["spec"], path) == "", path
        assert got["spec"]["driver"]["certConfig"] == policy["spec"]["driver"]["certConfig"]
    finally:
        kubectl.run("delete", "clusterpolicies.nvidia.com", "--all", "--wait=false", check=False)
        kubectl.run("delete", "crd", "clusterpolicies.nvidia.com", "--wait=false", check=False)
