"""The sharing stage's shape, shared by the features installed as a Helm release of their own plus a node label on
the GPU nodes (gpumanager, hami, nos): the pull Secret in the release's namespace, `helm upgrade --install`, the
label, then a wait until the feature's DaemonSet runs on every labelled node and its Deployment is available;
apply --check previews the same; uninstall removes release, label and the Secret gpu-install made."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from installer.config import Site
from installer.errors import ConfigError, PreflightError
from installer.features.base import Chart, Feature, Progress, StageResult, StageRun, site_images

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.plan import Plan


@dataclass
class Report:
    release: str
    namespace: str
    changed: bool
    revision: int | None
    label: tuple[str, str]
    labelled: list[str] = field(default_factory=list)
    secret: str = "none"
    seconds: float = 0.0

    def lines(self) -> list[str]:
        return [f"release {self.release} in {self.namespace}: revision {self.revision}"
                + (" (changed)" if self.changed else " (unchanged)"),
                f"label {self.label[0]}={self.label[1]} set on {len(self.labelled)} node(s)"
                + (f" ({', '.join(self.labelled)})" if self.labelled else ""),
                f"done in {self.seconds:.1f}s"]


class ReleaseFeature(Feature):
    """A feature installed by the sharing stage: subclasses give the release's coordinates, chart and values."""

    stage: ClassVar[str | None] = "sharing"
    title: ClassVar[str] = ""  # what the stage line calls it, e.g. "HAMi"
    chart_field: ClassVar[str] = ""  # the site field naming an upstream chart (e.g. sharing.hami.chart); "": our own
    chart_label: ClassVar[str] = ""  # how the mirror plan names that upstream chart (e.g. "HAMi chart")

    def sources(self, site: Site) -> dict[str, str]:
        """Its images: component -> upstream reference."""
        raise NotImplementedError

    def upstream_chart(self, site: Site) -> tuple[str, str, str]:
        """(name, version, upstream repository) of the upstream chart the mirror carries (with a chart_label)."""
        raise NotImplementedError

    def images(self, site: Site) -> list[Image]:
        return site_images(site, self.sources(site))

    def charts(self, site: Site) -> list[Chart]:
        if not self.chart_label:
            return []
        name, version, repository = self.upstream_chart(site)
        return [Chart(name, version, repository, self.chart_label)]

    def namespace(self, site: Site) -> str:
        raise NotImplementedError

    def release_name(self, site: Site) -> str:
        raise NotImplementedError

    def node_label(self, site: Site) -> tuple[str, str]:
        raise NotImplementedError

    def release_chart(self, site: Site) -> str | Path:
        """The chart the stage installs (ConfigError, exit 2, when the site names none)."""
        raise NotImplementedError

    def release_values(self, site: Site) -> dict[str, Any]:
        raise NotImplementedError

    def workloads(self, site: Site) -> tuple[str, str]:
        """(the DaemonSet that must run on every labelled node, the Deployment that must be available)."""
        raise NotImplementedError

    def stage_nodes(self, plan: Plan) -> list[str]:
        """The Kubernetes Nodes the stage labels: every GPU node of the plan."""
        return [n.node_name for n in plan.nodes]

    def after_release(self, client: Any, site: Site, namespace: str, release: str) -> list[str]:
        """Anything the chart cannot do by values, after the release (lines to say)."""
        return []

    def destinations(self, site: Site) -> dict[str, str]:
        return {i.component: i.destination for i in self.images(site)}

    # ---- apply

    def check_stage_inputs(self, site: Site) -> None:
        """The stage's chart is there (exit 2 before any host): an upstream chart given as a local path exists."""
        ref = self.release_chart(site)
        if isinstance(ref, str) and "://" not in ref and not Path(ref).exists():
            raise ConfigError(f"{self.chart_field} {ref}: no such file or directory",
                              hint=f"give the {self.name}-<version>.tgz of the bundle (BUNDLE/charts/) or the oci:// "
                                   "reference `gpu-install mirror push` printed")

    def cluster_conflicts(self, plan: Plan, client: Any, operator_namespace: str | None = None) -> list[str]:
        """Read-only: what in the cluster contradicts it, each with its fix."""
        return []

    def check_cluster(self, plan: Plan, client: Any, say: Progress) -> Any:
        found = self.cluster_conflicts(plan, client, plan.site.operator.namespace)
        if found:
            raise PreflightError(f"{self.what(plan.site)} conflicts with the cluster:\n    "
                                 + "\n    ".join(found), hint="fix these first; nothing was changed on any host")
        return None

    def apply(self, run: StageRun) -> StageResult:
        run.say(f"stage sharing: {self.title}" + (" (check mode)" if run.check else ""))
        if run.check:
            changed, what = self.preview(run.plan, run.kubeconfig)
            return StageResult("would change" if changed else "unchanged", what)
        rep = self.install(run.plan, run.kubeconfig, timeout=run.timeout, wait=run.wait,
                           progress=lambda m: run.say(f"sharing: {m}"))
        return StageResult("changed" if rep.changed else "unchanged", "; ".join(rep.lines()[:2]))

    def install(self, plan: Plan, kubeconfig: Path, timeout: float = 300, wait: bool = True,
                progress: Progress | None = None) -> Report:
        """Pull Secret in the namespace, `helm upgrade --install` of the chart, then the node label on every node of
        stage_nodes() (the DaemonSet starts there), then a wait until that runs on every node and the Deployment is
        available."""
        from installer import helm, kube

        say = progress or (lambda _m: None)
        t0 = time.monotonic()
        site = plan.site
        ns, rel, label = self.namespace(site), self.release_name(site), self.node_label(site)
        chart = self.release_chart(site)
        client = kube.api_client(kubeconfig)
        kube.ensure_namespace(client, ns, timeout=timeout)
        secret = "none"
        if site.registry.pullSecret:
            secret = kube.ensure_secret(client, kube.pull_secret_body(site.registry, ns))
            say(f"pull secret {ns}/{site.registry.pullSecret.name}: {secret}")
        say(f"helm upgrade --install {rel} {chart} -n {ns}" + (f" (wait up to {timeout:.0f}s)" if wait else ""))
        # no --wait on helm: the device plugin's pods only start once the nodes are labelled, below; rollout() waits
        state = helm.install_or_upgrade(chart, rel, ns, self.release_values(site), kubeconfig, timeout=timeout,
                                        wait=False)
        for line in self.after_release(client, site, ns, rel):
            say(line)
        labelled = []
        for node in self.stage_nodes(plan):
            current = kube.node_labels(client, [node]).get(node)
            if current is None:
                raise ConfigError(f"no Node {node} in the cluster for GPU host {node}",
                                  hint="join the node, or set gpu_install_node_name to its Kubernetes name")
            if current.get(label[0]) != label[1]:
                kube.set_node_label(client, node, *label)
                labelled.append(node)
        if wait:
            self.rollout(client, site, self.stage_nodes(plan),
                         timeout=max(30.0, timeout - (time.monotonic() - t0)), progress=say)
        return Report(rel, ns, bool(state.changed) or bool(labelled), state.revision, label, labelled, secret,
                      time.monotonic() - t0)

    def preview(self, plan: Plan, kubeconfig: Path) -> tuple[bool, str]:
        """apply --check: (would change, what) for the release and the node labels, read-only."""
        from installer import helm, kube

        site = plan.site
        ns, rel, label = self.namespace(site), self.release_name(site), self.node_label(site)
        rp = helm.plan_release(self.release_chart(site), rel, ns, self.release_values(site), kubeconfig)
        labels = kube.node_labels(kube.api_client(kubeconfig), self.stage_nodes(plan))
        todo = sorted(n for n, ls in labels.items() if ls is None or ls.get(label[0]) != label[1])
        what = f"release {rel} in {ns}: {'would ' + rp.action if rp.action != 'unchanged' else 'unchanged'}; " + (
            f"would label {', '.join(todo)} {label[0]}={label[1]}" if todo else "node labels in place")
        return rp.action != "unchanged" or bool(todo), what

    def rollout(self, client: Any, site: Site, nodes: list[str], timeout: float, progress: Progress,
                poll: float = 1.0) -> None:
        """Wait until the DaemonSet runs a pod on every node and the Deployment is available; a pod that cannot
        pull its image ends the wait with the kubelet's message."""
        from kubernetes import client as k

        from installer.errors import ClusterError

        core: Any = k.CoreV1Api(client)
        apps: Any = k.AppsV1Api(client)
        ns = self.namespace(site)
        daemon, deployment = self.workloads(site)
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            pods = [p for p in core.list_namespaced_pod(ns).items
                    if p.metadata.name.startswith((daemon + "-", deployment + "-"))]
            running = {p.spec.node_name for p in pods
                       if p.metadata.name.startswith(daemon + "-") and p.status.phase == "Running"}
            try:
                dep = apps.read_namespaced_deployment(deployment, ns)
                ready = (dep.status.available_replicas or 0) >= 1
            except k.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
                ready = False
            missing = sorted(set(nodes) - running)
            stuck = []
            for p in pods:
                for st in (p.status.container_statuses or []) + (p.status.init_container_statuses or []):
                    w = st.state.waiting if st.state else None
                    if w and w.reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                                          "CreateContainerConfigError"):
                        stuck.append(f"{p.metadata.name} on {p.spec.node_name}: {w.reason} {w.message or ''}".strip())
            if not missing and ready:
                progress(f"{daemon} running on {len(nodes)} node(s), {deployment} available")
                return
            state = (f"{daemon} missing on {', '.join(missing) or 'none'}; "
                     f"{deployment} {'ready' if ready else 'not ready'}")
            if state != last:
                progress(state)
                last = state
            if time.monotonic() > deadline or any("ImagePull" in s or "InvalidImage" in s for s in stuck):
                raise ClusterError(f"sharing: {state}" + (f" ({'; '.join(stuck[:5])})" if stuck else "")
                                   + f" after {timeout - max(0.0, deadline - time.monotonic()):.0f}s",
                                   hint=f"kubectl -n {ns} get pods -o wide; images: gpu-install mirror push; the pull "
                                        "Secret")
            time.sleep(poll)

    def removal(self, plan: Plan) -> str:
        site = plan.site
        sns, label = self.namespace(site), self.node_label(site)
        return (f"Helm release {self.release_name(site)} ({self.name}) in namespace {sns}, the node label {label[0]} "
                "from the GPU nodes"
                + (f", pull Secret {sns}/{site.registry.pullSecret.name} (only if gpu-install made it)"
                   if site.registry.pullSecret and sns != site.operator.namespace else ""))

    def uninstall(self, plan: Plan, kubeconfig: Path, timeout: float = 300,
                  progress: Progress | None = None) -> list[str]:
        """The Helm release, the node label from the GPU nodes, the pull Secret (only if gpu-install made it)."""
        from installer import helm, kube

        say = progress or (lambda _m: None)
        site = plan.site
        ns, rel, label = self.namespace(site), self.release_name(site), self.node_label(site)
        client = kube.api_client(kubeconfig)
        done = []
        if helm.uninstall(rel, ns, kubeconfig, timeout=timeout):
            done.append(f"Helm release {rel} in {ns} removed")
        labels = kube.node_labels(client, self.stage_nodes(plan))
        unlabelled = [n for n, ls in labels.items() if ls is not None and label[0] in ls]
        for node in unlabelled:
            kube.set_node_label(client, node, label[0], None)
        if unlabelled:
            done.append(f"label {label[0]} removed from {', '.join(sorted(unlabelled))}")
        ps = site.registry.pullSecret
        if ps and ns != site.operator.namespace and kube.delete_secret_if_ours(client, ns, ps.name):
            done.append(f"pull Secret {ns}/{ps.name} removed")
        for line in done:
            say(line)
        return done


class SharingMode(ReleaseFeature):
    """A release feature that is a value of sharing.mode: its name."""

    def requested(self, site: Site) -> bool:
        return site.sharing.mode == self.name

    def what(self, site: Site) -> str:
        return f"sharing.mode {self.name}"


def advertised_elsewhere(feature: ReleaseFeature, plan: Plan, client: Any, operator_namespace: str,
                         again: str) -> list[str]:
    """GPU nodes where something other than the GPU Operator's device plugin (which this apply turns off) or the
    feature's own (from an earlier apply) advertises nvidia.com/gpu: the feature would hand out the same GPUs again."""
    from kubernetes import client as k

    from installer import kube

    site = plan.site
    out = []
    core: Any = k.CoreV1Api(client)
    names = [n.node_name for n in plan.nodes]
    objs = {n.metadata.name: n for n in kube._call("list the nodes", lambda: core.list_node().items)}
    for name in names:
        node = objs.get(name)
        if node is None:
            continue
        try:
            gpus = int((node.status.allocatable or {}).get("nvidia.com/gpu", "0"))
        except ValueError:
            gpus = 0
        if gpus <= 0:
            continue
        selector = f"spec.nodeName={name}"
        pods = kube._call(f"list the pods on {name}",
                          lambda: core.list_pod_for_all_namespaces(field_selector=selector).items)  # noqa: B023
        operator_plugin = any(p.metadata.namespace == operator_namespace and "device-plugin" in p.metadata.name
                              for p in pods)
        own = any(p.metadata.namespace == feature.namespace(site)
                  and p.metadata.name.startswith(feature.release_name(site))
                  and "device-plugin" in p.metadata.name for p in pods)  # the feature's own, from an earlier apply
        if operator_plugin or own:
            continue  # the operator's: this apply disables it (components.devicePlugin.enabled false)
        others = sorted(f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if "device-plugin" in p.metadata.name)
        by = f"pod(s) {', '.join(others)}" if others else "a device plugin outside Kubernetes (no pod of it on the node)"
        out.append(f"node {name} already advertises {gpus} nvidia.com/gpu, by {by}: {site.sharing.mode} would hand "
                   f"out the same GPUs again {again}: remove that device plugin from the node first")
    return out


def whole_gpu_conflicts(plan: Plan, who: str, plugin: str, own: list[str]) -> list[str]:
    """Site conflicts of a feature that shares whole GPUs through a device plugin of its own (gpumanager, hami), each
    with its fix: the operator's device plugin (plugin: how the feature's advertises the GPUs), the feature's own
    (own), time-slicing/MPS, MIG layouts."""
    site = plan.site
    out = []
    dp = plan.components.get("devicePlugin")
    if dp is not None and plan.deployed(dp):
        out.append("the GPU Operator's NVIDIA device plugin would run on the GPU nodes too and advertise the same GPUs "
                   f"as nvidia.com/gpu, {plugin}: set components.devicePlugin.enabled: false")
    out += own
    method, replicas, _ = site.devicePlugin.sharing()
    if replicas > 1:
        out.append(f"devicePlugin.{method}.replicas {replicas}: time-slicing and MPS are the NVIDIA device plugin's, "
                   f"which does not run with {who}: set the replicas to 0")
    migs = sorted({a.node for a in plan.mig})
    if site.mig.config or migs:
        where = f" (nodes {', '.join(migs)})" if migs else ""
        out.append(f"a MIG layout is set{where}: {who} shares whole GPUs here (gpu-install does not drive MIG "
                   "under it): drop mig.config / gpu_install_mig_config")
    return out
