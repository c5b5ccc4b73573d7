"""The bastion's OCI registry: Debian's docker-registry (distribution v2.8) on the bastion's lab
address, TLS with a certificate from the lab CA, optional htpasswd basic auth."""

from __future__ import annotations

import secrets
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from installer.errors import EnvironmentProblem
from installer.util import atomic_write

PORT = 5000
USER = "lab"


def write_config(reg_dir: Path, addr: str, cert: Path, key: Path, auth: bool) -> Path:
    """registry/config.yml (0600: it holds the http secret); with auth also htpasswd + password."""
    reg_dir.mkdir(parents=True, exist_ok=True)
    (reg_dir / "data").mkdir(exist_ok=True)
    config_path = reg_dir / "config.yml"
    old = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    config = {
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(reg_dir / "data")}, "delete": {"enabled": True}},
        "http": {
            "addr": addr,
            "secret": (old or {}).get("http", {}).get("secret") or secrets.token_hex(16),
            "tls": {"certificate": str(cert), "key": str(key)},
        },
    }
    if auth:
        config["auth"] = {"htpasswd": {"realm": "gpu-install-lab", "path": str(ensure_htpasswd(reg_dir))}}
    atomic_write(config_path, yaml.safe_dump(config, sort_keys=False), mode=0o600)
    return config_path


def ensure_htpasswd(reg_dir: Path) -> Path:
    """registry/htpasswd (bcrypt, the only scheme distribution accepts) for user `lab`; the
    password is generated once and kept in registry/password (0600), never printed."""
    import bcrypt  # paramiko's dependency

    pw_file, htpasswd = reg_dir / "password", reg_dir / "htpasswd"
    if not pw_file.exists():
        atomic_write(pw_file, secrets.token_urlsafe(18) + "\n", mode=0o600)
    if not htpasswd.exists():
        pw = pw_file.read_text().strip().encode()
        atomic_write(htpasswd, f"{USER}:{bcrypt.hashpw(pw, bcrypt.gensalt()).decode()}\n", mode=0o600)
    return htpasswd


def wait_ready(url: str, ca: Path, timeout: float = 20) -> None:
    """GET /v2/ over TLS verified with the lab CA: 200 (open) or 401 (auth on) means up."""
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v2/", context=ctx, timeout=2):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 401:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise EnvironmentProblem(f"lab registry at {url} did not come up: {last}",
                             hint="see registry/registry.log in the lab directory")
