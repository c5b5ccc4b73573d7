"""Install, inspect and remove the GPU Operator Helm release (apply step "operator install").

install(): namespace → pull Secret → the chart's CRDs → `helm upgrade --install --skip-crds` of the chart
with the plan's values (installer.plan: the same values `gpu-install render` prints), waiting up to
a timeout for the release's workloads. After an upgrade that made a new revision, what failed revisions after the
deployed one created and the new revision lacks (helm's upgrade diffs against the deployed revision only) is deleted
when the release owns it (installer.upgrade.orphans.after_upgrade; helm's history is read, before the upgrade, only
when the last revision is not deployed).

CRDs: helm installs a chart's crds/ on the first install only and never upgrades or removes them (the GPU
Operator's own CRD hook Jobs need running pods and the operator image). So before every install or upgrade the
CRDs of the chart's crds/ and of its enabled subcharts' crds/ (node-feature-discovery when nfd.enabled) are
applied server-side with the field manager `gpu-install` (conflicts forced: helm created them on a first
install), and helm runs with --skip-crds: one owner, the same path on first install and upgrade.
uninstall(purge_crds=True) deletes them once the release is gone and no custom resource of theirs is left. Kubernetes API calls go through installer.kube, Helm through
installer.helm. A second install with the same chart and values changes nothing and reports so.

The chart (load_chart): a chart archive (.tgz) is read once, while it is hashed, into a private copy (a 0700
temporary directory of this process), and helm -- the install, the CRDs, Chart.yaml's checks -- is only ever given
that copy, so the file cannot change between its check and its use. Its sha256 is bound when operator.chartSha256 is
set (for the file operator.chart names) or when the file lies in a bundle directory (<bundle>/charts/<file>, beside
bundle.lock.json or its signature): then the lock must verify with the site's pinned keys (mirror.trustedKeys,
installer.mirror.bundle.signed_lock) and list the file. A chart of another sha256 is refused (ConfigError, exit 2,
naming both digests and where the expected one comes from) before anything is touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import helm, kube
from installer.errors import ConfigError, PreflightError

if TYPE_CHECKING:
    from installer.plan import Plan
    from installer.upgrade.orphans import Swept

ENV_CHART = "GPU_INSTALL_CHART"
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def crd_lines(crds: list[tuple[str, str]], would: bool = False) -> list[str]:
    """One line per CRD: `CRD clusterpolicies.nvidia.com: updated (server-side apply, field manager gpu-install)`."""
    how = f"server-side apply, field manager {kube.FIELD_MANAGER}" + (", dry run" if would else "")
    return [f"CRD {name}: {('would be ' + action) if would and action != 'unchanged' else action} ({how})"
            for name, action in crds]


def chart_crds(plan: Plan, chart_ref: str) -> list[dict[str, Any]]:
    """The CRDs of the chart's crds/ and of its enabled subcharts' crds/, with the plan's values."""
    site = plan.site
    return helm.chart_crds(chart_ref, plan.values, site.operator.releaseName, site.operator.namespace)


def check_chart_ref(chart_ref: str | os.PathLike[str] | None) -> str:
    """A chart directory, a .tgz or an oci:// reference (helm pulls it from the registry)."""
    if not chart_ref:
        raise ConfigError("no GPU Operator chart given",
                          hint=f"pass --chart PATH.tgz|DIR|oci://REGISTRY/PATH/gpu-operator (or set {ENV_CHART})")
    ref = str(chart_ref)
    if ref.startswith("oci://"):
        return ref
    path = Path(ref)
    if path.is_dir():
        if not (path / "Chart.yaml").is_file():
            raise ConfigError(f"chart {ref}: a directory without Chart.yaml", hint="point at the chart's directory")
        return str(path.resolve())
    if path.is_file():
        return str(path.resolve())
    raise ConfigError(f"chart {ref} not found", hint="give a chart directory, a .tgz, or an oci:// reference")


#: a GPU Operator chart archive is a few hundred KiB; a file past this is no chart and is not read past it
MAX_CHART_BYTES = 64 << 20
SHA256_FIELD = "operator.chartSha256"


@dataclass(frozen=True)
class Chart:
    """The chart a command installs (load_chart): ref is what helm is given -- the private copy of a .tgz, a chart
    directory, an oci:// reference; source is the chart as it was named; sha256 is the digest of the archive read
    (None for a directory or an oci:// reference); pinned_by says where the sha256 it was held against came from
    (None: nothing pinned it)."""

    ref: str
    source: str
    sha256: str | None = None
    pinned_by: str | None = None

    def describe(self) -> str:
        """`PATH (sha256 …, as operator.chartSha256 pins it)` for progress lines."""
        if self.sha256 is None:
            return self.source
        return self.source + f" (sha256 {self.sha256}" + (f", as {self.pinned_by} pins it)" if self.pinned_by
                                                          else ", not pinned)")


#: (chart as named, the pin) -> the chart read: a command reads a chart archive once (upgrade apply's plan check
#: and its helm upgrade install the same bytes)
_LOADED: dict[tuple[str, str | None], Chart] = {}


def _bundle_of(path: Path) -> Path | None:
    """The bundle directory a chart file lies in: <bundle>/charts/<file> where <bundle> holds the bundle lock or its
    signature (either one: a bundle whose signature was removed is still a bundle, and its unsigned lock is refused)."""
    from installer.mirror.bundle import LOCK, SIGNATURE

    bundle = path.parent.parent
    if path.parent.name == "charts" and any(os.path.lexists(bundle / n) for n in (LOCK, SIGNATURE)):
        return bundle
    return None


def chart_pin(plan: Plan, ref: str) -> tuple[str, str] | None:
    """(expected sha256, where it comes from) for a local chart: operator.chartSha256 when the chart is the file
    operator.chart names, else the entry of the signed lock of the bundle the file lies in (verified with the site's
    pinned keys); None when neither applies (an oci:// reference: helm pulls it). ConfigError (exit 2) for a bundle
    whose lock does not verify or does not list the file."""
    op = plan.site.operator
    if ref.startswith("oci://"):
        return None
    given = Path(os.path.abspath(ref))
    if op.chartSha256 and op.chart and os.path.abspath(op.chart) == str(given):
        return op.chartSha256, f"{SHA256_FIELD} in the site file"
    for path in dict.fromkeys((given, Path(os.path.realpath(ref)))):  # the file as named, and where a link leads
        bundle = _bundle_of(path)
        if bundle is None:
            continue
        from installer.mirror.bundle import SIGNATURE, signed_lock

        where = f"the signed lock of bundle {bundle} ({SIGNATURE})"
        try:
            lock = signed_lock(bundle, plan.site.mirror.trustedKeys)
        except ConfigError as exc:
            also = f"or set {SHA256_FIELD} to the sha256 `gpu-install mirror push` printed for the chart"
            raise ConfigError(f"chart {ref} lies in bundle {bundle}, whose lock cannot be verified: {exc.message}",
                              hint=f"{exc.hint}; {also}" if exc.hint else also) from None
        rel = f"charts/{path.name}"
        for entry in lock.get("charts") or []:
            if isinstance(entry, dict) and entry.get("file") == rel:
                want = str(entry.get("sha256"))
                return want, where
        raise ConfigError(f"chart {ref}: {rel} is not a chart {where} lists",
                          hint="name a chart the bundle carries (`gpu-install mirror push` prints it) or pull the "
                               "bundle again on the connected side")
    return None


def _read_private(src: Path, dest: Path) -> str:
    """Copy src to dest (created new, 0600) in one read while hashing it: a regular file, not a symlink, at most
    MAX_CHART_BYTES. The sha256 of what was copied; ConfigError naming src otherwise."""
    hint = "give the chart archive itself (a .tgz `helm package` or `gpu-install mirror pull` made)"
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "a symbolic link" if os.path.islink(src) else exc.strerror or str(exc)
        raise ConfigError(f"chart {src}: cannot be read ({why})", hint=hint) from None
    digest = hashlib.sha256()
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"chart {src}: not a regular file", hint=hint)
        if st.st_size > MAX_CHART_BYTES:
            raise ConfigError(f"chart {src}: {st.st_size} bytes, more than a chart's {MAX_CHART_BYTES}", hint=hint)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        stack.callback(os.close, out)
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_CHART_BYTES:
                raise ConfigError(f"chart {src}: grew past {MAX_CHART_BYTES} bytes while it was read", hint=hint)
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view):]
    return digest.hexdigest()


def load_chart(plan: Plan, chart_ref: str | os.PathLike[str] | None) -> Chart:
    """The chart to install, checked (see the module's docstring): an archive is read once into a private copy,
    hashed and held against its pin (chart_pin); a directory or an oci:// reference is given to helm as it is -- refused
    where a pin applies (a directory has no single digest). The same chart named again in this process is not read
    again. ConfigError (exit 2) for a chart missing, unreadable or not the pinned one, nothing touched."""
    import shutil
    import tempfile
    import weakref

    ref = check_chart_ref(chart_ref)
    source = str(chart_ref)
    pin = chart_pin(plan, source)
    key = (os.path.abspath(source) if not source.startswith("oci://") else source, pin[0] if pin else None)
    if key in _LOADED:
        return _LOADED[key]
    if ref.startswith("oci://"):
        return Chart(ref, source)
    if os.path.isdir(ref):
        if pin is not None:
            raise ConfigError(
                f"chart {source} is a directory, and {pin[1]} pins a chart archive's sha256 (a directory has no "
                "single digest)",
                hint=(f"give the .tgz itself (`helm package {source}`, or the bundle's charts/ file), or remove "
                      f"{SHA256_FIELD} to install a chart directory") if pin[1].startswith(SHA256_FIELD) else
                "a bundle's charts are archives: carry the bundle across again as `gpu-install mirror pull` wrote it")
        return Chart(ref, source)
    tmp = tempfile.mkdtemp(prefix="gpu-install-chart-")
    copy = Path(tmp) / (Path(ref).name if Path(ref).name.endswith(".tgz") else "chart.tgz")
    try:
        got = _read_private(Path(os.path.realpath(source)), copy)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if pin is not None and got != pin[0]:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(
            f"chart {source} has sha256 {got}, but {pin[1]} says {pin[0]}: it is not the chart that was "
            "signed and pushed, and it was not installed",
            hint="carry the bundle across again (or name the chart `gpu-install mirror push` printed, with its "
                 f"sha256 as {SHA256_FIELD}); nothing was changed")
    chart = Chart(str(copy), source, got, pin[1] if pin else None)
    weakref.finalize(chart, shutil.rmtree, tmp, True)  # the copy goes with the process
    _LOADED[key] = chart
    return chart


@dataclass
class InstallReport:
    release: helm.ReleaseState
    namespace: str
    namespace_action: str  # created | unchanged
    secret: str | None  # pull Secret name
    secret_action: str  # created | updated | unchanged | none
    seconds: float
    crds: list[tuple[str, str]] = field(default_factory=list)  # (name, created|updated|unchanged)
    #: the revisions after the one helm upgrade diffed against (failed ones) and what they left that was swept
    #: (installer.upgrade.orphans.after_upgrade); None: no new revision, nothing looked at
    swept: Swept | None = None
    #: the driver container's package-source ConfigMaps (installer.driver_repo): (namespace/name, action)
    configmaps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return (self.release.changed or self.namespace_action != "unchanged"
                or self.secret_action in ("created", "updated") or any(a != "unchanged" for _, a in self.crds)
                or any(a != "unchanged" for _, a in self.configmaps))

    def lines(self) -> list[str]:
        r = self.release
        helm_part = (f"revision {r.revision} {r.status}" if r.changed
                     else f"unchanged at revision {r.revision} ({r.status}; same chart and values)")
        out = [f"namespace {self.namespace}: {self.namespace_action}"]
        if self.secret:
            out.append(f"pull secret {self.namespace}/{self.secret}: {self.secret_action}")
        out.extend(f"ConfigMap {name} (driver package sources): {action}" for name, action in self.configmaps)
        out.extend(crd_lines(self.crds))
        if r.recovered:  # a revision an interrupted run had left pending, made proceedable first
            out.append(r.recovered)
        orphans = self.swept.orphans if self.swept else []
        out.extend(f"not in the release's revision any more: {o.line()}" for o in orphans)
        summary = self.swept.summary() if self.swept else ""
        out.append(f"release {r.name} ({r.chart}): {helm_part}" + (f"; {summary}" if summary else ""))
        out.append(f"operator install ok in {self.seconds:.1f}s: {'changed' if self.changed else 'no change'}")
        return out


@dataclass
class Prepared:
    """Everything install() needs that can be checked without touching the cluster: the chart reference,
    the rendered values (checked against the release's keys), the pull Secret (credentials resolved from
    the environment) and the kubeconfig file. Missing pieces raise ConfigError (exit 2)."""

    chart: str  # what helm is given (Chart.ref: an archive's private copy)
    values: dict[str, Any]
    secret_body: dict[str, Any] | None
    kubeconfig: Path
    source: Chart | None = None  # the chart as named and checked (load_chart)
    #: the driver container's package-source ConfigMaps (installer.driver_repo.configmaps), read and checked here
    configmaps: list[dict[str, Any]] = field(default_factory=list)

    @property
    def shown(self) -> str:
        """The chart as progress lines name it: as given, with its sha256 and pin."""
        return self.source.describe() if self.source else self.chart


def chart_metadata(ref: str) -> dict[str, Any] | None:
    """Chart.yaml of a local chart (directory or .tgz); None for an oci:// reference (read only by helm, from the
    registry) or a chart without one."""
    import tarfile

    import yaml

    if ref.startswith("oci://"):
        return None
    path = Path(ref)
    text: str | None = None
    try:
        if path.is_dir():
            text = (path / "Chart.yaml").read_text(encoding="utf-8")
        else:
            with tarfile.open(path, "r:*") as tar:
                member = next((m for m in tar.getmembers()
                               if m.isfile() and m.name.count("/") == 1 and m.name.endswith("/Chart.yaml")), None)
                raw = tar.extractfile(member) if member else None
                text = raw.read(1 << 20).decode("utf-8") if raw else None
    except (OSError, tarfile.TarError, UnicodeDecodeError) as exc:
        raise ConfigError(f"chart {ref}: cannot read its Chart.yaml ({exc})",
                          hint="give a chart directory or a .tgz made by `helm package`") from None
    try:
        meta = yaml.safe_load(text) if text else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"chart {ref}: Chart.yaml is not YAML ({exc})") from None
    return meta if isinstance(meta, dict) else None


def check_chart_version(plan: Plan, ref: str, shown: str | None = None) -> None:
    """A GPU Operator chart must be the release the values were rendered for (its keys differ between releases).
    ref: the chart read (a private copy); shown: how messages name it (default: ref)."""
    from installer.catalog import parse_release

    meta = chart_metadata(ref)
    ref = shown or ref
    if not meta or meta.get("name") != "gpu-operator":
        return  # an oci:// reference, or another chart (a site's own packaging): nothing to hold it against
    version = parse_release(str(meta.get("version", "")))
    want = parse_release(plan.release.version)
    if version is not None and version != want:
        raise ConfigError(
            f"chart {ref} is GPU Operator v{version} but operator.version is {plan.release.version}: the values are "
            f"rendered for {plan.release.version}'s keys",
            hint=f"give the v{version} chart's release in operator.version, or the {plan.release.version} chart")


def prepare(plan: Plan, kubeconfig: str | os.PathLike[str] | None,
            chart_ref: str | os.PathLike[str] | None) -> Prepared:
    """What install() needs, checked before anything is touched (Prepared): the chart read and held against its pin
    (load_chart), its release (check_chart_version, on the copy read), credentials, the kubeconfig, the driver
    container's package-source ConfigMaps (their key and CA files read and checked)."""
    from installer import driver_repo

    site = plan.site
    configmaps = driver_repo.configmaps(site, plan.release, plan.nodes)
    chart = load_chart(plan, chart_ref)
    check_chart_version(plan, chart.ref, chart.source)
    # credentials resolved before anything is touched: a missing env var changes nothing
    secret_body = kube.pull_secret_body(site.registry, site.operator.namespace) if site.registry.pullSecret else None
    kc = kube.resolve_kubeconfig(kubeconfig)
    kube.api_client(kc)  # a malformed kubeconfig is exit 2 here, before any host is touched
    return Prepared(chart.ref, plan.values, secret_body, kc, chart, configmaps)


def check_cluster(plan: Plan, kubeconfig: Path) -> str | None:
    """Read the API server's version and refuse (PreflightError, exit 3) a Kubernetes the release cannot run on,
    naming the newest catalog release that fits; a note when it is outside NVIDIA's validated range. Read-only."""
    from installer import platforms
    from installer.catalog import Catalog

    version = kube.server_version(kube.api_client(kubeconfig))
    cat_dir = plan.release.catalog_dir
    return platforms.check_kubernetes(plan.release.version, version, Catalog(cat_dir).releases(),
                                      f"cluster ({kubeconfig}: Kubernetes {version})", cat_dir)


def install(plan: Plan, prepared: Prepared, timeout: float = 300, progress: Progress | None = None,
            wait: bool = True) -> InstallReport:
    """Namespace, pull Secret, `helm upgrade --install` with what prepare() checked."""
    site = plan.site
    say = progress or _quiet
    t0 = time.monotonic()
    pre = prepared
    ref, values, kc = pre.chart, pre.values, pre.kubeconfig
    ns = site.operator.namespace
    ps = site.registry.pullSecret
    client = kube.api_client(kc)
    ns_action = kube.ensure_namespace(client, ns, timeout=timeout)
    say(f"namespace {ns}: {ns_action}")
    secret_action = "none"
    if ps and pre.secret_body:
        secret_action = kube.ensure_secret(client, pre.secret_body)
        say(f"pull secret {ns}/{ps.name}: {secret_action}")
    from installer.features import monitoring

    for cm in monitoring.configmaps_before_operator(plan):  # releases below v24.9.0 only name the metrics ConfigMap
        action = kube.apply_object(client, cm)
        say(f"ConfigMap {ns}/{cm['metadata']['name']} (DCGM exporter metrics): {action}")
    cm_actions = []
    for cm in pre.configmaps:  # the driver container's package sources, mounted by name (driver.repoConfig)
        cm_actions.append((f"{ns}/{cm['metadata']['name']}", kube.apply_object(client, cm)))
        say(f"ConfigMap {cm_actions[-1][0]} (driver package sources): {cm_actions[-1][1]}")
    crds = chart_crds(plan, ref)
    say(f"CRDs of the chart: server-side apply of {len(crds)} ({', '.join(c['metadata']['name'] for c in crds)})")
    crd_actions = kube.apply_crds(client, crds, timeout=min(120.0, timeout))
    for line in crd_lines(crd_actions):
        say(line)
    say(f"helm upgrade --install --skip-crds {site.operator.releaseName} {pre.shown} -n {ns}"
        f"{f' (wait up to {timeout:.0f}s)' if wait else ''}")
    remaining = max(30.0, timeout - (time.monotonic() - t0))
    state = helm.install_or_upgrade(ref, site.operator.releaseName, ns, values, kc, timeout=remaining, wait=wait)
    swept = None
    if state.changed:  # what failed revisions made, which the upgrade's diff (against the deployed one) does not see
        from installer.upgrade import orphans

        swept = orphans.after_upgrade(site.operator.releaseName, ns, state.history_before, state.revision, kc,
                                      client, say)
    return InstallReport(state, ns, ns_action, ps.name if ps else None, secret_action, time.monotonic() - t0,
                         crd_actions, swept, cm_actions)


@dataclass
class PlanReport:
    """install() in check mode: what it would do, found read-only."""

    namespace: str
    namespace_phase: str | None
    secret: str | None
    secret_exists: bool
    release: str
    plan: helm.ReleasePlan
    crds: list[tuple[str, str]] = field(default_factory=list)  # dry-run server-side apply: (name, action)
    #: deployed values → rendered values, three-way (installer.upgrade.release.values_diff; secrets redacted)
    values_diff: list[str] = field(default_factory=list)
    #: the driver container's package-source ConfigMaps: (namespace/name, what a dry-run apply says)
    configmaps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return (self.plan.action != "unchanged" or self.namespace_phase is None
                or bool(self.secret and not self.secret_exists) or any(a != "unchanged" for _, a in self.crds)
                or any(a != "unchanged" for _, a in self.configmaps))

    def lines(self) -> list[str]:
        out = [f"namespace {self.namespace}: " + (self.namespace_phase or "would be created")]
        if self.secret:
            out.append(f"pull secret {self.namespace}/{self.secret}: "
                       + ("exists (would be updated if its content differs)" if self.secret_exists else "would be created"))
        out.extend(f"ConfigMap {name} (driver package sources): {action}" for name, action in self.configmaps)
        out.extend(crd_lines(self.crds, would=True))
        p, cur = self.plan, self.plan.current
        if p.action == "install" or cur is None:
            out.append(f"release {self.release}: would install chart {p.chart}")
        elif p.action == "upgrade":
            out.append(f"release {self.release}: would upgrade revision {cur.revision} ({cur.chart}, {cur.status}) "
                       f"to chart {p.chart} with the rendered values"
                       + (f"; values deployed → rendered ({len(self.values_diff)}):" if self.values_diff else ""))
            out.extend(f"  {line}" for line in self.values_diff)
        else:
            out.append(f"release {self.release}: unchanged at revision {cur.revision} ({cur.status}; same chart and values)")
        return out


def preview(plan: Plan, prepared: Prepared) -> PlanReport:
    """Read-only: namespace, pull Secret and what helm upgrade --install would do (apply --check)."""
    site = plan.site
    client = kube.api_client(prepared.kubeconfig)
    ns, ps = site.operator.namespace, site.registry.pullSecret
    phase = kube.namespace_phase(client, ns)
    exists = bool(ps and phase and kube.secret_info(client, ns, ps.name))
    rp = helm.plan_release(prepared.chart, site.operator.releaseName, ns, prepared.values, prepared.kubeconfig)
    crds = kube.apply_crds(client, chart_crds(plan, prepared.chart), dry_run=True)
    configmaps = [(f"{ns}/{cm['metadata']['name']}", _would(kube.apply_object(client, cm, dry_run=True))
                   if phase else "would be created") for cm in prepared.configmaps]
    return PlanReport(ns, phase, ps.name if ps else None, exists, site.operator.releaseName, rp, crds,
                      deployed_values_diff(plan, prepared) if rp.action == "upgrade" else [], configmaps)


def _would(action: str) -> str:
    return action if action == "unchanged" else f"would be {action}"


def deployed_values_diff(plan: Plan, prepared: Prepared) -> list[str]:
    """The values the release was deployed with → the rendered ones, three-way (what the site changes, what the
    release's defaults change; installer.upgrade.release.values_diff), credentials redacted. Read-only."""
    from installer.catalog import Catalog
    from installer.errors import ConfigError
    from installer.jsonout import secret_values
    from installer.upgrade import release as up

    site = plan.site
    found = helm.release_values(site.operator.releaseName, site.operator.namespace, prepared.kubeconfig)
    if found is None:
        return []
    state, deployed = found
    cur = None
    version = state.chart.rpartition("-")[2]
    try:
        cur = Catalog(plan.release.catalog_dir).get(version, "deployed chart")
    except ConfigError:
        pass  # a chart outside the catalog: the diff still shows every change, marked by the defaults rule
    baseline = up.baseline_values(plan, cur) if cur else None
    return up.values_diff(cur, deployed, plan.release, prepared.values, secret_values(plan), baseline)


@dataclass
class StatusReport:
    namespace: str
    namespace_phase: str | None
    secret: str | None
    secret_info: dict[str, Any] | None
    release: helm.ReleaseState | None
    release_name: str

    @property
    def installed(self) -> bool:
        return self.release is not None and self.release.status == "deployed"

    def lines(self) -> list[str]:
        out = [f"namespace {self.namespace}: {self.namespace_phase or 'absent'}"]
        if self.secret:
            i = self.secret_info
            out.append(f"pull secret {self.namespace}/{self.secret}: "
                       + (f"{i['type']}, registries {', '.join(i['registries']) or '-'}" if i else "absent"))
        r = self.release
        out.append(f"release {self.release_name}: "
                   + (f"revision {r.revision} {r.status} ({r.chart})" if r else "not installed"))
        return out

    def to_json(self) -> dict[str, Any]:
        """The state as gpu-install.operator-status/v1 has it (installer.jsonout; docs/json.md): names, phases,
        the pull Secret's type and registry hosts -- never its credentials."""
        i, r = self.secret_info, self.release
        return {
            "namespace": {"name": self.namespace, "phase": self.namespace_phase},
            "pullSecret": None if not self.secret else {
                "name": self.secret, "present": i is not None, "type": i["type"] if i else None,
                "registries": list(i["registries"]) if i else [],
                "managedByGpuInstall": i is not None and all(
                    (i["labels"] or {}).get(k) == v for k, v in kube.MANAGED_BY.items())},
            "helmRelease": {"name": self.release_name, "installed": r is not None,
                            "revision": r.revision if r else None, "status": r.status if r else None,
                            "chart": r.chart if r else None},
            "deployed": self.installed,
        }


def status(plan: Plan, kubeconfig: str | os.PathLike[str] | None) -> StatusReport:
    site = plan.site
    kc = kube.resolve_kubeconfig(kubeconfig)
    client = kube.api_client(kc)
    ns = site.operator.namespace
    ps = site.registry.pullSecret
    phase = kube.namespace_phase(client, ns)
    info = kube.secret_info(client, ns, ps.name) if ps and phase else None
    rel = helm.release_state(site.operator.releaseName, ns, kc) if phase else None
    return StatusReport(ns, phase, ps.name if ps else None, info, rel, site.operator.releaseName)


@dataclass
class UninstallReport:
    release: str
    namespace: str
    release_removed: bool
    secret_removed: bool
    namespace_deleted: bool
    crds_deleted: list[str] | None = None  # None: not purged (--purge-crds not given)
    configmaps_removed: list[str] = field(default_factory=list)  # the driver package-source ConfigMaps gpu-install made

    def lines(self) -> list[str]:
        out = [f"release {self.release}: {'uninstalled' if self.release_removed else 'was not installed'}"]
        out.append(f"pull secret: {'deleted' if self.secret_removed else 'none of ours'}")
        if self.configmaps_removed:
            out.append(f"driver package-source ConfigMaps: deleted {', '.join(self.configmaps_removed)}")
        out.append(f"namespace {self.namespace}: {'deletion started' if self.namespace_deleted else 'kept'}")
        if self.crds_deleted is None:
            out.append("CRDs: kept (helm leaves a chart's CRDs in place; --purge-crds deletes them when no custom "
                       "resource of theirs is left)")
        else:
            out.append("CRDs: " + (f"deleted {', '.join(self.crds_deleted)}" if self.crds_deleted
                                   else "none of the chart's were present"))
        return out


def remaining_resources(client: Any, crd_names: list[str], release: str | None = None,
                        namespace: str | None = None) -> list[str]:
    """The custom resources of the named CRDs, except (with release) those the Helm release itself owns (its
    uninstall deletes them)."""
    items = kube.custom_resources(client, crd_names)
    if release is None:
        return [i for i, _ in items]
    return [i for i, ann in items if not (ann.get("meta.helm.sh/release-name") == release
                                          and ann.get("meta.helm.sh/release-namespace") == namespace)]


def _refuse_purge(left: list[str], crd_names: list[str], after_release: bool) -> PreflightError:
    shown = ", ".join(left[:20]) + (f" (+{len(left) - 20} more)" if len(left) > 20 else "")
    return PreflightError(
        f"--purge-crds: {len(left)} custom resource(s) of the chart's CRDs remain: {shown}; no CRD was deleted"
        + (" (the release is already uninstalled)" if after_release else " and nothing was changed"),
        hint=f"delete them first (kubectl delete <kind> [-n <namespace>] <name>), then re-run; the CRDs: "
             f"{', '.join(crd_names)}")


def uninstall(plan: Plan, kubeconfig: str | os.PathLike[str] | None, yes: bool, delete_namespace: bool = False,
              timeout: float = 300, progress: Progress | None = None, purge_crds: bool = False,
              chart_ref: str | os.PathLike[str] | None = None) -> UninstallReport:
    """Reverse install(): helm uninstall, delete the pull Secret gpu-install made; the namespace
    only with delete_namespace. Refuses without yes (nothing is touched).

    purge_crds: the CRDs the chart carries (with the plan's values: as install() applied them) are deleted after
    the release is gone -- only when no custom resource of theirs is left; else PreflightError (exit 3) naming
    them, no CRD deleted. Resources that are not the release's own are looked for before anything is touched."""
    site = plan.site
    ns, name = site.operator.namespace, site.operator.releaseName
    if not yes:
        what = f"Helm release {name} and its resources in namespace {ns}" + (" and the namespace" if delete_namespace else "")
        raise ConfigError(f"operator uninstall removes the {what}; not confirmed",
                          hint="re-run with --yes to confirm")
    say = progress or _quiet
    ref = load_chart(plan, chart_ref).ref if purge_crds else None  # exit 2 before anything is touched
    kc = kube.resolve_kubeconfig(kubeconfig)
    client = kube.api_client(kc)
    crd_names: list[str] = []
    if ref is not None:
        crd_names = [c["metadata"]["name"] for c in chart_crds(plan, ref)]
        say(f"--purge-crds: the chart's CRDs: {', '.join(crd_names) or 'none'}")
        left = remaining_resources(client, crd_names, name, ns)
        if left:
            raise _refuse_purge(left, crd_names, after_release=False)
    say(f"helm uninstall {name} -n {ns}")
    removed = helm.uninstall(name, ns, kc, timeout=timeout) if kube.namespace_phase(client, ns) else False
    ps = site.registry.pullSecret
    secret_removed = kube.delete_secret_if_ours(client, ns, ps.name) if ps else False
    from installer import driver_repo

    # after the release: its driver pods mount them; only ours (the managed-by label), whatever the site says now
    cms = [f"{ns}/{cm['metadata']['name']}" for cm in driver_repo.removal_targets(site)
           if kube.delete_object_if_ours(client, cm)]
    for name in cms:
        say(f"ConfigMap {name} (driver package sources): deleted")
    deleted: list[str] | None = None
    if ref is not None:
        left = remaining_resources(client, crd_names)
        if left:
            raise _refuse_purge(left, crd_names, after_release=True)
        say(f"delete CRDs {', '.join(crd_names)}")
        deleted = kube.delete_crds(client, crd_names, timeout=min(120.0, timeout))
    ns_deleted = kube.delete_namespace(client, ns) if delete_namespace else False
    return UninstallReport(name, ns, removed, secret_removed, ns_deleted, deleted, cms)
