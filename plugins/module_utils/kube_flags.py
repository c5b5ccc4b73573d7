# -*- coding: utf-8 -*-
"""Reading Kubernetes component flags from a command list (the scheduler modules)."""


def flag_value(command, name, default=None):
    """The value of --name=value (or --name value) in a command list; the last one wins, like pflag."""
    value = default
    for i, arg in enumerate(command):
        if arg == "--" + name and i + 1 < len(command) and not command[i + 1].startswith("-"):
            value = command[i + 1]
        elif arg.startswith("--" + name + "="):
            value = arg.split("=", 1)[1]
    return value
