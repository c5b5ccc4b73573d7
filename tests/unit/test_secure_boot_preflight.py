"""Preflight's Secure Boot checks (plugins/modules/preflight.py): the node's state from the SecureBoot EFI variable
and `mokutil --sb-state`, and with driver.secureBoot auto/require in host/runfile mode the site certificate's
enrolment from `mokutil --test-key`; a refusal is exit 3 with the fix (for a key not enrolled: the one-time
procedure), and gpu-install never enrols a key itself.

The decision is tested pure (secure_boot_problems), the probe against a fake node tree with the lab's STAND-IN mokutil
(gpu_install_lab.standin_mokutil, reading its answers from a file), and the role through the real seam
(preflight_root) with local connections, as tests/unit/test_preflight_facts.py does."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from gpu_install_lab.standin_mokutil import answers, write_standin_mokutil
from installer.config import parse_site
from installer.errors import ConfigError, PreflightError
from tests.unit.library_modules import load_module
from tests.unit.test_ansible_apply import LOCAL, fake_node, inventory, options, preflight
from tests.unit.test_secure_boot_site import mok_pair, openssl_fingerprint

probe = load_module("preflight")
EFIVAR = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
SHA = "ab" * 32


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return mok_pair(tmp_path_factory.mktemp("mok"))


def facts(on, mokutil="/usr/bin/mokutil"):
    return {"secure_boot": on, "mokutil": mokutil}


def decide(on, driver_mode="host", mode="auto", enrolled=None, mokutil="/usr/bin/mokutil"):
    return probe.secure_boot_problems("gpu1", facts(on, mokutil), driver_mode, mode, enrolled, SHA)


# ---------------------------------------------------------------- the decision (pure)


@pytest.mark.parametrize("driver_mode", ["host", "runfile", "operator"])
def test_off_refuses_a_secure_boot_node_where_a_module_is_built_naming_driver_secure_boot(driver_mode):
    [message] = decide(True, driver_mode, "off")
    assert message.startswith("host gpu1: Secure Boot is on and driver.secureBoot.mode is off")
    assert f"(driver.mode {driver_mode})" in message and "set driver.secureBoot" in message
    assert decide(False, driver_mode, "off") == decide(None, driver_mode, "off") == []


@pytest.mark.parametrize("driver_mode", ["precompiled", "preinstalled"])
@pytest.mark.parametrize("mode", ["off", "auto", "require"])
def test_modes_that_build_nothing_accept_secure_boot(driver_mode, mode):
    assert decide(True, driver_mode, mode, mokutil=None) == []


@pytest.mark.parametrize("driver_mode", ["host", "runfile", "precompiled", "preinstalled"])
@pytest.mark.parametrize("on,state", [(False, "off"), (None, "not readable")])
def test_require_refuses_a_node_without_secure_boot_naming_the_host(driver_mode, on, state):
    [message] = decide(on, driver_mode, "require")
    assert message.startswith(f"host gpu1: Secure Boot is {state}") and "driver.secureBoot.mode is require" in message
    assert decide(on, driver_mode, "auto") == []


@pytest.mark.parametrize("mode", ["auto", "require"])
def test_with_secure_boot_on_the_site_certificate_must_be_enrolled(mode):
    assert decide(True, "host", mode, enrolled=True) == []
    [message] = decide(True, "runfile", mode, enrolled=False)
    assert message.startswith(f"host gpu1: Secure Boot is on and the site certificate (SHA-256 {SHA}) is not enrolled")
    for step in ("`mokutil --import cert.der`", "one-time password", "reboot", "MOK manager at the console",
                 "then re-run", "gpu-install never enrols keys itself"):
        assert step in message, step
    # whole in a failed task's message (cut at 500 characters, installer/progress.py), with a long host name
    long_host = probe.secure_boot_problems("h" * 40, facts(True), "host", mode, False, SHA)[0]
    assert len(long_host) <= 500, len(long_host)
    [unanswered] = decide(True, "host", mode, enrolled=None)
    assert "`mokutil --test-key` gave no answer" in unanswered


def test_a_secure_boot_node_without_mokutil_names_the_package():
    [message] = decide(True, "host", "auto", mokutil=None)
    assert message == ("host gpu1: Secure Boot is on and mokutil is not installed: install the mokutil package on the "
                       "node (preflight tests the site certificate's enrolment with `mokutil --test-key`)")
    assert decide(False, "host", "auto", mokutil=None) == []


@pytest.mark.parametrize("efivar,mokutil,on", [(True, None, True), (False, None, False), (None, True, True),
                                                (None, False, False), (None, None, None), (False, True, True),
                                                (True, False, True)])
def test_either_source_saying_on_counts(efivar, mokutil, on):
    assert probe.secure_boot_on(efivar, mokutil) is on


@pytest.mark.parametrize("text,answer", [("SecureBoot enabled\n", True), ("SecureBoot disabled\n", False),
                                         ("EFI variables are not supported on this system\n", None)])
def test_sb_state_words(text, answer):
    assert probe.mokutil_sb_state(text) is answer


@pytest.mark.parametrize("text,answer", [("/tmp/x.der is already enrolled\n", True), ("/tmp/x.der is not enrolled\n", False),
                                         ("Failed to open /tmp/x.der\n", None)])
def test_test_key_words(text, answer):
    assert probe.mokutil_enrolled(text) is answer


# ---------------------------------------------------------------- the probe, with the STAND-IN mokutil


def secure_node(root: Path, efivar: bytes | None, mokutil_on: bool | None = None, enrolled: tuple[bytes, ...] = ()):
    """A fake node (tests.unit.test_ansible_apply.fake_node) with the SecureBoot EFI variable and/or the STAND-IN
    mokutil (None: not there)."""
    fake_node(root)
    if efivar is not None:
        (root / EFIVAR).parent.mkdir(parents=True)
        (root / EFIVAR).write_bytes(efivar)
    if mokutil_on is not None:
        (root / "mok-answers").write_text(answers(mokutil_on, enrolled))
        write_standin_mokutil(root / "usr/bin/mokutil", root / "mok-answers")
    return root


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("efivar,mokutil_on,on", [(bytes([6, 0, 0, 0, 1]), None, True),
                                                  (bytes([6, 0, 0, 0, 0]), None, False),
                                                  (None, True, True), (None, False, False), (None, None, None),
                                                  (bytes([6, 0, 0, 0, 0]), True, True)])
def test_the_probe_reads_the_efivar_and_mokutil(tmp_path, efivar, mokutil_on, on):
    root = secure_node(tmp_path / "n", efivar, mokutil_on)
    f = probe.probe(str(root), run, kernel="k", arch="x86_64")
    assert f["secure_boot"] is on and (f["mokutil"] == "/usr/bin/mokutil") == (mokutil_on is not None)
    assert f["secure_boot_mokutil"] is mokutil_on


def test_test_key_asks_the_standin_about_a_temporary_copy_removed_after(tmp_path, pair):
    cert, _ = pair
    der = cert.read_bytes()
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "gpu-install-mok-*")))
    for enrolled in ((), (der,)):
        root = secure_node(tmp_path / f"n{len(enrolled)}", bytes([6, 0, 0, 0, 1]), True, enrolled)
        assert probe.test_key(str(root), run, "/usr/bin/mokutil", der) is bool(enrolled)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "gpu-install-mok-*"))) == before


# ---------------------------------------------------------------- the role, through the real seam


def sb_site(tmp_path, mode="auto", driver_mode="host", pair=None):
    sb: dict = {"mode": mode}
    if pair:
        sb |= {"certificate": str(pair[0]), "signingKey": str(pair[1])}
    return parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000", "insecure": True},
                       "runtime": "docker", "toolkit": {"mode": "host"}, "driver": {"mode": driver_mode, "secureBoot": sb}})


def run_preflight(tmp_path, s, root, hosts=None):
    opts, _ = options(tmp_path, inventory(tmp_path, hosts or {"gpu1": dict(LOCAL)}), root)
    return preflight(s, opts)


def refusal(tmp_path, s, root, hosts=None) -> str:
    with pytest.raises(PreflightError) as exc:
        run_preflight(tmp_path, s, root, hosts)
    assert exc.value.exit_code == 3 and str(exc.value).startswith("preflight failed on gpu1: "), str(exc.value)
    return str(exc.value)


def test_a_secure_boot_node_without_the_site_key_enrolled_stops_preflight_with_the_procedure(tmp_path, pair):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 1]), True)
    message = refusal(tmp_path, sb_site(tmp_path, pair=pair), root)
    sha = openssl_fingerprint(pair[0], "sha256")
    assert f"host gpu1: Secure Boot is on and the site certificate (SHA-256 {sha}) is not enrolled" in message
    assert "`mokutil --import cert.der`" in message and message.rstrip().endswith(
        "gpu-install never enrols keys itself\n  hint: fix the reported problems; nothing was changed".rstrip()), message
    # enrolled: the same node passes
    (root / "mok-answers").write_text(answers(True, (pair[0].read_bytes(),)))
    assert run_preflight(tmp_path, sb_site(tmp_path, pair=pair), root).failed == []


def test_the_role_passes_the_certificate_and_never_the_key(tmp_path, pair):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 1]), True, (pair[0].read_bytes(),))
    run_preflight(tmp_path, sb_site(tmp_path, "require", pair=pair), root)
    secret = "".join(pair[1].read_text().splitlines()[1:-1])
    for f in (tmp_path / "state").rglob("*"):
        if f.is_file():
            text = f.read_text(errors="replace")
            assert secret[:40] not in text and secret[-40:] not in text, f
    events = [json.loads(p.read_text()) for p in (tmp_path / "state").rglob("job_events/*.json")]
    [args] = [e["event_data"]["res"]["invocation"]["module_args"] for e in events
              if e.get("event") == "runner_on_ok" and e["event_data"].get("task", "").startswith("Preflight | Probe")]
    assert args["secure_boot_mode"] == "require" and args["secure_boot_certificate"]
    assert "allow_secure_boot" not in args and str(pair[1]) not in json.dumps(args)


def test_a_secure_boot_node_without_mokutil_stops_preflight_naming_the_package(tmp_path, pair):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 1]), None)
    assert "mokutil is not installed: install the mokutil package" in refusal(tmp_path, sb_site(tmp_path, pair=pair), root)


def test_require_stops_a_node_with_secure_boot_off_naming_it(tmp_path, pair):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 0]), False)
    message = refusal(tmp_path, sb_site(tmp_path, "require", pair=pair), root)
    assert "host gpu1: Secure Boot is off and driver.secureBoot.mode is require" in message


def test_off_stops_a_secure_boot_node_naming_driver_secure_boot(tmp_path):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 1]), None)
    message = refusal(tmp_path, sb_site(tmp_path, "off"), root)
    assert "Secure Boot is on and driver.secureBoot.mode is off" in message and "preflight_allow_secure_boot" not in message


def test_the_removed_allow_flag_is_named_with_its_replacement(tmp_path):
    root = secure_node(tmp_path / "node", bytes([6, 0, 0, 0, 1]), None)
    with pytest.raises(ConfigError, match="host gpu1: variable 'preflight_allow_secure_boot' was removed; use "
                                          "driver.secureBoot in the site file") as exc:
        run_preflight(tmp_path, sb_site(tmp_path, "off"), root,
                      {"gpu1": dict(LOCAL, preflight_allow_secure_boot=True)})
    assert exc.value.exit_code == 2
