"""Runtime roles driven through the real seam (ansible-runner) with ansible_connection=local against files
in a temp directory (the roles take their config paths as variables; restarts are off: no daemons here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from installer import ansible as seam
from installer import content
from installer.errors import EXIT_HOST_FAILURES, EXIT_OK
from tests.conftest import requires


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


def apply_role(tmp_path: Path, role: str, variables: dict, check: bool = False, diff: bool = False):
    pb = tmp_path / "play.yml"
    pb.write_text(yaml.safe_dump([{"name": "Test", "hosts": "all", "gather_facts": False, "roles": [content.fqcn(role)]}]))
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local",
                                                                "ansible_python_interpreter": sys.executable}}}}))
    lines: list[str] = []
    res = seam.run_playbook(pb, inv, variables, check=check, diff=diff, progress=lines.append)
    res.lines = lines  # type: ignore[attr-defined]
    return res


# ---------------------------------------------------------------- docker_runtime

USER_DAEMON = {"log-driver": "journald", "data-root": "/srv/docker", "runtimes": {"crun": {"path": "/usr/bin/crun"}},
               "insecure-registries": ["old.lab:5000"], "features": {"buildkit": True}}


def docker_vars(path: Path, **extra) -> dict:
    return {"docker_runtime_daemon_json": str(path), "docker_runtime_restart": False,
            "docker_runtime_insecure_registries": ["reg.lab:5000"], **extra}


def backups(path: Path) -> list[Path]:
    return [p for p in path.parent.iterdir() if p.name.startswith(path.name) and p != path]


def test_docker_merge_keeps_user_keys_backup_then_changed_0(tmp_path):
    path = tmp_path / "etc" / "docker" / "daemon.json"
    path.parent.mkdir(parents=True)
    original = json.dumps(USER_DAEMON)
    path.write_text(original)
    res = apply_role(tmp_path, "docker_runtime", docker_vars(path))
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1
    doc = json.loads(path.read_text())
    for key in ("log-driver", "data-root", "features"):
        assert doc[key] == USER_DAEMON[key]
    assert doc["runtimes"]["crun"] == {"path": "/usr/bin/crun"}
    assert doc["runtimes"]["nvidia"] == {"path": "/usr/bin/nvidia-container-runtime"}
    assert doc["default-runtime"] == "nvidia"
    assert doc["insecure-registries"] == ["old.lab:5000", "reg.lab:5000"]
    [backup] = backups(path)
    assert backup.read_text() == original
    again = apply_role(tmp_path, "docker_runtime", docker_vars(path))
    assert again.exit_code() == EXIT_OK and again.hosts["node"].changed == 0
    assert len(backups(path)) == 1


def test_docker_invalid_json_fails_file_untouched(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-driver": "journald",}\n')
    res = apply_role(tmp_path, "docker_runtime", docker_vars(path))
    assert res.exit_code() == EXIT_HOST_FAILURES and res.failed == ["node"]
    assert "not valid JSON" in res.failures[0].message and str(path) in res.failures[0].message
    assert path.read_text() == '{"log-driver": "journald",}\n' and backups(path) == []


def test_docker_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("{}")
    res = apply_role(tmp_path, "docker_runtime", docker_vars(path), check=True, diff=True)
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1
    assert path.read_text() == "{}" and backups(path) == []


def test_docker_missing_file_created(tmp_path):
    path = tmp_path / "new" / "daemon.json"
    res = apply_role(tmp_path, "docker_runtime", docker_vars(path, docker_runtime_default_runtime=""))
    assert res.exit_code() == EXIT_OK
    assert json.loads(path.read_text()) == {"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}},
                                            "insecure-registries": ["reg.lab:5000"]}
    assert oct(path.stat().st_mode & 0o777) == "0o644"


def test_docker_argument_specs_reject_wrong_type(tmp_path):
    res = apply_role(tmp_path, "docker_runtime", docker_vars(tmp_path / "d.json", docker_runtime_ready_retries="many"))
    assert res.exit_code() == EXIT_HOST_FAILURES
    assert "docker_runtime_ready_retries" in res.failures[0].message


# ---------------------------------------------------------------- containerd_runtime

def containerd_bin() -> str | None:
    import os
    import shutil

    cached = Path(os.path.expanduser("~/.cache/gpu-install/pkgroot/usr/bin/containerd"))
    return shutil.which("containerd") or (str(cached) if cached.exists() else None)


def containerd_vars(tmp_path: Path, **extra) -> dict:
    return {"containerd_runtime_config": str(tmp_path / "config.toml"),
            "containerd_runtime_dropin": str(tmp_path / "conf.d" / "99-nvidia.toml"),
            "containerd_runtime_restart": False, "containerd_runtime_containerd_bin": containerd_bin() or "containerd",
            "containerd_runtime_config_version": 2, **extra}


USER_TOML = 'version = 2\n# mine\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "reg.lab/pause:3.9"\n'


@requires(containerd_bin(), "no containerd binary to validate with (Debian package containerd; scripts/bootstrap)")
def test_containerd_role_validates_with_real_containerd_and_second_run_changed_0(tmp_path):
    import subprocess
    import tomllib

    config = tmp_path / "config.toml"
    config.write_text(USER_TOML)
    res = apply_role(tmp_path, "containerd_runtime", containerd_vars(tmp_path))
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1, res.recap()
    assert config.read_text().startswith(f'version = 2\nimports = ["{tmp_path}/conf.d/99-nvidia.toml"]\n# mine\n')
    dump = subprocess.run([containerd_bin(), "--config", str(config), "config", "dump"], capture_output=True,
                          text=True, check=True).stdout
    cri = tomllib.loads(dump)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "reg.lab/pause:3.9" and cri["containerd"]["default_runtime_name"] == "nvidia"
    assert len(backups(config)) == 1
    again = apply_role(tmp_path, "containerd_runtime", containerd_vars(tmp_path))
    assert again.exit_code() == EXIT_OK and again.hosts["node"].changed == 0


def test_containerd_role_rejected_config_restored(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(USER_TOML)
    fake = tmp_path / "fake-containerd"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'containerd x v1.7.1 y'; exit 0; }\necho 'invalid' >&2; exit 1\n")
    fake.chmod(0o755)
    res = apply_role(tmp_path, "containerd_runtime", containerd_vars(tmp_path, containerd_runtime_containerd_bin=str(fake)))
    assert res.exit_code() == EXIT_HOST_FAILURES and "restored" in res.failures[0].message
    assert config.read_text() == USER_TOML
    assert not (tmp_path / "conf.d" / "99-nvidia.toml").exists()


def test_containerd_role_invalid_toml_untouched(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n[plugins\n")
    res = apply_role(tmp_path, "containerd_runtime", containerd_vars(tmp_path, containerd_runtime_validate=False))
    assert res.exit_code() == EXIT_HOST_FAILURES and "not valid TOML" in res.failures[0].message
    assert config.read_text() == "version = 2\n[plugins\n" and not (tmp_path / "conf.d").exists()


def test_containerd_role_check_mode_writes_nothing(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(USER_TOML)
    res = apply_role(tmp_path, "containerd_runtime", containerd_vars(tmp_path), check=True, diff=True)
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1
    assert config.read_text() == USER_TOML and not (tmp_path / "conf.d").exists()


# ---------------------------------------------------------------- package_repo: the keys a node trusts


def _package_repo_render(os_family: str) -> tuple[dict, dict, str]:
    """The role's own task files rendered by Ansible's templar for a node of os_family: (variables, the
    package_repo_files paths.yml decides, the repository definition deploy.yml writes)."""
    import ansible.template
    from ansible.parsing.dataloader import DataLoader

    trust = getattr(ansible.template, "trust_as_template", lambda s: s)  # ansible-core 2.19 templates only trusted text
    role = content.role_dir("package_repo")
    tasks = yaml.safe_load((role / "tasks" / "deploy.yml").read_text())
    paths = yaml.safe_load((role / "tasks" / "paths.yml").read_text())
    variables = {**yaml.safe_load((role / "defaults" / "main.yml").read_text()),
                 "package_repo_url": "http://repo.lab/site", "package_repo_os": "rocky9.5",
                 "package_repo_key_src": "/srv/site/gpu-install-site.asc", "ansible_facts": {"os_family": os_family}}

    def render(text: str, extra: dict | None = None):
        return ansible.template.Templar(loader=DataLoader(), variables={**variables, **(extra or {})}).template(
            trust(text))

    (decide,) = [t["ansible.builtin.set_fact"] for t in paths if "ansible.builtin.set_fact" in t]
    files = render(decide["package_repo_files"])
    variables["package_repo_upstream_keys_src"] = render(variables["package_repo_upstream_keys_src"])
    (definition,) = [t["ansible.builtin.copy"] for t in tasks if t["name"] == "Package repo | Repository definition"]
    copies = {render(t["ansible.builtin.copy"]["dest"], {"package_repo_files": files}):
              render(t["ansible.builtin.copy"]["src"], {"package_repo_files": files})
              for t in tasks if "src" in t.get("ansible.builtin.copy", {})
              and render("{{ " + str(t.get("when", "true")) + " }}") in (True, "True")}
    variables["copies"] = copies  # node path -> controller path, for every key the role copies
    return variables, files, render(definition["content"], {"package_repo_files": files})


def test_rhel_repository_names_only_keys_copied_from_the_controller():
    """Every gpgkey of the .repo file is file:// of a file a copy task of the role puts there from the controller
    (the site key and the upstream keys `mirror push` published beside it); none is fetched over the network."""
    variables, files, repo = _package_repo_render("RedHat")
    gpgkeys = [line.split("=", 1)[1].split() for line in repo.splitlines() if line.replace(" ", "").startswith("gpgkey=")]
    assert len(gpgkeys) == 1, repo
    assert gpgkeys[0] == ["file:///etc/pki/rpm-gpg/RPM-GPG-KEY-gpu-install",
                          "file:///etc/pki/rpm-gpg/RPM-GPG-KEYS-gpu-install-upstream"], repo
    for ref in gpgkeys[0]:
        assert ref.startswith("file:///") and "://" not in ref[len("file://"):], ref
        assert variables["copies"][ref[len("file://"):]].startswith("/srv/site/"), variables["copies"]
    assert variables["copies"][files["upstream_keys"]] == "/srv/site/packages/rocky9.5/RPM-GPG-KEYS-upstream.asc"
    assert "\ngpgcheck=1\n" in repo and "\nrepo_gpgcheck=1\n" in repo


def test_apt_source_is_signed_by_the_copied_site_key():
    variables, files, listed = _package_repo_render("Debian")
    (line,) = [x for x in listed.splitlines() if x.startswith("deb ")]
    assert line == "deb [signed-by=/etc/apt/keyrings/gpu-install.asc] http://repo.lab/site/packages/rocky9.5 gpu-install main"
    assert variables["copies"][files["key"]] == "/srv/site/gpu-install-site.asc"
    assert "trusted=yes" not in listed
