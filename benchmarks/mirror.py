#!/usr/bin/env python3
"""Print `gpu-install mirror` image-engine figures (not a pass/fail test): registry to registry for the full image
set of one release, ours (`images.sync`, N at a time) against a serial `skopeo copy` loop of the same list in the same
run; a no-op re-sync; a bundle (`images.pull`) against the sum of its unique blobs.

    .venv/bin/python benchmarks/mirror.py [--mb 300] [--jobs 4] [--throttle 8] [--images N]

The images are STAND-INs generated here at the exact paths and tags of a site's Plan.images (driver and toolkit from the
operator, sandbox workloads, GDS and GDRCopy on, two node OSes: 17 images): uncompressed tar layers of random bytes (they do not compress away), three base layers shared the way CUDA /
distroless bases are, plus one or two layers of each image's own; total about --mb MB. Three Debian docker-registry
processes on loopback with a throwaway CA: "upstream" (seeded), and one destination for each contender, so that
neither can mount blobs the other pushed. Needs skopeo, docker-registry and the [lab] extra (the test CA).

Both contenders read the upstream through a STAND-IN of a CDN edge (ThrottledProxy): a TCP proxy on loopback that
limits each connection's download to --throttle MB/s (as nvcr.io's and most CDNs' per-connection limits do; TLS
passes through it untouched). Without it loopback is limited only by CPU, and copying more images at once cannot
help; with it, concurrency matters as it does against a real upstream. --throttle 0: no proxy (plain loopback).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


def tar_layer(rng: random.Random, name: str, size: int) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, 0o644
        t.addfile(info, io.BytesIO(rng.randbytes(size)))
    return raw.getvalue()


def write_image(out: Path, layers: list[bytes]) -> dict[str, int]:
    """An OCI layout at out (tag t) of these layers; {blob digest: size} of the image."""
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, int] = {}

    def put(data: bytes) -> str:
        d = hashlib.sha256(data).hexdigest()
        (blobs / d).write_bytes(data)
        sizes["sha256:" + d] = len(data)
        return "sha256:" + d

    descs = [{"mediaType": LAYER_TYPE, "digest": put(b), "size": len(b)} for b in layers]
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in descs]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": put(config),
                                      "size": len(config)}, "layers": descs}).encode()
    md = put(manifest)
    (out / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (out / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": len(manifest),
         "annotations": {"org.opencontainers.image.ref.name": "t"}}]}))
    return sizes


class ThrottledProxy:
    """STAND-IN for a CDN edge in front of the upstream registry: a loopback TCP proxy (asyncio, in a thread) that
    limits each connection's bytes towards the client to `rate` bytes/s with a token bucket (burst 256 KiB); the
    client's bytes to the registry pass unlimited. One limit per TCP connection, none on their number."""

    BURST = 256 * 1024

    def __init__(self, target: str, rate: float):
        host, port = target.rsplit(":", 1)
        self.target, self.rate = (host, int(port)), rate
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.connections = 0
        self.bytes_down = 0  # towards the clients, all connections

    def start(self) -> str:
        """Listen on a free loopback port; returns "127.0.0.1:PORT"."""
        self.thread.start()
        coro = asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.server = asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        async def close() -> None:
            self.server.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in others:
                t.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float) -> None:
        allowance, last = float(self.BURST), self.loop.time()
        try:
            while data := await reader.read(64 * 1024):
                if rate:
                    now = self.loop.time()
                    allowance = min(float(self.BURST), allowance + (now - last) * rate) - len(data)
                    last = now
                    if allowance < 0:
                        await asyncio.sleep(-allowance / rate)
                writer.write(data)
                await writer.drain()
                if rate:
                    self.bytes_down += len(data)
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, 0), self._pipe(up_reader, writer, self.rate))
        for w in (up_writer, writer):
            w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=300, help="about this many MB of unique blobs in all (default 300)")
    ap.add_argument("--jobs", type=int, default=4, help="ours: images at a time (default 4)")
    ap.add_argument("--images", type=int, default=0, help="only the first N images of the release (default: all 17)")
    ap.add_argument("--throttle", type=float, default=8.0,
                    help="the STAND-IN CDN's limit per TCP connection, MB/s (default 8; 0: no proxy)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    for tool in ("skopeo", "docker-registry"):
        if shutil.which(tool) is None:
            print(f"{tool} missing (scripts/apt-packages.txt)", file=sys.stderr)
            return 2

    import yaml

    from gpu_install_lab.pki import ensure_ca, issue_server_cert
    from installer.config import load_site
    from installer.mirror import images
    from installer.plan import Options, resolve
    from tests.integration.registries import serve

    work = Path(tempfile.mkdtemp(prefix="gpu-install-bench-mirror-"))
    procs = []
    proxy: ThrottledProxy | None = None
    try:
        ca, _ = ensure_ca(work / "pki", cn="gpu-install mirror bench CA")
        cert, key = issue_server_cert(work / "pki", "registry", ["127.0.0.1"], ["localhost"])
        certs = work / "certs"
        certs.mkdir()
        shutil.copy(ca, certs / "ca.crt")
        regs = {}
        for name in ("upstream", "serial", "ours"):
            proc, addr = serve(work, name, cert, key)
            procs.append(proc)
            regs[name] = addr
        # what the contenders pull from: the upstream behind the STAND-IN CDN (seeding goes to the registry itself)
        upstream = regs["upstream"]
        if args.throttle > 0:
            proxy = ThrottledProxy(regs["upstream"], args.throttle * 1_000_000)
            upstream = proxy.start()
        site = {"operator": {"version": "v24.9.2"}, "registry": {"host": regs["ours"], "prefix": "mirror", "ca": str(ca)},
                "driver": {"mode": "operator"}, "toolkit": {"mode": "operator"},
                "sandboxWorkloads": {"enabled": True}, "components": {"gds": {"enabled": True}, "gdrcopy": {"enabled": True}},
                "mirror": {"upstream": {"nvcr.io": f"{upstream}/nv", "registry.k8s.io": f"{upstream}/k8s"},
                           "upstreamCa": str(ca)}}
        site_file = work / "site.yaml"
        site_file.write_text(yaml.safe_dump(site))
        plan = resolve(load_site(site_file), Options(os_tags=("ubuntu22.04", "rhel8.10")))
        imgs = list(plan.artifacts(()).images)
        if args.images > 0:
            imgs = imgs[:args.images]
        n = len(imgs)

        # generate: three shared bases (about 45% of the bytes) and each image's own layers
        rng = random.Random(13)
        total = args.mb * 1_000_000
        bases = [tar_layer(rng, f"base{i}", int(total * f)) for i, f in enumerate((0.25, 0.13, 0.07))]
        own_each = int(total * 0.55 / n)
        unique: dict[str, int] = {}
        t0 = time.perf_counter()
        layouts = []
        for k in range(n):
            layers = [bases[k % 3]] + ([bases[2]] if k % 3 != 2 and k % 2 else [])
            layers += [tar_layer(rng, f"own{k}a", own_each * 2 // 3), tar_layer(rng, f"own{k}b", own_each // 3)]
            out = work / "layouts" / str(k)
            unique |= write_image(out, layers)
            layouts.append(out)
        sources = [images.pull_from(i.source, dict(plan.site.mirror.upstream)) for i in imgs]

        def seed(a: tuple[Path, str]) -> None:
            subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-cert-dir", str(certs),
                            f"oci:{a[0]}:t", f"docker://{a[1].replace(upstream, regs['upstream'], 1)}"],
                           check=True, capture_output=True)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(seed, zip(layouts, sources, strict=True)))
        print(f"{n} images, {len(unique)} unique blobs, {sum(unique.values()) / 1e6:.1f} MB unique "
              f"(generated and seeded in {time.perf_counter() - t0:.1f}s)")

        # serial skopeo copy loop into its own registry
        down0 = proxy.bytes_down if proxy else 0
        t = time.perf_counter()
        for img, src in zip(imgs, sources, strict=True):
            dest = img.destination.replace(regs["ours"], regs["serial"], 1)
            subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests", "--override-os", "linux",
                            "--override-arch", "amd64", "--src-cert-dir", str(certs), "--dest-cert-dir", str(certs),
                            f"docker://{src}", f"docker://{dest}"], check=True, capture_output=True)
        serial = time.perf_counter() - t
        down1 = proxy.bytes_down if proxy else 0

        t = time.perf_counter()
        done = images.sync(plan, imgs, config_json=None, jobs=args.jobs)
        ours = time.perf_counter() - t
        down2 = proxy.bytes_down if proxy else 0
        assert len(done.copied) == n, done
        t = time.perf_counter()
        again = images.sync(plan, imgs, config_json=None, jobs=args.jobs)
        noop = time.perf_counter() - t
        assert len(again.skipped) == n, again

        bundle = work / "bundle"
        t = time.perf_counter()
        images.pull(plan, imgs, bundle, jobs=args.jobs)
        pull_s = time.perf_counter() - t
        stored = sum(p.stat().st_size for p in (bundle / "images" / "blobs" / "sha256").iterdir())
        whole = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        want = sum(unique.values())

        if proxy is not None:
            print(f"upstream: STAND-IN CDN, {args.throttle:g} MB/s per TCP connection "
                  f"({proxy.connections} connections in all); bytes it served: serial loop "
                  f"{(down1 - down0) / 1e6:.1f} MB, ours {(down2 - down1) / 1e6:.1f} MB "
                  f"(unique blobs {sum(unique.values()) / 1e6:.1f} MB)")
        else:
            print("upstream: plain loopback (no per-connection limit)")
        print(f"registry -> registry, serial skopeo copy loop: {serial:6.2f}s")
        print(f"registry -> registry, ours (sync, --jobs {args.jobs}): {ours:6.2f}s   speed-up {serial / ours:.2f}x")
        print(f"no-op re-sync of {n} images:               {noop:6.2f}s")
        print(f"pull into a bundle (--jobs {args.jobs}):           {pull_s:6.2f}s")
        print(f"bundle: blobs {stored / 1e6:.1f} MB, whole directory {whole / 1e6:.1f} MB, unique blobs "
              f"{want / 1e6:.1f} MB: {100 * (whole - want) / want:+.2f}%")
        print(f"cores: {os.cpu_count()}")
    finally:
        if proxy is not None:
            proxy.stop()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
