#!/usr/bin/env python3
"""Image mirroring throughput (figures, not a pass/fail test).

    .venv/bin/python benchmarks/bench_mirror.py [--release v24.9.2] [--base-mb 60] [--image-mb 2:20] [--jobs 4]

The full image set of one release (the Plan.images of a site with driver.mode operator, ubuntu22.04 nodes) is made
up locally: every image gets the same two base layers (--base-mb in all) and one layer of its own (a size drawn
from --image-mb, reproducibly), random bytes so nothing compresses away; they are seeded into an "upstream"
registry (Debian's docker-registry on loopback, TLS from a throwaway CA) at the exact upstream paths, through
`mirror.upstream`. Then, each into a fresh registry of its own so neither run profits from blobs the other left:

  1. a serial `skopeo copy --preserve-digests` loop over the same list (what a site does by hand today);
  2. `gpu-install mirror sync` (the real CLI, --jobs images at a time);
  3. the same sync again (nothing to copy: the no-op re-sync);
  4. `gpu-install mirror pull` into a bundle: its size on disk against the sum of the unique blobs.

Targets (issue 13): sync >= 2x faster than the serial loop; no-op re-sync < 2 s; bundle within 5% of the unique blobs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXE = str(Path(sys.executable).parent / "gpu-install")
LAYER = "application/vnd.oci.image.layer.v1.tar"


def put_blob(layout: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    path = layout / "blobs" / "sha256" / digest
    if not path.exists():
        path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def make_layout(layout: Path, names: list[str], base_mb: float, image_mb: tuple[float, float]) -> int:
    """One OCI layout holding an image per name (two shared base layers + one own layer); the unique blob bytes."""
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    rng = random.Random(13)
    base = [put_blob(layout, rng.randbytes(int(base_mb * 2 / 3 * 2**20))),
            put_blob(layout, rng.randbytes(int(base_mb / 3 * 2**20)))]
    index = []
    for n, name in enumerate(names):
        own = put_blob(layout, rng.randbytes(int(rng.uniform(*image_mb) * 2**20)))
        layers = [{"mediaType": LAYER, **d} for d in (*base, own)]
        config = put_blob(layout, json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {
            "type": "layers", "diff_ids": [d["digest"] for d in layers]}, "config": {"Labels": {"n": str(n)}}}).encode())
        manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                               "layers": layers}).encode()
        index.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", **put_blob(layout, manifest),
                      "annotations": {"org.opencontainers.image.ref.name": name}})
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": index}))
    return sum(p.stat().st_size for p in (layout / "blobs" / "sha256").iterdir())


def run(argv: list[str], **kw) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}…: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--release", default="v24.9.2")
    ap.add_argument("--base-mb", type=float, default=60.0, help="shared base layers, MiB in all (default 60)")
    ap.add_argument("--image-mb", default="2:20", help="each image's own layer, MiB MIN:MAX (default 2:20)")
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args()
    lo, hi = (float(x) for x in args.image_mb.split(":"))

    from gpu_install_lab.pki import ensure_ca, issue_server_cert
    from installer.config import parse_site
    from installer.mirror.images import pull_from
    from installer.plan import Options, resolve
    from tests.integration.registries import serve, serve_https, standin_chart_repo

    work = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    procs = []
    try:
        ca, _ = ensure_ca(work / "pki", cn="gpu-install bench CA")
        cert, key = issue_server_cert(work / "pki", "registry", ["127.0.0.1"], ["localhost"])
        certs = work / "certs"
        certs.mkdir()
        shutil.copy(ca, certs / "ca.crt")
        up_proc, upstream = serve(work, "upstream", cert, key)
        serial_proc, serial_reg = serve(work, "serial", cert, key)
        ours_proc, ours_reg = serve(work, "ours", cert, key)
        procs += [up_proc, serial_proc, ours_proc]
        httpd, www = serve_https(work / "www", cert, key)
        standin_chart_repo(work / "www" / "charts", f"{www}/charts", args.release)
        remap = {"nvcr.io": f"{upstream}/nv", "registry.k8s.io": f"{upstream}/k8s"}

        def site(registry: str) -> Path:
            path = work / f"site-{registry.rsplit(':', 1)[1]}.yaml"
            path.write_text(yaml.safe_dump({
                "operator": {"version": args.release}, "registry": {"host": registry, "ca": str(ca)},
                "driver": {"mode": "operator"}, "toolkit": {"mode": "operator"},
                "mirror": {"upstream": remap, "upstreamCa": str(ca), "chartRepository": f"{www}/charts"}}))
            return path

        ours_site, serial_site = site(ours_reg), site(serial_reg)
        plan = resolve(parse_site(yaml.safe_load(ours_site.read_text())), Options(os_tags=("ubuntu22.04",)))
        sources = [i.source for i in plan.images]
        layout = work / "layout"
        unique = make_layout(layout, sources, args.base_mb, (lo, hi))
        t = sum(run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-cert-dir", str(certs),
                     f"oci:{layout}:{s}", f"docker://{pull_from(s, remap)}"], timeout=600) for s in sources)
        print(f"release {args.release}: {len(sources)} images, {unique / 2**20:.0f} MiB of unique blobs "
              f"(base {args.base_mb:.0f} MiB shared, own layers {lo:.0f}-{hi:.0f} MiB); seeded upstream in {t:.1f}s",
              flush=True)

        dests = {i.source: i.destination.replace(ours_reg, serial_reg, 1) for i in plan.images}
        t0 = time.perf_counter()
        for s in sources:
            run(["skopeo", "copy", "--quiet", "--preserve-digests", "--src-cert-dir", str(certs), "--dest-cert-dir",
                 str(certs), f"docker://{pull_from(s, remap)}", f"docker://{dests[s]}"], timeout=600)
        serial = time.perf_counter() - t0
        sync = run([EXE, "mirror", "sync", "-s", str(ours_site), "--os", "ubuntu22.04", "--jobs", str(args.jobs),
                    "-q"], timeout=1200)
        noop = run([EXE, "mirror", "sync", "-s", str(ours_site), "--os", "ubuntu22.04", "--jobs", str(args.jobs),
                    "-q"], timeout=600)
        bundle = work / "bundle"
        pull = run([EXE, "mirror", "pull", "-s", str(serial_site), "--os", "ubuntu22.04", "-o", str(bundle), "-q"],
                   timeout=1200)
        size = sum(p.stat().st_size for p in (bundle / "images" / "blobs" / "sha256").iterdir())
        print(f"serial skopeo loop:            {serial:7.1f}s")
        print(f"gpu-install mirror sync -j{args.jobs}:   {sync:7.1f}s  ({serial / sync:.2f}x faster; target >= 2x)")
        print(f"no-op re-sync:                 {noop:7.2f}s  (target < 2 s)")
        print(f"mirror pull into a bundle:     {pull:7.1f}s  bundle blobs {size / 2**20:.1f} MiB vs unique "
              f"{unique / 2**20:.1f} MiB ({(size - unique) / unique * 100:+.2f}%; target within 5%)", flush=True)
        httpd.shutdown()
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
