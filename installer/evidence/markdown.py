"""The evidence for people: the same facts as the signed statement, as Markdown for a change ticket (evidence.md
beside evidence.json). It is a rendering, not the evidence: only the signed file is verified."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from installer.evidence.model import Subject


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return out + [""]


def render(subjects: Sequence[Subject], predicate: Mapping[str, Any], *, fingerprint: str,
           files: Mapping[str, str] | None = None) -> str:
    rel = predicate.get("release") or {}
    made = predicate.get("createdBy") or {}
    helm = predicate.get("helm") or {}
    lines = [f"# Install evidence: GPU Operator {rel.get('operatorVersion')}", ""]
    lines += _table(["", ""], [
        ("ticket", predicate.get("ticket") or "—"),
        ("made", f"{made.get('time')} by {made.get('user')} on {made.get('host')} ({made.get('tool')})"),
        ("signed by", f"evidence key {fingerprint} (ECDSA P-256)"),
        ("release", f"{rel.get('releaseName')} in namespace {rel.get('namespace')}, helm revision "
                    f"{helm.get('revision')} ({helm.get('status')}, chart {helm.get('chart')})" if helm else
         f"{rel.get('releaseName')} in namespace {rel.get('namespace')}: no helm release found"),
        ("catalog", f"{(rel.get('catalog') or {}).get('file')} sha256 {(rel.get('catalog') or {}).get('sha256')}"),
        ("registry", rel.get("registry")),
        ("driver", f"{rel.get('driverMode')} {rel.get('driverVersion') or ''}"),
        ("toolkit", f"{rel.get('toolkitMode')} {rel.get('toolkitVersion') or ''}"),
        ("runtime", rel.get("runtime")),
    ])
    lines += ["## Subjects (sha256)", ""]
    lines += _table(["subject", "sha256", "read from"],
                    [(s.label, s.sha256, (files or {}).get(s.label, "")) for s in subjects])
    lines += ["## Nodes", ""]
    rows = []
    for n in predicate.get("nodes") or []:
        gpus = "; ".join(f"{g.get('model')} {g.get('uuid')}" + (" MIG" if (g.get("mig") or {}).get("current") else "")
                         for g in n.get("gpus") or [])
        k8s = n.get("kubernetes") or {}
        rows.append((n.get("name"), n.get("os") if n.get("reached") else f"not reached: {n.get('error')}",
                     n.get("kernel"), n.get("driver"), k8s.get("containerRuntime"), gpus or "—",
                     n.get("migConfig") or "—", ", ".join(sorted(n.get("records") or {})) or "—"))
    lines += _table(["node", "OS", "kernel", "driver", "runtime", "GPUs (model, UUID)", "MIG config",
                     "gpu-install records"], rows)
    images = predicate.get("images") or {}
    lines += [f"## Images running in namespace {images.get('namespace')}", ""]
    lines += _table(["image", "digest", "pods"],
                    [(i.get("image"), i.get("digest"), ", ".join(i.get("pods") or [])) for i in images.get("running") or []])
    if images.get("withoutDigest"):
        lines += ["Containers without a digest reported by the kubelet: " + "; ".join(images["withoutDigest"]), ""]
    lines += ["## Validate", ""]
    for v in predicate.get("validate") or []:
        lines += [f"**{v.get('name')}**: {v.get('result')} (release {v.get('release')}, {v.get('started')}; "
                  f"{len(v.get('passedChecks') or [])} passed, {len(v.get('warnedChecks') or [])} warned, "
                  f"{len(v.get('failedChecks') or [])} failed)", ""]
        for word, key in (("failed", "failedChecks"), ("warned", "warnedChecks")):
            if v.get(key):
                lines += [f"- {word}: " + ", ".join(v[key]), ""]
    if not predicate.get("validate"):
        lines += ["No validate report was given.", ""]
    st = predicate.get("settings") or {}
    lines += ["## Sharing, MIG and monitoring", ""]
    lines += _table(["setting", "value"], [(k, v) for k, v in st.items()])
    lines += ["Verify: `gpu-install evidence verify evidence.json --key evidence.pub.pem` (a key pinned before, "
              "compared by its fingerprint)."]
    return "\n".join(lines) + "\n"
