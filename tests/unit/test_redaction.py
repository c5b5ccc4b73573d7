"""What is hidden of the site's credentials (installer.jsonout.redact/hide, installer.mirror.common.redact): a secret
in the string values of a --json document, never its keys or its envelope's own fields; a user name is no secret.

The commands run in process with the stage entry points of tests/unit/test_stages.py answering (no hosts, no
cluster); every written document is checked against its published JSON schema."""

from __future__ import annotations

import json

import pytest

from installer import jsonout
from installer.mirror import common
from tests.unit.test_json_output import load

#: the password is a part of every schema name ("gpu-install.…/v1") and of many messages
PASSWORD = "gpu-install"


@pytest.fixture
def staged(tmp_path, write_site):
    """The site and inventory of tests/unit/test_json_output.py's staged_files (pullSecret from JSON_TEST_USER and
    JSON_TEST_PASSWORD)."""
    from tests.unit.test_json_output import staged_files

    return staged_files.__wrapped__(tmp_path, write_site)


@pytest.fixture
def short_user(monkeypatch):
    """GPU registry credentials whose user name is "gpu" -- a part of every schema name and of many values."""
    monkeypatch.setenv("JSON_TEST_USER", "gpu")
    monkeypatch.setenv("JSON_TEST_PASSWORD", PASSWORD)


def _only_in_the_schema(raw: str) -> None:
    """The password appears once in the written file: inside the schema name, which is never redacted."""
    assert raw.count(PASSWORD) == 1 and json.loads(raw)["schema"].startswith(PASSWORD + ".")


@pytest.mark.parametrize("command", ["preflight", "apply", "uninstall"])
def test_json_with_a_short_user_name_and_a_password_inside_the_schema_name(cli, tmp_path, monkeypatch, staged,
                                                                        short_user, command):
    """GPU_REGISTRY_USER=gpu once turned the schema into ***-install.preflight/v1: KeyError, exit 1, no file. Now
    the document is written, valid, with its schema and command, and the user name left as it is."""
    from tests.unit.test_stages import Stubs

    site, inv = staged
    Stubs(monkeypatch, None)
    from installer import validate
    from tests.unit.test_json_output import _real_report

    monkeypatch.setattr(validate, "run", lambda *a, **k: _real_report())
    out = tmp_path / f"{command}.json"
    extra = {"apply": ["--skip-mirror-check"], "uninstall": ["--yes"], "preflight": []}[command]
    rc, _, err = cli(command, "-s", site, "-i", inv, *extra, "--json", out, "-q")
    assert rc == 0, err
    schema = jsonout.PREFLIGHT if command == "preflight" else jsonout.APPLY
    doc = load(out, schema)
    assert (doc["command"], doc["exitCode"], doc["error"]) == (command, 0, None)
    _only_in_the_schema(out.read_text())


def test_a_failure_message_keeps_the_user_name_and_hides_the_password(cli, tmp_path, monkeypatch, staged,
                                                                      short_user):
    from installer.errors import ClusterError
    from tests.unit.test_stages import Stubs

    site, inv = staged
    stubs = Stubs(monkeypatch, "operator")
    stubs.error = ClusterError(f"login as gpu with {PASSWORD} refused by https://gpu:{PASSWORD}@registry.example.com")
    out = tmp_path / "apply.json"
    rc, _, err = cli("apply", "-s", site, "-i", inv, "--skip-mirror-check", "--json", out, "-q")
    assert rc == 7, err
    doc = load(out, jsonout.APPLY)
    assert doc["error"]["message"] == "login as gpu with *** refused by https://***@registry.example.com"
    _only_in_the_schema(out.read_text())


def test_redact_leaves_keys_and_the_envelope_and_hides_whole_values():
    doc = {**jsonout.envelope(jsonout.APPLY, "apply"), "error": None, "stages": []}
    clean = jsonout.redact({**doc, "install": {"gpu-install": "x gpu-install y"}}, ["gpu-install"])
    assert clean["schema"] == jsonout.APPLY and clean["command"] == "apply"
    assert clean["install"] == {"gpu-install": "x *** y"}
    # not a document: every string value, keys still untouched
    assert jsonout.redact({"schema": "gpu-install", "k": ["gpu-install"]}, ["gpu-install"]) == {
        "schema": "***", "k": ["***"]}


def test_a_short_secret_is_hidden_as_a_whole_value_or_word_only():
    """A secret under MIN_EMBEDDED characters: replaced where it is the whole value or a word of its own (never
    shown in `password abc`), not inside other words (`abcd`, `gpu-abc1` stay readable)."""
    assert jsonout.MIN_EMBEDDED == 4
    assert jsonout.hide("abc", ["abc"]) == "***"
    assert jsonout.hide("password abc refused; abcd gpu-abc1 x-abc", ["abc"]) == \
        "password *** refused; abcd gpu-abc1 x-***"
    assert jsonout.hide("tokenabcd1 and abcd1", ["abcd1"]) == "token*** and ***"
    assert common.redact("helm: https://u:p@h/x failed for abc", ["abc"]) == "helm: https://***@h/x failed for ***"


def test_secret_values_are_passwords_not_user_names(monkeypatch):
    from types import SimpleNamespace

    plan = SimpleNamespace(pull_secret=SimpleNamespace(usernameEnv="U", passwordEnv="P"))
    monkeypatch.setenv("U", "robot")
    monkeypatch.setenv("P", "s3cr3t-pa55word")
    assert jsonout.secret_values(plan) == ["s3cr3t-pa55word"]
    assert common.secrets_of(json.dumps({"auths": {"r:5000": {"username": "robot", "password": "pw12",
                                                                "auth": "cm9ib3Q6cHcxMg=="}}}).encode()) == [
        "pw12", "cm9ib3Q6cHcxMg=="]
