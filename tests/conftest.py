"""Shared test helpers. Lab fixtures live in tests/integration/conftest.py."""

from __future__ import annotations

import copy
import functools
import os
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The lab's nodes run Debian 12 and a Rocky 9.5 stand-in, for which NVIDIA publishes no driver images: a lab site that
# leaves the driver to the operator declares them as OSes the site builds its own driver images for.
LAB_DRIVER_OS = ["debian12", "rocky9.5"]
UPSTREAM = ROOT.parent / "shared" / "upstream" / "gpu-operator"

# In CI (or with GPU_INSTALL_REQUIRE_TOOLS) a missing tool the tests need (helm, containerd, ansible-lint, …) is a
# failure, not a skip: CI must not skip what it claims to test.
REQUIRE_TOOLS = bool(os.environ.get("CI") or os.environ.get("GPU_INSTALL_REQUIRE_TOOLS"))


def need(available: object, reason: str, *, required: bool = False, why_required: str = "") -> None:
    """Inside a test: skip without the tool -- or fail, when tools are required (CI, GPU_INSTALL_REQUIRE_TOOLS, or
    `required`: the lab's GPU_INSTALL_REQUIRE_LAB / _KUBERNETES, named by why_required). Every skip of the test suite
    goes through here, except the few that depend on what the machine IS (an NVIDIA driver present), not on what
    was installed on it."""
    if available:
        return
    if REQUIRE_TOOLS or required:
        pytest.fail(f"{reason} ({why_required or 'CI / GPU_INSTALL_REQUIRE_TOOLS'} is set: not skipping)")
    pytest.skip(reason)


def requires(available: object, reason: str):
    """Decorator form of need(): the check is made when the test runs."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            need(available, reason)
            return fn(*args, **kwargs)

        return wrapper

    return deco


def pytest_sessionfinish(session, exitstatus):
    """The gpg-agents that gpg started for the tests' own GnuPG homes (signing keys made in tmp_path) are stopped:
    gpg leaves one running per home, and a test run leaves nothing running on the machine."""
    import subprocess

    factory = getattr(session.config, "_tmp_path_factory", None)
    basetemp = getattr(factory, "_basetemp", None)  # only a session that made its temporary dir (never make one here)
    if basetemp is None:
        return
    base = str(basetemp)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv[0].endswith(b"gpg-agent") or b"--homedir" not in argv[:-1]:
            continue
        home = argv[argv.index(b"--homedir") + 1].decode(errors="replace")
        if home.startswith(base + os.sep):
            try:
                subprocess.run(["gpgconf", "--homedir", home, "--kill", "gpg-agent"], capture_output=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass  # best effort: never fail the run over it


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The skip count with the reasons, at the end of every run (CI prints it before pytest's closing line)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    reasons: Counter[str] = Counter()
    for rep in skipped:
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    terminalreporter.section(f"{len(skipped)} skipped, by reason")
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"{n:4d}  {reason}")


BASE_SITE = {
    "operator": {"version": "v24.9.2"},
    "registry": {"host": "registry.lab:5000", "pullSecret": {"name": "gpu-registry"}},
}


@pytest.fixture
def site_data() -> dict:
    return copy.deepcopy(BASE_SITE)


@pytest.fixture
def write_site(tmp_path):
    import yaml

    def write(data: dict, name: str = "site.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return write


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    from installer.cli import main

    def run(*args: str):
        rc = main([str(a) for a in args])
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


def plan_of(site, nodes=None, inventory: str | None = None, **options):
    """installer.plan.resolve for a parsed site, with GPU nodes given directly or from an inventory."""
    from installer.plan import Options, resolve

    return resolve(site, Options(inventory=str(inventory) if inventory else None, **options), facts=nodes)


def nodes_of(inventory) -> list:
    """The GPU nodes installer.plan reads from an inventory."""
    from installer.facts import node_from_vars
    from installer.plan import gpu_host_vars, load_inventory

    return [node_from_vars(name, hv) for name, hv in gpu_host_vars(load_inventory(str(inventory)))]


def upstream_available() -> bool:
    return (UPSTREAM / "matrix.json").is_file()


@pytest.fixture(scope="session")  # session: set up before any module fixture that reads the facts
def upstream_facts() -> None:
    need(upstream_available(), f"upstream facts not found at {UPSTREAM}")


#: a mark: the test needs ../shared/upstream (skipped without it, a failure in CI -- through need())
needs_upstream = pytest.mark.usefixtures("upstream_facts")


def staged_charts(bundle, lock, site=None):
    """(charts, files) of the lock as `mirror push` checks them: charts.stage into a staging directory dropped
    afterwards (ConfigError naming the first entry that is not as the lock says)."""
    from installer.mirror import charts
    from installer.mirror.staging import staging

    with staging(bundle=bundle) as into:
        staged = charts.stage(bundle, lock, site, into)
    return [c for c, _ in staged.charts], [f for f, _ in staged.files]


def staged_packages(bundle, lock):
    """The lock's package entries as `mirror push` checks them (packages.stage, staging directory dropped)."""
    from installer.mirror import packages
    from installer.mirror.staging import staging

    with staging(bundle=bundle) as into:
        return [e for e, _ in packages.stage(bundle, lock, into)]
