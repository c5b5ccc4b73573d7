"""Forged and hostile bundles: everything `mirror push` / `mirror verify --bundle` read from a bundle is untrusted.

Each case starts from a well-formed bundle (a real OCI layout of one STAND-IN image at the exact source of an image the
site's plan pulls, and its lock), changes what an attacker controls, and calls push at the layer below the lock's
signature check (the lock handed in as `mirror push` hands it on after verifying the signature: a bundle signed by a
pinned key that turned hostile, or a key stolen from the connected side). The refusal must come before anything is
copied: a spy `skopeo` / `helm` on PATH logs every call and then runs the real tool, and records no call at all. The
positive control shows the spy sees a copy of the unforged bundle.

A FIFO as a blob runs in a child process with a wall-clock limit (and pytest-timeout around the test): a hang fails
the test instead of stalling it.
"""

from __future__ import annotations

import copy
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from installer.errors import EXIT_USAGE, ConfigError
from installer.mirror import bundle as b
from installer.mirror import charts, packages
from installer.mirror import images as m
from tests.conftest import need, staged_charts, staged_packages

REGISTRY = "127.0.0.1:9"  # discard port: nothing answers there, so even a copy that ran would not land anywhere
SOURCE = "nvcr.io/nvidia/gpu-operator:v24.9.2"  # an image the plan of SITE pulls (release v24.9.2)
DESTINATION = f"{REGISTRY}/mirror/nvidia/gpu-operator:v24.9.2"  # registry.prefix mirror, layout flat
SITE = {"operator": {"version": "v24.9.2"}, "registry": {"host": REGISTRY, "prefix": "mirror"}}


def _site(data: dict | None = None):
    from installer.config import parse_site

    return parse_site(copy.deepcopy(data or SITE))


@pytest.fixture
def spy(tmp_path, monkeypatch):
    """skopeo and helm spies first on PATH (helm also as GPU_INSTALL_HELM): each logs its argv, then runs the real
    tool. Returns the log's lines."""
    need(shutil.which("skopeo"), "skopeo missing (scripts/apt-packages.txt)")
    real_skopeo = shutil.which("skopeo")
    bin_dir = tmp_path / "spy-bin"
    bin_dir.mkdir()
    log = tmp_path / "spy.log"
    log.write_text("")
    from installer.tools import helm_path

    real_helm = helm_path()
    for name, real in (("skopeo", real_skopeo), ("helm", real_helm if real_helm.is_file() else None)):
        tail = f'exec "{real}" "$@"' if real else "exit 1"
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >> "{log}"\n{tail}\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("GPU_INSTALL_HELM", str(bin_dir / "helm"))
    return lambda: [ln for ln in log.read_text().splitlines() if ln]


def _bundle(tmp_path: Path) -> tuple[Path, str]:
    """A complete bundle of one image (SOURCE → DESTINATION): real OCI layout and lock; the manifest's digest."""
    from gpu_install_lab.images import write_layout

    bundle = tmp_path / "bundle"
    write_layout(bundle / "images", SOURCE, ["/bin/sh"], busybox=b"stand-in layer" * 16)
    index = json.loads((bundle / "images" / "index.json").read_text())
    digest = index["manifests"][0]["digest"]
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == SOURCE
    lock = {"schema": b.SCHEMA, "complete": True, "release": "v24.9.2", "registry": REGISTRY,
            "platform": "linux/amd64", "layout": "images", "failed": [],
            "images": [{"source": SOURCE, "destination": DESTINATION, "digest": digest, "refName": SOURCE,
                        "component": "operator", "size": 1}]}
    b.write_lock(bundle, lock)
    return bundle, digest


def _lock(bundle: Path) -> dict:
    return json.loads((bundle / b.LOCK).read_text())


def _edit(bundle: Path, change) -> dict:
    lock = _lock(bundle)
    change(lock)
    b.write_lock(bundle, lock)  # checksum recomputed, as a forger would
    return lock


def _push(site, bundle: Path, lock: dict | None = None):
    return m.push(site, bundle, config_json=None, lock=lock if lock is not None else _lock(bundle), jobs=1)


def _refused(spy, site, bundle: Path, match: str) -> ConfigError:
    with pytest.raises(ConfigError, match=match) as exc:
        _push(site, bundle)
    assert exc.value.exit_code == EXIT_USAGE == 2
    assert spy() == [], "nothing may be read or copied before the refusal"
    return exc.value


def _blob(bundle: Path, digest: str) -> Path:
    return bundle / "images" / "blobs" / "sha256" / digest.split(":", 1)[1]


def _put_blob(bundle: Path, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _blob(bundle, digest).write_bytes(data)
    return digest


def _name_in_index(bundle: Path, digest: str, media_type: str = "application/vnd.oci.image.index.v1+json") -> None:
    """index.json names digest as SOURCE, and the lock too (a forger controls both)."""
    path = bundle / "images" / "index.json"
    size = _blob(bundle, digest).lstat().st_size if _blob(bundle, digest).exists() else 1
    path.write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": media_type, "digest": digest, "size": size,
         "annotations": {"org.opencontainers.image.ref.name": SOURCE}}]}))
    _edit(bundle, lambda lock: lock["images"][0].update(digest=digest))


# ---------------------------------------------------------------- the positive control


def test_the_spy_sees_the_copy_of_an_unforged_bundle(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    with pytest.raises(m.TransferFailures) as exc:  # nothing listens at REGISTRY: the copy is tried and fails
        _push(_site(), bundle)
    assert DESTINATION in exc.value.message
    copies = [ln for ln in spy() if ln.startswith("skopeo copy")]
    assert len(copies) == 1 and copies[0].endswith(f"docker://{DESTINATION}"), spy()


# ---------------------------------------------------------------- destinations


@pytest.mark.parametrize("forged", [
    f"{REGISTRY}/payments/api:prod",  # another repository of the site registry
    "ghcr.io/victim-org/app:latest",  # another registry
    f"{REGISTRY}/mirror/../payments/api:prod",  # a path with ..
    f"{REGISTRY}/mirror/nvidia/gpu-operator:v24.9.3",  # another tag
])
def test_a_destination_other_than_the_site_computes_is_refused(tmp_path, spy, forged):
    bundle, _ = _bundle(tmp_path)
    _edit(bundle, lambda lock: lock["images"][0].update(destination=forged))
    err = _refused(spy, _site(), bundle, "is not where this site puts that image")
    assert f"images[0] ({SOURCE})" in err.message and f"expected {DESTINATION}" in err.message, err.message
    assert forged in err.message


@pytest.mark.parametrize("source", [
    f"{REGISTRY}/payments/api:prod",  # a source in the site registry maps to itself
    "payments/api:prod",  # Docker Hub: flat layout puts it at <host>/<prefix>/payments/api
    "nvcr.io/nvidia/gpu-operator:evil",  # a planned repository at another tag
    "nvcr.io/nvidia/cloud-native/dcgm:3.3.9-1-ubuntu22.04",  # a component this site does not deploy
])
def test_a_source_the_plan_does_not_pull_is_refused(tmp_path, spy, source):
    from installer.render.values import destination_ref

    site = _site()
    bundle, _ = _bundle(tmp_path)
    _edit(bundle, lambda lock: lock["images"][0].update(source=source, refName=m.ref_name(source),
                                                         destination=destination_ref(source, site.registry)))
    err = _refused(spy, site, bundle, "is not an image this site's plan pulls")
    assert source in err.message


def test_without_a_prefix_a_source_in_the_site_registry_is_still_refused(tmp_path, spy):
    """flat layout, no prefix: the mirror namespace is the whole registry; only the plan tells payments/api apart."""
    site = _site({"operator": {"version": "v24.9.2"}, "registry": {"host": REGISTRY}})
    bundle, _ = _bundle(tmp_path)
    forged = f"{REGISTRY}/payments/api:prod"
    _edit(bundle, lambda lock: lock["images"][0].update(source=forged, refName=forged, destination=forged))
    _refused(spy, site, bundle, f"{forged} is not an image this site's plan pulls")


def test_a_malformed_reference_digest_or_ref_name_is_refused(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    _edit(bundle, lambda lock: lock["images"][0].update(source="nvcr.io/nvidia/../gpu-operator:v24.9.2"))
    _refused(spy, _site(), bundle, "is not an image reference")
    bundle, digest = _bundle(tmp_path / "2")
    _edit(bundle, lambda lock: lock["images"][0].update(digest="sha256:../../etc"))
    _refused(spy, _site(), bundle, "is not sha256:<64 hex>")
    bundle, digest = _bundle(tmp_path / "3")
    _edit(bundle, lambda lock: lock["images"][0].update(refName="other"))
    _refused(spy, _site(), bundle, f"refName 'other', expected {SOURCE}")


def test_the_site_computes_the_destinations_the_plan_lists():
    """check_images' expected destination is the plan's own, for every image of a plan (both layouts, a prefix)."""
    from installer.plan import Options, resolve

    for registry in ({"host": "r.lab:5000", "prefix": "mirror"}, {"host": "r.lab:5000", "layout": "keep-host"}):
        site = _site({"operator": {"version": "v24.9.2"}, "registry": registry})
        plan = resolve(site, Options(os_tags=("ubuntu22.04",)))
        planned = m.planned_sources(_site({"operator": {"version": "v24.9.2"}, "registry": registry}))
        for img in plan.images:
            assert planned(img.source), img.source
            assert m.expected_destination(site, img.source) == img.destination
    assert m.expected_destination(_site(), SOURCE) == DESTINATION  # written out: no code computes the expectation


def test_verify_bundle_refuses_the_same_forged_lock(tmp_path, spy):
    from installer.mirror import verify

    bundle, _ = _bundle(tmp_path)
    lock = _edit(bundle, lambda lock: lock["images"][0].update(destination="ghcr.io/victim-org/app:latest"))
    with pytest.raises(ConfigError, match=f"expected {DESTINATION}"):
        verify.from_lock(_site(), lock, bundle)
    assert spy() == []


# ---------------------------------------------------------------- the layout's path


def test_a_layout_outside_the_bundle_is_refused(tmp_path, spy):
    bundle, _ = _bundle(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(bundle / "images", elsewhere)
    for layout, match in ((str(elsewhere), "is not a path inside the bundle"),
                          ("../elsewhere", "is not a path inside the bundle"),
                          ("images/../../elsewhere", "is not a path inside the bundle")):
        _edit(bundle, lambda lock, layout=layout: lock.update(layout=layout))
        err = _refused(spy, _site(), bundle, match)
        assert "layout" in err.message and layout in err.message
    (bundle / "link").symlink_to(elsewhere)
    _edit(bundle, lambda lock: lock.update(layout="link"))
    _refused(spy, _site(), bundle, f"layout 'link' leads outside the bundle \\(to {elsewhere}\\)")


def test_blobs_linked_out_of_the_bundle_are_refused(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    elsewhere = tmp_path / "elsewhere-blobs"
    shutil.move(bundle / "images" / "blobs", elsewhere)
    (bundle / "images" / "blobs").symlink_to(elsewhere)  # the layout's blobs/ directory itself
    _refused(spy, _site(), bundle, "leads outside the bundle")
    bundle, digest = _bundle(tmp_path / "2")
    secret = tmp_path / "secret"
    secret.write_bytes(_blob(bundle, digest).read_bytes())  # the same bytes, so only the path gives it away
    _blob(bundle, digest).unlink()
    _blob(bundle, digest).symlink_to(secret)  # one blob
    _refused(spy, _site(), bundle, "leads outside the bundle")


def test_a_blob_that_is_a_symlink_inside_the_bundle_is_refused(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    real = bundle / "images" / "manifest-copy"
    real.write_bytes(_blob(bundle, digest).read_bytes())
    _blob(bundle, digest).unlink()
    _blob(bundle, digest).symlink_to(real)
    _refused(spy, _site(), bundle, f"blob {digest}: a symbolic link, not a regular file")


# ---------------------------------------------------------------- hostile layouts


def test_an_index_that_lists_itself_is_exit_2_not_a_recursion_error(tmp_path, spy):
    bundle, _ = _bundle(tmp_path)
    # an index naming its own digest cannot hash to it: the file stored under the name is checked before it is read
    # as an index, so the loop is never entered
    body = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []}
    data = json.dumps(body).encode()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    body["manifests"] = [{"mediaType": "application/vnd.oci.image.index.v1+json", "digest": digest, "size": len(data)}]
    _blob(bundle, digest).write_bytes(json.dumps(body).encode())
    _name_in_index(bundle, digest)
    err = _refused(spy, _site(), bundle, f"blob {digest} does not match its digest")
    assert "RecursionError" not in err.message


def test_indexes_nested_beyond_the_bound_are_refused(tmp_path, spy):
    """A chain of real indexes (each digest correct) deeper than MAX_DEPTH: bounded, named, exit 2."""
    bundle, digest = _bundle(tmp_path)
    top, size = digest, _blob(bundle, digest).stat().st_size
    for _ in range(m.MAX_DEPTH + 2):
        data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
            {"mediaType": "application/vnd.oci.image.index.v1+json", "digest": top, "size": size}]}).encode()
        top, size = _put_blob(bundle, data), len(data)
    _name_in_index(bundle, top)
    _refused(spy, _site(), bundle, f"indexes nested more than {m.MAX_DEPTH} deep")


def test_a_diamond_of_indexes_is_not_a_cycle():
    """The same manifest listed twice (a shared child) is walked once, without an error."""
    import tempfile

    from gpu_install_lab.images import write_layout

    with tempfile.TemporaryDirectory() as tmp:
        layout = Path(tmp) / "images"
        write_layout(layout, SOURCE, ["/bin/sh"], busybox=b"x" * 64)
        child = json.loads((layout / "index.json").read_text())["manifests"][0]
        data = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                           "manifests": [child, child]}).encode()
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest.split(":")[1]).write_bytes(data)
        assert child["digest"] in m.Layout(layout, root=Path(tmp)).closure(digest)


def _hangs_not(bundle: Path) -> subprocess.CompletedProcess[str]:
    """push of the bundle in a child process, killed after 60 s (a FIFO read would block forever)."""
    code = ("import json, sys; from pathlib import Path; from installer.config import parse_site; "
            "from installer.errors import GpuInstallError; from installer.mirror import images as m; "
            "bundle = Path(sys.argv[1]); lock = json.loads((bundle / 'bundle.lock.json').read_text())\n"
            "try:\n    m.push(parse_site(json.loads(sys.argv[2])), bundle, config_json=None, lock=lock, jobs=1)\n"
            "except GpuInstallError as exc:\n    print(exc.message); sys.exit(exc.exit_code)\n")
    try:
        return subprocess.run([sys.executable, "-c", code, str(bundle), json.dumps(SITE)], capture_output=True,
                              text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        pytest.fail("push hung on a FIFO in the bundle")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["manifest", "layer"])
def test_a_fifo_as_a_blob_is_refused_without_hanging(tmp_path, spy, which):
    bundle, digest = _bundle(tmp_path)
    doc = json.loads(_blob(bundle, digest).read_bytes())
    target = digest if which == "manifest" else doc["layers"][0]["digest"]
    _blob(bundle, target).unlink()
    os.mkfifo(_blob(bundle, target))
    proc = _hangs_not(bundle)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"blob {target}: a FIFO, not a regular file" in proc.stdout, proc.stdout
    assert spy() == []


def test_an_oversized_manifest_is_refused_before_it_is_read_whole(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    doc = json.loads(_blob(bundle, digest).read_bytes())
    doc["annotations"] = {"padding": "x" * (m.MAX_JSON + 1)}
    big = _put_blob(bundle, json.dumps(doc).encode())  # a correct digest: only the size is wrong
    _name_in_index(bundle, big, doc["mediaType"])
    _refused(spy, _site(), bundle, f"blob {big}: {_blob(bundle, big).stat().st_size} bytes, more than the "
                                   f"{m.MAX_JSON}")


def test_a_manifest_is_checked_against_its_digest_before_it_is_parsed(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    _blob(bundle, digest).write_bytes(b"{not json" + b"[" * 100000)  # parsed, this would be a JSON error
    _refused(spy, _site(), bundle, f"blob {digest} does not match its digest")


def test_a_layer_whose_bytes_do_not_match_its_digest_is_refused(tmp_path, spy):
    bundle, digest = _bundle(tmp_path)
    layer = json.loads(_blob(bundle, digest).read_bytes())["layers"][0]["digest"]
    data = bytearray(_blob(bundle, layer).read_bytes())
    data[-1] ^= 1  # same size, other content
    _blob(bundle, layer).write_bytes(bytes(data))
    _refused(spy, _site(), bundle, f"blob {layer} does not match its digest")


@pytest.mark.parametrize("body, match", [
    (b"[1, 2]", "not a JSON object"),
    (b"{\"schemaVersion\": 2, \"layers\": {\"digest\": 1}}", "layers is not a list"),
    (b"{\"schemaVersion\": 2, \"layers\": [{\"digest\": \"sha256:../../etc/passwd\"}]}", "is not a sha256 digest"),
    (b"{\"schemaVersion\": 2, \"manifests\": [\"x\"]}", "a descriptor without a digest"),
    (b"[" * 200000 + b"]" * 200000, "not valid JSON"),
])
def test_malformed_manifests_with_a_correct_digest_are_named(tmp_path, spy, body, match):
    bundle, _ = _bundle(tmp_path)
    digest = _put_blob(bundle, body)
    _name_in_index(bundle, digest, "application/vnd.oci.image.manifest.v1+json")
    err = _refused(spy, _site(), bundle, match)
    assert digest in err.message


@pytest.mark.timeout(120)
def test_a_hostile_index_json_is_refused(tmp_path, spy):
    bundle, _ = _bundle(tmp_path)
    (bundle / "images" / "index.json").unlink()
    os.mkfifo(bundle / "images" / "index.json")
    proc = _hangs_not(bundle)
    assert proc.returncode == 2 and "index.json: a FIFO, not a regular file" in proc.stdout, proc.stdout
    assert spy() == []


# ---------------------------------------------------------------- charts and files


def _chart_tgz(path: Path, name: str, version: str) -> None:
    import io

    path.parent.mkdir(parents=True, exist_ok=True)
    data = f"apiVersion: v2\nname: {name}\nversion: {version}\n".encode()
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(f"{name.replace('/', '_')}/Chart.yaml")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _with_chart(bundle: Path, name: str, version: str, file: str | None = None) -> dict:
    file = file or f"charts/{name}-{version}.tgz"
    tgz = bundle / "charts" / "the.tgz"
    _chart_tgz(tgz, name, version)
    entry = {"name": name, "version": version, "repository": "https://x", "file": file,
             "sha256": charts.sha256_of(tgz), "size": tgz.stat().st_size}
    return _edit(bundle, lambda lock: lock.update(charts=[entry]))


@pytest.mark.parametrize("name, version, match", [
    ("../../payments", "v24.9.2", "is not a chart name"),
    ("gpu-operator/../../x", "v24.9.2", "is not a chart name"),
    ("gpu-operator", "v24.9.2/../../x", "is not a SemVer version"),
    ("payments", "v24.9.2", "chart payments v24.9.2 is not a chart this site's plan carries"),
    ("gpu-operator", "v24.9.3", "chart gpu-operator v24.9.3 is not a chart this site's plan carries"),
])
def test_a_chart_the_plan_does_not_carry_is_refused_before_helm_runs(tmp_path, spy, name, version, match):
    bundle, _ = _bundle(tmp_path)
    lock = _with_chart(bundle, name, version)
    with pytest.raises(ConfigError, match=match) as exc:
        staged_charts(bundle, lock, _site())
    assert exc.value.exit_code == 2
    with pytest.raises(ConfigError, match=match):
        charts.push(_site(), bundle, lock, config_json=None, repo_dir=tmp_path / "repo")
    assert spy() == [] and not (tmp_path / "repo").exists()


def test_a_chart_archive_that_is_another_chart_is_refused(tmp_path, spy):
    bundle, _ = _bundle(tmp_path)
    lock = _with_chart(bundle, "gpu-operator", "v24.9.2")
    tgz = bundle / "charts" / "gpu-operator-v24.9.2.tgz"
    _chart_tgz(tgz, "payments", "v24.9.2")  # helm push takes the name from Chart.yaml, not from the lock
    lock["charts"][0].update(sha256=charts.sha256_of(tgz), size=tgz.stat().st_size)
    with pytest.raises(ConfigError, match="the archive is chart payments v24.9.2, the lock says gpu-operator"):
        charts.push(_site(), bundle, lock, config_json=None, repo_dir=None)
    assert spy() == []


def test_a_chart_file_linked_out_of_the_bundle_is_refused(tmp_path, spy):
    bundle, _ = _bundle(tmp_path)
    lock = _with_chart(bundle, "gpu-operator", "v24.9.2")
    outside = tmp_path / "outside.tgz"
    shutil.move(bundle / "charts" / "the.tgz", outside)
    (bundle / "charts" / "gpu-operator-v24.9.2.tgz").symlink_to(outside)
    with pytest.raises(ConfigError, match="leads outside the bundle"):
        staged_charts(bundle, lock, _site())
    assert spy() == []


def test_a_file_that_is_not_the_plans_runfile_is_refused(tmp_path):
    bundle, _ = _bundle(tmp_path)
    (bundle / "files").mkdir()
    (bundle / "files" / "evil.run").write_bytes(b"#!/bin/sh\n")
    lock = _edit(bundle, lambda lock: lock.update(files=[{"name": "evil.run", "file": "files/evil.run",
                                                          "sha256": charts.sha256_of(bundle / "files" / "evil.run")}]))
    with pytest.raises(ConfigError, match="files\\[0\\]: 'evil.run' is not a file this site's plan carries"):
        staged_charts(bundle, lock, _site())


# ---------------------------------------------------------------- package repository paths


@pytest.mark.parametrize("entry, match", [
    ({"os": "../../etc", "file": "packages/../../etc/x.deb"}, "is not a node OS tag"),
    ({"os": "ubuntu22.04", "file": "packages/ubuntu22.04/../../../x.deb"}, "is not packages/ubuntu22.04/"),
    ({"os": "ubuntu22.04", "file": "/etc/x.deb"}, "is not packages/ubuntu22.04/"),
    ({"os": "ubuntu22.04", "manager": "sh", "file": "packages/ubuntu22.04/x.deb"}, "is not apt or dnf"),
    ({"os": "evilos1", "file": "packages/evilos1/x.deb"}, "is not a node OS tag"),
])
def test_package_entries_outside_their_repository_are_refused(tmp_path, entry, match):
    bundle, _ = _bundle(tmp_path)
    full = {"manager": "apt", "sha256": "0" * 64, "size": 1, **entry}
    lock = _edit(bundle, lambda lock: lock.update(packages=[full]))
    with pytest.raises(ConfigError, match=match) as exc:
        packages.publish(bundle, lock, tmp_path / "repo", tmp_path / "home")
    assert exc.value.exit_code == 2 and not (tmp_path / "repo").exists() and not (tmp_path / "home").exists()
    base = _edit(bundle, lambda lock: lock.update(packages=[], packageBase=[full]))
    with pytest.raises(ConfigError, match=match):
        staged_packages(bundle, base)


def test_a_package_file_linked_out_of_the_bundle_is_refused(tmp_path):
    bundle, _ = _bundle(tmp_path)
    outside = tmp_path / "outside.deb"
    outside.write_bytes(b"deb")
    (bundle / "packages" / "ubuntu22.04").mkdir(parents=True)
    (bundle / "packages" / "ubuntu22.04" / "x_1_amd64.deb").symlink_to(outside)
    lock = _edit(bundle, lambda lock: lock.update(packages=[
        {"os": "ubuntu22.04", "manager": "apt", "file": "packages/ubuntu22.04/x_1_amd64.deb",
         "sha256": hashlib.sha256(b"deb").hexdigest(), "size": 3}]))
    with pytest.raises(ConfigError, match="leads outside the bundle"):
        staged_packages(bundle, lock)


# ---------------------------------------------------------------- InRelease: only the signed text counts


def test_unsigned_lines_before_the_signed_inrelease_block_do_not_count(tmp_path):
    """A repository whose Packages was replaced, with an InRelease that keeps its valid signature but has forged
    'SHA256:' lines (naming the forged Packages) before the signed block: gpgv accepts the signature; the check
    must read only what it covers, and find that Packages does not match."""
    need(shutil.which("gpg") and shutil.which("gpgv"), "gpg/gpgv missing (scripts/apt-packages.txt)")
    home = tmp_path / "signing"
    fpr, public = packages.site_key(home)
    key = tmp_path / "site.asc"
    key.write_text(public)
    root = tmp_path / "www" / "packages" / "ubuntu22.04"
    binary = root / "dists" / packages.SUITE / "main" / "binary-amd64"
    binary.mkdir(parents=True)
    real = b"Package: nvidia-driver\nVersion: 1\nFilename: pool/main/nvidia-driver_1_amd64.deb\nSHA256: " + \
        b"1" * 64 + b"\n\n"
    forged = real.replace(b"1" * 64, b"2" * 64)

    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    release = root / "dists" / packages.SUITE / "Release"
    release.write_text(f"Suite: {packages.SUITE}\nSHA256:\n {sha(real)} {len(real)} main/binary-amd64/Packages\n")
    packages._sign(home, fpr, release, root / "dists" / packages.SUITE / "InRelease", clear=True)
    inrelease = root / "dists" / packages.SUITE / "InRelease"
    signed = inrelease.read_text()
    assert packages._gpgv(key, inrelease) is None
    inrelease.write_text(f"SHA256:\n {sha(forged)} {len(forged)} main/binary-amd64/Packages\n\n" + signed)
    assert packages._gpgv(key, inrelease) is None  # the signature alone still verifies: the text around it is free
    (binary / "Packages").write_bytes(forged)

    handler = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            lambda *a: handler(*a, directory=str(tmp_path / "www")))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(ValueError, match="Packages does not match its signed InRelease"):
            packages.repo_index(url, "ubuntu22.04", "apt", key)
        (binary / "Packages").write_bytes(real)  # control: the real Packages is what the signed text names
        assert packages.repo_index(url, "ubuntu22.04", "apt", key)["nvidia-driver_1_amd64.deb"]["sha256"] == "1" * 64
    finally:
        httpd.shutdown()


# ---------------------------------------------------------------- the command, a lock signed by a pinned key


def _signed(tmp_path: Path, bundle: Path) -> Path:
    """Sign the (forged) lock as `mirror pull` would with the connected side's key -- the key is pinned here: the
    signature verifies, so only the checks below it stand between the lock and the registry. The public key."""
    from installer import signing

    key = signing.load_or_create(tmp_path / "bundle-key")
    b.finish(bundle, key)
    return key.public_path


@pytest.mark.parametrize("forged, field", [
    (f"{REGISTRY}/payments/api:prod", "destination"),
    ("ghcr.io/victim-org/app:latest", "destination"),
    (str(Path("/") / "tmp" / "elsewhere"), "layout"),
])
def test_mirror_push_exits_2_on_a_forged_lock_that_the_pinned_key_signed(tmp_path, spy, cli, write_site, forged,
                                                                          field):
    bundle, _ = _bundle(tmp_path)
    if field == "layout":
        _edit(bundle, lambda lock: lock.update(layout=forged))
    else:
        _edit(bundle, lambda lock: lock["images"][0].update(destination=forged))
    pub = _signed(tmp_path, bundle)
    site = write_site(copy.deepcopy(SITE))
    rc, out, err = cli("mirror", "push", bundle, "-s", site, "--trusted-key", pub)
    assert rc == 2, err
    assert forged in err and (f"expected {DESTINATION}" in err or "is not a path inside the bundle" in err), err
    assert spy() == []
    rc, out, err = cli("mirror", "verify", "-s", site, "--bundle", bundle, "--trusted-key", pub)
    assert rc == 2 and forged in err, err
    assert spy() == []
