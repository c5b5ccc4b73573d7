"""installer/driver_repo.py: the GPU Operator driver container's package sources in a full air gap (driver.mode
operator with packages.url / packages.osMirror): the values (driver.repoConfig / driver.certConfig, only under keys the
release's chart has), the repository ConfigMap (apt signed-by a key mounted beside the .list, dnf gpgcheck with
file:// keys mounted with the .repo, never trusted=yes), the CA ConfigMap for https, and the operator stage that writes
them before the release and removes them at uninstall. The keys are real (gpg), the CA a real certificate; the
lab test (tests/integration/test_driver_airgap.py) runs the real apt against them inside a pod."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from installer import driver_repo, helm, kube, operator
from installer.config import load_site, parse_site
from installer.errors import ConfigError
from installer.facts import Node
from installer.mirror.packages import site_key
from installer.mirror.packages.tools import COMPONENT, SITE_KEY, SUITE, UPSTREAM_KEYS
from tests.conftest import need, plan_of

URL = "http://repo.site.example/gpu-install"
DEB, RPM = Node("gpu1", "ubuntu", "22.04"), Node("gpu2", "rhel", "9.4")


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    """DIR as `mirror push --repo-dir` leaves it: the site key (real gpg, publish.site_key) and rhel9.4's upstream
    keys beside it."""
    need(shutil.which("gpg"), "gpg missing (scripts/apt-packages.txt)")
    d = tmp_path_factory.mktemp("site-dir")
    home = d / "signing"
    _, public = site_key(home)
    (d / SITE_KEY).write_text(public)
    (d / "packages" / "rhel9.4").mkdir(parents=True)
    (d / "packages" / "rhel9.4" / UPSTREAM_KEYS).write_text(public.replace("\n", "\r\n"))  # another line ending
    return d


def _site(site_dir: Path, tmp_path: Path, version: str = "v25.10.1", **packages) -> object:
    import yaml

    data = {"operator": {"version": version}, "registry": {"host": "registry.lab:5000"},
            "packages": {"url": URL, "key": str(site_dir / SITE_KEY), **packages}}
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_site(path)


def _data(cms, name=driver_repo.REPO_CONFIGMAP) -> dict:
    (cm,) = [c for c in cms if c["metadata"]["name"] == name]
    return cm["data"]


# ---------------------------------------------------------------- values


def test_operator_mode_with_the_site_repository_renders_repo_config(site_dir, tmp_path):
    plan = plan_of(_site(site_dir, tmp_path), nodes=[DEB])
    assert plan.values["driver"]["repoConfig"] == {"configMapName": "gpu-install-driver-repo"}
    assert "certConfig" not in plan.values["driver"]  # http: no CA


@pytest.mark.parametrize("mode", ["host", "precompiled", "preinstalled"])
def test_other_driver_modes_render_no_repo_config(site_dir, tmp_path, mode):
    site = _site(site_dir, tmp_path)
    site.driver.mode = mode
    plan = plan_of(site, nodes=[DEB])
    assert "repoConfig" not in plan.values.get("driver", {})
    assert driver_repo.configmaps(site, plan.release, [DEB]) == []


def test_https_with_a_ca_renders_cert_config(site_dir, tmp_path):
    from gpu_install_lab.pki import ensure_ca

    ca, _ = ensure_ca(tmp_path / "pki")
    site = _site(site_dir, tmp_path, ca=str(ca))
    site.packages.url = URL.replace("http:", "https:")
    plan = plan_of(site, nodes=[DEB])
    assert plan.values["driver"]["certConfig"] == {"name": "gpu-install-driver-ca"}
    assert plan.values["driver"]["repoConfig"] == {"configMapName": "gpu-install-driver-repo"}


def test_a_release_whose_chart_lacks_the_keys_is_refused(site_dir, tmp_path):
    """Every catalog release (v1.11 … v26.x) has them; a release without them (its keys file edited) is exit 2."""
    site = _site(site_dir, tmp_path)
    release = plan_of(site, nodes=[DEB]).release
    keys = tmp_path / "keys" / f"{release.version}.txt"
    keys.parent.mkdir()
    keys.write_text("\n".join(k for k in release.keys_file.read_text().splitlines()
                              if not k.startswith("driver.repoConfig")) + "\n")
    lacking = dataclasses.replace(release, keys_file=keys)
    with pytest.raises(ConfigError) as err:
        driver_repo.value_paths(site, lacking)
    assert err.value.exit_code == 2
    assert f"GPU Operator {release.version}'s chart has no driver.repoConfig.configMapName" in err.value.message
    assert "precompiled" in (err.value.hint or "")


def test_the_real_charts_have_the_keys():
    """The keys the values name, in every chart of ../shared/upstream/charts: values.yaml's driver.repoConfig and
    driver.certConfig, and the ClusterPolicy template passes them on."""
    import tarfile

    import yaml

    charts = sorted((Path(__file__).resolve().parents[3] / "shared" / "upstream" / "charts").glob("gpu-operator-*.tgz"))
    need(charts, "../shared/upstream/charts not found")
    for tgz in charts:
        with tarfile.open(tgz) as t:
            values = yaml.safe_load(t.extractfile("gpu-operator/values.yaml").read())
            policy = t.extractfile("gpu-operator/templates/clusterpolicy.yaml").read().decode()
        assert values["driver"]["repoConfig"] == {"configMapName": ""}, tgz.name
        assert values["driver"]["certConfig"] == {"name": ""}, tgz.name
        assert ".Values.driver.repoConfig" in policy and ".Values.driver.certConfig" in policy, tgz.name


def test_own_values_for_repo_config_are_refused(site_dir, tmp_path):
    site = _site(site_dir, tmp_path)
    site.values = {"driver": {"repoConfig": {"configMapName": "mine"}}}
    with pytest.raises(ConfigError, match=r"values.driver.repoConfig: gpu-install renders it") as err:
        plan_of(site, nodes=[DEB])
    assert err.value.exit_code == 2


def test_a_ca_without_an_https_source_is_refused(site_dir, tmp_path):
    from gpu_install_lab.pki import ensure_ca

    ca, _ = ensure_ca(tmp_path / "pki")
    with pytest.raises(ConfigError, match=r"packages.ca is set, but no package source of the driver container is "
                                          rf"https \({URL}\)") as err:
        plan_of(_site(site_dir, tmp_path, ca=str(ca)), nodes=[DEB])
    assert err.value.exit_code == 2


# ---------------------------------------------------------------- the repository ConfigMap


def test_apt_list_signed_by_the_key_mounted_beside_it(site_dir, tmp_path):
    site = _site(site_dir, tmp_path)
    plan = plan_of(site, nodes=[DEB])
    cms = driver_repo.configmaps(site, plan.release, plan.nodes)
    assert [c["metadata"]["name"] for c in cms] == ["gpu-install-driver-repo"]  # no CA over http
    cm = cms[0]
    assert cm["metadata"]["namespace"] == site.operator.namespace
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-install"
    data = cm["data"]
    assert sorted(data) == ["gpu-install-site.asc", "gpu-install-ubuntu22.04.list"]
    assert driver_repo.KEY_FILE == SITE_KEY  # the name publish exports, the one apt's signed-by names
    assert data[SITE_KEY] == (site_dir / SITE_KEY).read_text()
    deb = [ln for ln in data["gpu-install-ubuntu22.04.list"].splitlines() if not ln.startswith("#")]
    # the suite and component publish writes; the key where the operator mounts the ConfigMap's keys
    assert deb == [f"deb [signed-by=/etc/apt/sources.list.d/gpu-install-site.asc] {URL}/packages/ubuntu22.04 "
                   f"{SUITE} {COMPONENT}"]
    assert (SUITE, COMPONENT) == ("gpu-install", "main")
    assert "mirror plan/pull --facts" in data["gpu-install-ubuntu22.04.list"]  # the fix for missing headers
    assert not any("trusted=yes" in v for v in data.values())


def test_dnf_repo_gpgcheck_with_file_keys_mounted_with_it(site_dir, tmp_path):
    site = _site(site_dir, tmp_path)
    plan = plan_of(site, nodes=[RPM, DEB])
    data = _data(driver_repo.configmaps(site, plan.release, plan.nodes))
    assert sorted(data) == ["gpu-install-rhel9.4-upstream.asc", "gpu-install-rhel9.4.repo", "gpu-install-site.asc",
                            "gpu-install-ubuntu22.04.list"]
    repo = dict(ln.split("=", 1) for ln in data["gpu-install-rhel9.4.repo"].splitlines() if "=" in ln
                and not ln.startswith("#"))
    assert repo["baseurl"] == f"{URL}/packages/rhel9.4"
    assert repo["gpgcheck"] == "1" and repo["repo_gpgcheck"] == "1" and repo["enabled"] == "1"
    keys = repo["gpgkey"].split()
    assert keys == ["file:///etc/yum.repos.d/gpu-install-site.asc",
                    "file:///etc/yum.repos.d/gpu-install-rhel9.4-upstream.asc"]
    for k in keys:  # every key dnf may import is one mounted from this ConfigMap
        assert Path(k.removeprefix("file://")).name in data
    assert "\r" not in data["gpu-install-rhel9.4-upstream.asc"]
    assert "sslcacert" not in repo


def test_missing_or_empty_keys_are_refused_naming_the_file(site_dir, tmp_path):
    site = _site(site_dir, tmp_path)
    plan = plan_of(site, nodes=[RPM])
    other = tmp_path / "other"
    (other / "packages" / "rhel9.4").mkdir(parents=True)
    (other / SITE_KEY).write_text((site_dir / SITE_KEY).read_text())
    site.packages.key = other / SITE_KEY
    with pytest.raises(ConfigError, match=rf"the upstream keys of rhel9.4 .*{UPSTREAM_KEYS} not found") as err:
        driver_repo.configmaps(site, plan.release, plan.nodes)
    assert err.value.exit_code == 2
    (other / SITE_KEY).write_text("not a key\n")
    with pytest.raises(ConfigError, match=r"packages.key .*: no armored OpenPGP public key in it"):
        driver_repo.configmaps(site, plan.release, plan.nodes)


def test_nodes_without_an_os_or_none_at_all_are_refused(site_dir, tmp_path):
    site = _site(site_dir, tmp_path)
    release = plan_of(site, nodes=[DEB]).release
    with pytest.raises(ConfigError, match="no GPU node is known") as err:
        driver_repo.configmaps(site, release, [])
    assert "--os" in (err.value.hint or "") and err.value.exit_code == 2
    with pytest.raises(ConfigError, match="host gpu3: OS unknown"):
        driver_repo.configmaps(site, release, [DEB, Node("gpu3", None, None)])


@pytest.mark.parametrize(("version", "key"), [("v22.9.2", "ca-certificates.crt"),
                                              ("v25.10.1", "gpu-install-packages-ca.crt")])
def test_https_ca_configmap_where_the_release_mounts_it(site_dir, tmp_path, version, key):
    """v23.3.0 moved Ubuntu's certConfig mount to /usr/local/share/ca-certificates (update-ca-certificates); before,
    /etc/ssl/certs, where apt reads the bundle file only."""
    from gpu_install_lab.pki import ensure_ca

    ca, _ = ensure_ca(tmp_path / "pki")
    site = _site(site_dir, tmp_path, version=version, ca=str(ca))
    site.packages.url = URL.replace("http:", "https:")
    site.driver.customImageOs = ["rhel9.4"]  # v22.9.2: NVIDIA published no rhel9 driver images yet
    plan = plan_of(site, nodes=[DEB, RPM])
    cms = driver_repo.configmaps(site, plan.release, plan.nodes)
    assert _data(cms, driver_repo.CA_CONFIGMAP) == {key: ca.read_text()}
    repo = _data(cms)["gpu-install-rhel9.4.repo"]
    assert f"sslcacert=/etc/pki/ca-trust/extracted/pem/{key}\n" in repo


def test_a_ca_that_is_not_a_certificate_is_refused(site_dir, tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    site = _site(site_dir, tmp_path, ca=str(bad))
    site.packages.url = URL.replace("http:", "https:")
    plan = plan_of(site, nodes=[DEB])
    with pytest.raises(ConfigError, match=r"packages.ca .*: not a valid PEM certificate") as err:
        driver_repo.configmaps(site, plan.release, plan.nodes)
    assert err.value.exit_code == 2


def test_a_configmap_past_what_the_api_server_stores_is_refused(site_dir, tmp_path):
    """Four RHEL releases whose upstream key files are each just under the per-file bound: together past 1 MB."""
    big = tmp_path / "big"
    public = (site_dir / SITE_KEY).read_text()
    (big / SITE_KEY).parent.mkdir(parents=True)
    (big / SITE_KEY).write_text(public)
    oses = ["rhel8.10", "rhel9.2", "rhel9.4", "rhel9.6"]
    for tag in oses:
        (big / "packages" / tag).mkdir(parents=True)
        (big / "packages" / tag / UPSTREAM_KEYS).write_text(public * (250_000 // len(public)))
    site = _site(site_dir, tmp_path)
    site.packages.key = big / SITE_KEY
    release = plan_of(site, nodes=[DEB]).release
    nodes = [Node(f"gpu{i}", "rhel", tag.removeprefix("rhel")) for i, tag in enumerate(oses)]
    with pytest.raises(ConfigError, match=r"ConfigMap gpu-install-driver-repo: \d+ bytes, more than the API server "
                                          "stores") as err:
        driver_repo.configmaps(site, release, nodes)
    assert err.value.exit_code == 2


# ---------------------------------------------------------------- packages.osMirror


def test_os_mirror_apt_suites_of_the_nodes_release_signed_by_the_archive_keyring(site_dir, tmp_path):
    site = _site(site_dir, tmp_path, osMirror=["http://mirror.site.example/ubuntu"])
    plan = plan_of(site, nodes=[DEB])
    data = _data(driver_repo.configmaps(site, plan.release, plan.nodes))
    assert sorted(data) == ["gpu-install-os-mirror-ubuntu22.04.list"]  # instead of the site repository
    lines = [ln for ln in data["gpu-install-os-mirror-ubuntu22.04.list"].splitlines() if not ln.startswith("#")]
    key = "[signed-by=/usr/share/keyrings/ubuntu-archive-keyring.gpg]"
    assert lines == [f"deb {key} http://mirror.site.example/ubuntu jammy{p} main" for p in ("", "-updates", "-security")]


def test_os_mirror_dnf_with_gpgcheck_on(site_dir, tmp_path):
    site = _site(site_dir, tmp_path, osMirror=["http://m.example/rhel/9/BaseOS/x86_64/os",
                                               "http://m.example/rhel/9/AppStream/x86_64/os"])
    plan = plan_of(site, nodes=[RPM])
    text = _data(driver_repo.configmaps(site, plan.release, plan.nodes))["gpu-install-os-mirror-rhel9.4.repo"]
    assert text.count("gpgcheck=1\n") == 2 and text.count("gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-redhat-release\n") == 2
    assert "baseurl=http://m.example/rhel/9/AppStream/x86_64/os\n" in text


def test_os_mirror_with_nodes_on_two_releases_is_refused(site_dir, tmp_path):
    site = _site(site_dir, tmp_path, osMirror=["http://mirror.site.example/ubuntu"])
    plan = plan_of(site, nodes=[DEB, Node("gpu4", "ubuntu", "24.04")])
    with pytest.raises(ConfigError, match="packages.osMirror: the GPU nodes run ubuntu22.04, ubuntu24.04") as err:
        driver_repo.configmaps(site, plan.release, plan.nodes)
    assert "packages.url without osMirror" in (err.value.hint or "")


def test_os_mirror_for_an_os_without_known_suites_or_key_is_refused(site_dir, tmp_path, monkeypatch):
    site = _site(site_dir, tmp_path, osMirror=["http://mirror.site.example/debian"])
    release = plan_of(site, nodes=[DEB]).release
    with pytest.raises(ConfigError, match="packages.osMirror: gpu-install knows no apt suites for debian10 nodes"):
        driver_repo.configmaps(site, release, [Node("old", "debian", "10")])
    monkeypatch.delitem(driver_repo.DNF_DISTRIBUTION_KEY, "centos")  # a RHEL-family OS the table would not know
    with pytest.raises(ConfigError, match="packages.osMirror: gpu-install knows no distribution key for centos7"):
        driver_repo.configmaps(site, release, [Node("x", "centos", "7")])


# ---------------------------------------------------------------- the operator stage (kube and helm stubbed)


@pytest.fixture
def stage(site_dir, tmp_path, monkeypatch):
    calls: list[tuple[str, str]] = []
    existing: dict[str, dict] = {}

    def apply_object(_client, obj, dry_run=False):
        name = obj["metadata"]["name"]
        action = "created" if name not in existing else ("unchanged" if existing[name] == obj else "updated")
        calls.append(("apply" + (" (dry run)" if dry_run else ""), name))
        if not dry_run:
            existing[name] = obj
        return action

    def delete_if_ours(_client, obj):
        calls.append(("delete", obj["metadata"]["name"]))
        return existing.pop(obj["metadata"]["name"], None) is not None

    monkeypatch.setattr(kube, "api_client", lambda _p: object())
    monkeypatch.setattr(kube, "resolve_kubeconfig", lambda _p: tmp_path / "kubeconfig")
    monkeypatch.setattr(kube, "ensure_namespace", lambda *_a, **_k: "unchanged")
    monkeypatch.setattr(kube, "namespace_phase", lambda *_a: "Active")
    monkeypatch.setattr(kube, "apply_object", apply_object)
    monkeypatch.setattr(kube, "delete_object_if_ours", delete_if_ours)
    monkeypatch.setattr(kube, "delete_secret_if_ours", lambda *_a: False)
    monkeypatch.setattr(kube, "apply_crds", lambda *_a, **_k: calls.append(("crds", "")) or [])
    monkeypatch.setattr(helm, "chart_crds", lambda *_a: [])
    monkeypatch.setattr(helm, "install_or_upgrade", lambda *a, **_k: calls.append(("helm", "")) or helm.ReleaseState(
        a[1], a[2], 1, "deployed", "gpu-operator-v25.10.1", changed=True))
    monkeypatch.setattr(helm, "uninstall", lambda *_a, **_k: calls.append(("helm uninstall", "")) or True)
    site = _site(site_dir, tmp_path)
    site.registry.pullSecret = None
    plan = plan_of(site, nodes=[DEB])
    prepared = operator.Prepared("chart.tgz", plan.values, None, tmp_path / "kubeconfig", None,
                                 driver_repo.configmaps(site, plan.release, plan.nodes))
    return plan, prepared, calls, existing


def test_install_writes_the_configmaps_before_the_release_and_again_changes_nothing(stage):
    plan, prepared, calls, existing = stage
    rep = operator.install(plan, prepared, wait=False)
    assert calls == [("apply", "gpu-install-driver-repo"), ("crds", ""), ("helm", "")]
    assert "ConfigMap gpu-operator/gpu-install-driver-repo (driver package sources): created" in rep.lines()
    calls.clear()
    again = operator.install(plan, prepared, wait=False)
    assert ("ConfigMap gpu-operator/gpu-install-driver-repo (driver package sources): unchanged" in again.lines())
    assert existing["gpu-install-driver-repo"]["data"] == prepared.configmaps[0]["data"]


def test_uninstall_removes_ours_after_the_release(stage):
    plan, prepared, calls, existing = stage
    operator.install(plan, prepared, wait=False)
    calls.clear()
    rep = operator.uninstall(plan, None, yes=True)
    assert calls == [("helm uninstall", ""), ("delete", "gpu-install-driver-repo"), ("delete", "gpu-install-driver-ca")]
    assert "driver package-source ConfigMaps: deleted gpu-operator/gpu-install-driver-repo" in rep.lines()
    assert existing == {}


def test_preview_shows_them_without_writing(stage, monkeypatch):
    plan, prepared, calls, existing = stage
    monkeypatch.setattr(kube, "secret_info", lambda *_a: None)
    monkeypatch.setattr(helm, "plan_release", lambda *_a: helm.ReleasePlan("install", "gpu-operator-v25.10.1", None))
    rep = operator.preview(plan, prepared)
    assert "ConfigMap gpu-operator/gpu-install-driver-repo (driver package sources): would be created" in rep.lines()
    assert sorted(calls) == [("apply (dry run)", "gpu-install-driver-repo"), ("crds", "")] and existing == {}
    assert rep.changed


def test_prepare_refuses_before_the_chart_is_read(site_dir, tmp_path):
    """No GPU node known (operator install without -i/--os): exit 2 before the chart, the kubeconfig or the cluster."""
    site = _site(site_dir, tmp_path)
    plan = plan_of(site, nodes=[])
    with pytest.raises(ConfigError, match="no GPU node is known"):
        operator.prepare(plan, tmp_path / "absent-kubeconfig", str(tmp_path / "absent-chart.tgz"))


def test_site_schema_takes_packages_ca():
    site = parse_site({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.lab:5000"},
                       "packages": {"ca": "ca.pem"}})
    assert site.packages.ca == Path("ca.pem")
