"""installer.ansible: exit codes from per-host stats of a real ansible-runner run, secrets kept out."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from installer import ansible as seam
from installer.errors import EXIT_HOST_FAILURES, EXIT_OK, EXIT_PREFLIGHT, EXIT_UNREACHABLE, GpuInstallError

PY = sys.executable
PLAYBOOK = """\
---
# Test fixture for installer.ansible: one host ok, one failing (when told), one unreachable.
- name: Exit code fixture
  hosts: all
  gather_facts: false
  tasks:
    - name: Fixture | Fail where asked
      ansible.builtin.fail:
        msg: "asked to fail on {{ inventory_hostname }}"
      when: inventory_hostname in (fixture_fail | default([]))

    - name: Fixture | Touch a file
      ansible.builtin.command: "true"
      changed_when: fixture_changed | default(false)
"""


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.fixture
def FIXTURE(tmp_path):
    path = tmp_path / "exitcodes.yml"
    path.write_text(PLAYBOOK)
    return path


def inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    lines = ["[gpu_nodes]"]
    for name, hv in hosts.items():
        lines.append(name + " " + " ".join(f"{k}={v}" for k, v in hv.items()))
    path = tmp_path / "hosts.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": PY}
DEAD = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": "1", "ansible_user": "nobody",
        "ansible_ssh_common_args": "'-o ConnectTimeout=3 -o BatchMode=yes -o StrictHostKeyChecking=no'"}


def test_all_ok_exit_0_and_progress_lines(tmp_path, FIXTURE):
    lines: list[str] = []
    from installer.plan import load_inventory

    inv = inventory(tmp_path, {"a": LOCAL, "b": LOCAL})
    res = seam.run_playbook(FIXTURE, inv, {"fixture_changed": True}, progress=lines.append,
                            inventory_info=load_inventory(str(inv)))
    assert res.exit_code() == EXIT_OK
    assert set(res.hosts) == {"a", "b"}
    assert res.hosts["a"].changed == 1 and res.hosts["a"].failed == 0
    assert "[a] changed      Fixture | Touch a file  (" in "\n".join(lines)
    assert lines[0] == "== Exit code fixture (2 hosts)"  # host count from the inventory the plan read


def test_failed_host_exit_4_others_finish(tmp_path, FIXTURE):
    res = seam.run_playbook(FIXTURE, inventory(tmp_path, {"a": LOCAL, "b": LOCAL}), {"fixture_fail": ["b"]})
    assert res.failed == ["b"] and res.unreachable == []
    assert res.hosts["a"].ok == 1  # a carried on: ran the second task
    assert res.exit_code() == EXIT_HOST_FAILURES
    assert res.exit_code(preflight=True) == EXIT_PREFLIGHT
    assert res.failures[0].host == "b" and "asked to fail on b" in res.failures[0].message
    assert "FAILED [b]" in res.recap()


def test_unreachable_host_exit_5_others_finish(tmp_path, FIXTURE):
    res = seam.run_playbook(FIXTURE, inventory(tmp_path, {"a": LOCAL, "dead": DEAD, "b": LOCAL}),
                            {"fixture_fail": ["b"]})
    assert res.unreachable == ["dead"]
    assert res.failed == ["b"]
    assert res.hosts["a"].ok == 1
    assert res.exit_code() == EXIT_UNREACHABLE  # unreachable wins over failures
    assert any(f.unreachable and f.host == "dead" for f in res.failures)


def test_limit_check_and_tags_pass_through(tmp_path):
    """--limit, --check, --diff, --tags and --skip-tags reach ansible-playbook: a file task in check mode changes
    nothing on disk but reports the change with its diff; tasks outside --tags or inside --skip-tags do not run."""
    pb = tmp_path / "tags.yml"
    out = tmp_path / "out"
    pb.write_text(f"""\
- name: Tags fixture
  hosts: all
  gather_facts: false
  tasks:
    - name: Fixture | Tagged write
      ansible.builtin.copy: {{dest: "{out}/{{{{ inventory_hostname }}}}.tagged", content: "x\\n", mode: "0644"}}
      tags: [wanted]
    - name: Fixture | Untagged write
      ansible.builtin.copy: {{dest: "{out}/{{{{ inventory_hostname }}}}.untagged", content: "x\\n", mode: "0644"}}
    - name: Fixture | Skipped write
      ansible.builtin.copy: {{dest: "{out}/{{{{ inventory_hostname }}}}.skipped", content: "x\\n", mode: "0644"}}
      tags: [wanted, unwanted]
""")
    out.mkdir()
    inv = inventory(tmp_path, {"a": LOCAL, "b": LOCAL})
    events: list[dict] = []

    class Collect:
        def start_run(self, *a):
            pass

        def finish_run(self):
            pass

        def event(self, e):
            events.append(e)

    res = seam.run_playbook(pb, inv, {}, limit="a", check=True, diff=True, tags="wanted", skip_tags="unwanted",
                            display=Collect())
    assert set(res.hosts) == {"a"}  # --limit
    assert res.hosts["a"].changed == 1 and list(out.iterdir()) == []  # --check: reported, not written
    tasks = {e["event_data"]["task"] for e in events if e.get("event") == "runner_on_ok"}
    assert tasks == {"Fixture | Tagged write"}  # --tags wanted, --skip-tags unwanted
    diffs = [e["event_data"]["res"].get("diff") for e in events if e.get("event") == "runner_on_ok"]
    assert diffs and diffs[0], "--diff: the result carries the file's diff"
    res = seam.run_playbook(pb, inv, {}, limit="b", tags="wanted", skip_tags="unwanted")
    assert sorted(p.name for p in out.iterdir()) == ["b.tagged"]


def test_artifacts_private_extravars_typed_no_secret_env(tmp_path, FIXTURE, monkeypatch):
    monkeypatch.setenv("GPU_REGISTRY_PASSWORD", "hunter2-do-not-leak")
    monkeypatch.setenv("SITE_REG_CRED", "second-secret-value")
    ev = {"fixture_changed": False, "n": 3, "nested": {"list": [1, "x"], "flag": True}}
    res = seam.run_playbook(FIXTURE, inventory(tmp_path, {"a": LOCAL}), ev, scrub_env=["SITE_REG_CRED"])
    run = res.artifacts
    assert run is not None and run.parent == Path(os.environ["GPU_INSTALL_STATE"]) / "runs"
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    assert json.loads((run / "env" / "extravars").read_text()) == ev  # typed JSON, not strings
    blob = b"".join(p.read_bytes() for p in run.rglob("*") if p.is_file())
    assert b"hunter2-do-not-leak" not in blob and b"second-secret-value" not in blob
    assert os.environ["GPU_REGISTRY_PASSWORD"] == "hunter2-do-not-leak"  # restored afterwards


@pytest.mark.parametrize("key", ["registry_password", "pull_token", "gpu_install_secret", "apiKey"])
def test_secret_looking_extravars_refused(tmp_path, FIXTURE, key):
    with pytest.raises(GpuInstallError, match="credential"):
        seam.run_playbook(FIXTURE, inventory(tmp_path, {"a": LOCAL}), {"nested": {key: "x"}})


def test_missing_inventory_is_config_error(tmp_path, FIXTURE):
    from installer.errors import ConfigError

    with pytest.raises(ConfigError):
        seam.run_playbook(FIXTURE, tmp_path / "nope.yml", {})


def test_failure_message_and_recap_with_time(tmp_path, FIXTURE):
    res = seam.run_playbook(FIXTURE, inventory(tmp_path, {"a": LOCAL, "b": LOCAL}), {"fixture_fail": ["b"]}, limit="b")
    assert res.failures[0].message == "asked to fail on b"
    recap = res.recap().splitlines()
    assert recap[0].split() == ["host", "ok", "changed", "failed", "unreachable", "skipped", "time"]
    assert recap[1].split()[:4] == ["b", "0", "0", "1"] and recap[1].endswith("s")
    assert res.seconds["b"] > 0
