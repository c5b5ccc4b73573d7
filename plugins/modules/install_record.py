#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What a role of gpu-install installed and wrote on a node, so that its removal reverses exactly that."""

DOCUMENTATION = r"""
module: install_record
short_description: Record what gpu-install installed on a node (packages, files) and remove exactly that
description:
  - Keeps a JSON record per role (e.g. /var/lib/gpu-install/nvidia_driver.json, mode 0600, no secrets).
  - O(state=snapshot) returns the names of the installed packages (dpkg or rpm database); changes nothing.
  - O(state=present) records the packages installed now that were not in O(packages_before) (what this run's
    install added, dependencies included), the O(requested) packages that were there before (they are never
    removed), and each O(entries) key not recorded yet (the first change wins, so the record keeps the state before
    gpu-install's first apply). Later applies add only what is new.
  - O(state=query) returns the record (empty when there is none).
  - O(state=absent) removes the recorded packages that are still installed - only when removing them removes
    nothing else (apt's simulation, rpm's dependency test); otherwise it fails naming the packages that depend on
    them and removes nothing. With O(keep_packages) nothing is removed and the record keeps the package list (a later
    removal can still take them out); otherwise the record file goes. Reverse the O(entries) (files, services)
    before, with the record from O(state=query).
  - Supports check mode (the removal is simulated only).
options:
  path: {type: path, required: true, description: the record file}
  state: {type: str, default: present, choices: [snapshot, present, query, absent]}
  manager: {type: str, choices: [apt, dnf], required: true, description: the node's package manager}
  packages_before: {type: list, elements: str, default: [], description: "state=present: snapshot from before the install"}
  requested: {type: list, elements: str, default: [], description: "state=present: the package names the role asked for"}
  entries: {type: dict, default: {}, description: "state=present: things this run wrote, recorded unless already recorded"}
  keep_packages: {type: bool, default: false, description: "state=absent: remove no package"}
author: gpu-install
"""

RETURN = r"""
installed: {description: names of the installed packages, returned: snapshot, type: list}
record: {description: the record (after the change), returned: always, type: dict}
added: {description: packages recorded by this run, returned: present, type: list}
removed: {description: packages removed (would be, in check mode), returned: absent, type: list}
kept: {description: recorded packages kept because of keep_packages, returned: absent, type: list}
preexisting: {description: requested packages that were there before gpu-install (never removed), returned: absent, type: list}
missing: {description: recorded packages that were already gone, returned: absent, type: list}
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_install.node.plugins.module_utils.files import makedirs
from ansible_collections.gpu_install.node.plugins.module_utils.first_change import (
    RecordError, load_state, write_state)

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any, Iterable  # noqa: F401

FORMAT = 1
ENV = {"LC_ALL": "C", "LANG": "C", "DEBIAN_FRONTEND": "noninteractive"}


def empty():
    # type: () -> dict[str, Any]
    return {"format": FORMAT, "packages": [], "preexisting": [], "entries": {}}


def parse_dpkg(text):
    # type: (str) -> set[str]
    """Installed package names from `dpkg-query -W -f '${db:Status-Abbrev}\\t${Package}\\n'` (a package whose files
    are on disk: not 'not-installed' or 'config-files' only)."""
    out = set()
    for line in text.splitlines():
        status, _, name = line.partition("\t")
        if name and len(status) >= 2 and status[1] not in ("n", "c"):
            out.add(name.strip())
    return out


def parse_apt_simulation(text):
    # type: (str) -> set[str]
    """Package names `apt-get -s remove` would remove (its `Remv name [version]` lines; arch qualifiers dropped)."""
    return {m.group(1).split(":")[0] for m in re.finditer(r"^Remv (\S+)", text, re.M)}


def parse_rpm_needed(text):
    # type: (str) -> list[str]
    """`rpm -e --test` failures: the installed packages that need what would be removed."""
    return sorted({m.group(1) for m in re.finditer(r"is needed by \(installed\) (\S+)", text)})


def add(record, before, installed, requested, entries):
    # type: (dict[str, Any] | None, Iterable[str], Iterable[str], Iterable[str], dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]
    """The record after an install: packages installed now and absent before (dependencies included), requested
    packages that were there before, entries not recorded yet. Returns (new record, packages added)."""
    rec = dict(empty(), **(record or {}))
    rec["entries"] = dict(rec.get("entries") or {})
    before = set(before)
    new = sorted(set(installed) - before - set(rec["packages"]))
    rec["packages"] = sorted(set(rec["packages"]) | set(new))
    pre = {p for p in requested if p in before and p not in rec["packages"]}
    rec["preexisting"] = sorted(set(rec.get("preexisting") or []) | pre)
    for key, value in (entries or {}).items():
        if key not in rec["entries"] and value not in (None, "", {}, []):
            rec["entries"][key] = value
    return rec, new


def removal(record, installed, keep):
    # type: (dict[str, Any] | None, Iterable[str], bool) -> tuple[list[str], list[str], list[str]]
    """(to remove, kept, missing) for a record and the installed package names."""
    recorded = set((record or {}).get("packages") or [])
    present = sorted(recorded & set(installed))
    missing = sorted(recorded - set(installed))
    return ([], present, missing) if keep else (present, [], missing)


class Node:
    """The package database and tool of the node."""

    def __init__(self, module, manager):
        # type: (AnsibleModule, str) -> None
        self.module, self.manager = module, manager

    def run(self, argv, check=True):
        # type: (list[str], bool) -> tuple[int, str, str]
        rc, out, err = self.module.run_command(argv, environ_update=ENV)
        if check and rc != 0:
            self.module.fail_json(msg="%s failed (exit %d): %s" % (" ".join(argv), rc, (err or out).strip()[-600:]))
        return rc, out, err

    def installed(self):
        # type: () -> set[str]
        if self.manager == "apt":
            return parse_dpkg(self.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev}\t${Package}\n"])[1])
        # gpg-pubkey: the keys dnf imported (one pseudo-package per key), not packages a removal may take
        return {ln.strip() for ln in self.run(["rpm", "-qa", "--qf", "%{NAME}\n"])[1].splitlines()
                if ln.strip() and ln.strip() != "gpg-pubkey"}

    def also_removed(self, names):
        # type: (list[str]) -> list[str]
        """Installed packages outside `names` that removing `names` would remove or break."""
        if self.manager == "apt":
            rc, out, err = self.run(["apt-get", "-s", "-q", "remove"] + names, check=False)
            if rc != 0:
                self.module.fail_json(msg="apt-get cannot remove the packages gpu-install installed (%s) without "
                                          "breaking others: %s; nothing was removed. Resolve that, or keep the "
                                          "packages (uninstall --keep-packages)"
                                          % (", ".join(names), (err or out).strip()[-600:]), removed=[])
            return sorted(parse_apt_simulation(out) - set(names))
        rc, out, err = self.run(["rpm", "-e", "--test"] + names, check=False)
        needed = parse_rpm_needed(out + err)
        if rc != 0 and not needed:
            self.module.fail_json(msg="rpm -e --test %s failed: %s" % (" ".join(names), (err or out).strip()[-600:]))
        return sorted(set(needed) - set(names))

    def remove(self, names):
        # type: (list[str]) -> None
        if self.manager == "apt":
            self.run(["apt-get", "-y", "-q", "remove"] + names)
        else:
            self.run(["dnf", "-y", "-q", "remove", "--noautoremove"] + names)


def main():
    # type: () -> None
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["snapshot", "present", "query", "absent"]),
            manager=dict(type="str", required=True, choices=["apt", "dnf"]),
            packages_before=dict(type="list", elements="str", default=[]),
            requested=dict(type="list", elements="str", default=[]),
            entries=dict(type="dict", default={}),
            keep_packages=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path, node = p["path"], Node(module, p["manager"])
    try:
        record = load_state(path, what="gpu-install's record of what it installed", error=RecordError,
                            fallback="nothing (no package is removed without it)") if p["state"] != "snapshot" else None
    except RecordError as exc:
        module.fail_json(msg=str(exc))
    if record is not None and "format" in record:
        record = dict(empty(), **record)

    if p["state"] == "snapshot":
        module.exit_json(changed=False, installed=sorted(node.installed()))
    if p["state"] == "query":
        module.exit_json(changed=False, record=record or {})

    if p["state"] == "present":
        new, added = add(record, p["packages_before"], node.installed() if p["packages_before"] else set(),
                         p["requested"], p["entries"])
        changed = new != (record or empty())
        if changed and not module.check_mode:
            makedirs(os.path.dirname(path) or ".", 0o700)
            write_state(path, new)
        module.exit_json(changed=changed, record=new, added=added)

    # absent
    if record is None:
        module.exit_json(changed=False, record={}, removed=[], kept=[], preexisting=[], missing=[])
    remove, kept, missing = removal(record, node.installed(), p["keep_packages"])
    if remove:
        others = node.also_removed(remove)
        if others:
            module.fail_json(msg="removing the packages gpu-install installed (%s) would also remove or break %s, "
                                 "which gpu-install did not install; nothing was removed. Remove those first, or keep "
                                 "the packages (uninstall --keep-packages)" % (", ".join(remove), ", ".join(others)),
                             removed=[], blocked_by=others)
        if not module.check_mode:
            node.remove(remove)
            left = sorted(set(remove) & node.installed())
            if left:
                module.fail_json(msg="still installed after the removal: %s" % ", ".join(left), removed=[])
    after = dict(record, entries={}) if kept else {}
    if not module.check_mode:
        if after:
            write_state(path, after)
        elif os.path.exists(path):
            os.remove(path)
    module.exit_json(changed=bool(remove) or after != record, record=after, removed=remove, kept=kept,
                     preexisting=record.get("preexisting") or [], missing=missing)


if __name__ == "__main__":
    main()
