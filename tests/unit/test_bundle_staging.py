"""A bundle file swapped between its check and its use is never published, indexed, signed or pushed.

Someone who can write the bundle directory (a transfer share, a USB disk) but holds no signing key waits until push
has checked a file against the signed lock and then replaces it. push reads every bundle file once into a private
staging directory (installer.mirror.staging) and uses only that copy; the swap is done here from the hook the staging
code calls right after each check (staging.after_check) -- the exact moment, not a race. Each case asserts that what
got published or pushed is the original, verified bytes, and that the staging directory is gone afterwards.

Real parts: dpkg-deb builds the packages, apt-ftparchive indexes them, gpg signs, helm writes index.yaml; the
registry side is a logging stand-in for skopeo / `helm push` (it records the bytes it was handed and fails the
read-back, as an unreachable registry would).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from installer.errors import EXIT_ENVIRONMENT, ConfigError, GpuInstallError
from installer.mirror import charts, packages, staging
from installer.mirror import common as common
from installer.mirror import images as m
from tests.conftest import need
from tests.unit.test_bundle_adversarial import REGISTRY, SITE, _blob, _bundle, _chart_tgz, _edit, _lock

RUNFILE = "NVIDIA-Linux-x86_64-550.90.07.run"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _site(**more):
    from installer.config import parse_site

    return parse_site({**copy.deepcopy(SITE), **more})


@pytest.fixture
def base(tmp_path) -> Path:
    """The directory push makes its staging directory in: empty again after every push."""
    path = tmp_path / "staging-base"
    path.mkdir()
    return path


@pytest.fixture
def swap(monkeypatch):
    """swap(name, act): act(bundle path) runs right after the file of that name was staged and checked (once)."""
    done: list[str] = []

    def arm(name: str, act) -> list[str]:
        def hook(src: Path, dest: Path) -> None:
            if src.name == name and not done:
                done.append(str(dest))
                act(src)

        monkeypatch.setattr(staging, "after_check", hook)
        return done

    return arm


def _replace(path: Path, data: bytes) -> None:
    """What the bundle's writer does: a new file renamed over the checked one."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _bin(tmp_path: Path, monkeypatch, name: str, script: str) -> Path:
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / name


# ---------------------------------------------------------------- packages


def _deb(out: Path, name: str, version: str, payload: bytes) -> bytes:
    need(shutil.which("dpkg-deb"), "dpkg-deb missing (scripts/apt-packages.txt)")
    root = out.parent / f"{name}-{version}-{_sha(payload)[:8]}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
                                             "Maintainer: test <t@example>\nDescription: test\n")
    (root / "usr" / "share" / name).mkdir(parents=True)
    (root / "usr" / "share" / name / "payload").write_bytes(payload)
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    return out.read_bytes()


def test_a_deb_swapped_after_its_check_is_never_indexed_or_signed(tmp_path, base, swap):
    need(shutil.which("apt-ftparchive") and shutil.which("gpg"), "apt-ftparchive / gpg missing")
    bundle, _ = _bundle(tmp_path)
    rel = "packages/ubuntu22.04/gpu-test_1.0_amd64.deb"
    (bundle / rel).parent.mkdir(parents=True)
    good = _deb(bundle / rel, "gpu-test", "1.0", b"the signed package")
    evil = _deb(tmp_path / "evil.deb", "gpu-test", "1.0", b"runs as root on every node")
    lock = _edit(bundle, lambda lock: lock.update(packages=[
        {"os": "ubuntu22.04", "manager": "apt", "file": rel, "name": "gpu-test", "version": "1.0", "arch": "amd64",
         "sha256": _sha(good), "size": len(good)}]))
    staged = swap("gpu-test_1.0_amd64.deb", lambda path: _replace(path, evil))
    repo = tmp_path / "repo"
    packages.publish(bundle, lock, repo, tmp_path / "signing", staging_dir=base)
    assert staged and (bundle / rel).read_bytes() == evil, "the swap happened after the check"
    published = repo / "packages" / "ubuntu22.04" / "pool" / "main" / "gpu-test_1.0_amd64.deb"
    assert published.read_bytes() == good
    index = (repo / "packages" / "ubuntu22.04" / "dists" / packages.SUITE / "main" / "binary-amd64" / "Packages")
    assert f"SHA256: {_sha(good)}" in index.read_text() and _sha(evil) not in index.read_text()
    assert list(base.iterdir()) == [], "the staging directory is removed"


def test_a_package_that_does_not_match_stops_push_before_anything_is_published(tmp_path, base):
    bundle, _ = _bundle(tmp_path)
    rel = "packages/ubuntu22.04/x_1_amd64.deb"
    (bundle / rel).parent.mkdir(parents=True)
    (bundle / rel).write_bytes(b"other bytes")
    lock = _edit(bundle, lambda lock: lock.update(packages=[
        {"os": "ubuntu22.04", "manager": "apt", "file": rel, "sha256": _sha(b"the bytes!!"), "size": 11}]))
    with pytest.raises(ConfigError, match=f"{rel}: sha256 {_sha(b'other bytes')}, the lock says") as exc:
        packages.publish(bundle, lock, tmp_path / "repo", tmp_path / "signing", staging_dir=base)
    assert exc.value.exit_code == 2
    assert not (tmp_path / "repo").exists() and not (tmp_path / "signing").exists() and list(base.iterdir()) == []


# ---------------------------------------------------------------- the runfile and the chart


def _runfile_bundle(tmp_path: Path) -> tuple[Path, dict, bytes, object]:
    bundle, _ = _bundle(tmp_path)
    data = b"#!/bin/sh\necho the verified runfile\n"
    (bundle / "files").mkdir()
    (bundle / "files" / RUNFILE).write_bytes(data)
    lock = _edit(bundle, lambda lock: lock.update(files=[
        {"name": RUNFILE, "source": f"https://files.example/{RUNFILE}", "file": f"files/{RUNFILE}",
         "sha256": _sha(data), "size": len(data)}]))
    site = _site(driver={"mode": "runfile", "runfile": f"https://files.example/{RUNFILE}", "runfileSha256": _sha(data)})
    return bundle, lock, data, site


def test_a_runfile_replaced_by_a_symlink_after_its_check_publishes_the_verified_bytes(tmp_path, base, swap):
    bundle, lock, data, site = _runfile_bundle(tmp_path)
    secret = tmp_path / "root-only"
    secret.write_bytes(b"root:$6$secret-hash:19000:0:99999:7:::\n")
    secret.chmod(0o600)

    def to_secret(path: Path) -> None:
        path.unlink()
        path.symlink_to(secret)

    staged = swap(RUNFILE, to_secret)
    repo = tmp_path / "repo"
    charts.push(site, bundle, lock, config_json=None, repo_dir=repo, staging_dir=base)
    assert staged and (bundle / "files" / RUNFILE).is_symlink()
    assert (repo / "files" / RUNFILE).read_bytes() == data
    assert f"{_sha(data)}  {RUNFILE}" in (repo / "files" / "SHA256SUMS").read_text()
    assert list(base.iterdir()) == []


def test_a_runfile_that_is_a_symlink_at_its_check_is_refused_without_being_read(tmp_path, base):
    bundle, lock, data, site = _runfile_bundle(tmp_path)
    inside = bundle / "files" / "copy.run"
    inside.write_bytes(data)  # the same bytes, inside the bundle: only the link gives it away
    (bundle / "files" / RUNFILE).unlink()
    (bundle / "files" / RUNFILE).symlink_to(inside)
    with pytest.raises(ConfigError, match=f"files/{RUNFILE} is missing or not a regular file \\(a symbolic link"):
        charts.push(site, bundle, lock, config_json=None, repo_dir=tmp_path / "repo", staging_dir=base)
    assert not (tmp_path / "repo").exists() and list(base.iterdir()) == []


@pytest.fixture
def fake_helm(tmp_path, monkeypatch):
    """helm whose `push` records the sha256 of the archive it was handed (a registry that got it) and whose `pull`
    finds nothing; every other command (repo index) is the real helm. Returns the recorded digests."""
    from installer.tools import helm_path

    real = helm_path()
    need(real.is_file(), "helm missing (scripts/bootstrap installs it)")
    log = tmp_path / "helm-pushed.log"
    log.write_text("")
    helm = _bin(tmp_path, monkeypatch, "helm", f'case "$1" in\n  push) sha256sum "$2" >> "{log}"; exit 0;;\n'
                                              f'  pull) exit 1;;\nesac\nexec "{real}" "$@"\n')
    monkeypatch.setenv("GPU_INSTALL_HELM", str(helm))
    return lambda: [ln.split()[0] for ln in log.read_text().splitlines()]


def test_a_chart_swapped_after_its_check_is_never_pushed_or_indexed(tmp_path, base, swap, fake_helm):
    bundle, _ = _bundle(tmp_path)
    tgz = bundle / "charts" / "gpu-operator-v24.9.2.tgz"
    _chart_tgz(tgz, "gpu-operator", "v24.9.2")
    good = tgz.read_bytes()
    evil_tgz = tmp_path / "evil" / "gpu-operator-v24.9.2.tgz"
    _chart_tgz(evil_tgz, "gpu-operator", "v24.9.2")
    with open(evil_tgz, "ab") as fh:
        fh.write(b"\0" * 512)  # another archive of the same chart name and version (an extra DaemonSet, say)
    evil = evil_tgz.read_bytes()
    assert _sha(evil) != _sha(good)
    lock = _edit(bundle, lambda lock: lock.update(charts=[
        {"name": "gpu-operator", "version": "v24.9.2", "repository": "https://x", "file": "charts/" + tgz.name,
         "sha256": _sha(good), "size": len(good)}]))
    staged = swap(tgz.name, lambda path: _replace(path, evil))
    repo = tmp_path / "repo"
    with pytest.raises(charts.ChartFailures, match="pulled back nothing"):  # the stand-in registry keeps nothing
        charts.push(_site(), bundle, lock, config_json=None, repo_dir=repo, staging_dir=base)
    assert staged and tgz.read_bytes() == evil
    assert fake_helm() == [_sha(good)], "helm push got the verified archive"
    assert (repo / "charts" / tgz.name).read_bytes() == good
    assert f"digest: {_sha(good)}" in (repo / "charts" / "index.yaml").read_text()
    assert list(base.iterdir()) == []


# ---------------------------------------------------------------- images


@pytest.fixture
def fake_skopeo(tmp_path, monkeypatch):
    """skopeo whose `copy` records, for a dir: source, each file name and the sha256 of its bytes (what a registry
    would have received) and whose `inspect` finds nothing. Returns {file name: sha256} of every copy."""
    log = tmp_path / "skopeo-copied.log"
    log.write_text("")
    _bin(tmp_path, monkeypatch, "skopeo",
         f'if [ "$1" = copy ]; then\n  for a in "$@"; do case "$a" in dir:*) (cd "${{a#dir:}}" && sha256sum *) '
         f'>> "{log}";; esac; done\n  exit 0\nfi\nexit 1\n')
    return lambda: {ln.split()[1]: ln.split()[0] for ln in log.read_text().splitlines()}


@pytest.mark.parametrize("how", ["blob", "directory"])
def test_an_image_swapped_after_its_check_is_never_pushed(tmp_path, base, swap, fake_skopeo, how):
    bundle, digest = _bundle(tmp_path)
    import json

    layer = json.loads(_blob(bundle, digest).read_bytes())["layers"][0]["digest"]
    original = _blob(bundle, layer).read_bytes()
    forged = bytes(b ^ 0xFF for b in original)  # same size, other bytes

    def act(path: Path) -> None:
        if how == "blob":
            _replace(path, forged)
        else:  # the whole layout renamed away, another in its place
            os.rename(bundle / "images", bundle / "images.checked")
            shutil.copytree(bundle / "images.checked", bundle / "images")
            _replace(_blob(bundle, layer), forged)

    staged = swap(layer.split(":", 1)[1], act)
    with pytest.raises(m.TransferFailures, match="after the copy the registry has nothing"):
        m.push(_site(), bundle, config_json=None, lock=_lock(bundle), jobs=1, staging_dir=base)
    assert staged and _blob(bundle, layer).read_bytes() == forged
    copied = fake_skopeo()
    assert copied[layer.split(":", 1)[1]] == _sha(original), "skopeo read the verified layer"
    assert copied["manifest.json"] == digest.split(":", 1)[1]
    assert all(name == sha for name, sha in copied.items() if name not in ("manifest.json", "version")), copied
    assert list(base.iterdir()) == []


def test_every_image_is_staged_and_checked_before_the_first_push(tmp_path, base, fake_skopeo):
    """A layer that does not match its digest stops push (exit 2) before skopeo copies anything: no image that was
    already good can have been tagged in the registry by then."""
    bundle, digest = _bundle(tmp_path)
    import json

    layer = json.loads(_blob(bundle, digest).read_bytes())["layers"][0]["digest"]
    data = bytearray(_blob(bundle, layer).read_bytes())
    data[0] ^= 1
    _blob(bundle, layer).write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=f"blob {layer} does not match its digest"):
        m.push(_site(), bundle, config_json=None, lock=_lock(bundle), jobs=1, staging_dir=base)
    assert fake_skopeo() == {} and list(base.iterdir()) == []


# ---------------------------------------------------------------- the staging directory


def test_too_little_space_for_the_staging_directory_is_exit_8_naming_it(tmp_path, base):
    bundle, _ = _bundle(tmp_path)
    free = shutil.disk_usage(base).free
    with staging.staging(base, bundle) as into, pytest.raises(common.DiskFull) as exc:
        m.stage(_site(), bundle, _lock(bundle), into, also_needs=free + (1 << 40))
    assert exc.value.exit_code == EXIT_ENVIRONMENT == 8
    assert str(into.path) in exc.value.message and "bytes free" in exc.value.message
    assert "--staging-dir" in (exc.value.hint or "")
    assert list(base.iterdir()) == []


def test_the_staging_directory_is_private_and_removed_even_on_ctrl_c(tmp_path, base, swap):
    bundle, digest = _bundle(tmp_path)
    seen: list[int] = []

    def interrupt(path: Path) -> None:
        seen.append(os.stat(base / next(iter(os.listdir(base)))).st_mode & 0o777)
        raise KeyboardInterrupt

    swap(digest.split(":", 1)[1], interrupt)
    with pytest.raises(KeyboardInterrupt):
        m.push(_site(), bundle, config_json=None, lock=_lock(bundle), jobs=1, staging_dir=base)
    assert seen == [0o700] and list(base.iterdir()) == []


def test_a_staging_directory_inside_the_bundle_is_refused(tmp_path):
    bundle, _ = _bundle(tmp_path)
    with pytest.raises(ConfigError, match="inside the bundle"):
        m.push(_site(), bundle, config_json=None, lock=_lock(bundle), jobs=1, staging_dir=bundle / "images")


def test_mirror_push_stages_in_the_staging_dir_and_removes_it(tmp_path, base, cli, write_site, fake_skopeo):
    from tests.unit.test_bundle_adversarial import _signed

    bundle, digest = _bundle(tmp_path)
    pub = _signed(tmp_path, bundle)
    rc, _, err = cli("mirror", "push", bundle, "-s", write_site(copy.deepcopy(SITE)), "--trusted-key", pub,
                     "--staging-dir", base, "-q")
    assert rc == 4 and REGISTRY in err, err  # the stand-in registry keeps nothing
    assert fake_skopeo()["manifest.json"] == digest.split(":", 1)[1]
    assert list(base.iterdir()) == []


# ---------------------------------------------------------------- .part files


def test_a_planted_part_symlink_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    src = tmp_path / "src"
    src.write_bytes(b"published bytes")
    dest = tmp_path / "repo" / "x.run"
    dest.parent.mkdir()
    part = dest.with_name(".x.run.part")
    part.symlink_to(victim)
    assert common.copy_in(src, dest, _sha(b"published bytes"))
    assert victim.read_bytes() == b"keep me" and dest.read_bytes() == b"published bytes"
    assert not os.path.lexists(part)
    part.symlink_to(victim)
    common.fetch(str(src), tmp_path / "repo" / "x.run", None)  # fetch's .part: the same name, the same rule
    assert victim.read_bytes() == b"keep me" and not os.path.lexists(part)
    part.write_bytes(b"a stale half file of a killed run")
    dest.unlink()
    assert common.copy_in(src, dest, _sha(b"published bytes")) and dest.read_bytes() == b"published bytes"


def test_a_part_name_that_cannot_be_created_new_is_exit_8(tmp_path):
    dest = tmp_path / "x.run"
    dest.with_name(".x.run.part").mkdir()  # not removable as a file: nothing is written through it either
    (tmp_path / "src").write_bytes(b"x")
    with pytest.raises(GpuInstallError, match="cannot create it new") as exc:
        common.copy_in(tmp_path / "src", dest, _sha(b"x"))
    assert exc.value.exit_code == 8


def test_a_part_symlink_planted_again_after_the_stale_one_was_removed_is_not_followed(tmp_path, monkeypatch):
    """The race the O_CREAT|O_EXCL|O_NOFOLLOW open closes: the writer of the directory plants the symlink again
    right after the stale .part was removed (from a wrapper around that removal, not a race)."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "src").write_bytes(b"published bytes")
    dest = tmp_path / "x.run"
    part = dest.with_name(".x.run.part")
    part.symlink_to(victim)
    real_unlink = os.unlink

    def unlink_then_plant(path, *a, **kw):
        real_unlink(path, *a, **kw)
        if Path(path) == part:
            part.symlink_to(victim)

    monkeypatch.setattr(os, "unlink", unlink_then_plant)
    with pytest.raises(GpuInstallError, match=r"\.x\.run\.part: cannot create it new \(File exists\)"):
        common.copy_in(tmp_path / "src", dest, _sha(b"published bytes"))
    assert victim.read_bytes() == b"keep me" and not dest.exists()


def test_mirror_push_publishes_nothing_until_every_file_is_staged(tmp_path, base, cli, write_site, fake_skopeo):
    """A good runfile and image, a package that does not match: exit 2, and nothing pushed or published -- the
    package is staged (and fails) before the first image, chart or file goes anywhere."""
    from tests.unit.test_bundle_adversarial import _signed

    bundle, lock, data, _ = _runfile_bundle(tmp_path)
    rel = "packages/ubuntu22.04/x_1_amd64.deb"
    (bundle / rel).parent.mkdir(parents=True)
    (bundle / rel).write_bytes(b"other bytes")
    _edit(bundle, lambda lock: lock.update(packages=[
        {"os": "ubuntu22.04", "manager": "apt", "file": rel, "sha256": _sha(b"the bytes!!"), "size": 11}]))
    pub = _signed(tmp_path, bundle)
    site = write_site({**copy.deepcopy(SITE), "driver": {"mode": "runfile", "runfile": f"https://files.example/"
                                                                                       f"{RUNFILE}",
                                                         "runfileSha256": _sha(data)}})
    repo = tmp_path / "repo"
    rc, _, err = cli("mirror", "push", bundle, "-s", site, "--trusted-key", pub, "--staging-dir", base,
                     "--repo-dir", repo, "--signing-home", tmp_path / "signing")
    assert rc == 2 and f"{rel}: sha256 {_sha(b'other bytes')}, the lock says" in err, err
    assert fake_skopeo() == {} and not repo.exists() and not (tmp_path / "signing").exists()
    assert list(base.iterdir()) == []
