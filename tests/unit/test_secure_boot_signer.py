"""node.driver.signer: the nvidia module's signer (modinfo) against the site certificate or Canonical's.

Test data: real modinfo output of the lab's STAND-IN module built and signed by real DKMS (tests/fixtures/modinfo/,
README there says how)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from installer.validate.node import SIGNER, SiteCertificate, signer_check, site_certificate

FIX = Path(__file__).parent.parent / "fixtures" / "modinfo"


def field(modinfo: str, name: str) -> str:
    """What `modinfo -F <name>` prints, from modinfo's full output."""
    return next((line.split(":", 1)[1].strip() for line in modinfo.splitlines() if line.startswith(f"{name}:")), "")


def read(name: str) -> tuple[str, str]:
    text = (FIX / name).read_text()
    return field(text, "signer"), field(text, "sig_key")


@pytest.fixture
def site() -> SiteCertificate:
    return site_certificate((FIX / "site-cert.der").read_bytes())


def _cert(cn: str | None, serial: int) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else
                     [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(serial).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def test_site_certificate_reads_cn_serial_and_ski(site: SiteCertificate) -> None:
    assert site.cn == "Example Site Module Signing"
    assert site.serial == ("07:AB:CC:3C:AB:54:EE:DA:BC:98:0E:D7:48:8C:8D:D9:A7:47:75:AA",)
    assert site.ski == "F6:56:46:4C:72:1D:3E:A6:7C:2C:F6:25:8F:55:93:E3:9E:04:99:B9"


def test_module_signed_by_site_key_passes(site: SiteCertificate) -> None:
    signer, sig_key = read("site-signed.modinfo")
    [f] = signer_check("gpu1", signer, sig_key, site, True)
    assert (f.check, f.severity) == (SIGNER, "info")
    assert "Example Site Module Signing" in f.message and "07:AB:CC" in f.message


def test_module_signed_by_another_key_is_refused(site: SiteCertificate) -> None:
    signer, sig_key = read("other-signed.modinfo")
    [f] = signer_check("gpu1", signer, sig_key, site, True)
    assert f.severity == "error"
    assert "'DKMS module signing key'" in f.message and "Example Site Module Signing" in f.message
    assert "mok_signing_key" in f.fix


def test_same_cn_other_key_is_refused(site: SiteCertificate) -> None:
    # a key made with the site's CN is not the site's key: sig_key must match too
    _, other_key = read("other-signed.modinfo")
    [f] = signer_check("gpu1", site.cn, other_key, site, True)
    assert f.severity == "error"


def test_other_cert_does_not_accept_site_module() -> None:
    other = site_certificate((FIX / "other-cert.der").read_bytes())
    signer, sig_key = read("site-signed.modinfo")
    assert signer_check("gpu1", signer, sig_key, other, True)[0].severity == "error"


def test_sig_key_as_subject_key_identifier_passes(site: SiteCertificate) -> None:
    assert site.ski is not None  # sign-file -k signs with the SKI as the signer id
    assert signer_check("gpu1", site.cn, site.ski.lower() + "\n", site, True)[0].severity == "info"


def test_not_loaded_is_an_error_even_when_signed(site: SiteCertificate) -> None:
    signer, sig_key = read("site-signed.modinfo")
    [f] = signer_check("gpu1", signer, sig_key, site, False)
    assert f.severity == "error" and "/sys/module/nvidia" in f.message and "Key was rejected" in f.fix


def test_unsigned_module_is_an_error(site: SiteCertificate) -> None:
    [f] = signer_check("gpu1", "", "", site, True)
    assert f.severity == "error" and "not signed" in f.message


@pytest.mark.parametrize("signer", ["Canonical Ltd. Kernel Module Signing", "Canonical Ltd. Secure Boot Signing (2024)"])
def test_canonical_only_when_allowed(site: SiteCertificate, signer: str) -> None:
    assert signer_check("gpu1", signer, "AB:CD", site, True)[0].severity == "error"
    assert signer_check("gpu1", signer, "AB:CD", None, True, canonical_ok=True)[0].severity == "info"


def test_no_certificate_and_not_canonical_is_refused() -> None:
    signer, sig_key = read("site-signed.modinfo")
    [f] = signer_check("gpu1", signer, sig_key, None, True, canonical_ok=True)
    assert f.severity == "error" and "Canonical" in f.message


def test_serial_with_top_bit_set_matches_with_and_without_leading_zero() -> None:
    cert = site_certificate(_cert("Site", 0x80_01))
    assert cert.serial == ("80:01", "00:80:01")
    for key in cert.serial:
        assert signer_check("h", "Site", key, cert, True)[0].severity == "info"


def test_pem_and_der_read_alike(site: SiteCertificate) -> None:
    der = (FIX / "site-cert.der").read_bytes()
    pem = x509.load_der_x509_certificate(der).public_bytes(serialization.Encoding.PEM)
    assert site_certificate(pem) == site


@pytest.mark.parametrize("data, words", [
    (b"not a certificate", "driver.secureBoot.certificate: not an X.509 certificate"),
    (b"\0" * (64 * 1024 + 1), "more than a certificate"),
])
def test_bad_certificate_is_refused_naming_the_field(data: bytes, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        site_certificate(data)


def test_certificate_without_cn_is_refused() -> None:
    with pytest.raises(ValueError, match="no CN"):
        site_certificate(_cert(None, 5))


def test_site_key_id_under_another_signer_name_is_refused(site: SiteCertificate) -> None:
    _, sig_key = read("site-signed.modinfo")
    assert signer_check("gpu1", "Someone Else", sig_key, site, True)[0].severity == "error"


def _probe_text(signer: str, sig_key: str, module: str) -> str:
    from installer.validate import probe

    m = probe.MARK
    smi = (Path(__file__).parent.parent / "fixtures" / "nvidia-smi" / "corpus" / "driver-not-loaded.txt").read_text()
    return (f"{m} nvidia-smi\n{smi}\n{m} rc 9\n{m} lspci\n\n{m} modules\n\n{m} secureboot\nSecureBoot enabled\n"
            f"{m} reboot\n\n{m} signer\n{signer}\n{m} sig_key\n{sig_key}\n{m} module\n{module}\n{m} end\n")


@pytest.mark.parametrize("module, status", [("loaded", "pass"), ("", "fail")])
def test_validate_node_layer_reports_the_signer(site: SiteCertificate, module: str, status: str) -> None:
    from installer.validate import probe
    from installer.validate.node import Expectations, SignerExpectation

    signer, sig_key = read("site-signed.modinfo")
    t = probe.Target("gpu1", "gpu-01", {})
    checks = probe.checks_for(t, probe.parse_probe(_probe_text(signer, sig_key, module)),
                              Expectations(signer=SignerExpectation(site)), 1.0)
    [c] = [c for c in checks if c.check == SIGNER]
    assert c.status == status and c.node == "gpu-01" and "Example Site Module Signing" in c.message
    # the site does not ask for Secure Boot: no signer check
    plain = probe.checks_for(t, probe.parse_probe(_probe_text(signer, sig_key, module)), Expectations(), 1.0)
    assert SIGNER not in {c.check for c in plain}


def _plan_with_secure_boot(tmp_path: Path, sb_mode: str, cert: Path) -> object:
    import subprocess

    import yaml

    from installer.config import parse_site
    from tests.conftest import plan_of

    key = tmp_path / "MOK.priv"
    if not key.exists():
        subprocess.run(["openssl", "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-outform", "DER", "-out", str(tmp_path / "MOK.der"), "-days", "30", "-subj", "/CN=MOK/"],
                       check=True, capture_output=True)
        key.chmod(0o600)
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000"},
                       "driver": {"mode": "host", "secureBoot": {"mode": sb_mode, "certificate": str(cert),
                                                                 "signingKey": str(key)}}})
    inv = tmp_path / "inv"
    inv.mkdir(exist_ok=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": {"gpu_install_os": "ubuntu24.04"}}}}}}))
    return plan_of(site, inventory=str(inv))


def test_validate_expects_the_site_signer_only_when_the_site_asks(tmp_path: Path) -> None:
    from installer import validate
    from installer.validate.node import site_certificate as read

    plan = _plan_with_secure_boot(tmp_path, "auto", tmp_path / "MOK.der")
    want = read((tmp_path / "MOK.der").read_bytes())
    assert validate.expectations(plan, "gpu1").signer.certificate == want  # type: ignore[arg-type]
    assert validate.expectations(_plan_with_secure_boot(tmp_path, "off", tmp_path / "MOK.der"),  # type: ignore[arg-type]
                                 "gpu1").signer is None


def test_validate_refuses_an_unreadable_or_malformed_site_certificate(tmp_path: Path) -> None:
    from installer import validate
    from installer.errors import ConfigError

    plan = _plan_with_secure_boot(tmp_path, "require", tmp_path / "MOK.der")
    (tmp_path / "MOK.der").write_bytes(b"garbage")  # changed after the plan was made
    with pytest.raises(ConfigError, match=r"driver.secureBoot.certificate .*MOK.der: not an X.509") as e:
        validate.expectations(plan, "gpu1")  # type: ignore[arg-type]
    assert e.value.exit_code == 2
    (tmp_path / "MOK.der").unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        validate.expectations(plan, "gpu1")  # type: ignore[arg-type]
