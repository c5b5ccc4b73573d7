"""Is an image in the site registry, by digest: one `skopeo inspect --raw` per destination (concurrently, with the
site's CA and credentials as push has them), its sha256 compared with the digest wanted. Used by `mirror verify`,
apply's mirror check and push of an incremental bundle (the images it builds on)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from installer.mirror.common import DEFAULT_JOBS, authfile, cert_dir, manifest_digest, secrets_of

if TYPE_CHECKING:
    from installer.config import Site


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


def check(site: Site, wanted: Sequence[Wanted], *, config_json: bytes | None, jobs: int = DEFAULT_JOBS) -> list[Finding]:
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

