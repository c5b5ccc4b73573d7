"""installer.mirror.common (what the mirror's kinds share) and installer.mirror.lock (a lock's entries parsed as
untrusted input): the one skopeo copy command line, re-use of a bundle file, the incomplete-bundle failure, the
bundle-file check, and the typed entries the checks return."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from installer.errors import ConfigError, HostFailures
from installer.mirror import common, lock

SHA_OF_HELLO = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"  # sha256 of b"hello"


@pytest.fixture
def fake_skopeo(monkeypatch):
    monkeypatch.setattr(common, "skopeo", lambda: "/opt/skopeo")


def test_copy_argv_of_pull_one_platform(fake_skopeo, tmp_path):
    argv = common.copy_argv("docker://up/x:1", "oci:/b/p:x", platform="linux/arm64/v8", digestfile=tmp_path / "d",
                            src_certs="/certs")
    assert argv == ["/opt/skopeo", "copy", "--quiet", "--preserve-digests", "--retry-times", "2", "--digestfile",
                    f"{tmp_path}/d", "--override-os", "linux", "--override-arch", "arm64", "--override-variant", "v8",
                    "--src-cert-dir", "/certs", "docker://up/x:1", "oci:/b/p:x"]


def test_copy_argv_of_push_and_sync(fake_skopeo):
    push = common.copy_argv("dir:/t", "docker://r/x:1", platform=common.ALL_PLATFORMS, dest_certs="/c",
                            dest_auth="/a.json", dest_tls=False)
    assert push == ["/opt/skopeo", "copy", "--quiet", "--preserve-digests", "--retry-times", "2", "--all",
                    "--dest-cert-dir", "/c", "--dest-authfile", "/a.json", "--dest-tls-verify=false", "dir:/t",
                    "docker://r/x:1"]
    plain = common.copy_argv("dir:/t", "docker://r/x:1")  # no platform: what the dir: copy holds
    assert plain == ["/opt/skopeo", "copy", "--quiet", "--preserve-digests", "--retry-times", "2", "dir:/t",
                     "docker://r/x:1"]
    sync = common.copy_argv("docker://u/x:1", "docker://r/x:1", platform="linux/amd64", src_certs="/u",
                            dest_certs="/c")
    assert sync[6:] == ["--override-os", "linux", "--override-arch", "amd64", "--src-cert-dir", "/u",
                        "--dest-cert-dir", "/c", "docker://u/x:1", "docker://r/x:1"]


def test_copy_argv_runs_with_the_real_skopeo():
    if shutil.which("skopeo") is None:
        pytest.skip("skopeo is not installed")
    argv = common.copy_argv("dir:/nonexistent", "dir:/nonexistent2")
    rc, _, msg = common.run_skopeo(argv, timeout=60)
    assert rc != 0 and "nonexistent" in msg  # skopeo parsed every option and named the missing source


def test_reusable_only_when_the_file_has_the_recorded_sha256(tmp_path):
    (tmp_path / "charts").mkdir()
    dest = tmp_path / "charts" / "a.tgz"
    entry = {"file": "charts/a.tgz", "sha256": SHA_OF_HELLO}
    old = {"charts/a.tgz": entry}
    assert common.reusable(old, "charts/a.tgz", dest) is None  # not there
    dest.write_bytes(b"hello")
    assert common.reusable(old, "charts/a.tgz", dest) is entry
    assert common.reusable({"charts/a.tgz": {"file": "charts/a.tgz"}}, "charts/a.tgz", dest) is None  # no sha256
    assert common.reusable(old, "charts/b.tgz", dest) is None  # not in the older lock
    dest.write_bytes(b"hellO")
    assert common.reusable(old, "charts/a.tgz", dest) is None


def test_incomplete_names_every_failure():
    exc = common.incomplete(common.PackageFailures, "2 OS package problem(s)",
                            [{"ref": "ubuntu22.04/a.deb", "error": "404"}, {"ref": "rocky9.4 (b)", "error": "no key"}],
                            hint="run pull again")
    assert isinstance(exc, HostFailures) and type(exc) is common.PackageFailures
    assert exc.message == ("2 OS package problem(s); the bundle is incomplete:\n  ubuntu22.04/a.deb: 404\n"
                           "  rocky9.4 (b): no key")
    assert exc.hint == "run pull again"


def test_staging_take_refuses_a_link_another_sha256_or_a_way_out(tmp_path):
    from installer.mirror.staging import staging

    bundle = tmp_path / "b"
    (bundle / "files").mkdir(parents=True)
    (bundle / "files" / "x.run").write_bytes(b"hello")
    with staging(tmp_path, bundle) as into:
        assert into.take(bundle, "files/x.run", SHA_OF_HELLO, 5, "files entry").read_bytes() == b"hello"
    with staging(tmp_path, bundle) as into, \
            pytest.raises(ConfigError, match=r"files/x.run: sha256 2cf24d.* the lock says 00"):
        into.take(bundle, "files/x.run", "00", 5, "files entry")
    os.symlink(bundle / "files" / "x.run", bundle / "files" / "y.run")
    with staging(tmp_path, bundle) as into, pytest.raises(ConfigError, match="files/y.run is missing or not a regular file"):
        into.take(bundle, "files/y.run", SHA_OF_HELLO, 5, "files entry")
    with staging(tmp_path, bundle) as into, pytest.raises(ConfigError, match="is not a path inside the bundle"):
        into.take(bundle, "files/../../x", SHA_OF_HELLO, 5, "files entry")


def test_read_since_refuses_a_changed_lock(tmp_path):
    old = tmp_path / "old.lock.json"
    text = json.dumps({"schema": "gpu-install.bundle-lock/v1", "images": []})
    old.write_text(text)
    lock_, sha = common.read_since(old)
    assert lock_["images"] == [] and sha == hashlib.sha256(text.encode()).hexdigest()
    (tmp_path / "old.lock.json.sha256").write_text("0" * 64 + "  bundle.lock.json\n")
    with pytest.raises(ConfigError, match="checksum mismatch with old.lock.json.sha256"):
        common.read_since(old)


def test_chart_and_file_entries_are_parsed_into_their_fields(tmp_path):
    chart = lock.chart_entry(tmp_path, {"name": "gpu-operator", "version": "v24.9.2", "file": "charts/g.tgz",
                                        "sha256": SHA_OF_HELLO, "size": 5, "evil": "/etc"})
    assert chart == {"name": "gpu-operator", "version": "v24.9.2", "repository": "", "file": "charts/g.tgz",
                     "sha256": SHA_OF_HELLO, "size": 5}  # what is not a field of the entry is not carried on
    file = lock.file_entry(tmp_path, {"name": "d.run", "file": "files/d.run", "sha256": SHA_OF_HELLO, "size": "5"})
    assert file == {"name": "d.run", "source": "", "file": "files/d.run", "sha256": SHA_OF_HELLO, "size": 0}
    with pytest.raises(ConfigError, match="a charts entry is not an object"):
        lock.chart_entry(tmp_path, ["charts/g.tgz"])
    with pytest.raises(ConfigError, match="charts entry names 'files/g.tgz'"):
        lock.chart_entry(tmp_path, {"file": "files/g.tgz"})
    with pytest.raises(ConfigError, match="is not a plain file name"):
        lock.file_entry(tmp_path, {"file": "files/.hidden"})


def test_a_package_entry_keeps_only_its_fields(tmp_path):
    e = {"os": "ubuntu22.04", "manager": "apt", "file": "packages/ubuntu22.04/a_1.0_amd64.deb", "source": "http://x",
         "sha256": SHA_OF_HELLO, "size": 7, "name": "a", "version": ["1.0"], "arch": "amd64", "script": "rm -rf /"}
    assert lock.check_entry(tmp_path / "bundle.lock.json", "packages", 0, e) == {
        "os": "ubuntu22.04", "manager": "apt", "file": "packages/ubuntu22.04/a_1.0_amd64.deb", "source": "http://x",
        "sha256": SHA_OF_HELLO, "size": 7, "name": "a", "arch": "amd64"}
    key = {"os": "rocky9.4", "manager": "dnf", "key": True, "file": "packages/rocky9.4/keys/upstream0.asc",
           "sha256": SHA_OF_HELLO, "size": 3}
    assert lock.check_entry(tmp_path / "bundle.lock.json", "packages", 1, key)["key"] is True
    with pytest.raises(ConfigError, match=r"packages\[2\] \(rocky9.4\): manager 'yum' is not apt or dnf"):
        lock.check_entry(tmp_path / "bundle.lock.json", "packages", 2, {**key, "manager": "yum"})
