"""STAND-IN upstream package repositories for the mirror tests, served over HTTP on 127.0.0.1 by a thread: what
gpu_install_lab.upstream.package_repository builds (a real apt archive whose InRelease a STAND-IN upstream key signs, a
real rpm repository whose packages that key signs, NVIDIA's toolkit chain under its real names at the given versions;
optionally rpm-unsigned/, a version nobody signed)."""

from __future__ import annotations

import functools
import http.server
import threading
from dataclasses import dataclass
from pathlib import Path

from gpu_install_lab.upstream import gpg, package_repository

__all__ = ["Upstreams", "gpg", "serve", "start"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@dataclass
class Upstreams:
    url: str  # http://127.0.0.1:PORT
    key: Path  # the upstream public key (armored)
    www: Path
    server: http.server.ThreadingHTTPServer

    @property
    def apt(self) -> str:
        return f"{self.url}/apt"

    @property
    def rpm(self) -> str:
        return f"{self.url}/rpm"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: what building and resolving the STAND-IN package repositories needs on this machine (scripts/apt-packages.txt)
TOOLS = ("apt-get", "apt-ftparchive", "dnf", "rpm", "rpmsign", "createrepo_c", "gpg", "dpkg-deb", "rpmbuild")


def require_tools() -> None:
    """Skip (fail in CI) a test whose machine lacks a tool of TOOLS."""
    import shutil

    from tests.integration.conftest import _skip_or_fail

    for tool in TOOLS:
        if shutil.which(tool) is None:
            _skip_or_fail(f"{tool} missing (scripts/apt-packages.txt)")


def unauthorized(handler: http.server.BaseHTTPRequestHandler, realm: str) -> None:
    """A 401 asking for Basic credentials: what a repository behind a login answers a request without them."""
    handler.send_response(401)
    handler.send_header("WWW-Authenticate", f'Basic realm="{realm}"')
    handler.send_header("Content-Length", "0")
    handler.end_headers()


def serve(directory: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    """Serve a directory on 127.0.0.1; (url, server)."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(directory)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", httpd


def start(root: Path, versions: tuple[str, ...], unsigned: str | None = None) -> Upstreams:
    www = root / "www"
    key = package_repository(www, versions, unsigned)
    url, httpd = serve(www)
    return Upstreams(url, key, www, httpd)
