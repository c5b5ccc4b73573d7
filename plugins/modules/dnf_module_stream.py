#!/usr/bin/python
# -*- coding: utf-8 -*-
"""One stream of a dnf module enabled exactly (RHEL 8/9: NVIDIA's nvidia-driver:<branch>-open | <branch>-dkms), and
the module put back as it was."""

DOCUMENTATION = r"""
module: dnf_module_stream
short_description: Enable exactly one stream of a dnf module (switching only through a reset), or put the module back
description:
  - Reads the streams of the module that the node's enabled repositories offer (C(dnf module list NAME)) and the
    module's state on the node (C(/etc/dnf/modules.d/NAME.module), the file dnf keeps it in).
  - O(state=enabled) - nothing when O(stream) is the enabled stream already. When the repositories offer no stream of
    the module at all (repositories without modules metadata: their packages are not modular), nothing changes and
    RV(offered) is empty; the caller installs the packages without a stream. When they offer the module but not
    O(stream), it fails naming the streams offered and changes nothing. Another stream of the module enabled is
    switched with C(dnf module reset NAME), then C(dnf module enable NAME:STREAM) (dnf refuses to switch an enabled
    stream otherwise); RV(switched_from) names it. A disabled module is enabled at O(stream).
  - O(state=reset) - when the module's enabled stream is O(stream) or one of O(also_streams) (the streams gpu-install
    enabled), C(dnf module reset NAME), then the state before gpu-install back (O(previous_state), O(previous_stream)):
    C(dnf module enable NAME:PREVIOUS) or C(dnf module disable NAME). Any other state (a stream someone enabled since,
    a reset module) is left alone.
  - Supports check mode (reports what it would run).
options:
  module: {type: str, required: true, description: the dnf module (nvidia-driver)}
  stream: {type: str, required: true, description: "enabled - the stream to enable; reset - the stream gpu-install enabled"}
  state: {type: str, default: enabled, choices: [enabled, reset]}
  also_streams: {type: list, elements: str, default: [], description: "reset - more streams that count as gpu-install's"}
  previous_state: {type: str, default: "", choices: ["", enabled, disabled], description: "reset - the module's state before gpu-install"}
  previous_stream: {type: str, default: "", description: "reset - the stream enabled before gpu-install (previous_state enabled)"}
  root: {type: path, default: /, description: "tests only - an installroot (dnf --installroot; its etc/dnf/modules.d)"}
  dnf_options: {type: list, elements: str, default: [], description: "tests only - more dnf options (--setopt=reposdir=...)"}
author: gpu-install
"""

RETURN = r"""
module: {description: O(module), returned: always, type: str}
stream: {description: O(stream), returned: always, type: str}
offered: {description: the streams of the module the repositories offer, returned: always, type: list}
before: {description: "the module's state before this run: {state, stream}", returned: always, type: dict}
switched_from: {description: the enabled stream a reset replaced with O(stream) (empty when none), returned: state=enabled, type: str}
msg: {description: what was done, in a sentence, returned: always, type: str}
"""

import os
import re

from ansible.module_utils.basic import AnsibleModule

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any  # noqa: F401

ENV = {"LC_ALL": "C", "LANG": "C"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$")
NOT_OFFERED = re.compile(r"No matching Modules to list|Unable to resolve argument|No such module", re.I)
FLAG = re.compile(r"\[([a-z])\]")


def parse_module_list(text, module):
    # type: (str, str) -> list[tuple[str, list[str]]]
    """(stream, flags) of each row of `dnf module list MODULE` naming the module, in dnf's order, each stream once:
    flags are the one-letter markers after the stream (d default, e enabled, x disabled). Repository headers, the
    table head, wrapped summaries and the hint line are not rows of the module."""
    out = []  # type: list[tuple[str, list[str]]]
    seen = set()  # type: set[str]
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] != module or parts[1].startswith("["):
            continue
        stream = parts[1]
        flags = []  # type: list[str]
        for word in parts[2:]:
            found = FLAG.findall(word)
            if not found or FLAG.sub("", word):
                break
            flags.extend(found)
        if stream not in seen:
            seen.add(stream)
            out.append((stream, flags))
    return out


def parse_state(text):
    # type: (str) -> dict[str, str]
    """The module's {state, stream} from dnf's /etc/dnf/modules.d/NAME.module (INI: state=enabled|disabled|'' and
    stream=...); empty values when the file says nothing."""
    values = {}  # type: dict[str, str]
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("state", "stream"):
            values[key.strip()] = value.strip()
    state = values.get("state", "")
    return {"state": state, "stream": values.get("stream", "") if state == "enabled" else ""}


def decide(wanted, offered, before):
    # type: (str, list[str], dict[str, str]) -> list[str]
    """state=enabled: the dnf module actions to run ([], ['enable'] or ['reset', 'enable']) for the wanted stream,
    the streams offered and the module's state before. Raises ValueError when the module is offered without the
    stream (offered empty: nothing to do, the repositories carry no module metadata)."""
    if not offered:
        return []
    if wanted not in offered:
        raise ValueError("stream %s is not offered (streams offered: %s)" % (wanted, ", ".join(offered)))
    if before["state"] == "enabled" and before["stream"] == wanted:
        return []
    if before["state"] == "enabled" and before["stream"]:
        return ["reset", "enable"]
    return ["enable"]


def restore(stream, also, before, previous_state, previous_stream):
    # type: (str, list[str], dict[str, str], str, str) -> list[tuple[str, str]]
    """state=reset: the (action, argument) pairs that put the module back as it was before gpu-install, when its
    enabled stream is one gpu-install enabled ([] otherwise: someone else's state stays)."""
    if before["state"] != "enabled" or before["stream"] not in [stream] + list(also):
        return []
    steps = [("reset", "")]
    if previous_state == "enabled" and previous_stream and previous_stream != before["stream"]:
        steps.append(("enable", previous_stream))
    elif previous_state == "disabled":
        steps.append(("disable", ""))
    elif previous_state == "enabled" and previous_stream == before["stream"]:
        return []  # it was enabled at this stream before gpu-install: it stays
    return steps


class Dnf:
    def __init__(self, module, root, options):
        # type: (AnsibleModule, str, list[str]) -> None
        self.module = module
        self.root = root or "/"
        self.base = [module.get_bin_path("dnf", required=True)] + (
            ["--installroot=" + self.root] if self.root != "/" else []) + list(options)

    def run(self, args, what):
        # type: (list[str], str) -> str
        argv = self.base + args
        rc, out, err = self.module.run_command(argv, environ_update=ENV)
        if rc != 0:
            self.module.fail_json(msg="%s failed (exit %d): %s" % (what, rc, (err or out).strip()[-800:]),
                                  argv=argv)
        return str(out)

    def offered(self, name):
        # type: (str) -> list[str]
        argv = self.base + ["-q", "module", "list", name]
        rc, out, err = self.module.run_command(argv, environ_update=ENV)
        if rc != 0:
            if NOT_OFFERED.search(out + err):
                return []
            self.module.fail_json(msg="dnf module list %s failed (exit %d): %s" % (name, rc, (err or out).strip()[-800:]),
                                  argv=argv)
        return [s for s, _ in parse_module_list(out, name)]

    def state(self, name):
        # type: (str) -> dict[str, str]
        path = os.path.join(self.root, "etc", "dnf", "modules.d", name + ".module")
        if not os.path.isfile(path):
            return {"state": "", "stream": ""}
        with open(path) as fh:
            return parse_state(fh.read(65536))


def main():
    # type: () -> None
    module = AnsibleModule(
        argument_spec=dict(
            module=dict(type="str", required=True),
            stream=dict(type="str", required=True),
            state=dict(type="str", default="enabled", choices=["enabled", "reset"]),
            also_streams=dict(type="list", elements="str", default=[]),
            previous_state=dict(type="str", default="", choices=["", "enabled", "disabled"]),
            previous_stream=dict(type="str", default=""),
            root=dict(type="path", default="/"),
            dnf_options=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    name, stream = p["module"], p["stream"]
    for field, value in [("module", name), ("stream", stream), ("previous_stream", p["previous_stream"] or "x")] + [
            ("also_streams", s) for s in p["also_streams"]]:
        if not NAME.match(value):
            module.fail_json(msg="%s %r is not a dnf module or stream name" % (field, value))
    dnf = Dnf(module, p["root"], p["dnf_options"])
    before = dnf.state(name)
    spec = "%s:%s" % (name, stream)

    def done(**result):
        # type: (Any) -> None
        module.exit_json(module=name, stream=stream, before=before, **result)

    if p["state"] == "reset":
        steps = restore(stream, p["also_streams"], before, p["previous_state"], p["previous_stream"])
        if not steps:
            now = ("stream %s enabled" % before["stream"]) if before["state"] == "enabled" else (
                before["state"] or "no stream enabled")
            done(changed=False, offered=[], msg="%s: %s, not a stream gpu-install enabled: left as it is" % (name, now))
        ran = []
        for action, arg in steps:
            target = "%s:%s" % (name, arg) if arg else name
            ran.append("dnf module %s %s" % (action, target))
            if not module.check_mode:
                dnf.run(["-y", "-q", "module", action, target], ran[-1])
        done(changed=True, offered=[], msg="%s: stream %s put back (%s)" % (name, before["stream"], "; ".join(ran)))

    offered = dnf.offered(name)
    try:
        actions = decide(stream, offered, before)
    except ValueError as exc:
        module.fail_json(msg="%s: %s in the node's enabled repositories; nothing was changed" % (spec, exc),
                         offered=offered, before=before,
                         hint="publish the repository that has it (mirror pull with the driver branch and kernel "
                              "modules flavour of the site, then mirror push), or set driver.version / "
                              "driver.kernelModuleType to an offered stream")
    if not offered:
        done(changed=False, offered=[], switched_from="",
             msg="the node's repositories offer no %s module (no modules metadata): the packages are installed "
                 "without a stream" % name)
    if not actions:
        done(changed=False, offered=offered, switched_from="", msg="%s: enabled already" % spec)
    switched = before["stream"] if "reset" in actions else ""
    if not module.check_mode:
        if switched:
            dnf.run(["-y", "-q", "module", "reset", name], "dnf module reset %s" % name)
        dnf.run(["-y", "-q", "module", "enable", spec], "dnf module enable %s" % spec)
    msg = ("%s: enabled, switched from stream %s (dnf module reset %s first)" % (spec, switched, name) if switched
           else "%s: enabled" % spec + (" (the module was disabled)" if before["state"] == "disabled" else ""))
    done(changed=True, offered=offered, switched_from=switched, msg=msg)


if __name__ == "__main__":
    main()
