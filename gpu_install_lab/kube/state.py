"""What the control plane keeps under <lab_dir>/kube: state.json (ports, recorded processes, hollow
nodes, network namespace, tokens), the token file and kubeconfigs, the processes' logs. ControlPlaneState
is the base of ControlPlane (controlplane.py) and of its HollowNodes part (nodes.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_install_lab import proc
from gpu_install_lab.kube.binaries import Progress
from installer.errors import EnvironmentProblem
from installer.util import atomic_write

STATE_VERSION = 1
PYTHONPATH = str(Path(__file__).resolve().parents[2])  # where gpu_install_lab is: `python -m` children find it


# --------------------------------------------------------------------------- ports
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port



class ControlPlaneState:
    """All state under lab_dir/"kube"; every process started is recorded there at once, so down() can stop
    it after a crash."""

    def __init__(self, lab_dir: Path, progress: Progress = print):
        self.lab_dir = Path(lab_dir)
        self.dir = self.lab_dir / "kube"
        self.kubeconfig = self.dir / "kubeconfig"
        self.progress = progress
        self.state_path = self.dir / "state.json"
        self.state: dict[str, Any] = self._load()

    # ---------------------------------------------------------------- state
    def _load(self) -> dict[str, Any]:
        blank = {"version": STATE_VERSION, "ports": {}, "processes": {}, "nodes": {}, "netns": None}
        if not self.state_path.exists():
            return blank
        try:
            data = json.loads(self.state_path.read_text())
        except (OSError, ValueError) as exc:
            raise EnvironmentProblem(
                f"control-plane state {self.state_path} is unreadable: {exc}",
                hint=f"make sure no lab process is left, then remove {self.dir}",
            ) from exc
        blank.update(data)
        return blank

    def _save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write(self.state_path, json.dumps(self.state, indent=2, sort_keys=True) + "\n", mode=0o600)

    @property
    def netns(self) -> str:
        return "gik-" + hashlib.sha1(str(self.dir.resolve()).encode()).hexdigest()[:10]

    def _port(self, name: str, owner: str | None = None) -> int:
        """The port recorded for name; a new free one if there is none yet, or if its owner process
        is not running and something else took the port meanwhile (e.g. after a reboot)."""
        ports = self.state["ports"]
        if name in ports and owner and not self._running(owner) and not _port_free(int(ports[name])):
            self.progress(f"kube: port {ports[name]} of {name} is taken by something else; choosing another")
            del ports[name]
        if name not in ports:
            used = set(ports.values())
            port = _free_port()
            while port in used:
                port = _free_port()
            ports[name] = port
            self._save()
        return int(ports[name])

    # ---------------------------------------------------------------- processes
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
        log_path = self.dir / "logs" / f"{name}.log"
        rec = proc.spawn(argv, log_path, env=env or None)  # its own session: survives the CLI, never gets its Ctrl-C
        rec.update(argv=argv[:3] + (["..."] if len(argv) > 3 else []), log=str(log_path))
        self.state["processes"][name] = rec  # recorded at once: down() can stop it after a crash
        self._save()
        return rec

    def _stop_component(self, name: str) -> None:
        rec = self.state["processes"].get(name)
        if rec:
            proc.stop(rec)
            self.state["processes"].pop(name, None)
            self._save()

    def _running(self, name: str) -> bool:
        return proc.alive(self.state["processes"].get(name))

    def _log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.dir / "logs" / f"{name}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n    ".join(text.splitlines()[-lines:])

    def _wait(self, what: str, check: Callable[[], bool], timeout: float, proc_name: str | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc_name and not self._running(proc_name):
                raise EnvironmentProblem(
                    f"{proc_name} exited while waiting for {what}; log tail:\n    {self._log_tail(proc_name)}",
                    hint=f"full log: {self.dir / 'logs' / (proc_name + '.log')}",
                )
            try:
                if check():
                    return
            except Exception:  # noqa: BLE001 - not ready yet
                pass
            time.sleep(0.3)
        tail = self._log_tail(proc_name) if proc_name else ""
        raise EnvironmentProblem(
            f"timed out after {timeout:.0f}s waiting for {what}" + (f"; log tail:\n    {tail}" if tail else ""),
            hint=f"logs in {self.dir / 'logs'}",
        )

    # ---------------------------------------------------------------- credentials
    def _token(self, user: str) -> str:
        token: str = self.state["tokens"][user]
        return token

    def _write_kubeconfig(self, path: Path, server: str, user: str, token: str | None = None,
                          cert: str | None = None, key: str | None = None) -> None:
        ca = base64.b64encode((self.dir / "pki" / "ca.crt").read_bytes()).decode()
        creds = {"token": token} if token else {
            "client-certificate-data": base64.b64encode(cert.encode()).decode(),  # type: ignore[union-attr]
            "client-key-data": base64.b64encode(key.encode()).decode(),  # type: ignore[union-attr]
        }
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "gpu-install-lab", "cluster": {"server": server, "certificate-authority-data": ca}}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "gpu-install-lab", "context": {"cluster": "gpu-install-lab", "user": user}}],
            "current-context": "gpu-install-lab",
        }
        atomic_write(path, json.dumps(cfg, indent=2) + "\n", mode=0o600)

    def _ensure_tokens(self) -> None:
        tokens = self.state.setdefault("tokens", {})
        for user in ("admin", "kube-scheduler", "kube-controller-manager"):
            tokens.setdefault(user, base64.b32encode(os.urandom(20)).decode().lower())
        self._save()
        self._write_token_file()

    def _write_token_file(self) -> None:
        # token,user,uid,"group1,group2"
        rows = [
            f'{self._token("admin")},lab-admin,lab-admin,"system:masters"',
            f'{self._token("kube-scheduler")},system:kube-scheduler,system:kube-scheduler',
            f'{self._token("kube-controller-manager")},system:kube-controller-manager,system:kube-controller-manager',
        ]
        atomic_write(self.dir / "tokens.csv", "\n".join(rows) + "\n", mode=0o600)
