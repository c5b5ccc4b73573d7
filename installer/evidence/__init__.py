"""Signed install evidence (docs/evidence.md): what runs where, tied to what was shipped and validated, in one file a
change ticket can carry and anyone can verify offline with the site's evidence key.

create(): an in-toto Statement v1 (installer.evidence.model) whose subjects are the bundle lock, the chart, the
rendered values, the site file (credentials redacted), the validate reports and every image running in the operator's
namespace by the digest the kubelet reports; its predicate (PREDICATE_TYPE) the release, the nodes, the settings, the
helm revision, the validate summaries, who and when; signed in a DSSE envelope with the site's ECDSA P-256 evidence
key (installer.evidence.sign, installer.signing), the Markdown rendering beside it.

verify(): the signature against pinned public keys only, the subjects against the files given, and with live the
running cluster against the evidence (an image, driver, kernel, GPU or node that differs is named). Exit 0 valid, 2 an
unreadable or wrong input, 6 a signature, subject or live mismatch (EvidenceMismatch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import EXIT_VALIDATION, ConfigError, GpuInstallError
from installer.evidence import collect, model

if TYPE_CHECKING:
    from installer.plan import Plan

Progress = Callable[[str], None]


class EvidenceMismatch(GpuInstallError):
    """The evidence does not verify: signature, a subject, or the live cluster differs (exit 6)."""

    exit_code = EXIT_VALIDATION


@dataclass(frozen=True)
class Made:
    path: Path
    markdown: Path
    public_key: Path  # the evidence key's public half, exported beside the evidence
    fingerprint: str
    subjects: int
    key_created: bool


def public_key_path(output: Path) -> Path:
    """Where the key's public half is exported: <output stem>.pub.pem beside the evidence."""
    return output.with_name(output.stem + ".pub.pem")


def create(plan: Plan, site_path: str, output: Path, *, kubeconfig: Path, bundle: Path | None = None,
           chart: str | None = None, reports: Sequence[Path] = (), ticket: str | None = None,
           key_home: str | None = None, sigstore: bool = False, timeout: float = 30.0, secrets: Sequence[str] = (),
           progress: Progress | None = None) -> Made:
    """Collect, sign, write output (the envelope), output.md-style Markdown and the public key beside it."""
    from installer.evidence import markdown, sign
    from installer.util import atomic_write

    if output.is_dir() or not output.parent.is_dir():
        raise ConfigError(f"-o {output}: " + ("is a directory" if output.is_dir() else
                                              f"directory {output.parent} does not exist"),
                          hint="give a file name in an existing directory")
    if bundle is not None and not bundle.is_dir():
        raise ConfigError(f"--bundle {bundle}: not a directory", hint="give the bundle directory `mirror pull` wrote")
    key = sign.load_key(key_home)  # a key problem is exit 2 before the cluster and the nodes are asked
    say = progress or (lambda _: None)
    out = collect.Collected()
    collect.controller_files(plan, site_path, bundle=bundle, chart=chart, reports=reports, secrets=secrets, out=out)
    say(f"evidence: {len(out.subjects)} file subject(s); the images running in namespace {plan.site.operator.namespace}")
    objects = collect.cluster(plan, kubeconfig, out)
    say(f"evidence: {sum(s.kind == model.IMAGE for s in out.subjects)} running image(s); the GPU nodes over SSH")
    out.predicate["nodes"] = collect.nodes(plan, objects, timeout=timeout, secrets=secrets, progress=progress)
    out.predicate["createdBy"] = collect.who()
    out.predicate["ticket"] = ticket
    statement = model.statement(out.subjects, out.predicate)
    data = sign.envelope(key, model.canonical(statement), sigstore=sigstore)
    md = output.with_suffix(".md")
    pub = public_key_path(output)
    try:
        atomic_write(output, data.decode(), mode=0o644)
        atomic_write(md, markdown.render(out.subjects, out.predicate, fingerprint=key.fingerprint, files=out.files),
                     mode=0o644)
        atomic_write(pub, key.public_path.read_text(), mode=0o644)
    except OSError as exc:
        raise ConfigError(f"{output}: cannot write the evidence ({exc.strerror or exc})",
                          hint="choose a writable directory") from None
    return Made(output, md, pub, key.fingerprint, len(out.subjects), key.created)


# ---------------------------------------------------------------- verify


@dataclass
class Verdict:
    """What verify found: one check per signature, subject and live fact."""

    file: str
    keyid: str | None = None
    subjects: list[model.Subject] = field(default_factory=list)
    predicate: dict[str, Any] = field(default_factory=dict)
    live: bool = False
    checks: list[dict[str, str]] = field(default_factory=list)

    def add(self, kind: str, name: str, result: str, detail: str = "") -> None:
        self.checks.append({"kind": kind, "name": name, "result": result, "detail": detail})

    @property
    def bad(self) -> list[dict[str, str]]:
        return [c for c in self.checks if c["result"] in ("mismatch", "drift")]

    def doc(self) -> dict[str, Any]:
        return {"file": self.file, "keyid": self.keyid,
                "predicateType": model.PREDICATE_TYPE if self.predicate else None, "subjects": len(self.subjects),
                "live": self.live, "valid": not self.bad and self.keyid is not None, "checks": list(self.checks)}


def read_signed(path: Path, keys: Sequence[str], verdict: Verdict) -> None:
    """The signature against the pinned keys; verdict gets the signing key, the subjects and the predicate. An
    unreadable file or key, or another kind of envelope: ConfigError (2); a signature that does not verify or a key
    not pinned: EvidenceMismatch (6)."""
    from installer import signing
    from installer.evidence import sign

    hint = "give the evidence file `gpu-install evidence create` wrote"
    trusted = sign.pinned(list(keys))
    raw = signing.read_bounded(path, signing.MAX_ENVELOPE_BYTES, "the evidence", hint)
    data, _key_hint = sign.unwrap(raw, path)
    try:
        env = signing.parse_envelope(data)
    except ValueError as exc:
        raise ConfigError(f"{path}: not a valid DSSE envelope: {exc}", hint=hint) from None
    if env.payload_type != model.PAYLOAD_TYPE:
        raise ConfigError(f"{path}: an envelope of {env.payload_type!r}, not an in-toto statement "
                          f"({model.PAYLOAD_TYPE})", hint=hint)
    again = ("the evidence was changed after it was signed, or it was signed by a key not pinned here: get the file "
             "again from where it was made, and pin the evidence key by its fingerprint")
    try:
        payload, key = signing.verify(data, trusted, model.PAYLOAD_TYPE, source=path, hint=again)
    except ConfigError as exc:
        verdict.add("signature", ", ".join(env.signatures), "mismatch", exc.message)
        raise EvidenceMismatch(exc.message, hint=again) from None
    verdict.keyid = key.keyid
    verdict.add("signature", key.keyid, "ok", "DSSE signature verified (ECDSA P-256) with a pinned key")
    try:
        verdict.subjects, verdict.predicate = model.parse(payload)
    except ValueError as exc:
        raise ConfigError(f"{path}: signed, but {exc}", hint="give gpu-install evidence (predicate "
                                                             f"{model.PREDICATE_TYPE})") from None


def check_subject(verdict: Verdict, kind: str, name: str, data: bytes, source: str) -> None:
    expected = [s for s in verdict.subjects if s.kind == kind and s.name == name]
    label = f"{kind}:{name}"
    if not expected:
        verdict.add("subject", label, "mismatch", f"{source} is not a subject of the evidence "
                    f"(it records {', '.join(s.label for s in verdict.subjects if s.kind == kind) or f'no {kind}'})")
        return
    got = model.sha256(data)
    if got == expected[0].sha256:
        verdict.add("subject", label, "ok", f"{source}: sha256 {got}")
    else:
        verdict.add("subject", label, "mismatch", f"{source} has sha256 {got}, the evidence records "
                                                  f"{expected[0].sha256}")


def check_files(verdict: Verdict, *, bundle: Path | None, files: Sequence[Path], plan: Plan | None,
                site_path: str | None, secrets: Sequence[str]) -> None:
    """The subjects recomputed from what is given: the bundle's lock and chart, files by name (validate reports, a
    chart), with the site file the rendered values and the redacted site."""
    from installer.mirror.bundle import LOCK as LOCK_FILE

    if bundle is not None:
        if not bundle.is_dir():
            raise ConfigError(f"--bundle {bundle}: not a directory", hint="give the bundle directory")
        check_subject(verdict, model.LOCK, LOCK_FILE, collect.read_file(bundle / LOCK_FILE, "bundle lock"),
                      str(bundle / LOCK_FILE))
        for s in verdict.subjects:
            if s.kind == model.CHART and (bundle / "charts" / s.name).is_file():
                check_subject(verdict, s.kind, s.name, collect.read_file(bundle / "charts" / s.name, "chart"),
                              str(bundle / "charts" / s.name))
    for f in files:
        kinds = [s.kind for s in verdict.subjects if s.name == f.name and s.kind != model.IMAGE]
        check_subject(verdict, kinds[0] if kinds else model.VALIDATE, f.name, collect.read_file(f, "file"), str(f))
    if plan is not None and site_path is not None:
        check_subject(verdict, model.SITE, Path(site_path).name, collect.redacted_site(site_path, secrets),
                      f"{site_path} (credentials redacted)")
        check_subject(verdict, model.VALUES, "values.yaml", collect.rendered_values(plan),
                      "the values rendered from the site file")
    checked = {c["name"] for c in verdict.checks if c["kind"] == "subject"}
    live_kind = verdict.live
    for s in verdict.subjects:
        if s.label not in checked and not (s.kind == model.IMAGE and live_kind):
            verdict.add("subject", s.label, "not checked", "no file given for it")


def check_live(verdict: Verdict, plan: Plan, kubeconfig: Path, *, timeout: float, secrets: Sequence[str],
               progress: Progress | None = None) -> None:
    """The running cluster against the evidence: the images running in the operator's namespace (each digest), the
    GPU nodes (present, OS, kernel, driver, GPUs by UUID), the helm revision."""
    now = collect.Collected()
    objects = collect.cluster(plan, kubeconfig, now)
    before: dict[str, set[str]] = {}
    after: dict[str, set[str]] = {}
    for subjects, into in ((verdict.subjects, before), (now.subjects, after)):
        for s in subjects:
            if s.kind == model.IMAGE:
                into.setdefault(s.name, set()).add(s.sha256)
    for name in sorted(set(before) | set(after)):
        then, cur = before.get(name, set()), after.get(name, set())
        recorded = ", ".join(f"sha256:{d}" for d in sorted(then)) or "no such image"
        for d in sorted(cur - then):
            verdict.add("live", f"image:{name}", "drift", f"runs with sha256:{d}, the evidence records {recorded}")
        if not cur:
            verdict.add("live", f"image:{name}", "drift", f"{recorded} in the evidence, no container runs it now")
        elif then - cur and cur <= then:
            verdict.add("live", f"image:{name}", "drift", ", ".join(f"sha256:{d}" for d in sorted(then - cur))
                        + " in the evidence, no container runs it now")
        if cur and cur == then:
            verdict.add("live", f"image:{name}", "ok", f"runs with {recorded}")
    helm_then = verdict.predicate.get("helm") or {}
    helm_now = now.predicate.get("helm") or {}
    if helm_then.get("revision") == helm_now.get("revision") and helm_then.get("chart") == helm_now.get("chart"):
        verdict.add("live", "helm", "ok", f"revision {helm_now.get('revision')} ({helm_now.get('chart')})")
    else:
        verdict.add("live", "helm", "drift", f"revision {helm_now.get('revision')} ({helm_now.get('chart')}) now, "
                                             f"the evidence records {helm_then.get('revision')} "
                                             f"({helm_then.get('chart')})")
    nodes_now = {n["name"]: n for n in collect.nodes(plan, objects, timeout=timeout, secrets=secrets,
                                                     progress=progress)}
    nodes_then = {str(n.get("name")): n for n in verdict.predicate.get("nodes") or [] if isinstance(n, dict)}
    for name in sorted(set(nodes_then) - set(nodes_now), key=str):
        verdict.add("live", f"node:{name}", "drift", "in the evidence, not a GPU node of the inventory now")
    for name in sorted(set(nodes_now) - set(nodes_then)):
        verdict.add("live", f"node:{name}", "drift", "a GPU node of the inventory now, not in the evidence")
    for name in sorted(set(nodes_now) & set(nodes_then)):
        was, now_ = nodes_then[name], nodes_now[name]
        if not now_.get("reached"):
            verdict.add("live", f"node:{name}", "drift", f"not reached now: {now_.get('error')}")
            continue
        differ = []
        for fact in ("os", "kernel", "driver"):
            if was.get(fact) != now_.get(fact):
                differ.append(f"{fact} {now_.get(fact)} now, {was.get(fact)} in the evidence")
        uuids_then = sorted(str(g.get("uuid")) for g in was.get("gpus") or [])
        uuids_now = sorted(str(g.get("uuid")) for g in now_.get("gpus") or [])
        if uuids_then != uuids_now:
            differ.append(f"GPUs {', '.join(uuids_now) or 'none'} now, {', '.join(uuids_then) or 'none'} in the "
                          "evidence")
        for fact in differ:
            verdict.add("live", f"node:{name}/{fact.split()[0]}", "drift", fact)
        if not differ:
            verdict.add("live", f"node:{name}", "ok", f"{now_.get('os')} {now_.get('kernel')}, driver "
                                                      f"{now_.get('driver')}, {len(uuids_now)} GPU(s) as recorded")


def verify(path: Path, keys: Sequence[str], *, bundle: Path | None = None, files: Sequence[Path] = (),
           plan: Plan | None = None, site_path: str | None = None, kubeconfig: Path | None = None,
           timeout: float = 30.0, secrets: Sequence[str] = (), progress: Progress | None = None,
           verdict: Verdict | None = None) -> Verdict:
    """Signature, subjects, and with kubeconfig the live cluster. Returns the verdict (its bad checks make the caller
    raise EvidenceMismatch); raises ConfigError for bad input and EvidenceMismatch for a bad signature."""
    v = verdict or Verdict(str(path))
    if not keys:
        raise ConfigError("evidence verify needs the pinned public key (--key evidence.pub.pem)",
                          hint="give the evidence key's public half, pinned before the evidence came")
    v.live = kubeconfig is not None
    read_signed(path, keys, v)
    check_files(v, bundle=bundle, files=files, plan=plan, site_path=site_path, secrets=secrets)
    if kubeconfig is not None:
        assert plan is not None
        check_live(v, plan, kubeconfig, timeout=timeout, secrets=secrets, progress=progress)
    return v


def fail_if_bad(v: Verdict) -> None:
    bad = v.bad
    if bad:
        raise EvidenceMismatch(f"{v.file}: {len(bad)} mismatch(es): " + "; ".join(
            f"{c['name']}: {c['detail']}" for c in bad[:8]) + (" …" if len(bad) > 8 else ""),
            hint="the evidence does not describe what is given or what runs: find out what changed (the list above), "
                 "then make new evidence after the change is validated")
