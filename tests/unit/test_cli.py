"""CLI layer: exit codes, catalog commands, lazy imports (fast start)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from installer.catalog import Catalog
from tests.conftest import ROOT


def test_catalog_list_show_diff(cli):
    rc, out, _ = cli("catalog", "list")
    releases = out.split()
    assert rc == 0 and len(releases) == 33 and releases[0] == "v1.11.0" and releases[-1] == "v26.7.0"
    rc, out, _ = cli("catalog", "show", "v24.9.2")
    assert rc == 0 and "nvcr.io/nvidia/driver:550.144.03  (+ -<osTag>)" in out
    rc, out, _ = cli("catalog", "diff", "v24.9.2", "v25.3.0")
    assert rc == 0
    assert "  - operator.defaultRuntime" in out and "  + driver.kernelModuleType" in out
    rc, _, err = cli("catalog", "show", "v9.9.9")
    assert rc == 2 and "not in the catalog" in err


def test_output_to_a_device_or_fifo_is_written_in_place(cli, write_site, site_data, tmp_path):
    """-o /dev/stdout or a FIFO must not be replaced by a regular file (atomic rename would)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    import threading

    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    rc, _, _ = cli("render", "-s", write_site(site_data), "-o", fifo)
    reader.join(timeout=10)
    assert rc == 0 and got and got[0].startswith("# Helm values")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_output_file_is_written(cli, write_site, site_data, tmp_path):
    out = tmp_path / "values.yaml"
    rc, stdout, err = cli("render", "-s", write_site(site_data), "-o", out)
    assert rc == 0 and stdout == "" and f"wrote {out}" in err
    assert out.read_text().startswith("# Helm values for GPU Operator v24.9.2")


def test_usage_error_is_exit_2(cli):
    with pytest.raises(SystemExit) as exc:
        cli("render")  # no -s and no GPU_INSTALL_SITE
    assert exc.value.code == 2


def test_internal_error_is_exit_1_without_traceback(cli, write_site, site_data, monkeypatch):
    import installer.render.values as rv

    monkeypatch.setattr(rv, "check_keys", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    rc, _, err = cli("render", "-s", write_site(site_data))
    assert rc == 1 and "internal error: RuntimeError: boom" in err and "Traceback" not in err
    with pytest.raises(RuntimeError):
        cli("--debug", "render", "-s", write_site(site_data))


HEAVY = ("pydantic", "yaml", "ansible", "kubernetes", "pyhelm3", "jinja2", "paramiko", "rich")


def test_cli_import_is_light():
    code = (
        "import sys; from installer.cli import build_parser; build_parser(); "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_render_without_inventory_does_not_load_ansible(write_site, site_data, tmp_path):
    path = write_site(site_data)
    code = (
        f"import sys; from installer.cli import main; rc = main(['render', '-s', sys.argv[1], '-o', '{tmp_path}/v.yaml']); "
        "print(rc, [m for m in ('ansible', 'kubernetes', 'pyhelm3', 'paramiko') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0 []", out.stdout + out.stderr


def test_every_catalog_release_renders_through_the_cli(cli, write_site, site_data):
    for rel in Catalog.default().releases():
        site_data["operator"]["version"] = rel
        rc, out, err = cli("images", "-s", write_site(site_data), "--os", "ubuntu22.04", "--format", "json")
        assert rc == 0, (rel, err)
        assert all(d["destination"].startswith("registry.lab:5000/") for d in json.loads(out))


def test_closed_pipe_is_not_an_internal_error():
    """`gpu-install … | head`: writing to a pipe whose reader is gone ends quietly with 0."""
    r, w = os.pipe()
    os.close(r)  # the reader is gone before we write a byte: every write gets EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "installer.cli", "catalog", "diff", "v1.11.0", "v26.7.0"],
                              cwd=ROOT, stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
