"""The only module that drives Helm (through pyhelm3 and the sha256-verified helm binary)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from installer.errors import ClusterError, ClusterUnreachable, GpuInstallError

T = TypeVar("T")


def oci_version(chart_ref: str | Path) -> tuple[str, str | None]:
    """(reference, version) of a chart reference: an oci:// reference may carry the chart version as its tag
    (oci://registry/path/gpu-operator:v24.9.2, what `gpu-install mirror push` prints), which helm takes as --version;
    anything else is returned as it is, with no version."""
    ref = str(chart_ref)
    if ref.startswith("oci://"):
        head, _, last = ref.rpartition("/")
        name, colon, tag = last.partition(":")
        if colon and tag and head != "oci:/":
            return f"{head}/{name}", tag
    return ref, None


async def _get_chart(c: Any, chart_ref: str | Path) -> Any:
    ref, version = oci_version(chart_ref)
    return await c.get_chart(ref, version=version) if version else await c.get_chart(chart_ref)


def client(kubeconfig: Path | None = None) -> Any:
    import logging

    from pyhelm3 import Client

    from installer.tools import ensure_helm

    # pyhelm3 logs every failed helm call (also the expected "release: not found") as a warning; our
    # errors carry helm's stderr instead.
    logging.getLogger("pyhelm3").setLevel(logging.ERROR)
    return Client(executable=str(ensure_helm()), kubeconfig=kubeconfig)


def template(chart_ref: str | Path, values: dict[str, Any], release_name: str = "gpu-operator",
             namespace: str = "gpu-operator") -> list[dict[str, Any]]:
    """`helm template` a chart (directory, .tgz or OCI ref) with values; returns the resources."""

    async def run() -> list[dict[str, Any]]:
        c = client()
        chart = await _get_chart(c, chart_ref)
        return list(await c.template_resources(chart, release_name, values, namespace=namespace))

    return _run(run(), f"helm template {chart_ref}", "check the chart reference and the rendered values")


# ---------------------------------------------------------------- the chart's CRDs


def _crd_source(source: str) -> bool:
    """True for a file of a chart's or a subchart's `crds/` directory: `<chart>/crds/…`,
    `<chart>/charts/<sub>/crds/…` (templates that render a CRD are release resources, helm's business)."""
    parts = source.strip().split("/")[1:]
    while len(parts) > 2 and parts[0] == "charts":
        parts = parts[2:]
    return len(parts) > 1 and parts[0] == "crds"


def split_crds(rendered: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of the crds/ files in `helm template --include-crds` output (each file is
    printed after a `# Source: <path>` line, and may hold several documents); subcharts that the values disable
    are not in it."""
    import re

    import yaml

    parts = re.split(r"(?m)^# Source: (.*)$", rendered)
    out: list[dict[str, Any]] = []
    for source, text in zip(parts[1::2], parts[2::2], strict=True):
        if not _crd_source(source):
            continue
        for doc in yaml.safe_load_all(text):
            if isinstance(doc, dict) and doc.get("kind") == "CustomResourceDefinition":
                out.append(doc)
    return out


def chart_crds(chart_ref: str | Path, values: dict[str, Any], release_name: str = "gpu-operator",
               namespace: str = "gpu-operator") -> list[dict[str, Any]]:
    """The CRDs helm would install with this chart and these values: its crds/ directory and those of the enabled
    subcharts (the GPU Operator's node-feature-discovery when nfd.enabled), read with
    `helm template --include-crds` (`helm show crds` ignores the values, so a disabled subchart's CRDs would be
    in it)."""
    import json

    from pyhelm3.command import Command

    from installer.tools import ensure_helm

    async def run() -> list[dict[str, Any]]:
        cmd = Command(executable=str(ensure_helm()))
        ref, version = oci_version(chart_ref)
        raw = await cmd.run(["template", release_name, ref, *(["--version", version] if version else []),
                             "--include-crds", "--namespace", namespace, "--values", "-"], json.dumps(values).encode())
        return split_crds(raw.decode())

    return _run(run(), f"helm template --include-crds {chart_ref}",
                "check the chart reference and the rendered values")


# ---------------------------------------------------------------- releases


@dataclass
class ReleaseState:
    name: str
    namespace: str
    revision: int
    status: str  # deployed, failed, pending-install, ...
    chart: str  # name-version
    changed: bool = False  # this call made a new revision
    description: str = ""
    #: what install_or_upgrade() did first with a revision an interrupted run had left pending ("" when nothing)
    recovered: str = ""
    #: install_or_upgrade(): the release's history as it was before anything was done, read only when its last revision
    #: was not deployed (failed, pending, superseded) -- what the upgrade's diff does not cover
    #: (installer.upgrade.orphans.not_diffed); None when it was deployed, or there was no release
    history_before: list[HistoryEntry] | None = None


async def _state(rev: Any, changed: bool = False) -> ReleaseState:
    status = getattr(rev.status, "value", str(rev.status))
    meta = await rev.chart_metadata()
    chart = f"{meta.name}-{meta.version}" if meta else ""
    return ReleaseState(rev.release.name, rev.release.namespace, int(rev.revision), status, chart,
                        changed, rev.description or "")


# helm's words for an API server it could not reach -- or lost in the middle of a request (the server went away
# while answering: "unexpected EOF", a reset connection, a lost HTTP/2 connection)
UNREACHABLE = ("kubernetes cluster unreachable", "connection refused", "no such host", "i/o timeout",
               "no route to host", "tls handshake timeout", "unexpected eof", "connection reset by peer",
               "http2: client connection lost", "broken pipe")

#: release statuses that helm leaves behind when it is stopped (or loses the API server) before it records the outcome
PENDING = ("pending-install", "pending-upgrade", "pending-rollback", "uninstalling")


def _helm_text(exc: Exception) -> str:
    stderr = getattr(exc, "stderr", b"")
    return (stderr.decode(errors="replace") if isinstance(stderr, bytes) else str(stderr)).strip() or str(exc)


def _unreachable(text: str) -> bool:
    return any(u in text.lower() for u in UNREACHABLE)


def _helm_error(action: str, exc: Exception, hint: str,
                unreachable_hint: str = "check the kubeconfig's server and that the cluster is up"
                ) -> ClusterError | ClusterUnreachable:
    """helm's own message; exit 5 when it could not reach the API server, else 7."""
    text = _helm_text(exc)
    if _unreachable(text):
        return ClusterUnreachable(f"{action} failed: the Kubernetes API server cannot be reached: {text[-1500:]}",
                                  hint=unreachable_hint)
    return ClusterError(f"{action} failed: {text[-1500:]}", hint=hint)


class _HelmLoop(asyncio.SelectorEventLoop):
    """The event loop pyhelm3's coroutines run on: each helm command (pyhelm3 starts `sh -c 'helm …'`) in a session
    of its own, so that a command past its limit is stopped whole -- pyhelm3's own cancellation terminates the shell
    only, which leaves helm running and holding the pipes it then waits on."""

    def __init__(self) -> None:
        super().__init__()
        self.started: list[asyncio.SubprocessTransport] = []

    async def subprocess_shell(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["start_new_session"] = True
        transport, protocol = await super().subprocess_shell(*args, **kwargs)
        self.started.append(transport)
        return transport, protocol

    def stop_running(self, sig: int) -> None:
        for t in self.started:
            if t.get_returncode() is None:  # still running: its session (shell and helm) is alive
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(t.get_pid(), sig)


async def _bounded(coro: Coroutine[Any, Any, T], seconds: float) -> T:
    """coro's result, or TimeoutError after seconds with every helm it started stopped (TERM, then KILL)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if task in done:
        return task.result()
    assert isinstance(loop, _HelmLoop)
    loop.stop_running(signal.SIGTERM)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)
    if not done:
        loop.stop_running(signal.SIGKILL)
        await asyncio.wait({task}, timeout=10)
    raise TimeoutError


def _run_bounded(coro: Coroutine[Any, Any, T], seconds: float) -> T:
    with asyncio.Runner(loop_factory=_HelmLoop) as runner:
        return runner.run(_bounded(coro, seconds))


def _run(coro: Coroutine[Any, Any, T], action: str, hint: str, limit: float | None = None) -> T:
    """Run one pyhelm3 coroutine, stopped after limit seconds (default: limits.helm_timeout()); its errors (carrying
    helm's stderr) become ClusterError / ClusterUnreachable."""
    from installer import limits

    seconds = limits.helm_timeout() if limit is None else limit
    try:
        return _run_bounded(coro, seconds)
    except GpuInstallError:
        raise
    except TimeoutError:
        raise ClusterError(f"{action} did not finish in {seconds:g} s and was stopped",
                           hint=f"check the API server (and, for an oci:// chart, the registry); the limit is "
                                f"${limits.ENV_HELM_TIMEOUT}=SECONDS") from None
    except Exception as exc:  # noqa: BLE001 - pyhelm3 raises its own and asyncio's errors; all carry helm's words
        raise _helm_error(action, exc, hint) from None


def _timeout(seconds: float) -> str:
    return f"{max(1, int(seconds))}s"


def _fix_pending(release_name: str, namespace: str, status: str, kubeconfig: Path | None) -> str:
    """The helm command that makes a release left in status proceedable by hand (what pyhelm3 does itself)."""
    kc = f" --kubeconfig {kubeconfig}" if kubeconfig else ""
    if status in ("pending-install", "uninstalling"):
        return f"helm uninstall {release_name} -n {namespace} --wait{kc}"
    return f"helm rollback {release_name} -n {namespace} --wait{kc}"


async def _proceedable(c: Any, release_name: str, namespace: str, timeout: float,
                       kubeconfig: Path | None) -> tuple[Any, str, list[HistoryEntry] | None]:
    """(the revision to upgrade from or None, what was done to get it, the history before that when the last
    revision was not deployed -- else None): a release an interrupted run left pending
    (helm lost the API server or was stopped before it recorded the outcome) is made proceedable with pyhelm3's
    get_proceedable_revision -- pending-install/uninstalling uninstalled, pending-upgrade/pending-rollback rolled
    back to the previous revision; when that fails, an error naming the status and the helm command that fixes it."""
    from pyhelm3 import errors as herr

    try:
        current = await c.get_current_revision(release_name, namespace=namespace)
    except herr.ReleaseNotFoundError:
        return None, "", None
    status = getattr(current.status, "value", str(current.status))
    before = None if status == "deployed" else await _history(kubeconfig, release_name, namespace)
    if status not in PENDING:
        return current, "", before
    left = f"release {release_name}: revision {current.revision} was left {status} by an interrupted run"
    undo = "uninstalling it" if status in ("pending-install", "uninstalling") else "rolling it back"
    try:
        rev = await c.get_proceedable_revision(release_name, namespace=namespace, timeout=_timeout(timeout))
    except herr.Error as exc:
        fix = _fix_pending(release_name, namespace, status, kubeconfig)
        raise _helm_error(f"{left}; {undo}", exc, hint=f"run `{fix}`, then re-run this command",
                          unreachable_hint=f"once the API server answers, re-run this command (re-running is safe), "
                                           f"or run `{fix}` first") from None
    done = ("uninstalled it" if rev is None else
            f"rolled back to revision {int(current.revision) - 1} as revision {rev.revision}")
    return rev, f"{left}: {done} before upgrading", before


def _left_behind(release_name: str, namespace: str, kubeconfig: Path | None) -> ReleaseState | None | str:
    """After a failed helm upgrade: the release's current revision, None when there is none, or helm's words when
    the API server cannot be reached or does not answer (read-only, bounded); None too when helm fails otherwise."""
    try:
        return release_state(release_name, namespace, kubeconfig, limit=30)
    except ClusterUnreachable as exc:
        return exc.message
    except GpuInstallError as exc:
        return exc.message if "did not finish" in exc.message else None


def install_or_upgrade(chart_ref: str | Path, release_name: str, namespace: str, values: dict[str, Any],
                       kubeconfig: Path | None, timeout: float = 300, wait: bool = True) -> ReleaseState:
    """`helm upgrade --install` (no --create-namespace) unless the deployed release already has this
    chart and these values; then nothing is done and changed=False. A release left pending by an
    interrupted run is made proceedable first (_proceedable(); what was done is in the state's
    `recovered`). With wait, helm waits (up to timeout) for the release's Deployments,
    DaemonSets, pods and Jobs to be ready. When helm fails, the release is read back: an API server that
    cannot be reached is exit 5 (ClusterUnreachable), and a revision left pending is named."""
    from pyhelm3 import errors as herr

    recovered = ""

    async def run() -> ReleaseState:
        nonlocal recovered
        c = client(kubeconfig)
        try:
            chart = await _get_chart(c, chart_ref)
        except herr.Error as exc:
            raise _helm_error(f"helm show chart {chart_ref}", exc,
                              "give a chart directory, a .tgz or an oci:// reference helm can reach") from None
        current, recovered, before = await _proceedable(c, release_name, namespace, timeout, kubeconfig)
        if not await c.should_install_or_upgrade_release(current, chart, values):
            state = await _state(await c.get_current_revision(release_name, namespace=namespace))
            state.recovered = recovered
            return state
        # --skip-crds: gpu-install applies the chart's CRDs itself, server-side, before every install and upgrade
        # (installer.operator); helm's own CRD step (first install only, create-if-missing) would have no effect
        rev = await c.install_or_upgrade_release(
            release_name, chart, values, namespace=namespace, create_namespace=False,
            wait=wait, timeout=_timeout(timeout), skip_crds=True)
        state = await _state(rev, changed=True)
        state.recovered = recovered
        state.history_before = before
        return state

    action = f"helm upgrade --install {release_name}"
    resume = ("check the kubeconfig's server and that the cluster is up; re-run the same command once the API server "
              "answers: re-running is safe -- a revision left "
              "pending-upgrade is rolled back to the last deployed one and upgraded again (pending-install: "
              "uninstalled and installed again)")
    try:
        return _run_bounded(run(), timeout + 120)
    except GpuInstallError:
        raise
    except TimeoutError:
        raise ClusterError(f"{action} did not finish in {timeout + 120:.0f}s",
                              hint="check the API server; re-running is safe") from None
    except Exception as exc:  # noqa: BLE001 - pyhelm3's errors carry helm's stderr
        text = _helm_text(exc)
        after = _left_behind(release_name, namespace, kubeconfig)
        lost = _unreachable(text) or isinstance(after, str)
        left = (f"; release {release_name} is left {after.status} at revision {after.revision}"
                if isinstance(after, ReleaseState) and after.status in PENDING else "")
        if lost:
            now = (f"; the API server still cannot be reached ({after.split('cannot be reached: ', 1)[-1][-300:]})"
                   if isinstance(after, str)
                   else left + " (the API server answers again)")
            raise ClusterUnreachable(
                f"{action} failed: the Kubernetes API server cannot be reached or went away during the "
                f"upgrade{now}. helm said: {text[-1500:]}", hint=resume) from None
        hint = ("the release's workloads did not become ready in time: check their pods (image pulls, "
                "pull Secret, node capacity); re-running is safe" if "timed out" in text or "deadline" in text
                else "see helm's message; re-running is safe (a failed release is upgraded again)")
        if left:
            hint = resume.split("; ", 1)[1].replace(" once the API server answers", "")
        raise ClusterError(f"{action} failed{left}: {text[-1500:]}", hint=hint) from None


def release_state(release_name: str, namespace: str, kubeconfig: Path | None,
                  limit: float | None = None) -> ReleaseState | None:
    """The current revision of a release, or None when there is none (stopped after limit seconds)."""
    from pyhelm3 import errors as herr

    async def run() -> ReleaseState | None:
        c = client(kubeconfig)
        try:
            return await _state(await c.get_current_revision(release_name, namespace=namespace))
        except herr.ReleaseNotFoundError:
            return None

    return _run(run(), f"helm status {release_name}", "check the kubeconfig and the API server", limit)


def release_values(release_name: str, namespace: str,
                   kubeconfig: Path | None) -> tuple[ReleaseState, dict[str, Any]] | None:
    """Read-only: the current revision of a release and the values it was installed with (`helm get values`: the
    user-supplied ones, not the chart's defaults), or None when there is no release."""
    from pyhelm3 import errors as herr

    async def run() -> tuple[ReleaseState, dict[str, Any]] | None:
        c = client(kubeconfig)
        try:
            rev = await c.get_current_revision(release_name, namespace=namespace)
        except herr.ReleaseNotFoundError:
            return None
        values = await rev.values()
        return await _state(rev), dict(values) if isinstance(values, dict) else {}

    return _run(run(), f"helm get values {release_name}", "check the kubeconfig and the API server")


def uninstall(release_name: str, namespace: str, kubeconfig: Path | None, timeout: float = 300) -> bool:
    """`helm uninstall --wait`; True when there was a release to remove."""
    async def run() -> bool:
        c = client(kubeconfig)
        from pyhelm3 import errors as herr

        try:
            await c.get_current_revision(release_name, namespace=namespace)
        except herr.ReleaseNotFoundError:
            return False
        await c.uninstall_release(release_name, namespace=namespace, wait=True, timeout=_timeout(timeout))
        return True

    return _run(run(), f"helm uninstall {release_name}", "re-running is safe", timeout + 120)


@dataclass
class ReleasePlan:
    """What `helm upgrade --install` would do, found without changing anything (apply --check)."""

    action: str  # install | upgrade | unchanged
    chart: str  # the chart's name-version
    current: ReleaseState | None


def plan_release(chart_ref: str | Path, release_name: str, namespace: str, values: dict[str, Any],
                 kubeconfig: Path | None) -> ReleasePlan:
    """Read-only: the deployed revision (if any) compared with this chart and these values, by the same
    rule install_or_upgrade() uses to decide that nothing needs doing."""
    from pyhelm3 import errors as herr

    async def run() -> ReleasePlan:
        c = client(kubeconfig)
        chart = await _get_chart(c, chart_ref)
        name = f"{chart.metadata.name}-{chart.metadata.version}"
        try:
            rev = await c.get_current_revision(release_name, namespace=namespace)
        except herr.ReleaseNotFoundError:
            return ReleasePlan("install", name, None)
        todo = await c.should_install_or_upgrade_release(rev, chart, values)
        return ReleasePlan("upgrade" if todo else "unchanged", name, await _state(rev))

    return _run(run(), f"helm status {release_name}", "check the chart, the kubeconfig and the API server")


# ---------------------------------------------------------------- history and rollback (gpu-install upgrade rollback)


def _command(kubeconfig: Path | None) -> Any:
    """pyhelm3's Command (the helm CLI calls, as client() makes them) for what its Client does not offer."""
    import logging

    from pyhelm3.command import Command

    from installer.tools import ensure_helm

    logging.getLogger("pyhelm3").setLevel(logging.ERROR)
    return Command(executable=str(ensure_helm()), kubeconfig=kubeconfig)


@dataclass
class HistoryEntry:
    revision: int
    status: str  # deployed, superseded, failed, ...
    chart: str  # name-version
    description: str


def release_history(release_name: str, namespace: str, kubeconfig: Path | None,
                    max_revisions: int = 256) -> list[HistoryEntry] | None:
    """Read-only: `helm history` of a release, oldest first (at most max_revisions), or None when there is none.
    helm's JSON is read as untrusted: an entry without a whole revision number is left out."""
    return _run(_history(kubeconfig, release_name, namespace, max_revisions), f"helm history {release_name}",
                "check the kubeconfig and the API server")


async def _history(kubeconfig: Path | None, release_name: str, namespace: str,
                   max_revisions: int = 256) -> list[HistoryEntry] | None:
    from pyhelm3 import errors as herr

    try:
        raw = await _command(kubeconfig).history(release_name, max_revisions=max_revisions, namespace=namespace)
    except herr.ReleaseNotFoundError:
        return None
    out = []
    for h in raw if isinstance(raw, list) else []:
        rev = h.get("revision") if isinstance(h, dict) else None
        if isinstance(rev, int) and not isinstance(rev, bool):
            out.append(HistoryEntry(rev, str(h.get("status") or ""), str(h.get("chart") or ""),
                                    str(h.get("description") or "")))
    return sorted(out, key=lambda e: e.revision)


def revision_values(release_name: str, namespace: str, revision: int, kubeconfig: Path | None) -> dict[str, Any]:
    """Read-only: the values a revision of the release was installed with (`helm get values --revision`)."""

    async def run() -> dict[str, Any]:
        values = await _command(kubeconfig).get_values(release_name, namespace=namespace, revision=revision)
        return dict(values) if isinstance(values, dict) else {}

    return _run(run(), f"helm get values {release_name} --revision {revision}",
                "check the kubeconfig, the API server and the revision (helm history)")


def rollback(release_name: str, namespace: str, revision: int, kubeconfig: Path | None, timeout: float = 300,
             wait: bool = True) -> ReleaseState:
    """`helm rollback RELEASE REVISION` (with --wait --wait-for-jobs when wait): a new revision with that revision's
    chart and values. Helm never touches CRDs on a rollback."""

    async def run() -> ReleaseState:
        c = client(kubeconfig)
        await _command(kubeconfig).rollback(release_name, revision, namespace=namespace, timeout=_timeout(timeout), wait=wait)
        return await _state(await c.get_current_revision(release_name, namespace=namespace), changed=True)

    hint = ("the release's workloads did not become ready in time: check their pods (image pulls, pull Secret); the "
            "rollback revision is recorded by helm (helm history), re-running is safe" if wait else
            "see helm's message; re-running is safe")
    return _run(run(), f"helm rollback {release_name} {revision}", hint, timeout + 120)


def revision_manifest(release_name: str, namespace: str, revision: int,
                      kubeconfig: Path | None) -> list[dict[str, Any]]:
    """Read-only: the resources a revision of the release rendered (`helm get manifest --revision`; hooks are not in
    it), as helm stored them: untrusted YAML, anything that is not a mapping left out."""

    async def run() -> list[dict[str, Any]]:
        docs = await _command(kubeconfig).get_resources(release_name, namespace=namespace, revision=revision)
        return [d for d in docs if isinstance(d, dict)]

    return _run(run(), f"helm get manifest {release_name} --revision {revision}",
                "check the kubeconfig, the API server and the revision (helm history)")
