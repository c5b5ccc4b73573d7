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
    """The images of a bundle's (verified) lock, each with its digest."""
    if lock.get("registry") != site.registry.host:
        raise ConfigError(f"{bundle}: the bundle was pulled for registry {lock.get('registry')}, the site file names "
                          f"{site.registry.host}", hint="verify with the site file the bundle was pulled for")
    return [Wanted(str(e.get("source")), str(e.get("destination")), str(e.get("digest")))
            for e in lock.get("images") or [] if isinstance(e, dict)]


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
            findings.append(Finding(w, f"missing ({err})"))
        elif w.digest and digest != w.digest:
            findings.append(Finding(w, f"the registry has {digest}, the bundle {w.digest}"))
    return findings


def require(site: Any, wanted: Sequence[Wanted], *, config_json: bytes | None, jobs: int = DEFAULT_JOBS,
            what: str = "") -> int:
    """check(), raising PreflightError (exit 3) naming every missing or different image; the number checked."""
    findings = check(site, wanted, config_json=config_json, jobs=jobs)
    if findings:
        raise PreflightError(
            f"{len(findings)} of {len(wanted)} images {what}are not in {site.registry.host} as the site needs them:\n"
            + "\n".join(f.line() for f in findings),
            hint="copy them there: gpu-install mirror push BUNDLE -s SITE (air-gapped) or gpu-install mirror sync -s "
                 "SITE (a host that sees both registries); a different digest: push the bundle of this release")
    return len(wanted)


def for_apply(plan: Any) -> int:
    """apply's mirror check: every image the plan deploys is in registry.host (its tag resolves), with the site's CA
    and pull credentials; PreflightError (exit 3) naming each missing one. The number checked."""
    from installer.kube import docker_config_json

    site = plan.site
    ps = site.registry.pullSecret
    creds = docker_config_json(site.registry) if ps and (ps.dockerConfigFile or ps.usernameEnv) else None
    return require(site, from_plan(plan.artifacts(()).images), config_json=creds, what="the release deploys ")
