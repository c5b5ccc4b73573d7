"""driver.secureBoot in the site model: mode off|require|auto, the site's MOK certificate and signing key.

The key pair is made by the real openssl as docs/secure-boot.md tells a site to; the certificate is read and the key
matched with pyca/cryptography (installer.render.role_vars.site_key). Every refusal is a ConfigError (exit 2) naming
the field; the private key is never passed to the roles, nor shown."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest

from installer.config import load_site, parse_site
from installer.errors import ConfigError
from installer.render.role_vars import site_key
from tests.conftest import plan_of

BASE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000"}}


def mok_pair(d: Path, name="MOK", encrypt=False) -> tuple[Path, Path]:
    """A MOK pair as a site makes one: `openssl req -new -x509 -newkey rsa:2048 -outform DER` (key 0600)."""
    d.mkdir(parents=True, exist_ok=True)
    key, cert = d / f"{name}.priv", d / f"{name}.der"
    secret = ["-passout", "pass:secret"] if encrypt else ["-nodes"]
    subprocess.run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-keyout", str(key), "-outform", "DER",
                    "-out", str(cert), "-days", "30", "-subj", f"/CN={name} site module signing/", *secret],
                   check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key


def openssl_fingerprint(cert: Path, digest: str) -> str:
    out = subprocess.run(["openssl", "x509", "-inform", "DER", "-in", str(cert), "-noout", "-fingerprint", f"-{digest}"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "").lower()


def sb_site(driver_mode="host", **secure_boot):
    return parse_site({**BASE, "driver": {"mode": driver_mode, "secureBoot": secure_boot}})


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return mok_pair(tmp_path_factory.mktemp("mok"))


# ---------------------------------------------------------------- the model


def test_off_by_default_and_off_needs_nothing():
    assert parse_site(BASE).driver.secureBoot.mode == "off"
    assert sb_site("host", mode="off").driver.secureBoot.certificate is None


@pytest.mark.parametrize("mode", ["host", "runfile"])
@pytest.mark.parametrize("given,missing", [({}, "driver.secureBoot.certificate and driver.secureBoot.signingKey"),
                                           ({"certificate": "MOK.der"}, "needs driver.secureBoot.signingKey"),
                                           ({"signingKey": "MOK.priv"}, "needs driver.secureBoot.certificate:")])
def test_a_node_built_module_needs_certificate_and_key(mode, given, missing):
    driver = {"mode": mode, "secureBoot": {"mode": "auto", **given}}
    if mode == "runfile":
        driver["runfile"] = "/srv/NVIDIA-Linux-x86_64-550.54.15.run"
    with pytest.raises(ConfigError) as exc:
        parse_site({**BASE, "driver": driver})
    assert exc.value.exit_code == 2 and f"driver.secureBoot.mode auto with driver.mode {mode}" in str(exc.value)
    assert missing in str(exc.value)


@pytest.mark.parametrize("sb", ["auto", "require"])
def test_operator_mode_with_secure_boot_is_refused_naming_precompiled_and_host_with_the_site_key(sb):
    with pytest.raises(ConfigError) as exc:
        sb_site("operator", mode=sb, certificate="MOK.der", signingKey="MOK.priv")
    message = str(exc.value)
    assert exc.value.exit_code == 2 and f"driver.secureBoot.mode {sb} with driver.mode operator" in message
    assert "driver.mode precompiled" in message and "driver.mode host with the site key" in message


@pytest.mark.parametrize("mode", ["precompiled", "preinstalled"])
def test_modes_that_build_nothing_need_no_key(mode):
    assert sb_site(mode, mode="require").driver.secureBoot.mode == "require"


def test_an_unknown_mode_names_the_field():
    with pytest.raises(ConfigError, match=r"driver\.secureBoot\.mode: Input should be 'off', 'require' or 'auto'"):
        sb_site("host", mode="on")


def test_paths_are_relative_to_the_site_file(tmp_path, pair):
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "site.yaml").write_text(json.dumps(
        {**BASE, "driver": {"mode": "host", "secureBoot": {"mode": "auto", "certificate": "keys/MOK.der",
                                                           "signingKey": "keys/MOK.priv"}}}))
    sb = load_site(site_dir / "site.yaml").driver.secureBoot
    assert (sb.certificate, sb.signingKey) == (site_dir / "keys/MOK.der", site_dir / "keys/MOK.priv")


# ---------------------------------------------------------------- the files


def test_the_certificate_der_or_pem_is_read_and_its_fingerprints_computed(tmp_path, pair):
    cert, key = pair
    k = site_key(sb_site(mode="auto", certificate=str(cert), signingKey=str(key)))
    assert k.der == cert.read_bytes()
    assert (k.sha1, k.sha256) == (openssl_fingerprint(cert, "sha1"), openssl_fingerprint(cert, "sha256"))
    pem = tmp_path / "MOK.pem"
    subprocess.run(["openssl", "x509", "-inform", "DER", "-in", str(cert), "-out", str(pem)], check=True)
    assert site_key(sb_site(mode="auto", certificate=str(pem), signingKey=str(key))) == k


def _refusal(cert, key) -> str:
    with pytest.raises(ConfigError) as exc:
        site_key(sb_site(mode="auto", certificate=str(cert), signingKey=str(key)))
    assert exc.value.exit_code == 2
    return str(exc.value)


def test_a_file_that_is_no_certificate_is_refused(tmp_path, pair):
    cert, key = pair
    assert "driver.secureBoot.certificate" in _refusal(tmp_path / "none.der", key)
    assert f"driver.secureBoot.certificate {key}: not an X.509 certificate" in _refusal(key, key)


def test_the_key_must_be_a_private_regular_file(tmp_path, pair):
    cert, key = pair
    assert f"driver.secureBoot.signingKey {tmp_path / 'none'}: No such file" in _refusal(cert, tmp_path / "none")
    assert f"driver.secureBoot.signingKey {tmp_path}: not a regular file" in _refusal(cert, tmp_path)
    for mode in (0o640, 0o604, 0o620, 0o601):
        key.chmod(mode)
        try:
            message = _refusal(cert, key)
        finally:
            key.chmod(0o600)
        assert f"driver.secureBoot.signingKey {key}: mode {mode:04o} lets group or other" in message, message


def test_the_key_must_be_the_certificates_and_unencrypted(tmp_path, pair):
    cert, _ = pair
    _, other = mok_pair(tmp_path / "other", "OTHER")
    message = _refusal(cert, other)
    assert f"driver.secureBoot.signingKey {other} is not the private key of driver.secureBoot.certificate" in message
    assert "PRIVATE KEY" not in message and other.read_text()[40:80] not in message
    _, locked = mok_pair(tmp_path / "locked", "LOCKED", encrypt=True)
    assert "the private key is encrypted" in _refusal(tmp_path / "locked/LOCKED.der", locked)
    junk = tmp_path / "junk.priv"
    junk.write_bytes(b"-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    junk.chmod(0o600)
    assert f"driver.secureBoot.signingKey {junk}: not a private key" in _refusal(cert, junk)


# ---------------------------------------------------------------- what the roles get


def test_preflight_gets_the_mode_and_the_certificate_never_the_key(pair):
    cert, key = pair
    rv = dict(plan_of(sb_site(mode="auto", certificate=str(cert), signingKey=str(key))).role_vars)
    assert rv["preflight_secure_boot_mode"] == "auto"
    assert base64.b64decode(rv["preflight_secure_boot_certificate"]) == cert.read_bytes()
    assert rv["preflight_secure_boot_certificate_sha256"] == openssl_fingerprint(cert, "sha256")
    text = json.dumps(rv)
    secret = "".join(key.read_text().splitlines()[1:-1])
    assert "preflight_allow_secure_boot" not in rv and secret[:40] not in text and secret[-40:] not in text
    assert all(not isinstance(v, str) or "BEGIN PRIVATE KEY" not in v for v in rv.values())


def test_resolve_refuses_a_bad_key_with_exit_2(tmp_path, pair):
    cert, key = pair
    with pytest.raises(ConfigError) as exc:
        plan_of(sb_site(mode="require", certificate=str(cert), signingKey=str(tmp_path / "none")))
    assert exc.value.exit_code == 2 and "driver.secureBoot.signingKey" in str(exc.value)


@pytest.mark.parametrize("driver", [{"mode": "precompiled", "secureBoot": {"mode": "require"}},
                                    {"mode": "host"}])
def test_without_a_node_built_module_no_certificate_is_passed(driver):
    rv = dict(plan_of(parse_site({**BASE, "driver": driver})).role_vars)
    assert rv["preflight_secure_boot_certificate"] == "" == rv["preflight_secure_boot_certificate_sha256"]
    assert rv["preflight_secure_boot_mode"] == driver.get("secureBoot", {"mode": "off"})["mode"]


def test_a_file_too_large_for_a_key_is_not_read_whole(tmp_path, pair):
    cert, key = pair
    big = tmp_path / "big.der"
    big.write_bytes(cert.read_bytes() + b"\0" * (64 * 1024))
    assert f"driver.secureBoot.certificate {big}: larger than 65536 bytes" in _refusal(big, key)
