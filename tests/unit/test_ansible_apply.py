"""preflight/apply through the real seam with local connections and a fake node root; role specs vs defaults."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from installer import apply, content
from installer.config import parse_site
from installer.errors import ConfigError, HostFailures, HostsUnreachable, PreflightError
from installer.render.role_vars import toolkit_package_version
from tests.conftest import ROOT, plan_of
from tests.unit.library_modules import load_module

ROLES = ["preflight", "docker_runtime", "containerd_runtime", "registry_trust", "package_repo", "nvidia_driver",
         "nvidia_container_toolkit", "mig_mode",
         "scheduler_policy"]


def specs(role: str) -> dict:
    return yaml.safe_load((content.role_dir(role) / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_argument_specs_do_not_drift(role):
    defaults = yaml.safe_load((content.role_dir(role) / "defaults" / "main.yml").read_text())
    opts = specs(role)
    assert set(defaults) == set(opts)
    for key, value in defaults.items():
        assert key.startswith(role + "_")
        assert opts[key]["default"] == value, key
        assert opts[key].get("description"), key


FIXTURE_CA = ROOT / "tests" / "fixtures" / "ca.pem"  # a CA certificate (its key was thrown away)


def role_vars_of(s) -> dict:
    return dict(plan_of(s).role_vars)


def site(**over):
    data = {"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000", "insecure": True},
            "runtime": "docker", "toolkit": {"mode": "host"}, "driver": {"mode": "host"}}
    data.update(over)
    return parse_site(data)


@pytest.mark.parametrize("over", [{}, {"runtime": "containerd"}, {"toolkit": {"mode": "operator"}},
                                  {"cdi": {"enabled": True}}, {"registry": {"host": "r:1"}},
                                  {"driver": {"mode": "host", "version": "535.309.01"}},
                                  {"toolkit": {"mode": "host", "version": "v1.17.8-ubuntu20.04"}},
                                  {"driver": {"mode": "runfile", "runfile": "https://m/files/NVIDIA-Linux-x86_64-535.216.03.run",
                                              "runfileSha256": "a" * 64}}])
def test_role_vars_only_declared_variables(over):
    declared = {k for r in ROLES for k in specs(r)} | {"gpu_install_action"}
    ev = role_vars_of(site(**over))
    assert set(ev) <= declared
    json.dumps(ev)


def test_role_vars_mapping():
    ev = role_vars_of(site())
    assert ev["docker_runtime_enabled"] and not ev["containerd_runtime_enabled"]
    assert ev["docker_runtime_insecure_registries"] == ["reg.lab:5000"]
    ev = role_vars_of(site(runtime="containerd", cdi={"enabled": True}))
    assert ev["containerd_runtime_enabled"] and ev["containerd_runtime_set_default"] is False
    assert ev["containerd_runtime_registry_config_path"] == "/etc/containerd/certs.d"
    assert not role_vars_of(site(toolkit={"mode": "operator"}))["docker_runtime_enabled"]
    ev = role_vars_of(site(runtime="containerd", registry={"host": "Reg.lab:5000", "ca": str(FIXTURE_CA)}))
    assert ev["registry_trust_enabled"] and ev["registry_trust_host"] == "reg.lab:5000"
    assert Path(ev["registry_trust_ca_src"]).is_absolute() and ev["registry_trust_ca_src"].endswith("/ca.pem")
    assert ev["registry_trust_containerd_config_path"] == "/etc/containerd/certs.d"
    assert ev["registry_trust_docker_certs_d"] == ""
    assert not role_vars_of(site(registry={"host": "r:1"}))["registry_trust_enabled"]


def test_role_vars_driver_and_toolkit():
    ev = role_vars_of(site())
    assert ev["nvidia_driver_mode"] == "host" and ev["nvidia_driver_package_version"] == "550"  # v24.9.2's branch
    assert ev["nvidia_driver_kernel_module_type"] == "proprietary"  # auto below R560
    assert ev["nvidia_container_toolkit_enabled"] and ev["nvidia_container_toolkit_version"] == "1.17.4"  # v24.9.2
    ev = role_vars_of(site(driver={"mode": "precompiled", "version": "550"}, toolkit={"mode": "host", "version": "1.17.8"}))
    assert ev["nvidia_driver_mode"] == "precompiled" and ev["nvidia_driver_package_version"] == "550"
    assert ev["nvidia_container_toolkit_version"] == "1.17.8"
    ev = role_vars_of(site(toolkit={"mode": "operator"}))
    assert ev["nvidia_container_toolkit_enabled"] is False and "nvidia_container_toolkit_version" not in ev
    with pytest.raises(ConfigError, match="not a toolkit version"):
        role_vars_of(site(toolkit={"mode": "host", "version": "latest"}))


def test_role_vars_runfile():
    url = "https://mirror.lab/files/NVIDIA-Linux-x86_64-535.216.03.run"
    ev = role_vars_of(site(driver={"mode": "runfile", "runfile": url, "runfileSha256": "AB" * 32}))
    assert ev["nvidia_driver_mode"] == "runfile" and ev["nvidia_driver_runfile"] == url
    assert ev["nvidia_driver_runfile_sha256"] == "ab" * 32  # normalised to lower case, as get_url/stat print it
    assert ev["nvidia_driver_package_version"] == "535.216.03"  # from the file name
    ev = role_vars_of(site(driver={"mode": "runfile", "runfile": "/srv/driver.run", "version": "550.54.15"}))
    assert ev["nvidia_driver_package_version"] == "550.54.15" and ev["nvidia_driver_runfile_sha256"] == ""
    assert "nvidia_driver_runfile" not in role_vars_of(site())


@pytest.mark.parametrize("driver,problem", [
    ({"mode": "runfile"}, "driver.mode runfile needs driver.runfile"),
    ({"mode": "runfile", "runfile": "/srv/driver.run"}, "needs the exact driver version"),
    ({"mode": "runfile", "runfile": "/srv/driver.run", "version": "535"}, "needs the exact driver version"),
    ({"mode": "runfile", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run", "version": "550.54.15"},
     "driver.version 550.54.15 but driver.runfile is the 535.216.03 installer"),
    ({"mode": "runfile", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run", "runfileSha256": "abc"}, "64 hex digits"),
    ({"mode": "host", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run"}, "only used with driver.mode: runfile"),
    ({"mode": "runfile", "runfile": "https://m/files/NVIDIA-Linux-x86_64-535.216.03.run"},
     "driver.runfileSha256 is required with a URL driver.runfile"),
    ({"mode": "runfile", "runfile": "http://m:8080/NVIDIA-Linux-x86_64-535.216.03.run", "runfileSha256": None},
     "`sha256sum NVIDIA-Linux-x86_64-535.216.03.run`"),
])
def test_runfile_site_errors_name_the_field(driver, problem):
    with pytest.raises(ConfigError) as exc:
        site(driver=driver)
    assert problem in exc.value.message and "driver" in exc.value.message


def test_runfile_path_relative_to_the_site_file(tmp_path):
    from installer.config import load_site

    (tmp_path / "site.yaml").write_text(
        "operator: {version: v24.9.2}\nregistry: {host: r:5000}\n"
        "driver: {mode: runfile, runfile: files/NVIDIA-Linux-x86_64-535.216.03.run}\n")
    s = load_site(tmp_path / "site.yaml")
    assert s.driver.runfile == str(tmp_path.resolve() / "files/NVIDIA-Linux-x86_64-535.216.03.run")
    (tmp_path / "site.yaml").write_text(
        "operator: {version: v24.9.2}\nregistry: {host: r:5000}\n"
        "driver: {mode: runfile, runfile: 'http://m:8080/files/NVIDIA-Linux-x86_64-535.216.03.run', "
        f"runfileSha256: {'c' * 64}}}\n")
    assert load_site(tmp_path / "site.yaml").driver.runfile.startswith("http://m:8080/files/")


def test_url_runfile_without_checksum_is_exit_2_at_load_naming_the_field_and_the_fix(tmp_path, capsys):
    """Before anything else runs: a URL runfile without driver.runfileSha256 would be fetched and run as root
    unchecked. The CLI's exit code and message, the site file's line named."""
    from installer.cli import main

    (tmp_path / "site.yaml").write_text(
        "operator: {version: v24.9.2}\nregistry: {host: r:5000}\n"
        "driver: {mode: runfile, runfile: 'https://files.lab/NVIDIA-Linux-x86_64-535.216.03.run'}\n")
    assert main(["render", "-s", str(tmp_path / "site.yaml"), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "driver.runfileSha256 is required with a URL driver.runfile" in err, err
    assert "`sha256sum NVIDIA-Linux-x86_64-535.216.03.run`" in err and "DIR/files/SHA256SUMS" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("tag,want", [("v1.17.4-ubuntu20.04", "1.17.4"), ("v1.18.0", "1.18.0"), ("1.17.4", "1.17.4"),
                                      ("v1.14.6-ubi8", "1.14.6"), ("1.17.4-1", "1.17.4-1"), (" v1.20.0 ", "1.20.0")])
def test_toolkit_package_version(tag, want):
    assert toolkit_package_version(tag) == want


@pytest.mark.parametrize("tag", ["latest", "v1", "1.17.4-", "sha256:abc", "1.x.4"])
def test_toolkit_package_version_refuses(tag):
    with pytest.raises(ConfigError):
        toolkit_package_version(tag)


@pytest.mark.parametrize("role,os_files", [("nvidia_driver", ["Debian", "Ubuntu", "RedHat"]),
                                           ("nvidia_container_toolkit", ["Debian", "Ubuntu", "RedHat"])])
def test_os_maps_have_the_same_keys(role, os_files):
    maps = [yaml.safe_load((content.role_dir(role) / "vars" / f"{f}.yml").read_text()) for f in os_files]
    assert all(set(m) == {f"{role}_os"} for m in maps)
    keys = [set(m[f"{role}_os"]) for m in maps]
    assert all(k == keys[0] for k in keys), keys


# ---------------------------------------------------------------- preflight probe (pure)

probe = load_module("preflight")
SUPPORTED = yaml.safe_load((content.role_dir("preflight") / "defaults" / "main.yml").read_text())["preflight_supported_os"]


def fake_node(root: Path, os_id="ubuntu", version="22.04", gpu=True, modules=(), runtime="dockerd", driver=None,
              tools=("apt-cache",)):
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/os-release").write_text(f'ID={os_id}\nVERSION_ID="{version}"\nID_LIKE=debian\n')
    (root / "proc").mkdir(exist_ok=True)
    (root / "proc/modules").write_text("".join(f"{m} 1 0 - Live 0x0\n" for m in modules))
    if driver:
        (root / "proc/driver/nvidia").mkdir(parents=True)
        (root / "proc/driver/nvidia/version").write_text(driver + "\n")
    dev = root / "sys/bus/pci/devices/0000:00:02.0"
    dev.mkdir(parents=True, exist_ok=True)
    for f, v in {"vendor": "0x10de" if gpu else "0x8086", "class": "0x030200", "device": "0x2330"}.items():
        (dev / f).write_text(v + "\n")
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    for exe in (runtime, *tools) if runtime else tools:
        (root / "usr/bin" / exe).write_text("#!/bin/sh\n")
        (root / "usr/bin" / exe).chmod(0o755)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    import os

    (root / "lib/modules" / os.uname().release / "build").mkdir(parents=True, exist_ok=True)  # headers installed
    return root


def check(root: Path, runtime="docker", mode="operator", **kw):
    f = probe.probe(str(root), lambda cmd: (0, "Candidate: (none)", ""), kernel="6.1.0-9-amd64", arch=kw.pop("arch", "x86_64"),
                    check_headers=mode in ("host", "runfile"))
    f["disk_path"], f["disk_free_gb"] = "/var/lib", kw.pop("free", 50.0)
    return f, probe.problems(f, runtime, mode, SUPPORTED, ["x86_64", "aarch64"], 10, True)


def test_probe_headers_asks_only_the_package_tool_the_node_has(tmp_path):
    """RHEL 9 has dnf (yum only as its alias), CentOS 7 yum; the lab's rhel9 stand-in has no yum at all. Running a
    missing tool made the preflight module fail ("Error executing command") instead of answering."""
    asked = []

    def run(cmd):
        asked.append(cmd[0])
        return (0, "Available Packages\nkernel-devel.x86_64 5.14.0-503.el9 baseos\n", "")

    root = fake_node(tmp_path, os_id="rocky", version="9.5", tools=("dnf",))
    (root / "etc/os-release").write_text('ID="rocky"\nVERSION_ID="9.5"\nID_LIKE="rhel centos fedora"\n')
    (root / "lib/modules").rename(root / "lib/no-modules")  # headers not installed: the repo is asked
    f = probe.probe(str(root), run, kernel="5.14.0-503.el9.x86_64", arch="x86_64", check_headers=True)
    assert asked == ["dnf"] and f["kernel_headers"] == "available"
    (root / "usr/bin/dnf").unlink()
    f = probe.probe(str(root), run, kernel="5.14.0-503.el9.x86_64", arch="x86_64", check_headers=True)
    assert asked == ["dnf"] and f["kernel_headers"] == "unknown"


def test_probe_healthy_node(tmp_path):
    f, problems = check(fake_node(tmp_path))
    assert problems == [] and f["gpus"] == ["0000:00:02.0 [10de:2330]"] and f["os_family"] == "debian"


@pytest.mark.parametrize("node,kw,expect", [
    ({"os_id": "ubuntu", "version": "16.04"}, {}, "OS ubuntu 16.04 is not supported"),
    ({}, {"arch": "ppc64le"}, "architecture ppc64le"),
    ({}, {"free": 2.0}, "only 2.0 GiB free"),
    ({"gpu": False}, {}, "no NVIDIA GPU on PCI"),
    ({"modules": ["nouveau"]}, {}, "nouveau driver is loaded"),
    ({"driver": "NVRM version: 550.54"}, {}, "already loaded on the host (NVRM version: 550.54) but driver.mode is operator"),
    ({"runtime": None}, {}, "container runtime docker not found"),
    ({}, {"mode": "host"}, "kernel headers for the running kernel 6.1.0-9-amd64"),
    ({}, {"mode": "runfile"}, "kernel headers for the running kernel 6.1.0-9-amd64"),
    ({}, {"mode": "preinstalled"}, "no NVIDIA driver is loaded"),
])
def test_probe_problems_name_the_fix(tmp_path, node, kw, expect):
    _, problems = check(fake_node(tmp_path, **node), **kw)
    assert len(problems) == 1 and expect in problems[0], problems


@pytest.mark.parametrize("mode,refused", [("operator", True), ("precompiled", True), ("host", False),
                                           ("runfile", False), ("preinstalled", False)])
def test_nouveau_is_refused_only_where_gpu_install_does_not_blacklist_it(tmp_path, mode, refused):
    """host/runfile: the driver role blacklists nouveau and handles the reboot, so preflight lets the run go on."""
    _, problems = check(fake_node(tmp_path, modules=["nouveau"]), mode=mode)
    assert any("nouveau" in p for p in problems) == refused, problems


def test_probe_kernel_headers_requirement_can_be_lifted(tmp_path):
    f, problems = check(fake_node(tmp_path), mode="host")
    assert f["kernel_headers"] == "missing" and len(problems) == 1
    assert probe.problems(f, "docker", "host", SUPPORTED, ["x86_64", "aarch64"], 10, True,
                          require_kernel_headers=False) == []


def test_probe_rocky_major_version_matches(tmp_path):
    _, problems = check(fake_node(tmp_path, os_id="rocky", version="9.5"))
    assert problems == []


# ---------------------------------------------------------------- preflight + apply, real runs

LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def inventory(tmp_path: Path, gpu_hosts: dict, groups=("kube_control_plane",)) -> str:
    children = {"gpu_nodes": {"hosts": gpu_hosts}}
    for g in groups:
        children[g] = {"hosts": {"cp": LOCAL}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"children": children}}))
    return str(path)


def options(tmp_path, inv, node_root, **kw):
    daemon = tmp_path / "daemon.json"
    # the driver/toolkit roles would install packages on this machine: tested on lab nodes
    # (tests/integration/test_driver_toolkit_roles.py); here only their install-nothing modes run
    extra = {"preflight_root": str(node_root), "preflight_min_free_gb": 0.001, "docker_runtime_daemon_json": str(daemon),
             "docker_runtime_restart": False, "docker_runtime_options": {"iptables": False},
             "nvidia_driver_enabled": False, "nvidia_container_toolkit_enabled": False}
    return NodeRun(inv, apply.RunOptions(extra=extra, **kw)), daemon


@dataclass
class NodeRun:
    inventory: str
    run: apply.RunOptions

    @property
    def extra(self) -> dict:
        return self.run.extra  # a dict: tests switch roles on in place


def preflight(s, opts: NodeRun):
    return apply.preflight(plan_of(s, inventory=opts.inventory), opts.run)


def apply_nodes(s, opts: NodeRun):
    """apply's first two stages: preflight (read-only) then playbooks/site.yml, on the resolved plan."""
    plan = plan_of(s, inventory=opts.inventory)
    return apply.preflight(plan, opts.run), apply.run_nodes("site.yml", plan, opts.run)


def test_apply_end_to_end_then_changed_0(tmp_path):
    node = fake_node(tmp_path / "node")
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL, "gpu2": LOCAL}), node)
    daemon.write_text('{"log-level": "warn"}')
    pre, res = apply_nodes(site(), opts)
    assert set(pre.hosts) >= {"gpu1", "gpu2"} and pre.changed == 0
    assert res.changed >= 1
    doc = json.loads(daemon.read_text())
    assert doc["log-level"] == "warn" and doc["default-runtime"] == "nvidia" and doc["iptables"] is False
    _, again = apply_nodes(site(), opts)
    assert all(s.changed == 0 for s in again.hosts.values())


def test_driver_mode_preinstalled_without_nvidia_smi_fails_that_host(tmp_path):
    """The driver role's install-nothing mode on this machine (no nvidia-smi here): exit 4 naming host and cause."""
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("this machine has nvidia-smi")
    node = fake_node(tmp_path / "node", driver="NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01")
    opts, _ = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}), node)
    opts.extra["nvidia_driver_enabled"] = True
    with pytest.raises(HostFailures, match="gpu1: driver.mode is preinstalled but nvidia-smi failed") as exc:
        apply_nodes(site(driver={"mode": "preinstalled"}, toolkit={"mode": "operator"}), opts)
    assert exc.value.exit_code == 4


def test_driver_mode_operator_on_a_clean_machine_passes(tmp_path):
    """operator mode: package facts of this machine (no NVIDIA driver packages) -> ok, nothing changed."""
    node = fake_node(tmp_path / "node")
    opts, _ = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}), node)
    opts.extra["nvidia_driver_enabled"] = True
    _, res = apply_nodes(site(driver={"mode": "operator"}, toolkit={"mode": "operator"}), opts)
    assert res.hosts["gpu1"].changed == 0 and res.hosts["gpu1"].ok >= 3


def test_apply_check_mode_changes_nothing(tmp_path):
    node = fake_node(tmp_path / "node")
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}), node, check=True)
    apply_nodes(site(), opts)
    assert not daemon.exists()


def test_preflight_problem_exit_3_nothing_changed(tmp_path, capsys):
    node = fake_node(tmp_path / "node", modules=["nouveau"])
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}), node)
    with pytest.raises(PreflightError, match="gpu1: the nouveau driver is loaded") as exc:
        apply_nodes(site(driver={"mode": "operator"}), opts)
    assert exc.value.exit_code == 3 and not daemon.exists()


EXTENDER = {"extenders": [{"urlPrefix": "http://127.0.0.1:3456/scheduler", "filterVerb": "filter"}]}


def test_kube_control_plane_is_required_only_by_the_scheduler_stage(tmp_path):
    node = fake_node(tmp_path / "node")
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL}, groups=()), node)
    with pytest.raises(ConfigError, match="group 'kube_control_plane' is missing or empty, and the scheduler stage "
                                          "needs it") as exc:
        apply_nodes(site(scheduler=EXTENDER), opts)
    assert exc.value.exit_code == 2 and not daemon.exists()
    _, res = apply_nodes(site(), opts)  # no extenders: nothing needs the control plane
    assert res.changed >= 1 and daemon.exists()


def test_removed_variable_named_with_fix(tmp_path):
    node = fake_node(tmp_path / "node")
    opts, _ = options(tmp_path, inventory(tmp_path, {"gpu1": dict(LOCAL, nvidia_driver_version="550")}), node)
    with pytest.raises(ConfigError, match="host gpu1: variable 'nvidia_driver_version' was removed; set driver.version"):
        preflight(site(), opts)


def test_unreachable_node_others_finish_exit_5(tmp_path):
    node = fake_node(tmp_path / "node")
    dead = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_user": "nobody",
            "ansible_ssh_common_args": "-o ConnectTimeout=3 -o BatchMode=yes -o StrictHostKeyChecking=no"}
    opts, daemon = options(tmp_path, inventory(tmp_path, {"gpu1": LOCAL, "dead": dead}), node)
    with pytest.raises(HostsUnreachable, match="unreachable: dead") as exc:
        preflight(site(), opts)
    assert exc.value.exit_code == 5
    # the others finished: gpu1's preflight ran to the end (its facts were recorded), the control plane too
    runs = sorted((tmp_path / "state" / "runs").iterdir())
    stats = [json.loads(line)["event_data"] for line in _events(runs[-1]) if '"playbook_on_stats"' in line]
    assert stats and stats[-1]["ok"].get("gpu1", 0) >= 3 and "gpu1" not in stats[-1].get("failures", {})
    assert stats[-1]["dark"] == {"dead": 1}


def _events(run_dir: Path) -> list[str]:
    return [p.read_text() for p in sorted((run_dir / "artifacts" / "run" / "job_events").glob("*.json"))]


def test_cli_preflight_exit_code_and_message(tmp_path, cli, write_site):
    inv = inventory(tmp_path, {"gpu1": LOCAL}, groups=())
    path = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000"}, "scheduler": EXTENDER})
    rc, out, err = cli("preflight", "-s", path, "-i", inv, "-q")
    assert rc == 2 and "kube_control_plane" in err and "scheduler" in err and "hint:" in err
