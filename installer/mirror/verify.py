"""`gpu-install mirror verify`: is every image the site needs in registry.host, by digest?

The images come from the plan (what `apply` will deploy) or, with a bundle, from its lock (what `mirror push` put
there, each with its digest). Each destination's manifest is read with `skopeo inspect --raw` (concurrently, with the
site's CA and credentials as push has them) and its sha256 compared with the lock's digest; without a bundle the
tag must resolve. Blobs are not fetched one by one: a registry (distribution) refuses a manifest whose blobs it lacks,
so a manifest that resolves means its blobs were there when it was pushed; a registry garbage-collected by hand
afterwards is outside this check. One finding per missing or different image, each naming the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import ConfigError, PreflightError
from installer.mirror.images import DEFAULT_JOBS, authfile, cert_dir, manifest_digest, secrets_of


@dataclass(frozen=True)
class Wanted:
    """An image the site needs at destination; digest None: any manifest the tag resolves to."""

    source: str
    destination: str
    digest: str | None = None


@dataclass(frozen=True)
class Finding:
    wanted: Wanted
    problem: str

    def line(self) -> str:
        return f"  {self.wanted.destination} (from {self.wanted.source}): {self.problem}"


def from_plan(images: Sequence[Any]) -> list[Wanted]:
    """The plan's images (ImageArtifacts), by tag (or by digest where the plan pins one)."""
    return [Wanted(i.source, i.destination) for i in images]


def from_lock(site: Any, lock: dict[str, Any], bundle: Path) -> list[Wanted]:
    """The images of a bundle's (verified) lock, each with its digest, at the destination the site computes for its
    source. The whole lock is checked first as push checks it (ConfigError, exit 2, naming the entry): images
    (installer.mirror.images.check_images), charts and files (installer.mirror.charts.check), package entries
    (installer.mirror.packages.check_entry): nothing the lock names is read from anywhere else."""
    from installer.mirror import charts, packages
    from installer.mirror.bundle import LOCK
    from installer.mirror.images import check_images

    if lock.get("registry") != site.registry.host:
        raise ConfigError(f"{bundle}: the bundle was pulled for registry {lock.get('registry')}, the site file names "
                          f"{site.registry.host}", hint="verify with the site file the bundle was pulled for")
    entries = check_images(site, lock, bundle)
    charts.check(site, bundle, lock)
    for section in (packages.PACKAGES, packages.BASE):
        for i, e in enumerate(lock.get(section) or []):
            packages.check_entry(bundle / LOCK, section, i, e)
    return [Wanted(str(e["source"]), str(e["destination"]), str(e["digest"])) for e in entries]


def check(site: Any, wanted: Sequence[Wanted], *, config_json: bytes | None, jobs: int = DEFAULT_JOBS) -> list[Finding]:
    """The images of wanted that registry.host lacks or holds with another digest (plan order)."""
    reg = site.registry
    secrets = secrets_of(config_json)
    with cert_dir(reg.ca) as certs, authfile(config_json) as auth, ThreadPoolExecutor(max_workers=max(jobs, 1)) as pool:
        got = list(pool.map(lambda w: manifest_digest(w.destination, cert=certs, auth=auth,
                                                      tls_verify=not reg.insecure, secrets=secrets), wanted))
    findings = []
    for w, (digest, err) in zip(wanted, got, strict=True):
        if digest is None:
            unknown = any(t in err.lower() for t in ("manifest unknown", "name unknown", "not found"))
            findings.append(Finding(w, f"missing: the registry has no such tag ({err.rsplit(': ', 1)[-1].strip()})"
                                    if unknown else f"cannot be read ({err})"))
        elif w.digest and digest != w.digest:
            findings.append(Finding(w, f"the registry has {digest}, the bundle {w.digest}"))
    return findings


def charts(site: Any, bundle: Path, lock: dict[str, Any], *, config_json: bytes | None) -> list[str]:
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


def require(site: Any, wanted: Sequence[Wanted], *, config_json: bytes | None, jobs: int = DEFAULT_JOBS,
            what: str = "", more: Sequence[str] = ()) -> int:
    """check(), raising PreflightError (exit 3) naming every missing or different image (and the lines of more:
    other artifacts found missing); the number of images checked."""
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


def for_apply(plan: Any) -> int:
    """apply's mirror check: every image the operator stage deploys is in registry.host (its tag resolves), with the
    site's CA and pull credentials; PreflightError (exit 3) naming each missing one. The number checked. The operator
    is cluster-wide: with --limit the images are those of every GPU node of the inventory (a driver image per node
    OS), not only the limited ones."""
    import dataclasses

    from installer.kube import docker_config_json

    if plan.limit:
        from installer.plan import resolve

        plan = resolve(plan.site, dataclasses.replace(plan.options, limit=None))
    site = plan.site
    ps = site.registry.pullSecret
    creds = docker_config_json(site.registry) if ps and (ps.dockerConfigFile or ps.usernameEnv) else None
    return require(site, from_plan(plan.artifacts(()).images), config_json=creds, what="the release deploys ")


def packages_for_apply(plan: Any) -> int:
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
