"""OS packages through `mirror pull` / `mirror push --repo-dir` (installer/mirror/packages.py), against real parts:
STAND-IN upstream repositories (tests/integration/package_upstreams.py: a real apt archive whose InRelease an
"upstream" key signs, a real rpm repository whose packages that key signs) holding NVIDIA's toolkit chain under its
real names at 1.17.4 and 1.17.5, resolved by the real apt and dnf of this machine; the published site repositories
are then read by the real apt (signed-by the site key) and installed from by the real dnf (gpgcheck and
repo_gpgcheck on) into an empty root. The image part of the bundle is empty here (test_mirror_images.py carries
images); push runs through the real CLI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration import package_upstreams
from tests.integration.conftest import VENV_BIN

TOOLKIT = "1.17.4"
CHAIN = {"nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
         "libnvidia-container1"}
OSES = ("debian12", "rocky9.4")


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    package_upstreams.require_tools()
    root = tmp_path_factory.mktemp("pkg-upstream")
    ups = package_upstreams.start(root, ("1.17.4", "1.17.5"), unsigned="1.17.6")
    try:
        yield ups
    finally:
        ups.close()


def _site(tmp: Path, up, toolkit: str = TOOLKIT, repos: dict | None = None, **extra) -> Path:
    # registry.host: loopback, nothing listens (the image part of these bundles is empty; nothing is pushed there)
    # driver.mode preinstalled: the toolkit's packages alone (operator mode adds its driver container's packages:
    # test_operator_mode_carries_the_driver_containers_kernel_packages)
    site = {"operator": {"version": "v24.9.2"}, "registry": {"host": "127.0.0.1:9"},
            "driver": {"mode": "preinstalled"},
            "toolkit": {"mode": "host", "version": toolkit},
            "mirror": {"packageRepositories": repos if repos is not None else {
                "debian12": [{"url": up.apt, "suite": "stable", "key": str(up.key)}],
                "rocky9.4": [{"url": up.rpm, "key": str(up.key)}]},
                # the air-gapped side pins the connected side's bundle key (_pull signs with it)
                "trustedKeys": [str(tmp / "connected-key" / "signing-key.pub.pem")]}, **extra}
    path = tmp / f"site-{toolkit}.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def _pull(site: Path, bundle: Path, since: Path | None = None) -> tuple[list[str], dict]:
    """The package part of `mirror pull` (the image part with no images writes the lock's header)."""
    from installer.config import load_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import images, packages
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    plan = resolve(load_site(site), Options(os_tags=OSES))
    lines: list[str] = []
    images.pull(plan, [], bundle, finish=False)
    try:
        packages.pull(plan.site, plan.artifacts(()).packages, bundle, say=lines.append, since=since)
    finally:
        lock = lockfile.finish(bundle, load_or_create(site.parent / "connected-key"))
    return lines, lock


def _gi(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(VENV_BIN / "gpu-install"), *argv], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def pushed(up, tmp_path_factory):
    """One pull and one push for the module: (bundle, repo dir, signing home, lock, pull lines, push result)."""
    work = tmp_path_factory.mktemp("pkg-bundle")
    site = _site(work, up)
    bundle = work / "bundle"
    lines, lock = _pull(site, bundle)
    repo, home = work / "repo", work / "signing"
    proc = _gi("mirror", "push", str(bundle), "-s", str(site), "--repo-dir", str(repo), "--signing-home", str(home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"site": site, "bundle": bundle, "repo": repo, "home": home, "lock": lock, "lines": lines, "push": proc}


def test_pull_resolves_the_pinned_closure_per_os(pushed, up):
    lock = pushed["lock"]
    assert lock["complete"] is True and lock["failed"] == [], lock["failed"]
    debs = [e for e in lock["packages"] if e["os"] == "debian12"]
    # apt: the four pinned roots exactly, at 1.17.4 (1.17.5 is in the upstream; the pin decides)
    assert {e["name"] for e in debs} == CHAIN
    assert {e["version"] for e in debs} == {f"{TOOLKIT}-1gpuinstall.upstream.standin"}
    rpms = [e for e in lock["packages"] if e["os"] == "rocky9.4" and not e.get("key")]
    assert {e["name"] for e in rpms} == CHAIN
    # each root at the pin; dnf resolves each root's dependencies on its own, so the newest libraries that satisfy
    # `>= 1.17.4` come along too (a superset, never less)
    assert {(e["name"], e["version"]) for e in rpms} >= {(n, f"{TOOLKIT}-1gpuinstall.upstream.standin") for n in CHAIN}
    assert all(e["version"].startswith(("1.17.4-", "1.17.5-")) for e in rpms), rpms
    (key,) = [e for e in lock["packages"] if e.get("key")]
    assert key["os"] == "rocky9.4" and key["sha256"] == _sha(up.key)
    for e in lock["packages"]:
        path = pushed["bundle"] / e["file"]
        assert _sha(path) == e["sha256"] and path.stat().st_size == e["size"], e
        if not e.get("key"):
            assert e["source"].startswith(up.url) and e["source"].endswith(path.name), e
    sets = {s["os"]: s for s in lock["packageSets"]}
    assert sets["debian12"]["manager"] == "apt" and sets["rocky9.4"]["manager"] == "dnf"
    assert sorted(sets["debian12"]["roots"]) == sorted(f"{n}={TOOLKIT}*" for n in CHAIN)
    assert sorted(sets["rocky9.4"]["roots"]) == sorted(f"{n}-{TOOLKIT}*" for n in CHAIN)


def test_second_pull_fetches_nothing_and_a_lost_file_comes_back(pushed, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(pushed["bundle"], bundle)
    lines, lock = _pull(pushed["site"], bundle)
    assert not [ln for ln in lines if "bytes)" in ln], lines  # nothing fetched
    assert lock["packages"] == pushed["lock"]["packages"]
    lost = next(e for e in lock["packages"] if e["os"] == "rocky9.4" and not e.get("key"))
    (bundle / lost["file"]).unlink()
    (bundle / lost["file"]).with_name("." + Path(lost["file"]).name + ".part").write_bytes(b"half a download")
    lines, lock = _pull(pushed["site"], bundle)
    assert [ln for ln in lines if "bytes)" in ln] == [f"packages rocky9.4: {Path(lost['file']).name} "
                                                      f"({lost['size']} bytes)"], lines
    assert lock["packages"] == pushed["lock"]["packages"] and lock["complete"] is True


def test_push_publishes_a_repository_apt_trusts_only_with_the_site_key(pushed, tmp_path):
    from installer.mirror import packages

    repo, home = pushed["repo"], pushed["home"]
    site_key = repo / packages.SITE_KEY
    assert "BEGIN PGP PUBLIC KEY BLOCK" in site_key.read_text()
    assert "packages.key" in pushed["push"].stderr
    # the signing key is kept: a second push signs with the same key and copies nothing
    fpr = package_upstreams.gpg(home, "--with-colons", "--list-secret-keys").stdout
    again = _gi("mirror", "push", str(pushed["bundle"]), "-s", str(pushed["site"]), "--repo-dir", str(repo),
                "--signing-home", str(home))
    assert again.returncode == 0, again.stderr
    assert package_upstreams.gpg(home, "--with-colons", "--list-secret-keys").stdout == fpr
    assert "packages debian12: 4 package(s) published" in again.stderr and "(0 new)" in again.stderr, again.stderr
    url, server = package_upstreams.serve(repo)
    try:
        def apt(key: Path, *argv: str) -> subprocess.CompletedProcess:
            from types import SimpleNamespace

            work = tmp_path / f"apt-{key.stem}"
            shutil.rmtree(work, ignore_errors=True)
            src = SimpleNamespace(url=f"{url}/packages/debian12", suite=packages.SUITE, components=["main"], key=key)
            env = packages._apt_conf(work, [src], None)
            update = subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True, timeout=120)
            if update.returncode != 0 or "W: " in update.stdout + update.stderr:
                return update
            return subprocess.run(["apt-get", *argv], env=env, capture_output=True, text=True, timeout=120)

        # the site key: apt verifies InRelease and resolves the toolkit from the published repository
        ok = apt(site_key, "install", "-s", *(f"{n}={TOOLKIT}*" for n in sorted(CHAIN)))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert sorted(ln.split()[1] for ln in ok.stdout.splitlines() if ln.startswith("Inst ")) == sorted(CHAIN)
        # any other key (the upstream's): apt refuses the repository
        refused = apt(up_key(pushed), "install", "-s", "nvidia-container-toolkit")
        assert refused.returncode != 0 or "W: " in refused.stdout + refused.stderr
        assert "NO_PUBKEY" in refused.stdout + refused.stderr or "not signed" in refused.stdout + refused.stderr, \
            refused.stdout + refused.stderr
        # a Packages index changed after signing: apt refuses it (hash sum mismatch)
        index = repo / "packages" / "debian12" / "dists" / packages.SUITE / "main" / "binary-amd64" / "Packages"
        saved = index.read_bytes()
        (index.parent / "Packages.gz").rename(index.parent / "Packages.gz.saved")
        index.write_bytes(saved.replace(b"Version: 1.17.4", b"Version: 1.17.9"))
        try:
            bad = apt(site_key, "install", "-s", "nvidia-container-toolkit")
            assert bad.returncode != 0 or "W: " in bad.stdout + bad.stderr
            assert "Hash Sum mismatch" in bad.stdout + bad.stderr or "File has unexpected size" in bad.stdout + \
                bad.stderr, bad.stdout + bad.stderr
        finally:
            index.write_bytes(saved)
            (index.parent / "Packages.gz.saved").rename(index.parent / "Packages.gz")
    finally:
        server.shutdown()
        server.server_close()


def up_key(pushed) -> Path:
    lock = pushed["lock"]
    (key,) = [e for e in lock["packages"] if e.get("key")]
    return pushed["bundle"] / key["file"]


def test_dnf_installs_the_toolkit_from_the_published_repository_with_gpgcheck(pushed, tmp_path):
    from installer.mirror import packages

    repo = pushed["repo"]
    url, server = package_upstreams.serve(repo)
    try:
        def dnf_install(site_key: Path) -> tuple[subprocess.CompletedProcess, Path]:
            work = tmp_path / f"dnf-{site_key.stem}"
            (work / "repos").mkdir(parents=True)
            (work / "dnf.conf").write_text("[main]\n")
            # what roles/package_repo writes on a RHEL-family node
            (work / "repos" / "gpu-install.repo").write_text(
                f"[gpu-install]\nname=site\nbaseurl={url}/packages/rocky9.4\nenabled=1\ngpgcheck=1\nrepo_gpgcheck=1\n"
                f"gpgkey=file://{site_key} {url}/packages/rocky9.4/{packages.UPSTREAM_KEYS}\n")
            proc = subprocess.run(
                ["dnf", "install", "-y", "-q", "--disableplugin=*", f"--config={work / 'dnf.conf'}", f"--installroot={work / 'root'}",
                 f"--setopt=reposdir={work / 'repos'}", f"--setopt=cachedir={work / 'cache'}", "--releasever=9",
                 "--forcearch=x86_64", "--setopt=install_weak_deps=False",
                 *(f"{n}-{TOOLKIT}*" for n in sorted(CHAIN))],
                capture_output=True, text=True, timeout=300, env={**os.environ, "LC_ALL": "C"})
            return proc, work / "root"

        proc, root = dnf_install(repo / packages.SITE_KEY)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        got = subprocess.run(["rpm", "--root", str(root), "--dbpath", "/var/lib/rpm", "-qa", "--qf",
                              "%{NAME} %{VERSION}\n"], capture_output=True, text=True, timeout=60)
        if not got.stdout.strip():  # Debian's rpm keeps its database elsewhere by default
            got = subprocess.run(["rpm", "--root", str(root), "-qa", "--qf", "%{NAME} %{VERSION}\n"],
                                 capture_output=True, text=True, timeout=60)
        rows = got.stdout.splitlines()
        # dnf imported the site key (repomd.xml's signature) and the upstream key (the packages' signatures)
        assert len([r for r in rows if r.startswith("gpg-pubkey ")]) == 2, rows
        assert sorted(r for r in rows if not r.startswith("gpg-pubkey ")) == sorted(f"{n} {TOOLKIT}" for n in CHAIN)
        assert f"version {TOOLKIT}" in (root / "usr/bin/nvidia-ctk").read_text()
        # with another key in place of the site's, repomd.xml's signature does not check out: nothing is installed
        other = tmp_path / "other.asc"
        shutil.copy(up_key(pushed), other)
        refused, root2 = dnf_install(other)
        assert refused.returncode != 0, refused.stdout
        assert not (root2 / "usr/bin/nvidia-ctk").exists()
    finally:
        server.shutdown()
        server.server_close()


def test_tampered_package_is_refused_before_anything_is_published(pushed, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(pushed["bundle"], bundle)
    deb = next(e for e in pushed["lock"]["packages"] if e["os"] == "debian12")
    data = bytearray((bundle / deb["file"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bundle / deb["file"]).write_bytes(bytes(data))
    repo = tmp_path / "repo"
    proc = _gi("mirror", "push", str(bundle), "-s", str(pushed["site"]), "--repo-dir", str(repo), "--signing-home",
               str(tmp_path / "signing"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{deb['file']}: sha256" in proc.stderr and "the lock says" in proc.stderr, proc.stderr
    assert not repo.exists() and not (tmp_path / "signing").exists()
    # the lock itself changed (its checksum recomputed): refused by its signature
    (bundle / deb["file"]).write_bytes((pushed["bundle"] / deb["file"]).read_bytes())
    lock = json.loads((bundle / "bundle.lock.json").read_text())
    lock["packages"][0]["sha256"] = "0" * 64
    text = json.dumps(lock, indent=2) + "\n"
    (bundle / "bundle.lock.json").write_text(text)
    (bundle / "bundle.lock.json.sha256").write_text(f"{hashlib.sha256(text.encode()).hexdigest()}  bundle.lock.json\n")
    proc = _gi("mirror", "push", str(bundle), "-s", str(pushed["site"]), "--repo-dir", str(repo))
    assert proc.returncode == 2 and "the lock was changed after signing" in proc.stderr, proc.stderr
    assert not repo.exists()


def test_push_of_packages_without_repo_dir_is_refused(pushed):
    proc = _gi("mirror", "push", str(pushed["bundle"]), "-s", str(pushed["site"]))
    assert proc.returncode == 2 and "--repo-dir" in proc.stderr, proc.stderr


def test_unsigned_package_and_missing_version_fail_the_pull_naming_them(up, tmp_path):
    # 1.17.6's rpms are in an upstream repository unsigned: each refused, the bundle stays incomplete
    site = _site(tmp_path, up, toolkit="1.17.6", repos={"rocky9.4": [{"url": f"{up.url}/rpm-unsigned",
                                                                      "key": str(up.key)}],
                                                       "debian12": [{"url": up.apt, "suite": "stable",
                                                                     "key": str(up.key)}]})
    from installer.mirror.packages import PackageFailures

    with pytest.raises(PackageFailures) as err:
        _pull(site, tmp_path / "b1")
    msg = str(err.value)
    for name in CHAIN:
        assert f"rocky9.4/{name}-1.17.6-1gpuinstall.upstream.standin.noarch.rpm: not signed" in msg, msg
    assert not list((tmp_path / "b1" / "packages" / "rocky9.4").glob("*.rpm"))  # refused files are not kept
    from installer.mirror import bundle as lockfile

    assert lockfile.read_lock(tmp_path / "b1")["complete"] is False
    # a version nobody has: apt's and dnf's own words, for each OS
    site = _site(tmp_path, up, toolkit="9.9.9")
    with pytest.raises(PackageFailures) as err:
        _pull(site, tmp_path / "b2")
    msg = str(err.value)
    assert "debian12 (" in msg and "9.9.9" in msg and "was not found" in msg, msg
    assert "rocky9.4 (" in msg and ("No package" in msg or "No match" in msg), msg


def test_pull_without_repositories_for_an_os_is_bad_input_and_writes_nothing(up, tmp_path):
    site = _site(tmp_path, up, repos={"debian12": [{"url": up.apt, "suite": "stable", "key": str(up.key)}]})
    out = tmp_path / "bundle"
    proc = _gi("mirror", "pull", "-s", str(site), "--os", "debian12", "--os", "rocky9.4", "-o", str(out))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "mirror.packageRepositories.rocky9.4: not set" in proc.stderr, proc.stderr
    assert not out.exists()
    site = _site(tmp_path, up, repos={"debian12": [{"url": up.apt, "key": str(up.key)}],
                                      "rocky9.4": [{"url": up.rpm, "key": str(up.key)}]})
    proc = _gi("mirror", "pull", "-s", str(site), "--os", "debian12", "--os", "rocky9.4", "-o", str(out))
    assert proc.returncode == 2 and "mirror.packageRepositories.debian12[0].suite: not set" in proc.stderr, proc.stderr
    assert not out.exists()


def _with_packages(site: Path, url: str, key: Path, tmp: Path, **over) -> Path:
    data = yaml.safe_load(site.read_text())
    data["packages"] = {"url": url, "key": str(key)}
    data.update(over)
    out = tmp / f"site-verify-{len(list(tmp.glob('site-verify-*')))}.yaml"
    out.write_text(yaml.safe_dump(data))
    return out


def _roots_missing(site: Path) -> list[str]:
    from installer.config import load_site
    from installer.mirror.packages import check_repo
    from installer.plan import Options, resolve

    plan = resolve(load_site(site), Options(os_tags=OSES))
    return check_repo(plan.site, sets=plan.artifacts(()).packages)


def _bundle_missing(site: Path, lock: dict) -> list[str]:
    """What `mirror verify --bundle` finds missing of the bundle's packages in the site repository (its package
    half, installer.mirror.packages.check_repo with the signed lock): this module's bundles carry packages only, and
    verify --bundle refuses a bundle without images before it reads a repository (test_bundle_checks)."""
    from installer.config import load_site
    from installer.mirror.packages import check_repo

    return check_repo(load_site(site), lock=lock)


def test_verify_reads_the_site_repository_as_the_nodes_do(pushed, tmp_path):
    """mirror verify with packages.url: the bundle's packages by sha256 in the signed index and served; without a
    bundle every root at its pin; a repository signed by another key, a lost file or a missing version: findings
    (exit 3 from the command)."""
    from installer.mirror import packages

    repo = tmp_path / "repo"
    shutil.copytree(pushed["repo"], repo)
    url, server = package_upstreams.serve(repo)
    try:
        site = _with_packages(pushed["site"], url, repo / packages.SITE_KEY, tmp_path)
        assert _bundle_missing(site, pushed["lock"]) == []
        assert sum(1 for e in pushed["lock"]["packages"] if not e.get("key")) > 0
        # the command refuses this bundle before any repository is read: it carries no image ("all 0 images" never
        # passes), so a bundle that only looks complete is never reported verified
        refused = _gi("mirror", "verify", "-s", str(site), "--os", "debian12", "--os", "rocky9.4", "--bundle",
                      str(pushed["bundle"]))
        assert refused.returncode == 2 and "carries no image" in refused.stderr, refused.stdout + refused.stderr
        # without a bundle (what apply's preflight runs, installer.mirror.verify.packages_for_apply): every root of
        # the plan at its pin (the images' half of verify needs a registry, which this test has not)
        assert _roots_missing(site) == []
        # the site asks for a version the repository does not hold: each root named, with what is there
        newer = _with_packages(pushed["site"], url, repo / packages.SITE_KEY, tmp_path,
                               toolkit={"mode": "host", "version": "1.17.5"})
        miss = "\n".join(_roots_missing(newer))
        # 6 of 8: rocky9.4's closure brought libnvidia-container{1,-tools} 1.17.5 along (a `>=` dependency)
        assert len(_roots_missing(newer)) == 6, miss
        assert ("debian12/nvidia-container-toolkit=1.17.5*: not in the site repository (it has "
                "1.17.4-1gpuinstall.upstream.standin)") in miss, miss
        assert "rocky9.4/nvidia-container-toolkit-base-1.17.5*: not in the site repository" in miss
        # a lost file: listed in the signed index, not served
        deb = next(e for e in pushed["lock"]["packages"] if e["os"] == "debian12")
        (repo / "packages" / "debian12" / "pool" / "main" / Path(deb["file"]).name).unlink()
        lost = "\n".join(_bundle_missing(site, pushed["lock"]))
        assert f"debian12/{Path(deb['file']).name}: listed in the signed index but not served" in lost, lost
        # the key apply would trust is not the one that signed: both repositories refused
        other = tmp_path / "other-signing"
        _gi("mirror", "push", str(pushed["bundle"]), "-s", str(pushed["site"]), "--repo-dir", str(tmp_path / "x"),
            "--signing-home", str(other))
        wrong = _with_packages(pushed["site"], url, tmp_path / "x" / packages.SITE_KEY, tmp_path)
        bad = "\n".join(_bundle_missing(wrong, pushed["lock"]))
        assert "debian12 packages:" in bad and "InRelease: signature not made by the site key" in bad, bad
        assert "rocky9.4 packages:" in bad and "repomd.xml: signature not made by the site key" in bad, bad
    finally:
        server.shutdown()
        server.server_close()


def test_incremental_bundle_carries_only_what_changed_and_push_needs_its_base(pushed, up, tmp_path):
    """1.17.4 -> 1.17.5 with --since the 1.17.4 bundle's lock: the packages that bundle had (rocky9.4's closure
    already brought libnvidia-container{1,-tools} 1.17.5) stay out; push needs them in the --repo-dir (exit 3
    naming them otherwise) and then publishes both releases' packages."""
    from installer.mirror import packages

    site = _site(tmp_path, up, toolkit="1.17.5")
    bundle = tmp_path / "bundle"
    lines, lock = _pull(site, bundle, since=pushed["bundle"] / "bundle.lock.json")
    assert lock["complete"] is True, lock["failed"]
    carried = {(e["os"], e["name"], e["version"].split("-")[0]) for e in lock["packages"] if not e.get("key")}
    base = {(e["os"], e["name"], e["version"].split("-")[0]) for e in lock["packageBase"]}
    assert base == {("rocky9.4", "libnvidia-container-tools", "1.17.5"), ("rocky9.4", "libnvidia-container1", "1.17.5")}
    assert carried == {(o, n, "1.17.5") for o in OSES for n in CHAIN} - base, carried
    assert not [p for p in (bundle / "packages" / "rocky9.4").glob("libnvidia-container1-1.17.5*")]
    assert "packages rocky9.4: 2 in the base bundle, not carried" in lines, lines
    # an empty --repo-dir lacks the base: refused before anything is written
    empty = tmp_path / "empty-repo"
    proc = _gi("mirror", "push", str(bundle), "-s", str(site), "--repo-dir", str(empty), "--signing-home",
               str(tmp_path / "signing"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "lacks 2 of them" in proc.stderr and "rocky9.4/libnvidia-container1-1.17.5" in proc.stderr, proc.stderr
    assert not empty.exists()
    # the site repository the 1.17.4 bundle was pushed into: both releases installable from it
    repo = tmp_path / "repo"
    shutil.copytree(pushed["repo"], repo)
    proc = _gi("mirror", "push", str(bundle), "-s", str(site), "--repo-dir", str(repo), "--signing-home",
               str(pushed["home"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url, server = package_upstreams.serve(repo)
    try:
        for os_tag, manager in (("debian12", "apt"), ("rocky9.4", "dnf")):
            index = packages.repo_index(url, os_tag, manager, repo / packages.SITE_KEY)
            have = {(i["name"], i["version"].split("-")[0]) for i in index.values()}
            assert {(n, v) for n in CHAIN for v in ("1.17.4", "1.17.5")} <= have, (os_tag, have)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- driver.mode operator: the driver container's packages

STANDIN_KERNEL = "5.15.0-999-generic"  # no Ubuntu kernel has this ABI number: the packages below are STAND-INs


def _standin_kernel_debs(out: Path) -> list[Path]:
    """STAND-IN Ubuntu kernel packages under the names NVIDIA's driver container asks for (dpkg-deb; Version and
    Description say STAND-IN; each holds a README only): linux-headers-<kernel> depending on its flavour-common
    linux-headers-<abi> as Ubuntu's do, linux-image-<kernel> depending on linux-modules-<kernel>. Ubuntu's real ones
    are not reachable here (no network, a Debian machine)."""
    abi = STANDIN_KERNEL.rsplit("-", 1)[0]
    pkgs = {f"linux-headers-{STANDIN_KERNEL}": f"linux-headers-{abi}", f"linux-headers-{abi}": None,
            f"linux-image-{STANDIN_KERNEL}": f"linux-modules-{STANDIN_KERNEL}", f"linux-modules-{STANDIN_KERNEL}": None}
    debs = []
    for name, depends in pkgs.items():
        root = out / name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN" / "control").write_text(
            f"Package: {name}\nVersion: 5.15.0-999.1~standin\nArchitecture: all\n"
            + (f"Depends: {depends}\n" if depends else "")
            + "Maintainer: gpu-install tests <tests@gpu-install.invalid>\nSection: kernel\nPriority: optional\n"
              f"Description: STAND-IN {name}\n gpu-install test STAND-IN for an Ubuntu kernel package.\n")
        doc = root / "usr" / "share" / "doc" / name
        doc.mkdir(parents=True)
        (doc / "STAND-IN").write_text(f"{name}: a gpu-install test STAND-IN package.\n")
        deb = out / f"{name}_5.15.0-999.1~standin_all.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)], check=True,
                       capture_output=True, timeout=60)
        debs.append(deb)
    return debs


def test_operator_mode_carries_the_driver_containers_kernel_packages(tmp_path):
    """driver.mode operator on an ubuntu22.04 node running STANDIN_KERNEL: the mirror plan's roots are the three
    packages NVIDIA's driver container installs; pull resolves them with their closure (the flavour-common headers,
    the modules the image depends on) from a signed STAND-IN upstream with the real apt; push publishes them into the
    site repository signed by the site key; the real apt, trusting only that key, then does the container's steps
    against it: `apt-get install linux-headers-<kernel>` and `apt-get download linux-image-/linux-modules-<kernel>`."""
    from types import SimpleNamespace

    from gpu_install_lab.upstream import UPSTREAM_KEY_NAME, apt_index, new_key
    from installer.config import load_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import images, packages
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    package_upstreams.require_tools()
    www = tmp_path / "www"
    pool = www / "apt" / "pool"
    pool.mkdir(parents=True)
    for deb in _standin_kernel_debs(tmp_path / "debs"):
        shutil.copy(deb, pool / deb.name)
    key = new_key(tmp_path / "upstream-gnupg", UPSTREAM_KEY_NAME)
    apt_index(www / "apt", tmp_path / "upstream-gnupg", suite="jammy")
    url, upstream = package_upstreams.serve(www)
    try:
        site = tmp_path / "site.yaml"
        site.write_text(yaml.safe_dump({
            "operator": {"version": "v25.10.1"}, "registry": {"host": "127.0.0.1:9"},
            "mirror": {"packageRepositories": {"ubuntu22.04": [{"url": f"{url}/apt", "suite": "jammy",
                                                                "key": str(key)}]},
                       "trustedKeys": [str(tmp_path / "connected-key" / "signing-key.pub.pem")]}}))
        plan = resolve(load_site(site), Options(os_tags=("ubuntu22.04",), kernels=(STANDIN_KERNEL,)))
        sets = plan.artifacts(()).packages
        assert [(s.os, s.manager, sorted(p.spec for p in s.packages)) for s in sets] == [
            ("ubuntu22.04", "apt", sorted(f"{n}-{STANDIN_KERNEL}" for n in ("linux-headers", "linux-image",
                                                                            "linux-modules")))]
        bundle = tmp_path / "bundle"
        images.pull(plan, [], bundle, finish=False)
        try:
            packages.pull(plan.site, sets, bundle)
        finally:
            lock = lockfile.finish(bundle, load_or_create(tmp_path / "connected-key"))
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert lock["complete"] is True and lock["failed"] == [], lock["failed"]
    abi = STANDIN_KERNEL.rsplit("-", 1)[0]
    assert {e["name"] for e in lock["packages"]} == {f"linux-headers-{STANDIN_KERNEL}", f"linux-headers-{abi}",
                                                     f"linux-image-{STANDIN_KERNEL}", f"linux-modules-{STANDIN_KERNEL}"}
    repo, home = tmp_path / "repo", tmp_path / "signing"
    proc = _gi("mirror", "push", str(bundle), "-s", str(site), "--repo-dir", str(repo), "--signing-home", str(home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "packages ubuntu22.04: 4 package(s) published" in proc.stderr, proc.stderr
    served, server = package_upstreams.serve(repo)
    try:
        work = tmp_path / "apt-site"
        src = SimpleNamespace(url=f"{served}/packages/ubuntu22.04", suite=packages.SUITE, components=["main"],
                              key=repo / packages.SITE_KEY)
        env = packages._apt_conf(work, [src], None)

        def apt(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
            return subprocess.run(["apt-get", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)

        update = apt("update", "-q")
        assert update.returncode == 0 and "W: " not in update.stdout + update.stderr, update.stdout + update.stderr
        install = apt("install", "-s", "--no-install-recommends", f"linux-headers-{STANDIN_KERNEL}")
        assert install.returncode == 0, install.stdout + install.stderr
        assert sorted(ln.split()[1] for ln in install.stdout.splitlines() if ln.startswith("Inst ")) == \
            sorted([f"linux-headers-{STANDIN_KERNEL}", f"linux-headers-{abi}"])
        got = tmp_path / "downloaded"
        got.mkdir()
        download = apt("download", f"linux-image-{STANDIN_KERNEL}", f"linux-modules-{STANDIN_KERNEL}", cwd=got)
        assert download.returncode == 0, download.stdout + download.stderr
        assert sorted(p.name.split("_")[0] for p in got.glob("*.deb")) == [f"linux-image-{STANDIN_KERNEL}",
                                                                        f"linux-modules-{STANDIN_KERNEL}"]
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- RHEL 8/9 host mode: the driver's dnf module stream


def _stream_site(tmp: Path, upstream: str, key: Path, kmt: str, version: str = "580.82.07") -> Path:
    site = {"operator": {"version": "v25.10.1"}, "registry": {"host": "127.0.0.1:9"},
            "driver": {"mode": "host", "version": version, "kernelModuleType": kmt}, "toolkit": {"mode": "operator"},
            "mirror": {"packageRepositories": {"rocky9.4": [{"url": upstream, "key": str(key)}]},
                       "trustedKeys": [str(tmp / "connected-key" / "signing-key.pub.pem")]}}
    path = tmp / f"site-stream-{kmt}-{version}.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def _stream_pull(site: Path, bundle: Path) -> tuple[list[str], dict, object]:
    from installer.config import load_site
    from installer.mirror import bundle as lockfile
    from installer.mirror import images, packages
    from installer.plan import Options, resolve
    from installer.signing import load_or_create

    plan = resolve(load_site(site), Options(os_tags=("rocky9.4",)))
    lines: list[str] = []
    images.pull(plan, [], bundle, finish=False)
    try:
        packages.pull(plan.site, plan.artifacts(()).packages, bundle, say=lines.append)
    finally:
        lock = lockfile.finish(bundle, load_or_create(site.parent / "connected-key"))
    return lines, lock, plan


def test_driver_module_stream_through_pull_push_and_dnf(up, tmp_path):
    """RHEL 9 host mode with open modules against a STAND-IN of NVIDIA's RHEL 9 repository (gpu_install_lab.
    standin_modules: nvidia-driver:580-open and :580-dkms at 580.82.07 and 580.95.05, default stream 580-dkms, signed
    by the upstream key; dkms/gcc/make/elfutils-libelf-devel STAND-INs beside): pull enables 580-open in its installroot
    (the default stream would give the proprietary module) and carries exactly that stream's metadata; push publishes
    it (modifyrepo_c) in the signed site repository, where the real dnf, gpgcheck and repo_gpgcheck on, sees only that
    stream, hides its packages until it is enabled, then installs the pinned open packages; a second bundle of the
    proprietary flavour adds its stream to what the repository publishes; the package check reads the streams back;
    a stream the upstream lacks fails the pull naming those it has."""
    from gpu_install_lab import standin_modules
    from installer.config import load_site
    from installer.mirror import packages
    from installer.mirror.packages import check_repo, modulemd

    upstream = standin_modules.module_repository(up.www / "nvidia-rhel9", up.www.with_name(up.www.name + "-gnupg"),
                                                 tools=True)
    url = f"{up.url}/{upstream.name}"
    site = _stream_site(tmp_path, url, up.key, "open")
    bundle = tmp_path / "bundle"
    lines, lock, plan = _stream_pull(site, bundle)
    assert lock["complete"] is True and lock["failed"] == [], lock["failed"]
    assert plan.artifacts(()).packages[0].modules == ("nvidia-driver:580-open",)
    assert any("module stream(s) nvidia-driver:580-open enabled" in ln for ln in lines), lines
    assert f"packages rocky9.4: module stream nvidia-driver:580-open: 1 modules document(s) from {url}" in lines, lines
    (rec,) = lock["packageSets"]
    assert rec["modules"] == ["nvidia-driver:580-open"]
    rpms = {(e["name"], e["version"].split("-")[0]) for e in lock["packages"] if e.get("name")}
    assert {("kmod-nvidia-open-dkms", "3:580.82.07"), ("nvidia-driver", "3:580.82.07"),
            ("nvidia-driver-cuda", "3:580.82.07"), ("dkms", "1.0")} <= rpms, rpms
    assert not any(n == "kmod-nvidia-latest-dkms" for n, _ in rpms), rpms  # the default stream's: not resolved
    (mod,) = [e for e in lock["packages"] if e.get("modules")]
    assert mod["file"] == "packages/rocky9.4/modules/modules.yaml" and mod["source"] == url
    assert _sha(bundle / mod["file"]) == mod["sha256"]
    carried = modulemd.read_file(bundle / mod["file"])
    assert {s.spec for s in carried} == {"nvidia-driver:580-open"}  # not 580-dkms, not the defaults document
    assert "modulemd-defaults" not in (bundle / mod["file"]).read_text()

    repo, home = tmp_path / "repo", tmp_path / "signing"
    proc = _gi("mirror", "push", str(bundle), "-s", str(site), "--repo-dir", str(repo), "--signing-home", str(home))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dnf module streams nvidia-driver:580-open in its modules metadata" in proc.stdout + proc.stderr
    served, server = package_upstreams.serve(repo)
    try:
        work = tmp_path / "node"
        (work / "repos").mkdir(parents=True)
        (work / "dnf.conf").write_text("[main]\n")
        (work / "repos" / "gpu-install.repo").write_text(  # what roles/package_repo writes on a RHEL-family node
            f"[gpu-install]\nname=site\nbaseurl={served}/packages/rocky9.4\nenabled=1\ngpgcheck=1\nrepo_gpgcheck=1\n"
            f"gpgkey=file://{repo / packages.SITE_KEY} {served}/packages/rocky9.4/{packages.UPSTREAM_KEYS}\n"
            "metadata_expire=0\n")

        def dnf(*argv: str) -> subprocess.CompletedProcess:
            return subprocess.run(
                ["dnf", "-y", "-q", "--disableplugin=*", f"--config={work / 'dnf.conf'}", f"--installroot={work / 'root'}",
                 f"--setopt=reposdir={work / 'repos'}", f"--setopt=cachedir={work / 'cache'}", "--releasever=9",
                 "--forcearch=x86_64", "--setopt=module_platform_id=platform:el9", *argv],
                capture_output=True, text=True, timeout=300, env={**os.environ, "LC_ALL": "C"})

        listed = dnf("module", "list", "nvidia-driver")
        assert listed.returncode == 0 and "580-open" in listed.stdout and "580-dkms" not in listed.stdout, listed
        hidden = dnf("list", "--available", "kmod-nvidia-open-dkms")  # modular, its stream not enabled yet
        assert hidden.returncode != 0 and "kmod-nvidia-open-dkms" not in hidden.stdout, hidden.stdout
        assert dnf("module", "enable", "nvidia-driver:580-open").returncode == 0
        got = dnf("install", "kmod-nvidia-open-dkms-580.82.07*", "nvidia-driver-580.82.07*")
        assert got.returncode == 0, got.stdout + got.stderr
        names = subprocess.run(["rpm", "--root", str(work / "root"), "-qa", "--qf", "%{NAME}-%{VERSION}\n"],
                               capture_output=True, text=True, timeout=60).stdout.split()
        if not names:  # Debian's rpm keeps its database elsewhere by default
            names = subprocess.run(["rpm", "--root", str(work / "root"), "--dbpath", "/var/lib/rpm", "-qa", "--qf",
                                    "%{NAME}-%{VERSION}\n"], capture_output=True, text=True, timeout=60).stdout.split()
        assert "kmod-nvidia-open-dkms-580.82.07" in names and "nvidia-driver-580.82.07" in names, names

        # apply's package check (the plan's streams) and verify --bundle (the lock's): the stream is published
        checked = _with_packages(site, served, repo / packages.SITE_KEY, tmp_path)
        p = resolve_packages(checked)
        assert check_repo(load_site(checked), sets=p) == []
        assert check_repo(load_site(checked), lock=lock) == []
        dkms_site = _with_packages(_stream_site(tmp_path, url, up.key, "proprietary"), served,
                                   repo / packages.SITE_KEY, tmp_path)
        assert check_repo(load_site(dkms_site), sets=resolve_packages(dkms_site)) == [
            "  rocky9.4: dnf module stream nvidia-driver:580-dkms: not in the site repository's modules metadata "
            "(it has nvidia-driver:580-open)",
            "  rocky9.4/kmod-nvidia-latest-dkms-580.82.07*: not in the site repository"]

        # a second bundle, the proprietary flavour, into the same repository: both streams published
        bundle2 = tmp_path / "bundle-dkms"
        _, lock2, _ = _stream_pull(_stream_site(tmp_path, url, up.key, "proprietary"), bundle2)
        assert lock2["complete"] is True, lock2["failed"]
        missing = check_repo(load_site(checked), lock=lock2)  # verify --bundle before its push: its stream is not there
        assert ("  rocky9.4: dnf module stream nvidia-driver:580-dkms: not in the site repository's modules metadata "
                "(it has nvidia-driver:580-open)") in missing, missing
        proc = _gi("mirror", "push", str(bundle2), "-s", str(site), "--repo-dir", str(repo), "--signing-home",
                   str(home))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "dnf module streams nvidia-driver:580-dkms, nvidia-driver:580-open" in proc.stdout + proc.stderr
        assert check_repo(load_site(dkms_site), sets=resolve_packages(dkms_site)) == []
        assert {s.spec for s in modulemd.read_file(repo / "packages" / "rocky9.4" / "modules" / "streams.yaml")} == {
            "nvidia-driver:580-open", "nvidia-driver:580-dkms"}
    finally:
        server.shutdown()
        server.server_close()

    # an upstream without modules metadata (its packages are not modular): resolved without the stream, said
    flat = up.www / "nvidia-rhel9-flat"
    shutil.copytree(upstream, flat)
    shutil.rmtree(flat / "repodata")
    subprocess.run(["createrepo_c", "--quiet", str(flat)], check=True, timeout=120)
    lines, lock4, _ = _stream_pull(_stream_site(tmp_path, f"{up.url}/{flat.name}", up.key, "open"),
                                   tmp_path / "bundle-flat")
    assert lock4["complete"] is True, lock4["failed"]
    assert ("packages rocky9.4: mirror.packageRepositories.rocky9.4 offer no nvidia-driver module (no modules "
            "metadata): resolved without the stream nvidia-driver:580-open; the nodes install the packages without "
            "it") in lines, lines
    assert lock4["packageSets"][0]["modules"] == [] and not [e for e in lock4["packages"] if e.get("modules")]
    assert ("kmod-nvidia-open-dkms", "3:580.82.07") in {(e["name"], e["version"].split("-")[0])
                                                       for e in lock4["packages"] if e.get("name")}

    # a branch the upstream has no stream of: the pull fails naming the streams it has, nothing carried
    from installer.mirror.common import PackageFailures

    with pytest.raises(PackageFailures) as err:
        _stream_pull(_stream_site(tmp_path, url, up.key, "open", "590"), tmp_path / "bundle-590")
    assert ("rocky9.4 (dkms, elfutils-libelf-devel, gcc, kmod-nvidia-open-dkms-590*, make, nvidia-driver-590*, "
            "nvidia-driver-cuda-590*, nvidia-persistenced): dnf module stream nvidia-driver:590-open is not in "
            "mirror.packageRepositories.rocky9.4 (the module nvidia-driver is, with the streams 580-dkms, 580-open)"
            ) in err.value.message, err.value.message
    assert not list((tmp_path / "bundle-590" / "packages" / "rocky9.4").glob("*.rpm"))


def resolve_packages(site: Path):
    from installer.config import load_site
    from installer.plan import Options, resolve

    return resolve(load_site(site), Options(os_tags=("rocky9.4",))).artifacts(()).packages
