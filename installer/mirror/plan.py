"""The artifact plan: everything an air-gapped site must hold before `apply`, from the resolved Plan. No network.

- images: exactly Plan.images (what `gpu-install images` lists, source → destination), each with the component and
  the settings that make it deployed and pick its tag;
- the chart: `gpu-operator` at the release's chart version, from site `mirror.chartRepository` (an http(s)
  repository or oci://);
- files: the driver runfile (driver.mode runfile);
- OS packages per node OS: the ROOTS the roles install there — read from the roles' own defaults and OS maps
  (roles/<role>/defaults/main.yml, roles/<role>/vars/<distribution|os_family>.yml, the same first-found order the
  roles use), overlaid with the inventory's settings of those variables and the variables the Plan hands the roles
  (Plan.role_vars), with the same pins the roles apply (apt `name=<v>*`, dnf `name-<v>*`). The dependency closure is
  not computed here: `mirror pull` resolves it with the distro tools against the upstream repositories;
- and, driver.mode operator, the OS packages NVIDIA's driver container installs at start for each node kernel
  (installer/data/driver-container-packages.yaml, per OS family, with its source), into the same per-OS package sets
  (none when packages.osMirror names the site's own OS mirror for the container).

JSON form (`gpu-install mirror plan --format json`) is versioned: SCHEMA names it; docs/airgap.md describes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from installer import content, platforms
from installer.catalog import has_path
from installer.errors import ConfigError
from installer.facts import Node, with_next_kernels
from installer.patterns import OS_TAG, strip_userinfo

if TYPE_CHECKING:
    from installer.artifacts import Image
    from installer.plan import Plan
    from installer.render.values import ResolvedComponent

SCHEMA = "gpu-install.mirror-plan/v1"
CHART_NAME = "gpu-operator"
CLOSURE = "resolved at pull"  # package dependencies: by apt/dnf at `mirror pull`, never here
DRIVER_ROLE = "nvidia_driver"
TOOLKIT_ROLE = "nvidia_container_toolkit"
DRIVER_COMPONENT = "driver"  # the operator's component whose container installs OS packages at start
CONTAINER_TABLE = Path(__file__).resolve().parent.parent / "data" / "driver-container-packages.yaml"
CONTAINER_WHY = "the driver container installs them at start (gpu-driver-container _install_prerequisites)"


@dataclass(frozen=True)
class Need:
    """Why an artifact is in the plan: the component (or role) that uses it and the settings that decide it."""

    component: str
    setting: str

    def as_dict(self) -> dict[str, str]:
        return {"component": self.component, "setting": self.setting}


@dataclass(frozen=True)
class ImageArtifact:
    source: str
    destination: str
    component: str
    needs: tuple[Need, ...]

    kind = "image"

    @property
    def ref(self) -> str:
        return self.source

    def answers(self, ref: str) -> bool:
        return ref in (self.source, self.destination)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "destination": self.destination, "component": self.component,
                "needs": [n.as_dict() for n in self.needs]}


@dataclass(frozen=True)
class ChartArtifact:
    name: str
    version: str
    repository: str  # https://… (index.yaml repository) or oci://…
    needs: tuple[Need, ...]

    kind = "chart"

    @property
    def oci(self) -> bool:
        return self.repository.startswith("oci://")

    @property
    def ref(self) -> str:
        """oci://<registry>/<path>/gpu-operator:<version>, or <repository>/gpu-operator:<version> (helm pull
        --repo <repository> gpu-operator --version <version>)."""
        return f"{self.repository}/{self.name}:{self.version}"

    @property
    def file(self) -> str:
        return f"{self.name}-{self.version}.tgz"  # what `helm pull` writes

    def answers(self, ref: str) -> bool:
        return ref in (self.name, f"{self.name}:{self.version}", self.ref, self.file, f"{self.repository}/{self.name}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "repository": strip_userinfo(self.repository),
                "type": "oci" if self.oci else "http", "ref": strip_userinfo(self.ref), "file": self.file,
                "needs": [n.as_dict() for n in self.needs]}


@dataclass(frozen=True)
class FileArtifact:
    source: str  # URL in the site's file mirror, or a path on the controller
    name: str
    sha256: str | None
    needs: tuple[Need, ...]

    kind = "file"

    @property
    def ref(self) -> str:
        return self.source

    def answers(self, ref: str) -> bool:
        return ref in (self.source, self.name)

    def as_dict(self) -> dict[str, Any]:
        return {"source": strip_userinfo(self.source), "name": self.name, "sha256": self.sha256,
                "needs": [n.as_dict() for n in self.needs]}


@dataclass(frozen=True)
class PackageArtifact:
    os: str  # ID+VERSION_ID as the inventory gives it (ubuntu22.04, rocky9.4)
    manager: str  # apt | dnf
    name: str
    version: str | None  # the pin (a version prefix), None: unpinned
    spec: str  # exactly what the role asks the package manager for (nvidia-driver=535*, nvidia-driver-535*)
    needs: tuple[Need, ...]
    hosts: tuple[str, ...] = ()  # inventory hosts that install it (empty with --os)

    kind = "package"

    @property
    def ref(self) -> str:
        return f"{self.os}/{self.name}"

    def answers(self, ref: str) -> bool:
        return ref in (self.name, self.ref, self.spec, f"{self.os}/{self.spec}")

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "match": "prefix" if self.version else None,
                "spec": self.spec, "hosts": list(self.hosts), "needs": [n.as_dict() for n in self.needs]}


Artifact = ImageArtifact | ChartArtifact | FileArtifact | PackageArtifact


@dataclass(frozen=True)
class OsPackages:
    """The package roots one node OS needs (the closure is resolved at pull)."""

    os: str
    manager: str
    packages: tuple[PackageArtifact, ...]
    hosts: tuple[str, ...] = ()
    # dnf module streams (name:stream, e.g. nvidia-driver:580-open) enabled to resolve and install the roots: RHEL 8/9
    # driver.mode host (the driver role's OS map, module_stream); pull carries their modules metadata
    modules: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"os": self.os, "manager": self.manager, "closure": CLOSURE, "hosts": list(self.hosts),
                **({"modules": list(self.modules)} if self.modules else {}),
                "roots": [p.as_dict() for p in self.packages]}


@dataclass(frozen=True)
class NodeKernels:
    """The kernel headers one node needs (driver.mode host/runfile: DKMS builds against them; operator: the driver
    container does): of the kernel it runs (gpu_install_kernel; --kernel without an inventory) and of each kernel it
    boots next (--kernel with -i)."""

    host: str  # inventory host, or the --os it stands for
    os: str
    kernel: str | None  # running; None: unknown (its headers cannot be listed)
    next: tuple[str, ...]
    headers: tuple[str, ...]  # package names, in the order of (kernel, *next)

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "os": self.os, "kernel": self.kernel, "next": list(self.next),
                "headers": list(self.headers)}


@dataclass(frozen=True)
class ArtifactPlan:
    release: str
    registry: str
    images: tuple[ImageArtifact, ...]
    charts: tuple[ChartArtifact, ...]
    files: tuple[FileArtifact, ...]
    packages: tuple[OsPackages, ...]
    kernels: tuple[str, ...] = ()  # the kernels the nodes boot next (--kernel with an inventory)
    notes: tuple[str, ...] = field(default=())
    node_kernels: tuple[NodeKernels, ...] = ()  # which node needs which kernel headers

    def artifacts(self) -> list[Artifact]:
        return [*self.images, *self.charts, *self.files, *(p for o in self.packages for p in o.packages)]

    def why(self, ref: str) -> list[Artifact]:
        """The artifacts REF names (an image source or destination, the chart, a file, a package name or os/name)."""
        ref = ref.strip()
        return [a for a in self.artifacts() if a.answers(ref)]

    def as_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "release": self.release, "registry": self.registry,
                "images": [i.as_dict() for i in self.images], "charts": [c.as_dict() for c in self.charts],
                "files": [f.as_dict() for f in self.files], "packages": [p.as_dict() for p in self.packages],
                "kernels": [k.as_dict() for k in self.node_kernels], "notes": list(self.notes)}


# ---------------------------------------------------------------- the plan


def artifact_plan(plan: Plan, kernels: Sequence[str] = ()) -> ArtifactPlan:
    """The artifacts of a resolved plan. kernels: more kernels the nodes boot next ([OSTAG=]KERNEL, each to the nodes
    of its OS, as --kernel with an inventory; resolve() has already added those of Options.kernels), besides the
    kernel each runs. Raises ConfigError (exit 2) for what it cannot resolve."""
    if kernels:
        plan = replace(plan, nodes=with_next_kernels(plan.nodes, kernels))
    extra = tuple(dict.fromkeys(k for n in plan.nodes for k in n.next_kernels))
    site = plan.site
    images = tuple(_image(plan, img) for img in plan.images)
    charts = chart_artifacts(plan)
    chart = charts[0]
    notes: list[str] = []
    if site.operator.chart:
        where = ("push the mirrored chart to that registry path" if "://" in site.operator.chart
                 else f"put the mirrored {chart.file} at that path on the air-gapped controller")
        notes.append(f"operator.chart is {site.operator.chart}: apply installs the chart from there; {where}")
    files, packages, more, node_kernels = _node_artifacts(plan)
    notes += more
    container = _container_wanted(plan)
    if site.packages.osMirror and not container:
        notes.append("packages.osMirror is read only by the operator's driver container (driver.mode operator): "
                     f"with driver.mode {site.driver.mode} nothing uses it")
    if extra and not (container and site.packages.osMirror) \
            and not any(p.name.endswith(tuple(extra)) for o in packages for p in o.packages):
        notes.append(f"--kernel {' '.join(extra)}: no kernel headers are installed by the roles with driver.mode "
                     f"{site.driver.mode}; nothing was listed for it")
    carried = "mirror pull/push carry the images, the chart" + (" and the runfile" if files else "")
    notes.append(carried + ("; the OS packages with their closure, resolved at pull against "
                            "mirror.packageRepositories, and published signed by push --repo-dir" if packages else ""))
    return ArtifactPlan(release=plan.release.version, registry=site.registry.host, images=images, charts=tuple(charts),
                        files=files, packages=packages, kernels=extra, notes=tuple(notes), node_kernels=node_kernels)


def chart_artifacts(plan: Plan) -> list[ChartArtifact]:
    """The charts of the plan: the GPU Operator's at the release's chart version (first), then the active features'
    (HAMi's, nos'). From the site and the catalog alone (no nodes): push checks a bundle's
    charts against it."""
    site = plan.site
    chart = ChartArtifact(CHART_NAME, chart_version(plan), site.mirror.chartRepository, (
        Need("GPU Operator chart", f"operator.version={plan.release.version}"),
        Need("GPU Operator chart", f"mirror.chartRepository={strip_userinfo(site.mirror.chartRepository)}"
             + ("" if "mirror" in site.model_fields_set and "chartRepository" in site.mirror.model_fields_set
                else " (default)"))))
    from installer import features

    charts = [chart]
    for feature, c in features.charts(site):  # the active features' charts, from their own repositories
        charts.append(ChartArtifact(c.name, c.version, c.repository, (Need(c.label, feature.selector(site)),)))
    return charts


def runfile_artifact(plan: Plan) -> FileArtifact | None:
    """The driver runfile the plan carries (driver.mode runfile), from the site alone; None in the other modes."""
    if plan.site.driver.mode != "runfile":
        return None
    rv = plan.role_vars
    source = str(rv[f"{DRIVER_ROLE}_runfile"])
    return FileArtifact(source, source.rsplit("/", 1)[-1], rv.get(f"{DRIVER_ROLE}_runfile_sha256") or None,
                        (Need(DRIVER_ROLE, "driver.mode=runfile"), Need(DRIVER_ROLE, f"driver.runfile={strip_userinfo(source)}")))


def chart_version(plan: Plan) -> str:
    """The chart's version as the chart repository lists it (the catalog records it; v-prefixed for NVIDIA's)."""
    chart = plan.release.raw.get("chart") or {}
    version = chart.get("version") if isinstance(chart, dict) else None
    return str(version or plan.release.version)


# ---------------------------------------------------------------- images


def _image(plan: Plan, img: Image) -> ImageArtifact:
    comp = plan.components.get(img.component)
    if comp is None:  # an image of a feature (installer.features), not of the operator's chart
        from installer import features

        need = Need(img.component, features.image_selector(plan.site, img.component))
        return ImageArtifact(img.source, img.destination, img.component, (need,))
    return ImageArtifact(img.source, img.destination, img.component, tuple(_image_needs(plan, comp, img)))


def _image_needs(plan: Plan, comp: ResolvedComponent, img: Image) -> list[Need]:
    site, spec, name = plan.site, comp.spec, comp.name
    out: list[Need] = []
    ov = site.components.get(name)
    # deployed because …
    if name == "driver":
        out.append(Need(name, f"driver.mode={site.driver.mode}"))
    elif name == "toolkit":
        out.append(Need(name, f"toolkit.mode={site.toolkit.mode}"))
    if ov is not None and ov.enabled is not None:
        out.append(Need(name, f"components.{name}.enabled={str(ov.enabled).lower()}"))
    elif name not in ("driver", "toolkit"):
        switch = spec.enabled_path
        if not switch:
            out.append(Need(name, f"always deployed by {plan.release.version}"))
        elif has_path(site.values, switch):
            out.append(Need(name, f"values.{switch}=true"))
        elif has_path(plan.values, switch):
            out.append(Need(name, f"{switch}=true (rendered from the site)"))
        else:
            out.append(Need(name, f"{switch}=true (chart default of {plan.release.version})"))
    for gate in spec.gates:
        if gate.startswith("sandboxWorkloads"):
            out.append(Need(name, "sandboxWorkloads.enabled=true"))
        elif not (name == "driver" and gate.startswith("driver.")):
            out.append(Need(name, f"{gate}={str(plan.effective(gate)).lower()}"))
    # … at this version
    if ov is not None and ov.version:
        out.append(Need(name, f"components.{name}.version={ov.version}"))
    elif name == "driver" and site.driver.version:
        out.append(Need(name, f"driver.version={site.driver.version}"))
    elif name == "toolkit" and site.toolkit.version:
        out.append(Need(name, f"toolkit.version={site.toolkit.version}"))
    else:
        out.append(Need(name, f"operator.version={plan.release.version} (catalog pin {comp.version})"))
    if ov is not None and ov.repository:
        out.append(Need(name, f"components.{name}.repository={ov.repository}"))
    # … with this tag suffix (driver, GDS, GDRCopy, vGPU manager: one image per node OS)
    if spec.os_suffix and not (comp.version or "").startswith("sha256:"):
        tag = img.source.rsplit(":", 1)[-1]
        hosts = [n for n in plan.nodes if n.os_id and n.os_version and tag.endswith("-" + n.os_tag(plan.release.version))
                 and (site.driver.mode != "precompiled" or name != "driver" or any(f"-{k}-" in tag for k in n.kernels))]
        out.append(Need(name, _node_setting(plan, hosts, precompiled=site.driver.mode == "precompiled"
                                            and name == "driver", tag=tag)))
    return out


def _node_setting(plan: Plan, nodes: Sequence[Node], precompiled: bool = False, tag: str = "") -> str:
    """The nodes (and, precompiled, the kernels: running, or booted next with --kernel) an image tag is for."""
    running = any(n.kernel and f"-{n.kernel}-" in tag for n in nodes)
    what = "gpu_install_os" + (" + gpu_install_kernel" if precompiled and running else "")
    if plan.inventory is None:
        tags = sorted({f"{n.os_id}{n.os_version}" for n in nodes})
        kernels = sorted({k for n in nodes for k in n.kernels if f"-{k}-" in tag}) if precompiled else []
        return " ".join([*(f"--os {t}" for t in tags), *(f"--kernel {k}" for k in kernels)])
    names = sorted(n.name for n in nodes)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    nxt = sorted({k for n in nodes for k in n.next_kernels if f"-{k}-" in tag}) if precompiled else []
    return f"{what} of host{'s' if len(names) != 1 else ''} {shown}" + "".join(
        f"; --kernel {k} (the kernel they boot next)" for k in nxt)


def _os_need(plan: Plan, role: str, os_tag: str) -> Need:
    return Need(role, f"gpu_install_os={os_tag}" if plan.inventory is not None else f"--os {os_tag}")


# ---------------------------------------------------------------- the roles' variables


@cache
def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


def role_defaults(role: str) -> dict[str, Any]:
    data = _yaml(content.role_dir(role) / "defaults" / "main.yml") or {}
    return dict(data)


def os_map_file(role: str, os_id: str, os_version: str) -> Path:
    """The OS map a role loads on a node with this os-release ID and VERSION_ID: the first of
    vars/<distribution>-<major>.yml, vars/<distribution>.yml, vars/<os_family>.yml (tasks/os.yml)."""
    if os_id not in platforms.ANSIBLE_OS:
        raise ConfigError(f"{os_id}{os_version}: no OS map for it in the roles (supported: "
                          f"{', '.join(sorted(platforms.ANSIBLE_OS))})",
                          hint="give the node's os-release ID and VERSION_ID, e.g. ubuntu22.04 or rocky9.4")
    distribution, family = platforms.ANSIBLE_OS[os_id]
    major = os_version.split(".")[0]
    vars_dir = content.role_dir(role) / "vars"
    for name in (f"{distribution}-{major}.yml", f"{distribution}.yml", f"{family}.yml"):
        if (vars_dir / name).is_file():
            return vars_dir / name
    raise ConfigError(f"role {role} has no OS map for {os_id}{os_version} in {vars_dir}",
                      hint="the roles support: " + ", ".join(sorted(platforms.ROLE_OS)))


def os_map(role: str, os_id: str, os_version: str) -> dict[str, Any]:
    data = _yaml(os_map_file(role, os_id, os_version)) or {}
    return dict(data.get(f"{role}_os") or {})


def _template(value: Any, variables: Mapping[str, Any], where: str) -> str:
    """A role's Jinja expression (a package name such as nvidia-driver-{{ … | split('.') | first }}-server), rendered
    the way Ansible would with these variables; sandboxed, nothing undefined."""
    text = str(value)
    if "{{" not in text and "{%" not in text:
        return text
    from jinja2 import StrictUndefined, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(undefined=StrictUndefined, autoescape=False)
    env.filters["split"] = lambda s, sep=None, maxsplit=-1: str(s).split(sep, maxsplit)  # Ansible's `split`
    try:
        return str(env.from_string(text).render(**variables)).strip()
    except TemplateError as exc:
        raise ConfigError(f"{where}: cannot evaluate {text!r} without a node ({exc})",
                          hint="set the variable to a plain value in the inventory") from None


def _names(rv: Mapping[str, Any], key: str, where: str) -> list[Any]:
    """A list variable of package names (role default, inventory or extra vars)."""
    value = rv.get(key)
    if value is None or value == "":
        return []
    if isinstance(value, str) or not isinstance(value, list):
        raise ConfigError(f"{where}: {key} is {value!r}, not a list of package names",
                          hint=f"give {key} as a YAML list in the inventory, e.g. [nvidia-driver]")
    return value


def _flag(rv: Mapping[str, Any], key: str, default: bool = True) -> bool:
    """A boolean role variable as Ansible's conditionals read it (an INI inventory gives 'false' as a string)."""
    value = rv.get(key, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "off", "0", "n", "f", "")
    return bool(value)


def _role_vars(plan: Plan, node: Node, role: str) -> dict[str, Any]:
    """A role's variables on a node as Ansible sees them: role defaults < inventory < what the Plan hands the role
    (extra vars)."""
    prefix = role + "_"
    out = role_defaults(role)
    out.update({k: v for k, v in node.role_vars.items() if k.startswith(prefix)})
    out.update({k: v for k, v in plan.role_vars.items() if k.startswith(prefix)})
    return out


# ---------------------------------------------------------------- files and packages


class _Collect:
    """Packages per node OS, merged across the hosts that share the OS."""

    def __init__(self) -> None:
        self.by_os: dict[str, tuple[str, dict[tuple[str, str], PackageArtifact]]] = {}
        self.hosts: dict[str, list[str]] = {}
        self.modules: dict[str, list[str]] = {}

    def add_module(self, os: str, stream: str) -> None:
        """A dnf module stream (name:stream) the roots of this OS are resolved and installed with (the driver's branch
        and flavour come from the site, one for every host)."""
        have = self.modules.setdefault(os, [])
        if stream not in have:
            have.append(stream)

    def add(self, os: str, manager: str, name: str, version: str | None, pin: str, needs: Iterable[Need],
            host: str | None) -> None:
        spec = f"{name}{pin}{version}*" if version else name
        have_manager, pkgs = self.by_os.setdefault(os, (manager, {}))
        if have_manager != manager:
            raise ConfigError(f"{os}: the roles' OS maps disagree on the package manager ({have_manager}, {manager})")
        old = pkgs.get((name, spec))
        hosts = tuple(sorted({*(old.hosts if old else ()), *([host] if host else [])}))
        merged = tuple(dict.fromkeys([*(old.needs if old else ()), *needs]))  # in the order they were found
        pkgs[(name, spec)] = PackageArtifact(os, manager, name, version, spec, merged, hosts)
        if host and host not in self.hosts.setdefault(os, []):
            self.hosts[os].append(host)

    def result(self) -> tuple[OsPackages, ...]:
        return tuple(OsPackages(os, manager, tuple(sorted(pkgs.values(), key=lambda p: (p.name, p.spec))),
                                tuple(sorted(self.hosts.get(os, ()))), tuple(self.modules.get(os, ())))
                     for os, (manager, pkgs) in sorted(self.by_os.items()))


def _node_artifacts(plan: Plan) -> tuple[tuple[FileArtifact, ...], tuple[OsPackages, ...], list[str],
                                        tuple[NodeKernels, ...]]:
    site = plan.site
    mode = site.driver.mode
    driver_packages = mode in ("host", "runfile")
    toolkit_packages = bool(plan.role_vars.get(f"{TOOLKIT_ROLE}_enabled"))
    container = _container_wanted(plan)
    if not (driver_packages or toolkit_packages or container):
        return (), (), [], ()
    files: dict[str, FileArtifact] = {}
    notes: list[str] = []
    runfile = runfile_artifact(plan)
    if runfile is not None:
        source = runfile.source
        files[source] = runfile
        if "://" not in source:
            notes.append(f"driver.runfile {source} is a path on the controller: carry it to the air-gapped controller "
                         "at the same path (or serve it from the site's file mirror and give its URL)")
    wanted = [w for w, on in (("driver.mode=" + mode, driver_packages), ("toolkit.mode=host", toolkit_packages)) if on]
    if not plan.nodes and not wanted:  # a driver image pinned by digest needs no node OS for its tag
        notes.append("driver.mode operator: the driver container installs the node kernels' OS packages at start, and "
                     "no nodes are given: none listed (pass -i INVENTORY, --os/--kernel, or --facts FILE from "
                     "`gpu-install nodes facts`)")
        return tuple(files.values()), (), notes, ()
    if not plan.nodes:
        raise ConfigError(f"{' and '.join(wanted)}: the roles install OS packages on the nodes, and which depends on "
                          "their OS, which is not given",
                          hint="pass -i INVENTORY (gpu_install_os per host) or --os, e.g. --os ubuntu22.04 --os rocky9.4")
    pkgs = _Collect()
    node_kernels: list[NodeKernels] = []
    table = container_table() if container else None
    precompiled_fit: dict[str, list[Node]] = {}
    for node in plan.nodes:
        if (node.os_id is None or node.os_version is None) and not wanted:
            notes.append(f"host {node.name}: OS unknown (gpu_install_os is not set): the OS packages its driver "
                         "container installs at start cannot be listed")
            continue
        if node.os_id is None or node.os_version is None:
            raise ConfigError(f"host {node.name}: OS unknown (gpu_install_os is not set), and {' and '.join(wanted)} "
                              "installs OS packages that depend on it",
                              hint="set gpu_install_os (e.g. ubuntu22.04) for the host or its group")
        os_tag = f"{node.os_id}{node.os_version}"
        host = node.name if plan.inventory is not None else None
        if driver_packages:
            more, headers = _driver_packages(plan, node, os_tag, host, node.kernels, pkgs)
            notes += more
            if headers:
                node_kernels.append(NodeKernels(host or f"--os {os_tag}", os_tag, node.kernel, node.next_kernels,
                                                tuple(headers)))
        if toolkit_packages:
            _toolkit_packages(plan, node, os_tag, host, pkgs)
        if table is not None:
            more, headers = _driver_container_packages(plan, node, os_tag, host, pkgs, table)
            notes += more
            if headers:
                node_kernels.append(NodeKernels(host or f"--os {os_tag}", os_tag, node.kernel, node.next_kernels,
                                                tuple(headers)))
            if _precompiled_fits(plan, node, os_tag, table):
                precompiled_fit.setdefault(os_tag, []).append(node)
    if table is not None:
        notes += _precompiled_notes(plan, precompiled_fit, table)
    return tuple(files.values()), pkgs.result(), list(dict.fromkeys(notes)), tuple(node_kernels)


def _driver_packages(plan: Plan, node: Node, os_tag: str, host: str | None, kernels: Sequence[str],
                     pkgs: _Collect) -> tuple[list[str], list[str]]:
    """The driver role's package roots on a node, exactly as roles/nvidia_driver/tasks/host.yml (runfile.yml) chooses
    them: the OS map's set, whose names follow nvidia_driver_kernel_module_type (with open no proprietary module
    package), or with nvidia_driver_prebuilt_modules its prebuilt set and the modules package of each kernel instead of
    DKMS, build tools and headers; (notes, the kernel header packages, in the order of kernels)."""
    from installer.render.role_vars import host_driver

    assert node.os_id is not None and node.os_version is not None
    site = plan.site
    mode = site.driver.mode
    rv = _role_vars(plan, node, DRIVER_ROLE)
    if not _flag(rv, f"{DRIVER_ROLE}_enabled"):
        return [], []
    osm = os_map(DRIVER_ROLE, node.os_id, node.os_version)
    where = f"host {node.name}" if plan.inventory is not None else f"{DRIVER_ROLE} on {os_tag}"
    manager, pin = str(osm["package_manager"]), str(osm["pin"])
    version = str(rv[f"{DRIVER_ROLE}_package_version"])
    variables = {**rv, f"{DRIVER_ROLE}_package_version": version}
    hd = host_driver(site, plan.release, plan.nodes)
    version_need = Need(DRIVER_ROLE, f"driver.version={site.driver.version}" if site.driver.version else
                        (f"driver.runfile={strip_userinfo(site.driver.runfile or '')}" if mode == "runfile" else
                         f"driver.version unset: the release's driver branch {version} ({plan.release.version} pins "
                         f"{hd.release_driver if hd else '?'})"))
    module_need = Need(DRIVER_ROLE, f"kernel modules: {rv.get(f'{DRIVER_ROLE}_kernel_module_type')}"
                       + (f" ({hd.module_why})" if hd else ""))
    mode_need = Need(DRIVER_ROLE, f"driver.mode={mode}")
    os_need = _os_need(plan, DRIVER_ROLE, os_tag)
    prebuilt = mode == "host" and _flag(rv, f"{DRIVER_ROLE}_prebuilt_modules", False)
    if prebuilt and not (osm.get("prebuilt_packages") and osm.get("prebuilt_modules")):
        raise ConfigError(f"{where}: {DRIVER_ROLE}_prebuilt_modules is true, and {os_tag} has no prebuilt NVIDIA "
                          "kernel modules (Canonical's linux-modules-nvidia-* are Ubuntu's)",
                          hint=f"set {DRIVER_ROLE}_prebuilt_modules: false for the host (DKMS builds the module on "
                               "the node)")
    notes: list[str] = []
    notes += _fabric_packages(plan, node, os_tag, host, pkgs, rv, osm, version, where)
    if mode == "host":
        own = _names(rv, f"{DRIVER_ROLE}_packages", where)
        names = own or osm.get("prebuilt_packages" if prebuilt else "packages") or []
        source = f"{DRIVER_ROLE}_packages" if own else f"vars/{os_map_file(DRIVER_ROLE, node.os_id, node.os_version).name}"
        for n in names:
            pkgs.add(os_tag, manager, _template(n, variables, where), version, pin,
                     (mode_need, version_need, module_need, os_need, Need(DRIVER_ROLE, f"package list: {source}")),
                     host)
        for n in _names(rv, f"{DRIVER_ROLE}_extra_packages", where) or osm.get("extra_packages") or []:
            pkgs.add(os_tag, manager, _template(n, variables, where), None, pin,
                     (mode_need, os_need, Need(DRIVER_ROLE, "companion package, unpinned")), host)
        stream = _template(osm.get("module_stream") or "", {
            **variables, "ansible_facts": {"distribution_major_version": node.os_version.split(".")[0]}}, where)
        if stream:
            pkgs.add_module(os_tag, stream)
            notes.append(f"{os_tag}: the driver packages come from the dnf module stream {stream} (NVIDIA's RHEL 8/9 "
                         "packaging): mirror pull resolves them with it enabled and carries its modules metadata into "
                         "the site repository; apply enables it on the nodes before the install")
        build_need = Need(DRIVER_ROLE, "driver.mode=host: DKMS builds the kernel module on the node")
    else:
        for n in _names(rv, f"{DRIVER_ROLE}_runfile_packages", where):
            pkgs.add(os_tag, manager, _template(n, variables, where), None, pin,
                     (mode_need, os_need, Need(DRIVER_ROLE, f"{DRIVER_ROLE}_runfile_packages")), host)
        build_need = Need(DRIVER_ROLE, "driver.mode=runfile: the runfile's --dkms builds the kernel module on the node")
    if prebuilt:
        # no DKMS: no build tools, no headers; the modules package of each kernel (running and next), unpinned
        for k in kernels:
            running = k == node.kernel
            pkgs.add(os_tag, manager, _template(osm["prebuilt_modules"], {**variables, "ansible_facts": {"kernel": k}},
                                                where), None, pin,
                     (mode_need, module_need, Need(DRIVER_ROLE, f"{DRIVER_ROLE}_prebuilt_modules: Canonical's prebuilt "
                                                   + ("modules of the running kernel" if running else
                                                      "modules of a kernel the node boots next")),
                      Need(DRIVER_ROLE, f"gpu_install_kernel={k}" if running and plan.inventory is not None
                           else f"--kernel {k}")), host)
        if node.kernel is None:
            notes.append(f"{os_tag}: the prebuilt kernel modules package of the nodes' running kernel is needed and "
                         "that kernel is not known: give --kernel (uname -r of the nodes) with --os, or "
                         "gpu_install_kernel in the inventory")
        return notes, []
    if mode == "host" or _flag(rv, f"{DRIVER_ROLE}_runfile_dkms"):
        for n in osm.get("build_packages") or []:
            pkgs.add(os_tag, manager, _template(n, variables, where), None, pin, (build_need, os_need), host)
    header_names: list[str] = []
    if _flag(rv, f"{DRIVER_ROLE}_require_kernel_headers"):
        headers = osm["headers"]
        if node.kernel is None:
            shown = _template(headers, {**variables, "ansible_facts": {"kernel": "<kernel>"}}, where)
            notes.append(f"{os_tag}: the kernel headers ({shown}) of the nodes' running kernel are needed and that "
                         "kernel is not known: give --kernel (uname -r of the nodes) with --os, or gpu_install_kernel "
                         "in the inventory")
        for k in kernels:
            name = _template(headers, {**variables, "ansible_facts": {"kernel": k}}, where)
            running = k == node.kernel
            kernel_need = Need(DRIVER_ROLE, f"gpu_install_kernel={k}" if running and plan.inventory is not None
                               else f"--kernel {k}")
            pkgs.add(os_tag, manager, name, None, pin,
                     (mode_need, Need(DRIVER_ROLE, "kernel headers of the running kernel (DKMS builds against them)"
                                      if running else "kernel headers of a kernel the node boots next (DKMS rebuilds "
                                      "the module against them after the kernel update)"), kernel_need), host)
            header_names.append(name)
    return notes, header_names


# ---------------------------------------------------------------- the driver container's packages (operator mode)


_NAME = r"[a-z0-9][a-z0-9+._-]{0,100}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ContainerPackage(_Strict):
    """A package the driver container installs; {kernel} in its name: one per node kernel."""

    name: str = Field(pattern=rf"^{_NAME}(?:\{{kernel\}}(?:[a-z0-9+._-]{{0,40}}))?$")
    how: str = Field(min_length=1, max_length=300)
    headers: StrictBool = False

    @property
    def per_kernel(self) -> bool:
        return "{kernel}" in self.name

    def for_kernel(self, kernel: str) -> str:
        return self.name.replace("{kernel}", kernel)


class ContainerFamily(_Strict):
    """The driver images of some os-release IDs: their package manager and what their container installs at start."""

    ids: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")]] = Field(min_length=1, max_length=16)
    manager: Literal["apt", "dnf"]
    source: str = Field(min_length=1, max_length=500)
    packages: list[ContainerPackage] = Field(min_length=1, max_length=16)
    notes: list[Annotated[str, Field(min_length=1, max_length=600)]] = Field(default_factory=list, max_length=8)

    @model_validator(mode="after")
    def _one_header_package(self) -> ContainerFamily:
        names = [p.name for p in self.packages]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"packages: {', '.join(twice)} listed twice")
        headers = [p.name for p in self.packages if p.headers]
        if len(headers) != 1 or "{kernel}" not in headers[0]:
            raise ValueError("packages: exactly one package per kernel ({kernel} in its name) is marked headers: true "
                             f"(found: {', '.join(headers) or 'none'})")
        return self

    def header_package(self) -> ContainerPackage:
        return next(p for p in self.packages if p.headers)


class PrecompiledOs(_Strict):
    kernels: list[Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+$")]] = Field(min_length=1, max_length=16)
    flavours: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")]] = Field(min_length=1, max_length=32)


class Precompiled(_Strict):
    source: str = Field(min_length=1, max_length=500)
    branches: list[Annotated[str, Field(pattern=r"^[0-9]{3,4}$")]] = Field(min_length=1, max_length=16)
    arch: list[Literal["x86_64", "aarch64"]] = Field(min_length=1, max_length=2)
    os: dict[Annotated[str, Field(pattern=OS_TAG)], PrecompiledOs] = Field(max_length=16)


class ContainerTable(_Strict):
    """installer/data/driver-container-packages.yaml."""

    schema_: Literal["gpu-install.driver-container-packages/v1"] = Field(alias="schema")
    families: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9-]{0,30}$")], ContainerFamily] = Field(
        min_length=1, max_length=16)
    precompiled: Precompiled

    @model_validator(mode="after")
    def _an_id_in_one_family(self) -> ContainerTable:
        seen: dict[str, str] = {}
        for name, fam in self.families.items():
            for os_id in fam.ids:
                if os_id in seen:
                    raise ValueError(f"families: {os_id} is in both {seen[os_id]} and {name}")
                seen[os_id] = name
        return self

    def family_of(self, os_id: str) -> tuple[str, ContainerFamily] | None:
        return next(((n, f) for n, f in self.families.items() if os_id in f.ids), None)


CONTAINER_TABLE_LIMIT = 64 * 1024  # the shipped table is ~5 KB


def container_table(path: Path | None = None) -> ContainerTable:
    """The driver container's package table (CONTAINER_TABLE by default): read bounded, as strict YAML (a key twice or
    an alias refused), every field checked; ConfigError naming the file and the entry otherwise."""
    return _container_table(path or CONTAINER_TABLE)


@cache
def _container_table(path: Path) -> ContainerTable:
    from installer.safefile import parse_yaml, read_text

    what = "driver container package table"
    doc = parse_yaml(read_text(path, what, limit=CONTAINER_TABLE_LIMIT), str(path), aliases=False)
    try:
        return ContainerTable.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise ConfigError(f"{path}: {where}: {err['msg'].removeprefix('Value error, ')}",
                          hint=f"the {what} ships with gpu-install: restore it from the release, or fix that entry "
                               "(its header comment describes the fields)") from None


def _container_wanted(plan: Plan) -> bool:
    """driver.mode operator (not precompiled, preinstalled, host or runfile) and the chart deploys the driver."""
    comp = plan.components.get(DRIVER_COMPONENT)
    return plan.site.driver.mode == "operator" and comp is not None and plan.deployed(comp)


def _kernel_need(plan: Plan, node: Node, kernel: str) -> Need:
    """Where the plan has this kernel of the node from: the inventory, --kernel, or the facts file."""
    facts = getattr(plan.options, "facts", None)
    running = kernel == node.kernel
    if facts:
        return Need(DRIVER_COMPONENT, f"kernel {kernel} of {node.name}, {'running' if running else 'boots next'} "
                                      f"(--facts {facts})")
    if running and plan.inventory is not None:
        return Need(DRIVER_COMPONENT, f"gpu_install_kernel={kernel}")
    return Need(DRIVER_COMPONENT, f"--kernel {kernel}" + ("" if running else " (the kernel the node boots next)"))


def _driver_container_packages(plan: Plan, node: Node, os_tag: str, host: str | None, pkgs: _Collect,
                               table: ContainerTable) -> tuple[list[str], list[str]]:
    """The OS packages the operator's driver container installs on a node at start: once per node OS, and per kernel
    it runs or boots next, into pkgs -- none when packages.osMirror is set (the container reads the site's OS mirror
    then); (notes, the header package per kernel, in the order of node.kernels)."""
    assert node.os_id is not None and node.os_version is not None
    site = plan.site
    found = table.family_of(node.os_id)
    if found is None:
        return [f"{os_tag}: the driver image is the site's own (driver.customImageOs), and which OS packages it "
                "installs at start is not known to gpu-install: none listed (build them into the image, or name the "
                "repositories it reads in packages.osMirror)"], []
    family_name, family = found
    header = family.header_package()
    names = ", ".join(p.for_kernel("<kernel>") for p in family.packages)
    notes = [f"{os_tag}: {n}" for n in family.notes]
    if node.kernel is None:
        notes.append(f"{os_tag}: the driver container installs the OS packages of the nodes' running kernel ({names}) "
                     "and that kernel is not known: give gpu_install_kernel in the inventory, --kernel (uname -r of "
                     "the nodes) with --os, or --facts FILE from `gpu-install nodes facts`")
    headers = [header.for_kernel(k) for k in node.kernels]
    if site.packages.osMirror:
        notes.append(f"{os_tag}: packages.osMirror is set: the driver container will use the site's OS mirror for "
                     f"{names}; mirror pull carries none of them")
        return notes, headers
    base = [Need(DRIVER_COMPONENT, "driver.mode=operator"), Need(DRIVER_COMPONENT, CONTAINER_WHY)]
    tag = node.os_tag(plan.release.version)
    if tag in site.driver.customImageOs:
        base.append(Need(DRIVER_COMPONENT, f"driver.customImageOs lists {tag}: the site's own driver image, taken to "
                                           f"install what NVIDIA's {family_name} driver image does"))
    os_need = _os_need(plan, DRIVER_COMPONENT, os_tag)
    for p in family.packages:
        how = Need(DRIVER_COMPONENT, p.how)
        if not p.per_kernel:
            pkgs.add(os_tag, family.manager, p.name, None, "", (*base, how, os_need), host)
            continue
        for k in node.kernels:
            pkgs.add(os_tag, family.manager, p.for_kernel(k), None, "", (*base, how, _kernel_need(plan, node, k),
                                                                        os_need), host)
    return notes, headers


_UBUNTU_KERNEL = r"^([0-9]+\.[0-9]+)\.[0-9]+-[0-9]+-([a-z][a-z0-9-]*)$"  # 6.8.0-45-generic: line 6.8, flavour generic


def _precompiled_fits(plan: Plan, node: Node, os_tag: str, table: ContainerTable) -> bool:
    """NVIDIA builds precompiled driver images (driver.mode precompiled) for every kernel of this node: its OS, the
    release's driver branch, its architecture (when known) and each kernel's line and flavour are in the table."""
    import re

    pre = table.precompiled
    where = pre.os.get(os_tag)
    arch = getattr(node, "arch", None)  # installer.facts.Node.arch: from the inventory or the facts file
    comp = plan.components.get(DRIVER_COMPONENT)
    branch = (comp.version or "").split(".")[0] if comp is not None else ""
    if where is None or not node.kernels or branch not in pre.branches or (arch is not None and arch not in pre.arch):
        return False
    if not plan.release.has_key("driver.usePrecompiled"):
        return False
    for k in node.kernels:
        m = re.match(_UBUNTU_KERNEL, k)
        if m is None or m[1] not in where.kernels or m[2] not in where.flavours:
            return False
    return True


def _precompiled_notes(plan: Plan, fits: Mapping[str, Sequence[Node]], table: ContainerTable) -> list[str]:
    comp = plan.components.get(DRIVER_COMPONENT)
    branch = (comp.version or "").split(".")[0] if comp is not None else ""
    out = []
    for os_tag, nodes in sorted(fits.items()):
        where = table.precompiled.os[os_tag]
        names = sorted(n.name for n in nodes) if plan.inventory is not None else []
        shown = f"hosts {', '.join(names)}" if names else f"the {os_tag} nodes"
        kernels = sorted({k for n in nodes for k in n.kernels})
        out.append(f"driver.mode precompiled would remove the need for the driver container's OS packages on {shown} "
                   f"({os_tag}, kernels {', '.join(kernels)}): NVIDIA builds precompiled driver images of branch "
                   f"{branch} for {os_tag} x86-64 kernels of the {'/'.join(where.kernels)} "
                   f"line{'s' if len(where.kernels) > 1 else ''}, flavours "
                   f"{', '.join(where.flavours)} (driver:{branch}-<kernel>-{os_tag}; check that the tag of each kernel "
                   "exists, the images follow the kernels NVIDIA builds for)")
    return out


#: the branch from which NVIDIA ships nvlsm (the NVLink subnet manager) for Blackwell HGX boards
NVLSM_BRANCH = 570


def _fabric_packages(plan: Plan, node: Node, os_tag: str, host: str | None, pkgs: _Collect, rv: Mapping[str, Any],
                     osm: Mapping[str, Any], version: str, where: str) -> list[str]:
    """Fabric Manager on an NVSwitch node, as roles/nvidia_driver/tasks/fabric.yml installs it: the OS map's
    fabric_packages (or nvidia_driver_fabric_packages) pinned to the driver's version, and with Blackwell GPUs from
    branch NVLSM_BRANCH its fabric_blackwell_packages (nvlsm: its own version line, unpinned). The node's NVSwitches come
    from gpu_install_nvswitch or the facts file; nvidia_driver_fabric_manager true/false overrides them. Returns notes.
    Raises ConfigError for an nvidia_driver_fabric_manager that is not auto, true or false."""
    from installer.validate.node import fabric_setting

    key = f"{DRIVER_ROLE}_fabric_manager"
    try:
        forced = fabric_setting(rv.get(key, "auto"))
    except ValueError:
        raise ConfigError(f"{where}: {key} is {rv.get(key)!r}, not auto, true or false",
                          hint=f"{key}: auto installs Fabric Manager where the node has NVSwitches (gpu_install_nvswitch"
                               ", else the facts file, else the node's PCI bus); true or false decides it") from None
    wanted = node.nvswitch if forced is None else forced
    if wanted is None:
        return ["NVSwitch nodes: whether a node has NVSwitches is not known for every node (gpu_install_nvswitch unset "
                "and no --facts): the driver role installs Fabric Manager where the node's PCI bus shows NVSwitches, "
                "and this plan carries it only for the nodes known to have them; give --facts FILE (`gpu-install nodes "
                "facts`) or gpu_install_nvswitch per host"]
    if not wanted:
        return []
    manager, pin = str(osm["package_manager"]), str(osm["pin"])
    variables = {**rv, f"{DRIVER_ROLE}_package_version": version}
    why = (Need(DRIVER_ROLE, f"{key}=true") if forced else
           Need(DRIVER_ROLE, f"NVSwitches on the node ({'the facts file' if node.facts_from else 'gpu_install_nvswitch'})"))
    needs = (Need(DRIVER_ROLE, "NVSwitch node: CUDA needs Fabric Manager"), why,
             Need(DRIVER_ROLE, f"the driver's version {version}: Fabric Manager refuses to start with another"),
             _os_need(plan, DRIVER_ROLE, os_tag))
    own = _names(rv, f"{DRIVER_ROLE}_fabric_packages", where)
    for n in own or osm.get("fabric_packages") or []:
        pkgs.add(os_tag, manager, _template(n, variables, where), version, pin, needs, host)
    branch = version.split(".")[0]
    if "Blackwell" in node.gpu_architectures and branch.isdigit() and int(branch) >= NVLSM_BRANCH:
        for n in osm.get("fabric_blackwell_packages") or []:
            pkgs.add(os_tag, manager, _template(n, variables, where), None, pin,
                     (needs[0], Need(DRIVER_ROLE, f"Blackwell GPUs, branch {branch}: the NVLink subnet manager, started "
                                                  "with Fabric Manager (its own version line, unpinned)"), needs[3]),
                     host)
    notes = []
    if "." not in version:
        notes.append(f"NVSwitch nodes: driver version {version} is a branch; Fabric Manager must be the driver's exact "
                     "version, and `mirror pull` takes the newest of each in the branch, which differ when the "
                     "repository's newest Fabric Manager is not its newest driver: pin driver.version to a full "
                     "version (x.y.z)")
    return notes


def _older(version: str, than: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version.split("-")[0]) < Version(than)
    except InvalidVersion:
        return False


def _toolkit_packages(plan: Plan, node: Node, os_tag: str, host: str | None, pkgs: _Collect) -> None:
    assert node.os_id is not None and node.os_version is not None
    rv = _role_vars(plan, node, TOOLKIT_ROLE)
    osm = os_map(TOOLKIT_ROLE, node.os_id, node.os_version)
    version = str(rv[f"{TOOLKIT_ROLE}_version"])
    site = plan.site
    version_need = Need(TOOLKIT_ROLE, f"toolkit.version={site.toolkit.version}" if site.toolkit.version else
                        f"operator.version={plan.release.version} (catalog toolkit {version})")
    names = _names(rv, f"{TOOLKIT_ROLE}_packages", f"{TOOLKIT_ROLE} on {os_tag}")
    if _older(version, "1.11.0"):  # the role's vars/main.yml: no nvidia-container-toolkit-base before 1.11.0
        names = [n for n in names if n != "nvidia-container-toolkit-base"]
    for n in names:
        pkgs.add(os_tag, str(osm["package_manager"]), _template(n, rv, f"{TOOLKIT_ROLE} on {os_tag}"), version,
                 str(osm["pin"]), (Need(TOOLKIT_ROLE, "toolkit.mode=host"), version_need,
                                   _os_need(plan, TOOLKIT_ROLE, os_tag)), host)
