"""One batch of `gpu-install upgrade apply` with `driver.mode host|runfile`: the host driver changes under running
workloads, so the nodes are taken out of service first and given back only once validated.

Per batch (installer.upgrade.apply calls run_batch, recording each step in the state file first):
  cordon (a node cordoned before the upgrade -- state.nodes[*].cordonedBefore -- stays cordoned at the end) →
  drain through `mig apply`'s drain (installer.mig_rollout.Rollout: the Eviction API, so PodDisruptionBudgets are
  honoured; a refused eviction is retried until --drain-timeout; the pods that use the GPU, or every pod but DaemonSet
  and mirror pods when the plan says host-reboot) → the driver role (playbooks/site.yml --tags driver, --limit the
  batch's hosts: the play apply runs) → when the plan says host-reboot: the role reboots per driver.rebootPolicy and
  this waits (a watch on the Node, no polling sleep) until the kubelet reports a new boot ID and Ready → validate the
  batch (node, runtime and smoke layers on the batch's nodes) → uncordon.

A failure leaves the batch's nodes cordoned (they are named) and raises: a drain that does not finish, a failed driver
role or a node that does not come back is HostFailures (exit 4); validate findings ValidationFindings (exit 6), an
unreachable node HostsUnreachable (exit 5).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from installer import kube
from installer.errors import HostFailures, HostsUnreachable, ValidationFindings

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.progress import Display

Progress = Callable[[str], None]
#: what the batch's validation runs (the cluster-wide layers are for `gpu-install validate`)
LAYERS = ("node", "runtime", "smoke")


def boot_id(node: Any) -> str | None:
    info = getattr(getattr(node, "status", None), "node_info", None)
    value = getattr(info, "boot_id", None)
    return value if isinstance(value, str) and value else None


def is_ready(node: Any) -> bool:
    conditions = getattr(getattr(node, "status", None), "conditions", None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def wait_rebooted(core: Any, node: str, before: str | None, timeout: float, say: Progress) -> None:
    """Until the Node reports a boot ID other than `before` and Ready (a watch on the Node object: no polling);
    HostFailures naming the node after timeout. before None: Ready is enough (the kubelet reported no boot ID)."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout

    def done(obj: Any) -> bool:
        return is_ready(obj) and (before is None or boot_id(obj) not in (None, before))

    obj = kube._call(f"read node {node}", lambda: core.read_node(node))
    while not done(obj):
        left = deadline - time.monotonic()
        if left <= 0:
            state = "Ready" if is_ready(obj) else "NotReady"
            raise HostFailures(
                f"{node}: not back after the driver's reboot within {timeout:.0f}s ({state}, boot ID "
                f"{boot_id(obj) or 'unknown'}{', unchanged' if boot_id(obj) == before else ''}); the node is left "
                "cordoned",
                hint=f"look at the node's console and its kubelet (kubectl describe node {node}); once it is Ready, "
                     "run the same `upgrade apply --resume`")
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        stream = w.stream(core.list_node, field_selector=f"metadata.name={node}",
                          resource_version=obj.metadata.resource_version, timeout_seconds=max(1, int(left)))
        try:
            for event in stream:
                if event.get("type") in ("ADDED", "MODIFIED"):
                    obj = event["object"]
                    if done(obj):
                        w.stop()
                        break
            else:  # the watch ended (its timeout, or the server closed it): read again, then watch from there
                obj = kube._call(f"read node {node}", lambda: core.read_node(node))
        except ApiException as exc:
            if exc.status != 410:  # 410 Gone: the version watched from is too old; read again
                raise kube._api_error(f"watch node {node}", exc) from None
            obj = kube._call(f"read node {node}", lambda: core.read_node(node))
    say(f"{node}: Ready (boot ID {boot_id(obj) or 'unknown'})")


def batch_plan(plan: Plan, hosts: Sequence[str]) -> Plan:
    """The plan limited to the batch's inventory hosts (what --limit does for apply)."""
    from installer.plan import resolve

    return resolve(plan.site, dataclasses.replace(plan.options, limit=",".join(hosts)))


class HostBatch:
    """The steps of one batch; each is safe to run again (--resume starts an interrupted batch over)."""

    def __init__(self, plan: Plan, client: Any, kubeconfig: str, *, drain_timeout: float, node_timeout: float,
                 validate_timeout: float, say: Progress, display: Display | None = None,
                 step: Callable[[str | None, str], None] | None = None, layers: Sequence[str] = LAYERS):
        from kubernetes import client as k

        from installer.mig_rollout import Rollout

        self.plan, self.client, self.kubeconfig = plan, client, kubeconfig
        self.core = k.CoreV1Api(client)
        self.drain_timeout, self.node_timeout, self.validate_timeout = drain_timeout, node_timeout, validate_timeout
        self.say, self.display, self.layers = say, display, tuple(layers)
        self.step = step or (lambda node, what: None)
        self.hosts = {n.node_name: n.name for n in plan.nodes}
        self._rollout: Callable[[bool], Rollout] = lambda drain_all: Rollout(
            plan, client, drain_timeout=drain_timeout, drain_all=drain_all, progress=say)

    def boot_id(self, node: str) -> str | None:
        return boot_id(kube._call(f"read node {node}", functools.partial(self.core.read_node, node)))

    def wait_rebooted(self, node: str, before: str | None) -> None:
        wait_rebooted(self.core, node, before, self.node_timeout, self.say)

    def cordon(self, node: str, on: bool) -> None:
        self._rollout(False)._cordon(node, on)

    def drain(self, node: str, everything: bool) -> None:
        from installer.mig_rollout import DrainTimeout

        try:
            self._rollout(everything).drain(node)
        except DrainTimeout as exc:
            raise HostFailures(exc.message.replace("  ", " "),
                               hint="a PodDisruptionBudget allows no disruption now (named above), or a pod does not "
                                    "stop: let the workload move (scale it up or relax the budget) or raise "
                                    "--drain-timeout, then run the same `upgrade apply --resume`; the batch's nodes "
                                    "are left cordoned") from None

    def driver_role(self, nodes: Sequence[str]) -> None:
        from installer.apply import RunOptions, run_nodes

        hosts = [self.hosts.get(n, n) for n in nodes]
        self.say(f"driver role on {', '.join(hosts)}: playbooks/site.yml --tags driver --limit {','.join(hosts)}")
        try:
            run_nodes("site.yml", batch_plan(self.plan, hosts), RunOptions(tags="driver"), self.display)
        except (HostFailures, HostsUnreachable) as exc:
            raise type(exc)(f"{exc.message}; the batch's nodes ({', '.join(nodes)}) are left cordoned",
                            hint="fix the node (the run records named above hold the task's output), then run the "
                                 "same `upgrade apply --resume`") from None

    def validate(self, nodes: Sequence[str]) -> None:
        from installer import validate

        hosts = [self.hosts.get(n, n) for n in nodes]
        self.say(f"validate {', '.join(nodes)}: {', '.join(self.layers)}")
        report = validate.run(batch_plan(self.plan, hosts), self.kubeconfig, self.layers, timeout=self.validate_timeout,
                              progress=self.say, client=self.client)
        failed = [c for c in report.checks if c.status in ("fail", "unreachable")]
        for c in failed:
            self.say(f"validate {c.node}: {c.check} {c.status}: {c.message}" + (f" (fix: {c.fix})" if c.fix else ""))
        code = report.exit_code()
        if code == HostsUnreachable.exit_code:
            raise HostsUnreachable(f"validate {', '.join(nodes)}: "
                                   + "; ".join(f"{c.node}: {c.message}" for c in failed if c.status == "unreachable")
                                   + "; the batch's nodes are left cordoned",
                                   hint="check the nodes' SSH, then run the same `upgrade apply --resume`")
        if code:
            raise ValidationFindings(f"validate {', '.join(nodes)}: {len(failed)} check(s) failed: "
                                     + "; ".join(f"{c.node} {c.check}: {c.message}" for c in failed)
                                     + "; the batch's nodes are left cordoned",
                                     hint="fix what the checks name, then run the same `upgrade apply --resume` "
                                          "(it runs this batch again), or `upgrade rollback`")
        self.say(f"validate {', '.join(nodes)}: {report.counts().get('pass', 0)} check(s) passed")

    def run(self, nodes: Sequence[str], *, reboot: bool, cordoned_before: Callable[[str], bool],
            boot_ids: dict[str, str | None]) -> None:
        """The whole batch. boot_ids: node -> its boot ID before the driver role, filled here the first time and kept
        by the caller (the state file) so that a resumed batch knows whether the reboot already happened."""
        for n in nodes:
            self.step(n, "cordon")
            if cordoned_before(n):
                self.say(f"{n}: cordoned before the upgrade; stays cordoned")
            self.cordon(n, True)
        for n in nodes:
            self.step(n, "drain")
            self.drain(n, reboot)
        for n in nodes:
            if n not in boot_ids:
                boot_ids[n] = self.boot_id(n)
        self.step(None, "driver")
        self.driver_role(nodes)
        if reboot:
            for n in nodes:
                self.step(n, "reboot")
                self.wait_rebooted(n, boot_ids.get(n))
        self.step(None, "validate")
        self.validate(nodes)
        for n in nodes:
            self.step(n, "uncordon")
            if cordoned_before(n):
                self.say(f"{n}: stays cordoned (it was before the upgrade)")
            else:
                self.cordon(n, False)
