"""The sweep of `upgrade rollback` (installer.upgrade.rollback: leftovers, owner_verdict): what the revisions rolled
back from rendered and the target revision lacks, computed on NVIDIA's real v22.9.2 and v23.9.2 charts rendered by
the real helm (../shared/upstream/charts), and which of those the sweep may delete -- never one the release does not
own. The deletions themselves run against the lab's API server in tests/integration/test_operator_rollback.py."""

from __future__ import annotations

from typing import Any

import pytest

from installer.upgrade import rollback as rb
from tests.conftest import UPSTREAM, needs_upstream

CHARTS = UPSTREAM.parent / "charts"
NS = "gpu-op-orphans"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """The two real charts as `helm template` renders them with their defaults (what the releases' manifests hold)."""
    from tests.conftest import need, upstream_available

    need(upstream_available(), f"upstream charts not found at {CHARTS}")
    from installer import helm

    return {v: helm.template(CHARTS / f"gpu-operator-{v}.tgz", {}, "gpu-operator", NS) for v in ("v22.9.2", "v23.9.2")}


def names(refs: list[rb.ObjRef]) -> list[tuple[str, str, str | None]]:
    return [(r.kind, r.name, r.namespace) for r in refs]


#: what v23.9.2's chart renders and v22.9.2's does not (read off the two charts: NFD 0.14's garbage collector, its
#: worker's Role, the master's and topology updater's ConfigMaps)
V23_ONLY = [
    ("ClusterRole", "gpu-operator-node-feature-discovery-gc", None),
    ("ClusterRoleBinding", "gpu-operator-node-feature-discovery-gc", None),
    ("ConfigMap", "gpu-operator-node-feature-discovery-master-conf", NS),
    ("ConfigMap", "gpu-operator-node-feature-discovery-topology-updater-conf", NS),
    ("Deployment", "gpu-operator-node-feature-discovery-gc", NS),
    ("Role", "gpu-operator-node-feature-discovery-worker", NS),
    ("RoleBinding", "gpu-operator-node-feature-discovery-worker", NS),
]


@needs_upstream
def test_rolled_back_from_v23_9_2_to_v22_9_2(rendered):
    got = rb.leftovers([rendered["v23.9.2"]], rendered["v22.9.2"])
    assert sorted(names(got)) == V23_ONLY
    gc = next(r for r in got if r.kind == "ClusterRole")
    assert (gc.api_version, gc.group) == ("rbac.authorization.k8s.io/v1", "rbac.authorization.k8s.io")


@needs_upstream
def test_after_a_refused_helm_rollback(rendered):
    """helm history: 1 v22.9.2, 2 v23.9.2, 3 failed (the refused rollback: v22.9.2's manifest), then the --chart
    upgrade makes 4 with v22.9.2's: revision 3 alone leaves nothing behind -- what helm's own diff saw -- while
    revisions 2 and 3 together give v23.9.2's own resources."""
    assert rb.leftovers([rendered["v22.9.2"]], rendered["v22.9.2"]) == []
    got = rb.leftovers([rendered["v23.9.2"], rendered["v22.9.2"]], rendered["v22.9.2"])
    assert sorted(names(got)) == V23_ONLY


@needs_upstream
def test_the_other_way_round_names_the_template_crd(rendered):
    """v22.9.2's NFD rendered its NodeFeatureRule CRD from a template: a leftover of v22.9.2 -> v23.9.2, which the
    sweep never deletes (owner_verdict)."""
    got = names(rb.leftovers([rendered["v22.9.2"]], rendered["v23.9.2"]))
    assert ("CustomResourceDefinition", "nodefeaturerules.nfd.k8s-sigs.io", None) in got
    assert ("ClusterRole", "gpu-operator-node-feature-discovery-gc", None) not in got
    # v22.9.2 writes the ClusterPolicy's namespace, v23.9.2 does not: the same object, not a leftover
    assert not [n for n in got if n[0] == "ClusterPolicy"], got
    assert rb.owner_verdict({rb.RELEASE_NAME: "gpu-operator", rb.RELEASE_NAMESPACE: NS}, "apiextensions.k8s.io",
                            "CustomResourceDefinition", "gpu-operator", NS).startswith("left: ")


def doc(api: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})}}


def test_matched_by_group_not_version_and_namespace_as_written():
    old = [doc("policy/v1beta1", "PodDisruptionBudget", "pdb", NS), doc("v1", "ConfigMap", "a"),
           doc("v1", "ConfigMap", "b", "elsewhere"), doc("v1", "ConfigMap", "c", NS)]
    new = [doc("policy/v1", "PodDisruptionBudget", "pdb", NS), doc("v1", "ConfigMap", "a", NS),
           doc("v1", "ConfigMap", "b", NS), doc("v1", "ConfigMap", "c")]
    assert names(rb.leftovers([old], new)) == [("ConfigMap", "b", "elsewhere")]
    # a kind of another group with the same name is another object
    assert names(rb.leftovers([[doc("example.com/v1", "ConfigMap", "a")]], new)) == [("ConfigMap", "a", None)]


def test_an_object_in_two_revisions_is_named_once_as_the_newest_has_it():
    got = rb.leftovers([[doc("policy/v1beta1", "PodDisruptionBudget", "p", NS)],
                        [doc("policy/v1", "PodDisruptionBudget", "p", NS)]], [])
    assert [(r.api_version, r.name) for r in got] == [("policy/v1", "p")]


def test_untrusted_manifest_documents_are_left_out():
    docs: list[Any] = [None, "text", 7, {"kind": "ConfigMap"}, {"apiVersion": "v1", "kind": "ConfigMap",
                                                                 "metadata": {"name": 5}},
                       {"apiVersion": "v1", "kind": "ConfigMap", "metadata": "x"},
                       {"apiVersion": "", "kind": "ConfigMap", "metadata": {"name": "e"}},
                       {"apiVersion": "v1", "kind": "List", "items": [doc("v1", "Secret", "s", NS), "junk"]},
                       {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok", "namespace": ["x"]}}]
    assert sorted(names(list(rb.manifest_refs(docs)))) == [("ConfigMap", "ok", None), ("Secret", "s", NS)]


OWNED = {rb.RELEASE_NAME: "gpu-operator", rb.RELEASE_NAMESPACE: NS}


@pytest.mark.parametrize(("group", "kind"), [("rbac.authorization.k8s.io", "ClusterRole"), ("apps", "Deployment")])
def test_deleted_only_when_the_release_owns_it(group, kind):
    """A cluster-scoped and a namespaced kind: the release's own is deleted; one annotated for another release (of the
    same name in another namespace, or another name in this one), one with no annotations, one helm keeps: never."""
    assert rb.owner_verdict(OWNED, group, kind, "gpu-operator", NS) == "deleted"
    other_ns = {**OWNED, rb.RELEASE_NAMESPACE: "gpu-operator"}
    assert rb.owner_verdict(other_ns, group, kind, "gpu-operator", NS) == \
        "left: not the release's (meta.helm.sh/release-name/meta.helm.sh/release-namespace: gpu-operator/gpu-operator)"
    assert rb.owner_verdict({**OWNED, rb.RELEASE_NAME: "other"}, group, kind, "gpu-operator", NS) == \
        f"left: not the release's (meta.helm.sh/release-name/meta.helm.sh/release-namespace: {NS}/other)"
    for none in (None, {}, {rb.RELEASE_NAMESPACE: NS}):
        assert rb.owner_verdict(none, group, kind, "gpu-operator", NS).startswith("left: not the release's"), none
    assert rb.owner_verdict({**OWNED, rb.RESOURCE_POLICY: "keep"}, group, kind, "gpu-operator", NS) == \
        "left: helm.sh/resource-policy: keep"


def test_a_namespace_is_never_deleted():
    assert rb.owner_verdict(OWNED, "", "Namespace", "gpu-operator", NS) == \
        "left: a Namespace is never deleted by a rollback"


def test_the_preview_names_what_goes_after_helm():
    from pathlib import Path

    from installer.helm import HistoryEntry

    pv = rb.Preview("gpu-operator", NS, HistoryEntry(2, "deployed", "gpu-operator-v23.9.2", "Upgrade complete"),
                    HistoryEntry(1, "superseded", "gpu-operator-v22.9.2", "Install complete"), "the previous revision",
                    [], "operator", Path("/s.json"), None, orphans=[
                        rb.Orphan("rbac.authorization.k8s.io/v1", "ClusterRole", "gc", None, "to be deleted"),
                        rb.Orphan("v1", "ConfigMap", "cm", NS, "left: helm.sh/resource-policy: keep")])
    lines = pv.lines()
    at = lines.index("in the cluster, rendered by a revision after 1 and not by revision 1 (deleted by helm, or after "
                     "it where helm leaves them):")
    assert lines[at + 1:at + 3] == ["  ClusterRole gc: to be deleted",
                                    f"  ConfigMap {NS}/cm: left: helm.sh/resource-policy: keep"]
