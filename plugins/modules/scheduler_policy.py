#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Render and write kube-scheduler's extender configuration (legacy Policy or KubeSchedulerConfiguration)."""

DOCUMENTATION = r"""
module: scheduler_policy
short_description: Write the scheduler extender file that the kube-scheduler static pod will read
description:
  - Reads the kube-scheduler static-pod manifest to learn the Kubernetes version (image tag, unless
    C(kubernetes_version) is given) and the flags a KubeSchedulerConfiguration must carry over
    (--kubeconfig, --leader-elect, --port/--address), picks the format (auto - legacy Policy below 1.23,
    KubeSchedulerConfiguration from 1.23 - or the forced one) and the apiVersion for the minor.
  - Writes the file atomically when its content differs; the previous content is copied into
    C(backup_dir) first. C(state=restore) puts a backup back (or removes the file when there was none)
    and keeps the rejected content next to the backups. C(state=absent) removes our files.
  - Returns what the manifest patch needs (flags, host path, mount path, sha256 of the content).
  - Supports check mode and diff.
options:
  manifest: {type: path, description: kube-scheduler static-pod manifest (needed for state=present)}
  config_dir: {type: path, required: true, description: host directory for the file (hostPath of the mount)}
  mount_dir: {type: str, default: /etc/kubernetes, description: directory of the file inside the container}
  backup_dir: {type: path, required: true, description: where previous contents are kept (never the manifests dir)}
  extenders: {type: list, elements: dict, default: [], description: extenders (site scheduler.extenders shape)}
  format: {type: str, default: auto, choices: [auto, policy, config], description: file format}
  kubernetes_version: {type: str, default: '', description: overrides the version read from the image tag}
  insecure_bind_address: {type: str, default: '127.0.0.1:10251', description: "healthz/metrics bind address put in a v1beta1/v1beta2 config when the manifest has --port=0 (those versions cannot turn insecure serving off through --config)"}
  state: {type: str, default: present, choices: [present, absent, restore], description: what to do}
  backup_file: {type: str, default: '', description: "state=restore: backup to put back; empty: the file did not exist before"}
  path: {type: path, description: "state=restore: the file to restore"}
  keep: {type: str, default: '', description: "state=absent: leave this one of our files (the one in use)"}
author: gpu-install
"""

RETURN = r"""
path: {description: host path of the file, returned: present, type: str}
mount_path: {description: path of the file inside the container, returned: present, type: str}
flags: {description: kube-scheduler flags that make it read the file, returned: present, type: list}
sha256: {description: sha256 of the content, returned: present, type: str}
format: {description: policy or config, returned: present, type: str}
api_version: {description: apiVersion written, returned: present, type: str}
kubernetes_version: {description: the version the choice was made for, returned: present, type: str}
backup_file: {description: copy of the previous content (empty when there was none), returned: present, type: str}
rejected_file: {description: copy of the rejected content, returned: restore, type: str}
"""

import datetime
import hashlib
import json
import os
import re
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_install.node.plugins.module_utils.files import atomic_write, redact_diff
from ansible_collections.gpu_install.node.plugins.module_utils.kube_flags import flag_value

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any  # noqa: F401

POLICY_FILE = "gpu-install-scheduler-policy.json"
CONFIG_FILE = "gpu-install-scheduler-config.yaml"
OUR_FILES = (POLICY_FILE, CONFIG_FILE)
OUR_FLAGS_ANNOTATION = "gpu-install.io/scheduler-flags"  # written by gpu_install.node.scheduler_manifest
FOREIGN_FLAGS = ("--config", "--policy-config-file", "--policy-configmap", "--use-legacy-policy-config")
LEGACY_POLICY_REMOVED = (1, 23)  # --policy-config-file and the Policy API are gone from 1.23
CONFIG_EXTENDERS_FROM = (1, 19)  # first KubeSchedulerConfiguration (v1beta1) with extenders:
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h))+\Z")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_NS = {"ns": 1, "us": 1000, "µs": 1000, "ms": 10 ** 6, "s": 10 ** 9, "m": 60 * 10 ** 9, "h": 3600 * 10 ** 9}


class PolicyError(Exception):
    pass


# ---------------------------------------------------------------- versions and formats (pure)
def parse_version(text):
    # type: (object) -> tuple[int, int]
    """'v1.20.2' / '1.20' / 'v1.25.0-rc.1' -> (1, 20)."""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?$", str(text or "").strip())
    if not m:
        raise PolicyError("%r is not a Kubernetes version such as v1.20.2" % (text,))
    return int(m.group(1)), int(m.group(2))


def choose_format(fmt, minor):
    # type: (str, tuple[int, int]) -> str
    if fmt == "auto":
        return "policy" if minor < LEGACY_POLICY_REMOVED else "config"
    if fmt == "policy" and minor >= LEGACY_POLICY_REMOVED:
        raise PolicyError("format policy: Kubernetes %d.%d has no legacy scheduler Policy (removed in 1.23); "
                          "use format config or auto" % minor)
    if fmt == "config" and minor < CONFIG_EXTENDERS_FROM:
        raise PolicyError("format config: KubeSchedulerConfiguration with extenders needs Kubernetes 1.19+ "
                          "(this is %d.%d); use format policy or auto" % minor)
    if fmt not in ("policy", "config"):
        raise PolicyError("format %r: use auto, policy or config" % (fmt,))
    return fmt


def config_api_version(minor):
    # type: (tuple[int, int]) -> str
    """The KubeSchedulerConfiguration apiVersion to write for a minor: v1beta1 1.19-1.21 (removed in 1.23),
    v1beta2 1.22 (removed in 1.28), v1beta3 1.23-1.24 (removed in 1.29), v1 from 1.25."""
    if minor < (1, 19):
        raise PolicyError("Kubernetes %d.%d: no KubeSchedulerConfiguration with extenders" % minor)
    if minor <= (1, 21):
        v = "v1beta1"
    elif minor == (1, 22):
        v = "v1beta2"
    elif minor <= (1, 24):
        v = "v1beta3"
    else:
        v = "v1"
    return "kubescheduler.config.k8s.io/" + v


def duration_ns(text):
    # type: (str | int) -> int
    """Go duration ('30s', '1m30s', '500ms') -> nanoseconds (the legacy Policy's httpTimeout is a time.Duration)."""
    if isinstance(text, int):
        return text
    s = str(text).strip()
    if not _DURATION.match(s):
        raise PolicyError("httpTimeout %r is not a duration such as 30s or 500ms" % (text,))
    return int(round(sum(float(n) * _UNIT_NS[u] for n, u in _DURATION_PART.findall(s))))


def extender_doc(ext, fmt):
    # type: (dict[str, Any], str) -> dict[str, Any]
    """One extender in the file's spelling. The legacy Policy's JSON tag is enableHttps and its httpTimeout an
    integer of nanoseconds; KubeSchedulerConfiguration (decoded strictly) wants enableHTTPS and a duration string."""
    if not ext.get("urlPrefix"):
        raise PolicyError("every extender needs a urlPrefix")
    out = {"urlPrefix": ext["urlPrefix"]}
    for key in ("filterVerb", "preemptVerb", "prioritizeVerb", "bindVerb"):
        if ext.get(key):
            out[key] = ext[key]
    if ext.get("weight") is not None:
        out["weight"] = int(ext["weight"])
    https = bool(ext.get("enableHTTPS", ext.get("enableHttps", False)))
    if https:
        out["enableHttps" if fmt == "policy" else "enableHTTPS"] = True
    if ext.get("tlsConfig"):
        out["tlsConfig"] = ext["tlsConfig"]
    if ext.get("httpTimeout") not in (None, ""):
        ns = duration_ns(ext["httpTimeout"])
        out["httpTimeout"] = ns if fmt == "policy" else ("%dms" % (ns // 10 ** 6) if ns % 10 ** 9 else "%ds" % (ns // 10 ** 9))
    if ext.get("nodeCacheCapable"):
        out["nodeCacheCapable"] = True
    if ext.get("managedResources"):
        out["managedResources"] = [{"name": r["name"], "ignoredByScheduler": bool(r.get("ignoredByScheduler", False))}
                                   for r in ext["managedResources"]]
    if ext.get("ignorable"):
        out["ignorable"] = True
    return out




def render(extenders, fmt, api_version, command, insecure_bind_address="127.0.0.1:10251"):
    # type: (list[dict[str, Any]], str, str, list[str], str) -> str
    """The file content for the extenders. command: the scheduler's current command+args (for --config:
    kubeconfig, leader election and insecure serving, which 1.20 ignores as flags once --config is given)."""
    docs = [extender_doc(e, fmt) for e in extenders]
    if fmt == "policy":
        return json.dumps({"kind": "Policy", "apiVersion": "v1", "extenders": docs}, indent=2) + "\n"
    doc = {"apiVersion": api_version, "kind": "KubeSchedulerConfiguration"}  # type: dict[str, Any]
    kubeconfig = flag_value(command, "kubeconfig", None)
    if kubeconfig:
        doc["clientConnection"] = {"kubeconfig": kubeconfig}
    leader = str(flag_value(command, "leader-elect", "true")).lower() not in ("false", "0")
    doc["leaderElection"] = {"leaderElect": leader}
    version = api_version.rsplit("/", 1)[-1]
    if version in ("v1beta1", "v1beta2"):  # these still have the insecure healthz/metrics addresses
        port = flag_value(command, "port", None)
        if port is not None and port != "0":
            addr = "%s:%s" % (flag_value(command, "address", "0.0.0.0"), port)
        else:
            addr = insecure_bind_address
        if port is not None:
            doc["healthzBindAddress"] = addr
            doc["metricsBindAddress"] = addr
    doc["extenders"] = docs
    import yaml

    return ("# written by gpu-install (scheduler_policy role); removed by `gpu-install uninstall`\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))


def manifest_command(doc):
    # type: (dict[str, Any] | None) -> list[str]
    c = (((doc or {}).get("spec") or {}).get("containers") or [{}])[0]
    return [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]


def manifest_version(doc):
    # type: (dict[str, Any] | None) -> str
    c = (((doc or {}).get("spec") or {}).get("containers") or [{}])[0]
    image = str(c.get("image") or "")
    last = image.rsplit("/", 1)[-1].split("@", 1)[0]
    return last.split(":", 1)[1] if ":" in last else ""


def plan(manifest_doc, extenders, fmt="auto", kubernetes_version="", config_dir="/etc/kubernetes",
         mount_dir="/etc/kubernetes", insecure_bind_address="127.0.0.1:10251"):
    # type: (dict[str, Any] | None, list[dict[str, Any]], str, str, str, str, str) -> dict[str, Any]
    """Everything the role needs from the manifest + site: the file, its content and the flags."""
    version = kubernetes_version or manifest_version(manifest_doc)
    if not version:
        raise PolicyError("cannot tell the Kubernetes version: the kube-scheduler image has no tag; "
                          "set scheduler.kubernetesVersion in the site file")
    minor = parse_version(version)
    chosen = choose_format(fmt, minor)
    api_version = "v1" if chosen == "policy" else config_api_version(minor)
    name = POLICY_FILE if chosen == "policy" else CONFIG_FILE
    mount_path = mount_dir.rstrip("/") + "/" + name
    command = manifest_command(manifest_doc)
    if chosen == "policy":
        flags = ["--policy-config-file=" + mount_path, "--use-legacy-policy-config=true"]
    else:
        flags = ["--config=" + mount_path]
    ann = ((manifest_doc or {}).get("metadata") or {}).get("annotations") or {}
    ours = set(flags) | set(json.loads(ann.get(OUR_FLAGS_ANNOTATION) or "[]"))  # an earlier apply's are ours too
    foreign = [a for a in command if a not in ours and any(a == f or a.startswith(f + "=") for f in FOREIGN_FLAGS)]
    if foreign:
        raise PolicyError("kube-scheduler already has %s (not gpu-install's); gpu-install would replace that "
                          "configuration: add the extenders to it yourself, or remove the flag first"
                          % ", ".join(foreign))
    content = render(extenders, chosen, api_version, command, insecure_bind_address)
    return {"path": os.path.join(config_dir, name), "mount_path": mount_path, "flags": flags, "format": chosen,
            "api_version": api_version, "kubernetes_version": version, "content": content,
            "sha256": hashlib.sha256(content.encode()).hexdigest()}


# ---------------------------------------------------------------- files
def _stamp():
    # type: () -> str
    return datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")


def _read_manifest(module, path):
    # type: (AnsibleModule, str) -> dict[str, Any]
    try:
        import yaml
    except ImportError:
        module.fail_json(msg="PyYAML is needed on %s to read the kube-scheduler manifest (install python3-yaml)"
                         % path)
    try:
        with open(path) as fh:
            doc = yaml.safe_load(fh)
    except (OSError, IOError) as exc:
        module.fail_json(msg="cannot read the kube-scheduler manifest %s: %s (is this a control-plane host with "
                             "static pods? set scheduler_policy_manifest)" % (path, exc))
    except yaml.YAMLError as exc:
        module.fail_json(msg="%s is not valid YAML: %s; left untouched" % (path, exc))
    if not isinstance(doc, dict) or doc.get("kind") != "Pod":
        module.fail_json(msg="%s is not a Pod manifest; left untouched" % path)
    return doc


def main():
    # type: () -> None
    module = AnsibleModule(
        argument_spec=dict(
            manifest=dict(type="path"),
            config_dir=dict(type="path", required=True),
            mount_dir=dict(type="str", default="/etc/kubernetes"),
            backup_dir=dict(type="path", required=True),
            extenders=dict(type="list", elements="dict", default=[]),
            format=dict(type="str", default="auto", choices=["auto", "policy", "config"]),
            kubernetes_version=dict(type="str", default=""),
            insecure_bind_address=dict(type="str", default="127.0.0.1:10251"),
            state=dict(type="str", default="present", choices=["present", "absent", "restore"]),
            backup_file=dict(type="str", default=""),
            path=dict(type="path"),
            keep=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    manifests_dir = os.path.dirname(os.path.abspath(p["manifest"])) if p["manifest"] else None
    if manifests_dir and (os.path.abspath(p["backup_dir"]).rstrip("/") == manifests_dir
                          or os.path.abspath(p["config_dir"]) == manifests_dir):
        module.fail_json(msg="backup_dir/config_dir must not be the manifests directory %s: the kubelet runs every "
                             "file there as a static pod" % manifests_dir)
    if p["state"] == "absent":
        removed = [os.path.join(p["config_dir"], n) for n in OUR_FILES
                   if os.path.exists(os.path.join(p["config_dir"], n)) and os.path.join(p["config_dir"], n) != p["keep"]]
        if removed and not module.check_mode:
            if not os.path.isdir(p["backup_dir"]):
                os.makedirs(p["backup_dir"], 0o700)
            for f in removed:
                shutil.copy2(f, os.path.join(p["backup_dir"], "%s.%s.removed" % (os.path.basename(f), _stamp())))
                os.unlink(f)
        module.exit_json(changed=bool(removed), removed=removed)
    if p["state"] == "restore":
        path = p["path"]
        if not path:
            module.fail_json(msg="state=restore needs path")
        rejected = ""
        changed = False
        if not module.check_mode:
            if not os.path.isdir(p["backup_dir"]):
                os.makedirs(p["backup_dir"], 0o700)
            if os.path.exists(path):
                rejected = os.path.join(p["backup_dir"], "%s.%s.rejected" % (os.path.basename(path), _stamp()))
                shutil.copy2(path, rejected)
            if p["backup_file"]:
                shutil.copy2(p["backup_file"], path)
                changed = True
            elif os.path.exists(path):
                os.unlink(path)
                changed = True
        module.exit_json(changed=changed, path=path, rejected_file=rejected)

    if not p["manifest"]:
        module.fail_json(msg="state=present needs manifest")
    doc = _read_manifest(module, p["manifest"])
    try:
        result = plan(doc, p["extenders"], p["format"], p["kubernetes_version"], p["config_dir"], p["mount_dir"],
                      p["insecure_bind_address"])
    except PolicyError as exc:
        module.fail_json(msg="scheduler policy: %s" % exc)
    path = result["path"]
    before = None
    if os.path.exists(path):
        with open(path) as fh:
            before = fh.read()
    changed = before != result["content"]
    result.update(changed=changed, backup_file="")
    if module._diff:
        result["diff"] = redact_diff(dict(before=before or "", after=result["content"], before_header=path,
                                          after_header=path))
    if changed and not module.check_mode:
        if not os.path.isdir(p["config_dir"]):
            os.makedirs(p["config_dir"], 0o755)
        if before is not None:
            if not os.path.isdir(p["backup_dir"]):
                os.makedirs(p["backup_dir"], 0o700)
            result["backup_file"] = os.path.join(p["backup_dir"], "%s.%s" % (os.path.basename(path), _stamp()))
            shutil.copy2(path, result["backup_file"])
        atomic_write(path, result["content"], mode=0o600)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
