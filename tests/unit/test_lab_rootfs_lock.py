"""Two labs starting at once with no cached rootfs: one builds it, the other waits and uses it (no second build
racing to rename into the same directory)."""

from __future__ import annotations

import threading

from gpu_install_lab import rootfs


def test_one_build_per_flavour_at_a_time(tmp_path, monkeypatch):
    target = tmp_path / "rootfs" / "debian12-abc"
    monkeypatch.setattr(rootfs, "rootfs_path", lambda flavour: target)
    builds = []
    inside = threading.Event()
    release = threading.Event()

    def build(flavour, path, progress):
        builds.append(threading.current_thread().name)
        inside.set()
        assert release.wait(30)  # hold the lock until the second caller is waiting on it
        (path / "etc").mkdir(parents=True)
        (path / "etc" / "os-release").write_text("ID=debian\n")
        return path

    monkeypatch.setattr(rootfs, "_build", build)
    results = {}

    def call(name):
        results[name] = rootfs.ensure_rootfs("debian12", progress=lambda _: None)

    first = threading.Thread(target=call, args=("first",), name="first")
    first.start()
    assert inside.wait(30)
    second = threading.Thread(target=call, args=("second",), name="second")
    second.start()
    second.join(0.3)
    assert second.is_alive()  # waiting for the first build, not building its own
    release.set()
    first.join(30)
    second.join(30)
    assert builds == ["first"] and results == {"first": target, "second": target}
