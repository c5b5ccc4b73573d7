"""The release side of `gpu-install upgrade plan`: the deployed GPU Operator release (CurrentRelease) against the
target one (the Plan resolved for the target operator.version). Read-only; pure functions over data, except
release_report(), which renders the target chart with helm and, given a client, lists the custom resources.

- components CURRENT → TARGET: chart, every image as the values deploy it, driver (mode, version), toolkit;
- the values diff deployed → target, three-way: a change the release's defaults/pins explain (the catalog entries of
  the two releases) is marked `(release default)`, any other `(site)`; secrets never appear;
- the hop: NVIDIA supports upgrades within a major release or to the next one, a major being YY.MM ("The first two
  fields, YY.MM identify a major version … Upgrades are only supported within a major release or to the next major
  release.", docs.nvidia.com/datacenter/cloud-native/gpu-operator/latest/platform-support.html, "NVIDIA GPU Operator
  Versioning" and "Life Cycle"; v1.11 is the last major of the old scheme, v22.9 the first calendar one, per the
  22.9.2 platform-support page). A hop over majors is a blocker naming them and the releases to go through;
- the catalog's Kubernetes range for the target against the cluster's version (installer.platforms);
- the target chart's rendered objects against the cluster's Kubernetes API schemas (kubernetes-validate, offline);
- CRDs: versions added/removed, schema fields removed, and fields that existing custom resources use and the new
  schema would prune (data loss: a blocker). CRDs are never downgraded by a rollback.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from installer.catalog import Catalog, Component, Release, join_path, lookup, parse_release, release_name, split_path
from installer.errors import ConfigError, GpuInstallError
from installer.upgrade.model import Blocker, Change, CurrentRelease, ReleaseReport

if TYPE_CHECKING:
    from installer.plan import Plan

CLUSTER = "(cluster)"
REDACTED = "***"
#: keys whose values are credentials (the same words installer.ansible hides from logs)
SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|credential|private_?key|api_?key|auth", re.I)
#: keys that name a Secret object, not its content (imagePullSecrets: [name], kata's artifacts.pullSecret, …)
SECRET_REF = re.compile(r"(image)?pullsecrets?$|secretname$|secretref$", re.I)


# ---------------------------------------------------------------- versions and the hop


def major(tag: str) -> tuple[int, int] | None:
    """The major version of a GPU Operator release: YY.MM (calendar releases) or 1.MINOR (before v22.9)."""
    v = parse_release(tag)
    return None if v is None else (v.release[0], v.release[1])


def show_major(m: tuple[int, int]) -> str:
    return f"v{m[0]}.{m[1]}"


def hop_blockers(current: str, target: str, releases: Iterable[str], allow_skip: bool = False) -> tuple[
        list[Blocker], list[str]]:
    """(blockers, findings) of going from release current to target: a downgrade is not an upgrade; more than one
    major ahead skips majors, each named, with the releases to go through (the newest patch of each major between,
    in order, from the catalog) -- a blocker, or with allow_skip a finding (the admin takes the unsupported hop)."""
    cv, tv = parse_release(current), parse_release(target)
    cm, tm = major(current), major(target)
    if cv is None or tv is None or cm is None or tm is None:
        return [], [f"release {current} → {target}: not a vYY.M.P pair, the hop is not checked"]
    if tv < cv:
        return [Blocker(CLUSTER, f"target {target} is older than the deployed {current}: that is a rollback, not an "
                                 "upgrade (CRDs are never downgraded)",
                        f"set operator.version (or --to) to {current} or newer")], []
    if tv == cv:
        return [], [f"release {current} is deployed already: the chart does not change"]
    by_major: dict[tuple[int, int], list[str]] = {}
    for r in sorted(releases, key=lambda t: parse_release(t) or parse_release("0.0.0")):  # type: ignore[arg-type,return-value]
        m = major(r)
        if m is not None:
            by_major.setdefault(m, []).append(r)
    between = [m for m in sorted(by_major) if cm < m < tm]
    if not between:
        kind = "a patch release" if cm == tm else "the next major release"
        return [], [f"{current} → {target}: {kind}, supported by NVIDIA's upgrade policy"]
    skipped = ", ".join(show_major(m) for m in between)
    path = [by_major[m][-1] for m in between]
    what = (f"{current} → {target} skips the major release{'s' if len(between) > 1 else ''} {skipped}: NVIDIA "
            "supports upgrades within a major release or to the next one only")
    fix = (f"upgrade through {' → '.join(path)} first (one `gpu-install upgrade` per release: set operator.version "
           f"to {path[0]}), then to {target}")
    if allow_skip:
        return [], [f"{what} (allowed; the supported path: {' → '.join(path)} → {target})"]
    return [Blocker(CLUSTER, what, fix)], []


def kube_blockers(target: str, kube_version: str, releases: list[str], catalog_dir: Any) -> tuple[
        list[Blocker], list[str]]:
    """The catalog's Kubernetes range for the target against the cluster's version (installer.platforms)."""
    from installer import platforms

    try:
        note = platforms.check_kubernetes(target, kube_version, releases, f"cluster (Kubernetes {kube_version})",
                                          catalog_dir)
    except GpuInstallError as exc:
        return [Blocker(CLUSTER, exc.message, exc.hint or "")], []
    return [], [note] if note else []


# ---------------------------------------------------------------- components


def _image(values: Mapping[str, Any], spec: Component) -> str | None:
    """The image a component runs with these values: the values' repository/image/version (tag for NFD), else the
    release's pins."""
    from installer.catalog import image_ref

    base = spec.values_path
    repo = lookup(values, f"{base}.repository") or spec.repository
    if spec.is_nfd:
        image, version = None, lookup(values, f"{base}.tag") or spec.version
    else:
        image, version = lookup(values, f"{base}.image") or spec.image, lookup(values, f"{base}.version") or spec.version
    if not repo or not version:
        return None
    return image_ref(str(repo), str(image) if image else None, str(version))


def _deployed(values: Mapping[str, Any], release: Release, spec: Component) -> bool:
    from installer.render.values import ResolvedComponent, deployed

    return deployed(dict(values), release, ResolvedComponent(spec, spec.repository, spec.image, spec.version))


def driver_state(values: Mapping[str, Any], release: Release) -> tuple[str, str | None]:
    """(mode, version) of the driver as the values deploy it: host (driver.enabled false: the nodes' own driver,
    its version is the node side's to read), precompiled or operator with the image tag."""
    from installer.render.values import effective

    if effective(dict(values), release, "driver.enabled") is False:
        return "host", None
    comp = release.components.get("driver")
    version = lookup(values, "driver.version") or (comp.version if comp else None)
    mode = "precompiled" if effective(dict(values), release, "driver.usePrecompiled") else "operator"
    return mode, None if version is None else str(version)


def toolkit_state(values: Mapping[str, Any], release: Release) -> str | None:
    """The container toolkit image tag the values deploy; None when the operator does not deploy it."""
    from installer.render.values import effective

    if effective(dict(values), release, "toolkit.enabled") is False:
        return None
    comp = release.components.get("toolkit")
    v = lookup(values, "toolkit.version") or (comp.version if comp else None)
    return None if v is None else str(v)


def component_changes(cur: Release | None, cur_values: Mapping[str, Any] | None, tgt: Release,
                      tgt_values: Mapping[str, Any], chart_from: str | None) -> tuple[list[Change], bool, bool]:
    """The component table (every row, changed or not), and whether the driver / the toolkit change."""
    rows = [Change("chart", chart_from, f"gpu-operator-{tgt.version}")]
    cv = cur_values or {}
    dm_c, dv_c = driver_state(cv, cur) if cur else (None, None)
    dm_t, dv_t = driver_state(tgt_values, tgt)
    rows.append(Change("driver", None if dm_c is None else _driver_text(dm_c, dv_c), _driver_text(dm_t, dv_t)))
    tk_c = toolkit_state(cv, cur) if cur else None
    tk_t = toolkit_state(tgt_values, tgt)
    rows.append(Change("toolkit", tk_c, tk_t))
    for name in sorted(set(cur.components if cur else ()) | set(tgt.components)):
        cs = cur.components.get(name) if cur else None
        ts = tgt.components.get(name)
        a = _image(cv, cs) if cur and cs and _deployed(cv, cur, cs) else None
        b = _image(tgt_values, ts) if ts and _deployed(tgt_values, tgt, ts) else None
        if a is None and b is None:
            continue
        rows.append(Change(f"image {name}", a, b))
    driver_changes = cur is None or (dm_c, dv_c) != (dm_t, dv_t)
    toolkit_changes = cur is None or tk_c != tk_t
    return rows, driver_changes, toolkit_changes


def _driver_text(mode: str, version: str | None) -> str:
    return f"{mode} {version}" if version else mode


# ---------------------------------------------------------------- values diff


def _flatten(values: Mapping[str, Any], open_keys: frozenset[str], prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """path → leaf (lists, scalars, free-form subtrees whole)."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        parts = (*prefix, str(k))
        path = join_path(list(parts))
        if isinstance(v, Mapping) and v and path not in open_keys:
            out.update(_flatten(v, open_keys, parts))
        else:
            out[path] = v
    return out


def release_default(release: Release, path: str) -> Any:
    """What a release gives a values path when the values do not set it: its chart default (catalog defaults) or
    the component's pinned image coordinates."""
    if path in release.defaults:
        return release.defaults[path]
    parts = split_path(path)
    base, leaf = join_path(parts[:-1]), parts[-1]
    for comp in release.components.values():
        if comp.values_path == base:
            if leaf == "version" or (comp.is_nfd and leaf == "tag"):
                return comp.version
            if leaf == "image" and not comp.is_nfd:
                return comp.image
    return None


def secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(key)) and not SECRET_REF.search(key)


def redact_value(value: Any, secrets: Iterable[str] = ()) -> Any:
    """value with what sits under a credential key (and {name: X_TOKEN, value: …} env entries) replaced, and every
    given secret string hidden in string values, never in keys (installer.jsonout.redact: the site's password/token
    variables -- not user names --, URL userinfo)."""
    from installer.jsonout import redact

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            secret_env = isinstance(v.get("name"), str) and secret_key(v["name"])
            return {k: (REDACTED if secret_key(str(k)) or (secret_env and k == "value") else walk(x))
                    for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x) for x in v]
        return v

    return redact(walk(value), secrets)


def _show(value: Any) -> str:
    import json

    if value is None:
        return "(unset)"
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def values_diff(cur: Release | None, deployed: Mapping[str, Any], tgt: Release, target: Mapping[str, Any],
                secrets: Iterable[str] = (), baseline: Mapping[str, Any] | None = None) -> list[str]:
    """Deployed values → target values, three-way. With baseline (today's site rendered for the CURRENT release):
    a path where the baseline equals the deployed value changes because the release does, `(release default)`; where
    it equals the target value, because the site does, `(site)`; else both, `(site, release default)`. Without a
    baseline: a path whose deployed value is the current release's default or pin (or unset) and whose target value
    is the target release's (or unset) is `(release default)`, any other `(site)`. Paths the values leave unset count
    too when the two releases' defaults differ. Credentials are redacted (key names and the given secret
    strings)."""
    opened = tgt.open_keys | (cur.open_keys if cur else frozenset())
    d, t = _flatten(deployed, opened), _flatten(target, opened)
    base = None if baseline is None else _flatten(baseline, opened)
    keys = set(d) | set(t) | set(tgt.defaults) | set(cur.defaults if cur else ())
    hidden = list(secrets)
    out: list[str] = []
    for path in sorted(keys):
        dflt_c = release_default(cur, path) if cur else None
        dflt_t = release_default(tgt, path)
        before = d[path] if path in d else dflt_c
        after = t[path] if path in t else dflt_t
        if before == after:
            continue
        if base is not None:
            was = base[path] if path in base else dflt_c
            why = "release default" if was == before else "site" if was == after else "site, release default"
        else:
            by_release = (path not in d or d[path] == dflt_c) and (path not in t or t[path] == dflt_t)
            why = "release default" if by_release else "site"
        secret = any(secret_key(p) for p in split_path(path))
        a = REDACTED if secret and before is not None else _show(redact_value(before, hidden))
        b = REDACTED if secret and after is not None else _show(redact_value(after, hidden))
        mark = "+" if before is None else "-" if after is None else "~"
        out.append(f"{mark} {path}: {a} -> {b} ({why})")
    return out


# ---------------------------------------------------------------- the report


def chart_ref(plan: Plan) -> str | None:
    """The chart apply installs: GPU_INSTALL_CHART, else the site's operator.chart (the CLI's --chart is passed
    explicitly)."""
    from installer.cli.common import ENV_CHART

    return os.environ.get(ENV_CHART) or plan.site.operator.chart


def baseline_values(plan: Plan, release: Release) -> dict[str, Any] | None:
    """Today's site rendered for another release (the deployed one): the third side of the values diff; None when
    the site does not render for it (a setting that release does not have)."""
    from installer.render.values import build_values, resolve_components

    site = plan.site.model_copy(deep=True)
    site.operator.version = release.version
    try:
        return build_values(site, release, resolve_components(site, release))
    except ConfigError:
        return None


def release_report(plan: Plan, current: CurrentRelease | None, kube_version: str, client: Any | None,
                   chart: str | None = None, catalog: Catalog | None = None,
                   allow_skip: bool = False) -> ReleaseReport:
    """The release side of the upgrade plan (see the module's docstring). chart: the target chart (default: what
    apply installs, chart_ref(); "" for none); without one, the rendered objects and CRDs are not checked, which a finding says.
    client: an ApiClient to list the custom resources with (None offline: their fields are not checked).
    allow_skip: a hop over major releases is a finding, not a blocker."""
    from installer.jsonout import secret_values

    tgt = plan.release
    cat = catalog or Catalog(tgt.catalog_dir)
    releases = cat.releases()
    blockers: list[Blocker] = []
    findings: list[str] = []
    cur_rel: Release | None = None
    if current is not None:
        try:
            cur_rel = cat.get(current.chart_version, "deployed chart")
        except ConfigError as exc:
            findings.append(f"deployed chart {current.chart_version} is not in the catalog ({exc.message}): its "
                            "defaults and images are taken from its values only")
        b, f = hop_blockers(_norm(current.chart_version), tgt.version, releases, allow_skip)
        blockers += b
        findings += f
    b, f = kube_blockers(tgt.version, kube_version, releases, tgt.catalog_dir)
    blockers += b
    findings += f
    chart_from = f"gpu-operator-{_norm(current.chart_version)}" if current else None
    changes, drv, tk = component_changes(cur_rel, current.values if current else None, tgt, plan.values, chart_from)
    baseline = baseline_values(plan, cur_rel) if cur_rel else None
    vdiff = values_diff(cur_rel, current.values if current else {}, tgt, plan.values, secret_values(plan), baseline)
    crd_changes: list[str] = []
    digests: dict[str, str] = {}
    ref = chart_ref(plan) if chart is None else chart or None  # "": no chart, on purpose
    if ref is None:
        findings.append("no chart (operator.chart, GPU_INSTALL_CHART or --chart): the target's rendered objects and "
                        "CRDs are not checked")
    else:

        site = plan.site
        objects, new_crds = render_with_crds(ref, plan.values, site.operator.releaseName, site.operator.namespace,
                                             kube_version)
        b, f = schema_blockers(objects, kube_version)
        blockers += b
        findings += f
        old_crds = dict(current.crds) if current else {}
        if client is not None:  # the target chart's other CRDs (node-feature-discovery's) as the cluster has them
            from installer import kube

            for c in new_crds:
                name = str((c.get("metadata") or {}).get("name"))
                if name not in old_crds and (obj := kube._crd_raw(client, name)) is not None:
                    old_crds[name] = obj
        crd_changes += crd_diff(old_crds, new_crds)
        digests = {"objects": canonical_digest(objects), "crds": canonical_digest(new_crds)}
        if client is not None:
            blockers += pruned_fields(new_crds, custom_objects(client, old_crds))
        elif old_crds:
            findings.append("offline: the fields existing custom resources use are not checked against the new CRDs")
    if current is not None:
        findings.append("rollback restores the Helm revision and its values; CRDs are never downgraded")
    return ReleaseReport(current=current, target_version=tgt.version, changes=tuple(changes),
                         values_diff=tuple(vdiff), crd_changes=tuple(crd_changes), findings=tuple(findings),
                         blockers=tuple(blockers), driver_changes=drv, toolkit_changes=tk, target_digests=digests)


def canonical_digest(value: Any) -> str:
    """sha256 of a value as canonical JSON (sorted keys, no spaces): the same objects give the same digest whatever
    their order of keys."""
    raw = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _norm(tag: str) -> str:
    v = parse_release(tag)
    return release_name(v) if v else tag


# ---------------------------------------------------------------- rendered objects vs the Kubernetes API


def render(chart: str, values: Mapping[str, Any], release: str, namespace: str,
           kube_version: str) -> list[dict[str, Any]]:
    """`helm template --kube-version` of the target chart: the objects as the cluster's helm would render them (the
    GPU Operator's templates test .Capabilities.KubeVersion, e.g. its PodSecurityPolicy below 1.25)."""
    return render_with_crds(chart, values, release, namespace, kube_version)[0]


def render_with_crds(chart: str, values: Mapping[str, Any], release: str, namespace: str,
                     kube_version: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """render() and the chart's CRDs (its crds/ and its enabled subcharts', installer.helm.split_crds) from one
    `helm template --include-crds`."""
    import json

    import yaml
    from pyhelm3.command import Command

    from installer import helm
    from installer.tools import ensure_helm

    kmaj, kmin = _minor(kube_version)

    async def run() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        cmd = Command(executable=str(ensure_helm()))
        ref, version = helm.oci_version(chart)
        raw = await cmd.run(["template", release, ref, *(["--version", version] if version else []),
                             "--kube-version", f"v{kmaj}.{kmin}.0", "--include-crds", "--namespace", namespace,
                             "--values", "-"], json.dumps(values).encode())
        text = raw.decode()
        crds = helm.split_crds(text)
        names = {str((c.get("metadata") or {}).get("name")) for c in crds}
        objects = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)
                   and not (d.get("kind") == "CustomResourceDefinition"
                            and str((d.get("metadata") or {}).get("name")) in names)]
        return objects, crds

    return helm._run(run(), f"helm template {chart}", "check the chart reference and the rendered values")


#: fields newer than the oldest schema kubernetes-validate ships (1.25): checked by rule below it
#: (Probe.grpc: alpha in 1.23 with the gate off, beta and on by default in 1.24 -- values/catalog/platforms.yaml)
GRPC_PROBE_MIN = (1, 24)
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def _minor(version: str) -> tuple[int, int]:
    from installer.platforms import kube_minor

    m = kube_minor(version, "Kubernetes version")
    return (int(m[0]), int(m[1]))


def schema_version(kube_version: str) -> tuple[str | None, str]:
    """The kubernetes-validate schema set to check against: the newest shipped ≤ the cluster's minor (None when the
    cluster is older than every shipped set: the oldest is used, plus the rules for newer fields), and a note."""
    from kubernetes_validate import utils

    want = _minor(kube_version)
    shipped = sorted({tuple(int(x) for x in v.split(".")[:2]) for v in utils.all_versions()})
    below = [v for v in shipped if v <= want]
    if want > shipped[-1]:
        v = shipped[-1]
        return f"{v[0]}.{v[1]}.0", (f"Kubernetes {v[0]}.{v[1]} API schemas (the newest shipped; the cluster's "
                                    f"{want[0]}.{want[1]} is newer)")
    if below:
        v = below[-1]
        note = "" if v == want else f" (the newest schema set shipped at or below {want[0]}.{want[1]})"
        return f"{v[0]}.{v[1]}.0", f"Kubernetes {v[0]}.{v[1]} API schemas{note}"
    v = shipped[0]
    return None, (f"Kubernetes {v[0]}.{v[1]} API schemas (the oldest shipped; the cluster's {want[0]}.{want[1]} is "
                  "older: fields newer than it are checked by rule)")


def _builtin(api_version: str) -> bool:
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def _pod_spec_paths(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        yield "spec", spec
    elif obj.get("kind") == "CronJob":
        yield "spec.jobTemplate.spec.template.spec", (((spec.get("jobTemplate") or {}).get("spec") or {})
                                                      .get("template") or {}).get("spec") or {}
    elif isinstance(spec.get("template"), Mapping):
        yield "spec.template.spec", spec["template"].get("spec") or {}


def _grpc_probes(obj: Mapping[str, Any]) -> list[str]:
    out = []
    for base, pod in _pod_spec_paths(obj):
        for field in ("initContainers", "containers"):
            for c in pod.get(field) or []:
                for probe in PROBES:
                    if isinstance(c.get(probe), Mapping) and "grpc" in c[probe]:
                        out.append(f"{base}.{field}[{c.get('name')}].{probe}.grpc")
    return out


def _what(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


def schema_blockers(objects: Iterable[Mapping[str, Any]], kube_version: str) -> tuple[list[Blocker], list[str]]:
    """Every rendered object of a built-in API checked against the cluster version's schema (strict: a field the
    API does not know is pruned or refused); custom resources are the CRDs' business. (blockers, findings)."""
    import kubernetes_validate as kv

    version, note = schema_version(kube_version)
    want = _minor(kube_version)
    objs = [o for o in objects if isinstance(o, Mapping) and o.get("apiVersion") and o.get("kind")]
    checked = 0
    blockers: list[Blocker] = []
    unknown: list[str] = []
    later: list[str] = []
    for obj in objs:
        api = str(obj["apiVersion"])
        if not _builtin(api):
            continue
        checked += 1
        what = _what(obj)
        if want < GRPC_PROBE_MIN:
            for path in _grpc_probes(obj):
                blockers.append(Blocker(CLUSTER, f"{what}: {path}: gRPC probes need Kubernetes 1.24 or newer "
                                                 f"(the cluster runs {want[0]}.{want[1]})",
                                        "upgrade the cluster to Kubernetes 1.24 or newer first"))
        try:
            kv.validate(dict(obj), version or "1.25.0", strict=True)
        except kv.SchemaNotFoundError:
            if version is None:  # older than every shipped schema set: what 1.25 lacks may well be served here
                unknown.append(f"{api} {obj['kind']}")
                continue
            blockers.append(Blocker(CLUSTER, f"{what}: {api} {obj['kind']} is not served by Kubernetes "
                                             f"{want[0]}.{want[1]}",
                                    "a target release that does not render it (or a values setting that turns it "
                                    "off, e.g. psp.enabled: false), or a cluster that serves the API"))
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            hook = _hook_outside_upgrade(obj)
            if hook:  # helm builds (and validates) a hook only when it fires: not on this upgrade
                later.append(f"{what}: {path or '(object)'}: {exc.message} (Kubernetes {want[0]}.{want[1]} API "
                             f"schema; a {hook} hook: not run by the upgrade, refused when it fires)")
                continue
            blockers.append(Blocker(CLUSTER, f"{what}: {path or '(object)'}: {exc.message} (Kubernetes "
                                             f"{want[0]}.{want[1]} API schema)",
                                    "a target release or values that render a field this Kubernetes knows, or "
                                    "upgrade the cluster"))
    findings = [f"{checked - len(unknown)} rendered objects checked against the {note}"]
    if unknown:
        findings.append(f"not checked (no schema below Kubernetes 1.25): {', '.join(sorted(set(unknown)))}")
    return blockers, findings + later


#: the helm hooks an upgrade runs (helm upgrade: pre-upgrade, post-upgrade)
UPGRADE_HOOKS = {"pre-upgrade", "post-upgrade"}


def _hook_outside_upgrade(obj: Mapping[str, Any]) -> str | None:
    """The hook events of a helm hook object that `helm upgrade` does not run (post-delete, test, …); None for a
    release object or a hook the upgrade runs."""
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    events = {e.strip() for e in str(ann.get("helm.sh/hook") or "").split(",") if e.strip()}
    return None if not events or events & UPGRADE_HOOKS else ",".join(sorted(events))


# ---------------------------------------------------------------- CRDs


def _versions(crd: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(v.get("name")): v for v in ((crd.get("spec") or {}).get("versions") or [])}


def _storage(crd: Mapping[str, Any]) -> str | None:
    vs = _versions(crd)
    return next((n for n, v in vs.items() if v.get("storage")), next(iter(vs), None))


def schema_fields(schema: Mapping[str, Any] | None, prefix: str = "") -> set[str]:
    """Every property path an openAPIV3Schema declares (list items as [])."""
    out: set[str] = set()
    if not isinstance(schema, Mapping):
        return out
    for name, sub in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else str(name)
        out.add(path)
        out |= schema_fields(sub, path)
    if isinstance(schema.get("items"), Mapping):
        out |= schema_fields(schema["items"], f"{prefix}[]")
    return out


def _schema(crd: Mapping[str, Any], version: str | None) -> Mapping[str, Any] | None:
    v = _versions(crd).get(version or "")
    return ((v or {}).get("schema") or {}).get("openAPIV3Schema")


def crd_diff(old: Mapping[str, Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the target chart's CRDs change against those in the cluster: CRDs added/left, versions added/removed,
    the storage version, schema fields added/removed (of the storage version)."""
    out: list[str] = []
    newd = {str((c.get("metadata") or {}).get("name")): c for c in new}
    for name in sorted(set(old) | set(newd)):
        a, b = old.get(name), newd.get(name)
        if a is None:
            out.append(f"+ CRD {name}: new ({', '.join(_versions(b or {}))})")
            continue
        if b is None:
            out.append(f"= CRD {name}: not in the target chart (left as it is)")
            continue
        va, vb = _versions(a), _versions(b)
        for v in sorted(set(vb) - set(va)):
            out.append(f"+ CRD {name}: version {v}")
        for v in sorted(set(va) - set(vb)):
            out.append(f"- CRD {name}: version {v} removed")
        sa, sb = _storage(a), _storage(b)
        if sa != sb:
            out.append(f"~ CRD {name}: storage version {sa} -> {sb}")
        fa, fb = schema_fields(_schema(a, sa)), schema_fields(_schema(b, sb))
        added, removed = _tops(fb - fa), _tops(fa - fb)
        if added:
            out.append(f"~ CRD {name}: {len(added)} schema field{'s' if len(added) != 1 else ''} added "
                       f"({_few(added)})")
        if removed:
            out.append(f"~ CRD {name}: {len(removed)} schema field{'s' if len(removed) != 1 else ''} removed "
                       f"({_few(removed)})")
        if not (set(va) ^ set(vb)) and sa == sb and not added and not removed:
            out.append(f"= CRD {name}: schema unchanged")
    return out


def _tops(paths: Iterable[str]) -> list[str]:
    """The paths not below another one of them (a removed object, not each of its fields)."""
    ps = set(paths)
    return sorted(p for p in ps if not any(p.startswith(q + ".") or p.startswith(q + "[") for q in ps if q != p))


def _few(paths: list[str], n: int = 6) -> str:
    return ", ".join(paths[:n]) + (f", … {len(paths) - n} more" if len(paths) > n else "")


KEY_DOT = "\x00"  # a dot inside a key of a used_fields() path


def used_fields(obj: Any, prefix: str = "") -> set[str]:
    """Every field path an object sets (list items as [])."""
    out: set[str] = set()
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = str(k).replace(".", KEY_DOT)  # a map key may hold dots (label keys): one path part all the same
            path = f"{prefix}.{key}" if prefix else key
            out.add(path)
            out |= used_fields(v, path)
    elif isinstance(obj, list):
        for it in obj:
            out |= used_fields(it, f"{prefix}[]")
    return out


def _kept(schema: Mapping[str, Any] | None, path: str) -> bool:
    """Does a structural schema keep this field path (declared, or below a free-form / preserve-unknown node)?"""
    node: Any = schema
    for part in re.findall(r"[^.\[\]]+|\[\]", path):
        if not isinstance(node, Mapping):
            return False
        if node.get("x-kubernetes-preserve-unknown-fields"):
            return True
        if part == "[]":
            node = node.get("items")
            continue
        props = node.get("properties") or {}
        if part.replace(KEY_DOT, ".") in props:
            node = props[part.replace(KEY_DOT, ".")]
        elif isinstance(node.get("additionalProperties"), Mapping):
            node = node["additionalProperties"]
        elif node.get("additionalProperties") is True:
            return True
        else:
            return False
    return True


def pruned_fields(new: Iterable[Mapping[str, Any]], objects: Mapping[str, list[Mapping[str, Any]]]) -> list[Blocker]:
    """Fields existing custom resources set (spec) that the target CRD's storage schema does not keep: the API server
    prunes them on the next write (data loss). objects: CRD name → its custom resources."""
    out: list[Blocker] = []
    newd = {str((c.get("metadata") or {}).get("name")): c for c in new}
    for name, items in sorted(objects.items()):
        crd = newd.get(name)
        if crd is None:
            continue
        schema = _schema(crd, _storage(crd))
        if schema is None:
            continue
        for it in items:
            top = _tops(p for p in used_fields({"spec": it.get("spec") or {}}) if not _kept(schema, p))
            if top:
                out.append(Blocker(CLUSTER, f"{_what(it)}: the target CRD {name} drops field"
                                            f"{'s' if len(top) > 1 else ''} {_few([t.replace(KEY_DOT, '.') for t in top])} that it sets (the API "
                                            "server prunes them: the setting is lost)",
                                   f"move the setting to what the target release names it (`gpu-install catalog "
                                   f"diff`), or remove it from the {it.get('kind')}, then plan again"))
    return out


def custom_objects(client: Any, crds: Mapping[str, Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The custom resources of each CRD in the cluster (read through its storage version)."""
    import functools
    import json

    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    from installer import kube

    api = k.CustomObjectsApi(client)
    out: dict[str, list[Mapping[str, Any]]] = {}
    for name, crd in crds.items():
        spec = crd.get("spec") or {}
        version = _storage(crd)
        if not version or not spec.get("group"):
            continue
        what = f"list {spec['names']['kind']} ({name})"
        try:
            resp = kube._call(what, functools.partial(api.list_cluster_custom_object, spec["group"], version,
                                                     spec["names"]["plural"], _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise kube._api_error(what, exc) from None
        out[name] = list(json.loads(resp.data).get("items") or [])
    return out
