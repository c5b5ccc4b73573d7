"""The chart and the runfile through `mirror pull` / `mirror push` (installer/mirror/charts.py), against real parts:
an "upstream" HTTPS chart repository (a thread of this test, TLS from a throwaway CA) serving the REAL GPU Operator
v24.9.2 chart from ../shared/upstream/charts with the index.yaml `helm repo index` writes, plus the STAND-IN driver
runfile as the site's file mirror; and the "site" registry (Debian's docker-registry, TLS, htpasswd auth with a
canary password that must never show up). The image part of the bundle is empty here (tests/integration/
test_mirror_images.py carries images); push runs through the real CLI.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import shutil
import ssl
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.conftest import VENV_BIN, _skip_or_fail
from tests.integration.registries import serve

CHARTS = ROOT.parent / "shared" / "upstream" / "charts"
VERSION = "v24.9.2"
CANARY_USER = "charts-canary-user"
CANARY = "Chart-Canary-Pw-41b7"
RUNFILE_VERSION = "535.54.03"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    for tool in ("docker-registry",):
        if shutil.which(tool) is None:
            _skip_or_fail(f"{tool} missing (scripts/apt-packages.txt)")
    src = CHARTS / f"gpu-operator-{VERSION}.tgz"
    if not src.is_file():
        _skip_or_fail(f"{src} is not there (../shared/upstream/charts)")
    import bcrypt

    from gpu_install_lab.packages import standin_runfile
    from gpu_install_lab.pki import ensure_ca, issue_server_cert
    from installer.tools import ensure_helm

    root = tmp_path_factory.mktemp("charts")
    ca, _ = ensure_ca(root / "pki", cn="gpu-install chart test CA")
    cert, key = issue_server_cert(root / "pki", "charts", ["127.0.0.1"], ["localhost"])
    # the upstream chart repository and file mirror
    www = root / "www"
    (www / "charts").mkdir(parents=True)
    (www / "files").mkdir()
    shutil.copy(src, www / "charts" / src.name)
    runfile = www / "files" / f"NVIDIA-Linux-x86_64-{RUNFILE_VERSION}.run"
    shutil.copy(standin_runfile(RUNFILE_VERSION), runfile)
    handler = lambda *a, **kw: _Quiet(*a, directory=str(www), **kw)  # noqa: E731
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    url = f"https://127.0.0.1:{httpd.server_address[1]}"
    subprocess.run([str(ensure_helm()), "repo", "index", str(www / "charts"), "--url", f"{url}/charts"], check=True,
                   capture_output=True, timeout=60)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    htpasswd = root / "htpasswd"
    htpasswd.write_text(f"{CANARY_USER}:{bcrypt.hashpw(CANARY.encode(), bcrypt.gensalt(4)).decode()}\n")
    reg_proc, reg = serve(root, "site", cert, key, htpasswd)
    site = {"operator": {"version": VERSION},
            "registry": {"host": reg, "prefix": "mirror", "ca": str(ca),
                         "pullSecret": {"name": "site-registry", "usernameEnv": "CHART_TEST_USER",
                                        "passwordEnv": "CHART_TEST_PASSWORD"}},
            "driver": {"mode": "runfile", "runfile": f"{url}/files/{runfile.name}",
                       "runfileSha256": hashlib.sha256(runfile.read_bytes()).hexdigest()},
            "toolkit": {"mode": "operator"},
            "mirror": {"chartRepository": f"{url}/charts", "upstreamCa": str(ca),
                       # the connected side's bundle key, pinned as the air-gapped side would (relative to the site)
                       "trustedKeys": ["connected-key/signing-key.pub.pem"]}}
    site_file = root / "site.yaml"
    site_file.write_text(yaml.safe_dump(site))
    try:
        yield {"root": root, "site": site_file, "src": src, "runfile": runfile, "ca": ca, "reg": reg, "url": url,
               "www": www, "key_home": root / "connected-key"}
    finally:
        httpd.shutdown()
        reg_proc.terminate()
        reg_proc.wait(timeout=10)


def _plan(env, **override):
    from installer.config import load_site
    from installer.plan import Options, resolve

    return resolve(load_site(env["site"], [f"{k}={v}" for k, v in override.items()]), Options(os_tags=("ubuntu22.04",)))


def _pull(env, bundle: Path, **override) -> list[str]:
    """The chart/file part of `mirror pull` (the image part with no images: it writes the lock's header)."""
    from installer.mirror import bundle as lockfile
    from installer.mirror import charts, images
    from installer.signing import load_or_create

    plan = _plan(env, **override)
    art = plan.artifacts(())
    lines: list[str] = []
    images.pull(plan, [], bundle, finish=False)
    try:
        charts.pull(plan, art.charts, art.files, bundle, say=lines.append)
    finally:
        lockfile.finish(bundle, load_or_create(env["key_home"]))
    return lines


def _push(env, bundle: Path, *extra: str, password: str = CANARY) -> subprocess.CompletedProcess:
    import os

    e = {**os.environ, "CHART_TEST_USER": CANARY_USER, "CHART_TEST_PASSWORD": password}
    return subprocess.run([str(VENV_BIN / "gpu-install"), "mirror", "push", str(bundle), "-s", str(env["site"]),
                           *extra], capture_output=True, text=True, env=e, timeout=300)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pull_push_repo_dir_and_back(env, tmp_path):
    from installer.mirror import bundle as lockfile
    from installer.tools import ensure_helm

    bundle = tmp_path / "bundle"
    lines = _pull(env, bundle)
    tgz = bundle / "charts" / env["src"].name
    assert _sha(tgz) == _sha(env["src"]), "the bundle's chart is not the served file"
    assert _sha(bundle / "files" / env["runfile"].name) == _sha(env["runfile"])
    lock = lockfile.read_lock(bundle)
    assert lock["complete"] is True and lock["failed"] == []
    (chart,) = lock["charts"]
    assert chart == {"name": "gpu-operator", "version": VERSION, "repository": f"{env['url']}/charts",
                     "file": f"charts/{env['src'].name}", "sha256": _sha(env["src"]), "size": env["src"].stat().st_size}
    (runfile,) = lock["files"]
    assert runfile["file"] == f"files/{env['runfile'].name}" and runfile["sha256"] == _sha(env["runfile"])
    assert any("helm pull" in ln for ln in lines), lines
    # a second pull fetches nothing
    assert _pull(env, bundle) == [f"chart gpu-operator {VERSION}: already in the bundle",
                                  f"file {env['runfile'].name}: already in the bundle"]

    repo = tmp_path / "repo"
    proc = _push(env, bundle, "--repo-dir", str(repo))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ref = f"oci://{env['reg']}/mirror/charts/gpu-operator"
    assert f"chart {ref}:{VERSION} pushed" in proc.stderr, proc.stderr
    assert f"\noperator.chartSha256: {_sha(env['src'])} (with operator.chart set to this bundle's copy" in proc.stderr
    for where in (proc.stdout, proc.stderr, *(p.read_text(errors="replace") for p in bundle.rglob("*.json"))):
        assert CANARY not in where and base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode() not in where
    # the registry serves exactly the bundle's bytes (pulled back with helm, logged in from a config of our own)
    cfg = tmp_path / "helm-registry.json"
    cfg.write_text(json.dumps({"auths": {env["reg"]: {"auth": base64.b64encode(
        f"{CANARY_USER}:{CANARY}".encode()).decode()}}}))
    back = tmp_path / "back"
    back.mkdir()
    out = subprocess.run([str(ensure_helm()), "pull", ref, "--version", VERSION, "--destination", str(back),
                          "--ca-file", str(env["ca"]), "--registry-config", str(cfg)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert _sha(next(back.glob("*.tgz"))) == _sha(env["src"])
    # the static chart repository: index.yaml lists the chart, helm pulls it from a file:// served copy
    index = yaml.safe_load((repo / "charts" / "index.yaml").read_text())
    assert [e["version"] for e in index["entries"]["gpu-operator"]] == [VERSION]
    assert _sha(repo / "charts" / env["src"].name) == _sha(env["src"])
    assert (repo / "files" / "SHA256SUMS").read_text() == f"{_sha(env['runfile'])}  {env['runfile'].name}\n"
    # a second push: nothing pushed again
    again = _push(env, bundle, "--repo-dir", str(repo))
    assert again.returncode == 0 and f"chart {ref}:{VERSION} already there" in again.stderr, again.stderr
    # a wrong password: the registry refuses the chart, exit 4 naming it, the password nowhere
    refused = _push(env, bundle, password="Wrong-Canary-Pw-9d2e")
    assert refused.returncode == 4 and "chart gpu-operator" in refused.stderr, refused.stdout + refused.stderr
    assert "Wrong-Canary-Pw-9d2e" not in refused.stdout + refused.stderr


def test_tampered_chart_or_runfile_refused_before_anything_is_pushed(env, tmp_path):
    bundle = tmp_path / "bundle"
    _pull(env, bundle)
    tgz = bundle / "charts" / env["src"].name
    data = bytearray(tgz.read_bytes())
    data[100] ^= 0xFF
    tgz.write_bytes(bytes(data))
    repo = tmp_path / "repo"
    proc = _push(env, bundle, "--repo-dir", str(repo))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"charts/{env['src'].name}: sha256" in proc.stderr and "the lock says" in proc.stderr, proc.stderr
    assert not repo.exists()
    tgz.unlink()
    proc = _push(env, bundle)
    assert proc.returncode == 2 and "is missing" in proc.stderr, proc.stderr


def test_missing_chart_version_and_bad_runfile_checksum_leave_the_bundle_incomplete(env, tmp_path):
    from installer.mirror import bundle as lockfile
    from installer.mirror import charts

    bundle = tmp_path / "bundle"
    with pytest.raises(charts.ChartFailures) as err:
        _pull(env, bundle, **{"operator.version": "v24.6.2", "driver.runfileSha256": "a" * 64})
    msg = err.value.message
    assert "gpu-operator" in msg and "v24.6.2" in msg, msg
    assert "sha256" in msg and "the site file says " + "a" * 64 in msg, msg
    lock = lockfile.read_lock(bundle)
    assert lock["complete"] is False and {f["kind"] for f in lock["failed"]} == {"chart", "file"}
    assert not list((bundle / "files").glob("*.run"))
    proc = _push(env, bundle)
    assert proc.returncode == 2 and "incomplete" in proc.stderr, proc.stderr



def test_the_bundles_chart_is_bound_to_the_signed_lock_at_apply(env, tmp_path):
    """The bundle's chart as push names it for apply (operator.chart, with operator.chartSha256 the sha256 the signed
    lock records): a chart swapped in the bundle afterwards is refused by config check (the check apply and operator
    install make first), also without operator.chartSha256 (the bundle's lock, verified with the pinned key)."""
    import io
    import os
    import tarfile

    from installer.mirror import bundle as lockfile

    bundle = tmp_path / "bundle"
    _pull(env, bundle)
    (entry,) = lockfile.signed_lock(bundle, [env["key_home"] / "signing-key.pub.pem"])["charts"]
    tgz = bundle / entry["file"]
    sha = entry["sha256"]
    assert sha == _sha(env["src"])
    data = yaml.safe_load(env["site"].read_text())
    data["mirror"]["trustedKeys"] = [str(env["key_home"] / "signing-key.pub.pem")]
    e = {**os.environ, "CHART_TEST_USER": CANARY_USER, "CHART_TEST_PASSWORD": CANARY}

    def check(**operator_fields) -> subprocess.CompletedProcess:
        site = tmp_path / "site.yaml"
        site.write_text(yaml.safe_dump({**data, "operator": {"version": VERSION, **operator_fields}}))
        return subprocess.run([str(VENV_BIN / "gpu-install"), "config", "check", "-s", str(site)],
                              capture_output=True, text=True, env=e, timeout=120)

    for fields in ({"chart": str(tgz), "chartSha256": sha}, {"chart": str(tgz)}):
        ok = check(**fields)
        assert ok.returncode == 0, ok.stdout + ok.stderr
    # the bundle's chart swapped: one template more
    buf = io.BytesIO()
    with tarfile.open(tgz, "r:gz") as src, tarfile.open(fileobj=buf, mode="w:gz") as out:
        for m in src.getmembers():
            out.addfile(m, src.extractfile(m) if m.isfile() else None)
        extra = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: not-reviewed}\n"
        info = tarfile.TarInfo("gpu-operator/templates/not-reviewed.yaml")
        info.size = len(extra)
        out.addfile(info, io.BytesIO(extra))
    tgz.write_bytes(buf.getvalue())
    swapped = _sha(tgz)
    refused = check(chart=str(tgz), chartSha256=sha)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"has sha256 {swapped}, but operator.chartSha256 in the site file says {sha}" in refused.stderr, \
        refused.stderr
    refused = check(chart=str(tgz))
    assert refused.returncode == 2 and f"has sha256 {swapped}, but the signed lock of bundle" in refused.stderr, \
        refused.stderr
