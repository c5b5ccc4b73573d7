#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Patch gpu-install's scheduler flags, policy mount and dnsPolicy into the kube-scheduler static-pod manifest
(and take them out again)."""

DOCUMENTATION = r"""
module: scheduler_manifest
short_description: Add or remove gpu-install's scheduler extender file in the kube-scheduler static pod
description:
  - C(state=present) adds the flags (e.g. --policy-config-file + --use-legacy-policy-config, or --config), a
    read-only hostPath File volume + volumeMount for the file, dnsPolicy ClusterFirstWithHostNet (the original
    value remembered in an annotation) and an annotation with the file's sha256 (a new policy restarts the pod).
    Everything added is recorded in annotations, so C(state=absent) takes exactly that out again.
  - The manifest is copied into C(backup_dir) (never the manifests directory - the kubelet runs every file
    there) before it changes; the first copy of an unpatched manifest is kept as the pristine original, and
    C(state=absent) writes those very bytes back when nothing else changed since.
  - C(state=restore) puts C(backup_file) back byte for byte.
  - A manifest that already has its own --config / --policy-config-file / --policy-configmap fails untouched.
  - Writes are atomic (temp file in the same directory + rename), only when the document changes.
    Supports check mode and diff.
options:
  path: {type: path, required: true, description: the manifest}
  state: {type: str, default: present, choices: [present, absent, restore], description: what to do}
  flags: {type: list, elements: str, default: [], description: flags to add (present)}
  host_path: {type: str, default: '', description: host file to mount (present)}
  mount_path: {type: str, default: '', description: where the container sees it (present)}
  sha256: {type: str, default: '', description: sha256 of the file content (present)}
  dns_policy: {type: str, default: ClusterFirstWithHostNet, description: "dnsPolicy to set (empty: leave it)"}
  backup_dir: {type: path, required: true, description: where copies of the manifest go}
  backup_file: {type: str, default: '', description: state=restore - the copy to put back}
author: gpu-install
"""

RETURN = r"""
backup_file: {description: copy of the manifest before this change (empty when unchanged), returned: always, type: str}
command: {description: the kube-scheduler command + args after the change, returned: always, type: list}
bind_address: {description: --bind-address of that command (default 0.0.0.0), returned: always, type: str}
secure_port: {description: --secure-port of that command (default 10259), returned: always, type: int}
changed_at: {description: epoch seconds just before the write, returned: changed, type: float}
"""

import copy
import datetime
import json
import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_install.node.plugins.module_utils.files import atomic_write, redact_diff
from ansible_collections.gpu_install.node.plugins.module_utils.kube_flags import flag_value

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any  # noqa: F401

PREFIX = "gpu-install.io/"
ANN_FLAGS = PREFIX + "scheduler-flags"
ANN_DNS = PREFIX + "scheduler-dns-policy-original"
ANN_SHA = PREFIX + "scheduler-policy-sha256"
ANN_VOLUME = PREFIX + "scheduler-volume"
VOLUME = "gpu-install-scheduler-policy"
UNSET = "<unset>"
FOREIGN_FLAGS = ("--config", "--policy-config-file", "--policy-configmap", "--use-legacy-policy-config")
PRISTINE_SUFFIX = ".gpu-install-original"


class ManifestError(Exception):
    pass


def _container(doc):
    # type: (dict[str, Any]) -> dict[str, Any]
    containers = ((doc.get("spec") or {}).get("containers") or [])  # type: list[dict[str, Any]]
    if not containers:
        raise ManifestError("spec.containers is empty")
    for c in containers:
        if c.get("name") == "kube-scheduler":
            return c
    return containers[0]


def _arg_list(c):
    # type: (dict[str, Any]) -> list[str]
    """The list our flags go into: args when the manifest uses args, else command (kubeadm: everything there)."""
    if c.get("args"):
        args = c["args"]  # type: list[str]
        return args
    command = c.setdefault("command", [])  # type: list[str]
    return command


def is_patched(doc):
    # type: (dict[str, Any]) -> bool
    return ANN_FLAGS in ((doc.get("metadata") or {}).get("annotations") or {})


def unpatch(doc):
    # type: (dict[str, Any]) -> dict[str, Any]
    """A copy of doc without anything patch() added (doc itself is not modified)."""
    out = copy.deepcopy(doc)
    meta = out.get("metadata") or {}
    ann = meta.get("annotations") or {}
    if ANN_FLAGS not in ann:
        return out
    flags = json.loads(ann.get(ANN_FLAGS) or "[]")
    volume = ann.get(ANN_VOLUME) or VOLUME
    c = _container(out)
    for key in ("command", "args"):
        if key in c:
            for flag in flags:
                if flag in c[key]:
                    c[key].remove(flag)
    c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m.get("name") != volume]
    if not c["volumeMounts"]:
        del c["volumeMounts"]
    spec = out["spec"]
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != volume]
    if not spec["volumes"]:
        del spec["volumes"]
    if ANN_DNS in ann:
        original = ann[ANN_DNS]
        if original == UNSET:
            spec.pop("dnsPolicy", None)
        else:
            spec["dnsPolicy"] = original
    for key in (ANN_FLAGS, ANN_DNS, ANN_SHA, ANN_VOLUME):
        ann.pop(key, None)
    if not ann:
        meta.pop("annotations", None)
    return out


def patch(doc, flags, host_path, mount_path, sha256, dns_policy="ClusterFirstWithHostNet"):
    # type: (dict[str, Any], list[str], str, str, str, str) -> dict[str, Any]
    """A copy of doc with our flags, volume, mount, dnsPolicy and annotations (any earlier patch replaced)."""
    out = unpatch(doc)
    c = _container(out)
    own = [a for a in (c.get("command") or []) + (c.get("args") or [])
           if any(a == f or a.startswith(f + "=") for f in FOREIGN_FLAGS)]
    if own:
        raise ManifestError("kube-scheduler already has %s (not gpu-install's); gpu-install would replace that "
                            "configuration: add the extenders to it yourself, or remove the flag first"
                            % ", ".join(own))
    _arg_list(c).extend(flags)
    c.setdefault("volumeMounts", []).append({"name": VOLUME, "mountPath": mount_path, "readOnly": True})
    spec = out["spec"]
    spec.setdefault("volumes", []).append({"name": VOLUME, "hostPath": {"path": host_path, "type": "File"}})
    meta = out.setdefault("metadata", {})
    ann = meta.get("annotations")
    if ann is None:
        ann = meta["annotations"] = {}
    ann[ANN_FLAGS] = json.dumps(list(flags))
    ann[ANN_VOLUME] = VOLUME
    ann[ANN_SHA] = sha256
    if dns_policy:
        ann[ANN_DNS] = spec.get("dnsPolicy", UNSET)
        spec["dnsPolicy"] = dns_policy
    return out


def command_of(doc):
    # type: (dict[str, Any]) -> list[str]
    c = _container(doc)
    return [str(a) for a in (c.get("command") or []) + (c.get("args") or [])]




def serving(command):
    # type: (list[str]) -> tuple[str, int]
    """(bind address, secure port) kube-scheduler serves /healthz on (defaults 0.0.0.0 and 10259)."""
    return flag_value(command, "bind-address", "0.0.0.0"), int(flag_value(command, "secure-port", "10259"))


def dump(doc):
    # type: (dict[str, Any]) -> str
    import yaml

    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def load(text):
    # type: (str) -> dict[str, Any]
    import yaml

    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or doc.get("kind") != "Pod":
        raise ManifestError("not a Pod manifest")
    return doc


def _stamp():
    # type: () -> str
    return datetime.datetime.now().strftime("%Y%m%dT%H%M%S.%f")


def main():
    # type: () -> None
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "absent", "restore"]),
            flags=dict(type="list", elements="str", default=[]),
            host_path=dict(type="str", default=""),
            mount_path=dict(type="str", default=""),
            sha256=dict(type="str", default=""),
            dns_policy=dict(type="str", default="ClusterFirstWithHostNet"),
            backup_dir=dict(type="path", required=True),
            backup_file=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path, backup_dir = p["path"], p["backup_dir"]
    manifests_dir = os.path.dirname(os.path.abspath(path))
    if os.path.abspath(backup_dir).rstrip("/") == manifests_dir or \
            os.path.abspath(backup_dir).startswith(manifests_dir + "/"):
        module.fail_json(msg="backup_dir %s is inside the manifests directory %s: the kubelet would run the "
                             "backup as a second kube-scheduler; choose a directory elsewhere" % (backup_dir, manifests_dir))
    if p["state"] == "absent" and not os.path.exists(path):
        # uninstall on a host without this static pod (or run twice after it went): nothing of ours is there, and
        # nothing to parse (a host without PyYAML is fine here)
        bind_address, secure_port = serving([])
        module.exit_json(changed=False, path=path, backup_file="", command=[], bind_address=bind_address,
                         secure_port=secure_port, msg="no manifest at %s: nothing to remove" % path)
    try:
        import yaml  # noqa: F401
    except ImportError:
        module.fail_json(msg="PyYAML is needed to edit %s (install python3-yaml)" % path)
    try:
        with open(path, "rb") as fh:
            before_bytes = fh.read()
    except (IOError, OSError) as exc:
        module.fail_json(msg="cannot read the kube-scheduler manifest %s: %s" % (path, exc))
    before_text = before_bytes.decode("utf-8", "replace")

    if p["state"] == "restore":
        if not p["backup_file"]:
            module.fail_json(msg="state=restore needs backup_file")
        with open(p["backup_file"], "rb") as fh:
            data = fh.read()
        changed = data != before_bytes
        result = dict(changed=changed, backup_file="", path=path)
        if changed and not module.check_mode:
            result["changed_at"] = time.time()
            atomic_write(path, data)
        result["command"] = command_of(load(data.decode("utf-8", "replace")))
        result["bind_address"], result["secure_port"] = serving(result["command"])
        module.exit_json(**result)

    try:
        doc = load(before_text)
        if p["state"] == "present":
            if not (p["flags"] and p["host_path"] and p["mount_path"]):
                module.fail_json(msg="state=present needs flags, host_path and mount_path")
            after = patch(doc, p["flags"], p["host_path"], p["mount_path"], p["sha256"], p["dns_policy"])
        else:
            after = unpatch(doc)
    except ManifestError as exc:
        module.fail_json(msg="%s: %s; left untouched" % (path, exc))
    except Exception as exc:  # YAML errors
        module.fail_json(msg="%s cannot be read as YAML (%s); left untouched" % (path, exc))

    pristine = os.path.join(backup_dir, os.path.basename(path) + PRISTINE_SUFFIX)
    changed = after != doc
    after_bytes = before_bytes
    if changed:
        after_bytes = dump(after).encode()
        if p["state"] == "absent" and os.path.exists(pristine):
            with open(pristine, "rb") as fh:
                original = fh.read()
            try:
                if load(original.decode("utf-8", "replace")) == after:
                    after_bytes = original  # nothing else changed since: the very bytes we found
            except Exception:
                pass
    result = dict(changed=changed, path=path, backup_file="", command=command_of(after))
    result["bind_address"], result["secure_port"] = serving(result["command"])
    if module._diff:
        result["diff"] = redact_diff(dict(before=before_text, after=after_bytes.decode("utf-8", "replace"),
                                          before_header=path, after_header=path))
    if changed and not module.check_mode:
        if not os.path.isdir(backup_dir):
            os.makedirs(backup_dir, 0o700)
        backup = os.path.join(backup_dir, "%s.%s" % (os.path.basename(path), _stamp()))
        shutil.copy2(path, backup)
        result["backup_file"] = backup
        if p["state"] == "present" and not is_patched(doc):
            shutil.copy2(path, pristine)  # the manifest as it was before gpu-install touched it
        result["changed_at"] = time.time()
        atomic_write(path, after_bytes)
        if p["state"] == "absent" and os.path.exists(pristine):
            os.unlink(pristine)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
