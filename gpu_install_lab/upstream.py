"""The demo's STAND-IN "upstream" (the connected side of the air gap), on 127.0.0.1 only. scripts/demo runs it.

  serve   a STAND-IN for nvcr.io, registry.k8s.io, ...: one more Debian `docker-registry` on a loopback port, TLS from
          a demo CA of its own (DIR/pki/ca.crt, the site's mirror.upstreamCa); and a STAND-IN for NVIDIA's Helm
          repository: a plain-HTTP chart repository on another loopback port (DIR/charts: the chart .tgz and the
          index.yaml `helm repo index` writes; a thread of this process). Prints ONE line of JSON on stdout once both
          answer ({"registry", "charts", "ca", "pids", ...}), then serves until SIGTERM/SIGINT or until its parent
          (the demo) exits, and stops the registry before it exits itself: nothing is left running.
  seed    a STAND-IN image at the exact repository path and tag of every image the site deploys (the JSON of
          `gpu-install images --format json`), in the stand-in registry, at the path the site's mirror.upstream
          remaps each upstream registry to, copied with skopeo (after the first copy of each image every further
          reference is a manifest). Which one, by the release's catalog repository of the image:
            operator                          the STAND-IN GPU Operator (labtools/standin-gpu-operator)
            CUDA (operator.initContainer),    the lab's STAND-IN CUDA smoke image (gpu_install_lab/smoke_image.py:
            validator                         nvidia-smi -L, vectorAdd; built once and cached)
            dcgmExporter                      the STAND-IN dcgm-exporter (labtools/standin-dcgm-exporter)
            every other image                 a busybox placeholder that says so and sleeps (NFD, GFD, toolkit, ...)
          (gpu_install_lab/images.py); real-kubelet nodes run them.

With --toolkit VERSION, also STAND-IN upstream package repositories (package_repository(): a signed apt archive and a
signed rpm repository of NVIDIA's toolkit chain, STAND-INs under the real names) on a third loopback port.

The chart: the given .tgz or chart directory (NVIDIA's real chart of the release), or else (--standin-chart) the fixture chart
(tests/fixtures/charts/gpu-operator-fixture) packaged under the name and version `mirror pull` asks the repository for
(gpu-operator at the catalog's chart version for the release): a chart with the GPU Operator's values shape, NOT
NVIDIA's chart.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGTERM to this process when its parent exits (prctl PR_SET_PDEATHSIG): a stand-in never outlives the process
    that started it, even one killed with SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _say(msg: str) -> None:
    print(f"upstream STAND-IN: {msg}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


# ---------------------------------------------------------------- the chart


def chart_version(release: str) -> str:
    """The chart version the catalog records for the release (what `mirror pull` asks the repository for)."""
    from installer.catalog import Catalog

    chart = Catalog.default().get(release).raw.get("chart") or {}
    return str((chart.get("version") if isinstance(chart, dict) else None) or release)


def _helm() -> str:
    from installer.tools import ensure_helm

    return str(ensure_helm(progress=_say))


def _run(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"upstream STAND-IN: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")


def chart_repository(directory: Path, url: str, release: str, chart: Path, standin: bool) -> Path:
    """directory = a chart repository served at url holding gpu-operator at the release's chart version: chart (a
    .tgz, or a directory `helm package` packs), or with standin the chart directory packaged under that name and
    version (the STAND-IN fixture chart). Returns the .tgz."""
    from installer.mirror.charts import chart_identity

    version = chart_version(release)
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.tgz"):
        old.unlink()
    with tempfile.TemporaryDirectory(prefix="upstream-chart-") as tmp:
        if not standin and chart.is_file():
            tgz = directory / f"gpu-operator-{version}.tgz"
            shutil.copyfile(chart, tgz)
        else:
            src = chart
            if standin:  # the fixture chart under the name and version of the release's chart
                src = Path(tmp) / "gpu-operator"
                shutil.copytree(chart, src)
                meta = src / "Chart.yaml"
                text = re.sub(r"(?m)^name: .*$", "name: gpu-operator", meta.read_text())
                meta.write_text(re.sub(r"(?m)^version: .*$", f"version: {version}", text))
            _run(_helm(), "package", str(src), "--destination", str(directory))
            (tgz,) = directory.glob("*.tgz")
    name, got = chart_identity(tgz)
    if (name, got) != ("gpu-operator", version):
        raise SystemExit(f"upstream STAND-IN: {tgz} is chart {name} {got}, not gpu-operator {version}")
    _run(_helm(), "repo", "index", str(directory), "--url", url)
    return tgz


# ---------------------------------------------------------------- package repositories

UPSTREAM_KEY_NAME = "gpu-install STAND-IN upstream package key"


def gpg(home: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["gpg", "--batch", "--quiet", "--no-tty", "--homedir", str(home), *argv], input=stdin,
                          capture_output=True, text=True, check=True, timeout=120)


def new_key(home: Path, name: str) -> Path:
    """A sign-only RSA key named `name` in a new GnuPG home; its armored public key file (beside the home)."""
    home.mkdir(parents=True, mode=0o700)
    gpg(home, "--gen-key", stdin=f"%no-protection\nKey-Type: RSA\nKey-Length: 2048\nKey-Usage: sign\n"
                                 f"Name-Real: {name}\nExpire-Date: 0\n%commit\n")
    pub = home.parent / f"{home.name}.asc"
    pub.write_text(gpg(home, "--armor", "--export", name).stdout)
    return pub


def apt_index(root: Path, home: Path, suite: str = "stable") -> None:
    """root/dists/<suite>: Packages and Release (apt-ftparchive) over root/pool, Release signed as InRelease."""
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


def package_repository(directory: Path, versions: tuple[str, ...], unsigned: str | None = None) -> Path:
    """STAND-IN upstream package repositories for NVIDIA's container toolkit chain (gpu_install_lab.packages.
    standin_toolkit_chain, at each version): directory/apt (pool + dists/stable, InRelease signed by a STAND-IN upstream
    key) and directory/rpm (createrepo_c, every package signed with rpmsign); with `unsigned`, that version's rpms in
    directory/rpm-unsigned, signed by nobody. The key's GnuPG home is <directory>-gnupg, its public half
    <directory>-gnupg.asc, which is returned."""
    from gpu_install_lab.packages import standin_toolkit_chain

    home = directory.with_name(directory.name + "-gnupg")  # beside what is served, not in it
    shutil.rmtree(home, ignore_errors=True)
    key = new_key(home, UPSTREAM_KEY_NAME)
    pool = directory / "apt" / "pool"
    pool.mkdir(parents=True)
    (directory / "rpm").mkdir()
    for v in versions:
        debs, rpms = standin_toolkit_chain(v)
        for d in debs:
            shutil.copy(d, pool / d.name)
        rpm_sign(home, [Path(shutil.copy(r, directory / "rpm" / r.name)) for r in rpms])
    # what a Rocky/RHEL upstream (BaseOS) also holds and the operator's driver container installs at start whatever
    # the kernel: elfutils-libelf(-devel), STAND-INs under the real names
    rpm_sign(home, [Path(shutil.copy(r, directory / "rpm" / r.name)) for r in standin_elfutils_rpms()])
    apt_index(directory / "apt", home)
    _run("createrepo_c", "--quiet", str(directory / "rpm"))
    if unsigned:
        (directory / "rpm-unsigned").mkdir()
        for r in standin_toolkit_chain(unsigned)[1]:
            shutil.copy(r, directory / "rpm-unsigned" / r.name)
        _run("createrepo_c", "--quiet", str(directory / "rpm-unsigned"))
    return key


ELFUTILS_VERSION = "0.190"


def standin_elfutils_rpms() -> list[Path]:
    """STAND-IN elfutils-libelf and elfutils-libelf-devel (Rocky 9 BaseOS/AppStream ship them; not obtainable here):
    what the driver container's RHEL packages (installer/data/driver-container-packages.yaml) resolve to upstream."""
    from gpu_install_lab.packages import RPM_RELEASE, _standin_rpm

    doc = "gpu-install lab STAND-IN, not the distribution's package: "
    return [_standin_rpm(name, ELFUTILS_VERSION, RPM_RELEASE, f"gpu-install lab STAND-IN for {name}", doc + what,
                         {f"/usr/share/doc/{name}/STANDIN": doc + what + "\n"}, requires=req)
            for name, what, req in (
                ("elfutils-libelf", "no library (nothing links against it in the lab)", ()),
                ("elfutils-libelf-devel", "no headers", (f"elfutils-libelf = {ELFUTILS_VERSION}",)))]


def newer(version: str) -> str:
    """1.17.4 -> 1.17.5: the version the stand-in upstream offers beside the pinned one (only the pin picks)."""
    head, _, last = version.rpartition(".")
    return f"{head}.{int(last) + 1}" if last.isdigit() else version + ".1"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


# ---------------------------------------------------------------- serve


def serve(directory: Path, release: str, chart: Path, standin: bool, toolkit: str | None = None) -> int:
    from gpu_install_lab.pki import ensure_ca, issue_server_cert

    _die_with_parent()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    directory.mkdir(parents=True, exist_ok=True)
    pki = directory / "pki"
    ca, _ = ensure_ca(pki, cn="gpu-install demo STAND-IN upstream CA")
    cert, key = issue_server_cert(pki, "registry", ["127.0.0.1"], ["localhost"])

    # the chart repository: plain HTTP, 127.0.0.1, a thread of this process
    handler = functools.partial(_Quiet, directory=str(directory / "charts"))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    charts_url = f"http://127.0.0.1:{httpd.server_address[1]}"
    tgz = chart_repository(directory / "charts", charts_url, release, chart, standin)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    servers = [httpd]
    packages: dict[str, str] = {}
    if toolkit:  # the package repositories: plain HTTP (the InRelease / package signatures carry the trust)
        shutil.rmtree(directory / "packages", ignore_errors=True)
        pkg_key = package_repository(directory / "packages", (toolkit, newer(toolkit)))
        phandler = functools.partial(_Quiet, directory=str(directory / "packages"))
        pserver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), phandler)
        threading.Thread(target=pserver.serve_forever, daemon=True).start()
        servers.append(pserver)
        packages = {"packages": f"http://127.0.0.1:{pserver.server_address[1]}", "packages_key": str(pkg_key)}

    # the image registry: docker-registry, TLS with the demo CA, 127.0.0.1
    port = _free_port()
    config = {"version": 0.1, "log": {"level": "error", "accesslog": {"disabled": True}},
              "storage": {"filesystem": {"rootdirectory": str(directory / "registry-data")}},
              "http": {"addr": f"127.0.0.1:{port}", "secret": "gpu-install-demo-upstream",
                       "tls": {"certificate": str(cert), "key": str(key)}}}
    (directory / "registry.yml").write_text(json.dumps(config))  # JSON is YAML
    log = open(directory / "registry.log", "wb")  # noqa: SIM115 - closed with the process
    reg = subprocess.Popen(["docker-registry", "serve", str(directory / "registry.yml")], stdin=subprocess.DEVNULL,
                           stdout=log, stderr=log, preexec_fn=_die_with_parent)  # noqa: PLW1509
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):  # the registry's socket: connect until it accepts (or the process ended)
            if reg.poll() is not None or time.monotonic() > deadline or stop.is_set():
                raise SystemExit(f"upstream STAND-IN: docker-registry did not start: "
                                 f"{(directory / 'registry.log').read_text(errors='replace')[-2000:]}")
            stop.wait(0.05)
        ready = {"registry": f"127.0.0.1:{port}", "charts": charts_url, "chart": str(tgz), "ca": str(ca),
                 "pids": [os.getpid(), reg.pid], "ports": [port, *(h.server_address[1] for h in servers)], **packages}
        (directory / "upstream.json").write_text(json.dumps(ready, indent=2) + "\n")
        print(json.dumps(ready), flush=True)
        sys.stdout.close()
        _say(f"registry https://127.0.0.1:{port} (demo CA {ca}), chart repository {charts_url} "
             f"({tgz.name}); pids {os.getpid()} {reg.pid}")
        stop.wait()
    finally:
        for h in servers:
            h.shutdown()
            h.server_close()
        reg.terminate()
        try:
            reg.wait(timeout=10)
        except subprocess.TimeoutExpired:
            reg.kill()
            reg.wait()
        log.close()
    _say("stopped (registry and chart repository)")
    return 0


# ---------------------------------------------------------------- seed


#: catalog component -> the STAND-IN image seeded at its upstream repository (seed())
SEED_ROLES = {"operator": "operator", "operator.initContainer": "smoke", "validator": "smoke",
              "dcgmExporter": "dcgm-exporter"}


def seed_roles(release: str) -> dict[str, str]:
    """{upstream repository (no tag): STAND-IN image role} for the release's images that get more than the
    placeholder (SEED_ROLES), from the catalog."""
    from installer.catalog import Catalog

    comps = Catalog.default().get(release).components
    out: dict[str, str] = {}
    for name, role in SEED_ROLES.items():
        comp = comps.get(name)
        if comp is not None and comp.repository:
            out.setdefault(f"{comp.repository}/{comp.image}" if comp.image else comp.repository, role)
    return out


def _repository(ref: str) -> str:
    """nvcr.io/nvidia/cuda:12.3.2-base-ubi8 -> nvcr.io/nvidia/cuda (a digest reference too)."""
    name = ref.split("@", 1)[0]
    head, sep, tail = name.rpartition(":")
    return head if sep and "/" not in tail else name


def seed(site_file: Path, images_json: Path) -> int:
    """A STAND-IN image at every image's upstream path (remapped as the site's mirror.upstream says)."""
    from gpu_install_lab import images
    from gpu_install_lab.smoke_image import build_smoke_image
    from installer.config import load_site
    from installer.mirror.images import pull_from

    site = load_site(site_file)
    remap = {k.lower(): v for k, v in site.mirror.upstream.items()}
    sources = sorted({str(i["source"]) for i in json.loads(images_json.read_text())})
    roles = seed_roles(site.operator.version)
    t0 = time.monotonic()
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="upstream-seed-") as work:
        layouts = {"smoke": (build_smoke_image("smoke"), "smoke"),
                   "operator": (images.operator_standin_layout(Path(work)), "standin"),
                   "dcgm-exporter": (images.dcgm_exporter_layout(Path(work)), "standin"),
                   "placeholder": (images.idle_standin_layout(Path(work)), "standin")}
        certs = Path(work) / "certs"
        certs.mkdir()
        if site.mirror.upstreamCa:
            shutil.copyfile(site.mirror.upstreamCa, certs / "ca.crt")
        for source in sources:
            dest = pull_from(source, remap)
            if dest == source:
                raise SystemExit(f"upstream STAND-IN: mirror.upstream remaps no registry of {source}: it would be "
                                 "read from the internet")
            role = roles.get(_repository(source), "placeholder")
            layout, tag = layouts[role]
            counts[role] = counts.get(role, 0) + 1
            _run("skopeo", "copy", "--quiet", "--dest-cert-dir", str(certs), f"oci:{layout}:{tag}", f"docker://{dest}")
    _say(f"{len(sources)} images seeded ({', '.join(f'{n} x {r}' for r, n in sorted(counts.items()))}: STAND-IN images "
         f"at the upstream paths and tags; {time.monotonic() - t0:.1f}s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpu_install_lab.upstream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="start the stand-in registry and chart repository (one JSON line when ready)")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--release", required=True, help="the site's operator.version")
    c = s.add_mutually_exclusive_group(required=True)
    c.add_argument("--chart", type=Path, help="the release's gpu-operator chart: a .tgz or a chart directory")
    c.add_argument("--standin-chart", type=Path, help="a STAND-IN chart directory (tests/fixtures/charts/"
                   "gpu-operator-fixture), packaged as gpu-operator at the release's chart version")
    s.add_argument("--toolkit", metavar="VERSION",
                   help="also serve STAND-IN apt/rpm repositories of NVIDIA's toolkit chain at VERSION and the next "
                        "patch version (signed by a STAND-IN upstream key)")
    d = sub.add_parser("seed", help="the stand-in image at every upstream path of `gpu-install images --format json`")
    d.add_argument("--site", type=Path, required=True)
    d.add_argument("--images", type=Path, required=True)
    a = p.parse_args(argv)
    if a.cmd == "serve":
        return serve(a.dir, a.release, a.chart or a.standin_chart, a.chart is None, a.toolkit)
    return seed(a.site, a.images)


if __name__ == "__main__":
    sys.exit(main())
