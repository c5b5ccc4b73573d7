"""installer.progress: the live per-host display, fed with RECORDED job events of real runs; and installer.ui's
tables and transfer progress, on plain streams and on forced terminals (replayed by terminal() below).

Fixtures (tests/fixtures/events/, re-recorded by record.py there):
- lab-driver.jsonl: `gpu-install apply` on 2 debian12 lab nodes with Debian's NVIDIA 535 packages: preflight.yml +
  site.yml with driver.mode host (installs; "Driver | Report" says REBOOT REQUIRED), then preflight.yml + site.yml
  with driver.mode operator (fails on both nodes).
- localhost.jsonl: a small playbook through the seam with --diff: a changed file (diff), a skipped task, an
  ignored error, an unreachable host, a no_log failure, a failing loop item, a "| Report" message.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from installer.progress import Display, HostRecap, recap_table
from installer.ui import TransferProgress, print_table, table

EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "events"
ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^\[(?P<host>[\w.-]+)\]\s+(?P<status>ok|changed|failed|ignored|unreachable|skipped)\s{2,}"
                  r"(?P<task>\S.*?)  \((?P<secs>\d+\.\d)s\)$")


def load(name: str) -> tuple[dict, list[dict]]:
    lines = [json.loads(ln) for ln in (EVENTS / name).read_text().splitlines()]
    return lines[0]["meta"], lines[1:]


def runs(events: list[dict]) -> list[tuple[str, list[dict]]]:
    """Split a recording into runs (each ends with its playbook_on_stats), named by their playbook."""
    out, cur = [], []
    for ev in events:
        cur.append(ev)
        if ev["event"] == "playbook_on_stats":
            name = next(e["event_data"]["playbook"] for e in cur if e["event"] == "playbook_on_play_start")
            out.append((name, cur))
            cur = []
    assert not cur
    return out


def replay(display: Display, name: str) -> tuple[dict, list[tuple[str, list[dict]]]]:
    """Feed a recording the way installer.ansible.run_playbook does: start_run, every event, finish_run."""
    meta, events = load(name)
    split = runs(events)
    for playbook, evs in split:
        display.start_run(playbook, lambda pattern: meta["patterns"].get(pattern), meta["hosts"])
        for ev in evs:
            display.event(ev)
        display.finish_run()
    display.close()
    return meta, split


def plain(name: str, verbose: bool = False) -> tuple[list[str], Display, list]:
    lines: list[str] = []
    d = Display(lines.append, verbose=verbose)
    _, split = replay(d, name)
    return lines, d, split


def find(lines: list[str], host: str, status: str, task: str) -> int:
    """Index of the result line host/status/task."""
    return next(i for i, ln in enumerate(lines)
                if (m := LINE.match(ln)) and (m["host"], m["status"], m["task"]) == (host, status, task))


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["event"] == kind]


def test_recording_is_a_real_apply():
    meta, events = load("lab-driver.jsonl")
    assert [p for p, _ in runs(events)] == ["preflight.yml", "site.yml", "preflight.yml", "site.yml"]
    assert meta == {"hosts": ["node1", "node2", "bastion"], "patterns": {"all": 3, "gpu_nodes": 2}}


def test_play_headers_with_host_counts():
    lines, _, _ = plain("lab-driver.jsonl")
    heads = [ln for ln in lines if ln.startswith("== ")]
    assert heads[:5] == ["== Validate inventory (3 hosts)", "== Preflight GPU nodes (2 hosts)",
                         "== Validate inventory (3 hosts)", "== NVIDIA driver (2 hosts)",
                         "== NVIDIA Container Toolkit (2 hosts)"]
    assert "== Container runtime (2 hosts)" in heads


def test_one_compact_line_per_shown_result_skipped_hidden():
    lines, _, split = plain("lab-driver.jsonl")
    events = [e for _, evs in split for e in evs]
    results = [ln for ln in lines if ln.startswith("[") and LINE.match(ln)]
    assert results, lines[:20]
    for ln in lines:  # every line is a header, a result, a message under a result, or a run summary
        assert ln.startswith(("== ", "-- ", "[")), ln
    assert not [ln for ln in results if LINE.match(ln)["status"] == "skipped"]
    assert of(events, "runner_on_skipped")  # there were some to hide
    # argument validation / include_tasks are bookkeeping: hidden when ok
    assert not [ln for ln in results if "Validating arguments" in ln or "Run action deploy" in ln]
    # what the admin wants to see: installs and restarts, per host, with their time
    changed = {(m["host"], m["task"]) for m in map(LINE.match, results) if m["status"] == "changed"}
    for node in ("node1", "node2"):
        for task in ("Driver | Install the pinned driver packages (apt)", "Toolkit | Install the pinned packages (apt)",
                     "Containerd | Restart containerd"):
            assert (node, task) in changed, (node, task, sorted(changed))
    n_changed = sum(1 for e in of(events, "runner_on_ok") if e["event_data"]["res"].get("changed"))
    assert len(changed) == n_changed
    # each changed result once, with its own duration
    shown = sorted((m["host"], m["task"], m["secs"]) for m in map(LINE.match, results) if m["status"] == "changed")
    assert shown == sorted((e["event_data"]["host"], e["event_data"]["task"], f"{e['event_data']['duration']:.1f}")
                           for e in of(events, "runner_on_ok") if e["event_data"]["res"].get("changed"))
    assert float(next(s for h, t, s in shown if t.startswith("Driver | Install"))) > 10  # the real install took time


def test_verbose_shows_skipped_and_bookkeeping():
    lines, _, split = plain("lab-driver.jsonl", verbose=True)
    events = [e for _, evs in split for e in evs]
    skipped = [ln for ln in lines if (m := LINE.match(ln)) and m["status"] == "skipped"]
    assert len(skipped) == len(of(events, "runner_on_skipped"))
    assert any("Validating arguments against arg spec" in ln for ln in lines)


def test_driver_report_lines_always_shown():
    lines, _, _ = plain("lab-driver.jsonl")
    for node in ("node1", "node2"):
        i = find(lines, node, "ok", "Driver | Report")
        below = lines[i + 1:i + 4]
        assert all(ln.startswith(f"[{node}]") and not LINE.match(ln) for ln in below), below
        assert any("REBOOT REQUIRED (no NVIDIA kernel module is loaded)" in ln for ln in below), below
        assert any("nvidia-smi exit 9" in ln for ln in below), below
    assert any("Driver | Report kernel headers not required" in ln for ln in lines)
    assert any("are NOT installed: the NVIDIA kernel module is not built" in ln for ln in lines)


def test_failures_with_their_message():
    lines, _, _ = plain("lab-driver.jsonl")
    for node in ("node1", "node2"):
        i = find(lines, node, "failed", "Driver | No host driver packages (driver.mode operator)")
        assert lines[i + 1].startswith(f"[{node}]      driver.mode is operator but host NVIDIA driver packages "
                                       "are installed (nvidia-driver 535.309.01"), lines[i + 1]
    assert lines[-1] == "-- site.yml: 2 hosts, 0 changed, 2 failed/unreachable (0.0s)" or \
        lines[-1].startswith("-- site.yml: 2 hosts, 0 changed, 2 failed/unreachable (")


def test_recap_counts_are_ansibles_and_time_is_the_hosts_tasks():
    _, d, split = plain("lab-driver.jsonl")
    assert [p for p, _, _ in d.runs] == ["preflight.yml", "site.yml", "preflight.yml", "site.yml"]
    for (_playbook, hosts, _), (_, evs) in zip(d.runs, split, strict=True):
        stats = of(evs, "playbook_on_stats")[0]["event_data"]
        for host, rec in hosts.items():
            assert rec.ok == stats["ok"].get(host, 0) and rec.changed == stats["changed"].get(host, 0)
            assert rec.failed == stats["failures"].get(host, 0) and rec.skipped == stats["skipped"].get(host, 0)
            want = sum(e["event_data"]["duration"] for e in evs if e["event"].startswith("runner_on_")
                       and e["event"] != "runner_on_start" and e["event_data"]["host"] == host)
            assert rec.seconds == pytest.approx(want)
    first_site = d.runs[1][1]
    assert first_site["node1"].changed > 0
    table = d.recap().splitlines()
    assert table[0].startswith("RECAP site.yml (")
    assert table[1].split() == ["host", "ok", "changed", "failed", "unreachable", "skipped", "time"]
    rows = {r.split()[0]: r.split()[1:] for r in table[2:]}
    assert set(rows) == {"node1", "node2"}  # the inventory checks run once (on node1)
    assert rows["node1"][2] == "1" and rows["node1"][-1].endswith("s")


def test_localhost_diff_unreachable_ignored_no_log_loop():
    lines, d, _ = plain("localhost.jsonl")
    text = "\n".join(lines)
    assert lines[0] == "== Fixture stage (3 hosts)"
    assert "== Fixture failures (2 hosts)" in lines
    # the file changed from 1 to 2: its diff under the changed line
    i = find(lines, "node-a", "changed", "Fixture | Write a file")
    assert "-key = 1" in "\n".join(lines[i:i + 8]) and "+key = 2" in "\n".join(lines[i:i + 8])
    un = find(lines, "node-dead", "unreachable", "Fixture | Write a file")
    assert lines[un + 1].startswith("[node-dead]") and lines[un + 1].endswith("Connection refused")
    assert not any("Probe that may fail" in ln for ln in lines)  # ignored: verbose only
    assert "(output hidden: no_log)" in text
    secret = find(lines, "node-b", "failed", "Fixture | Secret step")
    assert lines[secret + 1].split("]", 1)[1].strip() == "(output hidden: no_log)"
    loop = find(lines, "node-a", "failed", "Fixture | Loop")
    assert lines[loop + 1].split("]", 1)[1].strip() == "bad: non-zero return code"  # the failing item, named
    assert "REBOOT REQUIRED (fixture)" in text and "value is 2" in text
    rows = {r.split()[0]: r.split() for r in d.recap().splitlines()[2:]}
    assert rows["node-dead"][4] == "1" and rows["node-a"][3] == "1" and rows["node-b"][3] == "1"
    verbose, _, _ = plain("localhost.jsonl", verbose=True)
    assert find(verbose, "node-a", "ignored", "Fixture | Probe that may fail") >= 0


CONTROL = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n")


def terminal(raw: str) -> tuple[list[str], list[str], bool]:
    """Replay what a terminal is sent: the rows left on the screen (up to the cursor's), every row that was erased
    while it held text (the status lines drawn), and whether the cursor is visible at the end. Colours are
    ignored; any other control sequence fails the test."""
    rows, erased, y, x, cursor, pos = [""], [], 0, 0, True, 0
    for m in [*CONTROL.finditer(raw), None]:
        text = raw[pos:m.start() if m else len(raw)]
        rows[y] = rows[y][:x].ljust(x) + text + rows[y][x + len(text):]
        x += len(text)
        if m is None:
            break
        pos, code = m.end(), m.group()
        if code == "\r":
            x = 0
        elif code == "\n":
            y, x = y + 1, 0
            rows += [""] * (y + 1 - len(rows))
        elif m[2] == "K" and m[1] == "2":
            if rows[y]:
                erased.append(rows[y])
            rows[y] = ""
        elif m[2] == "A":
            y = max(0, y - int(m[1] or 1))
        elif m[1] == "?25" and m[2] in "lh":
            cursor = m[2] == "h"
        elif m[2] != "m":
            raise AssertionError(f"unexpected control sequence {code!r}")
    while len(rows) > y + 1 and not rows[-1]:  # empty rows below the cursor are not output
        rows.pop()
    return rows, erased, cursor


@pytest.fixture(autouse=True)
def _a_terminal_type(monkeypatch):
    """The tests that draw on a forced terminal: rich draws nothing live where TERM is dumb (as on some CI)."""
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_pipe_gets_no_escape_codes_tty_gets_a_status_line():
    pipe = io.StringIO()
    replay(Display(pipe), "lab-driver.jsonl")
    out = pipe.getvalue()
    assert "\x1b" not in out and "\r" not in out and "hosts - changed" not in out
    assert "== NVIDIA driver (2 hosts)" in out
    assert out.splitlines() == plain("lab-driver.jsonl")[0]  # a stream gets exactly the lines a line sink gets

    tty = io.StringIO()
    clock = iter(range(10**6))
    d = Display(tty, tty=True, width=80, tick=0, clock=lambda: float(next(clock)))
    replay(d, "lab-driver.jsonl")
    raw = tty.getvalue()
    assert re.search(r"\x1b\[[0-9;]*31mfailed\x1b\[0m", raw), raw[:500]  # a terminal: colours, failed in red
    screen, statuses, cursor = terminal(raw)
    assert cursor  # close() gave the cursor back
    assert screen[-1] == "" and screen[-2].startswith("-- site.yml: 2 hosts, 0 changed, 2 failed/unreachable (")
    assert statuses, raw[:500]
    for st in statuses:
        assert len(st) <= 80, st
        assert re.match(r"^\d+/(\d+|\?) hosts - changed \d+ - failed \d+ - ", st), st
    assert any(st.startswith("2/2 hosts") and "Driver | " in st for st in statuses)
    assert any(re.search(r"changed [1-9]", st) for st in statuses)
    assert any(st.endswith("...") for st in statuses)  # a long task name cut to the width
    # what stays on the screen is the lines a pipe gets, no status line left behind (the run summaries have
    # other times: the clock ticks at every call here)
    assert [ln for ln in screen[:-1] if not ln.startswith("--")] == [ln for ln in out.splitlines()
                                                                     if not ln.startswith("--")]
    assert len([ln for ln in screen if ln.startswith("-- ")]) == 4


def test_status_line_redrawn_by_the_clock():
    """tick > 0: rich's refresh thread redraws the status line with the elapsed time between events."""
    now = [100.0]
    tty = io.StringIO()
    d = Display(tty, tty=True, width=100, tick=0.01, clock=lambda: now[0])
    d.start_run("site.yml", lambda p: 2, ["node1", "node2"])
    d.event({"event": "playbook_on_play_start", "event_data": {"play": "NVIDIA driver", "play_pattern": "all"}})
    d.event({"event": "playbook_on_task_start", "event_data": {"task": "Driver | Install"}})
    now[0] = 175.0
    deadline = time.monotonic() + 5
    while "1:15" not in tty.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    d.close()
    screen, statuses, cursor = terminal(tty.getvalue())
    assert "0/2 hosts - changed 0 - failed 0 - Driver | Install - 1:15" in statuses and cursor
    assert screen == ["== NVIDIA driver (2 hosts)", ""]  # close() in the middle of a run removes the status line
    assert d._live is None  # stopped with its thread


def test_status_line_counts_hosts_of_the_current_task():
    meta, events = load("lab-driver.jsonl")
    d = Display(io.StringIO(), tty=True, width=200, tick=0, clock=lambda: 0.0)
    playbook, evs = runs(events)[1]
    d.start_run(playbook, lambda p: meta["patterns"].get(p), meta["hosts"])
    seen = 0
    for ev in evs:
        d.event(ev)
        if ev["event"] == "playbook_on_task_start" and ev["event_data"]["task"] == "Driver | Report":
            assert d.status_text().startswith("0/2 hosts")
            seen = 1
        elif seen == 1 and ev["event"] == "runner_on_ok":
            assert d.status_text().startswith("1/2 hosts") and "Driver | Report" in d.status_text()
            seen = 2
    assert seen == 2


SECRETS = ("hunter2-extravar", "s3cret-env-value", "tok-in-args")


def _plant(ev: dict) -> dict:
    ev = json.loads(json.dumps(ev))
    data = ev.setdefault("event_data", {})
    data["task_args"] = {"password": SECRETS[2]}
    data["extra_vars"] = {"registry_password": SECRETS[0]}
    ev["stdout"] = f"ok: [x] => {{'env': {{'GPU_REGISTRY_PASSWORD': '{SECRETS[1]}'}}}}"
    ev["env"] = {"GPU_REGISTRY_PASSWORD": SECRETS[1]}
    if isinstance(data.get("res"), dict):
        data["res"]["invocation"] = {"module_args": {"password": SECRETS[2], "environment": {"X": SECRETS[1]}}}
    return ev


@pytest.mark.parametrize("verbose", [False, True])
def test_never_prints_extravars_environment_or_arguments(verbose):
    out = io.StringIO()
    d = Display(out, verbose=verbose, tty=True, width=120, tick=0)
    meta, events = load("lab-driver.jsonl")
    for playbook, evs in runs(events):
        d.start_run(playbook, lambda p: meta["patterns"].get(p), meta["hosts"])
        for ev in evs:
            d.event(_plant(ev))
        d.finish_run()
    d.close()
    text = out.getvalue() + d.recap()
    assert "REBOOT REQUIRED" in text  # the planted events were displayed
    for secret in SECRETS:
        assert secret not in text


def test_no_log_results_print_no_message_and_no_diff():
    lines: list[str] = []
    d = Display(lines.append, verbose=True)
    res = {"_ansible_no_log": True, "msg": "token=abc", "changed": True,
           "diff": [{"before": "a=token1\n", "after": "a=token2\n"}]}
    d.event({"event": "runner_on_ok", "event_data": {"host": "h", "task": "X | Report", "duration": 1, "res": res}})
    d.event({"event": "runner_on_failed", "event_data": {"host": "h", "task": "X | Y", "duration": 1, "res": res}})
    assert not any("token" in ln for ln in lines), lines
    assert lines[1].endswith("(output hidden: no_log)") and lines[3].endswith("(output hidden: no_log)")


def test_closed_stream_does_not_raise():
    class Closed(io.StringIO):
        def write(self, s):
            raise BrokenPipeError

    d = Display(Closed(), tty=True, tick=0)
    d.note("x")
    d.event({"event": "playbook_on_play_start", "event_data": {"play": "P", "play_pattern": "all"}})
    d.close()
    for tty in (True, False):  # a whole run: never an exception (rich itself would exit on a broken pipe)
        d = Display(Closed(), tty=tty, tick=0)
        replay(d, "localhost.jsonl")
        d.print_recap(Closed())
        assert d.runs


def test_recap_table_bad_hosts_first():
    t = recap_table({"b": HostRecap(ok=3), "a": HostRecap(ok=1), "z": HostRecap(unreachable=1, seconds=2.25)})
    rows = [r.split()[0] for r in t.splitlines()[1:]]
    assert rows == ["z", "a", "b"]
    assert t.splitlines()[1].rstrip().endswith("2.2s") or t.splitlines()[1].rstrip().endswith("2.3s")


@pytest.mark.parametrize("tty", [True, False])
def test_a_stream_without_utf8_gets_replacement_characters(tty):
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    d = Display(stream, tty=tty, width=60, tick=0)
    d.start_run("x.yml", lambda p: 1, ["h"])
    d.event({"event": "playbook_on_play_start", "event_data": {"play": "Überprüfung", "play_pattern": "all"}})
    d.event({"event": "runner_on_failed", "event_data": {"host": "h", "task": "T | Prüfen", "duration": 0.5,
                                                         "res": {"msg": "Größe falsch"}}})
    d.close()
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "== ?berpr?fung (1 host)" in text and "Gr??e falsch" in text
    assert "[h] failed       T | Pr?fen  (0.5s)" in terminal(text)[0]


def test_control_characters_in_event_text_are_not_sent_to_the_terminal():
    """A remote message or task name with escape sequences must not reach the admin's terminal (or a log)."""
    ev = {"event": "runner_on_failed", "event_data": {"host": "h", "task": "T | \x1b]0;title\x07x\ty",
                                                      "duration": 0.5, "res": {"msg": "bad \x1b[2J\x1b[31mred\r!"}}}
    lines: list[str] = []
    Display(lines.append).event(ev)  # a line sink gets the text as it is
    assert "\x1b[2J" in lines[1]
    pipe, tty = io.StringIO(), io.StringIO()
    for d in (Display(pipe), Display(tty, tty=True, tick=0)):
        d.start_run("x.yml", lambda p: 1, ["h"])
        d.event(ev)
        d.note("stage: one\nstage: two")
        d.close()
    assert pipe.getvalue().splitlines() == ["[h] failed       T | ?]0;title?x y  (0.5s)",
                                            "[h]    bad ?[2J?[31mred !", "stage: one", "stage: two"]
    screen, _, _ = terminal(tty.getvalue())  # fails on any control sequence other than rich's own
    assert screen[:4] == pipe.getvalue().splitlines()


def test_no_color_on_a_terminal(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    tty = io.StringIO()
    replay(Display(tty, tty=True, width=80, tick=0), "localhost.jsonl")
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", tty.getvalue())  # bold and the status line, no colours
    assert terminal(tty.getvalue())[1]


def test_status_line_ends_with_the_run():
    meta, events = load("localhost.jsonl")
    tty = io.StringIO()
    d = Display(tty, tty=True, width=120, tick=0)
    (playbook, evs), = runs(events)
    d.start_run(playbook, lambda p: meta["patterns"].get(p), meta["hosts"])
    for ev in evs:
        d.event(ev)
    assert d.status_text().startswith(("0/", "1/", "2/", "3/"))
    d.finish_run()
    assert d.status_text() == ""  # no current task: nothing ticks on during the next stage
    d.note("operator: waiting for the operator")
    screen, statuses, _ = terminal(tty.getvalue())
    assert not [ln for ln in screen if " hosts - changed " in ln]  # the status line is gone, not redrawn
    assert screen[-2:] == ["operator: waiting for the operator", ""]
    d.close()
    assert statuses


def test_print_recap_plain_off_a_terminal_styled_on_one():
    _, d, _ = plain("localhost.jsonl")
    pipe = io.StringIO()
    d.print_recap(pipe)
    assert pipe.getvalue() == d.recap() + "\n" and "\x1b" not in pipe.getvalue()
    tty = io.StringIO()
    d.print_recap(Console(file=tty, force_terminal=True, width=120))
    screen, _, _ = terminal(tty.getvalue())
    assert "\x1b[1m" in tty.getvalue() and screen[0] == d.recap().splitlines()[0]
    assert screen[1] == d.recap().splitlines()[1] and set(screen[2]) == {"\u2500"}  # the same layout, and a rule
    assert screen[3:-1] == d.recap().splitlines()[2:]


def test_rich_is_imported_only_to_draw(tmp_path):
    """`gpu-install --help` and `render` start fast: rich comes in with the first table or terminal drawing."""
    code = (
        "import sys; from installer.cli import build_parser, main; build_parser(); "
        "import installer.progress, installer.ui; "
        f"rc = main(['render', '-s', 'inventories/sample/site.yaml', '-o', '{tmp_path}/v.yaml']); "
        "d = installer.progress.Display(open('/dev/null', 'w'), tty=False); d.start_run('x.yml'); "
        "d.event({'event': 'playbook_on_play_start', 'event_data': {'play': 'P'}}); d.finish_run(); d.close(); "
        "before = 'rich' in sys.modules; d.recap(); print(rc, before, 'rich' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split()[-3:] == ["0", "False", "True"], out.stdout + out.stderr


# ---------------------------------------------------------------------------------------------------- installer.ui


def test_table_plain_text_aligned_never_wrapped(monkeypatch):
    monkeypatch.setenv("COLUMNS", "20")  # no effect: a table is never wrapped to a terminal's width
    long = "x" * 150
    text = table("Catalog v25.3.0", ["component", "version", ("image", "left"), "pods"],
                 [["driver", "550.144.03", long, 2], ["toolkit", "v1.17.4", "nvcr.io/nvidia/k8s/toolkit", 12],
                  ["dcgm", None, "", 0]])
    lines = text.splitlines()
    assert lines[0] == "Catalog v25.3.0"
    assert lines[1].split() == ["component", "version", "image", "pods"]
    assert lines[2].split() == ["driver", "550.144.03", long, "2"] and lines[4].split() == ["dcgm", "0"]
    assert all(ln == ln.rstrip() for ln in lines) and "\x1b" not in text
    ends = {len(ln) for ln in lines[1:]}
    assert len(ends) == 1  # the numbers (and their header) are right-aligned: every row ends at the same column
    assert lines[1].index("image") == lines[2].index(long)  # a text column is left-aligned
    assert table("", ["a"], [["b"]]).splitlines() == ["a", "b"]  # no title: no title line
    assert table("t", ["host"], [["bad\x1b[31m"]]).splitlines()[2] == "bad?[31m"
    assert table("t", ["ok"], [[True], [False]]).splitlines()[2:] == ["True", "False"]  # booleans are not numbers


def test_print_table_ascii_rule_where_the_terminal_lacks_utf8():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    print_table("Stages", ["stage", ("result", "left"), "seconds"], [["driver", "ok", 12.5], ["mig", "skipped", 0]],
                stream, tty=True)
    stream.flush()
    screen, _, _ = terminal(raw.getvalue().decode("ascii"))
    assert screen[0] == "Stages" and screen[1].split() == ["stage", "result", "seconds"]
    assert set(screen[2]) == {"-"} and screen[3].split() == ["driver", "ok", "12.5"]
    assert [screen[1], *screen[3:-1]] == table("", ["stage", ("result", "left"), "seconds"],
                                               [["driver", "ok", 12.5], ["mig", "skipped", 0]]).splitlines()


def test_transfer_plain_lines_every_10_percent_and_done():
    now = [100.0]
    out = io.StringIO()
    with TransferProgress(out, clock=lambda: now[0]) as progress:
        with progress.add("nvcr.io/nvidia/driver:550.144.03-ubuntu22.04", total=100_000_000) as t:
            for _ in range(100):
                now[0] += 0.1
                t.advance(1_000_000)
    lines = out.getvalue().splitlines()
    assert "\x1b" not in out.getvalue() and "\r" not in out.getvalue()
    assert len(lines) == 10, lines
    for i, ln in enumerate(lines[:9], 1):
        m = re.fullmatch(r"nvcr\.io/nvidia/driver:550\.144\.03-ubuntu22\.04: (\d+)\.0 MB / 100\.0 MB \((\d+)%\), "
                         r"10\.0 MB/s, ETA 0:(\d\d)", ln)
        assert m and int(m[1]) == int(m[2]) == 10 * i and int(m[3]) == 10 - i, ln
    assert lines[9] == "nvcr.io/nvidia/driver:550.144.03-ubuntu22.04: done, 100.0 MB in 0:10 (10.0 MB/s)"


def test_transfer_plain_lines_at_most_one_per_interval_or_step():
    now = [0.0]
    seen: list[tuple[float, str]] = []
    progress = TransferProgress(lambda line: seen.append((now[0], line)), interval=30, clock=lambda: now[0])
    t = progress.add("slow", total=1000)
    for _ in range(1000):  # 1000 s, a byte a second
        now[0] += 1
        t.advance(1)
    t.done()
    steps = [int(re.search(r"\((\d+)%\)", ln)[1]) // 10 for _, ln in seen[:-1]]
    for (t0, _), (t1, _), s0, s1 in zip(seen, seen[1:], steps, steps[1:], strict=False):
        assert t1 - t0 >= 30 or s1 > s0
    assert steps == sorted(steps) and set(range(1, 10)) <= set(steps)  # every 10% step has its line
    assert 30 <= len(seen) <= 1000 / 30 + 10 + 1, len(seen)
    assert seen[-1][1] == "slow: done, 1.0 kB in 16:40 (1 byte/s)"


def test_transfer_items_unknown_total_and_a_stop():
    now = [0.0]
    lines: list[str] = []
    progress = TransferProgress(lines.append, unit="images", interval=5, clock=lambda: now[0])
    with progress.add("mirror: pull", total=None) as t:
        for _ in range(12):
            now[0] += 1
            t.advance()
    assert lines == ["mirror: pull: 5 images", "mirror: pull: 10 images", "mirror: pull: done, 12 images in 0:12"]
    lines.clear()
    with pytest.raises(RuntimeError):
        with progress.add("mirror: push", total=40) as t:
            t.update(4)  # 10%: a line
            t.update(5)
            now[0] += 2
            t.update(30)  # 75%: one line for the steps it crossed
            raise RuntimeError("registry went away")
    assert lines == ["mirror: push: 4/40 images (10%), ETA ?", "mirror: push: 30/40 images (75%), ETA 0:01",
                     "mirror: push: stopped at 30/40 images (75%)"]
    t.advance(5)  # after the end: ignored
    assert len(lines) == 3
    with pytest.raises(ValueError):
        TransferProgress(lines.append, step=0)


def test_transfer_on_a_terminal_console():
    now = [0.0]
    buf = io.StringIO()
    console = Console(force_terminal=True, file=buf, width=100)
    with TransferProgress(console, tick=0, clock=lambda: now[0]) as progress:
        a = progress.add("registry.lab/nvidia/driver:550", total=50_000_000)
        b = progress.add("registry.lab/nvidia/toolkit:1.17", total=None)
        for _ in range(3):
            now[0] += 1
            a.advance(10_000_000)
            b.advance(1_000_000)
        mid = terminal(buf.getvalue())[0]
        a.update(50_000_000)
        a.done()
    screen, drawn, cursor = terminal(buf.getvalue())
    raw = buf.getvalue()
    assert "\x1b[" in raw and cursor
    bar = next(ln for ln in mid if ln.startswith("registry.lab/nvidia/driver:550 "))
    assert "\u2501" in bar and "30.0/50.0 MB" in bar and "10.0 MB/s" in bar and "00:02" in bar, bar
    assert any(ln.startswith("registry.lab/nvidia/toolkit:1.17 ") and "3.0/? MB" in ln for ln in mid), mid
    # the finished transfer leaves its line above the bars and its bar goes; the one in flight stays
    assert "registry.lab/nvidia/driver:550: done, 50.0 MB in 0:03 (16.7 MB/s)" in screen
    assert not [ln for ln in screen if ln.startswith("registry.lab/nvidia/driver:550 ")]
    assert "registry.lab/nvidia/driver:550 " not in raw.split("driver:550: done")[1]  # not even for a moment
    assert [ln for ln in screen if ln.startswith("registry.lab/nvidia/toolkit:1.17 ")]
    assert drawn


def test_transfer_on_a_terminal_without_utf8():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    now = [0.0]
    with TransferProgress(stream, unit="layers", tty=True, width=80, tick=0, clock=lambda: now[0]) as progress:
        with progress.add("Überprüfung", total=4) as t:
            now[0] += 1
            t.advance(2)
    stream.flush()
    screen, drawn, _ = terminal(raw.getvalue().decode("ascii"))  # only ASCII was written
    assert "?berpr?fung: done, 2 layers in 0:01" in screen
    assert any("2/4 layers" in ln and "-" in ln for ln in drawn), drawn


def _real_traceback(code: str) -> str:
    """The stderr of a real Python process that dies with code's exception (what a module killed on a host leaves)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback (most recent call last):" in proc.stderr, proc.stderr
    return proc.stderr


def test_a_traceback_from_the_host_is_reduced_to_its_exception():
    """A module that died on the host (node stopped or link cut mid-task): Ansible relays its stderr. The one-line
    message keeps Ansible's words and the exception, not the frames: printed whole it reads as gpu-install's own crash
    and, cut at 500 characters, loses the exception."""
    from installer.progress import message

    frames = "def f(n):\n    return f(n - 1) if n else {}['gone']\nf(30)"  # 30 frames: far over 500 characters
    stderr = _real_traceback(frames)
    unreachable = {"unreachable": True, "msg": 'Data could not be sent to remote host "10.250.2.12". Make sure this '
                                             f"host can be reached over ssh: {stderr}"}
    got = message(unreachable)
    assert "Traceback" not in got and 'File "' not in got, got
    assert got.startswith('Data could not be sent to remote host "10.250.2.12". Make sure this host can be reached '
                          "over ssh: (a Python traceback from the host, ending in: KeyError: 'gone')"), got
    failed = {"failed": True, "msg": "MODULE FAILURE\nSee stdout/stderr for the exact error",
              "module_stderr": stderr}
    assert message(failed) == "MODULE FAILURE See stdout/stderr for the exact error"  # msg first, as before
    chained = _real_traceback("try:\n    {}['a']\nexcept KeyError:\n    raise ValueError('then this')")
    got = message({"failed": True, "msg": chained + "and Ansible's last words"})
    assert "Traceback" not in got, got
    assert "ending in: KeyError: 'a'" in got and "ending in: ValueError: then this" in got, got
    assert got.endswith("and Ansible's last words"), got
    cut = message({"failed": True, "msg": "over ssh: Traceback (most recent call last):\n  File \"x.py\", line 1"})
    assert cut == "over ssh: (a Python traceback from the host, ending in: cut off before the exception)", cut
    plain = {"failed": True, "msg": "Failed to connect to the host via ssh: Connection refused"}
    assert message(plain) == plain["msg"]
