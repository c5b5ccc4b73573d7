"""gpu_install.node.install_record: what the driver and toolkit roles installed, and removing exactly that.
Pure functions first, then the module through the real seam (ansible_connection=local) against this machine's
package database: recording, queries and removals that are refused or keep everything -- it never removes a package
here (the lab tests do: test_driver_toolkit_roles.py)."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer.errors import EXIT_HOST_FAILURES, EXIT_OK
from tests.conftest import need
from tests.unit.library_modules import load_module

rec = load_module("install_record")


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def test_parse_dpkg_counts_packages_with_files_on_disk():
    text = "ii \tbash\nrc \told-driver\nun \tnever\niU \thalf-unpacked\niF \tfailed-config\n\tbroken\n"
    assert rec.parse_dpkg(text) == {"bash", "half-unpacked", "failed-config"}


def test_parse_apt_simulation():
    text = ("NOTE: This is only a simulation!\nRemv nvidia-driver [535.309.01-1]\nRemv libfoo:i386 [1.0]\n"
            "Remv nvidia-smi [535.309.01-1] [amd64]\nInst x\n")
    assert rec.parse_apt_simulation(text) == {"nvidia-driver", "libfoo", "nvidia-smi"}


def test_parse_rpm_needed():
    text = ("error: Failed dependencies:\n\tnvidia-driver(x86-64) = 3:535 is needed by (installed) cuda-drivers-535-1.x86_64\n"
            "\tlibnvidia-ml.so.1 is needed by (installed) dcgm-3.3-1.x86_64\n")
    assert rec.parse_rpm_needed(text) == ["cuda-drivers-535-1.x86_64", "dcgm-3.3-1.x86_64"]


def test_add_records_new_packages_preexisting_requested_and_first_entries():
    before = {"bash", "nvidia-persistenced", "kmod"}
    after = before | {"nvidia-driver", "nvidia-smi", "libnvidia-x"}
    r, added = rec.add(None, before, after, ["nvidia-driver", "nvidia-smi", "nvidia-persistenced"],
                       {"blacklist": {"path": "/etc/modprobe.d/b.conf", "checksum": "1", "backup": ""}, "runfile": {}})
    assert added == ["libnvidia-x", "nvidia-driver", "nvidia-smi"]
    assert r["packages"] == added and r["preexisting"] == ["nvidia-persistenced"]
    assert r["entries"] == {"blacklist": {"path": "/etc/modprobe.d/b.conf", "checksum": "1", "backup": ""}}
    # a later apply: nothing new, an entry already recorded keeps its first value (the state before gpu-install)
    again, added2 = rec.add(r, after, after, ["nvidia-driver"], {"blacklist": {"path": "x", "checksum": "2"}})
    assert again == r and added2 == []
    # a later install adds to the record; the first packages stay recorded
    more, added3 = rec.add(r, after, after | {"dkms"}, ["dkms"], {"persistenced": "nvidia-persistenced"})
    assert added3 == ["dkms"] and set(more["packages"]) == set(added) | {"dkms"}
    assert more["entries"]["persistenced"] == "nvidia-persistenced" and more["entries"]["blacklist"]["checksum"] == "1"


names = st.sets(st.sampled_from([f"p{i}" for i in range(12)]))


@settings(max_examples=200, deadline=None)
@given(names, names, names, names)
def test_removal_never_touches_what_was_there_before(before, new, later_gone, requested):
    """Whatever was installed before the first apply is never in the removal; with keep nothing is removed."""
    after = before | new
    r, _ = rec.add(None, before, after, sorted(requested), {})
    installed = after - later_gone
    remove, kept, missing = rec.removal(r, installed, keep=False)
    assert set(remove) == (new - before) & installed and not set(remove) & before
    assert set(missing) == (new - before) & later_gone and kept == []
    remove2, kept2, _ = rec.removal(r, installed, keep=True)
    assert remove2 == [] and set(kept2) == set(remove)
    assert set(r["preexisting"]) == set(requested) & before


# ---------------------------------------------------------------- the module through the seam, on this machine

needs_dpkg = pytest.mark.skipif(shutil.which("dpkg-query") is None or shutil.which("apt-get") is None,
                                reason="needs dpkg-query and apt-get (Debian/Ubuntu)")


def play(tmp_path, tasks: list) -> object:
    import sys

    import yaml

    from installer import ansible as seam

    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump([{"name": "T", "hosts": "all", "gather_facts": False, "tasks": tasks}]))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local",
                                                                "ansible_python_interpreter": sys.executable}}}}))
    return seam.run_playbook(pb, inv, {})


def task(state: str, path, **kw) -> dict:
    return {"name": f"Record | {state}", "gpu_install.node.install_record": {"state": state, "path": str(path),
                                                                            "manager": "apt", **kw}}


def installed_here() -> list[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\n"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(rec.parse_dpkg(out))


@needs_dpkg
def test_module_records_new_packages_then_keeps_them_on_removal(tmp_path):
    here = installed_here()
    assert "dpkg" in here
    path = tmp_path / "var" / "lib" / "gpu-install" / "role.json"
    # as if dpkg and bash had been installed by this run (absent from the snapshot "before")
    before = [p for p in here if p not in ("dpkg", "bash")]
    res = play(tmp_path, [task("present", path, packages_before=before, requested=["bash", "coreutils"],
                               entries={"blacklist": {"path": "/x", "checksum": "c", "backup": ""}})])
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1
    doc = json.loads(path.read_text())
    assert doc["packages"] == ["bash", "dpkg"] and doc["preexisting"] == ["coreutils"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = play(tmp_path, [task("present", path, packages_before=here, requested=["bash"])])
    assert again.exit_code() == EXIT_OK and again.hosts["node"].changed == 0
    # keep_packages: nothing removed, the record keeps the packages (a later uninstall may remove them), entries go
    kept = play(tmp_path, [task("absent", path, keep_packages=True)])
    assert kept.exit_code() == EXIT_OK and kept.hosts["node"].changed == 1
    doc = json.loads(path.read_text())
    assert doc["packages"] == ["bash", "dpkg"] and doc["entries"] == {}
    assert play(tmp_path, [task("absent", path, keep_packages=True)]).hosts["node"].changed == 0
    assert installed_here() == here


@needs_dpkg
def test_module_refuses_a_removal_that_would_take_other_packages(tmp_path):
    """A package that others here depend on (libcurl4: curl, ...), recorded as ours: removing it would take them
    along -> refused, naming them; nothing removed."""
    here = installed_here()

    def dependents(pkg: str) -> list[str]:
        sim = subprocess.run(["apt-get", "-s", "-q", "remove", pkg], capture_output=True, text=True,
                             env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        return sorted(rec.parse_apt_simulation(sim.stdout) - {pkg}) if sim.returncode == 0 else []

    pkg = next((p for p in ("libcurl4", "dirmngr", "git-man", "libyaml-0-2", "python3-yaml")
                if p in here and dependents(p)), None)
    need(pkg, "no installed package here whose removal apt would cascade to others (git-man: install git)")
    path = tmp_path / "role.json"
    path.write_text(json.dumps({"format": 1, "packages": [pkg, "gone-package"], "preexisting": [], "entries": {}}))
    res = play(tmp_path, [task("absent", path)])
    assert res.exit_code() == EXIT_HOST_FAILURES
    msg = res.failures[0].message
    assert f"removing the packages gpu-install installed ({pkg}) would also remove or break" in msg, msg
    assert ", ".join(dependents(pkg)) in msg and "nothing was removed" in msg and "--keep-packages" in msg
    assert path.exists() and installed_here() == here


@needs_dpkg
def test_module_without_a_record_or_with_packages_already_gone(tmp_path):
    path = tmp_path / "role.json"
    res = play(tmp_path, [task("absent", path), task("query", path)])
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 0
    path.write_text(json.dumps({"format": 1, "packages": ["gpu-install-no-such-package"], "preexisting": [],
                                "entries": {}}))
    res = play(tmp_path, [task("absent", path)])
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1 and not path.exists()
    path.write_text("{not json")
    res = play(tmp_path, [task("absent", path)])
    assert res.exit_code() == EXIT_HOST_FAILURES
    assert "is not valid JSON" in res.failures[0].message and "remove it" in res.failures[0].message
