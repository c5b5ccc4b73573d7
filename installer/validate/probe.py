"""Node layer: one SSH session per GPU node (paramiko, all nodes at once, a timeout per node) running a read-only
probe, then installer/validate/nvsmi.py and node.py on what it printed.

The connection comes from the inventory as Ansible would use it: ansible_host, ansible_port, ansible_user,
ansible_ssh_private_key_file, ansible_password / ansible_ssh_pass (never logged), and from ansible_ssh_common_args
and ansible_ssh_extra_args (both, in that order, the first value of an option winning, as ssh reads what Ansible
passes it) `-o UserKnownHostsFile=…`, `-o GlobalKnownHostsFile=…`, `-o StrictHostKeyChecking=yes|accept-new|no`,
`-o ProxyJump=…` / `-J …` and `-o ProxyCommand=…`. Host keys are checked as OpenSSH checks them
(installer/validate/knownhosts.py).

The probe needs no root except for the operator's driver container: with no nvidia-smi on the PATH it tries
`sudo -n chroot /run/nvidia/driver nvidia-smi` (where the GPU Operator's driver container puts the driver).
"""

from __future__ import annotations

import getpass
import shlex
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from installer.validate.report import Check, Status

LAYER = "node"
MARK = "__gpu_install_probe__"
PROBE = f"""
M={MARK}
echo "$M nvidia-smi"
if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -q -x 2>&1; echo "$M rc $?"
elif [ -x /run/nvidia/driver/usr/bin/nvidia-smi ]; then sudo -n chroot /run/nvidia/driver nvidia-smi -q -x 2>&1; echo "$M rc $?"
else echo "$M rc 127"; fi
echo "$M lspci"
if command -v lspci >/dev/null 2>&1; then lspci -D 2>/dev/null
else
  for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    case "$(cat "$d/class" 2>/dev/null)" in
      0x0300*) echo "${{d##*/}} VGA compatible controller: NVIDIA Corporation";;
      0x0302*) echo "${{d##*/}} 3D controller: NVIDIA Corporation";;
      0x0380*) echo "${{d##*/}} Display controller: NVIDIA Corporation";;
    esac
  done
fi
echo "$M modules"
cut -d' ' -f1 /proc/modules 2>/dev/null | grep -E '^(nvidia|nouveau)' || true
echo "$M secureboot"
mokutil --sb-state 2>/dev/null || true
echo "$M reboot"
[ -e /var/run/reboot-required ] && echo required || true
echo "$M signer"
PATH="$PATH:/usr/sbin:/sbin" modinfo -F signer nvidia 2>/dev/null | head -n 1 || true
echo "$M sig_key"
PATH="$PATH:/usr/sbin:/sbin" modinfo -F sig_key nvidia 2>/dev/null | head -n 1 || true
echo "$M module"
[ -d /sys/module/nvidia ] && echo loaded || true
""" + r"""
bins=nvidia-container-runtime
asroot() { if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then sudo -n "$@" 2>&1; else "$@" 2>&1; fi; }
echo "$M containerd"
if command -v containerd >/dev/null 2>&1; then
  out=$(asroot containerd config dump); s=$?; printf '%s\n' "$out"; echo "$M status containerd $s"
  bins="$bins $(printf '%s\n' "$out" | sed -n 's/^ *BinaryName *= *"\([^"]*\)".*/\1/p' | tr '\n' ' ')"
else echo "$M status containerd 127"; fi
echo "$M docker"
if command -v docker >/dev/null 2>&1; then
  out=$(asroot docker info --format '{{json .}}'); s=$?; printf '%s\n' "$out"; echo "$M status docker $s"
  bins="$bins $(printf '%s\n' "$out" | grep -o '"path":"[^"]*"' | sed 's/"path":"\(.*\)"/\1/' | tr '\n' ' ')"
else echo "$M status docker 127"; fi
echo "$M binaries"
for b in $bins; do p=$(command -v "$b" 2>/dev/null) && echo "ok $b $p" || echo "missing $b"; done
echo "$M cdi"
for d in /etc/cdi /var/run/cdi; do
  for f in "$d"/*.yaml "$d"/*.yml "$d"/*.json; do
    [ -f "$f" ] && echo "$f $(grep -o -m1 'nvidia.com/gpu' "$f" 2>/dev/null)"
  done
done
echo "$M end"
"""


@dataclass(frozen=True)
class Target:
    host: str  # inventory host
    node: str  # Kubernetes node name (the report's row)
    vars: Mapping[str, Any]


@dataclass(frozen=True)
class Probe:
    sections: dict[str, str]
    nvidia_smi_rc: int
    statuses: dict[str, int] = field(default_factory=dict)  # `$M status NAME N` lines: exit statuses by name


def ssh_options(*args: str | None) -> dict[str, str]:
    """-o Key=Value / -oKey=Value / -o 'Key Value' / -J x of the argument strings (ansible_ssh_common_args, then
    ansible_ssh_extra_args: the order Ansible puts them on ssh's command line) as {lowercased key: value}, read as
    OpenSSH reads its command line: the FIRST value given for an option is the one in effect (a later -o of the same
    option is ignored), and ProxyJump (-J) and ProxyCommand compete -- whichever comes first keeps the other out.
    Words are split as Ansible splits them (shlex)."""
    out: dict[str, str] = {}
    words = [w for a in args for w in shlex.split(a or "")]
    i = 0
    while i < len(words):
        w = words[i]
        if w in ("-o", "-J") and i + 1 < len(words):
            value = words[i + 1]
            i += 2
        elif w.startswith("-o") or w.startswith("-J"):
            value = w[2:]
            i += 1
        else:
            i += 1
            continue
        if w.startswith("-J"):
            k, v = "proxyjump", value
        elif "=" in value:
            k, v = value.split("=", 1)
        elif " " in value:
            k, v = value.split(" ", 1)
        else:
            continue
        k, v = k.strip().lower(), v.strip()
        if k in out or (k in ("proxyjump", "proxycommand") and ("proxyjump" in out or "proxycommand" in out)):
            continue  # OpenSSH: the first obtained value wins (ssh_config(5)); ProxyJump/ProxyCommand compete
        out[k] = v
    return out


def _split_userhost(spec: str, default_user: str) -> tuple[str, str, int]:
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, 22
    if hostport.count(":") == 1:
        host, p = hostport.split(":")
        port = int(p)
    return user or default_user, host, port


def connect(t: Target, timeout: float) -> Any:
    """An SSH session to the target, its host key checked as OpenSSH would (installer/validate/knownhosts.py): nothing
    is sent before the key is accepted, and no known_hosts file is ever rewritten."""
    import paramiko

    from installer.validate.knownhosts import KnownHosts

    v = t.vars
    # Ansible's ssh connection plugin (ansible/plugins/connection/ssh.py, Connection._build_command: the loop over
    # ('ssh_common_args', '{subsystem}_extra_args')) puts the common args on ssh's command line first, then the extra
    # args, each split with shlex; ssh then keeps the first value of each option
    opts = ssh_options(v.get("ansible_ssh_common_args"), v.get("ansible_ssh_extra_args"))
    known = KnownHosts.from_options(opts)
    user = str(v.get("ansible_user") or getpass.getuser())
    key = v.get("ansible_ssh_private_key_file")
    password = v.get("ansible_password") or v.get("ansible_ssh_pass")
    address = str(v.get("ansible_host") or t.host)
    port = int(v.get("ansible_port") or 22)
    sock: Any = None
    if opts.get("proxycommand"):
        cmd = opts["proxycommand"].replace("%h", address).replace("%p", str(port)).replace("%r", user)
        sock = paramiko.ProxyCommand(cmd)
    elif opts.get("proxyjump"):
        juser, jhost, jport = _split_userhost(opts["proxyjump"].split(",")[0], user)
        jump = paramiko.SSHClient()
        known.prepare(jump, jhost, jport)
        _checked(known, jhost, jport, lambda: jump.connect(
            jhost, jport, juser, key_filename=str(Path(key).expanduser()) if key else None,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout))
        transport = jump.get_transport()
        assert transport is not None
        sock = transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=timeout)
    client = paramiko.SSHClient()
    known.prepare(client, address, port)
    _checked(known, address, port, lambda: client.connect(
        address, port, user, password=str(password) if password else None,
        key_filename=str(Path(str(key)).expanduser()) if key else None, look_for_keys=not key,
        timeout=timeout, banner_timeout=timeout, auth_timeout=timeout, sock=sock))
    return client


def _checked(known: Any, host: str, port: int, connect: Callable[[], None]) -> None:
    """connect(), a changed host key told apart from a revoked one (both refused before anything is sent)."""
    import paramiko

    from installer.validate.knownhosts import HostKeyRefused, fingerprint, hostkey_name

    try:
        connect()
    except paramiko.BadHostKeyException as exc:
        name = hostkey_name(host, port)
        known.refuse_revoked(name, exc.key)
        raise HostKeyRefused(
            f"{name}: its host key has CHANGED: it presented {fingerprint(exc.key)}, known_hosts "
            f"({known.files()}) lists {fingerprint(exc.expected_key)}: refused",
            "if the node was reinstalled, check its new key (ssh-keygen -lf on the node), remove the old line "
            f"(ssh-keygen -R '{name}' -f FILE) and add the new one; otherwise someone may be in between") from None


def run_probe(t: Target, timeout: float) -> Probe:
    client = connect(t, timeout)
    try:
        _, stdout, _ = client.exec_command(f"sh -c {shlex.quote(PROBE)}", timeout=timeout)
        text = stdout.read().decode("utf-8", "replace")
        stdout.channel.recv_exit_status()
    finally:
        client.close()
    return parse_probe(text)


def unreachable(t: Target, exc: BaseException) -> tuple[str, str]:
    """(message, fix) of a node that could not be reached or read over SSH: a host key refused (nothing was sent), a
    refused login, a timeout, refused connection, no route, DNS or a bad port."""
    import paramiko

    from installer.validate.knownhosts import HostKeyRefused

    if isinstance(exc, HostKeyRefused):  # unknown, changed or revoked: nothing was sent to the node
        return f"{t.host}: SSH: {exc.message}", exc.hint or ""
    if isinstance(exc, paramiko.SSHException):
        return (f"{t.host}: SSH: {exc}",
                "check ansible_user / ansible_ssh_private_key_file / ansible_password in the inventory")
    return (f"{t.host} ({t.vars.get('ansible_host') or t.host}): {type(exc).__name__}: {exc}",
            "is the node up and its sshd reachable from here (ansible_host, ansible_port, jump host)?")


def run_bounded(t: Target, command: str, timeout: float, limit: int) -> bytes:
    """What `command` prints on the node (stdout and stderr together), read through connect() -- at most limit + 1
    bytes (the reader stops there and closes the session: a caller sees that it was more), within timeout seconds in
    all for the command (TimeoutError after)."""
    client = connect(t, timeout)
    try:
        transport = client.get_transport()
        assert transport is not None
        chan = transport.open_session(timeout=timeout)
        chan.set_combine_stderr(True)
        chan.settimeout(timeout)
        chan.exec_command(command)
        deadline = time.monotonic() + timeout
        out = bytearray()
        while len(out) <= limit:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no complete answer within {timeout:g} s")
            data = chan.recv(min(65536, limit + 1 - len(out)))
            if not data:
                break
            out += data
        return bytes(out)
    finally:
        client.close()


def parse_probe(text: str) -> Probe:
    sections: dict[str, list[str]] = {}
    current = None
    rc = None
    statuses: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(MARK + " "):
            word = line[len(MARK) + 1:].split()
            if word and word[0] == "rc" and len(word) > 1:
                rc = int(word[1])
                continue
            if word and word[0] == "status" and len(word) > 2:
                statuses[word[1]] = int(word[2])
                continue
            current = word[0] if word else None
            if current:
                sections[current] = []
            continue
        if current:
            sections[current].append(line)
    if "end" not in sections or rc is None:
        raise ValueError("the probe's output is incomplete (the session ended early)")
    return Probe({k: "\n".join(v) for k, v in sections.items()}, rc, statuses)


def checks_for(t: Target, probe: Probe, expect: Any, seconds: float, *, result: Any = None,
               via: str = "nvidia-smi") -> list[Check]:
    """The node's Checks: one per node check id (pass when it found nothing), one per finding. result: the GPU facts
    when they were read another way (validate --local: NVML; an NvidiaSmi, DriverNotLoaded or NvidiaSmiError), else
    the probe's `nvidia-smi -q -x` is parsed."""
    from installer.validate import node as nodecheck
    from installer.validate.nvsmi import DriverNotLoaded, NvidiaSmiError, parse_output

    def check(check_id: str, status: Any, message: str, fix: str = "", gpu: str | None = None) -> Check:
        return Check(LAYER, check_id, t.node, status, message, fix, gpu, seconds)

    if result is None and probe.nvidia_smi_rc == 127:
        return [check("node.nvidia-smi", "fail", f"{t.host}: nvidia-smi not found (not on the PATH, no "
                      "/run/nvidia/driver from the operator's driver container)",
                      "install the driver (driver.mode host/runfile: gpu-install apply) or, in operator driver mode, "
                      "check the nvidia-driver-daemonset pod on this node")]
    pci = nodecheck.nvidia_pci_devices(probe.sections.get("lspci", ""))
    modules = probe.sections.get("modules", "").split()
    if result is None:
        try:
            result = parse_output(probe.sections.get("nvidia-smi", ""), probe.nvidia_smi_rc)
        except NvidiaSmiError as exc:
            result = exc
    if isinstance(result, NvidiaSmiError):
        return [check("node.nvidia-smi", "fail", f"{t.host}: {result.message}", result.hint or "")]
    findings = nodecheck.check_node(
        t.host, result, expect, pci_devices=pci if probe.sections.get("lspci", "").strip() else None,
        nouveau_loaded="nouveau" in modules, secure_boot="SecureBoot enabled" in probe.sections.get("secureboot", ""),
        reboot_required="required" in probe.sections.get("reboot", ""))
    signer = getattr(expect, "signer", None)
    if signer is not None:  # driver.secureBoot: node.driver.signer
        findings += nodecheck.signer_check(
            t.host, probe.sections.get("signer", ""), probe.sections.get("sig_key", ""), signer.certificate,
            "loaded" in probe.sections.get("module", "").split(), canonical_ok=signer.canonical_ok)
    out: list[Check] = []
    if isinstance(result, DriverNotLoaded):
        out.append(check("node.nvidia-smi", "fail", f"{t.host}: {via} ran, the driver is not loaded"))
    else:
        out.append(check("node.nvidia-smi", "pass", f"{len(result.gpus)} GPU(s), driver {result.driver_version}, "
                                                    f"CUDA {result.cuda_version}" + (f" ({via})" if via != "nvidia-smi"
                                                                                      else "")))
        found = {f.check for f in findings}
        out += [check(c, "pass", "ok") for c in nodecheck.CHECKS if c not in found and c != "node.driver.not-loaded"]
    status = {"error": "fail", "warning": "warn", "info": "pass"}
    for f in findings:
        gpu = str(f.gpu_index) if f.gpu_index is not None else None
        out.append(check(f.check, status[f.severity], f.message, f.fix if f.severity != "info" else "", gpu))
    return out


def runtime_checks_for(t: Target, probe: Probe, expect: Any, seconds: float) -> list[Check]:
    """The runtime layer's Checks for one node (installer/validate/runtime.py): one per check id."""
    from installer.validate import runtime

    findings = runtime.check_runtime(t.host, probe.sections, probe.statuses, expect)
    found = {f.check for f in findings}
    status: dict[str, Status] = {"error": "fail", "warning": "warn", "info": "pass"}
    skipped = {"runtime.nvidia", "runtime.binary", "runtime.default", "runtime.cdi"} if "runtime.present" in found \
        else {"runtime.binary"} if "runtime.nvidia" in found else set()
    out = [Check("runtime", c, t.node, "pass", _passed(c, expect), seconds=seconds) for c in runtime.CHECKS
           if c not in found and c not in skipped and (c != "runtime.default" or expect.default)
           and (c != "runtime.cdi" or expect.cdi)]
    out += [Check("runtime", f.check, t.node, status[f.severity], f.message, f.fix, seconds=seconds) for f in findings]
    return out


def _passed(check: str, expect: Any) -> str:
    return {"runtime.present": f"{expect.runtime} answers",
            "runtime.nvidia": f"runtime {expect.name} configured",
            "runtime.binary": "its binary is on the node",
            "runtime.default": f"{expect.name} is the default runtime",
            "runtime.cdi": "a CDI spec declares nvidia.com/gpu"}.get(check, "ok")


def run(targets: list[Target], expectations: Callable[[Target], Any], timeout: float = 60.0,
        progress: Callable[[str], None] | None = None, *, layers: tuple[str, ...] = ("node",),
        runtime_expect: Callable[[Target], Any] | None = None, facts: dict[str, Any] | None = None) -> list[Check]:
    """Probe every target at once (one SSH session each, for the node and the runtime layer); an unreachable one is
    a Check with status 'unreachable' (exit 5). facts, when given, collects node -> NvidiaSmi of every node whose
    nvidia-smi could be read (for the cluster layer's counts)."""
    import paramiko

    from installer.validate.knownhosts import HostKeyRefused

    layer = "node" if "node" in layers else "runtime"

    def one(t: Target) -> list[Check]:
        t0 = time.monotonic()
        try:
            probe = run_probe(t, timeout)
        except (paramiko.SSHException, HostKeyRefused, OSError, ValueError) as exc:
            message, hint = unreachable(t, exc)
            return [Check(layer, "node.reachable", t.node, "unreachable", message, hint,
                          seconds=time.monotonic() - t0)]
        seconds = time.monotonic() - t0
        out = [Check(layer, "node.reachable", t.node, "pass", f"SSH to {t.vars.get('ansible_host') or t.host}",
                     seconds=seconds)]
        if "node" in layers:
            out += checks_for(t, probe, expectations(t), seconds)
            if facts is not None:
                from installer.validate.nvsmi import NvidiaSmi, NvidiaSmiError, parse_output

                try:
                    result = parse_output(probe.sections.get("nvidia-smi", ""), probe.nvidia_smi_rc)
                except NvidiaSmiError:
                    result = None
                if isinstance(result, NvidiaSmi):
                    facts[t.node] = result
        if "runtime" in layers and runtime_expect is not None:
            out += runtime_checks_for(t, probe, runtime_expect(t), seconds)
        if progress:
            bad = sum(c.status in ("fail", "unreachable") for c in out)
            progress(f"node: {t.node}: {'ok' if not bad else f'{bad} failed check(s)'} ({seconds:.1f}s)")
        return out

    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
        return [c for checks in pool.map(one, targets) for c in checks]
