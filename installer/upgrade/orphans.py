"""What a Helm release's earlier revisions rendered that its new revision lacks and helm itself never deletes: found in
the cluster, deleted when the release owns it (docs/upgrade.md step 3 of upgrade rollback and "Rolling back";
docs/operator.md install step 6).

Helm deletes, on an upgrade or a rollback, what the revision it diffs against rendered and the new one does not. That
revision is not always the one whose resources are in the cluster:

- `helm upgrade` diffs against the last DEPLOYED revision. A failed upgrade (revision N failed: it timed out, a
  resource was refused) created what it could; the next upgrade, from the deployed revision before it, never looks at
  N's manifest, so what only N rendered stays -- annotated with the release, and outliving its uninstall. With no
  deployed revision (a failed rollback marks the one it started from superseded) it diffs against the last one,
  missing the superseded revision's. after_upgrade() is the sweep for these (installer.operator.install: `operator
  install`, apply's operator stage, `upgrade apply`), from the history read before the upgrade (not_diffed()).
- `helm rollback` diffs against the release's LAST revision: after a refused rollback (a failed revision holding the
  target's manifest) the newer chart's own resources stay (installer.upgrade.rollback).

A revision left pending-upgrade by an interrupted run is rolled back first (installer.helm._proceedable()), and helm's
rollback diffs against that pending revision, deleting what only it rendered; it is looked at all the same (cheap:
what is gone is not there).

The sweep deletes a resource only when its meta.helm.sh/release-name and -namespace annotations name this release, no
helm.sh/resource-policy: keep holds it, and it is not a CRD or a Namespace; anything else is left and named. Each
deletion and each object left is said as it goes (`not in the release's revision any more: KIND NAME: ACTION`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from installer.helm import HistoryEntry

Progress = Callable[[str], None]

#: the annotations helm writes on every resource of a release (and checks before it adopts one)
RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"
#: helm keeps a resource so annotated on upgrade and uninstall; so does the sweep
RESOURCE_POLICY = "helm.sh/resource-policy"
#: never deleted by the sweep: a CRD's deletion takes every custom resource of it (CRDs are never downgraded), a
#: Namespace's everything in it
NEVER_DELETED = frozenset({("apiextensions.k8s.io", "CustomResourceDefinition"), ("", "Namespace")})
#: the statuses of a revision whose resources helm's next upgrade does not diff against (after the deployed one)
NOT_DIFFED = frozenset({"failed", "pending-install", "pending-upgrade", "pending-rollback"})


@dataclass(frozen=True, order=True)
class ObjRef:
    """A resource as a manifest names it. namespace: as written (None: not written -- helm then uses the release's
    namespace for a namespaced kind; a cluster-scoped kind has none)."""

    api_version: str
    kind: str
    name: str
    namespace: str | None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0] if "/" in self.api_version else ""

    def show(self, namespace: str | None = None) -> str:
        """`Kind name` (cluster-scoped) or `Kind namespace/name`."""
        return f"{self.kind} {namespace}/{self.name}" if namespace else f"{self.kind} {self.name}"


def manifest_refs(docs: list[Any]) -> set[ObjRef]:
    """The resources of a stored manifest (helm get manifest): untrusted, so a document without a string apiVersion,
    kind and metadata.name is left out (a List's items are taken one by one)."""
    out: set[ObjRef] = set()
    for d in docs:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("kind"), str) and d["kind"].endswith("List") and isinstance(d.get("items"), list):
            out |= manifest_refs(d["items"])
            continue
        meta = d.get("metadata")
        api, kind = d.get("apiVersion"), d.get("kind")
        name = meta.get("name") if isinstance(meta, dict) else None
        ns = meta.get("namespace") if isinstance(meta, dict) else None
        if isinstance(api, str) and isinstance(kind, str) and isinstance(name, str) and api and kind and name:
            out.add(ObjRef(api, kind, name, ns if isinstance(ns, str) and ns else None))
    return out


def leftovers(older: list[list[Any]], target: list[Any]) -> list[ObjRef]:
    """What the manifests of the older revisions (the revisions rolled back from, or the failed ones an upgrade did
    not diff against; oldest first) have and the target revision's manifest lacks (pure): what a helm upgrade from the
    newest of them would have deleted. Matched by API group (not version: a chart may move a kind from v1beta1 to
    v1), kind, name and namespace; a namespace not written on either side matches any (cluster-scoped kinds carry
    none, and a namespaced one not written is the release's), so that nothing the target has is ever taken for a
    leftover."""
    keep: dict[tuple[str, str, str], set[str | None]] = {}
    for r in manifest_refs(target):
        keep.setdefault((r.group, r.kind, r.name), set()).add(r.namespace)
    out: dict[tuple[str, str, str, str | None], ObjRef] = {}
    for docs in reversed(older):  # the newest first: an object in two revisions is named as it has it
        for r in sorted(manifest_refs(docs)):
            have = keep.get((r.group, r.kind, r.name))
            if have is not None and (r.namespace is None or None in have or r.namespace in have):
                continue
            out.setdefault((r.group, r.kind, r.name, r.namespace), r)
    return sorted(out.values())


def owner_verdict(annotations: Mapping[str, Any] | None, group: str, kind: str, release: str,
                  namespace: str, by: str = "a rollback") -> str:
    """What the sweep does with a leftover found in the cluster (pure): `deleted` only when its meta.helm.sh
    annotations name this release in this namespace, nothing keeps it (helm.sh/resource-policy: keep) and it is not a
    CRD or a Namespace; else `left: <why>` (by: what never deletes a CRD or Namespace, in those words)."""
    a = annotations or {}
    if (a.get(RELEASE_NAME), a.get(RELEASE_NAMESPACE)) != (release, namespace):
        owner = f"{a.get(RELEASE_NAMESPACE)}/{a.get(RELEASE_NAME)}" if a.get(RELEASE_NAME) else "no release"
        return f"left: not the release's ({RELEASE_NAME}/{RELEASE_NAMESPACE}: {owner})"
    if str(a.get(RESOURCE_POLICY, "")).strip() == "keep":
        return f"left: {RESOURCE_POLICY}: keep"
    if (group, kind) in NEVER_DELETED:
        return f"left: a {kind} is never deleted by {by}"
    return "deleted"


@dataclass
class Orphan:
    """A resource of an earlier revision that the release's new revision does not have, found in the cluster, and
    what the sweep did with it."""

    api_version: str
    kind: str
    name: str
    namespace: str | None  # None: cluster-scoped
    action: str  # deleted | to be deleted (a preview) | left: <why>

    def line(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}: {self.action}"

    def to_json(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "namespace": self.namespace,
                "action": self.action}


@dataclass(frozen=True)
class Context:
    """How the sweep's messages name its case: what a candidate is, what is done already (an error's hint starts with
    it), and what never deletes a CRD or a Namespace."""

    leftover_of: str = "the revisions rolled back from"
    done: str = "helm's part of the rollback is done (do not run it again)"
    by: str = "a rollback"


ROLLBACK = Context()


def sweep(client: Any, release: str, namespace: str, candidates: list[ObjRef], say: Progress,
          dry_run: bool = False, context: Context = ROLLBACK) -> list[Orphan]:
    """Each leftover that is in the cluster: deleted when owner_verdict() says so (each one said as it goes), else
    left and said why; with dry_run nothing is deleted (`to be deleted`: the preview). A kind the cluster does not
    serve, or an object not there, is nothing to do. ClusterError when the API server fails a read or a delete (what
    was deleted until then is said)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    from installer.errors import ClusterError

    dyn = DynamicClient(client)  # type: ignore[no-untyped-call]
    out: list[Orphan] = []
    for ref in candidates:
        try:
            res = dyn.resources.get(api_version=ref.api_version, kind=ref.kind)
        except ResourceNotFoundError:
            continue
        ns = (ref.namespace or namespace) if res.namespaced else None
        what = ref.show(ns)
        try:
            obj = res.get(name=ref.name, namespace=ns) if ns else res.get(name=ref.name)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise ClusterError(f"read {what} (a leftover of {context.leftover_of}) failed: HTTP "
                               f"{exc.status} {exc.reason}", hint=f"{context.done}: check the object's "
                               "meta.helm.sh annotations and kubectl delete it") from None
        action = owner_verdict(dict(obj.metadata.annotations or {}), ref.group, ref.kind, release, namespace,
                               context.by)
        if action == "deleted" and dry_run:
            action = "to be deleted"
        elif action == "deleted":
            try:
                if ns:
                    res.delete(name=ref.name, namespace=ns, body={"propagationPolicy": "Background"})
                else:
                    res.delete(name=ref.name, body={"propagationPolicy": "Background"})
            except ApiException as exc:
                if exc.status != 404:
                    raise ClusterError(f"delete {what} (a leftover of {context.leftover_of}) failed: HTTP "
                                       f"{exc.status} {exc.reason}", hint=f"{context.done}: check RBAC, then "
                                       "kubectl delete it") from None
        orphan = Orphan(ref.api_version, ref.kind, ref.name, ns, action)
        say(f"not in the release's revision any more: {orphan.line()}")
        out.append(orphan)
    return out


# ---------------------------------------------------------------- after a helm upgrade (installer.operator.install)


def not_diffed(before: list[HistoryEntry] | None, new_revision: int) -> tuple[int | None, list[HistoryEntry]]:
    """(the deployed revision helm's upgrade diffed against, or None when there was none; the revisions whose
    resources may be in the cluster and which that diff does not cover), from the release's history read BEFORE the
    upgrade made new_revision (pure; helm marks the revisions superseded afterwards, so it is read before).

    helm upgrade diffs against the last deployed revision. The revisions after it are failed (an upgrade's, a
    rollback's) or pending (left by an interrupted run; installer.helm._proceedable() rolls that back first, and
    helm's rollback diffs against the pending revision itself -- so it is looked at, and what it had is usually gone
    already): each may have created what the new revision lacks. When no revision is deployed (a failed helm
    rollback marks the one it started from superseded) helm diffs against the last one, so the newest superseded
    revision counts too. A clean history (the newest revision deployed) gives none; so does no history, and one the
    new revision does not follow (the release uninstalled and installed anew: a pending install recovered)."""
    if not before or new_revision <= max(h.revision for h in before):
        return None, []
    ordered = sorted(before, key=lambda h: h.revision)
    kept = [h for h in ordered if h.status in ("deployed", "superseded")]
    base = kept[-1] if kept else None
    after = [h for h in ordered if base is None or h.revision > base.revision]
    if base is not None and base.status == "deployed":
        return base.revision, after
    return None, ([base] if base is not None and after else []) + after


def candidates(before: list[HistoryEntry] | None, new_revision: int,
               manifest: Callable[[int], list[dict[str, Any]]]) -> tuple[int | None, list[HistoryEntry], list[ObjRef]]:
    """not_diffed(), and what the revisions it names rendered and new_revision lacks (leftovers()): manifest(revision)
    is read for those revisions and new_revision only -- never when there are none."""
    base, skipped = not_diffed(before, new_revision)
    if not skipped:
        return base, [], []
    docs = [manifest(h.revision) for h in skipped]
    return base, skipped, leftovers(docs, manifest(new_revision))


@dataclass
class Swept:
    """What after_upgrade() found and did."""

    base: int | None  # the deployed revision helm upgrade diffed against (None: none was deployed)
    skipped: list[HistoryEntry]  # the revisions that diff did not cover (not_diffed())
    orphans: list[Orphan]

    def summary(self) -> str:
        """`2 leftover(s) of failed revision 3 deleted, 1 left` ("" when nothing was found)."""
        if not self.orphans:
            return ""
        deleted = sum(o.action == "deleted" for o in self.orphans)
        left = len(self.orphans) - deleted
        revs = ", ".join(f"{h.status} revision {h.revision}" for h in self.skipped)
        return f"{deleted} leftover(s) of {revs} deleted" + (f", {left} left" if left else "")


def after_upgrade(release: str, namespace: str, before: list[HistoryEntry] | None, new_revision: int,
                  kubeconfig: Path | None, client: Any, say: Progress) -> Swept:
    """After a helm upgrade that made new_revision, given the history read before it: when revisions that helm's diff
    did not cover are there (not_diffed()), their manifests and the new revision's are read (`helm get manifest
    --revision`) and what only they rendered is swept (sweep(): deleted only when the release owns it). A clean
    history costs nothing here (no helm call, no API call)."""
    from installer import helm

    base, skipped = not_diffed(before, new_revision)
    if not skipped:
        return Swept(base, [], [])
    revs = ", ".join(f"{h.revision} ({h.status})" for h in skipped)
    against = (f"helm upgrade diffed revision {new_revision} against the deployed revision {base}, not against"
               if base is not None else f"no revision was deployed: helm upgrade's diff for revision {new_revision} "
                                        "did not cover all of")
    say(f"release {release}: {against} revision(s) {revs}: what they rendered and revision {new_revision} lacks is "
        "looked for in the cluster")
    _, _, found = candidates(before, new_revision, lambda r: helm.revision_manifest(release, namespace, r, kubeconfig))
    context = Context(leftover_of=f"revision(s) {', '.join(str(h.revision) for h in skipped)}",
                      done=f"the upgrade is done (revision {new_revision})", by="the sweep")
    return Swept(base, skipped, sweep(client, release, namespace, found, say, context=context))
