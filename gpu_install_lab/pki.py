"""The lab's PKI, the one place that makes keys and certificates (EC P-256, SHA-256; ed25519 for SSH).

Two certificate authorities use it, each in its own directory:
  <lab_dir>/pki        the lab CA: the bastion registry's TLS certificate (lab.py), trusted by the nodes
  <lab_dir>/kube/pki   the control plane's CA (kube/controlplane.py): the apiserver's serving
                       certificate, the hollow kubelets' client certificates (CN=user, O=group), the
                       controller-manager's signing CA; plus the service-account key pair (sa.key/sa.pub)
Everything is made once and kept: a CA and a key pair are never replaced, a server certificate is
re-issued only when its names change.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from installer.errors import EnvironmentProblem
from installer.util import atomic_write

LAB_CA = "gpu-install lab CA"
ORG = "gpu-install lab"
CA_DAYS, LEAF_DAYS = 3650, 825
_PEM = serialization.Encoding.PEM
_NOENC = serialization.NoEncryption()


def _name(cn: str, org: str = ORG) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, _NOENC).decode()


def ensure_ca(pki: Path, cn: str = LAB_CA) -> tuple[Path, Path]:
    """pki/ca.crt + pki/ca.key (kept if present)."""
    crt, key_path = pki / "ca.crt", pki / "ca.key"
    if crt.exists() and key_path.exists():
        return crt, key_path
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    atomic_write(key_path, _key_pem(key), mode=0o600)
    atomic_write(crt, cert.public_bytes(_PEM).decode(), mode=0o644)
    return crt, key_path


def _issue(pki: Path, subject: x509.Name, usage: x509.ObjectIdentifier,
           sans: Sequence[x509.GeneralName] | None = None) -> tuple[str, str]:
    """A leaf certificate signed by pki's CA (made if missing): (certificate PEM, key PEM)."""
    ca_crt, ca_key_path = ensure_ca(pki)
    ca = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    ca_public = ca.public_key()
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or not isinstance(ca_public, ec.EllipticCurvePublicKey):
        raise EnvironmentProblem(f"the CA in {pki} does not hold an EC key pair (the lab makes P-256 keys): "
                                 f"{type(ca_key).__name__} in {ca_key_path}, {type(ca_public).__name__} in {ca_crt}",
                                 hint=f"remove {ca_crt} and {ca_key_path} to have a new CA made")
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(_PEM).decode(), _key_pem(key)


def issue_server_cert(pki: Path, name: str, ips: list[str], dns: list[str], cn: str | None = None) -> tuple[Path, Path]:
    """pki/<name>.crt/.key signed by pki's CA, valid for the given IPs and DNS names (CN: cn, else the
    first name). Re-issued when the SANs differ (e.g. the lab subnet changed)."""
    crt_path, key_path = pki / f"{name}.crt", pki / f"{name}.key"
    want = {*(ipaddress.ip_address(i) for i in ips), *dns}
    if crt_path.exists() and key_path.exists():
        old = x509.load_pem_x509_certificate(crt_path.read_bytes())
        san = old.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = {*san.get_values_for_type(x509.IPAddress), *san.get_values_for_type(x509.DNSName)}
        if have == want:
            return crt_path, key_path
    sans = [x509.IPAddress(ipaddress.ip_address(i)) for i in ips] + [x509.DNSName(d) for d in dns]
    cert, key = _issue(pki, _name(cn or (dns[0] if dns else ips[0])), ExtendedKeyUsageOID.SERVER_AUTH, sans)
    atomic_write(key_path, key, mode=0o600)
    atomic_write(crt_path, cert, mode=0o644)
    return crt_path, key_path


def client_cert(pki: Path, user: str, group: str) -> tuple[str, str]:
    """A client certificate (CN=user, O=group) signed by pki's CA: how kubelets authenticate to the
    apiserver (user and groups come from the subject). Returns (certificate PEM, key PEM)."""
    return _issue(pki, _name(user, org=group), ExtendedKeyUsageOID.CLIENT_AUTH)


def ensure_keypair(pki: Path, name: str) -> tuple[Path, Path]:
    """pki/<name>.key (PKCS#8) + pki/<name>.pub (SubjectPublicKeyInfo), kept if present: e.g. the
    service-account signing keys."""
    key_path, pub_path = pki / f"{name}.key", pki / f"{name}.pub"
    if key_path.exists() and pub_path.exists():
        return key_path, pub_path
    pki.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    atomic_write(key_path, _key_pem(key), mode=0o600)
    atomic_write(pub_path, key.public_key().public_bytes(_PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode())
    return key_path, pub_path


def ssh_keypair(private: Path, comment: str) -> str:
    """Ed25519 key in OpenSSH format at `private` (+ .pub); returns the public key line."""
    pub = private.with_name(private.name + ".pub")
    if private.exists() and pub.exists():
        return pub.read_text().strip()
    key = ed25519.Ed25519PrivateKey.generate()
    priv_text = key.private_bytes(_PEM, serialization.PrivateFormat.OpenSSH, _NOENC).decode()
    pub_text = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    line = f"{pub_text} {comment}"
    atomic_write(private, priv_text, mode=0o600)
    atomic_write(pub, line + "\n", mode=0o644)
    return line
