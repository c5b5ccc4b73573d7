"""Platforms a release runs on: node OS (role path, published driver images) and Kubernetes version.

The logic is tested against a catalog copy with a synthetic platforms.yaml (so a change of the sourced data does not
move these tests); tests/unit/test_platforms_data.py checks the real table itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from installer import platforms
from installer.errors import ConfigError, PreflightError
from tests.conftest import ROOT

SYNTHETIC = {"series": {
    "v23.9": {"kubernetes": {"min": "1.16", "validated": ["1.24", "1.29"], "source": "https://example.invalid/23.9"},
              "driverOs": {"ubuntu": ["20.04", "22.04"], "rhel": ["8.8", "9.2"], "source": "https://example.invalid/d"}},
    "v24.9": {"kubernetes": {"min": "1.24", "minReason": "NFD gRPC probes", "validated": ["1.24", "1.31"],
                             "source": "https://example.invalid/24.9"},
              "driverOs": {"ubuntu": ["22.04"], "rhel": ["9.*"], "source": "https://example.invalid/d"}},
    "v26.7": {"kubernetes": {"min": "1.27", "max": "1.40", "source": "https://example.invalid/26.7"},
              "driverOs": {"ubuntu": ["22.04", "24.04"], "rhel": ["9", "10"], "source": "https://example.invalid/d"}},
}}


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    """values/catalog with the synthetic platforms.yaml (only the releases of those series)."""
    src = ROOT / "values" / "catalog"
    dst = tmp_path / "catalog"
    (dst / "keys").mkdir(parents=True)
    for rel in ("v23.9.1", "v23.9.2", "v24.9.2", "v26.7.0"):
        shutil.copy(src / f"{rel}.yaml", dst)
        shutil.copy(src / "keys" / f"{rel}.txt", dst / "keys")
    (dst / "platforms.yaml").write_text(yaml.safe_dump(SYNTHETIC))
    monkeypatch.setenv("GPU_INSTALL_CATALOG", str(dst))
    return dst


def site(tmp_path: Path, version: str = "v24.9.2", driver: str = "") -> Path:
    p = tmp_path / "site.yaml"
    p.write_text(f"operator: {{version: {version}}}\nregistry: {{host: registry.lab:5000}}\n{driver}")
    return p


def test_the_roles_os_list_is_the_one_preflight_checks_on_the_node():
    defaults = yaml.safe_load((ROOT / "roles" / "preflight" / "defaults" / "main.yml").read_text())
    assert {k: tuple(v) for k, v in defaults["preflight_supported_os"].items()} == dict(platforms.ROLE_OS)


@pytest.mark.parametrize("os_tag", ["windows11", "ubuntu16.04", "centos8", "rhel7.9", "sles15.6"])
def test_an_os_without_a_role_path_is_exit_2_listing_the_supported(cli, tmp_path, os_tag):
    rc, out, err = cli("images", "-s", site(tmp_path), "--os", os_tag)
    assert rc == 2, err
    assert f"--os: {os_tag} is not an OS gpu-install supports on GPU nodes" in err
    assert "ubuntu 18.04/20.04/22.04/24.04" in err and "rocky 8/9" in err
    assert "Traceback" not in err and not out


def test_an_inventory_os_without_a_role_path_names_the_host(cli, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        gpu1: {gpu_install_os: windows11}\n")
    rc, _, err = cli("images", "-s", site(tmp_path), "-i", inv)
    assert rc == 2 and "host gpu1: gpu_install_os: windows11 is not an OS" in err, err


def test_driver_images_must_be_published_for_the_node_os(cli, tmp_path, catalog):
    rc, out, err = cli("images", "-s", site(tmp_path), "--os", "debian12")
    assert rc == 2, err
    assert "NVIDIA publishes no driver images of GPU Operator v24.9.2 for debian12" in err
    assert "published for: rhel 9.*, ubuntu 22.04" in err
    assert "driver.customImageOs: [debian12]" in err  # the way out, spelled for this node
    # the exact VERSION_ID unless the table lists a pattern or a bare major
    assert cli("images", "-s", site(tmp_path, "v23.9.2"), "--os", "rhel9.4")[0] == 2
    assert cli("images", "-s", site(tmp_path, "v23.9.2"), "--os", "rhel9.2")[0] == 0
    assert cli("images", "-s", site(tmp_path), "--os", "rhel9.4")[0] == 0  # 9.*
    assert cli("images", "-s", site(tmp_path, "v26.7.0"), "--os", "rhel9.6")[0] == 0  # major-only tags (rhel9)


def test_the_driver_os_check_only_applies_to_images_of_the_operator(cli, tmp_path, catalog):
    host = site(tmp_path, driver="driver: {mode: host}\n")
    rc, out, err = cli("images", "-s", host, "--os", "debian12")
    assert rc == 0, err
    assert "-debian12" not in out  # no driver container: no OS-tagged image at all


def test_a_site_that_builds_its_own_driver_images_lists_their_os(cli, tmp_path, catalog):
    own = site(tmp_path, driver="driver: {customImageOs: [debian12]}\n")
    rc, out, err = cli("images", "-s", own, "--os", "debian12", "--os", "ubuntu22.04")
    assert rc == 0, err
    assert "driver:550.127.08-debian12" in out or "-debian12 " in out
    rc, _, err = cli("images", "-s", own, "--os", "ubuntu20.04")  # only the listed OS is exempt
    assert rc == 2 and "for ubuntu20.04" in err


@pytest.mark.parametrize("bad", ["$(id)", "deb ian12", "x" * 60])
def test_custom_image_os_entries_are_os_tags(cli, tmp_path, bad):
    p = site(tmp_path, driver=f"driver: {{customImageOs: [{yaml.safe_dump(bad).splitlines()[0]}]}}\n")
    rc, _, err = cli("config", "check", "-s", p)
    assert rc == 2 and "driver.customImageOs" in err, err


def test_kube_version_check_without_a_cluster(cli, tmp_path, catalog):
    rc, out, err = cli("render", "-s", site(tmp_path), "--kube-version", "v1.20.2")
    assert rc == 3, err
    assert "--kube-version: Kubernetes 1.20 cannot run GPU Operator v24.9.2: it needs Kubernetes ≥ 1.24 " \
           "(NFD gRPC probes)" in err
    # the suggestion is a release NVIDIA validated on that Kubernetes; v23.9.2 would start on 1.20 but is not one
    assert "no catalog release is validated by NVIDIA on Kubernetes 1.20 (v23.9.2 would start on it, but is " \
           "validated on 1.24–1.29 only): upgrade the cluster to Kubernetes 1.24 or newer" in err
    assert "set operator.version" not in err
    assert not out  # nothing rendered
    rc, out, err = cli("render", "-s", site(tmp_path), "--kube-version", "1.24")
    assert rc == 0 and out and "note:" not in err
    rc, out, err = cli("render", "-s", site(tmp_path, "v23.9.2"), "--kube-version", "1.20")
    assert rc == 0 and "note: Kubernetes 1.20 is outside the range NVIDIA validated GPU Operator v23.9 on " \
                       "(1.24–1.29); it is expected to work (≥ 1.16)" in err
    rc, _, err = cli("config", "check", "-s", site(tmp_path, "v26.7.0"), "--kube-version", "1.41")
    assert rc == 3 and "it needs Kubernetes ≥ 1.27, ≤ 1.40" in err and "is v26.7.0" not in err
    rc, _, err = cli("render", "-s", site(tmp_path, "v26.7.0"), "--kube-version", "1.15")
    assert rc == 3 and "no catalog release is validated by NVIDIA on Kubernetes 1.15: upgrade the cluster to " \
                       "Kubernetes 1.24 or newer" in err
    # 1.25: v26.7.0 cannot run (≥ 1.27); v24.9.2 runs on it and is validated on 1.24–1.31; v23.9.2 too, but is older
    rc, _, err = cli("render", "-s", site(tmp_path, "v26.7.0"), "--kube-version", "1.25")
    assert rc == 3 and "the newest catalog release that runs on Kubernetes 1.25 and that NVIDIA validated on it is " \
                       "v24.9.2: set operator.version: v24.9.2" in err
    # newer than every validated range: no upgrade advice, the newest validated Kubernetes named
    rc, _, err = cli("config", "check", "-s", site(tmp_path, "v26.7.0"), "--kube-version", "1.41")
    assert rc == 3 and "(v24.9.2 would start on it, but is validated on 1.24–1.31 only): the newest Kubernetes a " \
                       "catalog release is validated on is 1.31" in err


@pytest.mark.parametrize("bad", ["latest", "1", "v1.x", "1.20; rm -rf /", "9" * 100])
def test_kube_version_must_be_a_version(cli, tmp_path, bad):
    rc, _, err = cli("render", "-s", site(tmp_path), "--kube-version", bad)
    assert rc == 2 and "--kube-version:" in err and "is not a Kubernetes version" in err, err


def test_kube_minor_reads_what_servers_report():
    assert platforms.kube_minor("v1.20.2") == (1, 20)
    assert platforms.kube_minor("v1.29.0-rc.1") == (1, 29)
    assert platforms.kube_minor("v1.24.3+k3s1") == (1, 24)
    assert platforms.kube_minor("1.31") == (1, 31)


def test_check_kubernetes_raises_preflight_error(catalog):
    releases = ["v23.9.1", "v23.9.2", "v24.9.2", "v26.7.0"]
    with pytest.raises(PreflightError) as err:
        platforms.check_kubernetes("v24.9.2", "v1.23.17", releases, "cluster", catalog)
    assert err.value.exit_code == 3 and "v23.9.2" in (err.value.hint or "")
    assert platforms.check_kubernetes("v24.9.2", "v1.30.1", releases, "cluster", catalog) is None
    with pytest.raises(ConfigError):
        platforms.check_kubernetes("v24.9.2", "garbage", releases, "cluster", catalog)
