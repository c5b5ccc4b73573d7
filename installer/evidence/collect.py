"""What the evidence records, gathered where each fact lives: files on the controller (the bundle lock, the chart, the
rendered values, the site file with credentials redacted, validate reports), the cluster (the images running in the
operator's namespace by the digest the kubelet reports, the Node objects, the helm release) and the GPU nodes (one
read-only SSH session each, through validate's connection code: OS, kernel, nvidia-smi, the toolkit, the records the
roles keep under /var/lib/gpu-install).

Everything read from the cluster or a node is untrusted: sizes are bounded, records are parsed as JSON objects only,
credential-looking keys are redacted.
"""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer.errors import ConfigError
from installer.evidence.model import CHART, IMAGE, LOCK, SITE, VALIDATE, VALUES, Subject, sha256
from installer.safefile import json_value, parse_json

if TYPE_CHECKING:
    from installer.plan import Plan

Progress = Callable[[str], None]
MAX_FILE_BYTES = 256 << 20  # a chart or a lock; a validate report of thousands of nodes stays far below
MAX_RECORD_BYTES = 64 << 10  # one role record on a node
MAX_PROBE_BYTES = 8 << 20
RECORD_DIR = "/var/lib/gpu-install"
MARK = "__gpu_install_evidence__"
PROBE = f"""
M={MARK}
asroot() {{ if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n "$@"; else "$@"; fi; }}
echo "$M os"; cat /etc/os-release 2>/dev/null
echo "$M kernel"; uname -r
echo "$M nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -q -x 2>&1; echo "$M rc $?"
elif [ -x /run/nvidia/driver/usr/bin/nvidia-smi ]; then sudo -n chroot /run/nvidia/driver nvidia-smi -q -x 2>&1; echo "$M rc $?"
else echo "$M rc 127"; fi
echo "$M toolkit"
for b in nvidia-ctk nvidia-container-cli; do command -v $b >/dev/null 2>&1 && $b --version 2>/dev/null | head -n 2; done
for f in {RECORD_DIR}/*.json; do [ -f "$f" ] || continue; echo "$M record ${{f##*/}}"; asroot head -c {MAX_RECORD_BYTES} "$f"; echo; done
echo "$M end"
"""


@dataclass
class Collected:
    """Subjects and the predicate's parts as gathered; model.statement() makes the Statement."""

    subjects: list[Subject] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # subject label -> where it was read (for the Markdown)
    predicate: dict[str, Any] = field(default_factory=dict)


def read_file(path: Path, what: str) -> bytes:
    from installer.signing import read_bounded

    return read_bounded(path, MAX_FILE_BYTES, what, f"give the {what} as a readable regular file")


# ---------------------------------------------------------------- files on the controller


def redacted_site(path: str | os.PathLike[str], secrets: Sequence[str] = ()) -> bytes:
    """The site file as YAML with what sits under a credential key, every given secret string and every URL's
    user:password@ replaced (installer.upgrade.release.redact_value, as upgrade plan shows values): the site
    subject's bytes, recomputable from the same site file by `evidence verify -s`."""
    import yaml

    from installer.upgrade.release import redact_value

    raw = read_file(Path(path), "site file")
    try:
        doc = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: not a YAML site file ({exc})") from None
    clean = redact_value(doc, secrets)
    return yaml.safe_dump(clean, sort_keys=True, default_flow_style=False, allow_unicode=True).encode()


def rendered_values(plan: Plan) -> bytes:
    """The Helm values apply installs (`gpu-install render`'s output)."""
    from installer.render.values import values_to_yaml

    return values_to_yaml(plan.values, plan.site).encode()


def chart_file(plan: Plan, bundle: Path | None, chart: str | None) -> Path | None:
    """The chart archive the release was installed from: --chart, else the site's operator.chart when it is a file,
    else the bundle's charts/ archive of the release; None when there is no archive here (oci://, a directory)."""
    ref = chart or plan.site.operator.chart
    if ref and not str(ref).startswith("oci://") and Path(ref).is_file():
        return Path(ref)
    if bundle is not None:
        found = sorted((bundle / "charts").glob(f"gpu-operator-*{plan.release.version.lstrip('v')}*.tgz"))
        if found:
            return found[0]
    return None


def validate_summary(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A validate report (gpu-install.validate/v1) as a test result: PASSED (all passed), WARNED (warnings, nothing
    failed), FAILED (a check failed or a node was unreachable), with the checks by outcome as node/check[gpu]."""
    if doc.get("schema") != "gpu-install.validate/v1" or not isinstance(doc.get("checks"), list):
        raise ConfigError(f"{name}: not a validate report (schema gpu-install.validate/v1)",
                          hint="give the file `gpu-install validate --json` or apply's validate stage wrote")
    lists: dict[str, list[str]] = {"pass": [], "warn": [], "fail": [], "skip": [], "unreachable": []}
    for c in doc["checks"]:
        if not isinstance(c, dict) or c.get("status") not in lists:
            raise ConfigError(f"{name}: a check without a known status", hint="give an unedited validate report")
        gpu = f"[gpu {c['gpu']}]" if c.get("gpu") is not None else ""
        lists[str(c["status"])].append(f"{c.get('node')}/{c.get('check')}{gpu}")
    failed = lists["fail"] + lists["unreachable"]
    result = "FAILED" if failed else "WARNED" if lists["warn"] else "PASSED"
    return {"name": name, "result": result, "release": doc.get("release"), "layers": doc.get("layers"),
            "started": doc.get("started"), "exitCode": doc.get("exitCode"), "summary": doc.get("summary"),
            "passedChecks": lists["pass"], "warnedChecks": lists["warn"], "failedChecks": failed,
            "skippedChecks": lists["skip"]}


def controller_files(plan: Plan, site_path: str, *, bundle: Path | None, chart: str | None,
                     reports: Sequence[Path], secrets: Sequence[str], out: Collected) -> None:
    """The file subjects and the release part of the predicate."""
    from installer.mirror.bundle import LOCK as LOCK_FILE
    from installer.mirror.bundle import catalog_record

    if bundle is not None:
        lock = bundle / LOCK_FILE
        data = read_file(lock, "bundle lock")
        out.subjects.append(Subject(LOCK, LOCK_FILE, sha256(data)))
        out.files[f"{LOCK}:{LOCK_FILE}"] = str(lock)
    archive = chart_file(plan, bundle, chart)
    if archive is not None:
        out.subjects.append(Subject(CHART, archive.name, sha256(read_file(archive, "chart"))))
        out.files[f"{CHART}:{archive.name}"] = str(archive)
    out.subjects.append(Subject(VALUES, "values.yaml", sha256(rendered_values(plan))))
    out.subjects.append(Subject(SITE, Path(site_path).name, sha256(redacted_site(site_path, secrets))))
    out.files[f"{SITE}:{Path(site_path).name}"] = f"{site_path} (credentials redacted)"
    summaries = []
    for report in reports:
        data = read_file(report, "validate report")
        doc = parse_json(data, f"validate report {report}", hint="give the file `gpu-install validate --json` wrote")
        if not isinstance(doc, dict):
            raise ConfigError(f"{report}: not a validate report", hint="give the file `gpu-install validate --json` "
                                                                      "wrote")
        out.subjects.append(Subject(VALIDATE, report.name, sha256(data)))
        out.files[f"{VALIDATE}:{report.name}"] = str(report)
        summaries.append(validate_summary(doc, report.name))
    site = plan.site
    out.predicate["release"] = {
        "operatorVersion": plan.release.version, "catalog": catalog_record(plan),
        "chart": {"file": archive.name, "sha256": next(s.sha256 for s in out.subjects if s.kind == CHART)}
        if archive is not None else {"ref": str(chart or site.operator.chart or "")},
        "namespace": site.operator.namespace, "releaseName": site.operator.releaseName,
        "registry": site.registry.host, "runtime": site.runtime, "driverMode": site.driver.mode,
        "driverVersion": site.driver.version, "toolkitMode": site.toolkit.mode, "toolkitVersion": site.toolkit.version,
    }
    out.predicate["settings"] = settings(plan, secrets)
    out.predicate["validate"] = summaries


def settings(plan: Plan, secrets: Sequence[str]) -> dict[str, Any]:
    """The site's sharing, device-plugin sharing, MIG and monitoring settings as the site gives them (defaults
    included), credentials redacted."""
    from installer.upgrade.release import redact_value

    site = plan.site
    dump: dict[str, Any] = {
        "sharing": site.sharing.model_dump(mode="json"), "devicePlugin": site.devicePlugin.model_dump(mode="json"),
        "mig": site.mig.model_dump(mode="json"), "monitoring": site.monitoring.model_dump(mode="json"),
        "migLayout": {a.node: a.config for a in plan.mig} if plan.mig else {},
    }
    clean: dict[str, Any] = redact_value(dump, secrets)
    return clean


# ---------------------------------------------------------------- the cluster


@dataclass(frozen=True)
class RunningImage:
    image: str  # as the pod spec names it (what the kubelet reports as .image)
    digest: str  # sha256 hex of imageID
    pods: tuple[str, ...]  # pod/container
    nodes: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"image": self.image, "digest": f"sha256:{self.digest}", "pods": list(self.pods),
                "nodes": list(self.nodes)}


def image_digest(image_id: str) -> str | None:
    """The sha256 hex of a kubelet imageID (docker-pullable://repo@sha256:…, repo@sha256:…, sha256:…)."""
    _, sep, digest = image_id.rpartition("sha256:")
    if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        return None
    return digest


def running_images(core: Any, namespace: str) -> tuple[list[RunningImage], list[str]]:
    """Every image a container runs in namespace, by the digest the kubelet reports, and the containers that run
    without one (named: a digest the kubelet does not report cannot be attested)."""
    from installer.kube import _call

    pods = _call(f"list pods in namespace {namespace}", lambda: core.list_namespaced_pod(namespace)).items
    by: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    missing: list[str] = []
    for pod in pods:
        if (pod.status.phase or "") not in ("Running", "Pending"):
            continue
        for cs in pod.status.container_statuses or []:
            if cs.state is None or cs.state.running is None:
                continue
            where = f"{pod.metadata.name}/{cs.name}"
            # the image as the pod names it: the kubelet's .image is the runtime's name for that digest, which is
            # another tag when several share the digest (an image pushed under two names reads as the first one)
            image = next((c.image for c in pod.spec.containers or [] if c.name == cs.name), None) or cs.image
            digest = image_digest(cs.image_id or "")
            if digest is None:
                missing.append(f"{where} ({image}: imageID {cs.image_id or 'empty'!s})")
                continue
            pods_, nodes_ = by.setdefault((image, digest), (set(), set()))
            pods_.add(where)
            nodes_.add(pod.spec.node_name or "")
    return [RunningImage(img, d, tuple(sorted(p)), tuple(sorted(n))) for (img, d), (p, n) in sorted(by.items())], missing


def node_objects(core: Any, names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """What the Kubernetes Node objects say of the GPU nodes: node info, GPU labels, allocatable GPUs."""
    from kubernetes.client.exceptions import ApiException

    from installer.kube import _call

    out: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            n = _call(f"read node {name}", partial(core.read_node, name))
        except ApiException as exc:
            if exc.status == 404:
                out[name] = {"present": False}
                continue
            raise
        info = n.status.node_info
        labels = n.metadata.labels or {}
        out[name] = {
            "present": True, "osImage": info.os_image, "kernelVersion": info.kernel_version,
            "containerRuntime": info.container_runtime_version, "kubelet": info.kubelet_version,
            "architecture": info.architecture,
            "labels": {k: v for k, v in sorted(labels.items()) if k.startswith("nvidia.com/")},
            "allocatable": {k: v for k, v in sorted((n.status.allocatable or {}).items()) if "/" in k},
        }
    return out


def helm_release(plan: Plan, kubeconfig: Path) -> dict[str, Any] | None:
    from installer import helm

    st = helm.release_state(plan.site.operator.releaseName, plan.site.operator.namespace, kubeconfig)
    if st is None:
        return None
    return {"name": st.name, "namespace": st.namespace, "revision": st.revision, "status": st.status,
            "chart": st.chart}


def cluster(plan: Plan, kubeconfig: Path, out: Collected) -> dict[str, dict[str, Any]]:
    """The running images as subjects, the helm release and the Node objects into the predicate; returns the Node
    objects by name (for the per-node part)."""
    from kubernetes import client as k

    from installer import kube

    core = k.CoreV1Api(kube.api_client(kubeconfig))
    ns = plan.site.operator.namespace
    images, missing = running_images(core, ns)
    for img in images:
        out.subjects.append(Subject(IMAGE, img.image, img.digest))
    out.predicate["images"] = {"namespace": ns, "running": [i.as_dict() for i in images], "withoutDigest": missing}
    out.predicate["helm"] = helm_release(plan, kubeconfig)
    return node_objects(core, [n.node_name for n in plan.nodes])


# ---------------------------------------------------------------- the GPU nodes


def _sections(text: str) -> tuple[dict[str, str], int | None, dict[str, str]]:
    sections: dict[str, list[str]] = {}
    records: dict[str, list[str]] = {}
    current: list[str] | None = None
    rc = None
    for line in text.splitlines():
        if line.startswith(MARK + " "):
            word = line[len(MARK) + 1:].split(maxsplit=1)
            if word[0] == "rc" and len(word) > 1 and word[1].strip().isdigit():
                rc = int(word[1])
            elif word[0] == "record" and len(word) > 1:
                current = records.setdefault(word[1].strip(), [])
            else:
                current = sections.setdefault(word[0], [])
            continue
        if current is not None:
            current.append(line)
    if "end" not in sections:
        raise ValueError("the node's answer is incomplete (the session ended early)")
    return ({k: "\n".join(v) for k, v in sections.items()}, rc, {k: "\n".join(v) for k, v in records.items()})


def _os_release(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("ID", "VERSION_ID", "PRETTY_NAME"):
            try:
                out[key] = " ".join(shlex.split(value))
            except ValueError:
                out[key] = value
    return out


def node_facts(text: str, secrets: Sequence[str] = ()) -> dict[str, Any]:
    """One node's answer to PROBE: OS, kernel, driver and CUDA, GPUs by UUID and model with their MIG state, the
    toolkit's version lines, the roles' records (JSON objects, credentials redacted)."""
    from installer.upgrade.release import redact_value
    from installer.validate.nvsmi import NvidiaSmi, NvidiaSmiError, parse_output

    sections, rc, records = _sections(text)
    osr = _os_release(sections.get("os", ""))
    facts: dict[str, Any] = {
        "os": f"{osr.get('ID', '?')}{osr.get('VERSION_ID', '')}", "osName": osr.get("PRETTY_NAME"),
        "kernel": sections.get("kernel", "").strip() or None, "driver": None, "cuda": None, "gpus": [],
        "toolkit": [line.strip() for line in sections.get("toolkit", "").splitlines() if line.strip()][:4],
    }
    if rc == 127 or rc is None:
        facts["nvidiaSmi"] = "not found"
    else:
        try:
            smi = parse_output(sections.get("nvidia-smi", ""), rc)
        except NvidiaSmiError as exc:
            smi = None
            facts["nvidiaSmi"] = exc.message
        if isinstance(smi, NvidiaSmi):
            facts.update(driver=smi.driver_version, cuda=smi.cuda_version)
            facts["gpus"] = [{
                "uuid": g.uuid, "model": g.product_name, "pciBusId": g.pci_bus_id,
                "mig": {"current": g.mig_current, "pending": g.mig_pending,
                        "devices": [{"profile": d.profile, "uuid": d.uuid, "gpuInstance": d.gpu_instance_id}
                                    for d in g.mig_devices]},
            } for g in smi.gpus]
        elif smi is not None:
            facts["nvidiaSmi"] = "the driver is not loaded"
    installed: dict[str, Any] = {}
    for name, body in sorted(records.items()):
        try:
            doc = json_value(body)
        except ValueError:
            installed[name] = "(not JSON)"
            continue
        installed[name] = redact_value(doc, secrets) if isinstance(doc, dict) else "(not a JSON object)"
    facts["records"] = installed
    return facts


def probe_node(target: Any, timeout: float) -> str:
    """PROBE over SSH (validate's connection: the inventory's user, key, jump host, known_hosts checking)."""
    from installer.validate.probe import connect

    client = connect(target, timeout)
    try:
        _, stdout, _ = client.exec_command(f"sh -c {shlex.quote(PROBE)}", timeout=timeout)
        data = stdout.read(MAX_PROBE_BYTES)
        stdout.channel.recv_exit_status()
    finally:
        client.close()
    return bytes(data).decode("utf-8", "replace")


def nodes(plan: Plan, objects: Mapping[str, Mapping[str, Any]], *, timeout: float, secrets: Sequence[str],
          progress: Progress | None = None) -> list[dict[str, Any]]:
    """Per GPU node: the inventory host, the Node object's facts and what the node itself says (all nodes at once);
    a node that cannot be reached is recorded as such, with the reason (never left out)."""
    import paramiko

    from installer.validate import node_targets

    targets = node_targets(plan)

    def one(t: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": t.node, "host": t.host, "kubernetes": dict(objects.get(t.node) or {})}
        try:
            entry.update(node_facts(probe_node(t, timeout), secrets))
            entry["reached"] = True
        except (paramiko.SSHException, OSError, ValueError) as exc:
            entry.update(reached=False, error=f"{type(exc).__name__}: {exc}"[:300])
        except Exception as exc:  # noqa: BLE001 - HostKeyRefused and the like: recorded, the others go on
            entry.update(reached=False, error=str(getattr(exc, "message", exc))[:300])
        mig = next((a.config for a in plan.mig if a.node == t.node or a.node == t.host), None)
        entry["migConfig"] = mig
        if progress:
            progress(f"evidence: node {t.node}: " + (f"{entry.get('os')} {entry.get('kernel')}, driver "
                                                     f"{entry.get('driver')}, {len(entry.get('gpus') or [])} GPU(s)"
                                                     if entry["reached"] else f"not reached ({entry['error']})"))
        return entry

    with ThreadPoolExecutor(max_workers=min(32, max(1, len(targets)))) as pool:
        return list(pool.map(one, targets))


def who() -> dict[str, Any]:
    """Who made the evidence: the user and machine, the time (UTC)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    from installer import __version__

    return {"user": user, "host": socket.gethostname(), "tool": f"gpu-install {__version__}",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
