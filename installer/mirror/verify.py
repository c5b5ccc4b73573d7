"""`gpu-install mirror verify` and apply's mirror check: is every image the site needs in registry.host?

Per image of the plan (exactly `gpu-install images`' destinations), concurrently: the destination's manifest as the
registry serves it (`skopeo inspect --raw`: the registry's own answer, with the site's credentials and CA). With a
bundle, its digest must be the lock's (what `mirror push` put there); without one, the tag must resolve. Blobs are
not fetched: a registry accepts a manifest only when it holds every blob the manifest names (the distribution spec's
manifest PUT), so a manifest that resolves means its image was pushed whole. With a bundle its chart is checked too:
the OCI chart in the registry must have the lock's sha256.

The result names every missing or different artifact with the fix; `mirror verify` and apply (before any host is
touched, when its operator stage will run) turn a non-empty result into exit 3.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from installer.errors import PreflightError

JOBS = 8


@dataclass(frozen=True)
class Finding:
    ref: str  # the destination (image) or chart reference
    problem: str  # missing | different | unreachable
    detail: str


def _creds(site: Any) -> bytes | None:
    from installer.kube import docker_config_json

    ps = site.registry.pullSecret
    return docker_config_json(site.registry) if ps and (ps.dockerConfigFile or ps.usernameEnv) else None


def images(site: Any, wanted: Sequence[tuple[str, str | None]], progress: Callable[[str], None] | None = None,
           jobs: int = JOBS) -> list[Finding]:
    """wanted: (destination, digest it must have or None for any); the findings (empty: all there)."""
    from installer.mirror.images import authfile, cert_dir, manifest_digest, secrets_of

    config = _creds(site)
    secrets = secrets_of(config)
    reg = site.registry
    with cert_dir(reg.ca) as certs, authfile(config) as auth:
        def one(item: tuple[str, str | None]) -> Finding | None:
            dest, digest = item
            got, err = manifest_digest(dest, cert=certs, auth=auth, tls_verify=not reg.insecure, secrets=secrets)
            if got is None:
                unknown = any(w in err.lower() for w in ("manifest unknown", "not found", "name unknown"))
                if unknown:
                    return Finding(dest, "missing", "the registry has no such tag ("
                                   + err.rsplit(": ", 1)[-1].strip() + ")")
                return Finding(dest, "unreachable", err)
            if digest and got != digest:
                return Finding(dest, "different", f"the registry has {got}, the bundle {digest}")
            return None

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            found = [f for f in pool.map(one, wanted) if f is not None]
    if progress:
        progress(f"mirror check: {len(wanted) - len(found)} of {len(wanted)} images in {reg.host}")
    return found


def chart(site: Any, bundle: Path, lock: dict[str, Any]) -> list[Finding]:
    """The bundle's charts in the site registry with the lock's sha256."""
    import tempfile

    from installer.mirror import charts

    out = []
    config = _creds(site)
    reg = site.registry
    with charts.helm_env() as env, charts._registry_config(config, env):
        tls = ["--insecure-skip-tls-verify"] if reg.insecure else (["--ca-file", str(reg.ca)] if reg.ca else [])
        for c in lock.get("charts") or []:
            ref = charts.oci_ref(site, str(c["name"]))
            with tempfile.TemporaryDirectory(prefix="gpu-install-verify-") as tmp:
                rc, msg = charts._helm(["pull", ref, "--version", str(c["version"]), "--destination", tmp, *tls], env)
                got = next(iter(Path(tmp).glob("*.tgz")), None) if rc == 0 else None
                if got is None:
                    out.append(Finding(f"{ref}:{c['version']}", "missing", msg))
                elif charts.sha256_of(got) != c["sha256"]:
                    out.append(Finding(f"{ref}:{c['version']}", "different",
                                       f"sha256 {charts.sha256_of(got)}, the bundle {c['sha256']}"))
    return out


def report(findings: Sequence[Finding], registry: str, what: str) -> PreflightError:
    lines = [f"  {f.ref}: {f.problem}: {f.detail}" for f in findings]
    return PreflightError(f"{what}: {len(findings)} artifact(s) not in {registry} as the site needs them:\n"
                          + "\n".join(lines[:50]) + (f"\n  … and {len(lines) - 50} more" if len(lines) > 50 else ""),
                          hint="mirror them: gpu-install mirror pull (connected side), then mirror push (or mirror "
                               "sync); unreachable: check registry.host, registry.ca and the pull credentials")


def check_plan(plan: Any, progress: Callable[[str], None] | None = None) -> None:
    """apply's mirror check: every image the operator stage deploys resolves in registry.host; PreflightError
    (exit 3) naming the missing ones otherwise. The operator is cluster-wide: with --limit the images are those of
    every GPU node of the inventory (a driver image per node OS), not only the limited ones."""
    import dataclasses

    if plan.limit:
        from installer.plan import resolve

        plan = resolve(plan.site, dataclasses.replace(plan.options, limit=None))
    found = images(plan.site, [(i.destination, None) for i in plan.images], progress)
    if found:
        raise report(found, plan.site.registry.host, "mirror check")
