"""A wheel that works anywhere: build the sdist, build the wheel FROM that sdist, install it into a fresh venv in a
temporary directory, and run the installed `gpu-install` from a directory without a checkout: catalog, render,
images, and `apply --skip-operator` / `uninstall` against a node of the session lab. The Ansible collection
(playbooks, roles, modules, ansible.cfg) and the catalog must come from the installed package data
(installer/_content), never from this checkout.

One build per module (sdist ~2 s, wheel ~15 s, install ~1 min from the pip cache). The apply uses only the lab
fixture's LabHandle (inventory, CA, nodes, ssh).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_DRIVER_OS, ROOT, need
from tests.integration.conftest import LabHandle

pytestmark = pytest.mark.lab
NODE = "node1"  # debian12
CONTENT = ["ansible.cfg", "meta/runtime.yml", "playbooks/site.yml", "playbooks/uninstall.yml",
           "playbooks/tasks/validate_inventory.yml", "plugins/modules/daemon_json.py",
           "plugins/module_utils/first_change.py", "roles/nvidia_driver/tasks/main.yml",
           "roles/registry_trust/templates/hosts.toml.j2", "values/catalog/v24.9.2.yaml", "values/mig/models.yaml",
           "values/sharing/gpumanager.yaml", "charts/gpu-manager/Chart.yaml",
           "charts/gpu-manager/templates/gpu-manager.yaml", "charts/gpu-manager/templates/_helpers.tpl",
           "values/sharing/nos.yaml", "roles/mig_mode/tasks/deploy.yml", "plugins/modules/mig_mode.py",
           "values/monitoring/dcgm-metrics.csv", "values/monitoring/alerts.yaml", "values/monitoring/dashboard.json"]
STANDIN_RUNTIME = "/usr/local/bin/containerd"


def run(argv: list, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv} exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin dir, a work dir outside any checkout, the clean environment to run it with)."""
    need(os.geteuid() == 0, "builds and installs a wheel and applies to the lab: root (lab tests)",
         required=bool(os.environ.get("CI") or os.environ.get("GPU_INSTALL_REQUIRE_LAB")),
         why_required="CI / GPU_INSTALL_REQUIRE_LAB")
    tmp = tmp_path_factory.mktemp("wheel")
    dist, venv, work = tmp / "dist", tmp / "venv", tmp / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PIP_NO_INPUT="1")
    t0 = time.monotonic()
    run([sys.executable, "-m", "venv", venv])
    pip = venv / "bin" / "pip"
    # a PEP 517 front end in two steps, as `python -m build` does: the sdist from the checkout, the wheel from the sdist
    run([pip, "install", "-q", "setuptools>=77"], env=env)
    sd = run([venv / "bin" / "python", "-c", "import sys; from setuptools import build_meta as b; "
              "print(b.build_sdist(sys.argv[1]))", dist], cwd=ROOT, env=env)
    sdist = dist / sd.stdout.strip().splitlines()[-1]
    for out in (sd.stdout, sd.stderr):
        assert "Deprecat" not in out and "deprecat" not in out, out
    names = tarfile.open(sdist).getnames()
    top = names[0].split("/")[0]
    for item in CONTENT + ["setup.py", "MANIFEST.in", "pyproject.toml"]:
        assert f"{top}/{item}" in names, (item, sdist)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    t1 = time.monotonic()
    wh = run([pip, "wheel", "-v", "--no-deps", "-w", dist, sdist], env=env, cwd=work)
    for out in (wh.stdout, wh.stderr):  # e.g. the old `project.license` table: SetuptoolsDeprecationWarning
        assert "Deprecat" not in out and "deprecat" not in out, [ln for ln in out.splitlines() if "eprecat" in ln]
    [wheel] = dist.glob("gpu_install-*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    for item in CONTENT:
        assert f"installer/_content/{item}" in files, item
    assert not [n for n in files if n.startswith("installer/_content/") and ("__pycache__" in n or n.endswith(".pyc"))]
    t2 = time.monotonic()
    run([pip, "install", "-q", wheel], env=env, cwd=work)
    print(f"venv + sdist {t1 - t0:.1f}s, wheel {t2 - t1:.1f}s ({wheel.stat().st_size // 1024} KiB), "
          f"install {time.monotonic() - t2:.1f}s", flush=True)
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", GPU_INSTALL_STATE=str(tmp / "state"),
               XDG_CACHE_HOME=str(tmp / "cache"), ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"))
    return venv / "bin", work, env


def gi(installed, *args, check: bool = True) -> subprocess.CompletedProcess:
    bindir, work, env = installed
    proc = subprocess.run([str(bindir / "gpu-install"), *map(str, args)], capture_output=True, text=True, cwd=work,
                          env=env, timeout=600)
    if check:
        assert proc.returncode == 0, f"{args} exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def test_installed_package_is_the_wheel_not_the_checkout(installed):
    bindir, work, env = installed
    code = ("import json, installer, installer.content as c; print(json.dumps({'installer': installer.__file__, "
            "'root': str(c.root()), 'cfg': str(c.ansible_cfg()), 'catalog': str(c.catalog_dir()), "
            "'collections': str(c.collections_path())}))")
    where = json.loads(run([bindir / "python", "-c", code], cwd=work, env=env).stdout)
    venv = bindir.parent.resolve()
    for key in ("installer", "root", "cfg", "catalog"):
        path = Path(where[key]).resolve()
        assert path.is_relative_to(venv), (key, path)
        assert not path.is_relative_to(ROOT), (key, path)
    assert Path(where["root"]) == venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages" / "installer" / "_content"
    link = Path(where["collections"]) / "ansible_collections" / "gpu_install" / "node"
    assert link.resolve() == Path(where["root"]) and (link / "roles" / "nvidia_driver").is_dir()


def test_config_sample_comes_from_the_wheels_package_data(installed):
    """installer/data/sample-site.yaml is package data: `config sample` prints it from the installed wheel."""
    out = gi(installed, "config", "sample").stdout
    assert out == (ROOT / "installer" / "data" / "sample-site.yaml").read_text()
    assert yaml.safe_load(out)["operator"]["version"]


def test_the_bundle_signature_works_from_the_wheel(installed, tmp_path):
    """The signing dependencies come with the wheel: a lock signed with a key made by the installed package verifies
    against the exported public key, and `mirror push` of that bundle without a pinned key is refused (exit 2)."""
    bindir, work, env = installed
    code = ("import sys; from pathlib import Path; from installer import signing; from installer.mirror import bundle "
            "as b; d = Path(sys.argv[1]); b.write_lock(d / 'bundle', {'schema': b.SCHEMA, 'registry': '127.0.0.1:9', 'images': [], 'failed': []});"
            " k = signing.load_or_create(d / 'key'); b.finish(d / 'bundle', k); "
            "print(b.signed_lock(d / 'bundle', [k.public_path])['complete'], k.fingerprint)")
    out = run([bindir / "python", "-c", code, tmp_path], cwd=work, env=env).stdout.split()
    assert out[0] == "True" and len(out[1]) == 64, out
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "127.0.0.1:9"}}))
    proc = gi(installed, "mirror", "push", tmp_path / "bundle", "-s", site, check=False)
    assert proc.returncode == 2 and "no bundle signing key is pinned" in proc.stderr, proc.stderr
    proc = gi(installed, "mirror", "push", tmp_path / "bundle", "-s", site, "--trusted-key",
              tmp_path / "key" / "signing-key.pub.pem", check=False)  # signed and pinned: past the signature check
    assert not any(m in proc.stderr for m in (".dsse", "not pinned", "is pinned", "does not verify")), proc.stderr


def test_catalog_render_images(installed, tmp_path):
    out = gi(installed, "catalog", "list").stdout
    assert "v24.9.2" in out and "v1.11.0" in out
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"},
                                    "registry": {"host": "registry.example.internal:5000"}}))
    values = yaml.safe_load(gi(installed, "render", "-s", site).stdout)
    assert values["operator"]["repository"].startswith("registry.example.internal:5000/")
    images = gi(installed, "images", "-s", site, "--os", "ubuntu22.04").stdout
    assert "nvcr.io/nvidia/driver:" in images and "-ubuntu22.04 registry.example.internal:5000/" in images


def _root(lab: LabHandle, cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return lab.ssh(NODE, cmd, user="root", check=check, timeout=300)


def test_apply_and_uninstall_from_the_wheel(installed, lab: LabHandle, tmp_path):
    """The installed package's playbooks, roles and modules (preflight probe, registry_trust, driver checks) run
    against a lab node; the run's collection link points into the venv."""
    reg = lab.status["registry"]
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hosts.yml").write_text(lab.inventory.read_text())
    (inv / "zz-wheel.yml").write_text(yaml.safe_dump({"all": {"children": {
        # a group apply requires; --limit keeps the runs on the node
        "kube_control_plane": {"hosts": {"bastion": {"ansible_connection": "local",
                                                     "ansible_python_interpreter": str(installed[0] / "python")}}},
        "gpu_nodes": {"vars": {"preflight_require_gpu": False, "preflight_require_kernel_headers": False}},
    }}}))
    # preflight wants a container runtime binary; a node of the session lab may have none (toolkit.mode operator:
    # no runtime role runs). A STAND-IN that only exists, made here and removed below, unless one is there.
    made = _root(lab, f"command -v containerd || {{ printf '#!/bin/sh\\n# STAND-IN (test_wheel): preflight only "
                      f"looks for the binary\\nexit 1\\n' > {STANDIN_RUNTIME} && chmod 755 {STANDIN_RUNTIME} "
                      f"&& echo made; }}").stdout.strip().endswith("made")
    _root(lab, "rm -f /usr/local/share/ca-certificates/gpu-install-registry-*.crt")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": reg, "ca": str(lab.ca)},
                                    "runtime": "containerd", "toolkit": {"mode": "operator"},
                                    "driver": {"mode": "operator", "customImageOs": LAB_DRIVER_OS}}))
    try:
        out = gi(installed, "apply", "-s", site, "-i", inv, "--limit", NODE, "--skip-operator")
        assert "apply ok" in out.stdout, out.stdout
        store = _root(lab, "cat /usr/local/share/ca-certificates/gpu-install-registry-*.crt").stdout
        assert store == lab.ca.read_text()
        hosts = _root(lab, f"cat /etc/containerd/certs.d/{reg}/hosts.toml").stdout
        assert hosts.startswith("# Written by gpu-install") and f'[host."https://{reg}"]' in hosts
        _, _, env = installed
        runs = sorted((Path(env["GPU_INSTALL_STATE"]) / "runs").glob("*-site*"))
        link = runs[-1] / "collections" / "ansible_collections" / "gpu_install" / "node"
        assert link.resolve().is_relative_to(Path(installed[0]).parent.resolve()), link.resolve()
        envvars = yaml.safe_load((runs[-1] / "env" / "envvars").read_text())
        assert envvars["ANSIBLE_CONFIG"].endswith("site-packages/installer/_content/ansible.cfg"), envvars
        again = gi(installed, "apply", "-s", site, "-i", inv, "--limit", NODE, "--skip-operator")
        assert "nodes changed=0" in again.stdout, again.stdout
        gone = gi(installed, "uninstall", "-s", site, "-i", inv, "--limit", NODE, "--skip-operator", "--yes")
        assert "nodes" in gone.stdout, gone.stdout
        assert "gpu-install-registry-" not in _root(lab, "ls /usr/local/share/ca-certificates/").stdout
        assert _root(lab, f"test -e /etc/containerd/certs.d/{reg}", check=False).returncode != 0
    finally:
        if made:
            _root(lab, f"rm -f {STANDIN_RUNTIME}")
