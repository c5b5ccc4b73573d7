"""gpu_install_lab.pki, the one PKI of the lab: the registry's CA and the control plane's (no root needed)."""

from __future__ import annotations

import socket
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_install_lab import pki
from gpu_install_lab.kube import ControlPlane


def _cert(path):
    return x509.load_pem_x509_certificate(path.read_bytes())


def _sans(cert):
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {*map(str, san.get_values_for_type(x509.IPAddress)), *san.get_values_for_type(x509.DNSName)}


def _tls_handshake(crt, key, ca, host="127.0.0.1"):
    """A real TLS handshake on loopback: OpenSSL (strict X.509 checks) accepts the chain for host."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(str(crt), str(key))
    client_ctx = ssl.create_default_context(cafile=str(ca))
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.socket() as lsock:
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(1)
        errors = []

        def serve():
            conn, _ = lsock.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError) as exc:
                errors.append(exc)

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with socket.create_connection(lsock.getsockname(), timeout=5) as raw:
            with client_ctx.wrap_socket(raw, server_hostname=host) as tls:
                peer = tls.getpeercert()
                tls.sendall(b"x")
        t.join(5)
    return peer


def test_lab_ca_and_registry_certificate(tmp_path):
    d = tmp_path / "pki"
    ca, ca_key = pki.ensure_ca(d)
    assert pki.ensure_ca(d) == (ca, ca_key) and _cert(ca).serial_number == _cert(pki.ensure_ca(d)[0]).serial_number
    assert oct(ca_key.stat().st_mode & 0o777) == "0o600"
    crt, key = pki.issue_server_cert(d, "registry", ["10.250.0.1"], ["bastion.gpu-install.lab"])
    cert = _cert(crt)
    assert _sans(cert) == {"10.250.0.1", "bastion.gpu-install.lab"}
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "bastion.gpu-install.lab"
    cert.verify_directly_issued_by(_cert(ca))
    serial = cert.serial_number
    assert _cert(pki.issue_server_cert(d, "registry", ["10.250.0.1"], ["bastion.gpu-install.lab"])[0]).serial_number == serial
    moved = _cert(pki.issue_server_cert(d, "registry", ["10.250.7.1"], ["bastion.gpu-install.lab"])[0])
    assert moved.serial_number != serial and "10.250.7.1" in _sans(moved)  # the subnet changed: re-issued


def test_client_certificate_names_user_and_group(tmp_path):
    d = tmp_path / "pki"
    ca, _ = pki.ensure_ca(d, "some-ca")
    cert_pem, key_pem = pki.client_cert(d, "system:node:n1", "system:nodes")
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:n1"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:nodes"]
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
    cert.verify_directly_issued_by(_cert(ca))
    key = serialization.load_pem_private_key(key_pem.encode(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_keypair_is_made_once(tmp_path):
    key, pub = pki.ensure_keypair(tmp_path / "pki", "sa")
    first = pub.read_text()
    assert pki.ensure_keypair(tmp_path / "pki", "sa") == (key, pub) and pub.read_text() == first
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    assert serialization.load_pem_public_key(pub.read_bytes()).public_numbers() == loaded.public_key().public_numbers()
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_control_plane_pki_serves_the_apiserver_names(tmp_path):
    cp = ControlPlane(tmp_path / "lab", progress=lambda m: None)
    d = cp._pki()
    assert {p.name for p in d.iterdir()} >= {"ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "sa.key", "sa.pub"}
    ca = _cert(d / "ca.crt")
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-install-lab-kubernetes-ca"
    api = _cert(d / "apiserver.crt")
    assert api.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kube-apiserver"
    assert _sans(api) == {"127.0.0.1", "10.96.0.1", "localhost", "kubernetes", "kubernetes.default",
                          "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}
    peer = _tls_handshake(d / "apiserver.crt", d / "apiserver.key", d / "ca.crt")
    assert ("IP Address", "127.0.0.1") in peer["subjectAltName"]
    again = ControlPlane(tmp_path / "lab", progress=lambda m: None)._pki()
    assert _cert(again / "apiserver.crt").serial_number == api.serial_number  # made once, kept


def test_registry_certificate_passes_strict_tls(tmp_path):
    d = tmp_path / "pki"
    ca, _ = pki.ensure_ca(d)
    crt, key = pki.issue_server_cert(d, "registry", ["127.0.0.1"], ["bastion.gpu-install.lab"])
    peer = _tls_handshake(crt, key, ca)
    assert ("DNS", "bastion.gpu-install.lab") in peer["subjectAltName"]
