"""The Ansible seam: the ONLY module that imports ansible_runner.

run_playbook() runs one playbook through ansible-runner and returns a RunResult built from the
runner's per-host stats (never ansible-playbook's raw rc). Extravars travel as typed JSON in the
runner's env/extravars file inside a 0700 private data dir kept per run under
$XDG_STATE_HOME/gpu-install/runs/<timestamp>-<playbook>/ (artifacts: job events, stdout).
Secrets never travel: extravars whose keys look like credentials are refused, and environment
variables that look like credentials are removed from the environment the runner sees (the
runner records its whole environment in artifacts/<ident>/command).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import content
from installer.errors import (
    EXIT_HOST_FAILURES,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_UNREACHABLE,
    ConfigError,
    EnvironmentProblem,
    GpuInstallError,
    HostFailures,
)

SECRET_KEY = re.compile(r"pass(word|wd|phrase)?|secret|token|credential|private_?key|api_?key|auth", re.I)
ENV_KEEP = {"SSH_AUTH_SOCK", "XAUTHORITY"}  # needed by ssh, not credentials themselves
STAT_KEYS = {"ok": "ok", "changed": "changed", "failures": "failed", "dark": "unreachable", "skipped": "skipped",
             "rescued": "rescued", "ignored": "ignored"}

Progress = Callable[[str], None]
if TYPE_CHECKING:
    from installer.plan import Inventory
    from installer.progress import Display


@dataclass
class HostStats:
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass
class TaskFailure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass
class RunResult:
    playbook: str
    hosts: dict[str, HostStats]
    failures: list[TaskFailure] = field(default_factory=list)
    artifacts: Path | None = None
    status: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # per host: the sum of its task durations

    @property
    def unreachable(self) -> list[str]:
        return sorted(h for h, s in self.hosts.items() if s.unreachable)

    @property
    def failed(self) -> list[str]:
        return sorted(h for h, s in self.hosts.items() if s.failed and not s.unreachable)

    @property
    def changed(self) -> int:
        return sum(s.changed for s in self.hosts.values())

    def exit_code(self, preflight: bool = False) -> int:
        """Unreachable hosts → 5, failed hosts → 4 (3 for preflight), else 0."""
        if self.unreachable:
            return EXIT_UNREACHABLE
        if self.failed:
            return EXIT_PREFLIGHT if preflight else EXIT_HOST_FAILURES
        return EXIT_OK

    def recap(self) -> str:
        from installer.progress import HostRecap, recap_table

        table = recap_table({h: HostRecap(s.ok, s.changed, s.failed, s.unreachable, s.skipped, self.seconds.get(h, 0.0))
                             for h, s in self.hosts.items()})
        lines = [table]
        for f in self.failures:
            kind = "UNREACHABLE" if f.unreachable else "FAILED"
            lines.append(f"{kind} [{f.host}] {f.task}: {f.message}")
        return "\n".join(lines)


def check_extravars(extravars: dict[str, Any], path: str = "") -> None:
    """Refuse anything that looks like a credential: extravars end up on disk and in process lists. That is a key
    named like one, or a URL carrying user:password@ anywhere in a value (the site model refuses those in its URL
    fields; this holds for whatever else builds extravars)."""
    for key, value in extravars.items():
        where = f"{path}{key}"
        if SECRET_KEY.search(str(key)):
            raise GpuInstallError(
                f"extravar {where!r} looks like a credential; secrets never travel as extravars",
                hint="read credentials on the controller (env var / file reference) and pass them another way",
            )
        if isinstance(value, dict):
            check_extravars(value, f"{where}.")
        elif not isinstance(value, (str, int, float, bool, list, type(None))):
            raise GpuInstallError(f"extravar {where!r}: {type(value).__name__} is not JSON")
        elif _url_credentials(value):
            raise ConfigError(f"extravar {where!r} holds a URL with a user name or password (user:password@): it "
                              "would be written to the run's env/extravars file and the process list",
                              hint="remove the credentials from the URL in the site file (docs/site.md: where each "
                                   "kind of URL takes its credentials)")
    json.dumps(extravars)  # typed JSON or nothing


def _url_credentials(value: Any) -> bool:
    """Whether value (a string, or a list or mapping holding one at any depth) holds a URL with user[:password]@."""
    from installer.patterns import strip_userinfo

    if isinstance(value, str):
        return strip_userinfo(value) != value
    if isinstance(value, dict):
        return any(_url_credentials(v) for v in value.values())
    return isinstance(value, list) and any(_url_credentials(v) for v in value)


def state_dir() -> Path:
    base = os.environ.get("GPU_INSTALL_STATE") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "gpu-install"
    )
    return Path(base)


def new_run_dir(name: str) -> Path:
    runs = state_dir() / "runs"
    runs.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1000):
        path = runs / (f"{stamp}-{name}" if n == 0 else f"{stamp}-{name}-{n}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)
        return path
    raise EnvironmentProblem(f"cannot create a run directory under {runs}")  # pragma: no cover


@contextmanager
def _scrubbed_environ(extra_names: list[str]) -> Iterator[None]:
    """Remove credential-looking variables (and the named ones) from os.environ for the run."""
    names = [k for k in os.environ if SECRET_KEY.search(k) and not k.startswith("ANSIBLE_") and k not in ENV_KEEP]
    names += extra_names
    saved = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _message(res: dict[str, Any]) -> str:
    from installer.progress import message

    return message(res)


@contextmanager
def _deferred_signals() -> Iterator[Callable[[], bool]]:
    """SIGINT and SIGTERM while a playbook runs: noted -- ansible-runner, polling the callback this yields, stops
    ansible-playbook -- and delivered again once the run has stopped, to the handlers that were there before (Ctrl-C:
    KeyboardInterrupt, exit 130 'cancelled'). Without a callback of ours, ansible-runner installs its own handlers for
    both signals and never puts the old ones back: the run ended as 'canceled' (an internal error) and every later
    Ctrl-C of the process was ignored. Outside the main thread (no signal handlers there): nothing to note."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    got: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def note(signum: int, _frame: object) -> None:
        got.append(signum)

    for s in previous:
        signal.signal(s, note)
    try:
        yield lambda: bool(got)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)
        if got:
            signal.raise_signal(got[0])


def run_playbook(
    playbook: str | os.PathLike[str],
    inventory: str | os.PathLike[str],
    extravars: dict[str, Any] | None = None,
    *,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    check: bool = False,
    diff: bool = False,
    progress: Progress | None = None,
    scrub_env: list[str] | None = None,
    run_dir: Path | None = None,
    display: Display | None = None,
    inventory_info: Inventory | None = None,
) -> RunResult:
    """Run a playbook; the result's exit_code() maps per-host stats to gpu-install exit codes.

    display (installer.progress.Display) gets every job event and the run's start and end; progress (a line
    sink) gets the same plain lines when no display is given. inventory_info (the plan's inventory, read once)
    gives the display each play's host count."""
    extravars = dict(extravars or {})
    check_extravars(extravars)
    pb = Path(playbook)
    if not pb.is_absolute():
        pb = content.playbooks_dir() / pb
    if not pb.is_file():
        raise EnvironmentProblem(f"playbook {pb} not found", hint="run from a complete gpu-install checkout")
    inv = Path(inventory)
    if not inv.exists():
        raise ConfigError(f"inventory {inventory} not found", hint="pass -i with an inventory file or directory")
    private = run_dir or new_run_dir(pb.stem)
    private.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(private, 0o700)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import ansible_runner

    from installer import limits

    run_limit = limits.ansible_timeout()
    failures: list[TaskFailure] = []
    seconds: dict[str, float] = {}
    running: dict[str, str] = {}  # host -> the task it started and has not finished (named when the limit passes)
    if display is None and progress is not None:
        from installer.progress import Display

        display = Display(progress)

    def on_event(event: dict[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "runner_on_start":
            running[str(data.get("host"))] = str(data.get("task", ""))
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            running.pop(str(data.get("host")), None)
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            failures.append(TaskFailure(str(data.get("host")), str(data.get("task", "")), _message(data.get("res") or {}),
                                        unreachable=kind == "runner_on_unreachable"))
        if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped"):
            host = str(data.get("host"))
            try:
                seconds[host] = seconds.get(host, 0.0) + float(data.get("duration") or 0.0)
            except (TypeError, ValueError):
                pass
        if display is not None:
            display.event(event)
        return True

    cmdline = " ".join(x for x, on in (("--check", check), ("--diff", diff)) if on)
    bindir = os.path.dirname(_ansible_playbook())
    # the bundle's ansible.cfg, and the collection gpu_install.node (roles, modules) through a link in this run's
    # private data dir to the content root (installer.content: a checkout or the installed package data)
    envvars = {**content.ansible_env(private / "collections"), "ANSIBLE_NOCOLOR": "1",
               "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    with _scrubbed_environ(list(scrub_env or [])):
        if display is not None:  # inside: a dynamic inventory script sees the same scrubbed environment
            if inventory_info is not None:
                display.start_run(pb.name, inventory_info.count, list(inventory_info.hosts))
            else:
                display.start_run(pb.name)
        try:
            with _deferred_signals() as cancelled:
                runner = ansible_runner.run(
                    private_data_dir=str(private),
                    project_dir=str(content.root()),
                    playbook=str(pb),
                    inventory=str(inv.resolve()),
                    extravars=extravars,
                    envvars=envvars,
                    limit=limit,
                    tags=tags,
                    skip_tags=skip_tags,
                    cmdline=cmdline or None,
                    event_handler=on_event,
                    quiet=True,
                    ident="run",
                    cancel_callback=cancelled,
                    timeout=max(1, int(run_limit)),  # the run is stopped (its process group terminated) when it passes
                )
        finally:
            if display is not None:
                display.finish_run()
    if runner.status == "timeout":
        busy = ", ".join(f"{h} ({t})" if t else h for h, t in sorted(running.items()))
        raise HostFailures(
            f"ansible-playbook {pb.name} ran past its {run_limit:g} s limit and was stopped"
            + (f"; still running: {busy}" if busy else ""),
            hint=f"a task hung on those hosts (see {private}/artifacts/run/stdout); if the run is only long, raise "
                 f"${limits.ENV_ANSIBLE_TIMEOUT}=SECONDS (default {limits.DEFAULT_ANSIBLE_TIMEOUT:g}). Re-running is "
                 "safe: the roles are idempotent")
    for sub in ("env", "artifacts"):
        if (private / sub).exists():
            os.chmod(private / sub, 0o700)
    stats = runner.stats
    if not stats:
        tail = _stdout_tail(runner)
        if "inventory" in tail.lower() and ("parse" in tail.lower() or "could not" in tail.lower()):
            raise ConfigError(f"inventory {inventory}: ansible could not use it: {tail}", hint="fix the inventory")
        raise GpuInstallError(
            f"ansible-playbook {pb.name} did not run ({runner.status}, rc {runner.rc}): {tail}",
            hint=f"see {private}/artifacts/run/stdout",
        )
    hosts: dict[str, HostStats] = {}
    for runner_key, attr in STAT_KEYS.items():
        for host, n in (stats.get(runner_key) or {}).items():
            setattr(hosts.setdefault(host, HostStats()), attr, int(n))
    for host in stats.get("processed") or {}:
        hosts.setdefault(host, HostStats())
    return RunResult(playbook=pb.name, hosts=hosts, failures=failures, artifacts=private, status=runner.status,
                     seconds=seconds)


def _ansible_playbook() -> str:
    """ansible-playbook next to this interpreter (the venv), else on PATH."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.is_file() else shutil.which("ansible-playbook")
    if not found:
        raise EnvironmentProblem("ansible-playbook not found", hint="run scripts/bootstrap (installs ansible-core)")
    return found


def _stdout_tail(runner: Any) -> str:
    try:
        text = runner.stdout.read()
    except Exception:  # noqa: BLE001 - best effort diagnostics
        return ""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " ".join(" ".join(lines[-6:]).split())[:800]
