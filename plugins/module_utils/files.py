# -*- coding: utf-8 -*-
"""Writing a config file whole or not at all, shared by the modules that edit node files (daemon_json,
containerd_runtime, scheduler_policy, scheduler_manifest) and the first-change record; and what their ``--diff``
may show of such a file.

The new content goes to a temp file in the same directory (same file system: the rename is atomic), is flushed to
disk, and only then replaces the file. The temp file is created with its final mode (``O_CREAT|O_EXCL``, the mode
given to ``open(2)`` itself) before a byte is written: a file that holds registry credentials is never readable by
others, not even for a moment between create and chmod. The temp name ends in ``.gpu-install.tmp``, never in
``.yaml``, ``.toml`` or ``.json``: a kubelet watching a static-pod directory, or a runtime reading a ``conf.d``, must
not take it for a file of its own.

Runs on the node's Python (3.6 on CentOS/RHEL 8, 2.7 on CentOS 7): no annotations, no f-strings."""

import errno
import os
import re

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import IO  # noqa: F401

    from ansible.module_utils.basic import AnsibleModule  # noqa: F401

REDACTED = "<redacted>"

#: keys whose values are secrets in the files the modules edit: containerd's CRI registry ``auth`` table (username
#: stays: it says whose login it is, not how to log in), docker-style ``auth``/``identitytoken``, HTTP headers in
#: hosts.toml, TLS private keys inline in a scheduler configuration
SECRET_KEYS = ("auth", "password", "identitytoken", "identity_token", "registrytoken", "registry_token", "token",
               "secret", "authorization", "keydata", "key_data")

_VALUE = (r'"""[\s\S]*?"""'         # TOML multi-line basic string
          r"|'''[\s\S]*?'''"        # TOML multi-line literal string
          r'|"(?:[^"\\\n]|\\.)*"'   # basic / JSON string
          r"|'[^'\n]*'"             # TOML literal / YAML single-quoted string
          r"|[^\s\"'{\[,}\]#][^\n,}\]#]*")  # a bare scalar (YAML, a command-line flag's value) to its end
# the key: bare or quoted, at a word start or after a flag's "--"; = or : on the same line as the value
_SECRET = re.compile(r'(?P<key>(?:(?<=--)|(?<![\w.-]))(?P<q>["\']?)(?:%s)(?P=q)[ \t]*[=:][ \t]*)(?P<value>%s)'
                     % ("|".join(SECRET_KEYS), _VALUE), re.IGNORECASE)


def redact(text):
    # type: (str) -> str
    """``text`` (a TOML, JSON or YAML-ish config) with the value of every secret key (SECRET_KEYS, any case, bare or
    quoted, ``=`` or ``:``) replaced by ``"<redacted>"``; everything else as it was. For ``--diff`` output."""
    if not text:
        return text
    return _SECRET.sub(lambda m: m.group("key") + '"%s"' % REDACTED, text)


def redact_diff(diff):
    # type: (dict[str, str] | list[dict[str, str]]) -> dict[str, str] | list[dict[str, str]]
    """A module result's ``diff`` (one dict or a list of them) with ``before``/``after`` redacted."""
    if isinstance(diff, list):
        return [_redact_sides(d) for d in diff]
    return _redact_sides(diff)


def _redact_sides(diff):
    # type: (dict[str, str]) -> dict[str, str]
    out = dict(diff)
    for side in ("before", "after"):
        if isinstance(out.get(side), (str, type(u""))):
            out[side] = redact(out[side])
    return out


def makedirs(path, mode=0o755):
    # type: (str, int) -> None
    """os.makedirs that is content when the directory is there (``exist_ok`` is Python 3 only)."""
    try:
        os.makedirs(path, mode)
    except OSError as exc:
        if exc.errno != errno.EEXIST or not os.path.isdir(path):
            raise


def temp_path(path):
    # type: (str) -> str
    return os.path.join(os.path.dirname(path), ".%s.%d.gpu-install.tmp" % (os.path.basename(path), os.getpid()))


def create_exclusive(path, mode):
    # type: (str, int) -> IO[bytes]
    """A new file at ``path`` open for writing (a file object), created by ``open(2)`` with O_CREAT|O_EXCL and
    ``mode`` and then set to exactly ``mode`` (the umask can only have taken bits away), before anything is written.
    A leftover at ``path`` (a temp file of a killed run, a symlink) is unlinked, never followed or reused."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
        os.unlink(path)
        fd = os.open(path, flags, mode)
    try:
        os.fchmod(fd, mode)
        return os.fdopen(fd, "wb")
    except Exception:
        os.close(fd)
        os.unlink(path)
        raise


def write_temp(path, data, mode=None, new_mode=0o600):
    # type: (str, str | bytes, int | None, int) -> str
    """The temp file beside ``path`` holding ``data`` (text or bytes), fsynced; returns its path.

    mode: that mode whatever ``path`` has now; None: the mode of the existing ``path``, or ``new_mode`` when it does
    not exist yet. The file has that mode from its creation on."""
    if mode is None:
        mode = (os.stat(path).st_mode & 0o7777) if os.path.exists(path) else new_mode
    tmp = temp_path(path)
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    try:
        with create_exclusive(tmp, mode) as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
    except Exception:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def move_into_place(tmp, path, module=None, mode=None):
    # type: (str, str, AnsibleModule | None, int | None) -> None
    """Rename the temp file onto ``path``. Over an existing file with an AnsibleModule: its atomic_move, which keeps
    that file's owner and SELinux context -- and its mode, so with ``mode`` given the old file is first narrowed to
    what both allow and the result then set to ``mode``: at no moment is it more open than before or than ``mode``.
    A new file keeps the mode it was created with: atomic_move would set 0666 less the umask on it (world-writable
    under umask 0), so it is renamed here and only given the SELinux default context of its path."""
    if module is not None and os.path.exists(path):
        if mode is not None:
            os.chmod(path, os.stat(path).st_mode & 0o7777 & mode)
        module.atomic_move(tmp, path)
        if mode is not None:
            os.chmod(path, mode)
        return
    os.rename(tmp, path)
    if module is not None and module.selinux_enabled():
        module.set_context_if_different(path, module.selinux_default_context(path), False)


def atomic_write(path, data, mode=None, new_mode=0o600, module=None):
    # type: (str, str | bytes, int | None, int, AnsibleModule | None) -> None
    """Replace ``path`` with ``data`` atomically (see move_into_place for what ``module`` adds)."""
    move_into_place(write_temp(path, data, mode, new_mode), path, module, mode)
