"""STAND-IN upstream package repositories for the mirror tests: a real apt archive (pool + dists/stable, Release signed
as InRelease by an "upstream" OpenPGP key) and a real rpm repository (createrepo_c, every package signed by that key
with rpmsign), holding the lab's STAND-IN NVIDIA container toolkit chain (gpu_install_lab.packages.
standin_toolkit_chain: NVIDIA's names and dependencies) at two versions, served over HTTP on 127.0.0.1 by a thread.
Optionally a second rpm repository, rpm-unsigned/, with a version nobody signed, for the refusal tests."""

from __future__ import annotations

import http.server
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

UPSTREAM_KEY_NAME = "gpu-install test upstream"


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


def gpg(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["gpg", "--batch", "--quiet", "--no-tty", "--homedir", str(home), *argv], input=stdin,
                          capture_output=True, text=True, check=True, timeout=120)


def new_key(home: Path, name: str) -> Path:
    """A sign-only RSA key named `name` in a new GnuPG home; its armored public key file."""
    home.mkdir(parents=True, mode=0o700)
    gpg(home, "--gen-key", stdin=f"%no-protection\nKey-Type: RSA\nKey-Length: 2048\nKey-Usage: sign\n"
                                 f"Name-Real: {name}\nExpire-Date: 0\n%commit\n")
    pub = home.parent / f"{home.name}.asc"
    pub.write_text(gpg(home, "--armor", "--export", name).stdout)
    return pub


def apt_index(root: Path, home: Path, suite: str = "stable") -> None:
    dist = root / "dists" / suite
    binary = dist / "main" / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = subprocess.run(["apt-ftparchive", "packages", "pool"], cwd=root, capture_output=True, text=True,
                              check=True).stdout
    (binary / "Packages").write_text(packages)
    release = subprocess.run(["apt-ftparchive", "-o", f"APT::FTPArchive::Release::Suite={suite}", "-o",
                              f"APT::FTPArchive::Release::Codename={suite}", "-o",
                              "APT::FTPArchive::Release::Components=main", "-o",
                              "APT::FTPArchive::Release::Architectures=amd64", "release", "."], cwd=dist,
                             capture_output=True, text=True, check=True).stdout
    (dist / "Release").write_text(release)
    (dist / "InRelease").unlink(missing_ok=True)
    gpg(home, "--clearsign", "--local-user", UPSTREAM_KEY_NAME, "--output", str(dist / "InRelease"),
        str(dist / "Release"))


def rpm_sign(home: Path, rpms: list[Path]) -> None:
    subprocess.run(["rpmsign", "--addsign", "--define", f"_gpg_name {UPSTREAM_KEY_NAME}", "--define",
                    "__gpg /usr/bin/gpg", "--define", f"_gpg_path {home}", *map(str, rpms)], check=True,
                   capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                   env={**os.environ, "GNUPGHOME": str(home)})


def start(root: Path, versions: tuple[str, ...], unsigned: str | None = None) -> Upstreams:
    """Build the stand-in upstreams under root (the chain at each version; with `unsigned`, that version's rpms
    unsigned in rpm-unsigned/) and serve them."""
    from gpu_install_lab.packages import standin_toolkit_chain

    home = root / "upstream-gnupg"
    key = new_key(home, UPSTREAM_KEY_NAME)
    www = root / "www"
    pool = www / "apt" / "pool"
    pool.mkdir(parents=True)
    (www / "rpm").mkdir()
    for v in versions:
        debs, rpms = standin_toolkit_chain(v)
        for d in debs:
            shutil.copy(d, pool / d.name)
        rpm_sign(home, [Path(shutil.copy(r, www / "rpm" / r.name)) for r in rpms])
    apt_index(www / "apt", home)
    subprocess.run(["createrepo_c", "--quiet", str(www / "rpm")], check=True, timeout=120)
    if unsigned:  # a repository of its own, rpm-unsigned/, whose packages nobody signed
        (www / "rpm-unsigned").mkdir()
        for r in standin_toolkit_chain(unsigned)[1]:
            shutil.copy(r, www / "rpm-unsigned" / r.name)
        subprocess.run(["createrepo_c", "--quiet", str(www / "rpm-unsigned")], check=True, timeout=120)
    handler = lambda *a, **kw: _Quiet(*a, directory=str(www), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return Upstreams(f"http://127.0.0.1:{httpd.server_address[1]}", key, www, httpd)


def serve(directory: Path) -> tuple[str, http.server.ThreadingHTTPServer]:
    """Serve a directory (a published site repository) on 127.0.0.1; (url, server)."""
    handler = lambda *a, **kw: _Quiet(*a, directory=str(directory), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", httpd
