#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Wait until the kube-scheduler of a given command line runs, stays up and answers /healthz."""

DOCUMENTATION = r"""
module: scheduler_wait
short_description: Wait for a healthy kube-scheduler started from the current static-pod manifest
description:
  - Looks in /proc for a kube-scheduler process whose arguments are exactly C(command)[1:] (static-pod
    containers are processes in the host's view, with a real kubelet too), started no earlier than C(since).
  - Succeeds once one such process has stayed up for C(stable_seconds) and https://C(host):C(port)/healthz
    (self-signed serving certificate, not verified) answered ok C(successes) times in a row.
  - On timeout fails with what was seen and the scheduler's last complaint from its log (C(log_glob)).
  - Read-only; in check mode it does nothing.
options:
  command: {type: list, elements: str, required: true, description: the container's command + args}
  since: {type: float, default: 0, description: epoch seconds; older processes do not count}
  port: {type: int, default: 10259, description: secure port (--secure-port)}
  host: {type: str, default: 127.0.0.1, description: address for /healthz (--bind-address; 0.0.0.0 -> 127.0.0.1)}
  timeout: {type: int, default: 120, description: seconds}
  stable_seconds: {type: float, default: 10, description: how long the process must stay up}
  successes: {type: int, default: 3, description: consecutive ok /healthz answers}
  interval: {type: float, default: 1, description: seconds between checks}
  max_restarts: {type: int, default: 3, description: "give up early once that many matching processes exited (crash loop; 0: never)"}
  log_glob: {type: str, default: '', description: glob of the scheduler's log files (for the complaint)}
author: gpu-install
"""

RETURN = r"""
pid: {description: the healthy scheduler's pid, returned: success, type: int}
waited: {description: seconds waited, returned: always, type: float}
complaint: {description: last error lines of the scheduler's log, returned: failure, type: str}
"""

import glob
import os
import re
import ssl
import sys
import time

from ansible.module_utils.basic import AnsibleModule

if sys.version_info >= (3,):
    from urllib.request import urlopen
else:  # pragma: no cover
    from urllib2 import urlopen

_KLOG = re.compile(r"^[IWEF]\d{4} ")
_NOISE = ("configmap_cafile_content.go", "requestheader_controller")


def _boot_time():
    # type: () -> int
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime "):
                return int(line.split()[1])
    return 0


def processes(binary="kube-scheduler"):
    # type: (str) -> list[tuple[int, list[str], float]]
    """[(pid, argv, start epoch)] of the processes whose argv[0] is .../<binary>."""
    out = []
    hz = os.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as fh:
                argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0")[:-1]]
            if not argv or os.path.basename(argv[0]) != binary:
                continue
            with open("/proc/%s/stat" % entry) as fh:
                stat = fh.read()
        except (IOError, OSError):
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        out.append((int(entry), argv, boot + int(fields[19]) / float(hz)))
    return out


def matching(command, since):
    # type: (list[str], float) -> tuple[int, float] | None
    want = [str(a) for a in command[1:]]
    name = os.path.basename(str(command[0]))
    found = [(pid, start) for pid, argv, start in processes(name) if argv[1:] == want and start >= since - 1.0]
    return sorted(found, key=lambda x: x[1])[-1] if found else None


def healthz(host, port):
    # type: (str, int) -> bool
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the scheduler's self-signed serving certificate, on loopback
    try:
        resp = urlopen("https://%s:%d/healthz" % (host, port), context=ctx, timeout=3)
        return bool(resp.getcode() == 200 and resp.read().decode("utf-8", "replace").strip() == "ok")
    except Exception:
        return False


def log_sizes(log_glob):
    # type: (str) -> dict[str, int]
    sizes = {}
    for f in glob.glob(log_glob) if log_glob else []:
        try:
            sizes[f] = os.path.getsize(f)
        except OSError:
            pass
    return sizes


def complaint(log_glob, since_sizes=None, lines=4):
    # type: (str, dict[str, int] | None, int) -> str
    """The last error lines written since since_sizes ({file: size}) to the newest log file matching log_glob."""
    files = sorted(glob.glob(log_glob), key=os.path.getmtime) if log_glob else []
    if not files:
        return ""
    try:
        with open(files[-1], "rb") as fh:
            fh.seek(0, 2)
            end = fh.tell()
            fh.seek(max((since_sizes or {}).get(files[-1], 0) if (since_sizes or {}).get(files[-1], 0) <= end else 0,
                        end - 65536))
            text = fh.read().decode("utf-8", "replace")
    except (IOError, OSError):
        return ""
    picked = []
    for line in text.splitlines():
        msg = re.sub(r"^\S+ (stdout|stderr) [FP] ", "", line.strip())  # CRI log lines: "<time> stderr F <msg>"
        if not msg or msg.startswith(("----", "Trace[")) or line[:1].isspace() or any(n in msg for n in _NOISE):
            continue
        if msg[:1] in ("E", "F") and _KLOG.match(msg) or not _KLOG.match(msg):
            picked.append(msg)
    unique = []
    for msg in reversed(picked):  # the same complaint repeats on every restart: keep each once, newest last
        if msg not in unique:
            unique.append(msg)
    return "\n".join(reversed(unique[:lines]))


def main():
    # type: () -> None
    module = AnsibleModule(
        argument_spec=dict(
            command=dict(type="list", elements="str", required=True),
            since=dict(type="float", default=0),
            port=dict(type="int", default=10259),
            host=dict(type="str", default="127.0.0.1"),
            timeout=dict(type="int", default=120),
            stable_seconds=dict(type="float", default=10),
            successes=dict(type="int", default=3),
            interval=dict(type="float", default=1),
            max_restarts=dict(type="int", default=3),
            log_glob=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="check mode: not waiting")
    host = p["host"] if p["host"] not in ("", "0.0.0.0", "::") else "127.0.0.1"
    sizes = log_sizes(p["log_glob"])
    t0 = time.time()
    deadline = t0 + p["timeout"]
    current, first_seen, oks, seen, exits = None, 0.0, 0, [], 0
    state = "no kube-scheduler with the new command line started"
    while time.time() < deadline:
        found = matching(p["command"], p["since"])
        now = time.time()
        if found is None:
            if current is not None:
                state = "pid %d exited" % current
                exits += 1
            current, oks = None, 0
            if p["max_restarts"] and exits >= p["max_restarts"]:
                state = "it keeps exiting (crash loop, %d exits)" % exits
                break
        else:
            pid = found[0]
            if pid != current:
                if current is not None:
                    exits += 1  # replaced between two looks
                current, first_seen, oks = pid, now, 0
                seen.append(pid)
            if healthz(host, p["port"]):
                oks += 1
            else:
                oks = 0
                state = "pid %d runs but https://%s:%d/healthz does not answer ok" % (pid, host, p["port"])
            if oks >= p["successes"] and now - first_seen >= p["stable_seconds"]:
                module.exit_json(changed=False, pid=pid, waited=round(now - t0, 1))
        time.sleep(p["interval"])
    module.fail_json(msg="%s (waited %ds)" % (state, time.time() - t0),
                     complaint=complaint(p["log_glob"], sizes), waited=round(time.time() - t0, 1), pids=seen)


if __name__ == "__main__":
    main()
