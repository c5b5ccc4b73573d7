# -*- coding: utf-8 -*-
"""Writing a config file whole or not at all, shared by the modules that edit node files (daemon_json,
containerd_runtime, scheduler_policy, scheduler_manifest) and the first-change record.

The new content goes to a temp file in the same directory (same file system: the rename is atomic), is flushed to
disk, gets its mode, and only then replaces the file. The temp name ends in ``.gpu-install.tmp``, never in ``.yaml``,
``.toml`` or ``.json``: a kubelet watching a static-pod directory, or a runtime reading a ``conf.d``, must not take it
for a file of its own."""

from __future__ import annotations

import os


def temp_path(path):
    return os.path.join(os.path.dirname(path), ".%s.%d.gpu-install.tmp" % (os.path.basename(path), os.getpid()))


def write_temp(path, data, mode=None, new_mode=0o600):
    """The temp file beside ``path`` holding ``data`` (text or bytes), fsynced; returns its path.

    mode: that mode whatever ``path`` has now; None: the mode of the existing ``path``, or ``new_mode`` when it does
    not exist yet."""
    tmp = temp_path(path)
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    if mode is None:
        mode = (os.stat(path).st_mode & 0o7777) if os.path.exists(path) else new_mode
    os.chmod(tmp, mode)
    return tmp


def atomic_write(path, data, mode=None, new_mode=0o600, module=None):
    """Replace ``path`` with ``data`` atomically. With an AnsibleModule, its atomic_move (which also keeps the owner
    and SELinux context of an existing file); else os.replace."""
    tmp = write_temp(path, data, mode, new_mode)
    if module is not None:
        module.atomic_move(tmp, path)
    else:
        os.replace(tmp, path)
