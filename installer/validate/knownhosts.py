"""OpenSSH's host key rules for validate's paramiko sessions (ssh_config(5) StrictHostKeyChecking, UserKnownHostsFile,
GlobalKnownHostsFile; sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT").

- Known keys come from GlobalKnownHostsFile (default /etc/ssh/ssh_known_hosts, ssh_known_hosts2) and
  UserKnownHostsFile (default ~/.ssh/known_hosts, known_hosts2; a UserKnownHostsFile given *replaces* the default).
  Host patterns (`*`, `?`, `!negation`, comma lists), `[host]:port` names and hashed names (`|1|salt|hash`) match as
  in OpenSSH.
- A known host whose key differs is refused whatever StrictHostKeyChecking says.
- An unknown host: `yes` (the default; also `ask`, which has no one to ask here) refuses it, naming the host and the
  fix; `accept-new` accepts it and appends it to the first UserKnownHostsFile given -- and to no other file: without
  a UserKnownHostsFile the key is accepted for this run only; `no`/`off` accepts it and saves it nowhere.
- `@revoked` lines: a key they list is refused, for every host and whatever StrictHostKeyChecking says.
- `@cert-authority` lines are not used: paramiko checks no host certificates, so a host known only through a CA is
  an unknown host (the refusal says so). They are never an error.
- A known_hosts file is never rewritten: a new key is appended (comments and every other line stay as they were).
  Lines that cannot be read (a key type paramiko does not know, bad base64) are skipped, as OpenSSH skips them.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

GLOBAL_DEFAULT = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
USER_DEFAULT = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
MAX_FILE_BYTES = 16 << 20  # a known_hosts of 100 000 hosts is ~10 MB; more is not a known_hosts file

_append_lock = threading.Lock()  # validate probes every node at once: one append at a time


class HostKeyRefused(paramiko.SSHException):  # type: ignore[misc]
    """The host key was not accepted (before any credential was sent). message + hint, like GpuInstallError."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def hostkey_name(host: str, port: int) -> str:
    """The name known_hosts lists a host under: `host`, or `[host]:port` off port 22."""
    return host if port == 22 else f"[{host}]:{port}"


def fingerprint(key: Any) -> str:
    return f"{key.get_name()} {key.fingerprint}"  # e.g. ssh-ed25519 SHA256:…, as ssh-keygen -lf shows it


@dataclass(frozen=True)
class Entry:
    marker: str  # "", "@revoked" or "@cert-authority"
    patterns: str
    key: Any  # paramiko.PKey
    where: str  # file:line


def _glob(pattern: str, name: str) -> bool:
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name) is not None


def _hashed(pattern: str, name: str) -> bool:
    parts = pattern.split("|")  # "", "1", salt, hash
    if len(parts) != 4:
        return False
    try:
        salt = base64.b64decode(parts[2], validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(salt) != 20:  # HMAC-SHA1's size, as OpenSSH writes it
        return False
    return bool(paramiko.HostKeys.hash_host(name, parts[2]) == pattern)


def matches(patterns: str, name: str) -> bool:
    """OpenSSH's match_hostname: a comma list of patterns; a negated one that matches rules the line out."""
    name = name.lower()
    if patterns.startswith("|1|"):
        return _hashed(patterns, name)
    hit = False
    for p in patterns.lower().split(","):
        if p.startswith("!"):
            if _glob(p[1:], name):
                return False
        elif p and _glob(p, name):
            hit = True
    return hit


def _parse_key(keytype: str, b64: str) -> Any:
    try:
        return paramiko.PKey.from_type_string(keytype, base64.b64decode(b64, validate=True))
    except (binascii.Error, ValueError, paramiko.SSHException, paramiko.pkey.UnknownKeyType, TypeError, IndexError):
        return None  # a type paramiko cannot use (a security-key type), or a damaged line: skipped


def read_entries(path: Path) -> list[Entry]:
    """The usable lines of one known_hosts file ([] when it does not exist or is not a small regular file)."""
    try:
        st = path.stat()
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_FILE_BYTES:
        return []  # /dev/null (the usual "no file"), a FIFO: nothing to read
    try:
        text = path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return []
    out: list[Entry] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        marker = ""
        if words[0].startswith("@"):
            marker, words = words[0].lower(), words[1:]
            if marker not in ("@revoked", "@cert-authority"):
                continue  # an unknown marker: OpenSSH ignores the line
        if len(words) < 3:
            continue
        key = _parse_key(words[1], words[2])
        if key is not None:
            out.append(Entry(marker, words[0], key, f"{path}:{n}"))
    return out


def _paths(value: str | None, default: tuple[str, ...]) -> list[Path]:
    words = value.split() if value else list(default)
    if [w.lower() for w in words] == ["none"]:
        return []
    return [Path(w).expanduser() for w in words]


@dataclass
class KnownHosts:
    """The host key rules of one ssh_options() set (see the module docstring)."""

    strict: str  # "yes" | "accept-new" | "no"
    user_files: list[Path]
    global_files: list[Path]
    save_to: Path | None  # accept-new: the first UserKnownHostsFile given (None: the default files are never written)
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def from_options(cls, opts: dict[str, str]) -> KnownHosts:
        raw = (opts.get("stricthostkeychecking") or "yes").lower()
        strict = "no" if raw in ("no", "off", "false") else "accept-new" if raw == "accept-new" else "yes"
        given = opts.get("userknownhostsfile")
        user = _paths(given, USER_DEFAULT)
        glob = _paths(opts.get("globalknownhostsfile"), GLOBAL_DEFAULT)
        kh = cls(strict, user, glob, user[0] if given and user else None)
        for path in glob + user:
            kh.entries += read_entries(path)
        return kh

    def files(self) -> str:
        return ", ".join(str(p) for p in self.user_files + self.global_files) or "none"

    def known(self, name: str) -> list[Any]:
        """The keys listed for name, less any that an @revoked line lists."""
        return [e.key for e in self.entries if not e.marker and matches(e.patterns, name) and not self.revoked(e.key)]

    def revoked(self, key: Any) -> Entry | None:
        blob = key.asbytes()
        return next((e for e in self.entries if e.marker == "@revoked" and e.key.asbytes() == blob), None)

    def authorities(self, name: str) -> list[Entry]:
        return [e for e in self.entries if e.marker == "@cert-authority" and matches(e.patterns, name)]

    def prepare(self, client: Any, host: str, port: int) -> None:
        """Give client (a paramiko.SSHClient with nothing loaded) the known keys of host:port and this policy."""
        name = hostkey_name(host, port)
        keys = client.get_host_keys()
        for key in self.known(name):
            keys.add(name, key.get_name(), key)
        client.set_missing_host_key_policy(_Policy(self))

    def refuse_revoked(self, name: str, key: Any) -> None:
        entry = self.revoked(key)
        if entry is not None:
            raise HostKeyRefused(
                f"{name}: the host key it presented ({fingerprint(key)}) is marked @revoked ({entry.where}): refused",
                "a revoked key is never accepted: give the node a new host key (ssh-keygen -A on the node after "
                "removing the old one), then replace its known_hosts line")

    def missing(self, name: str, key: Any) -> None:
        """An unknown host (paramiko's MissingHostKeyPolicy): accept, accept and append, or refuse."""
        self.refuse_revoked(name, key)
        if self.strict == "no":
            return
        if self.strict == "accept-new":
            if self.save_to is not None:
                append(self.save_to, name, key)
            return
        via_ca = self.authorities(name)
        ca = (f"; {via_ca[0].where} trusts it through @cert-authority, which validate does not use (paramiko "
              "checks no host certificates)") if via_ca else ""
        host, _, port = name.removeprefix("[").partition("]:")
        scan = f"ssh-keyscan {'-p ' + port + ' ' if port else ''}{host}"
        target = self.save_to or (self.user_files[0] if self.user_files else Path("~/.ssh/known_hosts"))
        raise HostKeyRefused(
            f"{name}: its host key ({fingerprint(key)}) is not in known_hosts ({self.files()}) and "
            f"StrictHostKeyChecking is {self.strict}{ca}",
            f"check the key against the node's own (ssh-keygen -lf /etc/ssh/ssh_host_{_KEY_FILE.get(key.get_name(), 'ecdsa')}"
            f"_key.pub on the node) and add it: {scan} >> {target}; or let the first connection record it with "
            "ansible_ssh_common_args '-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=FILE'")


_KEY_FILE = {"ssh-ed25519": "ed25519", "ssh-rsa": "rsa"}


class _Policy(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
    def __init__(self, known: KnownHosts) -> None:
        self.known = known

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        self.known.missing(hostname, key)


def append(path: Path, name: str, key: Any) -> None:
    """Append `name type base64` to path (created when missing); never rewrites it. A path that is not a regular file
    (/dev/null) takes nothing."""
    line = f"{name} {key.get_name()} {key.get_base64()}\n".encode()
    with _append_lock:
        if any(not e.marker and matches(e.patterns, name) and e.key.asbytes() == key.asbytes()
               for e in read_entries(path)):
            return  # recorded meanwhile (a jump host shared by several nodes)
        try:
            _append(path, line)
        except OSError as exc:
            raise HostKeyRefused(f"{name}: cannot record its new host key in {path} ({exc.strerror or exc})",
                                 "StrictHostKeyChecking=accept-new appends to the first UserKnownHostsFile: fix that "
                                 "path or its permissions (its directory must exist)") from None


def _append(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)  # a FIFO: ENXIO, no block
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        if st.st_size:
            with open(path, "rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = b"\n" + line
        os.write(fd, line)
    finally:
        os.close(fd)
