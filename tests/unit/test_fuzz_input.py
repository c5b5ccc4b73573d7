"""Property: whatever a site file, an inventory or a flag holds, gpu-install answers with a documented exit code and a
message -- never a traceback or an "internal error" -- never shows a credential, and when it refuses the input (exit
2) it has contacted nothing: no SSH, no ansible-runner, no Kubernetes API call, no helm.

Site files are generated from the published schema (`gpu-install config schema`) and from the example sites in the
repository, then mutated: wrong types, unknown keys, boundary numbers, hostile strings, deep nesting, duplicate keys,
missing required keys, YAML tags, canary secrets in the credential fields and in the environment. Inventories (YAML
and INI) hold unreachable hosts (127.0.0.1 port 1) and are mutated the same way. The real entry point
(installer.cli.main) runs in-process on render, images, config check, preflight, apply, uninstall and operator install
with a kubeconfig pointing at 127.0.0.1:1.

Every mutation found to break a property became a fix and a deterministic example below (REGRESSIONS).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import io
import json
import os
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from installer.config import CREDENTIAL_FIELDS, sample_site, site_schema
from installer.errors import (
    EXIT_CLUSTER,
    EXIT_ENVIRONMENT,
    EXIT_HOST_FAILURES,
    EXIT_OK,
    EXIT_PREFLIGHT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    EXIT_VALIDATION,
    ClusterUnreachable,
    EnvironmentProblem,
    HostsUnreachable,
)
from installer.safefile import MAX_INPUT_BYTES
from tests.conftest import ROOT

settings.register_profile("fuzz", max_examples=100, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
FUZZ = settings.get_profile("fuzz")  # a longer search: raise max_examples above (600 passed when this was written)

#: the documented exit codes a run may end with (README "Exit codes"; 1 is an internal error, never expected)
DOCUMENTED = {EXIT_OK, EXIT_USAGE, EXIT_PREFLIGHT, EXIT_HOST_FAILURES, EXIT_UNREACHABLE, EXIT_VALIDATION, EXIT_CLUSTER,
              EXIT_ENVIRONMENT}
CANARY = "c4nary-S3cret-9f2d"
CANARY_USER = "c4nary-User-41b7"
CANARY_NAME = "Canary_Var_Secret_77"  # a secret that happens to look like a variable name
CANARIES = (CANARY, CANARY_USER, CANARY_NAME, base64.b64encode(f"{CANARY_USER}:{CANARY}".encode()).decode(),
            base64.b64encode(CANARY.encode()).decode())
EXAMPLE_SITES = [yaml.safe_load(sample_site()), yaml.safe_load((ROOT / "inventories/sample/site.yaml").read_text())]
COMMANDS = ("render", "images", "config-check", "mirror-plan", "preflight", "apply", "uninstall", "operator-install",
            "validate")
#: commands that never contact anything, whatever they are given
OFFLINE = {"mirror-plan"}


# ---------------------------------------------------------------- points of contact

#: programs that libraries run to look at this machine (ctypes.util.find_library: ldconfig, cc), reaching nothing
LOCAL_PROGRAMS = {"ldconfig", "uname", "gcc", "cc", "ld", "objdump"}


class Contacts:
    """Every way gpu-install reaches beyond this process, guarded: each attempt is recorded, and the ones that would
    reach a host (ansible-runner, helm, SSH, a socket) fail the way an unreachable target does."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    @contextlib.contextmanager
    def guard(self):
        import ansible_runner
        import urllib3
        from kubernetes.client import ApiClient

        from installer import helm, tools

        seen = self.seen

        def runner(**kw: Any) -> Any:
            seen.append(f"ansible-runner {kw.get('playbook')}")
            raise HostsUnreachable("unreachable: every host (guarded in this test)")

        def helm_client(*a: Any, **kw: Any) -> Any:
            seen.append("helm")
            raise ClusterUnreachable("helm: 127.0.0.1:1 refused (guarded in this test)")

        def ensure_helm(*a: Any, **kw: Any) -> Any:
            seen.append("helm download")
            raise EnvironmentProblem("helm: not fetched (guarded in this test)")

        def connect(sock: socket.socket, address: Any, *a: Any) -> Any:
            seen.append(f"connect {address}")
            raise ConnectionRefusedError(111, "Connection refused (guarded in this test)")

        def connect_ex(sock: socket.socket, address: Any, *a: Any) -> int:
            seen.append(f"connect {address}")
            return 111

        call_api = ApiClient.call_api
        urlopen = urllib3.connectionpool.HTTPConnectionPool.urlopen
        popen_init = subprocess.Popen.__init__

        def api(self_: Any, *a: Any, **kw: Any) -> Any:
            seen.append(f"kubernetes {a[:2]}")
            return call_api(self_, *a, **kw)

        def pool(self_: Any, method: str, url: str, *a: Any, **kw: Any) -> Any:
            seen.append(f"http {method} {self_.host}:{self_.port}{url}")
            return urlopen(self_, method, url, *a, **kw)

        def popen(self_: Any, args: Any, *a: Any, **kw: Any) -> Any:
            program = os.path.basename(str(args[0] if isinstance(args, (list, tuple)) else args).split()[0])
            if program not in LOCAL_PROGRAMS:
                seen.append(f"subprocess {args!r:.80}")
            return popen_init(self_, args, *a, **kw)

        patches = [(ansible_runner, "run", runner), (helm, "client", helm_client), (tools, "ensure_helm", ensure_helm),
                   (socket.socket, "connect", connect), (socket.socket, "connect_ex", connect_ex),
                   (ApiClient, "call_api", api), (urllib3.connectionpool.HTTPConnectionPool, "urlopen", pool),
                   (subprocess.Popen, "__init__", popen)]
        try:
            import paramiko

            def ssh(*a: Any, **kw: Any) -> Any:
                seen.append("paramiko")
                raise OSError("ssh refused (guarded in this test)")

            patches.append((paramiko.SSHClient, "connect", ssh))
        except ImportError:
            pass
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
        try:
            for obj, name, new in patches:
                setattr(obj, name, new)
            yield self
        finally:
            for obj, name, old in saved:
                setattr(obj, name, old)


# ---------------------------------------------------------------- the run


class Run:
    """One in-process CLI run in a private directory (cache, state, home, kubeconfig, chart, run records)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for sub in ("home", "cache", "state", "config", "chart", "out"):
            (root / sub).mkdir()
        (root / "chart" / "Chart.yaml").write_text("apiVersion: v2\nname: gpu-operator-standin\nversion: 0.1.0\n")
        self.kubeconfig = root / "kubeconfig"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
            "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
        self.docker_config = root / "docker-config.json"
        self.docker_config.write_text(json.dumps({"auths": {"registry.example.com:5000": {"auth": CANARIES[3]}}}))

    def env(self) -> dict[str, str]:
        return {"HOME": str(self.root / "home"), "XDG_CACHE_HOME": str(self.root / "cache"),
                "XDG_STATE_HOME": str(self.root / "state"), "XDG_CONFIG_HOME": str(self.root / "config"),
                "GPU_INSTALL_CACHE": str(self.root / "cache"), "GPU_INSTALL_STATE": str(self.root / "state"),
                "GPU_REGISTRY_USER": CANARY_USER, "GPU_REGISTRY_PASSWORD": CANARY, "REG_PASS": CANARY,
                "REGISTRY_TOKEN": CANARY, "KUBECONFIG": str(self.kubeconfig)}

    def argv(self, command: str, site: Path, inventory: Path | None, sets: list[str]) -> list[str]:
        inv = ["-i", str(inventory)] if inventory else []
        flags = [a for s in sets for a in ("--set", s)]
        op = ["--kubeconfig", str(self.kubeconfig), "--operator-timeout", "5"]
        return {
            "render": ["render", "-s", str(site), *inv, "-o", str(self.root / "out" / "values.yaml")],
            "images": ["images", "-s", str(site), *inv, "--format", "json"],
            "mirror-plan": ["mirror", "plan", "-s", str(site), *inv, "--format", "json"],
            "config-check": ["config", "check", "-s", str(site)],
            "preflight": ["preflight", "-s", str(site), "-i", str(inventory or site), "-q"],
            "apply": ["apply", "-s", str(site), "-i", str(inventory or site), "-q", *op, "--chart",
                      str(self.root / "chart")],
            "uninstall": ["uninstall", "-s", str(site), "-i", str(inventory or site), "-q", "--yes", *op],
            "validate": ["validate", "-s", str(site), "-i", str(inventory or site), "-q", "--kubeconfig",
                         str(self.kubeconfig), "--ssh-timeout", "5", "--timeout", "5"],
            "operator-install": ["operator", "install", "-s", str(site), "--kubeconfig", str(self.kubeconfig),
                                 "--chart", str(self.root / "chart"), "--timeout", "5"],
        }[command] + flags

    def written(self) -> bytes:
        """Everything gpu-install wrote under this run's directories (records, run dirs, -o files)."""
        out = b""
        for sub in ("home", "cache", "state", "config", "out"):
            for p in sorted((self.root / sub).rglob("*")):
                if p.is_file() and not p.is_symlink():
                    out += p.read_bytes()
        return out


def run_cli(argv: list[str], env: dict[str, str]) -> tuple[int, str, list[str]]:
    """(exit code, stdout+stderr, points of contact tried) of one in-process run."""
    from installer.cli import main

    contacts = Contacts()
    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with contacts.guard(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse: a flag mistake
                rc = exc.code if isinstance(exc.code, int) else 2
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, out.getvalue() + err.getvalue(), contacts.seen


def check(command: str, site_text: str, inventory: tuple[str, str] | None = None,
          sets: tuple[str, ...] = ()) -> tuple[int, str, list[str]]:
    """The properties, for one command on one site file (and inventory, and --set flags). Returns (exit code,
    output, points of contact tried) for the assertions of a deterministic example."""
    with tempfile.TemporaryDirectory(prefix="gpu-install-fuzz-") as tmp:
        run = Run(Path(tmp))
        site = run.root / "site.yaml"
        site.write_text(site_text.replace("@DOCKER_CONFIG@", str(run.docker_config)))
        inv = None
        if inventory is not None:
            name, text = inventory
            inv = run.root / name
            inv.write_text(text)
        argv = run.argv(command, site, inv, list(sets))
        rc, output, contacted = run_cli(argv, run.env())
        written = run.written()
    shown = output[-3000:]
    assert rc in DOCUMENTED, f"exit {rc} is not a documented exit code: {argv}\n{shown}"
    assert "Traceback" not in output and "internal error" not in output, f"{argv}\n{shown}"
    for canary in CANARIES:
        assert canary not in output, f"a credential reached the output: {argv}\n{shown}"
        assert canary.encode() not in written, f"a credential reached a file gpu-install wrote: {argv}"
    if rc == EXIT_USAGE:
        assert not contacted, f"exit 2, yet {contacted} was tried first: {argv}\n{shown}"
    if command in OFFLINE:
        assert not contacted, f"{command} is offline, yet it tried {contacted}: {argv}\n{shown}"
    return rc, output, contacted


# ---------------------------------------------------------------- generated site files


def _from_schema(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values the schema describes (valid or not: the tool has rules the schema may not carry)."""
    if "$ref" in schema:
        return _from_schema(defs[schema["$ref"].split("/")[-1]], defs, depth)
    if "anyOf" in schema:
        return st.one_of([_from_schema(s, defs, depth) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object" and "properties" in schema:
        required = set(schema.get("required", []))
        props = {k: _from_schema(v, defs, depth + 1) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({k: v for k, v in props.items() if k in required},
                                     optional={k: v for k, v in props.items() if k not in required})
    if kind == "object":
        return st.dictionaries(st.sampled_from(["dcgm", "dcgmExporter", "gfd", "nfd", "x"]), st.just({}), max_size=2)
    if kind == "array":
        return st.lists(_from_schema(schema.get("items", {}), defs, depth + 1), max_size=2)
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: len(s) < 200)
        return st.sampled_from(["", "x", "v24.9.2", "550", "registry.example.com:5000", "nvidia.com/gpu", "30s",
                                "http://127.0.0.1:3456/scheduler", "all-1g.10gb", "gpu-registry"])
    if kind == "integer":
        return st.integers(schema.get("minimum", -3), schema.get("maximum", 200))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.none()


SCHEMA = site_schema()
schema_sites = _from_schema(SCHEMA, SCHEMA.get("$defs", {})).map(
    lambda d: {**d, "operator": {**d["operator"], "version": "v24.9.2"}} if isinstance(d.get("operator"), dict) else d)
base_sites = st.one_of(st.sampled_from(EXAMPLE_SITES).map(copy.deepcopy), schema_sites)

HOSTILE = [
    "$(reboot)", "`id`", "a; rm -rf /", "x\ny: 1", "nul\x00byte", "x" * 10_000, "ünïcødé-名前", "../../etc/passwd",
    "/etc/shadow", "~", "-", "--help", "", " ", "0", "-1", "null", "{a: 1}", "[1, 2]", "http://", "a..b", ":5000",
    "%s%s%n", "\u202eevil", "\ufffe", "C:\\Windows", "*", "!", "&anchor",
]
BOUNDARY = [0, -1, 1, 2**31, 2**63, -(2**63), 10**100, 0.5, float("inf"), float("nan"), True, False, None, [], {},
            [[[]]], {"a": {"b": {}}}]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    value = copy.deepcopy(value)  # never a shared constant: a later mutation would change it for every example
    if not path:
        return value
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return root


def _delete(root: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return root
    node = root
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return root


def _nest(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = {"a": value}
    return value


CREDENTIAL_VALUES = [CANARY, CANARY_USER, CANARY_NAME, "@DOCKER_CONFIG@", f"/nonexistent/{CANARY}", f"$({CANARY})"]


@st.composite
def mutated_sites(draw: st.DrawFn) -> tuple[str, tuple[str, ...]]:
    """A site file's text (and --set flags) after a few mutations of a generated or example site."""
    data = copy.deepcopy(draw(base_sites))  # mutated in place below: never a strategy's shared value
    sets: list[str] = []
    for _ in range(draw(st.integers(0, 3))):
        paths = _paths(data)
        path = draw(st.sampled_from(paths))
        kind = draw(st.sampled_from(["hostile", "boundary", "unknown", "delete", "nest", "credential", "set",
                                     "type"]))
        if kind == "hostile":
            data = _set(data, path, draw(st.sampled_from(HOSTILE) | st.text(max_size=30)))
        elif kind == "boundary":
            data = _set(data, path, draw(st.sampled_from(BOUNDARY)))
        elif kind == "type":
            data = _set(data, path, draw(st.sampled_from([1, "1", [1], {"x": 1}, True, None, 1.5])))
        elif kind == "unknown":
            parent = draw(st.sampled_from([p for p in paths if isinstance(_get(data, p), dict)] or [()]))
            target = _get(data, parent)
            if isinstance(target, dict):
                target[draw(st.sampled_from(["hots", "extra", "__proto__", "values", "1", "x" * 300]))] = \
                    draw(st.sampled_from(HOSTILE[:6] + [1, None]))
        elif kind == "delete":
            data = _delete(data, path)
        elif kind == "nest":
            # built fresh (no deepcopy) and the last mutation: walking or copying it again would recurse as deep in
            # this generator; far deeper nesting comes as text below
            nested = _nest(draw(st.sampled_from([5, 50, 150])))
            if not path:
                data = nested
            else:
                _get(data, path[:-1])[path[-1]] = nested
            break
        elif kind == "credential":
            ps = {"name": "gpu-registry"}
            field = draw(st.sampled_from(sorted(CREDENTIAL_FIELDS)))
            ps[field] = draw(st.sampled_from(CREDENTIAL_VALUES))
            if draw(st.booleans()) and field != "dockerConfigFile":
                ps[({"usernameEnv", "passwordEnv"} - {field}).pop()] = draw(
                    st.sampled_from(["GPU_REGISTRY_USER", "GPU_REGISTRY_PASSWORD", CANARY_NAME, CANARY]))
            if isinstance(data, dict) and isinstance(data.get("registry"), dict):
                data["registry"]["pullSecret"] = ps
        elif kind == "set":
            dotted = ".".join(str(p) for p in path) or "registry"
            value = draw(st.sampled_from([*HOSTILE[:8], "", "{a: [}", "1"]))
            secret = draw(st.sampled_from(CREDENTIAL_VALUES[:3]))
            field = draw(st.sampled_from(sorted(CREDENTIAL_FIELDS)))
            sets.append(draw(st.sampled_from([
                f"{dotted}={value}", dotted, f"={value}", f"a..b={value}",
                # a credential, pasted into a credential field or into the mapping that holds one
                f"registry.pullSecret.{field}={secret}", f"registry.pullSecret={secret}", f"registry={secret}",
                f"registry.pullSecret={{name: p, {field}: {secret}}}", f"registry.pullSecret.{field}.x={secret}"])))
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False) if data is not None else ""
    text = draw(st.sampled_from([
        lambda t: t,
        lambda t: t,
        lambda t: t + "operator: {version: v24.9.2}\n",  # a duplicate key
        lambda t: "!!python/object/apply:os.system ['id']\n" + t,
        lambda t: t.replace("operator:", "operator: !!python/object:builtins.dict", 1),
        lambda t: t + "anchors: &a [*a]\n",
        lambda t: t + "deep: " + "[" * 5000 + "]" * 5000 + "\n",  # nesting far past Python's recursion limit
        lambda t: t[: len(t) // 2],  # truncated mid-way
        lambda t: t + "\t tab: 1\n",
        lambda t: "%YAML 9.9\n---\n" + t,
        lambda t: t + "---\nsecond: document\n",
        lambda t: t.replace(": ", ":\x00 ", 1),
    ]))(text)
    return text, tuple(sets)


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        root = root[p]
    return root


# ---------------------------------------------------------------- generated inventories

OS_TAGS = ["ubuntu22.04", "ubuntu20.04", "rhel9.4", "rhel8.10", "centos7", "debian12", "windows11", "", "$(id)"]
KERNELS = ["5.15.0-105-generic", "5.14.0-427.13.1.el9_4.x86_64", "`reboot`", "", "5.15 $(id)"]
HOST_NAMES = ["gpu1", "gpu2.example.com", "10.0.0.7", "g-3", "bad host", "$(id)", "[1:3]", "ü", "a" * 300]


@st.composite
def inventories(draw: st.DrawFn) -> tuple[str, str]:
    """A YAML or INI inventory of unreachable GPU nodes (127.0.0.1 port 1), sometimes mutated."""
    hosts = draw(st.lists(st.sampled_from(HOST_NAMES[:4]), min_size=0, max_size=3, unique=True))
    hostvars = {}
    for h in hosts:
        hv: dict[str, Any] = {"ansible_host": "127.0.0.1", "ansible_port": 1, "ansible_connection": "ssh"}
        if draw(st.booleans()):
            hv["gpu_install_os"] = draw(st.sampled_from(OS_TAGS[:4]))
            hv["gpu_install_kernel"] = draw(st.sampled_from(KERNELS[:2]))
        hostvars[h] = hv
    mutation = draw(st.sampled_from(["none", "none", "host", "os", "kernel", "var", "group", "line", "password"]))
    if mutation == "host" and hosts:
        hostvars[draw(st.sampled_from(HOST_NAMES[4:]))] = hostvars.pop(hosts[0])
    elif mutation == "os" and hosts:
        hostvars[hosts[0]]["gpu_install_os"] = draw(st.sampled_from(OS_TAGS[4:]))
    elif mutation == "kernel" and hosts:
        hostvars[hosts[0]]["gpu_install_kernel"] = draw(st.sampled_from(KERNELS[2:]))
    elif mutation == "var" and hosts:
        hostvars[hosts[0]][draw(st.sampled_from(["gpu_install_mig_config", "ansible_port", "gpu_install_os_id"]))] = \
            draw(st.sampled_from(HOSTILE[:8] + [0, -1, 70000]))
    elif mutation == "password" and hosts:
        hostvars[hosts[0]]["ansible_password"] = CANARY
    group = "gpu_nodes" if mutation != "group" else draw(st.sampled_from(["gpu-nodes", "GPU_NODES", "all"]))
    control = {"cp1": {"ansible_host": "127.0.0.1", "ansible_port": 1}}
    if draw(st.booleans()):  # INI
        lines = ["[kube_control_plane]", "cp1 ansible_host=127.0.0.1 ansible_port=1", f"[{group}]"]
        for h, hv in hostvars.items():
            lines.append(" ".join([h, *(f"{k}={v}" for k, v in hv.items())]))
        if mutation == "line":
            at = draw(st.integers(0, len(lines)))
            lines.insert(at, draw(st.sampled_from(["[gpu_nodes:children", "novalue", "g9 =bad", 'g8 "unterminated',
                                                   "[group:weird]", "x ansible_port=abc:"])))
        return "hosts.ini", "\n".join(lines) + "\n"
    data = {"all": {"children": {"kube_control_plane": {"hosts": control}, group: {"hosts": hostvars or None}}}}
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    if mutation == "line":
        text = draw(st.sampled_from([text + "all: {}\n", text[: len(text) // 2], text.replace("hosts:", "hosts: [", 1)]))
    return "hosts.yml", text


# ---------------------------------------------------------------- the properties


@FUZZ
@given(site=mutated_sites(), command=st.sampled_from(("render", "images", "config-check", "mirror-plan")))
def test_site_files_never_break_the_offline_commands(site, command):
    text, sets = site
    check(command, text, sets=sets)


@FUZZ
@given(site=mutated_sites(), inventory=inventories(),
       command=st.sampled_from(("images", "mirror-plan", "preflight", "apply", "uninstall", "operator-install",
                                "validate")))
def test_site_files_and_inventories_never_reach_a_host_when_refused(site, inventory, command):
    text, sets = site
    check(command, text, inventory, sets)


@FUZZ
@given(inventory=inventories(),
       command=st.sampled_from(("images", "mirror-plan", "preflight", "apply", "uninstall", "validate")))
def test_inventories_alone(inventory, command):
    check(command, (ROOT / "inventories/sample/site.yaml").read_text(), inventory)


# ---------------------------------------------------------------- what the properties found, kept

SAMPLE_SITE = (ROOT / "inventories/sample/site.yaml").read_text()

REGRESSIONS = [
    # a --set of the mapping that holds the credential fields echoed the value given for it (flag and "got …")
    pytest.param("render", SAMPLE_SITE, None, (f"registry={CANARY}",), id="set-registry-to-a-secret"),
    pytest.param("config-check", SAMPLE_SITE, None, (f"registry.pullSecret={CANARY}",), id="set-pullsecret-to-a-secret"),
    pytest.param("config-check", SAMPLE_SITE, None, (f"registry.pullSecret={{name: p, passwordEnv: {CANARY}}}",),
                 id="set-pullsecret-mapping-with-a-secret"),
]


@pytest.mark.parametrize("command,site,inventory,sets", REGRESSIONS)
def test_regressions(command, site, inventory, sets):
    check(command, site, inventory, sets)


def _with_docker_config_file(path: Path) -> str:
    return SAMPLE_SITE.replace("    usernameEnv: GPU_REGISTRY_USER\n    passwordEnv: GPU_REGISTRY_PASSWORD\n",
                               f"    dockerConfigFile: {path}\n")


def _config_json(size: int | None = None) -> bytes:
    """A docker config.json with the sample site registry's entry (a canary credential), padded with JSON
    whitespace to `size` bytes when given."""
    raw = json.dumps({"auths": {"registry.example.com:5000": {"auth": CANARIES[3]}}}).encode()
    return raw if size is None else raw + b" " * (size - len(raw))


@pytest.mark.parametrize("make,needle", [
    (lambda p: None, "cannot read it"),
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    # one byte over the bound: refused from its size (stat), before a byte is read
    (lambda p: p.write_bytes(_config_json(MAX_INPUT_BYTES + 1)), f"{MAX_INPUT_BYTES + 1} bytes is not a docker"),
    (lambda p: p.write_bytes(b"[" * 200_000), "nested too deeply to be a docker config.json"),
], ids=["missing", "fifo", "directory", "device", "oversized", "nested"])
def test_docker_config_file_is_read_only_when_a_small_regular_file(tmp_path, make, needle):
    """The path may be a credential pasted by mistake: never shown; a FIFO is never opened (it would block), an
    oversized file never read. Each is exit 2 naming the field, before anything is contacted."""
    path = tmp_path / CANARY
    make(path)
    rc, output, contacted = check("operator-install", _with_docker_config_file(path))
    assert rc == EXIT_USAGE and not contacted, output
    assert f"registry.pullSecret.dockerConfigFile: {needle}" in output, output


@pytest.mark.parametrize("size", [None, MAX_INPUT_BYTES], ids=["small", "exactly-the-bound"])
def test_docker_config_file_small_regular_file_is_used(tmp_path, size):
    """A small regular file (up to the bound, inclusive) is read and used: the run goes past the input checks to
    the cluster (127.0.0.1:1 here: exit 5), and its credential is never shown."""
    path = tmp_path / "config.json"
    path.write_bytes(_config_json(size))
    assert path.stat().st_size == (size or path.stat().st_size)
    rc, output, contacted = check("operator-install", _with_docker_config_file(path))
    assert rc == EXIT_UNREACHABLE and contacted, output
    assert "dockerConfigFile" not in output, output


@pytest.mark.parametrize("text", [
    "operator:\n  version: v24.9.2\ndeep: " + "[" * 5000 + "]" * 5000 + "\n",
    "operator:\n  version: v24.9.2\ndeep:\n" + "".join(" " * i + "k:\n" for i in range(1, 1000)),  # < 1 MiB
], ids=["flow", "block"])
def test_a_site_nested_too_deeply_is_a_clear_exit_2(tmp_path, text):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    (tmp_path / "run").mkdir()
    rc, output, contacted = run_cli(["config", "check", "-s", str(site)], Run(tmp_path / "run").env())
    assert rc == EXIT_USAGE and not contacted, output
    assert f"{site}: nested too deeply to be a site file" in output, output
    assert "check the file" in output and "Traceback" not in output


@pytest.mark.parametrize("command,code", [("preflight", EXIT_UNREACHABLE), ("apply", EXIT_UNREACHABLE),
                                          ("operator-install", EXIT_UNREACHABLE), ("validate", EXIT_UNREACHABLE)])
def test_the_guards_see_what_a_valid_input_contacts(tmp_path, command, code):
    """The 'nothing contacted' property means something: a valid site and inventory do get past the door, to the
    guarded points of contact, and end as an unreachable target does (exit 5)."""
    run = Run(tmp_path)
    site = tmp_path / "site.yaml"
    site.write_text(SAMPLE_SITE)
    inv = tmp_path / "hosts.yml"
    inv.write_text((ROOT / "inventories/sample/hosts.yml").read_text())
    rc, output, contacted = run_cli(run.argv(command, site, inv, []), run.env())
    assert rc == code and contacted, output
    assert not any(c in output for c in CANARIES)
