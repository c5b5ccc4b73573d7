"""MIG layouts per GPU node: the `nvidia.com/mig.config` label the GPU Operator's mig-manager applies.

The site's `mig.config` is the cluster default; the inventory host var `gpu_install_mig_config` overrides it per
node (`gpu_install_node_name` names the Kubernetes Node when it differs from the inventory host name).
installer.plan resolves each node's config (and checks the names) once; label_nodes() checks every node before it
labels any:
- the name is one of the release's default mig-parted configs (values/catalog: migConfigs), unless
  `mig.configMap` names a custom ConfigMap (then any valid label value);
- where the Node says what GPU it has (GFD labels): `nvidia.com/mig.capable=false` allows only all-disabled;
  a `nvidia.com/gpu.product` of a known MIG model (values/mig/models.yaml, generated from mig-parted facts)
  must be one the config applies to (all-balanced: from the release that has a layout for that model).
Then it sets the label through the Kubernetes API (installer/kube.py); a node already carrying it is unchanged.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import content
from installer.catalog import Release
from installer.config import Site
from installer.errors import ConfigError
from installer.facts import NODE_NAME_VAR
from installer.safefile import shipped_yaml

if TYPE_CHECKING:
    from installer.plan import Plan

LABEL = "nvidia.com/mig.config"
HOST_VAR = "gpu_install_mig_config"
PRODUCT_LABEL = "nvidia.com/gpu.product"
CAPABLE_LABEL = "nvidia.com/mig.capable"
DISABLED = "all-disabled"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_PRODUCT_SUFFIX = re.compile(r"-(MIG-.*|SHARED)$")  # GFD: MIG single strategy / shared (time-slicing) suffixes


@dataclass(frozen=True)
class Model:
    name: str
    products: tuple[re.Pattern[str], ...]
    configs: frozenset[str]
    all_balanced_from: str | None
    profiles: tuple[tuple[str, int], ...] = ()  # profile -> most instances per GPU
    device_ids: frozenset[str] = frozenset()

    @property
    def slices(self) -> int:
        """Compute slices of the GPU (7, or 4 on A30): the largest <N>g profile."""
        return max((int(p.split("g", 1)[0]) for p, _ in self.profiles), default=0)

    def memory_slices(self, profile: str | None = None) -> int:
        """Memory slices a profile takes (the smallest 1g profile's memory is one), or the GPU's total (8; 4 on
        A30) when profile is None."""
        def gb(p: str) -> float:
            return float(re.split(r"[+-]", p.split(".", 1)[1])[0].removesuffix("gb"))

        unit = min((gb(p) for p, _ in self.profiles if p.startswith("1g.")), default=0.0)
        if not unit:
            return 0
        return round((gb(profile) if profile else max(gb(p) for p, _ in self.profiles)) / unit)


@lru_cache(maxsize=1)
def models(path: Path | None = None) -> tuple[Model, ...]:
    doc = shipped_yaml((path or content.mig_models_file()).read_text())
    return tuple(Model(m["model"], tuple(re.compile(p, re.I) for p in m["products"]), frozenset(m["configs"]),
                       m.get("allBalancedFrom"), tuple(sorted((m.get("profiles") or {}).items())),
                       frozenset(str(d).lower() for d in m.get("deviceIds") or [])) for m in doc["models"])


CUSTOM_CONFIGMAP = "gpu-install-mig-parted-config"


def misfit(model: Model, entries: list[Any]) -> str | None:
    """Why a custom config's entries cannot be applied to this GPU model (None: they can). An entry with a
    device-filter applies only to the models whose device IDs it names (mig-parted skips it on the others)."""
    have = dict(model.profiles)
    for i, e in enumerate(entries):
        if e.device_filter is not None:
            wanted = {d.lower() for d in ([e.device_filter] if isinstance(e.device_filter, str) else e.device_filter)}
            if not wanted & model.device_ids:
                continue
        if not e.mig_enabled:
            continue
        used = memory = 0
        for profile, count in e.mig_devices.items():
            if profile not in have:
                return f"entry {i}: {model.name} has no MIG profile {profile} (it has {', '.join(sorted(have))})"
            if count > have[profile]:
                return f"entry {i}: {model.name} fits at most {have[profile]} x {profile}, not {count}"
            used += int(profile.split("g", 1)[0]) * count
            memory += model.memory_slices(profile) * count
        layout = " + ".join(f"{n} x {p}" for p, n in e.mig_devices.items())
        if used > model.slices:
            return f"entry {i}: {layout} needs {used} compute slices, {model.name} has {model.slices}"
        if memory > model.memory_slices():
            return f"entry {i}: {layout} needs {memory} memory slices, {model.name} has {model.memory_slices()}"
    return None


def custom_models(entries: list[Any]) -> tuple[list[Model], list[str]]:
    """(the GPU models a custom config applies to, why not for each of the others)."""
    fits, why = [], []
    for m in models():
        problem = misfit(m, entries)
        if problem is None:
            fits.append(m)
        else:
            why.append(problem)
    return fits, why


def custom_configmap(site: Site) -> dict[str, Any] | None:
    """The mig-parted config gpu-install ships as the operator's MIG ConfigMap (key config.yaml): all-disabled (the
    chart's default label value) and the site's customConfigs. None without customConfigs."""
    import yaml

    custom = site.mig.customConfigs
    if not custom:
        return None
    configs: dict[str, Any] = {DISABLED: [{"devices": "all", "mig-enabled": False}]}
    for name, entries in custom.items():
        configs[name] = [e.model_dump(by_alias=True, exclude_none=True) for e in entries]
    return {"config.yaml": yaml.safe_dump({"version": "v1", "mig-configs": configs}, sort_keys=False)}


def model_of(product: str | None) -> Model | None:
    """The MIG model of a GFD product label (NVIDIA-A100-SXM4-40GB, NVIDIA-H100-80GB-HBM3-MIG-1g.10gb), or None."""
    if not product:
        return None
    base = _PRODUCT_SUFFIX.sub("", product)
    return next((m for m in models() if any(p.search(base) for p in m.products)), None)


def smallest_profile(product: str | None) -> str | None:
    """The smallest MIG profile of a GFD product's model (fewest compute, then memory slices; e.g. 1g.10gb on an
    A100-80GB): what validate's smoke pod asks on a node of nos, which makes that device on demand. None: unknown."""
    model = model_of(product)
    if model is None or not model.profiles:
        return None
    return min((p for p, _ in model.profiles), key=lambda p: (int(p.split("g", 1)[0]), model.memory_slices(p), p))


@dataclass(frozen=True)
class GpuInstanceProfile:
    """One row of the driver's GPU instance profile table (`nvidia-smi mig -lgip`)."""

    gpu: int
    name: str           # "1g.10gb", "1g.10gb+me" (without the "MIG " prefix)
    profile_id: int
    free: int
    total: int          # the most instances of this profile one GPU holds
    memory_gib: float
    p2p: bool
    sms: int
    dec: int
    enc: int
    ce: int
    jpeg: int
    ofa: int

    @property
    def compute_slices(self) -> int:
        return int(self.name.split("g.", 1)[0])


_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([0-9.]+)\s+(Yes|No)\s+(\d+)\s+(\d+)\s+(\d+)"
                       r"\s*\|\s*$")
_LGIP_SECOND = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|\s*$")
_LGIP_NAME = re.compile(r"^[0-9]g\.[0-9]+gb(\+[a-z]+)?$")


def parse_lgip(text: str, source: str = "nvidia-smi mig -lgip") -> tuple[GpuInstanceProfile, ...]:
    """The rows of `nvidia-smi mig -lgip` output (each profile is two table lines: GPU, name, ID, free/total instances,
    memory GiB, P2P, SM, DEC, ENC, then CE, JPEG, OFA). Raises ValueError naming the line when a line that starts a
    row is not one, or a row lacks its second line."""
    rows: list[GpuInstanceProfile] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if "MIG" not in line or not line.startswith("|") or "GPU instance profiles" in line:
            continue
        m = _LGIP_ROW.match(line)
        if not m or not _LGIP_NAME.match(m.group(2)):
            raise ValueError(f"{source}: line {i} is not a profile row: {line.strip()!r}")
        second = _LGIP_SECOND.match(lines[i].rstrip()) if i < len(lines) else None
        if second is None:
            raise ValueError(f"{source}: line {i + 1}: the CE/JPEG/OFA line of {m.group(2)} is missing")
        i += 1
        rows.append(GpuInstanceProfile(
            gpu=int(m.group(1)), name=m.group(2), profile_id=int(m.group(3)), free=int(m.group(4)),
            total=int(m.group(5)), memory_gib=float(m.group(6)), p2p=m.group(7) == "Yes", sms=int(m.group(8)),
            dec=int(m.group(9)), enc=int(m.group(10)), ce=int(second.group(1)), jpeg=int(second.group(2)),
            ofa=int(second.group(3))))
    return tuple(rows)


@lru_cache(maxsize=1)
def driver_tables(path: Path | None = None) -> dict[str, tuple[GpuInstanceProfile, ...]]:
    """model name (values/mig/models.yaml) -> the driver's own GPU instance profile table recorded on a real GPU of
    that model (values/mig/lgip.yaml)."""
    doc = shipped_yaml((path or content.mig_models_file().with_name("lgip.yaml")).read_text())
    return {str(t["model"]): parse_lgip(str(t["table"]), f"values/mig/lgip.yaml ({t['model']})")
            for t in doc["tables"]}


def profile_of(product: str | None, memory_mib: int | None, multiprocessors: int | None,
               gpu_memory_mib: int | None = None) -> str | None:
    """The MIG profile ("1g.18gb") of a MIG device of this memory and SM count on a GPU of this product, derived from
    the driver's facts, never from the number in a profile's name; None when it cannot be told.

    - With the driver's profile table of the model (values/mig/lgip.yaml): the profile whose SM count is the
      device's and whose memory (GiB) is the nearest to the device's, within 1 GiB or 6 % (a MIG device reports the
      profile's memory, e.g. 16384 MiB for the H200's 1g.18gb: 16.00 GiB). Without an SM count, the memory alone
      when one profile has it.
    - Without a table: compute slices from the SM count (one slice: 14 SMs on A100/A30, 16 on Hopper) and memory
      slices from the device's share of the GPU's memory (gpu_memory_mib: the parent GPU's total; 8 slices, 4 on
      A30), matched against the model's profiles' slices (Model.memory_slices: their sizes relative to the 1g one).
    `+me` profiles have the same memory and SMs as their base profile and are never the answer."""
    if memory_mib is None or memory_mib <= 0:
        return None
    model = model_of(product)
    if model is None:
        return None
    gib = memory_mib / 1024
    table = driver_tables().get(model.name)
    if table:
        rows = [r for r in table if "+" not in r.name and (multiprocessors is None or r.sms == multiprocessors)]
        near = [(abs(r.memory_gib - gib), r.name) for r in rows
                if abs(r.memory_gib - gib) <= max(1.0, 0.06 * r.memory_gib)]
        if not near:
            return None
        best = min(d for d, _ in near)
        names = sorted({n for d, n in near if d == best})
        return names[0] if len(names) == 1 else None
    if not multiprocessors or not gpu_memory_mib or gpu_memory_mib <= 0:
        return None
    per_slice = 16 if re.match(r"^G?H[0-9]", model.name) else 14
    slices = min(model.slices, multiprocessors // per_slice)
    mem_slices = round(memory_mib / gpu_memory_mib * model.memory_slices())
    chosen = [p for p, _ in model.profiles if "+" not in p and p.startswith(f"{slices}g.")
              and model.memory_slices(p) == mem_slices]
    return chosen[0] if len(chosen) == 1 else None


@dataclass(frozen=True)
class Assignment:
    host: str        # inventory host
    node: str        # Kubernetes Node name
    config: str
    source: str      # "site mig.config" | "inventory gpu_install_mig_config"


@dataclass
class Result:
    node: str
    config: str
    source: str
    previous: str | None
    changed: bool
    product: str | None = None

    def line(self) -> str:
        what = ("unchanged" if not self.changed else
                f"set (was {self.previous})" if self.previous else "set")
        gpu = f"; {self.product}" if self.product else ""
        return f"{self.node}: {LABEL}={self.config} ({self.source}{gpu}) {what}"


def assignments(site: Site, gpu_hosts: list[tuple[str, dict[str, Any]]]) -> list[Assignment]:
    """Which config each GPU node gets (nodes without one are left alone); gpu_hosts: (host, its inventory vars)."""
    out = []
    for host, hv in gpu_hosts:
        override = hv.get(HOST_VAR)
        if override is not None and not isinstance(override, str):
            raise ConfigError(f"host {host}: {HOST_VAR} must be a string, not {type(override).__name__}",
                              hint="e.g. gpu_install_mig_config: all-1g.10gb")
        config = override or site.mig.config
        if not config:
            continue
        node = str(hv.get(NODE_NAME_VAR) or host)
        out.append(Assignment(host, node, config, f"inventory {HOST_VAR}" if override else "site mig.config"))
    return out


def site_default(site: Site, assigned: tuple[Assignment, ...] | list[Assignment]) -> list[Assignment]:
    """The site's mig.config as a name to check when no node carries it (no inventory, or every node overrides)."""
    if not site.mig.config or any(a.source == "site mig.config" for a in assigned):
        return []
    return [Assignment("", "", site.mig.config, "site mig.config")]


def check_names(site: Site, release: Release, plans: list[Assignment]) -> None:
    """Every config is one the release's mig-manager knows (or a valid label value with a custom ConfigMap); with
    mig.customConfigs, one of those (or all-disabled), each applicable to some known GPU model."""
    problems = []
    custom = site.mig.customConfigs
    for name, entries in custom.items():
        fits, why = custom_models(entries)
        if not fits:
            near = [w for w in why if "has no MIG profile" not in w]  # models that have the profiles, but not room
            if near:
                detail = "; ".join(near)
            else:
                wanted = sorted({p for e in entries for p in e.mig_devices})
                having = {p: [m.name for m in models() if p in dict(m.profiles)] for p in wanted}
                detail = "no model has all of its profiles (" + "; ".join(
                    f"{p}: {', '.join(ms) or 'none'}" for p, ms in having.items()) + ")"
            problems.append(f"mig.customConfigs.{name}: no MIG-capable GPU model can take it: {detail}")
    for p in plans:
        where = f"host {p.host}: {HOST_VAR}" if p.source.startswith("inventory") else "mig.config"
        if not _LABEL_VALUE.match(p.config):
            problems.append(f"{where}: {p.config!r} is not a valid label value")
        elif custom and p.config not in custom and p.config != DISABLED:
            problems.append(f"{where}: {p.config} is not in mig.customConfigs ({', '.join(sorted(custom))}) nor "
                            f"{DISABLED}: the site's MIG ConfigMap replaces the release's default configs")
        elif not site.mig.configMap and not custom and release.mig_configs and p.config not in release.mig_configs:
            close = difflib.get_close_matches(p.config, release.mig_configs, n=3, cutoff=0.5)
            problems.append(f"{where}: {p.config} is not in GPU Operator {release.version}'s default MIG configs"
                            + (f"; nearest: {', '.join(close)}" if close else ""))
    if problems:
        raise ConfigError("; ".join(sorted(set(problems))),
                          hint="use a name from the release's default mig-parted config (gpu-install catalog show) or "
                               "from mig.customConfigs, or set mig.configMap to your own ConfigMap; nothing was labelled")


def check_node(site: Site, release: Release, p: Assignment, labels: dict[str, str]) -> str | None:
    """A problem of this config on this node's GPU (from its GFD labels), or None."""
    if labels.get(CAPABLE_LABEL) == "false" and p.config != DISABLED:
        return (f"node {p.node}: {p.config} ({p.source}) but the node reports {CAPABLE_LABEL}=false "
                f"({labels.get(PRODUCT_LABEL) or 'GPU model unknown'}); only {DISABLED} applies")
    if site.mig.configMap:
        return None  # a custom ConfigMap: its configs are not ours to know
    model = model_of(labels.get(PRODUCT_LABEL))
    if model is None:
        return None
    if p.config in site.mig.customConfigs:
        problem = misfit(model, site.mig.customConfigs[p.config])
        return None if problem is None else (f"node {p.node}: {p.config} ({p.source}) does not apply to its GPU "
                                             f"{labels[PRODUCT_LABEL]}: mig.customConfigs.{p.config} {problem}")
    if site.mig.customConfigs and p.config == DISABLED:
        return None
    ok = model.configs & set(release.mig_configs or model.configs)
    if p.config == "all-balanced" and model.all_balanced_from and not release.at_least(model.all_balanced_from):
        ok = ok - {"all-balanced"}
    if p.config not in ok:
        return (f"node {p.node}: {p.config} ({p.source}) does not apply to its GPU {labels[PRODUCT_LABEL]} "
                f"({model.name}); configs for it in {release.version}: {', '.join(sorted(ok))}")
    return None


def label_nodes(plan: Plan, kubeconfig: str | None = None, *, dry_run: bool = False,
                progress: Callable[[str], None] | None = None, client: Any = None) -> list[Result]:
    """Label each GPU node of the plan nvidia.com/mig.config=<its config>. All nodes are checked first;
    a problem on any node raises ConfigError and labels nothing. Returns one Result per labelled node."""
    from installer import kube

    plans = list(plan.mig)
    site, release = plan.site, plan.release
    if not plans:
        if progress:
            progress("mig: no MIG layout configured (site mig.config / inventory gpu_install_mig_config): nothing to label")
        return []
    if client is None:
        client = kube.api_client(kube.resolve_kubeconfig(kubeconfig))
    current = kube.node_labels(client, [p.node for p in plans])
    missing = [p for p in plans if current.get(p.node) is None]
    if missing:
        raise ConfigError("not in the cluster: " + ", ".join(f"node {p.node} (inventory host {p.host})" for p in missing),
                          hint=f"set {NODE_NAME_VAR} for hosts whose Kubernetes node name differs; nothing was labelled")
    problems = [msg for p in plans if (msg := check_node(site, release, p, current[p.node] or {}))]
    if problems:
        raise ConfigError("; ".join(problems), hint="pick a config for that GPU model (per node: "
                          f"{HOST_VAR} in the inventory); nothing was labelled")
    results = []
    for p in plans:
        labels = current[p.node] or {}
        previous = labels.get(LABEL)
        changed = previous != p.config
        if changed and not dry_run:
            kube.set_node_label(client, p.node, LABEL, p.config)
        r = Result(p.node, p.config, p.source, previous, changed, labels.get(PRODUCT_LABEL))
        results.append(r)
        if progress:
            progress(r.line() + (" (dry run)" if dry_run and changed else ""))
    return results
