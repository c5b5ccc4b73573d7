"""`gpu-install mirror plan|pull|push`: what an air-gapped site needs (images, chart, files, OS package roots), from the
plan; pull copies the plan's images into a bundle (OCI layout + lock), push copies a bundle into the site registry."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, NoReturn

from installer.cli.common import (
    command,
    group,
    inventory_arg,
    node_flags,
    output,
    output_arg,
    quiet_arg,
    resolve_plan,
    say,
    site_args,
)

if TYPE_CHECKING:
    from pathlib import Path

    from installer.config import Site
    from installer.mirror.images import Event, Outcome
    from installer.mirror.plan import Artifact, ArtifactPlan
    from installer.ui import Transfer, TransferProgress


def cmd_plan(args: argparse.Namespace) -> int:
    import json

    from installer import architectures
    from installer.errors import ConfigError

    # --kernel: without -i the --os nodes' kernels, with -i the kernels the inventory's nodes boot next (installer.facts)
    if args.why is not None and not args.why.strip():
        raise ConfigError("--why: empty reference", hint="give an image, the chart, a file or a package name")
    plan = resolve_plan(args)
    artifacts = plan.artifacts()
    architectures.check_packages(plan.nodes, artifacts.packages)
    if args.why is not None:
        found = artifacts.why(args.why)
        if not found:
            raise ConfigError(f"--why {args.why}: not in the mirror plan of this site",
                              hint="give an image (source or destination, with its tag), the chart (gpu-operator), the "
                                   "runfile, or a package name (or OS/name) as `gpu-install mirror plan` lists them")
        if args.format == "json":
            text = json.dumps({"schema": artifacts.as_dict()["schema"], "ref": args.why,
                               "artifacts": [{"kind": a.kind, "ref": a.ref, **a.as_dict()} for a in found]},
                              indent=2) + "\n"
        else:
            text = "".join(why_text(a) for a in found)
        output(text, args.output)
        return 0
    if args.format == "json":
        output(json.dumps(artifacts.as_dict(), indent=2) + "\n", args.output)
    else:
        output(plan_text(artifacts), args.output)
    return 0


def why_text(a: Artifact) -> str:
    lines = [f"{a.kind} {a.ref}"]
    from installer.mirror.plan import ImageArtifact, PackageArtifact

    if isinstance(a, ImageArtifact):
        lines.append(f"  mirrored to {a.destination}")
    if isinstance(a, PackageArtifact):
        lines.append(f"  {a.manager} {a.spec}" + (f" on {', '.join(a.hosts)}" if a.hosts else ""))
    components = list(dict.fromkeys(n.component for n in a.needs))
    for comp in components:
        lines.append(f"  needed by {comp}:")
        lines += [f"    {n.setting}" for n in a.needs if n.component == comp]
    return "\n".join(lines) + "\n"


def _needs(a: Artifact, skip_os: bool = False) -> str:
    """The settings that need an artifact (in a package table, not the node OS its title names)."""
    return "; ".join(n.setting for n in a.needs
                     if not (skip_os and n.setting.startswith(("--os ", "gpu_install_os="))))


def plan_text(p: ArtifactPlan) -> str:
    from installer.ui import table

    parts = [f"Mirror plan: GPU Operator {p.release} into {p.registry}"]
    parts.append(table(f"\nImages ({len(p.images)})", ["component", "source", "destination"],
                       [(i.component, i.source, i.destination) for i in p.images]))
    parts.append(table(f"\nChart ({len(p.charts)})", ["chart", "version", "repository", "file"],
                       [(c.name, c.version, c.repository, c.file) for c in p.charts]))
    if p.files:
        parts.append(table(f"\nFiles ({len(p.files)})", ["file", "source", "sha256", "needed by"],
                           [(f.name, f.source, f.sha256 or "-", _needs(f)) for f in p.files]))
    for o in p.packages:
        hosts = f"; hosts {', '.join(o.hosts)}" if o.hosts else ""
        streams = f"; dnf module stream {', '.join(o.modules)} enabled" if o.modules else ""
        parts.append(table(f"\nPackages for {o.os} ({o.manager}, {len(o.packages)} roots{streams}; closure resolved at "
                           f"pull{hosts})",
                           ["package", "version", "asks for", "needed by"],
                           [(k.name, k.version or "-", k.spec, k.needs[0].component + ": " + _needs(k, skip_os=True))
                            for k in o.packages]))
    if not p.packages:
        parts.append("\nPackages: none (driver.mode and toolkit.mode install nothing on the nodes)")
    if p.node_kernels:
        rows = []
        for k in p.node_kernels:
            kernels = [*([(k.kernel, "running")] if k.kernel else []), *((n, "boots next (--kernel)") for n in k.next)]
            rows += [(k.host, k.os, kernel, when, h) for (kernel, when), h in zip(kernels, k.headers, strict=True)]
        parts.append(table(f"\nKernel headers per node ({len(p.node_kernels)} nodes; the driver's kernel module is "
                           "built against them: by DKMS, or by the driver container)",
                           ["host", "os", "kernel", "which", "headers"], rows))
    parts += [f"note: {n}" for n in p.notes]
    return "\n".join(parts) + "\n"


class _Report:
    """Progress of mirror pull/push, one line per image (rich bars on a terminal, plain lines elsewhere; -q: none),
    each finished image with its size, and a summary of images and bytes. Called from several copying threads."""

    def __init__(self, quiet: bool, verb: str):
        import threading
        import time

        from installer.ui import TransferProgress

        self.verb = verb
        self.progress: TransferProgress | None = None if quiet else TransferProgress(unit="images")
        self.current: dict[str, Transfer] = {}
        self.bytes = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, e: Event) -> None:
        from installer.ui import _size

        with self._lock:
            size = e.detail.rpartition(" ")[2]
            if e.kind == "copied" and size.isdigit():
                self.bytes += int(size)
            if self.progress is None:
                return
            label = f"[{e.index}/{e.total}] {e.ref}"
            if e.kind == "start":
                self.current[e.ref] = self.progress.add(
                    f"{label}: {self.verb}" + (f" from {e.detail}" if e.detail else ""), total=1)
            elif e.kind == "skipped":
                with self.progress.add(f"{label}: already there ({e.detail})", total=1) as t:
                    t.advance()
            elif e.kind == "copied" and e.ref in self.current:
                t = self.current.pop(e.ref)
                if size.isdigit():
                    t.description += f" ({_size(int(size))})"
                t.advance()
                t.done()
            elif e.kind == "failed":
                failed = self.current.pop(e.ref, None) or self.progress.add(f"{label}: {self.verb}", total=1)
                failed.stop()

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def rate(self) -> str:
        """'1.2 GB in 0:42 (29.0 MB/s)': the bytes copied so far."""
        import time

        from installer.ui import _clock_text, _size

        elapsed = time.monotonic() - self.started
        speed = f" ({_size(self.bytes / elapsed)}/s)" if elapsed > 0 and self.bytes else ""
        return f"{_size(self.bytes)} in {_clock_text(elapsed)}{speed}"


def _summary(what: str, outcome: Outcome, quiet: bool, report: _Report | None = None) -> None:
    import sys

    if not quiet:
        moved = f"; {report.rate()}" if report is not None else ""
        print(f"{what}: {len(outcome.copied)} copied, {len(outcome.skipped)} already there{moved}", file=sys.stderr)


def cmd_pull(args: argparse.Namespace) -> int:
    from pathlib import Path

    from installer import architectures, signing
    from installer.errors import HostFailures
    from installer.mirror import bundle, charts, images, packages

    plan = resolve_plan(args)
    artifacts = plan.artifacts(())
    if artifacts.packages and not args.skip_packages:
        architectures.check_packages(plan.nodes, artifacts.packages)
        packages.check_sources(plan.site, artifacts.packages)  # bad input: before anything is fetched
    charts.chart_login(plan.site)  # mirror.chartCredentials' variables set (exit 2): before anything is fetched
    key = signing.load_or_create(signing.key_home(Path(args.key_home) if args.key_home else None))
    if key.created and not args.quiet:
        import sys

        print(f"bundle signing key: generated in {key.home} (Ed25519, fingerprint {key.fingerprint}); its public half "
              f"{key.public_path} is what the air-gapped side pins (mirror.trustedKeys), carried there once",
              file=sys.stderr)
    platform = _node_platform(plan, args)
    out = Path(args.output)
    report = _Report(args.quiet, "pulling")
    failures: list[HostFailures] = []
    outcome = None
    try:
        outcome = images.pull(plan, artifacts.images, out, platform=platform, progress=report, jobs=args.jobs,
                              since=Path(args.since) if args.since else None, finish=False)
    except images.TransferFailures as exc:  # the chart and files are still pulled: one run says all that is wrong
        failures.append(exc)
    finally:
        report.close()
    try:
        charts.pull(plan, artifacts.charts, artifacts.files, out, say=say(args) or (lambda m: None))
    except charts.ChartFailures as exc:
        failures.append(exc)
    except OSError as exc:
        _no_space(exc, out)
    if artifacts.packages and args.skip_packages:
        packages.record_skipped(artifacts.packages, out)
        if not args.quiet:
            import sys

            print("OS packages left out (--skip-packages): the nodes install "
                  + "; ".join(f"{o.os}: {' '.join(p.spec for p in o.packages)}" for o in artifacts.packages)
                  + " from repositories of their own", file=sys.stderr)
    elif artifacts.packages:
        try:
            packages.pull(plan.site, artifacts.packages, out, say=say(args) or (lambda m: None),
                          since=Path(args.since) if args.since else None)
        except packages.PackageFailures as exc:
            failures.append(exc)
    try:
        lock = bundle.finish(out, key)
    except OSError as exc:
        _no_space(exc, out)
    if not args.quiet:
        import sys

        print(f"bundle lock signed: {out / bundle.SIGNATURE}, key fingerprint {key.fingerprint}; public key "
              f"{key.public_path} (pinned on the air-gapped side: mirror.trustedKeys or --trusted-key)",
              file=sys.stderr)
    if failures:
        if len(failures) == 1:
            raise failures[0]
        raise HostFailures("\n".join(f.message for f in failures), hint=failures[0].hint)
    if outcome is not None:
        _summary(f"bundle {args.output} complete ({len(artifacts.images)} images, platform {platform}; "
                 f"{len(lock.get('charts') or [])} chart(s), {len(lock.get('files') or [])} file(s), "
                 f"{sum(1 for p in lock.get('packages') or [] if not p.get('key'))} OS package(s))", outcome,
                 args.quiet, report)
    return 0


def _no_space(exc: OSError, out: Path) -> NoReturn:
    """exc again, unless the disk under the bundle is full: then DiskFull (exit 8) naming the path and what is free."""
    import errno
    from pathlib import Path

    from installer.mirror.common import disk_full

    if exc.errno == errno.ENOSPC:
        raise disk_full(Path(exc.filename) if exc.filename else out, None) from None
    raise exc


def cmd_push(args: argparse.Namespace) -> int:
    from pathlib import Path

    from installer.config import load_site
    from installer.mirror import charts, images, packages, staging
    from installer.mirror.bundle import bundle_for_push
    from installer.mirror.lock import check_charts, check_images
    from installer.mirror.packages.publish import needs as package_bytes
    from installer.mirror.packages.publish import stage as stage_packages

    site = load_site(args.site, args.set)
    bundle = Path(args.bundle)
    lock = bundle_for_push(bundle, _trusted(site, args), site.mirror.maxBundleAge)  # signature, completeness, age
    check_images(site, lock, bundle)  # every destination from the site, before anything is read or copied
    check_charts(site, bundle, lock)  # every chart and file: the plan's
    if lock.get("packages") and not args.repo_dir:
        from installer.errors import ConfigError

        raise ConfigError(f"{bundle}: the bundle holds OS packages and --repo-dir is not given",
                          hint="give --repo-dir DIR (a directory a web server of the site serves to the nodes): "
                               "push publishes the packages there as signed repositories")
    # every file the lock names read ONCE from the bundle into a private staging directory and matched there (exit 2
    # before anything is pushed or published); from here on only the staged copies are used; removed however push ends
    with staging.staging(Path(args.staging_dir) if args.staging_dir else None, bundle) as into:
        staged_images = images.stage(site, bundle, lock, into, also_needs=charts.needs(lock) + package_bytes(lock))
        staged_charts = charts.stage(bundle, lock, site, into)
        staged_packages = stage_packages(bundle, lock, into)
        creds = _credentials(site)
        report = _Report(args.quiet, "pushing")
        try:
            outcome = images.push(site, bundle, config_json=creds, progress=report, jobs=args.jobs, lock=lock,
                                  staged=staged_images)
        finally:
            report.close()
        done = charts.push(site, bundle, lock, config_json=creds,
                           repo_dir=Path(args.repo_dir) if args.repo_dir else None,
                           say=say(args) or (lambda m: None), staged=staged_charts)
        if args.repo_dir:
            done += packages.publish(bundle, lock, Path(args.repo_dir),
                                     Path(args.signing_home) if args.signing_home else None,
                                     say=say(args) or (lambda m: None), staged=staged_packages)
    _summary(f"pushed {bundle} to {site.registry.host}", outcome, args.quiet, report)
    if not args.quiet:
        import sys

        for line in done:
            print(f"  {line}", file=sys.stderr)
        for c in lock.get("charts") or []:
            print(f"operator.chart for apply: {(bundle / str(c['file'])).resolve()} (this bundle's copy), or "
                  f"{charts.oci_ref(site, str(c['name']))}:{c['version']} (needs helm on this machine to trust and be "
                  "logged in to the registry)", file=sys.stderr)
            print(f"operator.chartSha256: {c['sha256']} (with operator.chart set to this bundle's copy: apply, "
                  "operator install and upgrade install only a file of this sha256)", file=sys.stderr)
    return 0


def _trusted(site: Site, args: argparse.Namespace) -> list[Path]:
    """The bundle keys pinned on this side: mirror.trustedKeys (relative to the site file) and --trusted-key."""
    from pathlib import Path

    return [*site.mirror.trustedKeys, *(Path(p) for p in args.trusted_key or [])]


def _credentials(site: Site) -> bytes | None:
    from installer.mirror.common import credentials

    return credentials(site)


def cmd_sync(args: argparse.Namespace) -> int:
    from installer.mirror import images

    plan = resolve_plan(args)
    artifacts = plan.artifacts(())
    platform = _node_platform(plan, args)
    creds = _credentials(plan.site)
    report = _Report(args.quiet, "syncing")
    try:
        outcome = images.sync(plan, artifacts.images, config_json=creds, platform=platform, progress=report,
                              jobs=args.jobs)
    finally:
        report.close()
    _summary(f"synced {len(artifacts.images)} images to {plan.site.registry.host} (platform {platform})", outcome,
             args.quiet, report)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from installer.mirror import verify
    from installer.mirror.bundle import bundle_for_push

    plan = resolve_plan(args)
    site = plan.site
    charts_found: list[str] = []
    from installer.mirror.packages import check_repo

    if args.bundle:
        bundle = Path(args.bundle)
        # what push requires first: the signature, completeness (a failed image), images at all, the bundle's age
        lock = bundle_for_push(bundle, _trusted(site, args), site.mirror.maxBundleAge)
        wanted = verify.from_lock(site, lock, bundle)
        charts_found = verify.charts(site, bundle, lock, config_json=_credentials(site))
        charts_found += check_repo(site, lock=lock)
        n_pkgs = sum(1 for p in lock.get("packages") or [] if isinstance(p, dict) and not p.get("key"))
        how = f"by the bundle's digests; {len(lock.get('charts') or [])} chart(s) by sha256"
    else:
        wanted = verify.from_plan(plan.artifacts(()).images)
        sets = plan.artifacts(()).packages
        charts_found += check_repo(site, sets=sets)
        n_pkgs = sum(len(s.packages) for s in sets)
        how = "tags resolve"
    n = verify.require(site, wanted, config_json=_credentials(site), jobs=args.jobs, more=charts_found)
    if not args.quiet:
        print(f"all {n} images are in {site.registry.host} ({how})", file=sys.stderr)
        if site.packages.url and n_pkgs:
            print(f"all {n_pkgs} OS package(s) are in {site.packages.url} ("
                  + ("by the bundle's sha256" if args.bundle else "each root at its pin")
                  + "; the index signed by the site key)", file=sys.stderr)
    return 0


def _node_platform(plan: Any, args: argparse.Namespace) -> str:
    """--platform / --all-platforms, else the platform of the nodes' architectures (installer.architectures)."""
    import sys

    from installer import architectures
    from installer.mirror import images

    platform, note = architectures.platform_for(plan.nodes, args.platform, args.all_platforms)
    if note and not args.quiet:
        print(f"note: {note}", file=sys.stderr)
    return images.ALL_PLATFORMS if platform == architectures.ALL_PLATFORMS else platform


def _platform(text: str) -> str:
    import re

    if not re.fullmatch(r"[a-z0-9]+/[a-z0-9_]+(?:/[a-z0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not OS/ARCH[/VARIANT], e.g. linux/amd64 or linux/arm64")
    return text


def _plan_command(msub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A mirror subcommand that resolves the site's plan: -s/--set, -i, and --os/--kernel for the nodes without an
    inventory."""
    p = command(msub, name, help_text)
    site_args(p)
    inventory_arg(p)
    node_flags(p)
    return p


def _platform_args(p: argparse.ArgumentParser, digest_note: str = "") -> None:
    """--platform OS/ARCH | --all-platforms: which manifest of a multi-platform image pull and sync copy."""
    plat = p.add_mutually_exclusive_group()
    plat.add_argument("--platform", type=_platform, default=None, metavar="OS/ARCH",
                      help="copy this platform's manifest of a multi-platform image (default: the nodes' "
                           "architecture -- gpu_install_arch or --facts -- every platform when they run several, "
                           "linux/amd64 when it is not known)" + digest_note)
    plat.add_argument("--all-platforms", action="store_true",
                      help="copy manifest lists / indexes whole, every platform (the published digest)")


def _trusted_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trusted-key", action="append", default=[], metavar="FILE",
                   help="public key (PEM) of the connected side's bundle signing key: the bundle's lock must be signed "
                        "by it or by a key of mirror.trustedKeys; repeatable")


def _jobs_arg(p: argparse.ArgumentParser, what: str = "copy N images at a time, one skopeo process each") -> None:
    p.add_argument("-j", "--jobs", type=int, default=4, metavar="N", help=f"{what} (default 4)")


def register(sub: Any) -> None:
    msub = group(sub, "mirror", "air-gapped mirroring: what the site needs", "mirror_command")
    p = _plan_command(msub, "plan", "list every artifact an air-gapped install needs (images, chart, files, OS "
                                    "packages); offline")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="text: tables by kind; json: schema gpu-install.mirror-plan/v1")
    p.add_argument("--why", metavar="REF",
                   help="say which component and which setting needs REF (an image, the chart, a file, a package); "
                        "exit 2 when REF is not in the plan")
    output_arg(p)
    p.set_defaults(func=cmd_plan)

    p = _plan_command(msub, "pull", "copy every image of the mirror plan into a bundle directory (one OCI image "
                                    "layout + bundle.lock.json); connected side; resumable")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="bundle directory (created; an existing bundle is completed, not copied again)")
    _platform_args(p, "; its digest is the one recorded and pushed")
    p.add_argument("--skip-packages", action="store_true",
                   help="leave the OS packages out of the bundle (the nodes install them from a package mirror of "
                        "their own); the lock lists the roots as skipped")
    p.add_argument("--since", metavar="OLD.lock.json",
                   help="incremental bundle: leave out every image whose digest this older bundle's lock already has "
                        "at the same destination, and every OS package file it has with the same sha256 (push then "
                        "requires the registry and the --repo-dir to hold those)")
    p.add_argument("--key-home", metavar="DIR",
                   help="directory of the bundle signing key (Ed25519) that signs the lock, generated there on first "
                        "use and kept; its public half DIR/signing-key.pub.pem is what the air-gapped side pins (env "
                        "GPU_INSTALL_BUNDLE_KEY_HOME; default <state dir>/bundle-signing)")
    _jobs_arg(p)
    quiet_arg(p)
    p.set_defaults(func=cmd_pull)

    p = _plan_command(msub, "sync", "copy every image of the mirror plan from its upstream straight into "
                                    "registry.host, digests preserved and checked (a host that sees both "
                                    "registries); idempotent")
    _platform_args(p)
    _jobs_arg(p)
    quiet_arg(p)
    p.set_defaults(func=cmd_sync)

    p = _plan_command(msub, "verify", "check that every image of the plan (or of a bundle's lock) is in "
                                      "registry.host, by digest, and (with packages.url) every OS package in the site "
                                      "repository; exit 3 naming what is missing")
    p.add_argument("--bundle", metavar="DIR",
                   help="check the images of this bundle's lock, each by its digest (default: the plan's images, "
                        "their tags must resolve)")
    _trusted_arg(p)
    _jobs_arg(p, "look up N images in registry.host at a time, one `skopeo inspect` each (nothing is copied)")
    quiet_arg(p)
    p.set_defaults(func=cmd_verify)

    p = command(msub, "push", "copy a bundle's images into the site registry (registry.host), digests preserved and "
                              "verified; air-gapped side; idempotent")
    p.add_argument("bundle", metavar="DIR", help="bundle directory written by `gpu-install mirror pull`")
    site_args(p)
    p.add_argument("--repo-dir", metavar="DIR",
                   help="also publish the chart as a static chart repository DIR/charts (index.yaml), the files "
                        "into DIR/files (SHA256SUMS) and the OS packages as signed apt/dnf repositories "
                        "DIR/packages/<os> (required when the bundle holds packages), for a web server of the site")
    p.add_argument("--signing-home", metavar="DIR",
                   help="GnuPG home holding the site's package signing key, generated there on first use and kept "
                        "(env GPU_INSTALL_SIGNING_HOME; default <state dir>/signing)")
    p.add_argument("--staging-dir", metavar="DIR",
                   help="where push makes its private staging directory (0700, removed afterwards): every bundle file "
                        "is read once and copied there, checked, and only that copy pushed or published; needs as "
                        "much free space as the bundle's files (env GPU_INSTALL_STAGING_DIR; default the system's "
                        "temporary directory)")
    _trusted_arg(p)
    _jobs_arg(p)
    quiet_arg(p)
    p.set_defaults(func=cmd_push)
