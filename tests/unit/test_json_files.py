"""installer/safefile.py's JSON reader (read_json, parse_json, json_value) and the files read through it: the upgrade
plan (`upgrade apply --plan`), the upgrade state file, a validate report given to `evidence create` and the signed
statement `evidence verify` reads. A file nested 200,000 levels deep, one over its size bound and one with a key given
twice are each exit 2 naming the file and what is wrong -- through the real CLI in a process of its own, so that a
traceback or `internal error` on stderr would show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from installer import safefile, signing
from installer.errors import ConfigError
from installer.evidence import collect, model, sign
from installer.upgrade import apply as ua
from installer.upgrade import state as st
from tests.conftest import ROOT

SITE = ROOT / "inventories" / "sample" / "site.yaml"
HOSTS = ROOT / "inventories" / "sample" / "hosts.yml"
DEEP = "[" * 200_000 + "]" * 200_000
PLAN = {"schema": ua.PLAN_SCHEMA, "planHash": "sha256:" + "0" * 64, "batches": [], "nodes": [], "blockers": [],
        "maxParallel": 1, "maxUnavailable": "25%", "nothingToDo": False}


def cli(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "installer.cli", *map(str, argv)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "GPU_INSTALL_STATE": "/nonexistent-state"})


def apply_cli(plan: Path, state: Path) -> subprocess.CompletedProcess[str]:
    return cli("upgrade", "apply", "-s", SITE, "-i", HOSTS, "--plan", plan, "--state", state, "--yes", "--resume")


def refused(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr and "RecursionError" not in \
        proc.stderr


# ---------------------------------------------------------------- the reader


@pytest.mark.parametrize(("text", "says"), [
    (DEEP, "nested more than 64 levels deep"),
    ("[" * 65 + "]" * 65, "nested more than 64 levels deep"),
    ('{"a": {"b": 1, "b": 2}}', "key 'b' is given twice in one object"),
    ('{"a": NaN}', "NaN is not a JSON number"),
    (b'{"a": "\xff"}', "not UTF-8 text (byte 7)"),
    ('{"a": ', "not JSON (Expecting value: line 1 column 7 (char 6))"),
])
def test_what_the_json_reader_refuses(text, says):
    with pytest.raises(ConfigError) as err:
        safefile.parse_json(text, "f.json", hint="fix it")
    assert err.value.message == f"f.json: {says}" or err.value.message.startswith(f"f.json: {says}")
    assert err.value.exit_code == 2 and err.value.hint == "fix it"


def test_the_json_reader_takes_64_levels_and_keeps_what_json_gives():
    assert safefile.json_value("[" * 64 + "]" * 64) == json.loads("[" * 64 + "]" * 64)
    doc = {"a": [1, 2.5, None, True, {"b": "ü"}], "c": {}}
    assert safefile.json_value(json.dumps(doc).encode()) == doc


def test_read_json_keeps_read_texts_bounds(tmp_path):
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    with pytest.raises(ConfigError, match=r"is 1203 bytes; more than 1000 is not a plan file"):
        safefile.read_json(big, "plan file", 1000)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ConfigError, match="not a regular file"):
        safefile.read_json(tmp_path / "fifo", "plan file")


# ---------------------------------------------------------------- upgrade apply: plan and state files


def test_a_plan_file_nested_200000_levels_deep_is_exit_2(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"schema": ' + DEEP + "}")
    refused(apply_cli(plan, tmp_path / "state.json"), f"error: plan file {plan}: nested more than 64 levels deep")


def test_a_state_file_nested_200000_levels_deep_is_exit_2(tmp_path):
    plan, state = tmp_path / "plan.json", tmp_path / "state.json"
    plan.write_text(json.dumps(PLAN))
    state.write_text('{"schema": "gpu-install.upgrade-state/v1", "batches": ' + DEEP + "}")
    refused(apply_cli(plan, state), f"error: upgrade state file {state}: nested more than 64 levels deep")


def test_oversize_plan_and_state_files_are_exit_2_before_they_are_read(tmp_path):
    plan, state = tmp_path / "plan.json", tmp_path / "state.json"
    with open(plan, "wb") as fh:  # sparse: the bound is checked on the size, before a byte is read
        fh.truncate(ua.MAX_PLAN_BYTES + 1)
    refused(apply_cli(plan, state), f"error: plan file {plan} is {ua.MAX_PLAN_BYTES + 1} bytes; more than "
                                    f"{ua.MAX_PLAN_BYTES} is not a plan file")
    plan.write_text(json.dumps(PLAN))
    with open(state, "wb") as fh:
        fh.truncate(st.MAX_BYTES + 1)
    refused(apply_cli(plan, state), f"error: upgrade state file {state} is {st.MAX_BYTES + 1} bytes")


def test_a_key_given_twice_in_the_plan_or_the_state_is_exit_2(tmp_path):
    plan, state = tmp_path / "plan.json", tmp_path / "state.json"
    text = json.dumps(PLAN)
    plan.write_text(text[:-1] + ', "planHash": "sha256:' + "1" * 64 + '"}')  # which hash would count?
    refused(apply_cli(plan, state), f"error: plan file {plan}: key 'planHash' is given twice in one object")
    plan.write_text(text)
    state.write_text('{"schema": "gpu-install.upgrade-state/v1", "batches": [{"index": 1, "status": "failed", '
                     '"status": "done"}]}')
    refused(apply_cli(plan, state), f"error: upgrade state file {state}: key 'status' is given twice in one object")


# ---------------------------------------------------------------- evidence


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    return sign.load_key(str(tmp_path_factory.mktemp("keys") / "evidence-home"))


@pytest.mark.parametrize(("payload", "says"), [
    (b'{"_type": "https://in-toto.io/Statement/v1", "_type": "x", "subject": []}',
     "signed, but the signed payload is not a JSON statement: key '_type' is given twice in one object"),
    (b'{"predicate": ' + ("[" * 200_000 + "]" * 200_000).encode() + b"}",
     "signed, but the signed payload is not a JSON statement: nested more than 64 levels deep"),
])
def test_evidence_verify_refuses_a_signed_statement_with_a_key_twice_or_nested_deep(tmp_path, key, payload, says):
    """Signed with the pinned key (the signer's mistake, or another tool's statement): still exit 2, no traceback."""
    path = tmp_path / "evidence.json"
    path.write_bytes(signing.sign(key, payload, model.PAYLOAD_TYPE))
    refused(cli("evidence", "verify", path, "--key", key.public_path), f"error: {path}: {says}")


def test_evidence_create_refuses_a_validate_report_with_a_key_twice(tmp_path):
    from installer.config import load_site
    from installer.plan import Options, resolve

    plan = resolve(load_site(SITE), Options(inventory=str(HOSTS)))
    report = tmp_path / "validate.json"
    report.write_text('{"schema": "gpu-install.validate/v1", "exitCode": 6, "exitCode": 0, "checks": []}')
    with pytest.raises(ConfigError) as err:
        collect.controller_files(plan, str(SITE), bundle=None, chart=None, reports=[report], secrets=[],
                                 out=collect.Collected())
    assert err.value.message == f"validate report {report}: key 'exitCode' is given twice in one object (JSON " \
                                "readers disagree on which one counts)"
    assert err.value.exit_code == 2


def test_a_node_record_nested_deep_or_with_a_key_twice_is_not_json_in_the_facts():
    """A role record read from a node goes through the same reader: "(not JSON)" in the facts, not a traceback."""
    m = collect.MARK
    text = "\n".join([f"{m} os", "ID=ubuntu", f"{m} rc 127", f"{m} record deep.json", DEEP,
                      f"{m} record twice.json", '{"version": "1", "version": "2"}', f"{m} end", ""])
    assert collect.node_facts(text)["records"] == {"deep.json": "(not JSON)", "twice.json": "(not JSON)"}
