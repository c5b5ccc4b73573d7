"""dnf module streams (RHEL 8/9: NVIDIA ships the driver as nvidia-driver:<branch>-open | <branch>-dkms):

- the driver role's stream (vars/RedHat.yml module_stream) as the mirror plan lists it (OsPackages.modules);
- installer/mirror/packages/modulemd.py, which reads untrusted modules metadata: documents split without parsing,
  only the wanted module's parsed strictly and checked, bounded expansion, repomd.xml's modules entry;
- the collection's dnf_module_stream module: its pure parts, then the module through the real seam
  (ansible_connection=local) driving this machine's real dnf in a private installroot against the STAND-IN module
  repository (gpu_install_lab/standin_modules.py: real createrepo_c and modifyrepo_c): enable, enabled already,
  switch through a reset, a stream not offered, a repository without modules metadata, the reset back."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from installer.errors import EXIT_HOST_FAILURES, EXIT_OK, ConfigError
from installer.mirror.packages import modulemd
from tests.conftest import need
from tests.unit.library_modules import load_module

dms = load_module("dnf_module_stream")


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))  # the seam's run records


# ---------------------------------------------------------------- the plan's stream


def _plan(tmp_path: Path, driver: dict, os_tags=("rocky9.4",)):
    from installer.config import load_site
    from installer.plan import Options, resolve

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v25.10.1"}, "registry": {"host": "r.example:5000"},
                                    "driver": driver}))
    return resolve(load_site(site), Options(os_tags=os_tags)).artifacts(())


def test_plan_lists_the_stream_of_the_branch_and_flavour(tmp_path):
    arts = _plan(tmp_path, {"mode": "host", "version": "580.82.07", "kernelModuleType": "open"},
                 ("rocky9.4", "rhel8.10", "ubuntu22.04"))
    sets = {s.os: s for s in arts.packages}
    assert sets["rocky9.4"].modules == ("nvidia-driver:580-open",)
    assert sets["rhel8.10"].modules == ("nvidia-driver:580-open",)
    assert sets["ubuntu22.04"].modules == ()
    roots = {p.spec for p in sets["rocky9.4"].packages}
    assert {"kmod-nvidia-open-dkms-580.82.07*", "nvidia-driver-580.82.07*"} <= roots
    assert not any(r.startswith("kmod-nvidia-latest-dkms") for r in roots)
    doc = arts.as_dict()
    assert [p.get("modules") for p in doc["packages"]] == [["nvidia-driver:580-open"], ["nvidia-driver:580-open"],
                                                           None]  # a key of the dnf OSes with streams only
    assert list(doc["packages"][0]) == ["os", "manager", "closure", "hosts", "modules", "roots"]
    assert any("dnf module stream nvidia-driver:580-open" in n for n in arts.notes)
    from installer.cli.mirror import plan_text

    text = plan_text(arts)
    assert "roots; dnf module stream nvidia-driver:580-open enabled; closure resolved at pull)" in text, text
    assert text.count("dnf module stream nvidia-driver:580-open enabled") == 2  # rocky9.4, rhel8.10; not Ubuntu
    prop = _plan(tmp_path, {"mode": "host", "version": "535", "kernelModuleType": "proprietary"})
    assert prop.packages[0].modules == ("nvidia-driver:535-dkms",)
    assert "kmod-nvidia-latest-dkms-535*" in {p.spec for p in prop.packages[0].packages}


def test_plan_lists_no_stream_on_rhel7_or_outside_host_mode(tmp_path):
    assert _plan(tmp_path, {"mode": "host", "version": "535"}, ("centos7.9",)).packages[0].modules == ()
    runfile = _plan(tmp_path, {"mode": "runfile", "runfile": "/x/NVIDIA-Linux-x86_64-580.82.07.run"})
    assert all(s.modules == () for s in runfile.packages)


# ---------------------------------------------------------------- modules metadata (untrusted)


def _doc(stream="580-open", name="nvidia-driver", version=20260101000000, rpms=None, extra="") -> str:
    rpms = rpms if rpms is not None else ["nvidia-driver-3:580.82.07-1.el9.x86_64"]
    arts = "".join(f"      - {r}\n" for r in rpms)
    return (f"document: modulemd\nversion: 2\ndata:\n  name: {name}\n  stream: {stream}\n  version: {version}\n"
            f"  context: 00000000\n  arch: x86_64\n  profiles:\n    default:\n      rpms: [nvidia-driver]\n"
            f"  artifacts:\n    rpms:\n{arts}{extra}")


def test_documents_split_at_markers_only():
    text = f"---\n{_doc()}...\n---\n{_doc('580-dkms')}\n---\ndocument: modulemd-defaults\n"
    docs = modulemd.documents(text)
    assert len(docs) == 3 and "580-dkms" in docs[1] and docs[2].startswith("document: modulemd-defaults")
    # a '---' inside a value (not at column 0) is text, not a boundary
    assert len(modulemd.documents("a: |\n  ---\n  x\n")) == 1


def test_parse_keeps_the_module_and_checks_every_field():
    text = "".join(f"---\n{d}" for d in (_doc(), _doc("580-dkms"), _doc(name="nodejs", rpms=["x-0:1-1.x86_64"]),
                                         "document: modulemd-defaults\nversion: 1\ndata: {module: nvidia-driver}\n"))
    got = modulemd.parse(text, "up", "nvidia-driver")
    assert [(s.spec, s.version, s.context) for s in got] == [("nvidia-driver:580-open", 20260101000000, "0"),
                                                            ("nvidia-driver:580-dkms", 20260101000000, "0")]
    assert got[0].text.startswith("document: modulemd") and "00000000" in got[0].text  # verbatim, as dnf reads it
    assert [s.spec for s in modulemd.parse(text, "up")] == ["nvidia-driver:580-open", "nvidia-driver:580-dkms",
                                                            "nodejs:580-open"]
    bad = {
        "artifacts.rpms": _doc(rpms=["nvidia-driver-580"]),
        "data.version": _doc(version="soon"),
        "data.name/data.stream": _doc(stream="580 open"),
        "given twice": _doc(extra="  name: nvidia-driver\n"),
        "alias": _doc().replace("rpms: [nvidia-driver]", "rpms: &a [nvidia-driver]\n    fm: {rpms: *a}"),
        "modulemd version": _doc().replace("version: 2\n", "version: 3\n", 1),
    }
    for what, doc in bad.items():
        with pytest.raises(ValueError) as err:
            modulemd.parse(f"---\n{doc}", "up", "nvidia-driver")
        assert what in str(err.value) and "up: document 1" in str(err.value), (what, err.value)
    with pytest.raises(ValueError, match="more than a module stream's document"):
        modulemd.parse(_doc(extra="  description: " + "x" * modulemd.MAX_DOCUMENT + "\n"), "up", "nvidia-driver")


def test_render_and_merge_keep_one_document_per_stream_version():
    a, b = modulemd.parse(f"---\n{_doc()}---\n{_doc('580-dkms')}", "x", "nvidia-driver")
    newer = modulemd.parse(_doc(version=20270101000000), "x", "nvidia-driver")[0]
    merged = modulemd.merge([a, b], [a, newer])
    assert [(s.stream, s.version) for s in merged] == [("580-dkms", 20260101000000), ("580-open", 20260101000000),
                                                      ("580-open", 20270101000000)]
    again = modulemd.parse(modulemd.render(merged), "rendered", "nvidia-driver")
    assert [s.key for s in again] == [s.key for s in merged]


def test_expand_by_suffix_and_bounded(tmp_path, monkeypatch):
    text = f"---\n{_doc()}"
    (tmp_path / "m.yaml.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "m.yaml.xz").write_bytes(lzma.compress(text.encode()))
    (tmp_path / "m.yaml").write_text(text)
    for name in ("m.yaml.gz", "m.yaml.xz", "m.yaml"):
        assert modulemd.expand(tmp_path / name, name) == text
    if shutil.which("zstd"):
        subprocess.run(["zstd", "-q", str(tmp_path / "m.yaml"), "-o", str(tmp_path / "m.yaml.zst")], check=True)
        assert modulemd.expand(tmp_path / "m.yaml.zst", "zst") == text
    monkeypatch.setattr(modulemd, "MAX_EXPANDED", 100)
    (tmp_path / "bomb.yaml.gz").write_bytes(gzip.compress(b"a" * 10_000))
    with pytest.raises(ValueError, match="bomb: more than 100 bytes"):
        modulemd.expand(tmp_path / "bomb.yaml.gz", "bomb")
    if shutil.which("zstd"):
        with pytest.raises(ValueError, match="zst: more than 100 bytes"):
            modulemd.expand(tmp_path / "m.yaml.zst", "zst")
    (tmp_path / "bad.yaml.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(ValueError, match="cannot be expanded"):
        modulemd.expand(tmp_path / "bad.yaml.gz", "bad")


def test_repomd_modules_entry_is_checked():
    ns = 'xmlns="http://linux.duke.edu/metadata/repo"'

    def repomd(href: str, kind: str = "sha256", value: str = "ab" * 32) -> bytes:
        return (f'<repomd {ns}><data type="primary"><location href="repodata/p.xml.gz"/></data>'
                f'<data type="modules"><checksum type="{kind}">{value}</checksum><location href="{href}"/></data>'
                "</repomd>").encode()

    assert modulemd.repomd_modules(repomd("repodata/m.yaml.gz"), "r") == ("repodata/m.yaml.gz", "sha256", "ab" * 32)
    assert modulemd.repomd_modules(f"<repomd {ns}/>".encode(), "r") is None
    for bad, what in ((repomd("../../etc/passwd"), "is not a file in repodata/"),
                      (repomd("repodata/m.yaml.gz", "md5", "ab" * 32), "checksum (md5)"),
                      (b"<repomd", "not XML")):
        with pytest.raises(ValueError, match=what.replace("(", r"\(").replace(")", r"\)")):
            modulemd.repomd_modules(bad, "r")


# ---------------------------------------------------------------- the module's pure parts


LIST = """\
gpu-install-lab STAND-IN nvidia
Name          Stream          Profiles           Summary
nvidia-driver 580-dkms [d]    default [d]        STAND-IN Nvidia driver for 580-dkms branch
nvidia-driver 580-open [e]    default [d], fm    STAND-IN Nvidia driver for 580-open branch that wraps
                                                 onto a second line
nvidia-driver latest-dkms [d][e] default         x
nvidia-driver-extra 1          default            another module

Hint: [d]efault, [e]nabled, [x]disabled, [i]nstalled
"""


def test_parse_module_list_rows_and_flags():
    assert dms.parse_module_list(LIST, "nvidia-driver") == [("580-dkms", ["d"]), ("580-open", ["e"]),
                                                           ("latest-dkms", ["d", "e"])]
    assert dms.parse_module_list("Error: No matching Modules to list\n", "nvidia-driver") == []


def test_parse_state_reads_dnfs_module_file():
    text = "[nvidia-driver]\nname=nvidia-driver\nstream=580-open\nprofiles=\nstate=enabled\n"
    assert dms.parse_state(text) == {"state": "enabled", "stream": "580-open"}
    assert dms.parse_state(text.replace("state=enabled", "state=disabled")) == {"state": "disabled", "stream": ""}
    assert dms.parse_state("[nvidia-driver]\nstream=\nstate=\n") == {"state": "", "stream": ""}


def test_decide_enables_exactly_and_switches_only_through_a_reset():
    off = {"state": "", "stream": ""}
    assert dms.decide("580-open", ["580-dkms", "580-open"], off) == ["enable"]
    assert dms.decide("580-open", ["580-open"], {"state": "enabled", "stream": "580-open"}) == []
    assert dms.decide("580-open", ["580-dkms", "580-open"], {"state": "enabled", "stream": "580-dkms"}) == [
        "reset", "enable"]
    assert dms.decide("580-open", ["580-open"], {"state": "disabled", "stream": ""}) == ["enable"]
    assert dms.decide("580-open", [], off) == []  # no modules metadata: nothing to enable
    with pytest.raises(ValueError, match=r"stream 580-open is not offered \(streams offered: 535-dkms, 580-dkms\)"):
        dms.decide("580-open", ["535-dkms", "580-dkms"], off)


def test_restore_puts_back_only_what_gpu_install_set():
    on = {"state": "enabled", "stream": "580-open"}
    assert dms.restore("580-open", [], on, "", "") == [("reset", "")]
    assert dms.restore("580-open", [], on, "enabled", "535-dkms") == [("reset", ""), ("enable", "535-dkms")]
    assert dms.restore("580-open", [], on, "disabled", "") == [("reset", ""), ("disable", "")]
    # gpu-install switched it to 580-dkms later (the site's settings name it now): that counts as ours
    assert dms.restore("580-open", ["580-dkms"], {"state": "enabled", "stream": "580-dkms"}, "", "") == [("reset", "")]
    # someone enabled another stream since, or reset it: left alone
    assert dms.restore("580-open", ["580-dkms"], {"state": "enabled", "stream": "590-open"}, "", "") == []
    assert dms.restore("580-open", [], {"state": "", "stream": ""}, "", "") == []
    # the stream before gpu-install is the one enabled now: nothing to do
    assert dms.restore("580-open", ["580-dkms"], {"state": "enabled", "stream": "580-dkms"}, "enabled",
                       "580-dkms") == []


# ---------------------------------------------------------------- the module with the real dnf


@pytest.fixture(scope="module")
def nvrepo(tmp_path_factory):
    for tool in ("dnf", "createrepo_c", "modifyrepo_c", "rpmbuild", "rpm"):
        need(shutil.which(tool) is not None, f"{tool} missing (scripts/apt-packages.txt)")
    from gpu_install_lab import standin_modules

    root = tmp_path_factory.mktemp("nvrepo")
    modular = standin_modules.module_repository(root / "modular")
    flat = root / "flat"  # the same packages without modules metadata
    flat.mkdir()
    for rpm in modular.glob("*.rpm"):
        shutil.copy(rpm, flat / rpm.name)
    subprocess.run(["createrepo_c", "--quiet", str(flat)], check=True)
    return {"modular": modular, "flat": flat}


class Node:
    """A private dnf installroot driven through the module (ansible_connection=local)."""

    def __init__(self, tmp: Path, repo: Path):
        self.tmp, self.root = tmp, tmp / "root"
        (tmp / "repos").mkdir(parents=True, exist_ok=True)
        (tmp / "repos" / "nv.repo").write_text(f"[nv]\nname=nv\nbaseurl=file://{repo}\ngpgcheck=0\nmetadata_expire=0\n")
        self.options = [f"--setopt=reposdir={tmp / 'repos'}", f"--setopt=cachedir={tmp / 'cache'}", "--releasever=9",
                        "--forcearch=x86_64", "--setopt=module_platform_id=platform:el9", "--disableplugin=*"]
        self.runs = 0

    def dnf(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["dnf", f"--installroot={self.root}", *self.options, *args], capture_output=True,
                              text=True, timeout=300, env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})

    def state(self) -> str:
        f = self.root / "etc" / "dnf" / "modules.d" / "nvidia-driver.module"
        return f.read_text() if f.exists() else ""

    def module(self, check: bool = False, **args):
        from installer import ansible as seam

        self.runs += 1
        out = self.tmp / f"result-{self.runs}.json"
        play = [{"name": "T", "hosts": "all", "gather_facts": False, "tasks": [
            {"name": "Stream", "gpu_install.node.dnf_module_stream": {
                "module": "nvidia-driver", "root": str(self.root), "dnf_options": self.options, **args},
             "register": "r", "ignore_errors": True},
            {"name": "Dump", "ansible.builtin.copy": {"content": "{{ r | to_json }}", "dest": str(out)},
             "check_mode": False}]}]
        pb, inv = self.tmp / "play.yml", self.tmp / "hosts.yml"
        pb.write_text(yaml.safe_dump(play))
        inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local",
                                                                    "ansible_python_interpreter": sys.executable}}}}))
        res = seam.run_playbook(pb, inv, {}, check=check)
        assert res.exit_code() in (EXIT_OK, EXIT_HOST_FAILURES)
        return json.loads(out.read_text())


def test_module_enables_the_exact_stream_once_then_resets_it(nvrepo, tmp_path):
    node = Node(tmp_path, nvrepo["modular"])
    # before: the module's default stream (580-dkms, as NVIDIA's repository has a default) is what dnf would use
    avail = node.dnf("-q", "list", "--available", "kmod-nvidia-*").stdout
    assert "kmod-nvidia-latest-dkms" in avail and "kmod-nvidia-open-dkms" not in avail, avail
    checked = node.module(check=True, stream="580-open")
    assert checked["changed"] is True and node.state() == ""  # check mode: nothing enabled
    r = node.module(stream="580-open")
    assert r["changed"] is True and r["msg"] == "nvidia-driver:580-open: enabled", r
    assert r["offered"] == ["580-dkms", "580-open"] and r["before"] == {"state": "", "stream": ""}
    assert "stream=580-open" in node.state() and "state=enabled" in node.state()
    avail = node.dnf("-q", "list", "--available", "--showduplicates", "kmod-nvidia-*").stdout
    assert "kmod-nvidia-open-dkms" in avail and "kmod-nvidia-latest-dkms" not in avail, avail
    assert avail.count("580.82.07") == 1 and avail.count("580.95.05") == 1  # every version of the stream
    again = node.module(stream="580-open")
    assert again["changed"] is False and again["msg"] == "nvidia-driver:580-open: enabled already"
    # reset: back to the state before (nothing enabled); a second reset finds nothing of gpu-install's
    back = node.module(state="reset", stream="580-open")
    assert back["changed"] is True and "put back (dnf module reset nvidia-driver)" in back["msg"], back
    assert "state=\n" in node.state() or "state=" == node.state().strip().splitlines()[-1]
    assert node.module(state="reset", stream="580-open")["changed"] is False


def test_module_switches_another_stream_through_a_reset_and_puts_it_back(nvrepo, tmp_path):
    node = Node(tmp_path, nvrepo["modular"])
    assert node.dnf("-y", "-q", "module", "enable", "nvidia-driver:580-dkms").returncode == 0  # the admin's
    r = node.module(stream="580-open")
    assert r["changed"] is True and r["switched_from"] == "580-dkms", r
    assert r["msg"] == "nvidia-driver:580-open: enabled, switched from stream 580-dkms (dnf module reset nvidia-driver first)"
    assert "stream=580-open" in node.state()
    # uninstall: the admin's stream back
    back = node.module(state="reset", stream="580-open", previous_state="enabled", previous_stream="580-dkms")
    assert back["changed"] is True and "dnf module enable nvidia-driver:580-dkms" in back["msg"], back
    assert "stream=580-dkms" in node.state() and "state=enabled" in node.state()
    # someone's stream now (not one gpu-install enabled): left alone
    alone = node.module(state="reset", stream="580-open")
    assert alone["changed"] is False and "stream 580-dkms enabled, not a stream gpu-install enabled" in alone["msg"]
    assert "stream=580-dkms" in node.state()


def test_module_refuses_a_stream_not_offered_and_passes_a_repository_without_modules(nvrepo, tmp_path):
    node = Node(tmp_path / "a", nvrepo["modular"])
    r = node.module(stream="590-open")
    assert r.get("failed") is True and r["changed"] is False, r
    assert r["msg"].startswith("nvidia-driver:590-open: stream 590-open is not offered (streams offered: 580-dkms, "
                               "580-open) in the node's enabled repositories; nothing was changed"), r["msg"]
    assert node.state() == ""
    odd = node.module(stream="580-open --setopt=x")
    assert odd.get("failed") is True and odd["msg"] == "stream '580-open --setopt=x' is not a dnf module or stream name"
    # an unreachable repository, with RHEL's default skip_if_unavailable=False (Debian's dnf defaults to True)
    broken = Node(tmp_path / "c", tmp_path / "no-such-repository")
    broken.options.append("--setopt=skip_if_unavailable=False")
    r = broken.module(stream="580-open")
    assert r.get("failed") is True and r["msg"].startswith("dnf module list nvidia-driver failed (exit 1): "), r
    assert "Failed to download metadata for repo 'nv'" in r["msg"]
    assert broken.state() == ""
    flat = Node(tmp_path / "b", nvrepo["flat"])
    r = flat.module(stream="580-open")
    assert r["changed"] is False and r["offered"] == [] and "offer no nvidia-driver module" in r["msg"], r
    assert flat.state() == ""
    # without modules metadata the packages are not modular: installable directly
    assert "kmod-nvidia-open-dkms" in flat.dnf("-q", "list", "--available", "kmod-nvidia-*").stdout


# ---------------------------------------------------------------- the role's install tasks with the real dnf


def test_role_install_tasks_enable_the_stream_and_install_only_the_flavour(nvrepo, tmp_path):
    """roles/nvidia_driver/tasks/install-dnf.yml with vars/RedHat.yml, through the real seam against a private
    installroot (module_defaults point the stream module and ansible.builtin.dnf there): check mode reports the stream
    and the install and changes nothing; the apply enables nvidia-driver:580-open, records the state before and
    installs the open packages at the pin (580.82.07, the stream also holds 580.95.05); a second apply changes
    nothing; the proprietary flavour switches the stream through a reset and says so, the record keeping the first."""
    from installer import ansible as seam
    from installer import content

    system_python = "/usr/bin/python3"
    need(subprocess.run([system_python, "-c", "import dnf"], capture_output=True).returncode == 0,
         "the system Python has no dnf bindings (python3-dnf), which ansible.builtin.dnf needs")
    node = Node(tmp_path, nvrepo["modular"])
    conf = tmp_path / "dnf.conf"
    conf.write_text(f"[main]\nreposdir={tmp_path / 'repos'}\ncachedir={tmp_path / 'cache'}\n"
                    "module_platform_id=platform:el9\n")
    role = content.role_dir("nvidia_driver")
    record = tmp_path / "record.json"

    def play(kmt: str, check: bool = False):
        pb = tmp_path / "role.yml"
        pb.write_text(yaml.safe_dump([{
            "name": "T", "hosts": "all", "gather_facts": False,
            "module_defaults": {
                "gpu_install.node.dnf_module_stream": {"root": str(node.root), "dnf_options": node.options},
                "ansible.builtin.dnf": {"installroot": str(node.root), "conf_file": str(conf), "releasever": "9",
                                        "disable_plugin": ["*"], "disable_gpg_check": True, "use_backend": "dnf4"}},
            "vars": {"nvidia_driver_mode": "host", "nvidia_driver_record": str(record),
                     "nvidia_driver_package_version": "580.82.07", "nvidia_driver_kernel_module_type": kmt,
                     "ansible_facts": {"distribution_major_version": "9"}},
            "tasks": [
                {"ansible.builtin.include_vars": str(role / "vars" / "RedHat.yml")},
                {"ansible.builtin.include_tasks": str(role / "tasks" / "install-dnf.yml"),
                 "vars": {"nvidia_driver_install_list": "{{ nvidia_driver_os['packages'] | map('regex_replace', '$', "
                                                        "'-580.82.07*') | list + ['nvidia-persistenced'] }}"}},
                {"ansible.builtin.copy": {"content": "{{ {'install': nvidia_driver_install, 'stream': "
                                                     "nvidia_driver_stream} | to_json }}",
                                          "dest": str(tmp_path / "out.json")}, "check_mode": False,
                 "changed_when": False}]}]))
        inv = tmp_path / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local",
                                                                    "ansible_python_interpreter": system_python}}}}))
        res = seam.run_playbook(pb, inv, {}, check=check)
        assert res.exit_code() == EXIT_OK, res.recap()
        return res, json.loads((tmp_path / "out.json").read_text())

    def installed() -> list[str]:
        out = subprocess.run(["rpm", "--root", str(node.root), "-qa", "--qf", "%{NAME}-%{VERSION}\n"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        return sorted(n for n in out if not n.startswith("gpg-pubkey"))

    res, out = play("open", check=True)
    assert out["install"]["changed"] is True and "check mode: nvidia-driver:580-open: enabled, then dnf installs " \
        "nvidia-driver-580.82.07* nvidia-driver-cuda-580.82.07* kmod-nvidia-open-dkms-580.82.07*" in out["install"]["msg"]
    assert node.state() == "" and installed() == [] and not record.exists()
    res, out = play("open")
    assert res.changed == 3 and "stream=580-open" in node.state()  # enabled, recorded, installed
    assert installed() == ["kmod-nvidia-open-dkms-580.82.07", "nvidia-driver-580.82.07",
                           "nvidia-driver-cuda-580.82.07", "nvidia-persistenced-580.95.05"]
    assert json.loads(record.read_text())["entries"] == {"module_stream": {
        "module": "nvidia-driver", "stream": "580-open", "previous_state": "", "previous_stream": ""}}
    res, _ = play("open")
    assert res.changed == 0
    res, out = play("proprietary")
    assert out["stream"]["switched_from"] == "580-open" and "stream=580-dkms" in node.state()
    assert "kmod-nvidia-latest-dkms-580.82.07" in installed()
    assert json.loads(record.read_text())["entries"]["module_stream"]["stream"] == "580-open"  # the first change


def test_role_remove_tasks_put_the_stream_back(nvrepo, tmp_path):
    """roles/nvidia_driver (action remove) on a RedHat-family node's facts, the stream module pointed at a private
    installroot: the record's stream (580-open) was switched by gpu-install to the one the settings name now
    (580-dkms): the module is reset and the report says so; with keep_packages the stream stays, said too."""
    from installer import ansible as seam
    from installer import content

    need(shutil.which("rpm") is not None, "rpm missing")
    node = Node(tmp_path, nvrepo["modular"])
    record = tmp_path / "record.json"
    entry = {"module": "nvidia-driver", "stream": "580-open", "previous_state": "", "previous_stream": ""}

    def remove(keep: bool) -> dict:
        record.write_text(json.dumps({"format": 1, "packages": [], "preexisting": [],
                                      "entries": {"module_stream": entry}}))
        record.chmod(0o600)
        assert node.dnf("-y", "-q", "module", "enable", "nvidia-driver:580-dkms").returncode == 0
        pb = tmp_path / "remove.yml"
        pb.write_text(yaml.safe_dump([{
            "name": "T", "hosts": "all", "gather_facts": False,
            "module_defaults": {"gpu_install.node.dnf_module_stream": {"root": str(node.root),
                                                                       "dnf_options": node.options}},
            "vars": {"nvidia_driver_record": str(record), "nvidia_driver_keep_packages": keep,
                     "nvidia_driver_package_version": "580", "nvidia_driver_kernel_module_type": "proprietary",
                     "nvidia_driver_blacklist_file": str(tmp_path / "blacklist.conf"),
                     "ansible_facts": {"os_family": "RedHat", "distribution": "Rocky",
                                       "distribution_major_version": "9", "kernel": "5.14.0-503.el9.x86_64"}},
            "roles": [{"role": str(content.role_dir("nvidia_driver")), "vars": {"nvidia_driver_action": "remove"}}],
            "post_tasks": [{"ansible.builtin.copy": {"content": "{{ nvidia_driver_stream_reset | to_json }}",
                                                     "dest": str(tmp_path / "out.json")}, "changed_when": False}]}]))
        inv = tmp_path / "hosts.yml"
        inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local",
                                                                    "ansible_python_interpreter": sys.executable}}}}))
        res = seam.run_playbook(pb, inv, {})
        assert res.exit_code() == EXIT_OK, res.recap()
        return json.loads((tmp_path / "out.json").read_text())

    kept = remove(keep=True)
    assert kept.get("skipped") is True and "stream=580-dkms" in node.state()
    out = remove(keep=False)
    assert out["changed"] is True and out["msg"] == "nvidia-driver: stream 580-dkms put back (dnf module reset " \
        "nvidia-driver)", out
    assert "state=enabled" not in node.state()


# ---------------------------------------------------------------- pull's cache reading, the lock entry, push's merge


def test_cached_streams_checks_the_file_against_repomd(tmp_path):
    base = tmp_path / "cache" / "upstream0-0123456789abcdef" / "repodata"
    base.mkdir(parents=True)
    data = gzip.compress(f"---\n{_doc()}---\n{_doc('580-dkms')}".encode())
    (base / "m-modules.yaml.gz").write_bytes(data)
    import hashlib

    def repomd(digest: str) -> None:
        (base / "repomd.xml").write_text(
            '<repomd xmlns="http://linux.duke.edu/metadata/repo"><data type="modules">'
            f'<checksum type="sha256">{digest}</checksum><location href="repodata/m-modules.yaml.gz"/></data></repomd>')

    repomd(hashlib.sha256(data).hexdigest())
    (_, got), (_, none) = modulemd.cached_streams(tmp_path / "cache", ["upstream0", "upstream1"], "nvidia-driver")
    assert [s.spec for s in got] == ["nvidia-driver:580-open", "nvidia-driver:580-dkms"] and none == []
    repomd(hashlib.sha256(b"other").hexdigest())
    with pytest.raises(ValueError, match="m-modules.yaml.gz: does not match the sha256 its repomd.xml names"):
        modulemd.cached_streams(tmp_path / "cache", ["upstream0"], "nvidia-driver")


def test_carry_modules_refuses_an_enabled_stream_without_metadata(tmp_path):
    from installer.mirror.packages import resolve
    from installer.mirror.plan import OsPackages

    state = tmp_path / "work" / "root" / "etc" / "dnf" / "modules.d"
    state.mkdir(parents=True)
    (state / "nvidia-driver.module").write_text("[nvidia-driver]\nname=nvidia-driver\nstream=580-open\nstate=enabled\n")
    s = OsPackages("rocky9.4", "dnf", (), modules=("nvidia-driver:580-open",))
    with pytest.raises(ValueError, match="dnf enabled nvidia-driver:580-open, and no modules metadata of the upstream"):
        resolve._carry_modules(s, [], tmp_path / "work", tmp_path / "out", lambda m: None)
    said: list[str] = []
    (state / "nvidia-driver.module").write_text("[nvidia-driver]\nstream=\nstate=\n")  # the upstream had no module
    assert resolve._carry_modules(s, [], tmp_path / "work", tmp_path / "out", said.append) == ([], [])
    assert said == ["packages rocky9.4: mirror.packageRepositories.rocky9.4 offer no nvidia-driver module (no modules "
                    "metadata): resolved without the stream nvidia-driver:580-open; the nodes install the packages "
                    "without it"]


def test_lock_entry_of_the_modules_metadata_has_one_place():
    from installer.mirror.lock import check_entry

    good = {"os": "rocky9.4", "manager": "dnf", "modules": True, "file": "packages/rocky9.4/modules/modules.yaml",
            "source": "https://up", "sha256": "ab" * 32, "size": 10}
    assert check_entry(Path("L"), "packages", 0, good)["modules"] is True
    for bad in ({**good, "file": "packages/rocky9.4/modules/../../x.yaml"}, {**good, "file": "packages/rocky9.4/x.rpm"},
                {**good, "file": "packages/rhel9/modules/modules.yaml"}):
        with pytest.raises(ConfigError) as err:
            check_entry(Path("L"), "packages", 0, bad)
        assert "packages[0] (rocky9.4): modules file" in err.value.message, err.value.message
    # apt carries no modules metadata: the entry is a package file there, and this is not one
    with pytest.raises(ConfigError, match="is not packages/rocky9.4/<a plain .deb file name>"):
        check_entry(Path("L"), "packages", 0, {**good, "manager": "apt"})


def test_push_merges_checked_documents_and_refuses_others(tmp_path):
    import importlib

    publish = importlib.import_module("installer.mirror.packages.publish")  # the package names its function so

    root = tmp_path / "repo" / "packages" / "rocky9.4"
    root.mkdir(parents=True)
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(f"---\n{_doc()}")
    second.write_text(f"---\n{_doc('580-dkms')}")
    state = publish._modules(root, [first], tmp_path / "B")
    assert state == root / publish.MODULES_STATE
    assert publish._modules(root, [second], tmp_path / "B") == state
    assert publish._specs(state) == ["nvidia-driver:580-dkms", "nvidia-driver:580-open"]  # the earlier push's stays
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"---\n{_doc(rpms=['not a nevra'])}")
    with pytest.raises(ConfigError) as err:
        publish._modules(root, [bad], tmp_path / "B")
    assert err.value.message.startswith(f"{tmp_path / 'B' / 'bundle.lock.json'}: the modules metadata it lists: ")
    assert "data.artifacts.rpms is not a list of package NEVRAs" in err.value.message
    state.write_text(f"---\n{_doc()}  name: twice\n")
    with pytest.raises(ConfigError, match="streams.yaml: .*given twice"):
        publish._modules(root, [first], tmp_path / "B")
    assert publish._modules(tmp_path / "empty", [], tmp_path / "B") is None
