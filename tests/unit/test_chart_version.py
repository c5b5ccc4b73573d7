"""A GPU Operator chart given with --chart must be the release operator.version names (values are rendered for that
release's keys): checked from the chart's own Chart.yaml before anything is contacted."""

from __future__ import annotations

import tarfile

import pytest

from installer.errors import ConfigError
from tests.conftest import ROOT, UPSTREAM, needs_upstream, plan_of

CHARTS = UPSTREAM.parent / "charts"


def site(version):
    from installer.config import parse_site

    return parse_site({"operator": {"version": version}, "registry": {"host": "registry.lab:5000"}})


@needs_upstream
@pytest.mark.parametrize("chart,release", [("v22.9.2", "v22.9.2"), ("v23.9.2", "v23.9.2"), ("v25.10.1", "v25.10.1")])
def test_the_real_charts_name_their_release(chart, release):
    from installer import operator

    meta = operator.chart_metadata(str(CHARTS / f"gpu-operator-{chart}.tgz"))
    assert meta and meta["name"] == "gpu-operator"
    operator.check_chart_version(plan_of(site(release)), str(CHARTS / f"gpu-operator-{chart}.tgz"))  # no error


@needs_upstream
def test_another_release_s_chart_is_exit_2_before_anything_is_contacted(cli, tmp_path, monkeypatch):
    path = tmp_path / "site.yaml"
    path.write_text("operator: {version: v22.9.2}\nregistry: {host: registry.lab:5000}\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))  # never read: the chart is checked first
    rc, out, err = cli("operator", "install", "-s", path, "--chart", CHARTS / "gpu-operator-v23.9.2.tgz")
    assert rc == 2, err
    assert "is GPU Operator v23.9.2 but operator.version is v22.9.2" in err and "kubeconfig" not in err


def test_other_charts_and_unreadable_ones(tmp_path):
    from installer import operator

    plan = plan_of(site("v24.9.2"))
    fixture = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"
    operator.check_chart_version(plan, str(fixture))  # a stand-in of another name: not held against the release
    assert operator.chart_metadata("oci://registry.lab:5000/charts/gpu-operator") is None
    bad = tmp_path / "gpu-operator.tgz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(ConfigError, match="cannot read its Chart.yaml"):
        operator.chart_metadata(str(bad))
    other = tmp_path / "other"
    (other / "gpu-operator").mkdir(parents=True)
    (other / "gpu-operator" / "Chart.yaml").write_text("name: gpu-operator\nversion: v24.9.1\n")
    tgz = tmp_path / "gpu-operator-v24.9.1.tgz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(other / "gpu-operator", arcname="gpu-operator")
    with pytest.raises(ConfigError, match="is GPU Operator v24.9.1 but operator.version is v24.9.2"):
        operator.check_chart_version(plan, str(tgz))
    with pytest.raises(ConfigError, match="v24.9.1"):  # a chart directory alike
        operator.check_chart_version(plan, str(other / "gpu-operator"))
