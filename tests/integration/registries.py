"""Real registries for the mirror tests: Debian's docker-registry on a loopback port, TLS from a test CA, optional
htpasswd auth; and the digest of a manifest as a registry serves it (skopeo inspect --raw)."""

from __future__ import annotations

import hashlib
import http.server
import socket
import subprocess
import time
from pathlib import Path

import yaml


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(root: Path, name: str, cert: Path, key: Path, htpasswd: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start registry `name` with its data under root/<name>-data; (process, "127.0.0.1:PORT") once it listens.
    The caller terminates the process."""
    port = free_port()
    config: dict = {"version": 0.1, "log": {"level": "error", "accesslog": {"disabled": True}},
                    "storage": {"filesystem": {"rootdirectory": str(root / f"{name}-data")},
                                "delete": {"enabled": True}},
                    "http": {"addr": f"127.0.0.1:{port}", "secret": "test-" + name,
                             "tls": {"certificate": str(cert), "key": str(key)}}}
    if htpasswd:
        config["auth"] = {"htpasswd": {"realm": "test", "path": str(htpasswd)}}
    (root / f"{name}.yml").write_text(yaml.safe_dump(config))
    log = open(root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(["docker-registry", "serve", str(root / f"{name}.yml")], stdout=log, stderr=log)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.terminate()
                raise AssertionError(f"{name} registry did not start: {(root / f'{name}.log').read_text()}") from None
            time.sleep(0.05)
    return proc, f"127.0.0.1:{port}"


def raw_digest(ref: str, certs: Path, *extra: str) -> str:
    out = subprocess.run(["skopeo", "inspect", "--raw", "--cert-dir", str(certs), *extra, f"docker://{ref}"],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    return "sha256:" + hashlib.sha256(out.stdout).hexdigest()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def serve_https(directory: Path, cert: Path, key: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A static HTTPS file server of directory on a loopback port, in a thread: (server, "https://127.0.0.1:PORT").
    The caller shuts it down."""
    import functools
    import ssl
    import threading

    handler = functools.partial(_Quiet, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"https://127.0.0.1:{httpd.server_address[1]}"


def standin_chart_repo(directory: Path, url: str, version: str) -> Path:
    """A chart repository in directory (served at url) holding a STAND-IN gpu-operator chart at version (`helm
    create` + `helm package`: a chart, not the GPU Operator's), with the index.yaml `helm repo index` writes."""
    from installer.tools import ensure_helm

    helm = str(ensure_helm(progress=lambda m: None))
    import tempfile

    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="standin-chart-") as src:
        subprocess.run([helm, "create", f"{src}/gpu-operator"], check=True, capture_output=True, timeout=60)
        subprocess.run([helm, "package", f"{src}/gpu-operator", "--version", version, "-d", str(directory)],
                       check=True, capture_output=True, timeout=60)
    subprocess.run([helm, "repo", "index", str(directory), "--url", url], check=True, capture_output=True, timeout=60)
    return directory / f"gpu-operator-{version}.tgz"
