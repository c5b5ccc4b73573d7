"""Arguments shared by the command groups (site file, inventory). argparse/os only: fast import."""

from __future__ import annotations

import argparse
import os

ENV_SITE = "GPU_INSTALL_SITE"
ENV_INVENTORY = "GPU_INSTALL_INVENTORY"


def site_args(p: argparse.ArgumentParser) -> None:
    """-s/--site (env GPU_INSTALL_SITE) and repeatable --set overrides."""
    p.add_argument("-s", "--site", default=os.environ.get(ENV_SITE), required=not os.environ.get(ENV_SITE),
                   help=f"site file (site.yaml); env {ENV_SITE}")
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="override a site field, e.g. --set registry.host=reg.local:5000 (repeatable; value is YAML)")


def inventory_arg(p: argparse.ArgumentParser, required: bool = False) -> None:
    """-i/--inventory (env GPU_INSTALL_INVENTORY)."""
    p.add_argument("-i", "--inventory", default=os.environ.get(ENV_INVENTORY),
                   required=required and not os.environ.get(ENV_INVENTORY),
                   help=f"Ansible inventory (file or directory); env {ENV_INVENTORY}")
