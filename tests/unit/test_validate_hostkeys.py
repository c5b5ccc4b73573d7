"""validate's SSH host key rules (installer/validate/knownhosts.py) against a real SSH server: a paramiko server on
127.0.0.1 (a real handshake, key exchange and host key signature; it answers the probe with a recorded nvidia-smi
document). HOME points at a temporary directory, so ~/.ssh/known_hosts is the test's own.

OpenSSH's rules: `no` accepts and saves nowhere; `accept-new` appends to the UserKnownHostsFile given and nowhere
else; the default refuses an unknown key, naming the host and the fix; @revoked refuses; @cert-authority lines are
not used and never an error; a known_hosts file is only ever appended to. A refused key means nothing was sent: the
server never saw an authentication attempt.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from pathlib import Path

import paramiko
import pytest
import yaml

from installer.validate import knownhosts, probe
from installer.validate.node import Expectations

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
PASSWORD = "probe-Pw-7f3e"  # noqa: S105 - the test server's
# what the node answers to the probe: a recorded A100 document and its PCI device
ANSWER = (f"{probe.MARK} nvidia-smi\n{(FIX / 'a100-sxm4-v12.xml').read_text()}\n{probe.MARK} rc 0\n"
          f"{probe.MARK} lspci\n0000:07:00.0 3D controller: NVIDIA Corporation\n{probe.MARK} modules\nnvidia\n"
          f"{probe.MARK} secureboot\n\n{probe.MARK} reboot\n\n{probe.MARK} end\n").encode()
KNOWN_HOSTS_HEAD = ("# managed by hand: keep this comment\n"
                    "gpu7.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxd2fCYuvzwJNpy7OpCdHWlJXbrqvVJCh4wM1lPz7Pd\n"
                    "\n# another comment, and a line paramiko cannot read:\n"
                    "broken.example.com ssh-ed25519 !!!not-base64!!!\n"
                    "sk.example.com sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIA==\n")


class _Node(paramiko.ServerInterface):
    def __init__(self, log: dict, on_exec=None) -> None:
        self.log = log
        self.on_exec = on_exec  # (channel, command) -> None, run in a thread: another answer than ANSWER

    def get_allowed_auths(self, username):
        return "password"

    def check_auth_password(self, username, password):
        self.log["auth"].append(username)
        return paramiko.AUTH_SUCCESSFUL if password == PASSWORD else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        self.log["exec"].append(command.decode())
        if self.on_exec is not None:
            threading.Thread(target=self.on_exec, args=(channel, command.decode()), daemon=True).start()
            return True

        def answer():  # EOF, then wait for the client to close (a close before the exec reply would fail it)
            channel.sendall(ANSWER)
            channel.send_exit_status(0)
            channel.shutdown_write()
            channel.settimeout(30)
            try:
                channel.recv(1)
            finally:
                with contextlib.suppress(EOFError, OSError):  # the client has gone already
                    channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


class SSHServer:
    """An SSH server on 127.0.0.1 with one ECDSA host key; log: the user names that authenticated, the commands run.
    on_exec(channel, command): how a command is answered (default: ANSWER, the recorded probe output)."""

    def __init__(self, on_exec=None) -> None:
        self.on_exec = on_exec
        self.key = paramiko.ECDSAKey.generate()
        self.log: dict = {"auth": [], "exec": [], "connections": 0}
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.name = f"[127.0.0.1]:{self.port}"
        self.transports: list[paramiko.Transport] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.log["connections"] += 1
            t = paramiko.Transport(conn)
            t.add_server_key(self.key)
            self.transports.append(t)
            try:
                t.start_server(server=_Node(self.log, self.on_exec))
            except (paramiko.SSHException, EOFError, OSError):
                continue

    def line(self, names: str | None = None) -> str:
        return f"{names or self.name} {self.key.get_name()} {self.key.get_base64()}\n"

    def close(self) -> None:
        self.sock.close()
        for t in self.transports:
            t.close()


@pytest.fixture
def node():
    server = SSHServer()
    yield server
    server.close()


@pytest.fixture
def home(tmp_path, monkeypatch):
    """HOME with a ~/.ssh/known_hosts of comments and other hosts, unknown to the test server."""
    h = tmp_path / "home"
    (h / ".ssh").mkdir(parents=True)
    (h / ".ssh" / "known_hosts").write_text(KNOWN_HOSTS_HEAD)
    monkeypatch.setenv("HOME", str(h))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return h


def target(server: SSHServer, args: str = "", **more) -> probe.Target:
    return probe.Target("gpu1", "gpu-01", {"ansible_host": "127.0.0.1", "ansible_port": server.port,
                                           "ansible_user": "probe", "ansible_password": PASSWORD,
                                           "ansible_ssh_common_args": args, **more})


def reach(server: SSHServer, args: str = "") -> probe.Check:
    checks = probe.run([target(server, args)], lambda _t: Expectations(), timeout=10)
    return next(c for c in checks if c.check == "node.reachable")


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_accepts_and_saves_nowhere(node, home, tmp_path):
    before = snapshot(home)
    for args in ("-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null", "-o StrictHostKeyChecking=no"):
        check = reach(node, args)
        assert check.status == "pass", check
    assert node.log["auth"] == ["probe", "probe"] and len(node.log["exec"]) == 2
    assert snapshot(home) == before  # byte for byte, and no file added under HOME


def test_the_cli_with_no_leaves_known_hosts_byte_for_byte(node, home, tmp_path, cli):
    """`gpu-install validate --only node` end to end, StrictHostKeyChecking=no + UserKnownHostsFile=/dev/null (the
    combination that used to save the unverified key into ~/.ssh/known_hosts and rewrite it without its comments)."""
    before = (home / ".ssh" / "known_hosts").read_bytes()
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}}))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {"hosts": {"gpu1": {
        "ansible_host": "127.0.0.1", "ansible_port": node.port, "ansible_user": "probe", "ansible_password": PASSWORD,
        "gpu_install_os": "ubuntu22.04", "gpu_install_kernel": "5.15.0-105-generic",
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}}}))
    report = tmp_path / "report.json"
    rc, out, err = cli("validate", "-s", site, "-i", inventory, "--only", "node", "-q", "--ssh-timeout", "10",
                       "--json", report)
    checks = {c["check"]: c for c in json.loads(report.read_text())["checks"]}
    assert checks["node.reachable"]["status"] == "pass", (rc, out, err)
    assert checks["node.nvidia-smi"]["status"] == "pass"
    assert rc in (0, 6), (out, err)  # reached: the node's own findings decide the rest
    assert node.log["exec"] and (home / ".ssh" / "known_hosts").read_bytes() == before
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["known_hosts"]


def test_default_refuses_an_unknown_key_naming_host_and_fix(node, home):
    before = snapshot(home)
    for args in ("", "-o StrictHostKeyChecking=yes", "-o StrictHostKeyChecking=ask"):
        check = reach(node, args)
        assert check.status == "unreachable", check
        assert node.name in check.message and "is not in known_hosts" in check.message
        assert str(home / ".ssh" / "known_hosts") in check.message
        assert f"ssh-keyscan -p {node.port} 127.0.0.1 >> {home / '.ssh' / 'known_hosts'}" in check.fix
        assert "accept-new" in check.fix
    assert node.log["auth"] == [] and node.log["exec"] == []  # refused before a credential was sent
    assert snapshot(home) == before


def test_common_and_extra_args_are_read_as_ssh_reads_them_from_ansible(node, home, tmp_path):
    """Ansible gives ssh the common args, then the extra args; ssh keeps each option's first value. A
    StrictHostKeyChecking=no in the extra args does not switch off the =yes of the common args (the node is refused
    before a credential is sent), and the extra args are read even when common args are set (a known_hosts file
    named only there is used)."""
    extra = {"ansible_ssh_extra_args": "-o StrictHostKeyChecking=no"}
    checks = probe.run([target(node, "-o StrictHostKeyChecking=yes", **extra)], lambda _t: Expectations(), timeout=10)
    check = next(c for c in checks if c.check == "node.reachable")
    assert check.status == "unreachable" and "is not in known_hosts" in check.message, check
    assert node.log["auth"] == [] and node.log["exec"] == []
    given = tmp_path / "lab_known_hosts"
    given.write_text(node.line())
    extra = {"ansible_ssh_extra_args": f"-o UserKnownHostsFile={given} -o StrictHostKeyChecking=yes"}
    checks = probe.run([target(node, "-o ConnectTimeout=3", **extra)], lambda _t: Expectations(), timeout=10)
    assert next(c for c in checks if c.check == "node.reachable").status == "pass"
    assert node.log["auth"] == ["probe"]


def test_accept_new_appends_only_to_the_file_given(node, home, tmp_path):
    given = tmp_path / "lab_known_hosts"
    given.write_text("# lab nodes\nother.lab ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHxd2fCYuvzwJNpy7OpCdHWlJXbrqvVJCh4wM1lPz7Pd")
    head = given.read_bytes()  # no final newline: the new line must not be glued to it
    before = snapshot(home)
    check = reach(node, f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={given}")
    assert check.status == "pass", check
    assert given.read_bytes() == head + b"\n" + node.line().encode()
    assert snapshot(home) == before
    # the recorded key is now known: strict checking accepts it, and a second accept-new adds nothing
    assert reach(node, f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={given}").status == "pass"
    assert reach(node, f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={given}").status == "pass"
    assert given.read_bytes() == head + b"\n" + node.line().encode()


def test_accept_new_without_a_file_given_saves_nowhere(node, home, tmp_path):
    before = snapshot(home)
    assert reach(node, "-o StrictHostKeyChecking=accept-new").status == "pass"
    assert snapshot(home) == before


def test_accept_new_into_the_users_own_file_when_that_is_the_file_given(node, home):
    path = home / ".ssh" / "known_hosts"
    assert reach(node, f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={path}").status == "pass"
    assert path.read_text() == KNOWN_HOSTS_HEAD + node.line()  # appended: comments and every line kept


def test_accept_new_into_a_new_file_and_an_unwritable_place(node, home, tmp_path):
    fresh = tmp_path / "fresh_known_hosts"
    assert reach(node, f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={fresh}").status == "pass"
    assert fresh.read_text() == node.line()
    nowhere = tmp_path / "no-such-dir" / "known_hosts"
    check = reach(node, f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={nowhere}")
    assert check.status == "unreachable" and f"cannot record its new host key in {nowhere}" in check.message


def test_the_file_given_replaces_the_default(node, home, tmp_path):
    """As in OpenSSH: with UserKnownHostsFile given, ~/.ssh/known_hosts is not read."""
    (home / ".ssh" / "known_hosts").write_text(KNOWN_HOSTS_HEAD + node.line())
    assert reach(node).status == "pass"  # the default file knows it
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    check = reach(node, f"-o UserKnownHostsFile={empty}")
    assert check.status == "unreachable" and str(empty) in check.message
    assert f">> {empty}" in check.fix


@pytest.mark.parametrize("names", ["127.0.0.1:*", "[127.0.0.1]:*", "[127.0.0.?]:*,!nothing", "HASHED"])
def test_patterns_and_hashed_names(node, home, tmp_path, names):
    if names == "HASHED":
        names = paramiko.HostKeys.hash_host(node.name)
    kh = tmp_path / "kh"
    kh.write_text(node.line(names))
    check = reach(node, f"-o UserKnownHostsFile={kh}")
    assert check.status == ("unreachable" if names == "127.0.0.1:*" else "pass"), (names, check)


def test_a_negated_pattern_rules_the_line_out(node, home, tmp_path):
    kh = tmp_path / "kh"
    kh.write_text(node.line(f"[127.0.0.1]:*,!{node.name}"))
    assert reach(node, f"-o UserKnownHostsFile={kh}").status == "unreachable"


@pytest.mark.parametrize("strict", ["yes", "accept-new", "no"])
def test_revoked_is_refused_whatever_strict_says(node, home, tmp_path, strict):
    kh = tmp_path / "kh"
    # listed as the host's key AND revoked (for another name: a revoked key is never accepted)
    kh.write_text(node.line() + "@revoked * " + node.line("ignored").split(" ", 1)[1])
    head = kh.read_bytes()
    check = reach(node, f"-o StrictHostKeyChecking={strict} -o UserKnownHostsFile={kh}")
    assert check.status == "unreachable", check
    assert "@revoked" in check.message and f"{kh}:2" in check.message and node.name in check.message
    assert node.log["auth"] == [] and kh.read_bytes() == head


def test_revoked_while_another_key_is_known(node, home, tmp_path):
    other = paramiko.ECDSAKey.generate()
    kh = tmp_path / "kh"
    kh.write_text(f"{node.name} {other.get_name()} {other.get_base64()}\n@revoked {node.line()}")
    check = reach(node, f"-o UserKnownHostsFile={kh}")
    assert check.status == "unreachable" and "@revoked" in check.message and node.log["auth"] == []


def test_a_changed_key_is_refused_even_with_no(node, home, tmp_path):
    other = paramiko.ECDSAKey.generate()
    kh = tmp_path / "kh"
    kh.write_text(f"{node.name} {other.get_name()} {other.get_base64()}\n")
    for strict in ("yes", "no", "accept-new"):
        check = reach(node, f"-o StrictHostKeyChecking={strict} -o UserKnownHostsFile={kh}")
        assert check.status == "unreachable" and "CHANGED" in check.message, check
        assert other.fingerprint in check.message and node.key.fingerprint in check.message
        assert "ssh-keygen -R" in check.fix
    assert node.log["auth"] == [] and kh.read_text().count("\n") == 1


def test_cert_authority_lines_are_never_an_error(node, home, tmp_path):
    ca = paramiko.ECDSAKey.generate()
    ca_line = f"@cert-authority *.lab,[127.0.0.1]:* {ca.get_name()} {ca.get_base64()} the site CA\n"
    kh = tmp_path / "kh"
    kh.write_text("# site CA\n" + ca_line)
    check = reach(node, f"-o UserKnownHostsFile={kh}")  # known only through the CA: unknown here, said so
    assert check.status == "unreachable" and "@cert-authority" in check.message and f"{kh}:2" in check.message
    kh.write_text("# site CA\n" + ca_line + node.line())  # with its own key listed too: accepted
    assert reach(node, f"-o UserKnownHostsFile={kh}").status == "pass"
    # the user's default file with CA and revoked lines (of other keys) is read without a crash
    (home / ".ssh" / "known_hosts").write_text(KNOWN_HOSTS_HEAD + ca_line + "@revoked * " + ca_line.split(" ", 2)[2]
                                               + node.line())
    assert reach(node).status == "pass"


def test_damaged_lines_are_skipped_not_fatal(tmp_path):
    kh = tmp_path / "kh"
    good = paramiko.ECDSAKey.generate()
    kh.write_text(KNOWN_HOSTS_HEAD + "@unknown-marker host ssh-ed25519 AAAA\n@revoked\nonly-two fields\n"
                  + f"ok.lab {good.get_name()} {good.get_base64()}\n")
    entries = knownhosts.read_entries(kh)
    assert [(e.patterns, e.where.rsplit(':', 1)[1]) for e in entries] == [("gpu7.example.com", "2"), ("ok.lab", "10")]
    assert knownhosts.read_entries(tmp_path / "missing") == [] and knownhosts.read_entries(Path("/dev/null")) == []


def test_hashed_name_with_a_bad_salt_does_not_match():
    salt = base64.b64encode(b"short").decode()
    assert not knownhosts.matches(f"|1|{salt}|AAAA", "host") and not knownhosts.matches("|1|!!|AAAA", "host")
    assert not knownhosts.matches("|1|x", "host")


def test_jump_host_key_is_checked_too(node, home, tmp_path):
    """ProxyJump: the jump host's key follows the same rules (here unknown: refused before anything is sent)."""
    jump = SSHServer()
    try:
        kh = tmp_path / "kh"
        kh.write_text(node.line())
        check = reach(node, f"-o UserKnownHostsFile={kh} -o ProxyJump=probe@127.0.0.1:{jump.port}")
        assert check.status == "unreachable" and jump.name in check.message, check
        assert jump.log["auth"] == [] and node.log["connections"] == 0
    finally:
        jump.close()
