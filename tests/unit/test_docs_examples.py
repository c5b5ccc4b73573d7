"""The docs say what the tool does (docs/testing.md, "The docs' examples").

1. Every fenced `gpu-install …` example in README.md and docs/*.md that needs no cluster runs, as the reader would
   type it, against a site made by `gpu-install config sample` (site.yaml) and the sample inventory (inventory/), or
   the page's own `# site.yaml` snippet when one comes before it in the same section (subsections included); a
   non-zero exit the page does not announce (`# exit N` / `# exits N` in the example's own comment or the comment
   line below it) fails, and so does an announced code the run does not end with. Examples that would contact a
   host, a registry or an API server are skipped by one of the declared rules below (SKIP_RULES), never one by one.
2. Every `# site.yaml` snippet, merged into the sample, passes `config check` (or announces its exit the same way).
3. Every relative link in README.md and docs/*.md names a file that exists and, with `#anchor`, a heading of that
   page (GitHub's slug rules).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from markdown_it import MarkdownIt
from markdown_it.token import Token

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GPU_INSTALL = Path(sys.executable).with_name("gpu-install")
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}

#: what an example is when it is not run, each with the reason; the first rule that matches decides
SKIP_RULES: list[tuple[str, re.Pattern[str], str]] = [
    ("synopsis", re.compile(r"\[[-A-Za-z.]|…|\.\.\.|\w\|\w|<\w|\s[A-Z][A-Z_]*(?=\s|$|\])"),
     "usage notation ([optional], A|B, …, <placeholder>, UPPERCASE placeholder): a synopsis, not a command"),
    ("contacts nodes", re.compile(r"^gpu-install (preflight|apply|mig (label|plan|apply)|nodes facts)\b|^gpu-install uninstall .*--yes\b"),
     "connects to the inventory's nodes over SSH (and to the API server); `uninstall` without --yes only previews"),
    ("contacts the cluster", re.compile(r"^gpu-install (operator (install|status|uninstall)|validate|upgrade (plan|apply|rollback)|evidence (create|verify))\b"),
     "talks to the Kubernetes API server (validate also to the nodes; upgrade reads the release, nodes and pods; "
     "evidence create reads the cluster and the nodes, evidence verify checks what create wrote there)"),
    ("contacts registries", re.compile(r"^gpu-install mirror (pull|push|sync|verify)\b"),
     "copies from or checks registries and chart/package repositories (covered by tests/integration/test_mirror_*)"),
    ("reads node facts", re.compile(r"\s--facts facts\.json\b"),
     "reads the facts.json `gpu-install nodes facts` wrote from the nodes (covered by tests/unit/test_facts_file.py)"),
    ("builds a lab", re.compile(r"^(sudo )?gpu-install lab\b"),
     "root: network namespaces and nspawn nodes (covered by tests/integration/)"),
]
#: an example that asks only for help or the version never contacts anything, whatever its command
ALWAYS_RUN = re.compile(r"\s(--help|-h|--version)(\s|$)")
ANNOUNCED = re.compile(r"#.*\bexits? (\d+)\b")
TIMEOUT = 60


@dataclass
class Example:
    page: Path
    line: int
    command: str
    expect: int = 0
    snippet: dict | None = None  # the section's `# site.yaml` snippet before the example, merged into the sample
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fences(page: Path) -> list[Token]:
    """The page's fenced blocks and its headings (the end of its section ends the reach of a site snippet)."""
    return [t for t in MarkdownIt("commonmark").parse(page.read_text())
            if (t.type == "fence" or t.type == "heading_open") and t.map]


def site_snippet(token: Token) -> dict | None:
    if token.info.strip() not in ("yaml", "yml") or not token.content.startswith("# site.yaml"):
        return None
    data = yaml.safe_load(token.content)
    return data if isinstance(data, dict) else None


def announced(*comments: str) -> int:
    for c in comments:
        m = ANNOUNCED.search(c)
        if m:
            return int(m[1])
    return 0


def examples_of(page: Path) -> list[Example]:
    out: list[Example] = []
    snippet: dict | None = None
    level = section = 0  # the current heading's level; the level of the section the snippet belongs to
    for token in fences(page):
        if token.type == "heading_open":
            level = int(token.tag[1:])
            if level <= section:  # the snippet's section ends (its subsections are part of it)
                snippet, section = None, 0
            continue
        if (data := site_snippet(token)) is not None:
            snippet, section = data, level
            out.append(Example(page, token.map[0] + 2, "gpu-install config check -s site.yaml", snippet=data,
                               expect=announced(*token.content.splitlines()[:1])))
            continue
        if token.info.strip().split(" ")[0] not in SHELL_FENCES:
            continue
        lines = token.content.splitlines()
        i = 0
        while i < len(lines):
            start = i
            text = lines[i].strip()
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            i += 1
            text = text.removeprefix("$ ").removeprefix(".venv/bin/")
            if not re.match(r"(sudo )?gpu-install(\s|$)", text):
                continue
            below = lines[i].strip() if i < len(lines) else ""
            out.append(Example(page, token.map[0] + 2 + start, text, snippet=snippet,
                               expect=announced(text, below if below.startswith("#") else "")))
    for ex in out:
        ex.skip = classify(ex.command)
    return out


def classify(command: str) -> str | None:
    """The name of the rule that skips the command; None: it is run."""
    code = command.split(" #", 1)[0].rstrip()
    if ALWAYS_RUN.search(code) and not re.search(r"\[|…", code):
        return None
    return next((name for name, rx, _ in SKIP_RULES if rx.search(code)), None)


EXAMPLES = [ex for page in PAGES for ex in examples_of(page)]
RUN = [ex for ex in EXAMPLES if ex.skip is None]


def merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


#: what every example would import anyway (a fresh interpreter's start-up, not the command's work)
WARM = ("installer.cli", "installer.plan", "installer.mirror.plan", "installer.render.values", "installer.catalog",
        "installer.offline_checks", "ansible.inventory.manager", "ansible.vars.manager", "ansible.parsing.dataloader",
        "jinja2")
SHELL_ONLY = re.compile(r"[|;&`$()<]|>>")  # what only a shell does; a plain `> FILE` is done here


def run_one(command: str, workdir: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run one example as a fresh process would, without paying the interpreter's start-up each time: a forked child
    of a process that imported installer.cli already calls main() with the example's words (its `> FILE` done by
    the child); anything else a shell would do goes to bash."""
    argv = shlex.split(command, comments=True)
    if SHELL_ONLY.search(command.split(" #", 1)[0]) or argv.count(">") > 1 or (">" in argv and argv[-2] != ">"):
        try:
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=workdir, env=env,
                                  capture_output=True, text=True, timeout=TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            return -1, f"did not finish in {TIMEOUT} s"
        return proc.returncode, (proc.stderr or proc.stdout)[-2000:]
    stdout = workdir / argv[-1] if ">" in argv else workdir / ".stdout"
    argv = argv[:-2] if ">" in argv else argv
    log = workdir / ".stderr"
    pid = os.fork()
    if pid == 0:  # the child: never returns
        rc = 1
        try:
            os.chdir(workdir)
            os.environ.clear()
            os.environ.update(env)
            os.dup2(os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 1)
            os.dup2(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.stdin, sys.stdout, sys.stderr = (open(0, closefd=False), open(1, "w", closefd=False),
                                                 open(2, "w", closefd=False))
            from installer.cli import main

            rc = main(argv[1:])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001 - a forked child must end in os._exit, never return into pytest
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(rc)
    deadline = time.monotonic() + TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return -1, f"did not finish in {TIMEOUT} s"
        time.sleep(0.01)
    text = log.read_text(errors="replace") or (stdout.read_text(errors="replace") if stdout.name == ".stdout" else "")
    return os.waitstatus_to_exitcode(status), text[-2000:]


def warm() -> None:
    """Import once, in a worker, what every example would import anyway: each example then pays only for its work."""
    for module in WARM:
        try:
            importlib.import_module(module)
        except ImportError:  # a module renamed: only the warm-up is lost, never an example
            pass


def run_page(job: tuple[Path, list[Example], str, Path]) -> dict[str, tuple[int, str]]:
    """Run one page's examples in order, in a directory of the page's own, as a reader would."""
    page, examples, sample, workdir = job
    workdir.mkdir()
    shutil.copytree(ROOT / "inventories" / "sample", workdir / "inventory")
    (workdir / "inventories").symlink_to(ROOT / "inventories")
    env = {**os.environ, "PATH": f"{GPU_INSTALL.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "GPU_INSTALL_STATE": str(workdir / "state"), "NO_COLOR": "1", "COLUMNS": "200"}
    for var in ("GPU_INSTALL_SITE", "GPU_INSTALL_INVENTORY", "GPU_INSTALL_CHART", "KUBECONFIG"):
        env.pop(var, None)
    results: dict[str, tuple[int, str]] = {}
    site = workdir / "site.yaml"
    site.write_text(sample)
    for ex in examples:
        before = site.read_text()
        if ex.snippet is not None:
            site.write_text(yaml.safe_dump(merge(yaml.safe_load(sample), ex.snippet), sort_keys=False))
        results[ex.where] = run_one(ex.command.removeprefix("sudo "), workdir, env)
        if ex.snippet is not None:
            site.write_text(before)  # the snippet holds for its own section only
    return results


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, tuple[int, str]]:
    sample = subprocess.run([str(GPU_INSTALL), "config", "sample"], capture_output=True, text=True, check=True).stdout
    root = tmp_path_factory.mktemp("docs-examples")
    by_page: dict[Path, list[Example]] = {}
    for ex in RUN:
        by_page.setdefault(ex.page, []).append(ex)
    jobs = [(page, exs, sample, root / page.stem) for page, exs in by_page.items()]
    out: dict[str, tuple[int, str]] = {}
    # workers from a fresh single-threaded server (never a fork of this process and whatever threads earlier tests
    # left in it), each warmed once; run_one forks each example from its worker
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__, *WARM])  # the server imports them once; its workers start warm
    with ctx.Pool(max(2, os.cpu_count() or 2), initializer=warm) as pool:
        for part in pool.imap_unordered(run_page, jobs):
            out.update(part)
    return out


@pytest.mark.parametrize("ex", RUN, ids=[ex.where for ex in RUN])
def test_example_runs_as_the_page_says(ex: Example, results):
    rc, err = results[ex.where]
    said = f"exits {ex.expect} (announced)" if ex.expect else "exits 0 (no exit announced)"
    assert rc == ex.expect, f"{ex.where}: `{ex.command}` {said}, but exited {rc}:\n{err}"


def test_examples_are_found_and_every_skip_rule_is_used():
    """The extraction finds the examples (a page that changes its fences does not silently drop out), and every
    declared rule skips at least one of them (no dead rule)."""
    assert len(RUN) >= 30, [ex.where for ex in RUN]
    used = Counter(ex.skip for ex in EXAMPLES if ex.skip)
    assert set(used) == {name for name, _, _ in SKIP_RULES}, used
    pages = {ex.page.name for ex in RUN}
    assert {"README.md", "airgap.md", "upgrade.md", "install.md"} <= pages, pages


@pytest.mark.parametrize("command, rule", [
    ("gpu-install render -s site.yaml [-i inventory]", "synopsis"),
    ("gpu-install images -s site.yaml --format text|json", "synopsis"),
    ("gpu-install mirror plan -s site.yaml --why REF", "synopsis"),
    ("gpu-install apply -s site.yaml -i inventory/", "contacts nodes"),
    ("gpu-install uninstall -s site.yaml -i inventory/ --limit gpu4.example.com --yes", "contacts nodes"),
    ("gpu-install uninstall -s site.yaml -i inventory/ --limit gpu4.example.com", None),
    ("gpu-install operator status -s site.yaml", "contacts the cluster"),
    ("gpu-install upgrade plan -s site.yaml -i hosts.yml --to v25.3.0", "contacts the cluster"),
    ("gpu-install mirror verify -s site.yaml --bundle bundle/", "contacts registries"),
    ("sudo gpu-install lab down", "builds a lab"),
    ("gpu-install mirror plan -s site.yaml -i inventory/ --format json -o plan.json", None),
    ("gpu-install catalog diff v24.9.2 v25.3.0       # image changes", None),
    ("gpu-install apply --help", None),
])
def test_the_rules_decide_as_declared(command, rule):
    assert classify(command) == rule


def test_announcement_convention():
    assert announced("gpu-install mirror plan -s site.yaml --why nope   # exit 2: not in the plan") == 2
    assert announced("gpu-install x", "# exits 3 naming what is missing") == 3
    assert announced("gpu-install render -s site.yaml -o values.yaml  # values for exit-2-free sites") == 0


# ---------------------------------------------------------------- links and anchors

def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, every character but letters, digits, '_', '-' and ' ' dropped, spaces
    to '-'."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def heading_text(inline: Token) -> str:
    return "".join(c.content for c in inline.children or [] if c.type in ("text", "code_inline"))


@functools.cache
def anchors(page: Path) -> set[str]:
    tokens = MarkdownIt("commonmark").enable("table").parse(page.read_text())
    seen: Counter[str] = Counter()
    out: set[str] = set()
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            base = slug(heading_text(tokens[i + 1]))
            out.add(base if not seen[base] else f"{base}-{seen[base]}")
            seen[base] += 1
    return out


def links(page: Path) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for t in MarkdownIt("commonmark").enable("table").parse(page.read_text()):
        for c in t.children or []:
            if c.type == "link_open":
                href = str(c.attrs.get("href", ""))
                if not re.match(r"[a-z][a-z0-9+.-]*:", href):  # http:, https:, mailto: are not checked here
                    out.append(((t.map or [0])[0] + 1, href))
    return out


LINKS = [(page, line, href) for page in PAGES for line, href in links(page)]


def test_slug_follows_githubs_rules():
    assert slug("Custom layouts: `mig.customConfigs`") == "custom-layouts-migcustomconfigs"
    assert slug("mirror pull (connected side)") == "mirror-pull-connected-side"
    assert slug("Exit 6, 7, 8") == "exit-6-7-8"
    assert slug("JSON: `gpu-install.mirror-plan/v1`") == "json-gpu-installmirror-planv1"


def test_links_are_found():
    assert len(LINKS) >= 50 and any(page.name == "README.md" for page, _, _ in LINKS)


@pytest.mark.parametrize("page, line, href", LINKS, ids=[f"{p.relative_to(ROOT)}:{n}:{h}" for p, n, h in LINKS])
def test_relative_link_and_anchor_exist(page: Path, line: int, href: str):
    path, _, anchor = href.partition("#")
    target = (page.parent / path).resolve() if path else page
    assert target.exists(), f"{page.relative_to(ROOT)}:{line}: {href}: {path} does not exist"
    if anchor and target.suffix == ".md":
        known = anchors(target)
        assert anchor in known, (f"{page.relative_to(ROOT)}:{line}: {href}: no heading with anchor #{anchor} in "
                                 f"{target.relative_to(ROOT)} (anchors: {sorted(known)})")


def test_shell_words_of_every_run_example_parse():
    """A run example is one shell command line (quotes balanced), so what runs is what the page shows."""
    for ex in RUN:
        shlex.split(ex.command, comments=True)


# ---------------------------------------------------------------- flags of every example, run or not

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from installer.cli import build_parser

    return build_parser()


def options_of(words: list[str]) -> tuple[str, set[str]]:
    """The command the words name (as far as the parser has it) and the options it accepts."""
    parser, path = _parser(), ["gpu-install"]
    for w in words:
        subs = _subparsers(parser)
        if w not in subs:
            break
        parser, path = subs[w], [*path, w]
    return " ".join(path), {o for a in parser._actions for o in a.option_strings}


def test_every_example_uses_flags_its_command_has():
    """Synopses and examples that are not run too: each option an example shows is one its command accepts (a flag
    the tool does not have, such as a `--wait` of a page's invention, fails here)."""
    wrong = []
    for ex in EXAMPLES:
        code = ex.command.removeprefix("sudo ").split(" #", 1)[0].split("$(", 1)[0]  # not a $(command)'s options
        words = re.findall(r"[a-z][a-z|-]*", code.split(" -", 1)[0].removeprefix("gpu-install"))
        for alternative in (words[1].split("|") if len(words) > 1 else [""]):
            path, accepted = options_of([*words[:1], alternative] if alternative else words[:1])
            for flag in re.findall(r"(?:(?<=\s)|(?<=\[))(--?[a-zA-Z][a-z0-9-]*)(?==|\s|\]|\||$)", code):
                if flag not in accepted:
                    wrong.append(f"{ex.where}: {flag} is not an option of `{path}`: {code}")
    assert not wrong, "\n".join(wrong)
