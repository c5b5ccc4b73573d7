#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Add the NVIDIA runtime to containerd through a drop-in file; edit the main config only to import it."""

DOCUMENTATION = r"""
module: containerd_runtime
short_description: NVIDIA runtime for containerd (config version 2 and 3) through a drop-in
description:
  - Writes O(dropin) (by default /etc/containerd/conf.d/99-nvidia.toml) and makes sure the main config's top-level
    C(imports) covers it - a minimal textual edit; the main file is never rewritten.
  - Config version 3 (containerd 2.x) merges imported tables key by key, so the drop-in holds only our keys.
    Config version 2 (containerd 1.6/1.7) replaces a whole plugin section with the imported one
    (containerd issue 5837), so the drop-in carries the effective CRI plugin section (main file, then earlier
    imports) plus ours, and is re-derived on every run.
  - The nvidia runtime gets runc's options (e.g. SystemdCgroup) plus BinaryName; runc is declared too when no
    file does, since a runtimes table replaces containerd's default map (runc would vanish).
  - Backs up what it changes, writes atomically, runs O(validate) afterwards and restores everything if it fails.
  - The first change is recorded in C(.<name>.gpu-install-state) (whether the main file existed or was edited,
    its backup, the text we wrote). O(state=absent) removes the drop-in and our C(imports) entry: the main file's
    exact original comes back from the backup while it still holds the text we wrote, otherwise only our entry is
    taken out of C(imports) (a minimal edit); validated and restored on failure as for deploy.
options:
  state: {type: str, default: present, choices: [present, absent]}
  config: {type: path, default: /etc/containerd/config.toml}
  dropin: {type: path, default: /etc/containerd/conf.d/99-nvidia.toml}
  config_version: {type: int, default: 0, description: 2 or 3; 0 = the main file's version, else from containerd_version}
  containerd_version: {type: str, default: '', description: output of containerd --version (used when the main file has no version)}
  runtime_name: {type: str, default: nvidia}
  runtime_binary: {type: str, default: /usr/bin/nvidia-container-runtime}
  set_default: {type: bool, default: true, description: make it default_runtime_name}
  registry_config_path: {type: str, default: '', description: registry config_path (hosts.toml directory); empty leaves it}
  backup: {type: bool, default: true}
  validate: {type: str, default: '', description: command run after writing, %s = main config path; failure restores}
author: gpu-install
"""

import fnmatch
import glob
import hashlib
import json
import os
import re
import sys

from ansible_collections.gpu_install.node.plugins.module_utils.files import atomic_write, move_into_place, redact_diff
from ansible_collections.gpu_install.node.plugins.module_utils.first_change import (
    STATE_FORMAT, load_state as _load_state, state_file, write_state)

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any, Callable, Literal  # noqa: F401

    from ansible.module_utils.basic import AnsibleModule  # noqa: F401

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_V3_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_V3_IMAGES = "io.containerd.cri.v1.images"
RUNC_V2 = "io.containerd.runc.v2"


class MergeError(Exception):
    pass


# ---------------------------------------------------------------- TOML reading (library on the node)


def toml_loads(text, path):
    # type: (str, str) -> dict[str, Any]
    if sys.version_info >= (3, 11):
        import tomllib as lib
    else:
        try:
            import tomli as lib
        except ImportError:
            try:
                import toml as lib
            except ImportError:
                raise MergeError("no TOML parser on this node (Python >= 3.11, or python3-toml / tomli) to read %s"
                                 % path)
    try:
        return lib.loads(text)
    except Exception as exc:  # each library has its own error type
        raise MergeError("%s is not valid TOML (%s); fix it - nothing was changed" % (path, exc))


# ---------------------------------------------------------------- TOML writing (the subset configs use)

_BARE = re.compile(r"^[A-Za-z0-9_-]+\Z")


def _str(s):
    # type: (str) -> str
    out = json.dumps(s, ensure_ascii=False)
    return out.replace("\x7f", "\\u007f")


def _key(k):
    # type: (str) -> str
    return k if _BARE.match(k) else _str(k)


def _value(v):
    # type: (object) -> str
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join("%s = %s" % (_key(k), _value(x)) for k, x in v.items()) + "}"
    if hasattr(v, "isoformat"):  # a TOML date or time
        text = v.isoformat()  # type: str
        return text
    raise MergeError("cannot write %r as TOML" % (v,))


def _is_aot(v):
    # type: (object) -> bool
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def toml_dumps(doc):
    # type: (dict[str, Any]) -> str
    lines = []

    def table(d, path):
        # type: (dict[str, Any], list[str]) -> None
        for k, v in d.items():
            if not isinstance(v, dict) and not _is_aot(v):
                lines.append("%s = %s" % (_key(k), _value(v)))
        for k, v in d.items():
            sub = path + [_key(k)]
            if isinstance(v, dict):
                lines.append("")
                lines.append("[%s]" % ".".join(sub))
                table(v, sub)
            elif _is_aot(v):
                for item in v:
                    lines.append("")
                    lines.append("[[%s]]" % ".".join(sub))
                    table(item, sub)

    table(doc, [])
    return "\n".join(lines).lstrip("\n") + "\n"


# ---------------------------------------------------------------- the main file's top level, textually


def scan_top(text):
    # type: (str) -> dict[str, Any]
    """Top-level facts of a TOML text without a parser: offsets of `version`/`imports` lines and of
    the imports array's closing bracket. String-, comment- and bracket-aware."""
    facts = {"header": len(text), "version_end": None, "imports_close": None, "imports_trailing_comma": False,
             "imports_key": None, "imports_open": None}
    i, n, depth, line_start = 0, len(text), 0, True
    key, in_imports, last_sig = None, False, ""
    while i < n:
        c = text[i]
        if c in "\"'":
            q3 = text[i:i + 3] in ('"""', "'''")
            end = text.find(text[i:i + 3] if q3 else c, i + (3 if q3 else 1))
            while c == '"' and end > 0 and (len(text[:end]) - len(text[:end].rstrip("\\"))) % 2 == 1:
                end = text.find(text[i:i + 3] if q3 else c, end + 1)
            if end < 0:
                raise MergeError("unterminated string")
            i = end + (3 if q3 else 1)
            last_sig, line_start = '"', False
            continue
        if c == "#":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
            continue
        if c == "\n":
            if depth == 0 and key == "version":
                facts["version_end"] = i + 1
            if depth == 0:
                key = None
            line_start = True
            i += 1
            continue
        if c in " \t\r":
            i += 1
            continue
        if line_start and depth == 0 and c == "[":
            facts["header"] = i
            return facts
        if line_start and depth == 0:
            m = re.match(r"([A-Za-z0-9_-]+)\s*=", text[i:])
            if m:
                key = m.group(1)
                in_imports = key == "imports"
                if in_imports:
                    facts["imports_key"] = i
                i += m.end()
                line_start = False
                continue
        if c == "[":
            if depth == 0 and in_imports and facts["imports_open"] is None:
                facts["imports_open"] = i
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0 and in_imports:
                facts["imports_close"] = i
                facts["imports_trailing_comma"] = last_sig in (",", "[")
                in_imports = False
        last_sig, line_start = c, False
        i += 1
    if key == "version" and depth == 0:
        facts["version_end"] = n
    return facts


def add_import(text, path, facts):
    # type: (str, str, dict[str, Any]) -> str
    """Minimal edit: our path appended to imports, or an imports line added after `version`."""
    if facts["imports_close"] is not None:
        j = facts["imports_close"]
        sep = " " if facts["imports_trailing_comma"] else ", "
        return text[:j] + sep + _str(path) + text[j:]
    line = "imports = [%s]\n" % _str(path)
    at = facts["version_end"]
    if at is None:
        at = 0
    elif not text[:at].endswith("\n"):
        line = "\n" + line
    return text[:at] + line + text[at:]


def remove_import(text, path, config="config.toml"):
    # type: (str, str, str) -> str | None
    """Minimal edit: `path` taken out of the top-level imports (the whole `imports = [...]` statement when it
    was the only entry). None when it is not listed there. The result must parse to the same document
    minus that entry."""
    doc = toml_loads(text, config) if text.strip() else {}
    imports = list(doc.get("imports") or [])
    if path not in imports:
        return None
    facts = scan_top(text)
    start, open_, close = facts["imports_key"], facts["imports_open"], facts["imports_close"]
    if None in (start, open_, close):
        raise MergeError("could not find the imports array in %s; remove %s from it by hand" % (config, path))
    rest = [x for x in imports if x != path]
    if rest:
        new = text[:open_] + "[" + ", ".join(_str(x) for x in rest) + "]" + text[close + 1:]
        expect = dict(doc, imports=rest)
    else:
        end = close + 1
        tail = text[end:]
        stripped = tail.lstrip(" \t")
        if stripped.startswith("\n") or not stripped:
            end += len(tail) - len(stripped) + (1 if stripped.startswith("\n") else 0)
        new = text[:start] + text[end:]
        expect = {k: v for k, v in doc.items() if k != "imports"}
    if (toml_loads(new, config + " (edited)") if new.strip() else {}) != expect:
        raise MergeError("could not remove the import from %s safely; remove %s from its `imports` by hand"
                         % (config, path))
    return new


def sha256(text):
    # type: (str) -> str
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def removal_plan(main_text, dropin_exists, state, dropin, config, read_backup=None):
    # type: (str | None, bool, dict[str, Any] | None, str, str, Callable[[str], str | None] | None) -> tuple[str | Literal[False] | None, bool]
    """state=absent → (new main text, or None to leave it, or False to delete it; remove the drop-in?).
    The main file goes back to its exact original (the backup recorded at our first change) while it still
    holds the text we wrote; else only our import is taken out."""
    st = state or {}
    new_main = None  # type: str | Literal[False] | None
    if st.get("main_edited") and main_text is not None and sha256(main_text) == st.get("main_written_sha256"):
        if st.get("main_existed") is False:
            new_main = False
        else:
            backup = st.get("main_backup")  # type: str | None
            original = read_backup(backup) if read_backup and backup else None
            if original is not None and sha256(original) == st.get("main_backup_sha256"):
                new_main = original
    if new_main is None and main_text is not None:
        new_main = remove_import(main_text, dropin, config)
    return new_main, dropin_exists


# ---------------------------------------------------------------- the plan


def _dig(doc, *keys):
    # type: (Any, *str) -> Any
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def _put(doc, keys, value):
    # type: (dict[str, Any], list[str], object) -> None
    for k in keys[:-1]:
        doc = doc.setdefault(k, {})
    doc[keys[-1]] = value


def covered(imports, path):
    # type: (list[str] | None, str) -> bool
    return any(p == path or fnmatch.fnmatchcase(path, p) for p in imports or [])


def import_order(imports, dropin, exists=os.path.exists):
    # type: (list[str] | None, str, Callable[[str], bool]) -> list[str]
    """Files containerd imports, in its order (each glob sorted); our drop-in included once."""
    out = []
    for pattern in imports or []:
        matches = sorted(glob.glob(pattern)) if any(ch in pattern for ch in "*?[") else [pattern]
        if dropin not in matches and covered([pattern], dropin):
            matches = sorted(matches + [dropin])
        out += [m for m in matches if m not in out]
    return out


def plan(main_text, dropin, params, read_import=None):
    # type: (str, str, dict[str, Any], Callable[[str], dict[str, Any]] | None) -> tuple[str | None, str, int]
    """→ (new main text or None when unchanged, drop-in text, config version)."""
    main_doc = toml_loads(main_text, params["config"]) if main_text.strip() else {}
    version = main_doc.get("version")
    if version is None and main_doc.get("plugins"):
        raise MergeError("%s has no `version` (config version 1, containerd < 1.5 layout)" % params["config"])
    if version is None:
        version = params.get("config_version") or _version_from_binary(params.get("containerd_version", ""))
    if version not in (2, 3):
        raise MergeError("%s: containerd config version %r is not supported (2 or 3)" % (params["config"], version))
    imports = list(main_doc.get("imports") or [])
    order = import_order(imports + ([] if covered(imports, dropin) else [dropin]), dropin)
    docs = [main_doc]
    seen_ours = False
    for f in order:
        if f == dropin:
            seen_ours = True
            continue
        doc = read_import(f) if read_import else {}
        cri = CRI_V2 if version == 2 else CRI_V3_RUNTIME
        if seen_ours and version == 2 and _dig(doc, "plugins", cri) is not None:
            raise MergeError("%s is imported after %s and replaces the whole CRI plugin section; "
                             "rename it to sort before %s or move its settings into %s"
                             % (f, dropin, os.path.basename(dropin), params["config"]))
        if not seen_ours:
            docs.append(doc)
    dropin_doc = {"version": version}
    if version == 2:
        base = {}
        for doc in docs:  # containerd 1.x: the last file that has the section wins, as a whole
            section = _dig(doc, "plugins", CRI_V2)
            if section is not None:
                base = json.loads(json.dumps(section, default=str))
        runtimes_at = ["plugins", CRI_V2, "containerd"]
        registry_at = ["plugins", CRI_V2, "registry"]
        dropin_doc["plugins"] = {CRI_V2: base}
        if params["registry_config_path"] and _dig(base, "registry", "mirrors"):
            raise MergeError("%s sets registry.mirrors, which containerd refuses together with config_path; "
                             "move the mirrors to hosts.toml files under %s"
                             % (params["config"], params["registry_config_path"]))
    else:
        runtimes_at = ["plugins", CRI_V3_RUNTIME, "containerd"]
        registry_at = ["plugins", CRI_V3_IMAGES, "registry"]
    runc = {}
    for doc in docs:
        opts = _dig(doc, *(runtimes_at + ["runtimes", "runc", "options"]))
        if isinstance(opts, dict):
            runc.update(opts)
    if not any(isinstance(_dig(doc, *(runtimes_at + ["runtimes", "runc"])), dict) for doc in docs):
        # containerd decodes a runtimes table over its defaults by replacing the map: naming only nvidia
        # would drop the built-in runc runtime (seen with 1.6 `config dump`), so name runc too.
        _put(dropin_doc, runtimes_at + ["runtimes", "runc"], {"runtime_type": RUNC_V2})
    options = dict(runc)
    options["BinaryName"] = params["runtime_binary"]
    _put(dropin_doc, runtimes_at + ["runtimes", params["runtime_name"]],
         {"runtime_type": RUNC_V2, "options": options})
    if params["set_default"]:
        _put(dropin_doc, runtimes_at + ["default_runtime_name"], params["runtime_name"])
    if params["registry_config_path"]:
        _put(dropin_doc, registry_at + ["config_path"], params["registry_config_path"])
    header = "# Written by gpu-install (containerd_runtime role); re-derived on every run. Edit %s instead.\n" % (
        params["config"] if version == 2 else "the role variables")
    dropin_text = header + toml_dumps(dropin_doc)

    new_main = None
    if not covered(imports, dropin):
        facts = scan_top(main_text)
        text = main_text
        if main_doc.get("version") is None:
            text = "version = %d\n" % version + text
            facts = scan_top(text)
        new_main = add_import(text, dropin, facts)
        check = toml_loads(new_main, params["config"] + " (edited)")
        expect = dict(main_doc, version=version, imports=imports + [dropin])
        if check != expect:  # the textual edit must change exactly version/imports
            raise MergeError("could not add the import to %s safely; add %s to its `imports` by hand"
                             % (params["config"], dropin))
    return new_main, dropin_text, version


def _version_from_binary(text):
    # type: (str) -> int
    m = re.search(r"\bv?(\d+)\.(\d+)\.\d+", text or "")
    if not m:
        raise MergeError("cannot tell the containerd config version: the main config has none and "
                         "containerd --version gave %r" % (text,))
    return 3 if int(m.group(1)) >= 2 else 2


# ---------------------------------------------------------------- module


def main():
    # type: () -> None
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="path", default="/etc/containerd/config.toml"),
            dropin=dict(type="path", default="/etc/containerd/conf.d/99-nvidia.toml"),
            config_version=dict(type="int", default=0),
            containerd_version=dict(type="str", default=""),
            runtime_name=dict(type="str", default="nvidia"),
            runtime_binary=dict(type="str", default="/usr/bin/nvidia-container-runtime"),
            set_default=dict(type="bool", default=True),
            registry_config_path=dict(type="str", default=""),
            backup=dict(type="bool", default=True),
            validate=dict(type="str", default=""),
            state=dict(type="str", default="present", choices=["present", "absent"]),
        ),
        supports_check_mode=True,
    )
    p = module.params

    def read(path):
        # type: (str) -> str
        if not os.path.exists(path):
            return ""
        with open(path, "r") as fh:
            return fh.read()

    state_path = state_file(p["config"])
    try:
        state = load_state(state_path)
    except MergeError as exc:
        module.fail_json(msg=str(exc), config=p["config"])
    if p["state"] == "absent":
        absent(module, read, state, state_path)
    main_text, old_dropin = read(p["config"]), read(p["dropin"])
    main_existed, dropin_dir_existed = os.path.exists(p["config"]), os.path.isdir(os.path.dirname(p["dropin"]))
    try:
        new_main, dropin_text, version = plan(main_text, p["dropin"], p,
                                              read_import=lambda f: toml_loads(read(f), f) if read(f).strip() else {})
    except MergeError as exc:
        module.fail_json(msg=str(exc), config=p["config"])
    # the drop-in of config version 2 carries a copy of the main file's CRI section, registry credentials included:
    # it is never more readable than the main file (0644 at most); one that is gets rewritten with that mode
    dropin_mode = 0o644 & ((os.stat(p["config"]).st_mode & 0o777) if main_existed else 0o644)
    too_open = os.path.exists(p["dropin"]) and bool(os.stat(p["dropin"]).st_mode & 0o777 & ~dropin_mode)
    changed_dropin = dropin_text != old_dropin or too_open
    changed = bool(new_main is not None or changed_dropin)
    result = dict(changed=changed, config=p["config"], dropin=p["dropin"], config_version=version, backups=[])
    if module._diff:
        # redacted: a config.toml may hold registry credentials (CRI registry.configs.<host>.auth)
        result["diff"] = redact_diff([
            dict(before=old_dropin, after=dropin_text, before_header=p["dropin"], after_header=p["dropin"]),
            dict(before=main_text, after=new_main if new_main is not None else main_text,
                 before_header=p["config"], after_header=p["config"])])
    if not changed or module.check_mode:
        module.exit_json(**result)

    undo = []  # (path, backup or None)

    def write(path, text, existed, mode=None):
        # type: (str, str, bool, int | None) -> None
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        backup = module.backup_local(path) if existed and p["backup"] else None
        if backup:
            result["backups"].append(backup)
        atomic_write(path, text, mode=mode, new_mode=0o644, module=module)
        undo.append((path, backup, existed))

    if changed_dropin:
        write(p["dropin"], dropin_text, os.path.exists(p["dropin"]), mode=dropin_mode)
    if new_main is not None:
        write(p["config"], new_main, os.path.exists(p["config"]))
    new_state = dict(state or {"format": STATE_FORMAT, "main_edited": False,
                               "dropin_dir_created": not dropin_dir_existed})
    if new_main is not None:
        if not new_state.get("main_edited"):  # our first edit: the original is what uninstall goes back to
            backup = undo[-1][1]
            new_state.update(main_edited=True, main_existed=main_existed, main_backup=backup,
                             main_backup_sha256=sha256(main_text) if main_existed else None)
        new_state["main_written_sha256"] = sha256(new_main)
    if p["validate"]:
        rc, out, err = module.run_command(p["validate"].replace("%s", p["config"]))
        if rc != 0 or p["runtime_binary"] not in out:
            for path, backup, existed in reversed(undo):
                if backup:
                    move_into_place(backup, path, module)
                elif not existed:
                    os.unlink(path)
            module.fail_json(msg="containerd rejected the merged configuration (%r); the previous files were "
                                 "restored: %s" % (p["validate"], (err or out).strip()[-800:]), **result)
    if new_state != state:
        write_state(state_path, new_state)
    module.exit_json(**result)


def load_state(state_path):
    # type: (str) -> dict[str, Any] | None
    return _load_state(state_path, fallback="our import entry", error=MergeError)


def absent(module, read, state, state_path):
    # type: (AnsibleModule, Callable[[str], str], dict[str, Any] | None, str) -> None
    """state=absent: the drop-in and our import out (see DOCUMENTATION); exits the module."""
    p = module.params
    config, dropin = p["config"], p["dropin"]
    main_text = read(config) if os.path.exists(config) else None
    dropin_exists = os.path.exists(dropin)

    def read_backup(path):
        # type: (str) -> str | None
        return read(path) if path and os.path.exists(path) else None

    try:
        new_main, remove_dropin = removal_plan(main_text, dropin_exists, state, dropin, config, read_backup)
    except MergeError as exc:
        module.fail_json(msg=str(exc), config=config)
    dropin_dir = os.path.dirname(dropin)
    rmdir = bool(state and state.get("dropin_dir_created") and os.path.isdir(dropin_dir)
                 and set(os.listdir(dropin_dir)) <= {os.path.basename(dropin)})
    changed = bool(new_main is not None or remove_dropin or state)
    result = dict(changed=changed, config=config, dropin=dropin, backups=[], state_removed=state)
    if module._diff:
        result["diff"] = redact_diff([
            dict(before=read(dropin), after="", before_header=dropin, after_header=dropin),
            dict(before=main_text or "", after=(new_main or "") if new_main is not None else (main_text or ""),
                 before_header=config, after_header=config)])
    if not changed or module.check_mode:
        module.exit_json(**result)
    undo = []  # (path, backup)
    dropin_text = read(dropin) if remove_dropin else None
    if remove_dropin:  # our own file, re-derived on every run: kept in memory for a restore, no backup
        os.unlink(dropin)
    if new_main is not None:
        backup = module.backup_local(config) if p["backup"] else None
        if backup:
            result["backups"].append(backup)
        if new_main is False:
            os.unlink(config)  # it did not exist before our first change
        else:
            atomic_write(config, new_main, new_mode=0o644, module=module)
        undo.append((config, backup))
    if p["validate"] and os.path.exists(config):
        rc, out, err = module.run_command(p["validate"].replace("%s", config))
        if rc != 0:
            for path, backup in reversed(undo):
                if backup:
                    move_into_place(backup, path, module)
            if dropin_text is not None:
                atomic_write(dropin, dropin_text, new_mode=0o644, module=module)
            module.fail_json(msg="containerd rejected the configuration without our runtime (%r); the previous "
                                 "files were restored: %s" % (p["validate"], (err or out).strip()[-800:]), **result)
    if rmdir and not os.listdir(dropin_dir):
        os.rmdir(dropin_dir)
    if state:
        os.unlink(state_path)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
