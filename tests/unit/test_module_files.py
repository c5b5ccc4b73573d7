"""plugins/module_utils/files.py: a config file is written with its final mode from the moment it exists (never
readable by others in between, whatever the umask), and what `--diff` shows of a config never carries a secret --
checked on the helpers and on the real modules run as Ansible runs them (JSON arguments on stdin, a subprocess)."""

from __future__ import annotations

import importlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from installer import content
from tests.unit.library_modules import load_module

load_module("containerd_runtime")  # puts the collection on sys.path, as on a node
files = importlib.import_module("ansible_collections.gpu_install.node.plugins.module_utils.files")

PASSWORD, TOKEN, AUTH = "hunter2-pw", "id-token-XYZ", "YWRtaW46aHVudGVyMg=="  # noqa: S105 - test data, no real secret
CONFIG_WITH_AUTH = f"""version = 2

[plugins."io.containerd.grpc.v1.cri".registry.configs."r.lab:5000".auth]
  username = "admin"
  password = "{PASSWORD}"
  identitytoken = "{TOKEN}"
  auth = '{AUTH}'

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"""


# ---------------------------------------------------------------- redaction


@pytest.mark.parametrize("text,expect", [
    ('password = "p"', 'password = "<redacted>"'),
    ("  auth = 'YWJj'", '  auth = "<redacted>"'),
    ('identitytoken = """a\nb"""\nx = 1', 'identitytoken = "<redacted>"\nx = 1'),
    ('a = { username = "u", password = "p" }', 'a = { username = "u", password = "<redacted>" }'),
    ('{"auths": {"r": {"auth": "abc", "username": "u"}}, "Password": "zz"}',
     '{"auths": {"r": {"auth": "<redacted>", "username": "u"}}, "Password": "<redacted>"}'),
    ('token: bare value', 'token: "<redacted>"'),
    ("command: [--token=abc, --kubeconfig=/etc/k]", 'command: [--token="<redacted>", --kubeconfig=/etc/k]'),
    ('[x.authorization]\n  "Authorization" = "Basic YQ=="', '[x.authorization]\n  "Authorization" = "<redacted>"'),
])
def test_secret_values_are_redacted(text, expect):
    assert files.redact(text) == expect


@pytest.mark.parametrize("text", [
    '[plugins."io.containerd.grpc.v1.cri".registry.configs."r.lab:5000".auth]',  # a table header: no value
    'username = "admin"',  # whose login, not how to log in
    'auth_type = "basic"\nmy-token = "x"\ntokens = 3',  # other keys that merely contain a secret's name
    "auth:\n  username: keep",  # a mapping's key: its value is on the next lines
    'config_path = "/etc/containerd/certs.d"',
])
def test_everything_else_is_left_alone(text):
    assert files.redact(text) == text


# ---------------------------------------------------------------- the modules' --diff


def run_module(name: str, args: dict, *, diff: bool = False, umask: int | None = None) -> dict:
    params = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_diff": diff}}
    proc = subprocess.run(
        [sys.executable, "-c", f"from ansible_collections.gpu_install.node.plugins.modules.{name} import main; main()"],
        input=json.dumps(params), capture_output=True, text=True, timeout=120, umask=-1 if umask is None else umask,
        env={**os.environ, "PYTHONPATH": str(content.collections_path())})
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def test_containerd_diff_shows_the_config_with_its_credentials_redacted(tmp_path):
    config, dropin = tmp_path / "config.toml", tmp_path / "conf.d" / "99-nvidia.toml"
    config.write_text(CONFIG_WITH_AUTH)
    config.chmod(0o600)
    res = run_module("containerd_runtime", {"config": str(config), "dropin": str(dropin), "config_version": 2},
                     diff=True)
    assert res["changed"] and not res.get("failed"), res
    shown = json.dumps(res["diff"])
    for secret in (PASSWORD, TOKEN, AUTH):
        assert secret not in shown, shown
    before_main = res["diff"][1]["before"]
    assert before_main.count('"<redacted>"') == 3 and 'username = "admin"' in before_main, before_main
    # version 2: the drop-in carries the CRI section, credentials included, so they are in its diff too -- redacted
    assert 'password = "<redacted>"' in res["diff"][0]["after"], res["diff"][0]["after"]
    # ... and the files themselves are intact (only the diff is redacted), the drop-in no more readable than the main
    assert PASSWORD in config.read_text() and PASSWORD in dropin.read_text()
    assert stat.S_IMODE(dropin.stat().st_mode) == 0o600


def test_daemon_json_diff_is_redacted(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"log-driver": "journald", "registry-auth": {"password": PASSWORD}}))
    res = run_module("daemon_json", {"path": str(path), "insecure_registries": ["r.lab:5000"]}, diff=True)
    assert res["changed"] and PASSWORD not in json.dumps(res["diff"]), res
    assert '"password": "<redacted>"' in res["diff"]["before"], res["diff"]


# ---------------------------------------------------------------- final mode from creation


def test_temp_file_has_its_final_mode_before_a_byte_is_written(tmp_path, monkeypatch):
    """Under umask 0 the file is created by open(2) with O_CREAT|O_EXCL and the final mode, and is at that mode --
    and empty -- when the first write comes; no chmod after the content."""
    target = tmp_path / "config.toml"
    seen: list[tuple[int, int, int]] = []
    real_open, real_fdopen = os.open, os.fdopen

    def spy_open(path, flags, mode=0o777, *a, **kw):
        fd = real_open(path, flags, mode, *a, **kw)
        seen.append((flags, mode, fd))
        return fd

    def spy_fdopen(fd, *a, **kw):
        st = os.fstat(fd)
        seen.append((-1, stat.S_IMODE(st.st_mode), st.st_size))  # the file as it is before anything is written
        return real_fdopen(fd, *a, **kw)

    def no_chmod(*_a, **_kw):
        raise AssertionError("chmod after creation")

    old = os.umask(0)
    try:
        monkeypatch.setattr(files.os, "open", spy_open)
        monkeypatch.setattr(files.os, "fdopen", spy_fdopen)
        monkeypatch.setattr(files.os, "chmod", no_chmod)
        files.atomic_write(str(target), CONFIG_WITH_AUTH, new_mode=0o600)
    finally:
        os.umask(old)
    (flags, mode, _fd), (_, mode_at_first_write, size_at_first_write) = seen
    assert flags & os.O_CREAT and flags & os.O_EXCL and mode == 0o600
    assert (mode_at_first_write, size_at_first_write) == (0o600, 0)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == CONFIG_WITH_AUTH
    assert [p.name for p in tmp_path.iterdir()] == ["config.toml"]  # no temp file left


def test_existing_file_keeps_its_mode_and_a_leftover_temp_or_symlink_is_not_followed(tmp_path):
    target, elsewhere = tmp_path / "daemon.json", tmp_path / "elsewhere"
    target.write_text("{}")
    target.chmod(0o640)
    elsewhere.write_text("untouched")
    Path(files.temp_path(str(target))).symlink_to(elsewhere)  # e.g. left by a killed run with this pid
    old = os.umask(0)
    try:
        files.atomic_write(str(target), '{"a": 1}')
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o640 and target.read_text() == '{"a": 1}'
    assert elsewhere.read_text() == "untouched"


def test_modules_create_files_at_their_mode_under_umask_0(tmp_path):
    """A new file through the modules is not 0666 (what Ansible's atomic_move gives a new file under umask 0)."""
    config, dropin = tmp_path / "config.toml", tmp_path / "conf.d" / "99-nvidia.toml"
    res = run_module("containerd_runtime", {"config": str(config), "dropin": str(dropin), "config_version": 2},
                     umask=0)
    assert res["changed"] and not res.get("failed"), res
    assert stat.S_IMODE(config.stat().st_mode) == 0o644 and stat.S_IMODE(dropin.stat().st_mode) == 0o644
    state = tmp_path / ".config.toml.gpu-install-state"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    daemon = tmp_path / "docker" / "daemon.json"
    res = run_module("daemon_json", {"path": str(daemon), "insecure_registries": ["r.lab:5000"]}, umask=0)
    assert res["changed"] and not res.get("failed"), res
    assert stat.S_IMODE(daemon.stat().st_mode) == 0o644


# ---------------------------------------------------------------- the node's Python

#: what `from __future__ import …` may name on Python 3.6 (CentOS/RHEL 8's platform-python); `annotations` came in 3.7
FUTURE_36 = {"nested_scopes", "generators", "division", "absolute_import", "with_statement", "print_function",
             "unicode_literals", "barry_as_FLUFL", "generator_stop"}


@pytest.mark.parametrize("path", sorted((content.collections_path() / "ansible_collections" / content.NAMESPACE
                                         / content.NAME / "plugins").rglob("*.py")), ids=lambda p: p.name)
def test_plugins_parse_as_python_3_6(path):
    """The modules run with the node's Python: its grammar (no walrus, no positional-only parameters), no
    `from __future__ import annotations` (a SyntaxError there), no variable annotations."""
    import ast

    tree = ast.parse(path.read_text(), str(path), feature_version=(3, 6))
    futures = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "__future__"
               for a in n.names}
    assert futures <= FUTURE_36, futures - FUTURE_36
    assert not [n.lineno for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)]
    assert not [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and (n.returns or any(a.annotation for a in n.args.args + n.args.kwonlyargs))]
