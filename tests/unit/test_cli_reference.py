"""docs/cli.md is the parser's own description (scripts/gen-cli-doc.py): it fails when a command, flag, default or
help text changes without the reference, and when the code reads an environment variable the reference omits."""

from __future__ import annotations

import importlib.util
import re

from tests.conftest import ROOT, need

spec = importlib.util.spec_from_file_location("gen_cli_doc", ROOT / "scripts" / "gen-cli-doc.py")
assert spec and spec.loader
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def test_reference_matches_the_parser():
    from importlib.metadata import entry_points

    need(any(ep.name == "lab" for ep in entry_points(group="gpu_install.commands")),
         "the lab's command group is not installed (pip install -e '.[lab]')")
    want = gen.reference()
    have = (ROOT / "docs" / "cli.md").read_text()
    assert have == want, "docs/cli.md drifted from the parser: run scripts/gen-cli-doc.py and review the diff"


def test_every_environment_variable_the_code_reads_is_documented():
    used: set[str] = set()
    for top in ("installer", "gpu_install_lab", "scripts", "tests"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh") and "fixtures" not in path.parts:
                used |= set(re.findall(r"\bGPU_INSTALL_[A-Z_]+[A-Z]\b", path.read_text(errors="replace")))
    documented = set(gen.ENVIRONMENT) | set(gen.DEVELOPMENT)
    assert used <= documented, f"read by the code, missing from docs/cli.md: {sorted(used - documented)}"
