"""installer.progress: the live per-host display, fed with RECORDED job events of real runs.

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
from pathlib import Path

import pytest

from installer.progress import Display, HostRecap, recap_table

EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "events"
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
    for (playbook, hosts, _), (_, evs) in zip(d.runs, split):
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


def test_pipe_gets_no_escape_codes_tty_gets_a_status_line():
    pipe = io.StringIO()
    replay(Display(pipe), "lab-driver.jsonl")
    out = pipe.getvalue()
    assert "\x1b" not in out and "\r" not in out and "hosts - changed" not in out
    assert "== NVIDIA driver (2 hosts)" in out

    tty = io.StringIO()
    clock = iter(range(10**6))
    d = Display(tty, tty=True, width=80, tick=0, clock=lambda: float(next(clock)))
    replay(d, "lab-driver.jsonl")
    raw = tty.getvalue()
    assert raw.endswith("\n")  # no status line left behind: the run summary replaced it
    statuses = [seg.split("\n")[0] for seg in raw.split("\r\x1b[2K") if seg and not seg.endswith("\n")]
    assert statuses, raw[:500]
    for st in statuses:
        assert len(st) <= 80, st
        assert re.match(r"^\d+/(\d+|\?) hosts - changed \d+ - failed \d+ - ", st), st
    assert any(st.startswith("2/2 hosts") and "Driver | " in st for st in statuses)
    assert any(re.search(r"changed [1-9]", st) for st in statuses)
    # the plain lines are the same as in a pipe, the status line only sits between them
    no_status = "".join(seg for seg in raw.split("\r\x1b[2K") if seg.endswith("\n"))
    assert [ln for ln in no_status.splitlines() if not ln.startswith("--")] == \
        [ln for ln in out.splitlines() if not ln.startswith("--")]


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


def test_recap_table_bad_hosts_first():
    t = recap_table({"b": HostRecap(ok=3), "a": HostRecap(ok=1), "z": HostRecap(unreachable=1, seconds=2.25)})
    rows = [r.split()[0] for r in t.splitlines()[1:]]
    assert rows == ["z", "a", "b"]
    assert t.splitlines()[1].rstrip().endswith("2.2s") or t.splitlines()[1].rstrip().endswith("2.3s")


def test_a_stream_without_utf8_gets_replacement_characters():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    d = Display(stream, tty=True, width=60, tick=0)
    d.start_run("x.yml", lambda p: 1, ["h"])
    d.event({"event": "playbook_on_play_start", "event_data": {"play": "Überprüfung", "play_pattern": "all"}})
    d.event({"event": "runner_on_failed", "event_data": {"host": "h", "task": "T | Prüfen", "duration": 0.5,
                                                         "res": {"msg": "Größe falsch"}}})
    d.close()
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "== ?berpr?fung (1 host)" in text and "Gr??e falsch" in text
