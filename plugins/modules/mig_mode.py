#!/usr/bin/python
# -*- coding: utf-8 -*-
"""MIG mode of a node's GPUs (nvidia-smi -mig), for dynamic MIG partitioning (mig.dynamic nos)."""

DOCUMENTATION = r"""
module: mig_mode
short_description: Turn MIG mode on (or back off) on a node's GPUs, with the pending-reset handling
description:
  - Reads every GPU's MIG mode (C(nvidia-smi --query-gpu=index,pci.bus_id,name,mig.mode.current,mig.mode.pending)).
  - O(state=enabled) needs every GPU of the node to be MIG-capable and of one model (nos partitions a node's GPUs
    alike); otherwise it fails naming the GPUs and changes nothing. For each GPU whose current mode is not Enabled it
    runs C(nvidia-smi -i N -mig 1). A mode the driver leaves pending (a process holds the GPU, or the platform wants a
    reset) is followed, with O(reset), by C(nvidia-smi -i N -r); a refused reset is reported with nvidia-smi's words.
  - O(state=disabled) turns MIG mode off again only on the GPUs the record says gpu-install turned on (the others
    keep their mode), after destroying their compute and GPU instances, then removes the record.
  - It does not fail on a mode left pending: RV(pending) lists those GPUs with the reason, and the role decides
    (reboot, or stop with the report). The record (O(record), mode 0600) lists the GPUs it switched; each GPU goes
    into it as soon as its switch is done (and out of it once it is back off), so a GPU that refuses after others
    switched fails the module with C(changed=true) and a record that uninstall reverses.
  - Supports check mode (reports what it would switch).
options:
  state: {type: str, default: enabled, choices: [enabled, disabled]}
  reset: {type: bool, default: true, description: try a GPU reset when the new mode stays pending}
  record: {type: path, default: /var/lib/gpu-install/mig_mode.json, description: the GPUs gpu-install switched on}
  nvidia_smi: {type: str, default: nvidia-smi, description: the nvidia-smi to run}
author: gpu-install
"""

RETURN = r"""
gpus: {description: "per GPU: index, bus_id, name, before, current, pending, messages", returned: always, type: list}
switched: {description: bus ids whose mode this run changed (or would), returned: always, type: list}
pending: {description: "GPUs whose mode is still pending: index, bus_id, reason", returned: always, type: list}
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpu_install.node.plugins.module_utils.first_change import (
    RecordError, load_state, write_state)

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any  # noqa: F401

FIELDS = "index,pci.bus_id,name,mig.mode.current,mig.mode.pending"
ENV = {"LC_ALL": "C", "LANG": "C"}


def query(module, smi):
    # type: (AnsibleModule, str) -> list[dict[str, Any]]
    rc, out, err = module.run_command([smi, "--query-gpu=" + FIELDS, "--format=csv,noheader"], environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="%s --query-gpu failed (exit %d): %s" % (smi, rc, (out + err).strip()[-500:]),
                         hint="the NVIDIA driver must be loaded (driver role, or driver.mode operator with its pod "
                              "running) before MIG mode can be set")
    gpus = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        index, bus, name, current, pending = parts
        gpus.append({"index": int(index), "bus_id": bus, "name": name, "current": current, "pending": pending,
                     "before": current, "messages": []})
    if not gpus:
        module.fail_json(msg="%s lists no GPU on this node" % smi, hint="check the driver (nvidia-smi -L)")
    return gpus


def words(out, err):
    # type: (str, str) -> str
    """nvidia-smi's reason in brief: its first line, without the "Warning: " and the "(e.g. ...)" advice."""
    lines = [line.strip() for line in (out + "\n" + err).splitlines() if line.strip() and line.strip() != "All done."]
    first = lines[0] if lines else ""
    if first.startswith("Warning: "):
        first = first[len("Warning: "):]
    return first.split(" (e.g.")[0].rstrip(". ")


class SwitchError(Exception):
    pass


def switch(module, smi, gpu, want, reset):
    # type: (AnsibleModule, str, dict[str, Any], str, bool) -> tuple[list[str], str]
    """Set one GPU's mode; returns (the nvidia-smi messages worth keeping, its current mode after). Raises
    SwitchError when nvidia-smi refuses the switch (the mode is unchanged then)."""
    flag = "1" if want == "Enabled" else "0"
    rc, out, err = module.run_command([smi, "-i", str(gpu["index"]), "-mig", flag], environ_update=ENV)
    msgs = [words(out, err)] if (rc != 0 or "pending" in out.lower() or "unable" in out.lower()) else []
    if rc != 0:
        raise SwitchError("GPU %d (%s): nvidia-smi -mig %s failed (exit %d): %s"
                          % (gpu["index"], gpu["bus_id"], flag, rc, words(out, err)))
    state = {g["index"]: g for g in query(module, smi)}[gpu["index"]]
    if state["current"] != want and state["pending"] == want and reset:
        rc, out, err = module.run_command([smi, "-i", str(gpu["index"]), "-r"], environ_update=ENV)
        if rc != 0:
            msgs.append("GPU reset refused: " + words(out, err))
        state = {g["index"]: g for g in query(module, smi)}[gpu["index"]]
    return msgs, state["current"]


def save(path, record):
    # type: (str, dict[str, Any]) -> None
    """The record as it is now (0600, atomically); none left when it lists no GPU."""
    if record.get("switched"):
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            os.makedirs(directory)
        write_state(path, record)
    elif os.path.exists(path):
        os.unlink(path)


def main():
    # type: () -> None
    module = AnsibleModule(argument_spec=dict(
        state=dict(type="str", default="enabled", choices=["enabled", "disabled"]),
        reset=dict(type="bool", default=True),
        record=dict(type="path", default="/var/lib/gpu-install/mig_mode.json"),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
    ), supports_check_mode=True)
    p = module.params
    smi = p["nvidia_smi"]
    if os.sep not in smi:
        smi = module.get_bin_path(smi, required=True)
    try:
        record = load_state(p["record"], what="gpu-install's record of the GPUs it put in MIG mode",
                            fallback="nothing (MIG mode stays as it is)") or {"format": 1, "switched": []}
    except RecordError as exc:
        module.fail_json(msg=str(exc))
    gpus = query(module, smi)
    want = "Enabled" if p["state"] == "enabled" else "Disabled"
    if p["state"] == "enabled":
        incapable = ["GPU %d %s (%s)" % (g["index"], g["bus_id"], g["name"]) for g in gpus if g["current"] == "[N/A]"]
        if incapable:
            module.fail_json(msg="not MIG-capable: %s; nos partitions every GPU of a node it manages"
                             % ", ".join(incapable),
                             hint="leave this node out of dynamic MIG: gpu_install_mig_dynamic: false for the host")
        models = sorted({g["name"] for g in gpus})
        if len(models) > 1:
            module.fail_json(msg="GPUs of %d models on one node (%s); nos needs one model per node"
                             % (len(models), ", ".join(models)),
                             hint="leave this node out of dynamic MIG: gpu_install_mig_dynamic: false for the host")
        todo = [g for g in gpus if g["current"] != want]
    else:
        mine = set(record.get("switched", []))
        todo = [g for g in gpus if g["bus_id"] in mine and g["current"] not in (want, "[N/A]")]
    switched = [g["bus_id"] for g in todo]
    if p["state"] == "disabled" and not todo and os.path.exists(p["record"]):
        if not module.check_mode:
            os.unlink(p["record"])  # nothing of ours is left in MIG mode
        module.exit_json(changed=True, gpus=gpus, switched=[], pending=[])
    if module.check_mode or not todo:
        module.exit_json(changed=bool(todo), gpus=gpus, switched=switched,
                         pending=[{"index": g["index"], "bus_id": g["bus_id"], "reason": "pending since before this run"}
                                  for g in gpus if g["pending"] != g["current"] and g not in todo])
    # the record follows each GPU as it switches: a failure on a later GPU (or a killed run) still leaves the ones
    # switched so far in it, for uninstall to turn back off
    # disabling: what is left of ours is the GPUs still to turn off (those already off leave the record)
    mine = set(record.get("switched", [])) if want == "Enabled" else set(switched)
    done = []  # type: list[str]
    for g in todo:
        if want == "Disabled":  # nos' instances go first, or the driver keeps MIG mode on
            for flag in ("-dci", "-dgi"):
                module.run_command([smi, "mig", "-i", str(g["index"]), flag], environ_update=ENV)
        try:
            g["messages"], now = switch(module, smi, g, want, p["reset"])
        except SwitchError as exc:
            module.fail_json(msg="%s%s" % (exc, "; switched before it: %s (in %s, for uninstall)"
                                           % (", ".join(done), p["record"]) if done else ""),
                             changed=bool(done), switched=done, gpus=gpus, pending=[])
        done.append(g["bus_id"])
        if want == "Enabled":
            mine.add(g["bus_id"])  # pending counts: the mode takes effect at the next reset or boot
        elif now == "Disabled":
            mine.discard(g["bus_id"])  # a disable left pending stays ours, to be tried again
        record["switched"] = sorted(mine)
        save(p["record"], record)
    after = {g["index"]: g for g in query(module, smi)}
    pending = []
    for g in gpus:
        seen = after[g["index"]]
        g["current"], g["pending"] = seen["current"], seen["pending"]
        if g["current"] != want and g in todo:
            pending.append({"index": g["index"], "bus_id": g["bus_id"],
                            "reason": "; ".join(g["messages"]) or "the driver left the mode pending"})
    module.exit_json(changed=True, gpus=gpus, switched=switched, pending=pending)


if __name__ == "__main__":
    main()
