"""`gpu-install mirror verify`: is every image the site needs in registry.host, by digest?

The images come from the plan (what `apply` will deploy) or, with a bundle, from its lock (what `mirror push` put
there, each with its digest). Each destination's manifest is read with `skopeo inspect --raw` (concurrently, with the
site's CA and credentials as push has them) and its sha256 compared with the lock's digest; without a bundle the
tag must resolve. Blobs are not fetched one by one: a registry (distribution) refuses a manifest whose blobs it lacks,
so a manifest that resolves means its blobs were there when it was pushed; a registry garbage-collected by hand
afterwards is outside this check. One finding per missing or different image, each naming the fix.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError, PreflightError
from installer.mirror.common import DEFAULT_JOBS, credentials
from installer.mirror.registry import Finding as Finding
from installer.mirror.registry import Wanted as Wanted
from installer.mirror.registry import check as check

if TYPE_CHECKING:
    from installer.config import Site
    from installer.mirror.plan import ImageArtifact
    from installer.plan import Plan


def from_plan(images: Sequence[ImageArtifact]) -> list[Wanted]:
    """The plan's images (ImageArtifacts), by tag (or by digest where the plan pins one)."""
    return [Wanted(i.source, i.destination) for i in images]


def from_lock(site: Site, lock: Mapping[str, Any], bundle: Path) -> list[Wanted]:
    """The images of a bundle's (verified) lock, each with its digest, at the destination the site computes for its
    source, and the images an incremental bundle builds on ("base": push requires the registry to hold them), each
    at its digest. The whole lock is checked first as push checks it (ConfigError, exit 2, naming the entry): complete
    and carrying images (installer.mirror.bundle.check_complete), images (installer.mirror.lock.check_images), charts
    and files (installer.mirror.lock.check_charts), package entries (installer.mirror.lock.check_entry): nothing the
    lock names is read from anywhere else."""
    from installer.mirror import lock as entries
    from installer.mirror.bundle import LOCK, check_complete

    check_complete(bundle, lock, images_required=True)

    if lock.get("registry") != site.registry.host:
        raise ConfigError(f"{bundle}: the bundle was pulled for registry {lock.get('registry')}, the site file names "
                          f"{site.registry.host}", hint="verify with the site file the bundle was pulled for")
    images = entries.check_images(site, lock, bundle)
    entries.check_charts(site, bundle, lock)
    for section in (entries.PACKAGES, entries.BASE):
        for i, e in enumerate(lock.get(section) or []):
            entries.check_entry(bundle / LOCK, section, i, e)
    base = [Wanted(str(e.get("source"))[:300], str(e.get("destination")), str(e.get("digest")))
            for e in lock.get("base") or [] if isinstance(e, dict)]
    return [*(Wanted(e["source"], e["destination"], e["digest"]) for e in images), *base]


def charts(site: Site, bundle: Path, lock: Mapping[str, Any], *, config_json: bytes | None) -> list[str]:
    """The bundle's charts that the site registry lacks or holds with another sha256 (as lines for require's
    message): each OCI chart `mirror push` put at installer.mirror.charts.oci_ref, pulled with helm and hashed."""
    import tempfile

    from installer.mirror import charts as ch

    out: list[str] = []
    reg = site.registry
    with ch.helm_env() as env, ch._registry_config(config_json, env):
        tls = ["--insecure-skip-tls-verify"] if reg.insecure else (["--ca-file", str(reg.ca)] if reg.ca else [])
        for c in lock.get("charts") or []:
            if not isinstance(c, dict):
                continue
            ref = f"{ch.oci_ref(site, str(c.get('name')))}:{c.get('version')}"
            with tempfile.TemporaryDirectory(prefix="gpu-install-verify-") as tmp:
                rc, msg = ch._helm(["pull", ref.rsplit(":", 1)[0], "--version", str(c.get("version")), "--destination",
                                    tmp, *tls], env, [])
                got = next(iter(Path(tmp).glob("*.tgz")), None) if rc == 0 else None
                if got is None:
                    out.append(f"  {ref} (chart): missing ({msg})")
                elif ch.sha256_of(got) != c.get("sha256"):
                    out.append(f"  {ref} (chart): sha256 {ch.sha256_of(got)}, the bundle {c.get('sha256')}")
    return out


def require(site: Site, wanted: Sequence[Wanted], *, config_json: bytes | None, jobs: int = DEFAULT_JOBS,
            what: str = "", more: Sequence[str] = ()) -> int:
    """check(), raising PreflightError (exit 3) naming every missing or different image (and the lines of more:
    other artifacts found missing); the number of images checked. Nothing to check is ConfigError (exit 2), never a
    pass: every site's plan deploys images (the GPU Operator's own), so an empty list is a plan or lock gone wrong."""
    if not wanted:
        raise ConfigError(f"no image {what}to check in {site.registry.host}: a site's plan always has images (the "
                          "GPU Operator's own), so nothing was verified",
                          hint="check the site file (operator.version, components) and, with --bundle, that the "
                               "bundle is the complete pull of this site's plan")
    findings = check(site, wanted, config_json=config_json, jobs=jobs)
    if findings or more:
        raise PreflightError(
            f"{len(findings)} of {len(wanted)} images {what}are not in {site.registry.host} as the site needs them"
            + (f" (and {len(more)} other artifact(s))" if more else "") + ":\n"
            + "\n".join([*(f.line() for f in findings), *more]),
            hint="copy them there: gpu-install mirror push BUNDLE -s SITE [--repo-dir DIR] (air-gapped) or gpu-install "
                 "mirror sync -s SITE (a host that sees both registries); a different digest: push the bundle of this "
                 "release")
    return len(wanted)


def for_apply(plan: Plan) -> int:
    """apply's mirror check: every image the operator stage deploys is in registry.host (its tag resolves), with the
    site's CA and pull credentials; PreflightError (exit 3) naming each missing one. The number checked. The operator
    is cluster-wide: with --limit the images are those of every GPU node of the inventory (a driver image per node
    OS), not only the limited ones."""
    from installer.plan import cluster_wide

    plan = cluster_wide(plan)
    site = plan.site
    return require(site, from_plan(plan.artifacts(()).images), config_json=credentials(site),
                   what="the release deploys ")


def packages_for_apply(plan: Plan) -> int:
    """apply's package check (with packages.url): every package root the node roles install is in the site
    repository as the nodes read it (<packages.url>/packages/<os>, the index's signature checked with packages.key);
    PreflightError (exit 3) naming each missing one. The number of roots checked."""
    from installer.mirror.packages import check_repo

    sets = plan.artifacts(()).packages
    missing = check_repo(plan.site, sets=sets)
    if missing:
        raise PreflightError(f"{len(missing)} OS package problem(s) in the site repository {plan.site.packages.url}:\n"
                             + "\n".join(missing),
                             hint="publish them: gpu-install mirror push BUNDLE -s SITE --repo-dir DIR (DIR served at "
                                  "packages.url), from a bundle pulled for these nodes' OSes")
    return sum(len(s.packages) for s in sets)
