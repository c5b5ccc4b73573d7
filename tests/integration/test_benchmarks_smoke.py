"""Every benchmark runs once at its smallest size (a smoke run: the figures are not checked), so a benchmark that no
longer runs -- a site the tool now refuses, a changed CLI, a lab API that moved -- fails here instead of on the day
someone needs its figures. Each benchmark must have an entry in SMOKE; a new benchmarks/*.py without one fails
test_every_benchmark_has_a_smoke_entry. Sizes and what each run costs: docs/performance.md#benchmarks-in-ci.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, need
from tests.integration.conftest import lab_prerequisites

BENCH = ROOT / "benchmarks"

# benchmark -> (smallest-size arguments, needs root and the lab, a line its output must have, timeout s)
SMOKE: dict[str, tuple[list[str], bool, str, int]] = {
    "bench_cli.py": (["-n", "1"], False, "render", 120),
    "mirror.py": (["--images", "3", "--mb", "2", "--throttle", "4"], False, "speed-up", 300),
    "bench_apply.py": (["--nodes", "1", "-n", "1"], True, "no-op re-apply", 600),
    "bench_fleet.py": (["--hosts", "1"], True, "torn down: no fleet netns", 600),
    "bench_validate.py": (["--hollow", "1", "--ssh-nodes", "1", "-n", "1"], True, "node+runtime layers: 1", 600),
    "bench_upgrade_plan.py": (["--nodes", "2", "-n", "1"], True, "upgrade plan v22.9.2 -> v23.9.2", 600),
}
KUBE = {"bench_validate.py", "bench_upgrade_plan.py"}  # they need the lab control plane's binaries


def benchmarks() -> list[str]:
    """The benchmark scripts: every benchmarks/*.py but private helpers (_*.py)."""
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_has_a_smoke_entry() -> None:
    missing = [b for b in benchmarks() if b not in SMOKE]
    assert not missing, f"benchmarks without a smoke entry in {__file__}::SMOKE: {missing} (add their smallest size)"


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.lab] if n in SMOKE and SMOKE[n][1] else [])
                                  for n in benchmarks()])
def test_benchmark_runs(name: str) -> None:
    assert name in SMOKE, f"{name}: no smoke entry (test_every_benchmark_has_a_smoke_entry)"
    args, root, marker, limit = SMOKE[name]
    if root:
        lab_prerequisites()
    if name == "mirror.py":
        for tool in ("skopeo", "docker-registry"):
            need(shutil.which(tool), f"{tool} missing (scripts/apt-packages.txt)")
    if name in KUBE:
        from tests.integration.conftest import _skip_or_fail

        try:
            from gpu_install_lab import kube
            kube.ensure_binaries(progress=lambda m: None)
        except Exception as exc:  # noqa: BLE001 - the cluster case needs the lab control plane's binaries
            _skip_or_fail(f"kubernetes binaries not available: {exc}")
    # (TMPDIR left as it is: the lab runs tools chrooted into its nodes, where a test's tmp_path does not exist; each
    # benchmark removes its own temporary directory)
    proc = subprocess.run([sys.executable, str(BENCH / name), *args], capture_output=True, text=True, timeout=limit,
                          cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{name} {' '.join(args)} exited {proc.returncode}:\n{out[-6000:]}"
    assert marker in out, f"{name}: no {marker!r} in its output:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-6000:]
    print(proc.stdout[-1500:])
