"""Resolve once: the validated site, the inventory and the command's options → one frozen Plan.

Every command that acts on a site (render, images, config check, preflight, apply, uninstall, operator, mig) calls
resolve() once and reads from the Plan; nothing else looks a catalog release up by its version string or reads the
inventory. The plan carries:

- the catalog release entry and the components with their final source coordinates,
- the GPU nodes with what we know of them before touching them (OS, kernel, Kubernetes node name) — from the
  inventory (after --limit) or from --os/--kernel,
- the inventory as Ansible reads it (hosts, groups, play-pattern host counts for the progress display),
- the Helm values (checked against the release's keys), the role variables, the MIG layout per node (names
  checked against the release), the pull secret reference (never its credentials),
- the image list (computed on first use: it needs the nodes' OS, which `render` does not),
- the artifact plan of `gpu-install mirror` (Plan.artifacts(): the image list, the chart, the runfile, the OS package
  roots the roles install per node OS).

Cross-checks live here, once. New capabilities (mirror, validate) extend this plan, features (installer.features:
sharing modes, dynamic MIG, monitoring) add to it through their hooks; none builds a second list of anything.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import architectures, platforms
from installer.catalog import Catalog, Release
from installer.config import PullSecret, Site
from installer.errors import ConfigError
from installer.facts import (
    CONTROL_PLANE_GROUP,
    GPU_GROUP,
    Node,
    facts_nodes,
    flag_nodes,
    node_from_vars,
    with_facts,
    with_next_kernels,
)
from installer.node_facts import read_file as read_facts

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.mig import Assignment
    from installer.mirror.plan import ArtifactPlan
    from installer.render.values import ResolvedComponent

SITE_FILE_PATTERN = r"(^|/)site\.ya?ml$"


@dataclass(frozen=True)
class Options:
    """What a command line adds to the site: where the nodes come from and which of them this run is about."""

    inventory: str | None = None
    os_tags: tuple[str, ...] = ()  # --os, without an inventory
    kernels: tuple[str, ...] = ()  # --kernel [OSTAG=]KERNEL: with --os the nodes' kernels, with -i the next ones
    limit: str | None = None  # Ansible host pattern (preflight/apply/uninstall --limit)
    need_inventory: bool = False  # the command acts on hosts: -i is required
    kube_version: str | None = None  # --kube-version: the cluster's Kubernetes version, checked without a cluster
    facts: str | None = None  # --facts FILE: what `gpu-install nodes facts` read from the nodes


@dataclass(frozen=True)
class Inventory:
    """The inventory as Ansible reads it (read once, with this bundle's ansible.cfg), after --limit."""

    path: str
    limit: str | None
    hosts: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]  # after --limit
    all_groups: Mapping[str, tuple[str, ...]]  # the whole inventory
    _manager: Any = field(repr=False, compare=False, default=None)
    _loader: Any = field(repr=False, compare=False, default=None)

    def count(self, pattern: str) -> int | None:
        """How many hosts a play pattern selects (None when Ansible cannot say)."""
        if self._manager is None:
            return None
        try:
            with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                return len(self._manager.get_hosts(pattern))
        except Exception:  # noqa: BLE001 - only a progress header depends on it
            return None


@dataclass(frozen=True)
class Plan:
    site: Site
    release: Release
    options: Options
    nodes: tuple[Node, ...]
    inventory: Inventory | None
    components: Mapping[str, ResolvedComponent]
    values: dict[str, Any]
    role_vars: Mapping[str, Any]
    mig: tuple[Assignment, ...]
    notes: tuple[str, ...] = ()  # worth saying, not wrong (e.g. Kubernetes outside NVIDIA's validated range)

    @property
    def pull_secret(self) -> PullSecret | None:
        """The pull Secret's name and where its credentials come from (read only when the Secret is written)."""
        return self.site.registry.pullSecret

    @property
    def limit(self) -> str | None:
        return self.options.limit

    @cached_property
    def images(self) -> tuple[Image, ...]:
        """Every image the deployed components pull (driver tags per node OS); fails closed."""
        from installer import features
        from installer.artifacts import images

        return tuple(sorted([*images(self.site, self.release, self.components.values(), self.values, self.nodes),
                             *features.images(self.site)]))

    def artifacts(self, kernels: Sequence[str] = ()) -> ArtifactPlan:
        """What an air-gapped site must hold: these images, the chart, the runfile, the OS package roots per node OS
        (kernels: more kernels the nodes boot next, [OSTAG=]KERNEL as --kernel gives them with -i: their headers and
        precompiled images too). installer.mirror.plan; no network."""
        from installer.mirror.plan import artifact_plan

        return artifact_plan(self, kernels)

    def effective(self, path: str) -> Any:
        """Value of a values path after rendering: rendered value, else the chart default."""
        from installer.render.values import effective

        return effective(self.values, self.release, path)

    def deployed(self, comp: ResolvedComponent) -> bool:
        from installer.render.values import deployed

        return deployed(self.values, self.release, comp)

    def require_inventory(self) -> Inventory:
        if self.inventory is None:
            raise ConfigError("this command needs an inventory", hint="pass -i with an inventory file or directory")
        return self.inventory


def cluster_wide(plan: Plan) -> Plan:
    """The plan for every GPU node of the inventory, whatever --limit says: what is cluster-wide (the operator and
    the images it deploys -- a driver image per node OS) does not shrink to the limited hosts."""
    if not plan.limit:
        return plan
    import dataclasses

    return resolve(plan.site, dataclasses.replace(plan.options, limit=None))


def resolve(site: Site, options: Options | None = None, catalog: Catalog | None = None,
            facts: Sequence[Node] | None = None) -> Plan:
    """The one place the site, the catalog and the inventory meet; raises ConfigError (exit 2) on any mismatch.
    facts: GPU nodes already known without an inventory (instead of --os/--kernel)."""
    from installer import features, mig
    from installer.render.role_vars import role_vars
    from installer.render.values import build_values, resolve_components

    opts = options or Options()
    cat = catalog or Catalog.default()
    release = cat.get(site.operator.version)
    site.operator.version = release.version  # '24.9.2' → 'v24.9.2'

    inventory: Inventory | None = None
    if opts.inventory:
        if opts.os_tags:
            raise ConfigError("--os is for use without an inventory",
                              hint="set gpu_install_os in the inventory instead (with -i, --kernel [OSTAG=]KERNEL "
                                   "adds a kernel the nodes boot next)")
        inventory = load_inventory(opts.inventory, opts.limit)
        gpu_vars = gpu_host_vars(inventory)
        if features.extenders(site) and not inventory.all_groups.get(CONTROL_PLANE_GROUP):
            why = features.extenders_why(site)
            raise ConfigError(
                f"inventory {inventory.path}: group '{CONTROL_PLANE_GROUP}' is missing or empty, and the scheduler "
                f"stage needs it: {why} patched into kube-scheduler on those hosts",
                hint=f"add the control-plane hosts to group {CONTROL_PLANE_GROUP} (see inventories/sample/hosts.yml), "
                     "or drop scheduler.extenders / sharing.mode")
        nodes: tuple[Node, ...] = tuple(node_from_vars(name, hv) for name, hv in gpu_vars)
        if opts.facts:
            nodes = with_facts(nodes, read_facts(opts.facts), f"facts file {opts.facts}")
        nodes = with_next_kernels(nodes, opts.kernels)
        assignments = tuple(mig.assignments(site, gpu_vars))
    else:
        if opts.need_inventory:
            raise ConfigError("no inventory given", hint="pass -i INVENTORY (or set GPU_INSTALL_INVENTORY)")
        if opts.facts and opts.os_tags:
            raise ConfigError("--facts and --os both describe the nodes",
                              hint="give one: --facts FILE (what `gpu-install nodes facts` read) or --os/--kernel")
        if opts.facts:
            nodes = with_next_kernels(facts_nodes(read_facts(opts.facts), f"facts file {opts.facts}"), opts.kernels)
        else:
            nodes = tuple(facts) if facts is not None else tuple(flag_nodes(opts.os_tags, opts.kernels))
        assignments = ()

    if site.registry.ca:
        check_ca(site.registry.ca)
    architectures.check(site, nodes)
    components = resolve_components(site, release)
    values = build_values(site, release, components)
    check_nodes_os(site, release, nodes, components, values, "--os" if not opts.inventory else None)
    # every MIG layout name, the site default too (also without nodes: render, config check), checked once
    mig.check_names(site, release, [*assignments, *mig.site_default(site, assignments)])
    notes: list[str] = []
    if opts.kube_version:
        note = platforms.check_kubernetes(release.version, opts.kube_version, cat.releases(), "--kube-version",
                                          release.catalog_dir)
        notes += [note] if note else []
    return Plan(site=site, release=release, options=opts, nodes=nodes, inventory=inventory, components=components,
                values=values, role_vars=role_vars(site, release, nodes), mig=assignments, notes=tuple(notes))


def check_nodes_os(site: Site, release: Release, nodes: Sequence[Node], components: Mapping[str, ResolvedComponent],
                   values: dict[str, Any], flag: str | None) -> None:
    """Every node's OS (as the inventory or --os says) is one the roles support and, when the operator deploys the
    driver container (or another image tagged -<osTag>), one NVIDIA publishes those images of the release for."""
    from installer.render.values import deployed

    suffixed = [c for c in components.values()
                if c.spec.os_suffix and not c.spec.user_supplied and deployed(values, release, c)]
    for node in nodes:
        if node.os_id is None or node.os_version is None:
            continue  # unknown: only what needs it fails (the image list)
        where = flag or f"host {node.name}: gpu_install_os"
        platforms.check_role_os(node.name, node.os_id, node.os_version, where)
        if suffixed:
            platforms.check_driver_os(release.version, node.os_id, node.os_version, node.os_tag(release.version),
                                      f"{where} with {' and '.join(c.name for c in suffixed)} from the operator",
                                      site.driver.customImageOs, release.catalog_dir)


def check_package_repo(site: Site, nodes: Sequence[Node]) -> None:
    """With packages.url, where the roles install packages: the site key is an OpenPGP public key, and every GPU node
    names its OS (its repository is <url>/packages/<os>). Called before the node playbooks touch any host (not at
    resolve: on the connected side the key does not exist yet, push writes it)."""
    if not site.packages.url or not (site.toolkit.mode == "host" or site.driver.mode in ("host", "runfile")):
        return
    from installer.safefile import read_text

    assert site.packages.key is not None  # the model requires it with url
    if "BEGIN PGP PUBLIC KEY BLOCK" not in read_text(Path(site.packages.key), "packages.key"):
        raise ConfigError(f"packages.key {site.packages.key}: no armored OpenPGP public key in it",
                          hint="give the key `gpu-install mirror push --repo-dir DIR` exported: DIR/gpu-install-site.asc")
    for node in nodes:
        if node.os_id is None or node.os_version is None:
            raise ConfigError(f"host {node.name}: OS unknown (gpu_install_os is not set), and packages.url makes its "
                              "repository <url>/packages/<os>",
                              hint="set gpu_install_os (e.g. ubuntu22.04) for the host or its group, as in the bundle")


def check_ca(path: Path) -> None:
    """registry.ca is a readable PEM certificate (checked before any host is contacted)."""
    import ssl

    from installer.safefile import read_text

    text = read_text(Path(path), "registry.ca")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(f"registry.ca {path}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)",
                          hint="give the registry's CA certificate in PEM form")
    try:
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"registry.ca {path}: not a valid PEM certificate ({exc})",
                          hint="give the registry's CA certificate in PEM form") from None


def load_inventory(path: str, limit: str | None = None) -> Inventory:
    """Read an Ansible inventory (once, with this bundle's ansible.cfg) and apply --limit."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"inventory {path} not found", hint="pass -i with an inventory file or directory")
    import warnings

    from installer import content

    # ansible.constants are read when ansible is first imported: this bundle's ansible.cfg (it ignores a site.yaml
    # beside hosts.yml in an inventory directory), no warnings on our streams
    os.environ.setdefault("ANSIBLE_CONFIG", str(content.ansible_cfg()))
    os.environ.setdefault("ANSIBLE_LOCALHOST_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_UNPARSED_WARNING", "False")
    os.environ.setdefault("ANSIBLE_INVENTORY_IGNORE_REGEX", SITE_FILE_PATTERN)
    said = io.StringIO()  # Ansible's own warnings while parsing: the reason a source failed
    failed_at: dict[str, int] = {}  # INI file → the line its parser stopped at
    # a YAML file is tried by the INI parser too (last): its failure there says nothing about the file
    yaml_file = p.suffix in (".yml", ".yaml", ".json")
    hint = "fix the inventory at the place named; nothing was run"
    with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(said), \
            _ini_failure_line({} if yaml_file else failed_at):
        warnings.simplefilter("ignore")
        import ansible.constants as constants  # a submodule import: mypy reads ansible/__init__ (pyproject.toml)
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader

        # strict whatever the environment: an inventory (or one file of an inventory directory) that does not parse
        # is an error, never a silently smaller or empty inventory
        constants.INVENTORY_ANY_UNPARSED_IS_FAILED = True
        constants.INVENTORY_UNPARSED_IS_FAILED = True
        loader = DataLoader()
        try:
            manager = InventoryManager(loader=loader, sources=[str(p)])
        except Exception as exc:  # noqa: BLE001 - ansible raises AnsibleError subclasses with a message
            reason = _parse_reason(said.getvalue(), yaml_file) or _redact(str(exc))
            raise ConfigError(f"{_where(p, said.getvalue(), reason, failed_at)}: {reason}", hint=hint) from None
        # a warning while parsing is a line Ansible read otherwise than it is written (or dropped): an error too
        warned = _parse_reason(said.getvalue(), yaml_file)
        if warned:
            raise ConfigError(f"{_where(p, said.getvalue(), warned, failed_at)}: {warned}", hint=hint)
        all_groups = {name: tuple(sorted(h.name for h in g.get_hosts())) for name, g in manager.groups.items()}
        if limit:
            manager.subset(limit)
        try:
            selected = {h.name for h in manager.get_hosts("all")}
        except Exception as exc:  # noqa: BLE001 - a bad --limit pattern
            raise ConfigError(f"--limit {limit}: {exc}") from None
    if limit and not selected:
        raise ConfigError(f"--limit {limit} matches no host of inventory {path}",
                          hint="give host names or groups of the inventory (Ansible patterns)")
    groups = {name: tuple(sorted(h.name for h in g.get_hosts() if h.name in selected))
              for name, g in manager.groups.items()}
    return Inventory(path=str(p), limit=limit, hosts=tuple(sorted(selected)), groups=groups, all_groups=all_groups,
                     _manager=manager, _loader=loader)


@contextmanager
def _ini_failure_line(found: dict[str, int]) -> Iterator[None]:
    """Record the line the INI inventory parser was at when it failed (ansible-core 2.19 drops it from the error;
    earlier releases call the position `lineno`). Only while our InventoryManager parses; put back after."""
    from ansible.plugins.inventory import ini

    original = ini.InventoryModule._parse

    def parse(self: Any, lines: list[str]) -> Any:
        try:
            return original(self, lines)
        except Exception:
            origin = getattr(self, "_origin", None)
            line = getattr(origin, "line_num", None) or getattr(self, "lineno", None)
            source = getattr(origin, "path", None) or getattr(self, "_filename", None)
            if isinstance(line, int) and line > 0 and source:
                found.setdefault(str(source), line)
            raise

    ini.InventoryModule._parse = parse
    try:
        yield
    finally:
        ini.InventoryModule._parse = original


#: inventory variables whose values are secrets (ansible_password, ansible_become_pass, …): never shown
_SECRET_VALUE = re.compile(r"(\b\w*(?:pass(?:word|wd|phrase)?|secret|token|credential|private_?key|api_?key|auth)\w*)"
                           r"(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s;,}]+)", re.I)


def _redact(text: str) -> str:
    return _SECRET_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}…", text)


def _parse_reason(text: str, yaml_file: bool = False) -> str:
    """The useful lines of Ansible's parse warnings ('Failed to parse inventory with 'ini' plugin: <why>'), without
    its source excerpts (we name the line ourselves) and with secret-looking variables' values left out."""
    lines = [" ".join(ln.replace("[WARNING]:", "").replace("[ERROR]:", "").replace("[DEPRECATION WARNING]:", "")
                      .split()) for ln in text.splitlines()]
    keep = [ln for ln in lines if ln and not ln.startswith(("<<<", "Origin:")) and "fork-safety" not in ln
            and "reconfigure stdout" not in ln and "Unable to parse" not in ln and "only implicit localhost" not in ln
            and "Deprecation warnings can be disabled" not in ln and not re.fullmatch(r"\d+ .*|\^.*", ln)]
    out: list[str] = []
    for ln in keep:
        if ln not in out and not any(o != ln and ln.rstrip(".") in o for o in keep):
            out.append(ln)
    noise = ("no root 'plugin' key found", *(("with 'ini' plugin",) if yaml_file else ()))
    out = [o for o in out if not any(n in o for n in noise)] or out
    return _redact("; ".join(out)[:1000])


def _where(path: Path, said: str, reason: str, failed_at: Mapping[str, int]) -> str:
    """'inventory FILE:LINE (LINE TEXT)' for the line a parse failure or warning is about, when it can be told: the
    line the INI parser stopped at, Ansible's 'Origin: FILE:LINE', a 'FILE:LINE:' in the message (ansible-core before
    2.19), else the one line of the file that holds the text the message quotes. 'inventory PATH' otherwise."""
    found: tuple[Path, int] | None = None
    for source, line in failed_at.items():
        found = (Path(source), line)
        break
    if found is None:
        m = re.search(r"Origin: (.+?):(\d+)(?::\d+)?\s*$", said, re.M) or re.search(r"(/[^\s:'\"]+):(\d+):", said)
        if m and Path(m.group(1)).is_file():
            found = (Path(m.group(1)), int(m.group(2)))
    if found is None and path.is_file():
        found = _quoted_line(path, reason)
    if found is None:
        return f"inventory {path}"
    file, line = found
    try:
        text = file.read_text(errors="replace").splitlines()[line - 1].strip()
    except (OSError, IndexError):
        return f"inventory {file}:{line}"
    shown = text if len(text) <= 120 else text[:117] + "..."
    return f"inventory {file}:{line} ({_redact(shown)!r})"


def _quoted_line(path: Path, reason: str) -> tuple[Path, int] | None:
    """The line of an inventory file holding what a parse message quotes ('…', [section], 'got: …'), if exactly one
    line does."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    quoted = re.findall(r"'([^']+)'|(\[[^\]\s]*\])|got: (.+?)(?:;|$)", reason)
    for fragment in (next(f for f in q if f) for q in quoted):
        hits = [n for n, ln in enumerate(lines, 1) if ln.strip() == fragment.strip()] or \
               [n for n, ln in enumerate(lines, 1) if fragment.strip() in ln and not ln.lstrip().startswith(("#", ";"))]
        if len(hits) == 1:
            return path, hits[0]
    return None


def gpu_host_vars(inv: Inventory) -> list[tuple[str, dict[str, Any]]]:
    """(host, its variables) of each GPU node (group gpu_nodes, after --limit), by name."""
    if GPU_GROUP not in inv.groups:
        raise ConfigError(
            f"inventory {inv.path}: no group '{GPU_GROUP}'",
            hint=f"put the GPU nodes in a group named {GPU_GROUP} (see inventories/sample/hosts.yml)",
        )
    from ansible.vars.manager import VariableManager

    manager = inv._manager
    vm = VariableManager(loader=inv._loader, inventory=manager)
    hosts = [h for h in manager.groups[GPU_GROUP].get_hosts() if h.name in set(inv.hosts)]
    out = [(h.name, vm.get_vars(host=h)) for h in sorted(hosts, key=lambda h: h.name)]
    if not out and not inv.limit:  # with --limit a run may be about the control plane only
        raise ConfigError(f"inventory {inv.path}: group '{GPU_GROUP}' has no hosts")
    return out


__all__ = ["CONTROL_PLANE_GROUP", "GPU_GROUP", "Inventory", "Options", "Plan", "gpu_host_vars", "load_inventory", "resolve"]
