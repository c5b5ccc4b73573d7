"""STAND-IN `mokutil` for preflight's Secure Boot checks (not the real mokutil: the lab's nodes and the test machine
boot no shim, and their Machine Owner Key list cannot be changed).

write_standin_mokutil() writes a POSIX shell script that answers the two questions preflight asks, in the real
mokutil's words, from an answers file instead of the firmware:

- `mokutil --sb-state` prints "SecureBoot enabled" or "SecureBoot disabled" (answers line `sb-state on|off`);
- `mokutil --test-key FILE` prints "FILE is already enrolled" (exit 1, as mokutil does) when FILE's SHA-256 is on an
  answers line `enrolled <sha256 of the DER certificate>`, else "FILE is not enrolled" (exit 0).

Anything else (`--import`, `--list-enrolled`, ...) says STAND-IN on stderr and exits 2: gpu-install never enrols
keys. The script says STAND-IN in its first lines. See docs/lab.md.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_SCRIPT = r"""#!/bin/sh
# mokutil -- gpu-install lab STAND-IN (not the real mokutil): answers --sb-state and --test-key from {answers}
# (lines: "sb-state on|off", "enrolled <sha256 of a DER certificate>"), as preflight's tests need.
ANSWERS='{answers}'
case "$1" in
  --sb-state)
    if grep -qx 'sb-state on' "$ANSWERS"; then echo "SecureBoot enabled"; else echo "SecureBoot disabled"; fi ;;
  --test-key)
    [ -r "$2" ] || {{ echo "Failed to open $2" >&2; exit 255; }}
    sum=$(sha256sum "$2" | cut -d' ' -f1)
    if grep -qx "enrolled $sum" "$ANSWERS"; then echo "$2 is already enrolled"; exit 1; fi
    echo "$2 is not enrolled" ;;
  *)
    echo "mokutil STAND-IN: only --sb-state and --test-key are answered" >&2; exit 2 ;;
esac
"""


def answers(secure_boot: bool, enrolled_der: tuple[bytes, ...] = ()) -> str:
    """The answers file's text: Secure Boot on/off and the DER certificates that count as enrolled."""
    lines = [f"sb-state {'on' if secure_boot else 'off'}"]
    lines += [f"enrolled {hashlib.sha256(der).hexdigest()}" for der in enrolled_der]
    return "\n".join(lines) + "\n"


def write_standin_mokutil(path: Path, answers_file: Path) -> Path:
    """The STAND-IN script at path (mode 0755), reading answers_file (written with answers()) on every call."""
    if "'" in str(answers_file):
        raise ValueError(f"{answers_file}: a quote in the answers file's path")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_SCRIPT.format(answers=answers_file))
    path.chmod(0o755)
    return path
