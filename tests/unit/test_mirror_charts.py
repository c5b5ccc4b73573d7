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
from tests.conftest import staged_charts


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
    checked, files = staged_charts(bundle, {"charts": [entry]})
    assert files == [] and [(c["name"], c["version"], c["file"], c["sha256"]) for c in checked] == [
        ("gpu-operator", "v24.9.2", entry["file"], entry["sha256"])]
    dest.write_bytes(tgz.read_bytes() + b"\0")
    with pytest.raises(ConfigError, match=rf"charts/{tgz.name}: sha256 .* the lock says"):
        staged_charts(bundle, {"charts": [entry]})
    dest.unlink()
    with pytest.raises(ConfigError, match="is missing"):
        staged_charts(bundle, {"charts": [entry]})
    for bad in ("charts/../../etc/passwd", "files/x", "charts/.hidden", "charts/"):
        with pytest.raises(ConfigError):
            staged_charts(bundle, {"charts": [{**entry, "file": bad}]})


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


# ---------------------------------------------------------------- Chart.yaml as untrusted input


def _archive(path: Path, members: dict[str, bytes]) -> Path:
    """A real chart archive (.tgz) of these members."""
    import io

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _laughs(levels: int = 9) -> bytes:
    """A "billion laughs" Chart.yaml: name is an alias of 10**levels nested strings (a few hundred bytes of text;
    str() of it is gigabytes)."""
    lines = ["apiVersion: v2", 'l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{n}: &l{n} [{', '.join([f'*l{n - 1}'] * 10)}]" for n in range(1, levels + 1)]
    lines += [f"name: *l{levels}", "version: v24.9.2", "description: a chart"]
    return ("\n".join(lines) + "\n").encode()


def test_an_alias_bomb_in_chart_yaml_is_refused_quickly_in_bounded_memory(tmp_path):
    """The archive as an upstream repository could serve it, read in a child process limited to 1 GiB of address
    space and 60 s: refused for its alias, in well under a second; expanding name (str() of it) would need GBs."""
    import resource
    import sys
    import time

    bomb = _laughs()
    assert len(bomb) < 1000
    tgz = _archive(tmp_path / "gpu-operator-v24.9.2.tgz", {"gpu-operator/Chart.yaml": bomb,
                                                           "gpu-operator/values.yaml": b"{}\n"})
    code = ("import sys\nfrom pathlib import Path\nfrom installer.mirror import charts\n"
            "try:\n    print('identity', charts.chart_identity(Path(sys.argv[1])))\n"
            "except ValueError as exc:\n    print('refused', exc)\n")

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(tgz)], capture_output=True, text=True, timeout=60,
                          preexec_fn=limit)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("refused gpu-operator/Chart.yaml:"), proc.stdout
    assert "a YAML alias (*name)" in proc.stdout and len(proc.stdout) < 500, proc.stdout
    assert took < 20, took  # the interpreter's start included; the refusal itself is milliseconds


def test_an_alias_bomb_chart_is_named_by_verify_and_pull(tmp_path):
    """Both callers name the chart: verify (a bundle's archive, exit 2) and pull (what the repository served)."""
    from installer.mirror import lock as lockmod

    bundle = tmp_path / "b"
    tgz = _archive(tmp_path / "bomb.tgz", {"gpu-operator/Chart.yaml": _laughs()})
    (bundle / "charts").mkdir(parents=True)
    target = bundle / "charts" / "gpu-operator-v24.9.2.tgz"
    target.write_bytes(tgz.read_bytes())
    entry = {"name": "gpu-operator", "version": "v24.9.2", "file": "charts/gpu-operator-v24.9.2.tgz",
             "sha256": hashlib.sha256(target.read_bytes()).hexdigest(), "size": target.stat().st_size}
    with pytest.raises(ConfigError, match=r"charts/gpu-operator-v24.9.2.tgz: gpu-operator/Chart.yaml:\d+:\d+: a YAML "
                                          r"alias") as exc:
        staged_charts(bundle, {lockmod.CHARTS: [entry]})
    assert exc.value.exit_code == 2


@pytest.mark.parametrize("chart_yaml, match", [
    (b"name: [gpu, operator]\nversion: v24.9.2\n", "name of type list is not a chart name"),
    (b"name: {a: b}\nversion: v24.9.2\n", "name of type dict is not a chart name"),
    (b"name: 12\nversion: v24.9.2\n", "name of type int is not a chart name"),
    (b"name: gpu-operator\nversion: 24.9\n", "version of type float is not a SemVer version string"),
    (b"name: ../../payments\nversion: v24.9.2\n", "name '../../payments' is not a chart name"),
    (b"name: " + b"a" * 5000 + b"\nversion: v24.9.2\n", "name 'a{100}' is not a chart name"),
    (b"name: gpu-operator\nversion: v24.9.2-" + b"1" * 200 + b"\n", "is not a SemVer version string"),
    (b"name: gpu-operator\nversion: latest\n", "version 'latest' is not a SemVer version string"),
    (b"name: gpu-operator\nname: payments\nversion: v24.9.2\n", "key 'name' is given twice"),
    (b"- name: gpu-operator\n", "not a mapping"),
    (b"name: gpu-operator\nversion: \xff\n", "not UTF-8 text"),
])
def test_chart_yaml_fields_are_type_and_size_checked_before_use(tmp_path, chart_yaml, match):
    tgz = _archive(tmp_path / "c.tgz", {"gpu-operator/Chart.yaml": chart_yaml})
    with pytest.raises(ValueError, match=match) as exc:
        charts.chart_identity(tgz)
    assert len(str(exc.value)) < 400


@pytest.mark.parametrize("second", ["other/Chart.yaml", "gpu-operator/./Chart.yaml", "gpu-operator/x/../Chart.yaml"])
def test_a_second_chart_yaml_helm_would_merge_is_refused(tmp_path, second):
    """helm drops each member's first path component, cleans the rest and unmarshals every Chart.yaml it finds into
    the same metadata (the last one's name wins): the checked name must be the only one."""
    genuine = b"apiVersion: v2\nname: gpu-operator\nversion: v24.9.2\n"
    tgz = _archive(tmp_path / "c.tgz", {"gpu-operator/Chart.yaml": genuine,
                                        second: b"apiVersion: v2\nname: payments\nversion: v24.9.2\n"})
    with pytest.raises(ValueError, match="two Chart.yaml files"):
        charts.chart_identity(tgz)
    one = _archive(tmp_path / "one.tgz", {"gpu-operator/Chart.yaml": genuine, "gpu-operator/charts/sub/Chart.yaml":
                                          b"apiVersion: v2\nname: sub\nversion: 1.0.0\n"})
    assert charts.chart_identity(one) == ("gpu-operator", "v24.9.2")  # a subchart's Chart.yaml is not the chart's


def test_an_archive_unpacking_past_helms_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(charts, "MAX_CHART_BYTES", 1 << 20)
    tgz = _archive(tmp_path / "c.tgz", {"gpu-operator/templates/big.yaml": b"0" * (2 << 20),
                                        "gpu-operator/Chart.yaml": b"name: gpu-operator\nversion: v24.9.2\n"})
    with pytest.raises(ValueError, match=f"more than {1 << 20} bytes unpacked"):
        charts.chart_identity(tgz)
