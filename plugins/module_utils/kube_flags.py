# -*- coding: utf-8 -*-
"""Reading Kubernetes component flags from a command list (the scheduler modules)."""

if False:  # typing only: the node's Python 2.7 has no typing module
    from typing import TypeVar
    _T = TypeVar("_T")


def flag_value(command, name, default):
    # type: (list[str], str, _T) -> str | _T
    """The value of --name=value (or --name value) in a command list, else ``default``; the last one wins, like
    pflag."""
    value = default  # type: str | _T
    for i, arg in enumerate(command):
        if arg == "--" + name and i + 1 < len(command) and not command[i + 1].startswith("-"):
            value = command[i + 1]
        elif arg.startswith("--" + name + "="):
            value = arg.split("=", 1)[1]
    return value
