"""Upstream package repositories that need a login (mirror.packageRepositories.<os>[].credentials), through the
package part of `mirror pull` (installer/mirror/packages/resolve.py) against real parts: STAND-IN apt and rpm
repositories (tests/integration/package_upstreams.py: a real apt archive whose InRelease a STAND-IN key signs, a real
rpm repository whose packages it signs) served by a thread of this test that answers 401 without the right HTTP Basic
credentials, resolved and fetched by the real apt and dnf of this machine through wrappers that record every call's
command line, environment and which files of its work directory hold the password (with their modes).

What must hold: the pull succeeds with the credentials and fails with 401 without them; the password is in no apt or
dnf command line or environment, in no file but the 0600 auth.conf (apt) and .repo file (dnf), in no progress line
and in no file of the bundle (the signed lock included); the Basic header goes to URLs under the repository only,
never to another host, port or path a redirect leads to."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from tests.integration import package_upstreams

USER = "pkg-reader"
PASSWORD = "Pkg-Login-Canary-93be"
CREDS = {"usernameEnv": "PKG_REPO_USER", "passwordEnv": "PKG_REPO_PASSWORD"}
OSES = ("debian12", "rocky9.4")
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


class _BasicAuth(http.server.SimpleHTTPRequestHandler):
    """Static files for a request with the right Basic credentials, 401 otherwise; every Authorization header seen
    is recorded (path, header) in `seen`. /redirect/<port>/<path> answers 302 to http://127.0.0.1:<port>/<path>."""

    seen: list[tuple[str, str | None]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/open/"):  # what a redirect may lead to: served to anyone
            self.path = self.path[len("/open"):]
            return super().do_GET()
        if self.headers.get("Authorization") != BASIC:
            package_upstreams.unauthorized(self, "packages")
            return
        if self.path.startswith(("/rpm/redirect/", "/rpm/inside/")):
            _, _, kind, port, rest = self.path.split("/", 4)
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{port}/{rest}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


def _serve(www: Path) -> tuple[str, http.server.ThreadingHTTPServer, list[tuple[str, str | None]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_BasicAuth,), {"seen": seen})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(www)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{httpd.server_address[1]}", httpd, seen


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """(url, key, www, seen): the STAND-IN repositories at URL/apt and URL/rpm, behind Basic authentication."""
    package_upstreams.require_tools()
    root = tmp_path_factory.mktemp("pkg-login")
    www = root / "www"
    key = package_upstreams.package_repository(www, ("1.17.4",))
    url, httpd, seen = _serve(www)
    try:
        yield url, key, www, seen
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def logged_tools(tmp_path, monkeypatch) -> Path:
    """apt-get and dnf first on PATH: wrappers around the real ones that append each call's argv, environment and the
    files of its work directory holding the password (mode, path; before and after the call) to the returned log."""
    log, shims = tmp_path / "tools.log", tmp_path / "shims"
    shims.mkdir()
    needle = tmp_path / "needle"  # grep's pattern from a file: the password is not on grep's command line either
    needle.write_text(PASSWORD + "\n")
    for name in ("apt-get", "dnf"):
        real = shutil.which(name)
        shim = shims / name
        shim.write_text(f"""#!/bin/sh
work=""
[ -n "$APT_CONFIG" ] && work=$(dirname "$APT_CONFIG")
for a in "$@"; do case "$a" in --config=*) work=$(dirname "${{a#--config=}}");; esac; done
scan() {{ [ -n "$work" ] && grep -rlF -f {needle} "$work" | while read -r f; do
  echo "FILE $(stat -c %a "$f") $f"; done; }}
{{ echo "ARGV {name} $*"; env | sed 's/^/ENV /'; scan; }} >> {log}
{real} "$@"
rc=$?
scan >> {log}
exit $rc
""")
        shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return log


def _site(tmp: Path, url: str, key: Path, login: bool) -> dict:
    extra = {"credentials": CREDS} if login else {}
    return {"operator": {"version": "v24.9.2"}, "registry": {"host": "127.0.0.1:9"},
            # preinstalled: the toolkit's packages alone (operator mode adds its driver container's packages)
            "driver": {"mode": "preinstalled"},
            "toolkit": {"mode": "host", "version": "1.17.4"},
            "mirror": {"packageRepositories": {
                "debian12": [{"url": f"{url}/apt", "suite": "stable", "key": str(key), **extra}],
                "rocky9.4": [{"url": f"{url}/rpm", "key": str(key), **extra}]}}}


def _pull(site: dict, tmp: Path, bundle: Path) -> tuple[list[str], BaseException | None, dict]:
    """The package part of `mirror pull` (the image part with no images writes the lock's header), lock signed."""
    from installer.config import parse_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import images, packages
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    plan = resolve(parse_site(site), Options(os_tags=OSES))
    lines: list[str] = []
    images.pull(plan, [], bundle, finish=False)
    failure = None
    try:
        packages.check_sources(plan.site, plan.artifacts(()).packages)
        packages.pull(plan.site, plan.artifacts(()).packages, bundle, say=lines.append)
    except packages.PackageFailures as exc:
        failure = exc
    finally:
        lock = lockfile.finish(bundle, load_or_create(tmp / "key-home"))
    return lines, failure, lock


def test_apt_and_dnf_pull_with_a_login_and_the_password_stays_in_0600_files(upstream, tmp_path, logged_tools,
                                                                             monkeypatch):
    url, key, _, seen = upstream
    # without credentials the repositories refuse both tools (401): what follows is not a pull that needed none
    seen.clear()
    lines, failure, lock = _pull(_site(tmp_path, url, key, login=False), tmp_path, tmp_path / "b0")
    assert failure is not None and lock["complete"] is False
    errors = {f["ref"].split(" ")[0]: f["error"] for f in lock["failed"]}
    assert "401  Unauthorized" in errors["debian12"], errors  # dnf says only that repomd.xml could not be had
    assert "Cannot download repomd.xml" in errors["rocky9.4"], errors
    assert ("/rpm/repodata/repomd.xml", None) in seen and not [a for _, a in seen if a], seen

    monkeypatch.setenv("PKG_REPO_USER", USER)
    monkeypatch.setenv("PKG_REPO_PASSWORD", PASSWORD)
    logged_tools.write_text("")
    bundle = tmp_path / "b1"
    lines, failure, lock = _pull(_site(tmp_path, url, key, login=True), tmp_path, bundle)
    assert failure is None, failure.message
    assert lock["complete"] is True and lock["failed"] == []
    names = {(e["os"], e["name"]) for e in lock["packages"] if not e.get("key")}
    assert {n for o, n in names if o == "debian12"} >= {"nvidia-container-toolkit", "libnvidia-container1"}
    assert {n for o, n in names if o == "rocky9.4"} >= {"nvidia-container-toolkit", "libnvidia-container1"}

    log = logged_tools.read_text()
    calls = [ln for ln in log.splitlines() if ln.startswith("ARGV ")]
    assert any(c.startswith("ARGV apt-get update") for c in calls) and any(c.startswith("ARGV dnf ") for c in calls)
    # in no command line, no environment (the variables are dropped: not even their names reach the tools)
    assert not [ln for ln in log.splitlines() if ln.startswith(("ARGV ", "ENV ")) and PASSWORD in ln]
    assert "ENV PKG_REPO_PASSWORD=" not in log and "ENV PKG_REPO_USER=" not in log
    # in exactly apt's auth.conf and dnf's .repo file of the work directories, both 0600
    files = {ln.split(" ", 2)[2]: ln.split(" ", 2)[1] for ln in log.splitlines() if ln.startswith("FILE ")}
    assert {Path(f).name for f in files} == {"auth.conf", "upstream0.repo"}, files
    assert set(files.values()) == {"600"}, files
    # in no progress line, no file of the bundle (the signed lock included), no file left anywhere of this test
    assert PASSWORD not in "\n".join(lines)
    left = [p for p in tmp_path.rglob("*") if p.is_file() and p.name not in ("needle", "tools.log")
            and PASSWORD.encode() in p.read_bytes()]
    assert left == [], left
    assert not [f for f in files if Path(f).exists()], "a work directory outlived the pull"


def test_a_wrong_password_fails_unshown(upstream, tmp_path, logged_tools, monkeypatch):
    url, key, _, _ = upstream
    wrong = "Wrong-Pkg-Pw-0d17"
    monkeypatch.setenv("PKG_REPO_USER", USER)
    monkeypatch.setenv("PKG_REPO_PASSWORD", wrong)
    lines, failure, lock = _pull(_site(tmp_path, url, key, login=True), tmp_path, tmp_path / "b")
    assert failure is not None and lock["complete"] is False
    assert {f["ref"].split(" ")[0] for f in lock["failed"]} == set(OSES), lock["failed"]
    text = "\n".join([*lines, failure.message, (tmp_path / "b" / "bundle.lock.json").read_text(),
                      *[ln for ln in logged_tools.read_text().splitlines() if ln.startswith(("ARGV ", "ENV "))]])
    assert wrong not in text


def test_fetch_sends_the_login_under_the_repository_only(upstream, tmp_path):
    """A redirect from inside the repository to another port (another server), or to a path of the same server
    outside the repository, is followed without the Authorization header; the repository's own URLs get it."""
    from installer.mirror.common import fetch

    url, _, www, seen = upstream
    other_www = tmp_path / "other"
    other_www.mkdir()
    rpm = next((www / "rpm").glob("*.rpm"))
    shutil.copy(rpm, other_www / rpm.name)
    other, other_httpd, other_seen = _serve(other_www)
    port = url.rsplit(":", 1)[1]
    login = [(f"{url}/rpm", USER, PASSWORD)]
    try:
        # under the repository: the header goes with the first request
        seen.clear()
        fetch(f"{url}/rpm/{rpm.name}", tmp_path / "a.rpm", None, login)
        assert seen == [(f"/rpm/{rpm.name}", BASIC)]
        # a redirect to another server: followed (it serves anyone), the header not sent there
        other_port = other.rsplit(":", 1)[1]
        fetch(f"{url}/rpm/redirect/{other_port}/open/{rpm.name}", tmp_path / "b.rpm", None, login)
        assert (tmp_path / "b.rpm").read_bytes() == rpm.read_bytes()
        assert other_seen == [(f"/open/{rpm.name}", None)], other_seen
        # a redirect to the same server, outside the repository's path: no header there either
        seen.clear()
        fetch(f"{url}/rpm/inside/{port}/open/rpm/{rpm.name}", tmp_path / "c.rpm", None, login)
        assert seen == [(f"/rpm/inside/{port}/open/rpm/{rpm.name}", BASIC), (f"/open/rpm/{rpm.name}", None)], seen
        # a sibling path that merely starts with the repository's ('/rpmx' for '/rpm') gets no header
        seen.clear()
        with pytest.raises(OSError, match="401"):
            fetch(f"{url}/rpmx/{rpm.name}", tmp_path / "d.rpm", None, login)
        assert seen == [(f"/rpmx/{rpm.name}", None)], seen
    finally:
        other_httpd.shutdown()
        other_httpd.server_close()


def test_the_plan_shows_no_password(upstream, tmp_path, cli, monkeypatch):
    url, key, _, _ = upstream
    monkeypatch.setenv("PKG_REPO_USER", USER)
    monkeypatch.setenv("PKG_REPO_PASSWORD", PASSWORD)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(_site(tmp_path, url, key, login=True)))
    for fmt in ("text", "json"):
        rc, out, err = cli("mirror", "plan", "-s", site, "--os", OSES[0], "--os", OSES[1], "--format", fmt)
        assert rc == 0, err
        assert PASSWORD not in out + err and "nvidia-container-toolkit" in out
