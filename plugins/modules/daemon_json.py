#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Merge the NVIDIA runtime (and registry settings) into Docker's daemon.json; keep every other key."""

DOCUMENTATION = r"""
module: daemon_json
short_description: Merge the NVIDIA runtime into /etc/docker/daemon.json
description:
  - Reads daemon.json, adds C(runtimes.<runtime_name>), optionally C(default-runtime), registry mirrors and
    insecure registries (appended, never removed) and extra top-level options; every other key is kept.
  - Invalid JSON or a non-object document fails and leaves the file untouched.
  - Writes only when the parsed content changes; backs up the original next to it; atomic rename.
  - Supports check mode and diff.
  - On the first change it records, in C(.<name>.gpu-install-state) next to the file, what the keys it sets held
    before (and the backup of the original). O(state=absent) uses that record to take out only our keys:
    C(runtimes.<runtime_name>) (the earlier entry comes back if there was one), C(default-runtime) and O(options)
    keys only while they still hold our value (their earlier value comes back), the list entries we appended.
    When the result equals the original it writes the backup's exact bytes. Without a record it removes only
    what is unmistakably ours (the runtime with our path, default-runtime naming it).
options:
  state: {type: str, default: present, choices: [present, absent], description: merge our keys in, or take them out}
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
backup_file: {description: backup of the file as it was before this change, returned: changed and backup, type: str}
created: {description: the file did not exist before this change, returned: always, type: bool}
config: {description: the resulting document (empty when the file was removed), returned: always, type: dict}
state_file: {description: the record of what our keys held before, returned: always, type: str}
state_created: {description: this change started the record (a rollback removes it), returned: changed, type: bool}
state_removed: {description: the record removed by state=absent (to put back on a rollback), returned: absent, type: dict}
"""

import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_install.node.plugins.module_utils.files import move_into_place, redact_diff, write_temp
from ansible_collections.gpu_install.node.plugins.module_utils.first_change import (
    STATE_FORMAT, load_state as _load_state, state_file, write_state)

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any, Sequence  # noqa: F401


class MergeError(Exception):
    pass


def parse(text, path="daemon.json"):
    # type: (str, str) -> dict[str, Any]
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
    # type: (object, Sequence[str], str) -> list[Any]
    if values is None:
        values = []
    if not isinstance(values, list):
        raise MergeError("daemon.json: %r must be a list, found %s" % (key, type(values).__name__))
    return values + [v for v in extra if v not in values]


def merge(doc, runtime_name="nvidia", runtime_path="/usr/bin/nvidia-container-runtime", runtime_args=(),
          default_runtime="", registry_mirrors=(), insecure_registries=(), options=None):
    # type: (dict[str, Any], str, str, Sequence[str], str, Sequence[str], Sequence[str], dict[str, Any] | None) -> dict[str, Any]
    """A new dict: doc with our keys merged in. Key order of doc is kept; doc is not modified."""
    out = json.loads(json.dumps(doc))  # type: dict[str, Any]
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


def _copy(value):
    # type: (Any) -> Any
    return json.loads(json.dumps(value))


def record(state, before, after, runtime_name, list_keys, option_keys):
    # type: (dict[str, Any] | None, dict[str, Any], dict[str, Any], str, list[str], list[str]) -> dict[str, Any]
    """The state record updated with what `before` held for each key the merge set (first time only):
    {"keys": {k: {present, value, ours}}, "runtimes": {present, entry: {present, value}, ours}, "lists": {k: {present, added}}}."""
    st = _copy(state) if state else {"format": STATE_FORMAT}  # type: dict[str, Any]
    keys = st.setdefault("keys", {})
    for k in option_keys:
        if k in after and k not in keys:
            keys[k] = {"present": k in before, "value": _copy(before.get(k))}
        if k in keys:
            keys[k]["ours"] = _copy(after.get(k))
    rts = st.setdefault("runtimes", {})
    if runtime_name not in rts:
        prev = before.get("runtimes") if isinstance(before.get("runtimes"), dict) else None
        rts[runtime_name] = {"present": bool(prev and runtime_name in prev),
                             "value": _copy(prev.get(runtime_name)) if prev else None}
        st.setdefault("runtimes_key_present", "runtimes" in before)
    rts[runtime_name]["ours"] = _copy(after["runtimes"][runtime_name])
    lists = st.setdefault("lists", {})
    for k in list_keys:
        new = [v for v in after.get(k) or [] if v not in (before.get(k) or [])]
        entry = lists.setdefault(k, {"present": k in before, "added": []})
        entry["added"] += [v for v in new if v not in entry["added"]]
    return st


def unmerge(doc, state, runtime_name="nvidia", runtime_path="/usr/bin/nvidia-container-runtime",
            default_runtime=""):
    # type: (dict[str, Any], dict[str, Any] | None, str, str, str) -> dict[str, Any]
    """doc without our keys (a new dict). With a state record: what it says (earlier values restored);
    without one: only what is unmistakably ours."""
    out = _copy(doc)  # type: dict[str, Any]
    if not state:
        rts = out.get("runtimes")
        if isinstance(rts, dict) and isinstance(rts.get(runtime_name), dict) and rts[runtime_name].get("path") == runtime_path:
            del rts[runtime_name]
            if not rts:
                del out["runtimes"]
        if default_runtime and out.get("default-runtime") == default_runtime == runtime_name:
            del out["default-runtime"]
        return out
    for k, rec in state.get("keys", {}).items():
        if k in out and out[k] == rec.get("ours"):  # still ours: put back what was there
            if rec.get("present"):
                out[k] = rec.get("value")
            else:
                del out[k]
    rts = out.get("runtimes")
    for name, rec in state.get("runtimes", {}).items():
        if isinstance(rts, dict) and name in rts:
            if rec.get("present"):
                rts[name] = rec.get("value")
            else:
                del rts[name]
    if isinstance(rts, dict) and not rts and not state.get("runtimes_key_present", True):
        del out["runtimes"]
    for k, rec in state.get("lists", {}).items():
        values = out.get(k)
        if isinstance(values, list):
            values = [v for v in values if v not in rec.get("added", [])]
            if values or rec.get("present"):
                out[k] = values
            else:
                del out[k]
    return out


def dump(doc):
    # type: (dict[str, Any]) -> str
    return json.dumps(doc, indent=2) + "\n"


def main():
    # type: () -> None
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
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path = p["path"]
    state_path = state_file(path)
    exists = os.path.exists(path)
    before_text = ""
    if exists:
        with open(path, "r") as fh:
            before_text = fh.read()
    try:
        before = parse(before_text, path)
        state = load_state(state_path)
        if p["state"] == "absent":
            absent(module, path, exists, before_text, before, state, state_path)
        after = merge(before, p["runtime_name"], p["runtime_path"], p["runtime_args"], p["default_runtime"],
                      p["registry_mirrors"], p["insecure_registries"], p["options"])
    except MergeError as exc:
        module.fail_json(msg=str(exc), path=path)
    changed = after != before or not exists
    result = dict(changed=changed, path=path, config=after, created=not exists, state_file=state_path)
    after_text = dump(after)
    if module._diff:
        result["diff"] = redact_diff(dict(before=before_text, after=after_text if changed else before_text,
                                          before_header=path, after_header=path))
    if changed and not module.check_mode:
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        tmp = write_temp(path, after_text, new_mode=0o644)
        if p["validate"]:
            rc, out, err = module.run_command(p["validate"].replace("%s", tmp))
            if rc != 0:
                os.unlink(tmp)
                module.fail_json(msg="%s: the merged file was rejected by %r; nothing was changed: %s"
                                 % (path, p["validate"], (err or out).strip()), path=path)
        if exists and p["backup"]:
            result["backup_file"] = module.backup_local(path)
        move_into_place(tmp, path, module)
        new_state = record(state, before, after, p["runtime_name"],
                           [k for k, v in (("registry-mirrors", p["registry_mirrors"]),
                                           ("insecure-registries", p["insecure_registries"])) if v],
                           (["default-runtime"] if p["default_runtime"] else []) + list(p["options"]))
        if not state:  # the first change: the original is what uninstall goes back to
            new_state.update(existed=exists, backup=result.get("backup_file"),
                             backup_sha256=_sha256(before_text) if exists else None)
        if new_state != state:
            write_state(state_path, new_state)
        result["state_created"] = not state
    module.exit_json(**result)


def _sha256(text):
    # type: (str) -> str
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_state(state_path):
    # type: (str) -> dict[str, Any] | None
    return _load_state(state_path, what="gpu-install's record of the keys it set", error=MergeError)


def original_text(state, doc):
    # type: (dict[str, Any] | None, dict[str, Any]) -> str | None
    """The original file's exact text when doc equals it (the backup recorded at the first change), else None."""
    backup = (state or {}).get("backup")
    if not backup or not os.path.exists(backup):
        return None
    with open(backup) as fh:
        text = fh.read()
    if (state or {}).get("backup_sha256") not in (None, _sha256(text)):
        return None
    try:
        return text if parse(text, backup) == doc else None
    except MergeError:
        return None


def absent(module, path, exists, before_text, before, state, state_path):
    # type: (AnsibleModule, str, bool, str, dict[str, Any], dict[str, Any] | None, str) -> None
    """state=absent: our keys out (see DOCUMENTATION); exits the module."""
    p = module.params
    after = unmerge(before, state, p["runtime_name"], p["runtime_path"], p["default_runtime"])
    remove_file = bool(exists and state and state.get("existed") is False and after == {})
    after_text = original_text(state, after)
    if after_text is None:
        after_text = before_text if after == before else dump(after)
    changed_file = exists and (remove_file or after_text != before_text)
    result = dict(changed=bool(changed_file or state), path=path, config={} if remove_file else after,
                  created=False, state_file=state_path)
    if state:
        result["state_removed"] = state
    if module._diff:
        result["diff"] = redact_diff(dict(before=before_text, after="" if remove_file else after_text,
                                          before_header=path, after_header=path))
    if module.check_mode or not result["changed"]:
        module.exit_json(**result)
    tmp = None
    if changed_file and not remove_file:
        tmp = write_temp(path, after_text, new_mode=0o644)
        if p["validate"]:
            rc, out, err = module.run_command(p["validate"].replace("%s", tmp))
            if rc != 0:
                os.unlink(tmp)
                module.fail_json(msg="%s: the file without our keys was rejected by %r; nothing was changed: %s"
                                 % (path, p["validate"], (err or out).strip()), path=path)
    if changed_file and p["backup"]:
        result["backup_file"] = module.backup_local(path)
    if tmp:
        move_into_place(tmp, path, module)
    elif remove_file:
        os.unlink(path)  # it did not exist before our first change
    if state:
        os.unlink(state_path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
