# -*- coding: utf-8 -*-
"""The record of gpu-install's first change to a config file, shared by the daemon_json and containerd_runtime
modules: a small JSON file next to the config (``.<name>.gpu-install-state``, mode 0600, no secrets) that keeps what
the file held before the first apply, so that ``state=absent`` can give it back."""

import json
import os

from ansible_collections.gpu_install.node.plugins.module_utils.files import atomic_write

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import Any  # noqa: F401

STATE_SUFFIX = ".gpu-install-state"
STATE_FORMAT = 1


class RecordError(Exception):
    pass


def state_file(path):
    # type: (str) -> str
    """The record of our first change: a hidden file next to the config (and its backups)."""
    return os.path.join(os.path.dirname(path), "." + os.path.basename(path) + STATE_SUFFIX)


def load_state(state_path, what="gpu-install's record of its first change", fallback="what is unmistakably ours",
               error=RecordError):
    # type: (str, str, str, type[Exception]) -> dict[str, Any] | None
    """The record as a dict, None when there is none. A record that is not JSON or of another format raises
    ``error`` saying how to go on without it (removing it makes removal take out only ``fallback``)."""
    if not os.path.exists(state_path):
        return None
    try:
        with open(state_path) as fh:
            st = json.load(fh)
    except ValueError as exc:
        raise error("%s (%s) is not valid JSON (%s); remove it to fall back to removing only %s"
                    % (state_path, what, exc, fallback))
    if not isinstance(st, dict) or st.get("format") != STATE_FORMAT:
        raise error("%s: unknown record format; remove it to fall back to removing only %s" % (state_path, fallback))
    return st


def write_state(state_path, st):
    # type: (str, dict[str, Any]) -> None
    """Write the record atomically (temp file in the same directory, fsync, rename), mode 0600."""
    atomic_write(state_path, json.dumps(st, indent=2, sort_keys=True) + "\n", mode=0o600)
