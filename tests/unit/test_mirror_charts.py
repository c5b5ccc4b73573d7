"""installer/mirror/charts.py without a network: chart archives made here with the real helm (`helm create` +
`helm package`), the lock's chart/file entries checked by sha256, names that could leave the bundle refused, and the
oci:// reference push prints taken apart as the operator stage takes it."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
from pathlib import Path

import pytest

from installer.errors import ConfigError
from installer.helm import oci_version
from installer.mirror import charts


@pytest.fixture(scope="module")
def tgz(tmp_path_factory) -> Path:
    from installer.tools import ensure_helm

    d = tmp_path_factory.mktemp("chart")
    helm = str(ensure_helm(progress=lambda m: None))
    subprocess.run([helm, "create", str(d / "gpu-operator")], check=True, capture_output=True, timeout=60)
    subprocess.run([helm, "package", str(d / "gpu-operator"), "--version", "v24.9.2", "-d", str(d)], check=True,
                   capture_output=True, timeout=60)
    return d / "gpu-operator-v24.9.2.tgz"


def test_chart_identity_reads_the_archive(tgz, tmp_path):
    assert charts.chart_identity(tgz) == ("gpu-operator", "v24.9.2")
    not_chart = tmp_path / "x.tgz"
    with tarfile.open(not_chart, "w:gz") as tar:
        tar.add(tgz, arcname="x/readme")
    with pytest.raises(ValueError, match="no Chart.yaml"):
        charts.chart_identity(not_chart)
    (tmp_path / "y.tgz").write_bytes(b"<html>not found</html>")
    with pytest.raises(ValueError, match="not a chart archive"):
        charts.chart_identity(tmp_path / "y.tgz")


def test_verify_names_a_changed_missing_or_escaping_file(tgz, tmp_path):
    bundle = tmp_path / "b"
    (bundle / "charts").mkdir(parents=True)
    dest = bundle / "charts" / tgz.name
    dest.write_bytes(tgz.read_bytes())
    entry = {"name": "gpu-operator", "version": "v24.9.2", "file": f"charts/{tgz.name}",
             "sha256": hashlib.sha256(tgz.read_bytes()).hexdigest()}
    checked, files = charts.verify(bundle, {"charts": [entry]})
    assert files == [] and [(c["name"], c["version"], c["file"], c["sha256"]) for c in checked] == [
        ("gpu-operator", "v24.9.2", entry["file"], entry["sha256"])]
    dest.write_bytes(tgz.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match=rf"charts/{tgz.name}: sha256 .* the lock says"):
        charts.verify(bundle, {"charts": [entry]})
    dest.unlink()
    with pytest.raises(ConfigError, match="is missing"):
        charts.verify(bundle, {"charts": [entry]})
    for bad in ("charts/../../etc/passwd", "files/x", "charts/.hidden", "charts/"):
        with pytest.raises(ConfigError):
            charts.verify(bundle, {"charts": [{**entry, "file": bad}]})


def test_oci_reference_push_prints_is_what_the_operator_stage_pins():
    from installer.config import Registry

    class Site:
        registry = Registry(host="reg.example:5000", prefix="mirror")

    ref = charts.oci_ref(Site, "gpu-operator")
    assert ref == "oci://reg.example:5000/mirror/charts/gpu-operator"
    assert oci_version(f"{ref}:v24.9.2") == (ref, "v24.9.2")
    assert oci_version(ref) == (ref, None)
    assert oci_version("oci://reg.example:5000/gpu-operator") == ("oci://reg.example:5000/gpu-operator", None)
    assert oci_version("/srv/charts/gpu-operator-v24.9.2.tgz") == ("/srv/charts/gpu-operator-v24.9.2.tgz", None)
    from installer.operator import check_chart_ref

    assert check_chart_ref(f"{ref}:v24.9.2") == f"{ref}:v24.9.2"
