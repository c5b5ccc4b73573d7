"""Runtime layer checks (installer/validate/runtime.py) on what the probe prints.

containerd's side is read from REAL `containerd config dump` output: this machine's containerd (Debian's 1.6, the
lab's) dumps config files written here, with an imported drop-in as the containerd_runtime role writes it, so the
parser sees the merged form containerd itself produces. docker's side is `docker info --format '{{json .}}'` as
dockerd 20.10 prints it (only the fields read here); the lab's docker nodes check the real output
(tests/integration/test_lab_real_nodes_docker.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from installer.validate import probe
from installer.validate.runtime import (
    CHECKS,
    RuntimeExpect,
    binaries,
    cdi_specs,
    check_runtime,
    containerd_config,
    docker_config,
)
from tests.conftest import need

MAIN_V2 = 'version = 2\nimports = ["{dropin}"]\n'
DROPIN_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "{default}"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def dump(tmp_path: Path, default: str = "nvidia", with_dropin: bool = True) -> str:
    """`containerd config dump` of a main config importing the role's drop-in (real containerd)."""
    need(shutil.which("containerd"), "containerd not installed (scripts/apt-packages.txt)")
    dropin = tmp_path / "99-nvidia.toml"
    dropin.write_text(DROPIN_V2.format(default=default))
    main = tmp_path / "config.toml"
    main.write_text(MAIN_V2.format(dropin=dropin) if with_dropin else "version = 2\n")
    out = subprocess.run(["containerd", "--config", str(main), "config", "dump"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def docker_info(runtimes: dict[str, str], default: str) -> str:
    return json.dumps({"ServerVersion": "20.10.24+dfsg1", "DefaultRuntime": default,
                       "Runtimes": {k: {"path": v} for k, v in runtimes.items()}})


OK_BINS = "ok nvidia-container-runtime /usr/bin/nvidia-container-runtime\n" \
          "ok /usr/bin/nvidia-container-runtime /usr/bin/nvidia-container-runtime\n"
CONTAINERD = RuntimeExpect("containerd", default=True)
DOCKER = RuntimeExpect("docker", default=True)


def ids(findings) -> list[str]:
    return [f.check for f in findings]


def test_containerd_dump_with_the_roles_dropin_passes(tmp_path):
    text = dump(tmp_path)
    cfg = containerd_config(text)
    assert cfg.runtimes["nvidia"] == "/usr/bin/nvidia-container-runtime"
    assert cfg.default == "nvidia"
    assert check_runtime("n1", {"containerd": text, "binaries": OK_BINS}, {"containerd": 0}, CONTAINERD) == []


def test_containerd_without_the_dropin_has_no_nvidia_runtime(tmp_path):
    text = dump(tmp_path, with_dropin=False)
    found = check_runtime("n1", {"containerd": text, "binaries": OK_BINS}, {"containerd": 0}, CONTAINERD)
    assert ids(found) == ["runtime.nvidia", "runtime.default"]
    assert "no runtime named 'nvidia' (runtimes: runc)" in found[0].message and "containerd_runtime role" in found[0].fix
    assert "default runtime is runc" in found[1].message


def test_default_runtime_not_checked_when_the_operator_configures_it(tmp_path):
    text = dump(tmp_path, default="runc")
    assert ids(check_runtime("n1", {"containerd": text, "binaries": OK_BINS}, {"containerd": 0}, CONTAINERD)) == [
        "runtime.default"]
    operator = RuntimeExpect("containerd", default=None, by="the GPU Operator's toolkit daemonset")
    assert check_runtime("n1", {"containerd": text, "binaries": OK_BINS}, {"containerd": 0}, operator) == []


def test_runtime_binary_missing_on_the_node(tmp_path):
    text = dump(tmp_path)
    bins = "missing nvidia-container-runtime\nmissing /usr/bin/nvidia-container-runtime\n"
    found = check_runtime("n1", {"containerd": text, "binaries": bins}, {"containerd": 0}, CONTAINERD)
    assert ids(found) == ["runtime.binary"] and "/usr/bin/nvidia-container-runtime" in found[0].message


def test_runtime_absent_or_failing_is_one_finding_naming_the_fix():
    absent = check_runtime("n1", {}, {"containerd": 127}, CONTAINERD)
    assert ids(absent) == ["runtime.present"] and "containerd is not installed" in absent[0].message
    refused = check_runtime("n1", {"docker": "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."},
                            {"docker": 1}, DOCKER)
    assert ids(refused) == ["runtime.present"] and "Cannot connect to the Docker daemon" in refused[0].message
    assert "systemctl status docker" in refused[0].fix
    garbage = check_runtime("n1", {"containerd": "not = [toml"}, {"containerd": 0}, CONTAINERD)
    assert ids(garbage) == ["runtime.present"] and "unreadable" in garbage[0].message


def test_docker_runtimes_and_default():
    good = docker_info({"runc": "runc", "nvidia": "nvidia-container-runtime"}, "nvidia")
    assert docker_config(good).runtimes["nvidia"] == "nvidia-container-runtime"
    assert check_runtime("n1", {"docker": good, "binaries": OK_BINS}, {"docker": 0}, DOCKER) == []
    plain = docker_info({"runc": "runc"}, "runc")
    assert ids(check_runtime("n1", {"docker": plain, "binaries": OK_BINS}, {"docker": 0}, DOCKER)) == [
        "runtime.nvidia", "runtime.default"]
    with pytest.raises(ValueError):
        docker_config("Cannot connect to the Docker daemon")
    # docker 20.10's client with the daemon stopped: exit 0, the error in ServerErrors (as the lab's node prints it)
    down = json.dumps({"ServerErrors": ["Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the "
                                        "docker daemon running?"], "Runtimes": None, "ClientInfo": {"Version": "20.10"}})
    found = check_runtime("n1", {"docker": down}, {"docker": 0}, DOCKER)
    assert ids(found) == ["runtime.present"] and "Cannot connect to the Docker daemon" in found[0].message


def test_cdi_spec_required_only_with_cdi():
    cdi = RuntimeExpect("docker", default=None, cdi=True)
    good = docker_info({"runc": "runc", "nvidia": "nvidia-container-runtime"}, "runc")
    base = {"docker": good, "binaries": OK_BINS}
    none = check_runtime("n1", base, {"docker": 0}, cdi)
    assert ids(none) == ["runtime.cdi"] and "no spec files" in none[0].message
    other = check_runtime("n1", {**base, "cdi": "/etc/cdi/vendor.yaml \n"}, {"docker": 0}, cdi)
    assert ids(other) == ["runtime.cdi"] and "/etc/cdi/vendor.yaml" in other[0].message
    assert check_runtime("n1", {**base, "cdi": "/var/run/cdi/nvidia.yaml nvidia.com/gpu\n"}, {"docker": 0}, cdi) == []
    assert cdi_specs("/etc/cdi/a.json nvidia.com/gpu\n/etc/cdi/b.yaml\n") == (
        ["/etc/cdi/a.json", "/etc/cdi/b.yaml"], ["/etc/cdi/a.json"])
    assert binaries("ok x /usr/bin/x\nmissing y\n") == {"x": "/usr/bin/x", "y": ""}


def test_probe_output_statuses_and_runtime_checks_per_node(tmp_path):
    text = dump(tmp_path)
    m = probe.MARK
    out = "\n".join([f"{m} nvidia-smi", f"{m} rc 127", f"{m} containerd", text, f"{m} status containerd 0",
                     f"{m} docker", f"{m} status docker 127", f"{m} binaries", OK_BINS, f"{m} cdi", f"{m} end"])
    parsed = probe.parse_probe(out)
    assert parsed.statuses == {"containerd": 0, "docker": 127} and parsed.nvidia_smi_rc == 127
    t = probe.Target("h1", "node1", {})
    checks = probe.runtime_checks_for(t, parsed, CONTAINERD, 0.1)
    assert {c.check: c.status for c in checks} == {c: "pass" for c in CHECKS if c != "runtime.cdi"}
    assert all(c.layer == "runtime" and c.node == "node1" for c in checks)
    # a missing runtime: nvidia fails, its binary is not judged
    bad = probe.runtime_checks_for(t, probe.parse_probe(out.replace(text, dump(tmp_path, with_dropin=False))),
                                   CONTAINERD, 0.1)
    assert {c.check: c.status for c in bad} == {"runtime.present": "pass", "runtime.nvidia": "fail",
                                               "runtime.default": "fail"}


def test_the_probe_script_is_valid_sh_and_runs_here():
    """The probe as a node runs it (sh): every section and status line comes out, whatever this machine has."""
    out = subprocess.run(["sh", "-c", probe.PROBE], capture_output=True, text=True, timeout=60)
    parsed = probe.parse_probe(out.stdout)
    assert {"containerd", "docker", "binaries", "cdi", "end"} <= set(parsed.sections)
    assert set(parsed.statuses) == {"containerd", "docker"}
    expect = 127 if shutil.which("containerd") is None else 0
    assert parsed.statuses["containerd"] == expect
