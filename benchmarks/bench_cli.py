#!/usr/bin/env python3
"""Print CLI start-up and render timings (figures, not a pass/fail test).

    .venv/bin/python benchmarks/bench_cli.py [-n 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "inventories" / "sample" / "site.yaml"
INV = ROOT / "inventories" / "sample" / "hosts.yml"
EXE = str(Path(sys.executable).parent / "gpu-install")

CASES = {
    "--help": [EXE, "--help"],
    "render": [EXE, "render", "-s", str(SITE)],
    "images --os": [EXE, "images", "-s", str(SITE), "--os", "ubuntu22.04"],
    "images -i (ansible inventory)": [EXE, "images", "-s", str(SITE), "-i", str(INV)],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=10)
    n = ap.parse_args().n
    print(f"{'command':34} {'median ms':>10} {'min ms':>8} {'max ms':>8}  (n={n})")
    for name, argv in CASES.items():
        times = []
        for _ in range(n):
            t = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times.append((time.perf_counter() - t) * 1000)
        print(f"{name:34} {statistics.median(times):10.0f} {min(times):8.0f} {max(times):8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
