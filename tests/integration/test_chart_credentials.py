"""A chart repository that needs a login (mirror.chartCredentials), through `mirror pull`'s chart step
(installer/mirror/charts.py) against real parts: an HTTP chart repository with Basic authentication (a thread of this
test) and Debian's docker-registry with htpasswd (an oci:// chart repository), both holding a STAND-IN gpu-operator
chart (`helm create` + `helm package`), pulled by the real helm through a wrapper that records every helm call's
command line, environment and the modes of the credential files in helm's temporary home.

What must hold: the chart is pulled; the password is in no helm command line or environment, in no progress line, in
no file of the bundle (the signed lock included); the credentials file helm reads is 0600."""

from __future__ import annotations

import base64
import http.server
import json
import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from tests.integration import package_upstreams
from tests.integration.conftest import _skip_or_fail
from tests.integration.registries import serve, standin_chart_repo

VERSION = "v24.9.2"
USER = "chart-reader"
PASSWORD = "Chart-Login-Canary-5e1d"
CREDS = {"usernameEnv": "CHART_REPO_USER", "passwordEnv": "CHART_REPO_PASSWORD"}


class _BasicAuth(http.server.SimpleHTTPRequestHandler):
    """Static files for a request with the right Basic credentials; 401 otherwise."""

    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != self.expected:
            package_upstreams.unauthorized(self, "charts")
            return
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def logged_helm(tmp_path, monkeypatch) -> Path:
    """GPU_INSTALL_HELM: a wrapper around the real helm that appends each call's argv, environment and the modes of
    the repositories file and registry config in helm's home to the returned log, then runs helm."""
    from installer.tools import ensure_helm

    real = ensure_helm(progress=lambda m: None)
    log = tmp_path / "helm.log"
    wrapper = tmp_path / "helm-logged"
    wrapper.write_text(f"""#!/bin/sh
{{ echo "ARGV $*"; env | sed 's/^/ENV /'
  for f in "$HELM_CONFIG_HOME/repositories.yaml" "$HELM_REGISTRY_CONFIG"; do
    [ -e "$f" ] && echo "MODE $(stat -c %a "$f") $f"
  done; }} >> {log}
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setenv("GPU_INSTALL_HELM", str(wrapper))
    return log


def _pull(site: dict, root: Path, bundle: Path) -> tuple[list[str], BaseException | None]:
    """The chart part of `mirror pull` (the image part with no images writes the lock's header), lock signed."""
    from installer.config import parse_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import charts, images
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    plan = resolve(parse_site(site), Options(os_tags=("ubuntu22.04",)))
    lines: list[str] = []
    images.pull(plan, [], bundle, finish=False)
    failure = None
    try:
        charts.pull(plan, plan.artifacts(()).charts[:1], [], bundle, say=lines.append)
    except charts.ChartFailures as exc:
        failure = exc
    finally:
        lockfile.finish(bundle, load_or_create(root / "key-home"))
    return lines, failure


def _nowhere(bundle: Path, lines: list[str], log: Path, secret: str = PASSWORD) -> None:
    text = log.read_text()
    assert "ARGV " in text, "helm was not called through the wrapper"
    assert secret not in text, "the password reached a helm command line or environment"
    assert secret not in "\n".join(lines)
    for path in bundle.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"the password is in {path}"


def test_an_http_chart_repository_with_a_login(tmp_path, logged_helm, monkeypatch):
    www = tmp_path / "www"
    handler = lambda *a, **kw: _BasicAuth(*a, directory=str(www), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    url = f"http://127.0.0.1:{httpd.server_address[1]}/charts"
    src = standin_chart_repo(www / "charts", url, VERSION)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    site = {"operator": {"version": VERSION}, "registry": {"host": "registry.example.com:5000"},
            "mirror": {"chartRepository": url, "chartCredentials": CREDS}}
    try:
        # the repository refuses a pull without the login: what follows is not a pull that needed none
        plain = {**site, "mirror": {"chartRepository": url}}
        lines, failure = _pull(plain, tmp_path, tmp_path / "b0")
        assert failure is not None and "401" in failure.message, (failure, lines)

        monkeypatch.setenv("CHART_REPO_USER", USER)
        monkeypatch.setenv("CHART_REPO_PASSWORD", PASSWORD)
        bundle = tmp_path / "b1"
        logged_helm.write_text("")
        lines, failure = _pull(site, tmp_path, bundle)
        assert failure is None, failure.message
        got = bundle / "charts" / src.name
        assert got.read_bytes() == src.read_bytes()
        assert (bundle / "bundle.lock.json").is_file()  # the signed lock, which _nowhere reads too
        _nowhere(bundle, lines, logged_helm)
        log = logged_helm.read_text()
        assert "ARGV repo update gpu-install-upstream" in log and "ARGV pull gpu-install-upstream/gpu-operator" in log
        assert "MODE 600 " in log and "repositories.yaml" in log and not any(
            ln.startswith("MODE ") and not ln.startswith("MODE 600 ") for ln in log.splitlines()), log

        # a wrong password: the pull fails, naming the chart; neither password shows anywhere
        monkeypatch.setenv("CHART_REPO_PASSWORD", "Wrong-Chart-Pw-77c1")
        logged_helm.write_text("")
        lines, failure = _pull(site, tmp_path, tmp_path / "b2")
        assert failure is not None and "gpu-operator" in failure.message
        _nowhere(tmp_path / "b2", [*lines, failure.message], logged_helm, "Wrong-Chart-Pw-77c1")

        # the variable unset: exit 2 naming it, before helm runs
        from installer.errors import ConfigError

        monkeypatch.delenv("CHART_REPO_PASSWORD")
        with pytest.raises(ConfigError, match="mirror.chartCredentials.passwordEnv: environment variable "
                                              "CHART_REPO_PASSWORD is not set"):
            _pull(site, tmp_path, tmp_path / "b3")
    finally:
        httpd.shutdown()


def test_an_oci_chart_repository_with_a_login(tmp_path, logged_helm, monkeypatch):
    if shutil.which("docker-registry") is None:
        _skip_or_fail("docker-registry missing (scripts/apt-packages.txt)")
    import bcrypt

    from gpu_install_lab.pki import ensure_ca, issue_server_cert
    from installer.tools import ensure_helm

    ca, _ = ensure_ca(tmp_path / "pki", cn="gpu-install chart login test CA")
    cert, key = issue_server_cert(tmp_path / "pki", "charts", ["127.0.0.1"], ["localhost"])
    htpasswd = tmp_path / "htpasswd"
    htpasswd.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
    proc, reg = serve(tmp_path, "upstream", cert, key, htpasswd)
    try:
        src = standin_chart_repo(tmp_path / "src", "http://unused.invalid", VERSION)
        cfg = tmp_path / "push-login.json"  # the test's own login, to put the chart there
        cfg.write_text(json.dumps({"auths": {reg: {"auth": base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()}}}))
        out = subprocess.run([str(ensure_helm()), "push", str(src), f"oci://{reg}/charts", "--ca-file", str(ca),
                              "--registry-config", str(cfg)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "HELM_CONFIG_HOME": str(tmp_path / "hc"),
                                  "HELM_CACHE_HOME": str(tmp_path / "hk")})
        assert out.returncode == 0, out.stderr
        monkeypatch.setenv("CHART_REPO_USER", USER)
        monkeypatch.setenv("CHART_REPO_PASSWORD", PASSWORD)
        logged_helm.write_text("")
        site = {"operator": {"version": VERSION}, "registry": {"host": "registry.example.com:5000"},
                "mirror": {"chartRepository": f"oci://{reg}/charts", "chartCredentials": CREDS, "upstreamCa": str(ca)}}
        bundle = tmp_path / "bundle"
        lines, failure = _pull(site, tmp_path, bundle)
        assert failure is None, failure.message
        assert (bundle / "charts" / src.name).read_bytes() == src.read_bytes()
        _nowhere(bundle, lines, logged_helm)
        log = logged_helm.read_text()
        modes = [ln for ln in log.splitlines() if ln.startswith("MODE ")]
        assert modes and all(ln.startswith("MODE 600 ") for ln in modes) and "registry/config.json" in log, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_credential_files_are_private():
    """login_files writes 0600 files, refusing one already there (O_EXCL: never a file planted before)."""
    import tempfile

    from installer.mirror import charts

    with tempfile.TemporaryDirectory() as tmp:
        env = {"HELM_CONFIG_HOME": f"{tmp}/config", "HELM_REGISTRY_CONFIG": f"{tmp}/config/registry/config.json"}
        secrets = charts.login_files("https://charts.example.com/x", (USER, PASSWORD), None, env)
        repo_file = Path(tmp) / "config" / "repositories.yaml"
        assert stat.S_IMODE(repo_file.stat().st_mode) == 0o600 and PASSWORD in secrets
        entry = yaml.safe_load(repo_file.read_text())["repositories"][0]
        assert (entry["name"], entry["url"], entry["username"], entry["password"]) == (
            "gpu-install-upstream", "https://charts.example.com/x", USER, PASSWORD)
        charts.login_files("oci://reg.example.com:5000/charts", (USER, PASSWORD), None, env)
        assert stat.S_IMODE(Path(env["HELM_REGISTRY_CONFIG"]).stat().st_mode) == 0o600
        with pytest.raises(FileExistsError):
            charts.login_files("https://charts.example.com/x", (USER, PASSWORD), None, env)
