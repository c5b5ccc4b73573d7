"""The chart apply, `operator install` and `upgrade` install is the one that was signed and pushed
(installer.operator.load_chart): a chart archive is read once into a private copy while it is hashed, held against
operator.chartSha256 or against the signed lock of the bundle it lies in, and helm is given only that copy; the
upgrade plan's hash covers the chart (installer.upgrade.plan.chart_inputs).

Real parts: NVIDIA's real v24.9.2 chart (../shared/upstream/charts), the STAND-IN chart of tests/fixtures/charts, the
real helm (template: the CRDs and the rendered objects), a bundle lock signed with a real Ed25519 key and verified
with the pinned public key. A "swapped" chart is the real one with one DaemonSet template more, packed again under
the same name, written over the file after it was pinned.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import shutil
import stat
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from installer import operator
from installer.config import parse_site
from installer.errors import ConfigError
from tests.conftest import BASE_SITE, ROOT, needs_upstream, plan_of

CHARTS = ROOT.parent / "shared" / "upstream" / "charts"
REAL = CHARTS / "gpu-operator-v24.9.2.tgz"
FIXTURE = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"
NAME = REAL.name

EXTRA_DAEMONSET = """apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: not-reviewed
  namespace: {{ .Release.Namespace }}
spec:
  selector:
    matchLabels: {app: not-reviewed}
  template:
    metadata:
      labels: {app: not-reviewed}
    spec:
      hostPID: true
      containers:
        - name: c
          image: attacker.example/tool:1
          securityContext: {privileged: true}
"""


@pytest.fixture(autouse=True)
def fresh_reads(monkeypatch):
    """Each test reads its charts itself (a process reads a chart once)."""
    monkeypatch.setattr(operator, "_LOADED", {})
    monkeypatch.delenv("GPU_INSTALL_CHART", raising=False)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def with_files(tgz: Path, dest: Path, files: dict[str, str]) -> Path:
    """The chart archive tgz with more files (path inside the chart -> text), packed again as dest."""
    buf = io.BytesIO()
    with tarfile.open(tgz, "r:gz") as src, tarfile.open(fileobj=buf, mode="w:gz") as out:
        top = ""
        for m in src.getmembers():
            top = top or m.name.split("/")[0]
            out.addfile(m, src.extractfile(m) if m.isfile() else None)
        for rel, text in files.items():
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(text.encode())
            out.addfile(info, io.BytesIO(text.encode()))
    dest.write_bytes(buf.getvalue())
    return dest


def with_template(tgz: Path, dest: Path, name: str, text: str) -> Path:
    """The chart archive tgz with one template more (templates/<name>), packed again as dest."""
    return with_files(tgz, dest, {f"templates/{name}": text})


def site_plan(**operator_fields):
    data = copy.deepcopy(BASE_SITE)
    data["operator"].update(operator_fields)
    return plan_of(parse_site(data))


# ---------------------------------------------------------------- operator.chartSha256


@needs_upstream
def test_a_chart_swapped_after_push_is_refused_at_prepare(tmp_path):
    chart = tmp_path / "bundle" / "charts" / NAME
    chart.parent.mkdir(parents=True)
    shutil.copy(REAL, chart)
    pinned = sha(REAL)
    plan = site_plan(chart=str(chart), chartSha256=pinned)
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)  # swapped after push printed the sha256
    with pytest.raises(ConfigError) as err:
        operator.prepare(plan, tmp_path / "absent-kubeconfig", str(chart))
    msg = err.value.message
    assert f"chart {chart} has sha256 {sha(chart)}, but operator.chartSha256 in the site file says {pinned}" in msg
    assert "nothing was changed" in (err.value.hint or "")
    assert err.value.exit_code == 2


@needs_upstream
def test_operator_install_refuses_it_with_exit_2_before_the_kubeconfig_is_read(cli, tmp_path, monkeypatch):
    chart = tmp_path / NAME
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2", "chart": NAME, "chartSha256": sha(REAL)},
                                    "registry": {"host": "registry.lab:5000"}}))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # never read: the chart is checked first
    rc, out, err = cli("operator", "install", "-s", site)
    assert rc == 2, err
    assert f"chart {chart} has sha256 {sha(chart)}, but operator.chartSha256" in err and "kubeconfig" not in err
    rc, out, err = cli("config", "check", "-s", site)  # the same check, offline
    assert rc == 2 and f"has sha256 {sha(chart)}" in err, err


@needs_upstream
def test_a_matching_chart_passes_and_helm_is_given_the_private_copy(tmp_path, monkeypatch):
    """The copy read is what helm installs and what the CRDs are taken from, even when the file is swapped after
    prepare() (between the check and the use)."""
    from installer import helm, kube

    chart = tmp_path / NAME
    shutil.copy(REAL, chart)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}]}))
    plan = site_plan(chart=str(chart), chartSha256=sha(REAL))
    plan.site.registry.pullSecret = None
    prepared = operator.prepare(plan, kubeconfig, str(chart))
    copy_path = Path(prepared.chart)
    assert copy_path != chart and chart.parent not in copy_path.parents
    assert sha(copy_path) == sha(REAL)
    assert stat.S_IMODE(copy_path.stat().st_mode) == 0o600 and stat.S_IMODE(copy_path.parent.stat().st_mode) == 0o700
    assert prepared.shown == f"{chart} (sha256 {sha(REAL)}, as operator.chartSha256 in the site file pins it)"
    # the file swapped after the check: a chart with another CRD and a DaemonSet more
    crd = yaml.safe_dump({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                          "metadata": {"name": "planted.example.com"},
                          "spec": {"group": "example.com", "names": {"kind": "P", "plural": "planted"},
                                   "scope": "Cluster", "versions": []}})
    with_files(REAL, chart, {"templates/extra.yaml": EXTRA_DAEMONSET, "crds/planted.yaml": crd})
    seen: dict = {}
    monkeypatch.setattr(kube, "api_client", lambda kc: object())
    monkeypatch.setattr(kube, "ensure_namespace", lambda client, ns, timeout: "unchanged")

    def apply_crds(client, crds, dry_run=False, timeout=None):
        seen["crds"] = sorted(c["metadata"]["name"] for c in crds)
        return [(n, "unchanged") for n in seen["crds"]]

    def install_or_upgrade(chart_ref, release, ns, values, kc, timeout, wait):
        seen["chart"] = str(chart_ref)
        seen["sha256"] = sha(Path(chart_ref))
        return helm.ReleaseState(release, ns, 1, "deployed", "gpu-operator-v24.9.2")

    monkeypatch.setattr(kube, "apply_crds", apply_crds)
    monkeypatch.setattr(helm, "install_or_upgrade", install_or_upgrade)
    operator.install(plan, prepared, timeout=60, wait=False)
    assert seen["chart"] == prepared.chart and seen["sha256"] == sha(REAL)
    want = sorted(c["metadata"]["name"] for c in helm.chart_crds(str(REAL), plan.values))
    assert seen["crds"] == want and "planted.example.com" not in seen["crds"]


def test_a_pin_on_a_directory_an_oci_reference_or_a_bad_digest_is_refused(tmp_path):
    plan = site_plan(chart=str(FIXTURE), chartSha256="a" * 64)
    with pytest.raises(ConfigError, match="is a directory, and operator.chartSha256 in the site file pins a chart "
                                          r"archive's sha256 \(a directory has no single digest\)"):
        operator.load_chart(plan, str(FIXTURE))
    with pytest.raises(ConfigError, match="operator.chart oci://registry.lab:5000/charts/gpu-operator is a "
                                          "reference helm pulls itself"):
        site_plan(chart="oci://registry.lab:5000/charts/gpu-operator", chartSha256="a" * 64)
    with pytest.raises(ConfigError, match="operator.chartSha256: not a sha256"):
        site_plan(chart="x.tgz", chartSha256="A" * 64)


def test_an_unpinned_archive_is_still_read_once_into_a_private_copy(tmp_path):
    chart = tmp_path / "c.tgz"
    chart.write_bytes(b"not checked here")
    got = operator.load_chart(site_plan(), str(chart))
    assert got.ref != str(chart) and Path(got.ref).read_bytes() == b"not checked here"
    assert got.pinned_by is None and got.sha256 == sha(chart)
    chart.write_bytes(b"changed")
    assert operator.load_chart(site_plan(), str(chart)) is got  # the same command reads it once
    fifo = tmp_path / "f.tgz"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"f.tgz not found|not a regular file"):
        operator.load_chart(site_plan(), str(fifo))


# ---------------------------------------------------------------- a chart of a signed bundle


def signed_bundle(tmp_path: Path, chart_bytes: bytes) -> tuple[Path, Path]:
    """A bundle directory whose lock lists charts/NAME with the sha256 of chart_bytes, signed with a real key; the
    chart file written; (bundle, the public key to pin)."""
    from installer.mirror import bundle as lockfile
    from installer.signing import load_or_create

    bundle = tmp_path / "bundle"
    (bundle / "charts").mkdir(parents=True)
    (bundle / "charts" / NAME).write_bytes(chart_bytes)
    lockfile.write_lock(bundle, {"schema": lockfile.SCHEMA, "release": "v24.9.2", "images": [], "failed": [],
                                 "charts": [{"name": "gpu-operator", "version": "v24.9.2", "repository": "",
                                             "file": f"charts/{NAME}",
                                             "sha256": hashlib.sha256(chart_bytes).hexdigest(),
                                             "size": len(chart_bytes)}]})
    home = tmp_path / "key"
    key = load_or_create(home)
    lockfile.finish(bundle, key)
    return bundle, key.public_path


def bundle_plan(pub: Path | None):
    data = copy.deepcopy(BASE_SITE)
    if pub is not None:
        data["mirror"] = {"trustedKeys": [str(pub)]}
    return plan_of(parse_site(data))


@needs_upstream
def test_a_chart_of_a_signed_bundle_is_held_against_its_lock_without_chartSha256(tmp_path):
    bundle, pub = signed_bundle(tmp_path, REAL.read_bytes())
    chart = bundle / "charts" / NAME
    got = operator.load_chart(bundle_plan(pub), str(chart))
    assert got.sha256 == sha(REAL) and got.pinned_by and "the signed lock of bundle" in got.pinned_by
    operator._LOADED.clear()
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)  # swapped after push
    with pytest.raises(ConfigError) as err:
        operator.prepare(bundle_plan(pub), tmp_path / "absent", str(chart))
    assert (f"chart {chart} has sha256 {sha(chart)}, but the signed lock of bundle {bundle} (bundle.lock.json.dsse) "
            f"says {sha(REAL)}") in err.value.message


@needs_upstream
def test_a_bundle_chart_is_refused_when_its_lock_cannot_vouch_for_it(tmp_path):
    bundle, pub = signed_bundle(tmp_path, REAL.read_bytes())
    chart = bundle / "charts" / NAME
    with pytest.raises(ConfigError, match="whose lock cannot be verified: .*no bundle signing key is pinned"):
        operator.load_chart(bundle_plan(None), str(chart))
    other = bundle / "charts" / "gpu-operator-v24.9.3.tgz"  # planted beside the signed one
    shutil.copy(chart, other)
    with pytest.raises(ConfigError, match="charts/gpu-operator-v24.9.3.tgz is not a chart the signed lock of bundle"):
        operator.load_chart(bundle_plan(pub), str(other))
    elsewhere = tmp_path / "evil" / "charts" / NAME  # the bundle's file made a link to a chart outside any bundle
    elsewhere.parent.mkdir(parents=True)
    with_template(REAL, elsewhere, "extra.yaml", EXTRA_DAEMONSET)
    chart.unlink()
    chart.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=f"has sha256 {sha(elsewhere)}, but the signed lock"):
        operator.load_chart(bundle_plan(pub), str(chart))
    chart.unlink()
    shutil.copy(REAL, chart)
    (bundle / "bundle.lock.json.dsse").unlink()  # the signature removed: still a bundle, now unsigned
    with pytest.raises(ConfigError, match="missing: the bundle is unsigned"):
        operator.load_chart(bundle_plan(pub), str(chart))


# ---------------------------------------------------------------- the upgrade plan's hash


def fixture_chart(tmp_path: Path, name: str, *, template: tuple[str, str] | None = None,
                  crd_field: str | None = None, archive: bool = False) -> str:
    """The STAND-IN chart copied (a template more, a CRD schema field more), as a directory or packed as .tgz."""
    d = tmp_path / name / "gpu-operator-fixture"
    shutil.copytree(FIXTURE, d)
    if template:
        (d / "templates" / template[0]).write_text(template[1])
    if crd_field:
        path = d / "crds" / "clusterpolicy-crd.yaml"
        crd = yaml.safe_load(path.read_text())
        props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].setdefault(
            "properties", {})
        props[crd_field] = {"type": "string"}
        path.write_text(yaml.safe_dump(crd))
    if not archive:
        return str(d)
    tgz = tmp_path / name / "gpu-operator-fixture-0.1.0.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(d, arcname="gpu-operator-fixture")
    return str(tgz)


def test_the_plan_hash_covers_the_charts_objects_crds_and_archive(tmp_path):
    from tests.unit.test_upgrade_plan import build, state

    st = state("v23.6.2")

    def h(chart: str) -> str:
        operator._LOADED.clear()
        return build(st, "v24.9.2", chart=chart).plan_hash

    base_dir = h(fixture_chart(tmp_path, "base"))
    assert h(fixture_chart(tmp_path, "base-again")) == base_dir  # the same chart elsewhere: the same plan
    # a DaemonSet more (a directory: no archive digest, the rendered objects differ)
    assert h(fixture_chart(tmp_path, "ds", template=("extra.yaml", EXTRA_DAEMONSET))) != base_dir
    # a CRD changed (the rendered objects are the same)
    assert h(fixture_chart(tmp_path, "crd", crd_field="planted")) != base_dir
    # archives: a DaemonSet template that renders nothing with these values changes only the archive's bytes
    base_tgz = h(fixture_chart(tmp_path, "a-base", archive=True))
    off = "{{- if .Values.notReviewed }}\n" + EXTRA_DAEMONSET + "{{- end }}\n"
    assert h(fixture_chart(tmp_path, "a-ds", template=("extra.yaml", off), archive=True)) != base_tgz
    assert base_tgz != base_dir and h("") != base_dir  # a plan without a chart is another plan


def test_chart_inputs_carry_the_crd_changes():
    from installer.upgrade import plan as up
    from installer.upgrade.model import ReleaseReport

    chart = operator.Chart("/tmp/x.tgz", "x.tgz", "a" * 64)
    report = ReleaseReport(None, "v24.9.2", (), (), ("= CRD a: schema unchanged",), (), (), False, False,
                           {"objects": "o", "crds": "c"})
    moved = replace(report, crd_changes=("~ CRD a: 1 schema field added (spec.x)",))
    assert up.chart_inputs(chart, report) != up.chart_inputs(chart, moved)
    assert up.chart_inputs(chart, report) == {"sha256": "a" * 64, "objects": "o", "crds": "c",
                                              "crdChanges": ["= CRD a: schema unchanged"]}
    assert up.chart_inputs(None, report) is None


@needs_upstream
def test_upgrade_plan_refuses_a_swapped_pinned_chart(tmp_path):
    from installer.upgrade import plan as up
    from tests.unit.test_upgrade_plan import state

    chart = tmp_path / NAME
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)
    target = site_plan(chart=str(chart), chartSha256=sha(REAL))
    with pytest.raises(ConfigError, match=f"has sha256 {sha(chart)}, but operator.chartSha256"):
        up.build(target, state("v23.9.2"), None, site="site.yaml", inventory="hosts.yml")


# ---------------------------------------------------------------- how the file is read


def test_the_read_refuses_a_link_a_fifo_and_a_file_past_the_bound(tmp_path, monkeypatch):
    real = tmp_path / "c.tgz"
    real.write_bytes(b"x" * 100)
    link = tmp_path / "link.tgz"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match=r"link.tgz: cannot be read \(a symbolic link\)"):
        operator._read_private(link, tmp_path / "copy1")
    fifo = tmp_path / "fifo.tgz"
    os.mkfifo(fifo)  # opened without blocking, then refused
    with pytest.raises(ConfigError, match="fifo.tgz: not a regular file"):
        operator._read_private(fifo, tmp_path / "copy2")
    monkeypatch.setattr(operator, "MAX_CHART_BYTES", 99)
    with pytest.raises(ConfigError, match="c.tgz: 100 bytes, more than a chart's 99"):
        operator._read_private(real, tmp_path / "copy3")
    assert not any((tmp_path / f"copy{i}").exists() for i in (1, 2))
    real_fstat = os.fstat  # a file that grows after it was looked at: read no further than the bound

    def small(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, *tuple(st)[1:6], 10, *tuple(st)[7:]))

    monkeypatch.setattr(os, "fstat", small)
    with pytest.raises(ConfigError, match="c.tgz: grew past 99 bytes while it was read"):
        operator._read_private(real, tmp_path / "copy5")
    monkeypatch.setattr(os, "fstat", real_fstat)
    monkeypatch.setattr(operator, "MAX_CHART_BYTES", 100)
    assert operator._read_private(real, tmp_path / "copy4") == sha(real)


@needs_upstream
def test_a_link_into_a_bundle_is_held_against_that_bundles_lock(tmp_path):
    bundle, pub = signed_bundle(tmp_path, REAL.read_bytes())
    chart = bundle / "charts" / NAME
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)
    link = tmp_path / "gpu-operator.tgz"  # operator.chart names a link of the site's own to the bundle's file
    link.symlink_to(chart)
    with pytest.raises(ConfigError, match=f"chart {link} has sha256 {sha(chart)}, but the signed lock of bundle"):
        operator.load_chart(bundle_plan(pub), str(link))


@needs_upstream
def test_uninstall_purge_crds_and_rollback_take_the_chart_the_same_way(tmp_path, monkeypatch):
    from installer.helm import HistoryEntry
    from installer.upgrade import rollback as rb

    chart = tmp_path / NAME
    with_template(REAL, chart, "extra.yaml", EXTRA_DAEMONSET)
    plan = site_plan(chart=str(chart), chartSha256=sha(REAL))
    with pytest.raises(ConfigError, match="but operator.chartSha256"):  # before the kubeconfig is read
        operator.uninstall(plan, tmp_path / "absent", yes=True, purge_crds=True, chart_ref=str(chart))
    # rollback --chart: refused after the preview (read from the cluster) and before anything changes
    pv = rb.Preview("gpu-operator", "gpu-operator", HistoryEntry(3, "deployed", "gpu-operator-v24.9.2", ""),
                    HistoryEntry(2, "superseded", "gpu-operator-v24.9.2", ""), "the revision before", [], "operator",
                    tmp_path / "state.json", None)
    monkeypatch.setattr(rb, "preview", lambda plan, opts, say: pv)
    with pytest.raises(ConfigError, match="but operator.chartSha256"):
        rb.run(plan, rb.Options(yes=True, kubeconfig=str(tmp_path / "absent"), chart=str(chart)), lambda m: None)


def test_upgrade_apply_refuses_a_plan_reviewed_with_another_chart(tmp_path, monkeypatch):
    """The plan file was made with the reviewed chart; apply given a chart with a DaemonSet more finds it stale and
    does nothing; given the reviewed chart (another copy of the same bytes) it applies."""
    import json

    from installer.errors import PreflightError
    from installer.upgrade import plan as up
    from tests.unit.test_upgrade_apply import Rig, plan_doc

    rig = Rig(tmp_path, monkeypatch)
    reviewed = fixture_chart(tmp_path, "reviewed", archive=True)
    other = fixture_chart(tmp_path, "other", template=("extra.yaml", EXTRA_DAEMONSET), archive=True)
    p = up.build(rig.plan, rig.cluster.state(), None, site="site.yaml", inventory="hosts.yml", chart=reviewed,
                 max_parallel=rig.max_parallel, max_unavailable="100%")
    rig.plan_file.write_text(json.dumps(plan_doc(p, str(rig.plan_file))))
    with pytest.raises(PreflightError) as err:
        rig.run(chart=other)
    assert err.value.message.startswith("plan is stale") and "the target chart" in err.value.message
    assert rig.log == [] and not rig.state_file.exists()
    again = tmp_path / "carried" / Path(reviewed).name
    again.parent.mkdir()
    shutil.copy(reviewed, again)
    out = rig.run(chart=str(again))
    assert out.plan_hash == p.plan_hash and ("helm", "v23.9.2") in rig.log


@needs_upstream
def test_a_directory_in_place_of_a_bundles_chart_is_refused(tmp_path):
    bundle, pub = signed_bundle(tmp_path, REAL.read_bytes())
    chart = bundle / "charts" / NAME
    chart.unlink()
    shutil.copytree(FIXTURE, chart)  # a chart directory under the archive's name: helm would install it
    with pytest.raises(ConfigError, match="is a directory, and the signed lock of bundle") as err:
        operator.load_chart(bundle_plan(pub), str(chart))
    assert "a bundle's charts are archives" in (err.value.hint or "")
