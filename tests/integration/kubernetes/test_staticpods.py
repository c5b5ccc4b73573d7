"""The lab's kubelet stand-in (gpu_install_lab/staticpods.py) running the REAL kube-scheduler 1.20.2 from its
static-pod manifest: restarts on a manifest change, a forgotten volume mount really breaks the binary (its
filesystem is the manifest's, not the host's), a crash loop backs off, a deleted manifest stops the pod."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpu_install_lab import kube, proc
from tests.integration.kubernetes.test_control_plane import wait_for

pytestmark = pytest.mark.kubernetes


def _healthy_pid(cp: kube.ControlPlane):
    st = cp.status()["components"]["kube-scheduler"]
    return st["pid"] if st["running"] and st["healthy"] else None


def test_static_pod_follows_its_manifest(control_plane):
    cp = control_plane
    manifest = cp.scheduler_manifest
    original = manifest.read_text()
    log = Path(cp.static_pods()["kube-scheduler"]["log"])
    first = wait_for("a healthy scheduler", lambda: _healthy_pid(cp))
    first_rec = proc.identity(first)
    try:
        # the container sees only its mounts: /etc/kubernetes/scheduler.conf is the hostPath File
        root = Path(f"/proc/{first}/root")
        assert (root / "etc/kubernetes/scheduler.conf").read_text() == Path(
            yaml.safe_load(original)["spec"]["volumes"][0]["hostPath"]["path"]).read_text()
        assert not (root / "root").exists() and not (root / "var").exists()  # a tmpfs root, not the host's
        assert Path(f"/proc/{first}/cmdline").read_bytes().split(b"\0")[0] == b"/usr/local/bin/kube-scheduler"

        # content change -> the old process is stopped, a new one started
        manifest.write_text(original + "# changed\n")
        second = wait_for("a new healthy scheduler", lambda: (p := _healthy_pid(cp)) and p != first and p)
        assert not proc.alive(first_rec) and proc.alive(cp.static_pods()["kube-scheduler"])

        # a forgotten volume mount: the real binary cannot find its kubeconfig and crash-loops
        doc = yaml.safe_load(original)
        doc["spec"]["containers"][0].pop("volumeMounts")
        manifest.write_text(yaml.safe_dump(doc))
        wait_for("the crash loop", lambda: cp.static_pods()["kube-scheduler"]["restarts"] >= 2, timeout=90)
        text = log.read_text()
        assert "scheduler.conf: no such file or directory" in text, text[-2000:]
        assert "restarting in" in text and "(back-off)" in text

        # an unparsable manifest: logged, the old process stopped
        manifest.write_text("kind: Pod\n  bad: [\n")
        wait_for("no scheduler", lambda: "pid" not in cp.static_pods()["kube-scheduler"] and
              cp.static_pods()["kube-scheduler"]["error"])
        # a deleted manifest stops it; a restored one starts it again
        manifest.unlink()
        wait_for("the pod gone", lambda: "kube-scheduler" not in cp.static_pods())
        assert second not in [r.get("pid") for r in cp.static_pods().values()]
    finally:
        manifest.write_text(original)
    wait_for("the scheduler back", lambda: _healthy_pid(cp), timeout=90)
