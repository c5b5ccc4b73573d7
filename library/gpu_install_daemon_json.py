#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Merge the NVIDIA runtime (and registry settings) into Docker's daemon.json; keep every other key."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_install_daemon_json
short_description: Merge the NVIDIA runtime into /etc/docker/daemon.json
description:
  - Reads daemon.json, adds C(runtimes.<runtime_name>), optionally C(default-runtime), registry mirrors and
    insecure registries (appended, never removed) and extra top-level options; every other key is kept.
  - Invalid JSON or a non-object document fails and leaves the file untouched.
  - Writes only when the parsed content changes; backs up the original next to it; atomic rename.
  - Supports check mode and diff.
options:
  path: {type: path, default: /etc/docker/daemon.json, description: daemon.json to merge into}
  runtime_name: {type: str, default: nvidia, description: key under runtimes}
  runtime_path: {type: str, default: /usr/bin/nvidia-container-runtime, description: runtime binary}
  runtime_args: {type: list, elements: str, default: [], description: runtime args}
  default_runtime: {type: str, default: '', description: value for default-runtime; empty leaves it alone}
  registry_mirrors: {type: list, elements: str, default: [], description: appended to registry-mirrors}
  insecure_registries: {type: list, elements: str, default: [], description: appended to insecure-registries}
  options: {type: dict, default: {}, description: extra top-level keys set as given}
  backup: {type: bool, default: true, description: back up the original before writing}
  validate: {type: str, default: '', description: "command run on the new file before it replaces the old one, %s = its path (e.g. dockerd --validate --config-file %s)"}
author: gpu-install
"""

RETURN = r"""
backup_file: {description: backup of the original, returned: changed and backup, type: str}
config: {description: the merged document, returned: always, type: dict}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule


class MergeError(Exception):
    pass


def parse(text, path="daemon.json"):
    """daemon.json text → dict. Empty (or whitespace) is an empty document."""
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise MergeError("%s is not valid JSON (%s); fix or remove it - it was left untouched" % (path, exc))
    if not isinstance(doc, dict):
        raise MergeError("%s must hold a JSON object, found %s; left untouched" % (path, type(doc).__name__))
    return doc


def _append(values, extra, key):
    if values is None:
        values = []
    if not isinstance(values, list):
        raise MergeError("daemon.json: %r must be a list, found %s" % (key, type(values).__name__))
    return values + [v for v in extra if v not in values]


def merge(doc, runtime_name="nvidia", runtime_path="/usr/bin/nvidia-container-runtime", runtime_args=(),
          default_runtime="", registry_mirrors=(), insecure_registries=(), options=None):
    """A new dict: doc with our keys merged in. Key order of doc is kept; doc is not modified."""
    out = json.loads(json.dumps(doc))
    runtimes = out.get("runtimes")
    if runtimes is None:
        runtimes = out["runtimes"] = {}
    if not isinstance(runtimes, dict):
        raise MergeError("daemon.json: 'runtimes' must be an object, found %s" % type(runtimes).__name__)
    entry = runtimes.get(runtime_name)
    entry = dict(entry) if isinstance(entry, dict) else {}
    entry["path"] = runtime_path
    if runtime_args or "runtimeArgs" in entry:
        entry["runtimeArgs"] = list(runtime_args)
    runtimes[runtime_name] = entry
    if default_runtime:
        out["default-runtime"] = default_runtime
    if registry_mirrors:
        out["registry-mirrors"] = _append(out.get("registry-mirrors"), registry_mirrors, "registry-mirrors")
    if insecure_registries:
        out["insecure-registries"] = _append(out.get("insecure-registries"), insecure_registries,
                                             "insecure-registries")
    for key, value in (options or {}).items():
        out[key] = value
    return out


def dump(doc):
    return json.dumps(doc, indent=2) + "\n"


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/etc/docker/daemon.json"),
            runtime_name=dict(type="str", default="nvidia"),
            runtime_path=dict(type="str", default="/usr/bin/nvidia-container-runtime"),
            runtime_args=dict(type="list", elements="str", default=[]),
            default_runtime=dict(type="str", default=""),
            registry_mirrors=dict(type="list", elements="str", default=[]),
            insecure_registries=dict(type="list", elements="str", default=[]),
            options=dict(type="dict", default={}),
            backup=dict(type="bool", default=True),
            validate=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    exists = os.path.exists(path)
    before_text = ""
    if exists:
        with open(path, "r") as fh:
            before_text = fh.read()
    try:
        before = parse(before_text, path)
        after = merge(before, p["runtime_name"], p["runtime_path"], p["runtime_args"], p["default_runtime"],
                      p["registry_mirrors"], p["insecure_registries"], p["options"])
    except MergeError as exc:
        module.fail_json(msg=str(exc), path=path)
    changed = after != before or not exists
    result = dict(changed=changed, path=path, config=after)
    after_text = dump(after)
    if module._diff:
        result["diff"] = dict(before=before_text, after=after_text if changed else before_text,
                              before_header=path, after_header=path)
    if changed and not module.check_mode:
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        if exists and p["backup"]:
            result["backup_file"] = module.backup_local(path)
        tmp = os.path.join(directory, ".%s.gpu-install.tmp" % os.path.basename(path))
        with open(tmp, "w") as fh:
            fh.write(after_text)
            fh.flush()
            os.fsync(fh.fileno())
        if not exists:
            os.chmod(tmp, 0o644)
        if p["validate"]:
            rc, out, err = module.run_command(p["validate"].replace("%s", tmp))
            if rc != 0:
                os.unlink(tmp)
                module.fail_json(msg="%s: the merged file was rejected by %r; nothing was changed: %s"
                                 % (path, p["validate"], (err or out).strip()), path=path)
        module.atomic_move(tmp, path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
