"""Exit codes mean what the README's table says: every code the tool can return is in the table, and each class of
error ends with its code (walked here through the real CLI where it needs no lab; hosts failing (4), unreachable (5)
and preflight (3) are walked on real runs in test_ansible_apply.py)."""

from __future__ import annotations

import inspect
import re
import sys

import pytest

from installer import errors
from tests.conftest import ROOT


def readme_codes() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    table = re.split(r"^#+ Exit codes$", text, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+) \|$", table, re.M)}


def test_every_exit_code_and_error_class_is_in_the_readme():
    codes = readme_codes()
    constants = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    assert constants == set(codes), f"README table {sorted(codes)} vs installer/errors.py {sorted(constants)}"
    for _, cls in inspect.getmembers(errors, inspect.isclass):
        if issubclass(cls, errors.GpuInstallError):
            assert cls.exit_code in codes, cls


@pytest.fixture
def site(write_site, site_data):
    return write_site(site_data)


def test_output_path_problems_are_exit_2(cli, site, tmp_path):
    rc, _, err = cli("render", "-s", site, "-o", tmp_path)
    assert rc == 2 and f"-o {tmp_path}: is a directory" in err
    rc, _, err = cli("render", "-s", site, "-o", tmp_path / "no" / "such" / "dir" / "v.yaml")
    assert rc == 2 and "does not exist" in err and not (tmp_path / "no").exists()  # no parents made
    rc, _, err = cli("render", "-s", site, "-o", "/dev/full")
    assert rc == 2 and "-o /dev/full: cannot write it (No space left on device)" in err


def test_unreachable_api_server_is_exit_5(cli, site, tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    rc, _, err = cli("operator", "status", "-s", site, "--kubeconfig", kubeconfig)
    assert rc == errors.EXIT_UNREACHABLE == 5, err
    assert "cannot reach the Kubernetes API server" in err


def test_bad_kubeconfig_is_exit_2(cli, site, tmp_path):
    rc, _, err = cli("operator", "status", "-s", site, "--kubeconfig", tmp_path / "missing")
    assert rc == 2 and "kubeconfig not found" in err


@pytest.mark.helm
def test_helm_failure_is_exit_7_with_helms_message(tmp_path):
    from installer.helm import template
    from installer.tools import find_helm
    from tests.conftest import need

    need(find_helm(), "helm not installed (scripts/bootstrap installs it)")

    chart = tmp_path / "broken"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: broken\nversion: 0.1.0\n")
    (chart / "templates" / "x.yaml").write_text("{{ .Values.nope.deeper }}\n")
    with pytest.raises(errors.ClusterError) as exc:
        template(chart, {})
    assert exc.value.exit_code == 7 and "nil pointer" in exc.value.message  # helm's own words


def test_missing_ansible_playbook_is_the_environment_error(cli, site, tmp_path, monkeypatch):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1: {ansible_connection: local}\n"
                   "    kube_control_plane:\n      hosts:\n        g1: {}\n")
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no ansible-playbook beside it
    rc, _, err = cli("preflight", "-s", site, "-i", inv, "-q")
    assert rc == errors.EXIT_ENVIRONMENT == 8, err
    assert "ansible-playbook not found" in err and "hint:" in err


def test_cancel_is_130_and_internal_is_1(cli, site, monkeypatch):
    import installer.cli.render as render

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(render, "cmd_config_check", interrupted)
    # the parser is built anew per call, so set_defaults picks up the patched handler
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 130 and "cancelled" in err


def test_debug_after_the_command_shows_the_traceback(cli, site, monkeypatch):
    import installer.render.values as rv

    monkeypatch.setattr(rv, "check_keys", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    rc, _, err = cli("render", "-s", site)
    assert rc == 1 and "internal error: RuntimeError: boom" in err
    with pytest.raises(RuntimeError):
        cli("render", "-s", site, "--debug")
    with pytest.raises(RuntimeError):
        cli("--debug", "render", "-s", site)
