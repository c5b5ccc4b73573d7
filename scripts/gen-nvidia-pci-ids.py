#!/usr/bin/env python3
"""Extract installer/data/nvidia-pci-ids.tsv (the NVIDIA data-centre GPU and NVSwitch PCI ids `gpu-install nodes
facts` names) from a pci.ids file: `scripts/gen-nvidia-pci-ids.py PCI_IDS SOURCE > installer/data/nvidia-pci-ids.tsv`.

SOURCE says where PCI_IDS came from (e.g. "github.com/pciutils/pciids@<commit>"); the header records it with the
file's Version line and sha256, and tests/unit/test_node_facts.py re-derives the table from a pci.ids with the same
rule (installer.node_facts.extract_pci_ids).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from installer.node_facts import extract_pci_ids, pci_table_text  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    data = Path(argv[0]).read_bytes()
    text = data.decode("utf-8", "replace")
    version = next((line.split(":", 1)[1].strip() for line in text.splitlines()[:40]
                    if line.lstrip("#\t ").startswith("Version:")), "unknown")
    sys.stdout.write(pci_table_text(extract_pci_ids(text), source=argv[1], version=version,
                                    sha256=hashlib.sha256(data).hexdigest()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
