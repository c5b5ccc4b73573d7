"""scripts/demo's arguments: --chart is checked before anything starts (no root needed, no lab, no demo dir).

The demo itself, with the real v23.9.2 chart when ../shared/upstream/charts has it, runs in
tests/integration/test_demo.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT, UPSTREAM, need

DEMO = ROOT / "scripts" / "demo"
CHARTS = UPSTREAM.parent / "charts"
STANDIN = ROOT / "tests" / "fixtures" / "charts" / "gpu-operator-fixture"

pytestmark = pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "python").exists(),
                                reason="scripts/demo runs the checkout's .venv (scripts/bootstrap makes it)")


def demo(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_INSTALL_DEMO_DIR": str(tmp_path / "demo")}
    return subprocess.run([str(DEMO), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("args, message", [
    (["--chart"], "demo: --chart needs a path (a GPU Operator chart .tgz or directory)"),
    (["--chart="], "demo: --chart needs a path"),
    (["--chart", "/nonexistent/gpu-operator.tgz"], "demo: --chart /nonexistent/gpu-operator.tgz: no such file or directory"),
    (["--chart", str(STANDIN)], f"demo: --chart {STANDIN} is chart 'gpu-operator-fixture', not gpu-operator"),
    (["--chart", str(ROOT / "README.md")], f"demo: chart {ROOT / 'README.md'}: cannot read its Chart.yaml"),
    (["--frobnicate"], "demo: unknown argument --frobnicate (use --chart PATH, --down or --help)"),
])
def test_bad_arguments_start_nothing(tmp_path, args, message):
    proc = demo(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert not (tmp_path / "demo").exists()


def test_a_real_chart_of_another_release_is_refused(tmp_path):
    chart = CHARTS / "gpu-operator-v22.9.2.tgz"
    need(chart.is_file(), f"real chart {chart} not found")
    proc = demo(tmp_path, "--chart", str(chart))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # the demo names the chart by its resolved path (shared/ may be a link to where the upstream data lives)
    assert (f"demo: --chart {chart.resolve()} is GPU Operator v22.9.2 but the demo's site has operator.version v23.9.2: "
            "give the v23.9.2 chart") in proc.stderr, proc.stderr
    assert not (tmp_path / "demo").exists()


def test_help_names_chart():
    proc = subprocess.run([str(DEMO), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "scripts/demo --chart PATH" in proc.stdout, proc.stdout + proc.stderr
