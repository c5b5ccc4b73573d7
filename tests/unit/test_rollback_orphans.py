"""The sweep of `upgrade rollback` and of an upgrade after a failed one (installer.upgrade.orphans: leftovers,
owner_verdict, not_diffed): what the revisions rolled back from (or skipped by helm's upgrade diff) rendered and the
new revision lacks, computed on NVIDIA's real v22.9.2 and v23.9.2 charts rendered by
the real helm (../shared/upstream/charts), and which of those the sweep may delete -- never one the release does not
own. The deletions themselves run against the lab's API server in tests/integration/test_operator_rollback.py."""

from __future__ import annotations

from typing import Any

import pytest

from installer.helm import HistoryEntry
from installer.upgrade import orphans as ob
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


def names(refs: list[ob.ObjRef]) -> list[tuple[str, str, str | None]]:
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
    got = ob.leftovers([rendered["v23.9.2"]], rendered["v22.9.2"])
    assert sorted(names(got)) == V23_ONLY
    gc = next(r for r in got if r.kind == "ClusterRole")
    assert (gc.api_version, gc.group) == ("rbac.authorization.k8s.io/v1", "rbac.authorization.k8s.io")


@needs_upstream
def test_after_a_refused_helm_rollback(rendered):
    """helm history: 1 v22.9.2, 2 v23.9.2, 3 failed (the refused rollback: v22.9.2's manifest), then the --chart
    upgrade makes 4 with v22.9.2's: revision 3 alone leaves nothing behind -- what helm's own diff saw -- while
    revisions 2 and 3 together give v23.9.2's own resources."""
    assert ob.leftovers([rendered["v22.9.2"]], rendered["v22.9.2"]) == []
    got = ob.leftovers([rendered["v23.9.2"], rendered["v22.9.2"]], rendered["v22.9.2"])
    assert sorted(names(got)) == V23_ONLY


@needs_upstream
def test_the_other_way_round_names_the_template_crd(rendered):
    """v22.9.2's NFD rendered its NodeFeatureRule CRD from a template: a leftover of v22.9.2 -> v23.9.2, which the
    sweep never deletes (owner_verdict)."""
    got = names(ob.leftovers([rendered["v22.9.2"]], rendered["v23.9.2"]))
    assert ("CustomResourceDefinition", "nodefeaturerules.nfd.k8s-sigs.io", None) in got
    assert ("ClusterRole", "gpu-operator-node-feature-discovery-gc", None) not in got
    # v22.9.2 writes the ClusterPolicy's namespace, v23.9.2 does not: the same object, not a leftover
    assert not [n for n in got if n[0] == "ClusterPolicy"], got
    assert ob.owner_verdict({ob.RELEASE_NAME: "gpu-operator", ob.RELEASE_NAMESPACE: NS}, "apiextensions.k8s.io",
                            "CustomResourceDefinition", "gpu-operator", NS).startswith("left: ")


def doc(api: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind,
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})}}


def test_matched_by_group_not_version_and_namespace_as_written():
    old = [doc("policy/v1beta1", "PodDisruptionBudget", "pdb", NS), doc("v1", "ConfigMap", "a"),
           doc("v1", "ConfigMap", "b", "elsewhere"), doc("v1", "ConfigMap", "c", NS)]
    new = [doc("policy/v1", "PodDisruptionBudget", "pdb", NS), doc("v1", "ConfigMap", "a", NS),
           doc("v1", "ConfigMap", "b", NS), doc("v1", "ConfigMap", "c")]
    assert names(ob.leftovers([old], new)) == [("ConfigMap", "b", "elsewhere")]
    # a kind of another group with the same name is another object
    assert names(ob.leftovers([[doc("example.com/v1", "ConfigMap", "a")]], new)) == [("ConfigMap", "a", None)]


def test_an_object_in_two_revisions_is_named_once_as_the_newest_has_it():
    got = ob.leftovers([[doc("policy/v1beta1", "PodDisruptionBudget", "p", NS)],
                        [doc("policy/v1", "PodDisruptionBudget", "p", NS)]], [])
    assert [(r.api_version, r.name) for r in got] == [("policy/v1", "p")]


def test_untrusted_manifest_documents_are_left_out():
    docs: list[Any] = [None, "text", 7, {"kind": "ConfigMap"}, {"apiVersion": "v1", "kind": "ConfigMap",
                                                                 "metadata": {"name": 5}},
                       {"apiVersion": "v1", "kind": "ConfigMap", "metadata": "x"},
                       {"apiVersion": "", "kind": "ConfigMap", "metadata": {"name": "e"}},
                       {"apiVersion": "v1", "kind": "List", "items": [doc("v1", "Secret", "s", NS), "junk"]},
                       {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ok", "namespace": ["x"]}}]
    assert sorted(names(list(ob.manifest_refs(docs)))) == [("ConfigMap", "ok", None), ("Secret", "s", NS)]


OWNED = {ob.RELEASE_NAME: "gpu-operator", ob.RELEASE_NAMESPACE: NS}


@pytest.mark.parametrize(("group", "kind"), [("rbac.authorization.k8s.io", "ClusterRole"), ("apps", "Deployment")])
def test_deleted_only_when_the_release_owns_it(group, kind):
    """A cluster-scoped and a namespaced kind: the release's own is deleted; one annotated for another release (of the
    same name in another namespace, or another name in this one), one with no annotations, one helm keeps: never."""
    assert ob.owner_verdict(OWNED, group, kind, "gpu-operator", NS) == "deleted"
    other_ns = {**OWNED, ob.RELEASE_NAMESPACE: "gpu-operator"}
    assert ob.owner_verdict(other_ns, group, kind, "gpu-operator", NS) == \
        "left: not the release's (meta.helm.sh/release-name/meta.helm.sh/release-namespace: gpu-operator/gpu-operator)"
    assert ob.owner_verdict({**OWNED, ob.RELEASE_NAME: "other"}, group, kind, "gpu-operator", NS) == \
        f"left: not the release's (meta.helm.sh/release-name/meta.helm.sh/release-namespace: {NS}/other)"
    for none in (None, {}, {ob.RELEASE_NAMESPACE: NS}):
        assert ob.owner_verdict(none, group, kind, "gpu-operator", NS).startswith("left: not the release's"), none
    assert ob.owner_verdict({**OWNED, ob.RESOURCE_POLICY: "keep"}, group, kind, "gpu-operator", NS) == \
        "left: helm.sh/resource-policy: keep"


def test_a_namespace_is_never_deleted():
    assert ob.owner_verdict(OWNED, "", "Namespace", "gpu-operator", NS) == \
        "left: a Namespace is never deleted by a rollback"


def test_the_preview_names_what_goes_after_helm():
    from pathlib import Path

    pv = rb.Preview("gpu-operator", NS, HistoryEntry(2, "deployed", "gpu-operator-v23.9.2", "Upgrade complete"),
                    HistoryEntry(1, "superseded", "gpu-operator-v22.9.2", "Install complete"), "the previous revision",
                    [], "operator", Path("/s.json"), None, orphans=[
                        ob.Orphan("rbac.authorization.k8s.io/v1", "ClusterRole", "gc", None, "to be deleted"),
                        ob.Orphan("v1", "ConfigMap", "cm", NS, "left: helm.sh/resource-policy: keep")])
    lines = pv.lines()
    at = lines.index("in the cluster, rendered by a revision after 1 and not by revision 1 (deleted by helm, or after "
                     "it where helm leaves them):")
    assert lines[at + 1:at + 3] == ["  ClusterRole gc: to be deleted",
                                    f"  ConfigMap {NS}/cm: left: helm.sh/resource-policy: keep"]


# ---------------------------------------------------------------- the same leftovers on the forward path: an upgrade
# after a failed one (installer.upgrade.orphans.not_diffed / candidates / after_upgrade, run by operator.install with
# the history read before the upgrade)


def hist(*rows: tuple[int, str, str, str]) -> list[HistoryEntry]:
    """A `helm history` as helm 3 records it: (revision, status, chart version, description)."""
    return [HistoryEntry(r, status, f"gpu-operator-{v}", d) for r, status, v, d in rows]


FAILED = 'Upgrade "gpu-operator" failed: context deadline exceeded'


def reader(rendered, charts: dict[int, str]):
    """manifest(revision) as `helm get manifest` gives it: the real chart of the revision rendered; each read kept."""
    reads: list[int] = []

    def manifest(revision: int) -> list[dict[str, Any]]:
        reads.append(revision)
        return rendered[charts[revision]]

    return manifest, reads


def revs(entries: list[HistoryEntry]) -> list[int]:
    return [h.revision for h in entries]


@needs_upstream
def test_an_upgrade_back_after_a_failed_one_sweeps_what_the_failed_revision_made(rendered):
    """v22.9.2 deployed, the upgrade to v23.9.2 failed (revision 2: its NFD gc objects were created), then the site goes
    back to v22.9.2: helm's upgrade (revision 3) diffs against revision 1 only -- revision 2's own resources are the
    sweep's; revision 2's and 3's manifests are read."""
    before = hist((1, "deployed", "v22.9.2", "Install complete"), (2, "failed", "v23.9.2", FAILED))
    manifest, reads = reader(rendered, {2: "v23.9.2", 3: "v22.9.2"})
    base, skipped, found = ob.candidates(before, 3, manifest)
    assert (base, revs(skipped), sorted(reads)) == (1, [2], [2, 3])
    assert sorted(names(found)) == V23_ONLY


@needs_upstream
def test_two_failed_tries_count_and_an_upgrade_forward_leaves_nothing(rendered):
    before = hist((1, "deployed", "v22.9.2", "Install complete"), (2, "failed", "v23.9.2", FAILED),
                  (3, "failed", "v23.9.2", FAILED))
    manifest, _ = reader(rendered, {2: "v23.9.2", 3: "v23.9.2", 4: "v22.9.2"})
    base, skipped, found = ob.candidates(before, 4, manifest)
    assert (base, revs(skipped)) == (1, [2, 3]) and sorted(names(found)) == V23_ONLY
    # the failed v23.9.2 upgrade retried and deployed: the new revision has all of it, nothing is a leftover
    manifest, _ = reader(rendered, {2: "v23.9.2", 3: "v23.9.2"})
    assert ob.candidates(before[:2], 3, manifest) == (1, before[1:2], [])


@needs_upstream
def test_after_a_refused_helm_rollback_the_superseded_revision_counts(rendered):
    """upgrade rollback's refused `helm rollback` (revision 3 failed, with v22.9.2's manifest; helm marked revision 2
    superseded: none is deployed), then `operator install` of v22.9.2: helm's upgrade diffs against the failed
    revision 3, never against v23.9.2's revision 2 -- whose own resources are the sweep's."""
    before = hist((1, "superseded", "v22.9.2", "Install complete"), (2, "superseded", "v23.9.2", "Upgrade complete"),
                  (3, "failed", "v22.9.2", 'Rollback "gpu-operator" failed: no CustomResourceDefinition with the name '
                                           '"nodefeaturerules.nfd.k8s-sigs.io" found'))
    manifest, reads = reader(rendered, {2: "v23.9.2", 3: "v22.9.2", 4: "v22.9.2"})
    base, skipped, found = ob.candidates(before, 4, manifest)
    assert (base, revs(skipped), sorted(reads)) == (None, [2, 3], [2, 3, 4])
    assert sorted(names(found)) == V23_ONLY


@needs_upstream
def test_a_pending_revision_rolled_back_first_is_looked_at(rendered):
    """Revision 2 left pending-upgrade by an interrupted run: the next run rolls it back (revision 3, helm's rollback
    diffing against revision 2) and upgrades (4). Revision 2 counts -- what helm's rollback deleted is simply not
    found in the cluster."""
    before = hist((1, "deployed", "v22.9.2", "Install complete"), (2, "pending-upgrade", "v23.9.2", "Preparing upgrade"))
    manifest, _ = reader(rendered, {2: "v23.9.2", 4: "v22.9.2"})
    base, skipped, found = ob.candidates(before, 4, manifest)
    assert (base, revs(skipped)) == (1, [2]) and sorted(names(found)) == V23_ONLY


@pytest.mark.parametrize(("before", "new", "base"), [
    # no release before: a first install
    (None, 1, None),
    ([], 1, None),
    # a clean upgrade (helm 3.18 leaves a pending revision rolled back labelled pending-upgrade: before the deployed
    # one, it is not looked at)
    ([(1, "superseded", "v22.9.2", "Install complete"), (2, "pending-upgrade", "v23.9.2", "Preparing upgrade"),
      (3, "deployed", "v22.9.2", "Rollback to 1")], 4, 3),
    # a failed revision before the deployed one: an earlier upgrade's sweep took care of it
    ([(1, "superseded", "v22.9.2", "Install complete"), (2, "failed", "v23.9.2", FAILED),
      (3, "deployed", "v22.9.2", "Upgrade complete")], 4, 3),
    # a pending install, uninstalled first and installed anew: the revision numbers start again, nothing is older
    ([(1, "pending-install", "v23.9.2", "Initial install underway")], 1, None),
])
def test_nothing_to_look_at_reads_no_manifest(before, new, base):
    def manifest(revision: int) -> list[dict[str, Any]]:
        raise AssertionError(f"manifest of revision {revision} read")

    assert ob.candidates(hist(*before) if before is not None else None, new, manifest) == (base, [], [])


def test_after_upgrade_with_a_clean_history_calls_nothing(monkeypatch):
    """A clean history (helm.install_or_upgrade reads none when the last revision is deployed; here one with a failed
    revision before the deployed one): no helm call, no API call (the client is an object without any method),
    nothing said."""
    from installer import helm

    def no_call(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("helm called")

    monkeypatch.setattr(helm, "release_history", no_call)
    monkeypatch.setattr(helm, "revision_manifest", no_call)
    said: list[str] = []
    before = hist((1, "superseded", "v22.9.2", "Install complete"), (2, "failed", "v23.9.2", FAILED),
                  (3, "deployed", "v22.9.2", "Upgrade complete"))
    for history in (None, before):
        swept = ob.after_upgrade("gpu-operator", NS, history, 4, None, object(), said.append)
        assert (swept.skipped, swept.orphans, swept.summary()) == ([], [], "")
    assert said == [] and swept.base == 3


def test_the_operator_report_names_what_was_swept():
    from installer.helm import ReleaseState
    from installer.operator import InstallReport

    swept = ob.Swept(1, hist((2, "failed", "v23.9.2", FAILED)), [
        ob.Orphan("rbac.authorization.k8s.io/v1", "ClusterRole", "gc", None, "deleted"),
        ob.Orphan("apps/v1", "Deployment", "gc", NS, "deleted"),
        ob.Orphan("v1", "ConfigMap", "cm", NS, "left: helm.sh/resource-policy: keep")])
    report = InstallReport(ReleaseState("gpu-operator", NS, 3, "deployed", "gpu-operator-v22.9.2", changed=True),
                           NS, "unchanged", None, "none", 1.0, [], swept)
    lines = report.lines()
    assert lines[-5:-1] == [
        "not in the release's revision any more: ClusterRole gc: deleted",
        f"not in the release's revision any more: Deployment {NS}/gc: deleted",
        f"not in the release's revision any more: ConfigMap {NS}/cm: left: helm.sh/resource-policy: keep",
        "release gpu-operator (gpu-operator-v22.9.2): revision 3 deployed; 2 leftover(s) of failed revision 2 "
        "deleted, 1 left"]
    # apply's operator stage shows lines()[-2] in its table and its JSON's stages[].reason
    assert lines[-2].endswith("2 leftover(s) of failed revision 2 deleted, 1 left")
    # nothing swept: the release line as before
    report.swept = ob.Swept(2, [], [])
    assert report.lines()[-2] == "release gpu-operator (gpu-operator-v22.9.2): revision 3 deployed"


def test_a_crd_or_namespace_is_never_deleted_by_the_upgrade_sweep():
    assert ob.owner_verdict(OWNED, "apiextensions.k8s.io", "CustomResourceDefinition", "gpu-operator", NS,
                            "the sweep") == "left: a CustomResourceDefinition is never deleted by the sweep"
    assert ob.owner_verdict(OWNED, "", "Namespace", "gpu-operator", NS, "the sweep").startswith("left: ")


@pytest.mark.parametrize(("status", "reads"), [("deployed", 0), ("failed", 1), ("superseded", 1)])
def test_helm_reads_the_history_before_the_upgrade_only_when_the_last_revision_is_not_deployed(monkeypatch, status,
                                                                                                reads):
    """installer.helm._proceedable() (install_or_upgrade's first step) with the release's last revision in each
    status: `helm history` is read once when it is not deployed, never when it is (the clean path's helm calls stay
    as they were)."""
    import asyncio
    from types import SimpleNamespace

    from installer import helm

    history = hist((1, "deployed", "v22.9.2", "Install complete"), (2, "failed", "v23.9.2", FAILED))
    calls: list[str] = []

    async def read_history(*args: Any, **kwargs: Any) -> list[HistoryEntry]:
        calls.append("history")
        return history

    async def current_revision(name: str, namespace: str) -> Any:
        return SimpleNamespace(status=status, revision=2)

    monkeypatch.setattr(helm, "_history", read_history)
    rev, recovered, before = asyncio.run(helm._proceedable(SimpleNamespace(get_current_revision=current_revision),
                                                           "gpu-operator", NS, 30, None))
    assert (rev.status, recovered, len(calls)) == (status, "", reads)
    assert before == (history if reads else None)
