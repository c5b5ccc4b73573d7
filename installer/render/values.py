"""Site (+ node facts) → Helm values for the pinned GPU Operator release. Pure functions.

Every image-bearing component of the release gets repository/image/version pinned and pointing at
the private registry, plus the pull secret where the component has the field; the rendered tree is
then checked against the release's accepted keys. installer.plan.resolve builds the values once and
`installer.artifacts` derives the image list from the same values, so what is rendered and what is
mirrored can never drift apart.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from installer.catalog import Component, Release, image_ref, join_path, split_path
from installer.config import Registry, Site
from installer.errors import ConfigError

TIME_SLICING_CONFIGMAP = "time-slicing-config"
TIME_SLICING_KEY = "any"  # the config's key in the ConfigMap (time-slicing and MPS alike)
MPS_CONFIGMAP = "mps-config"


@dataclass(frozen=True)
class ResolvedComponent:
    """A component with its final source coordinates (after site overrides)."""

    spec: Component
    repository: str | None  # upstream source repository
    image: str | None
    version: str | None

    @property
    def name(self) -> str:
        return self.spec.name

    def source_ref(self, tag: str | None = None) -> str:
        assert self.repository
        return image_ref(self.repository, self.image, tag or self.version or "")


def effective(values: dict[str, Any], release: Release, path: str) -> Any:
    """Value of a values path after rendering: rendered value, else the chart default."""
    node: Any = values
    for part in split_path(path):
        if not isinstance(node, dict) or part not in node:
            return release.defaults.get(path)
        node = node[part]
    return node


def deployed(values: dict[str, Any], release: Release, comp: ResolvedComponent) -> bool:
    """Does the chart deploy this component with these values (its enabled switch, else its default, and its gates)?"""
    spec = comp.spec
    if spec.enabled_path:
        enabled = effective(values, release, spec.enabled_path)
        if enabled is None:
            enabled = spec.enabled
    else:
        enabled = True if spec.enabled is None else spec.enabled
    return bool(enabled) and all(bool(effective(values, release, g)) for g in spec.gates)


# ---------------------------------------------------------------- registry mapping


def _split_host(repository: str) -> tuple[str | None, str]:
    first, _, rest = repository.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return None, repository  # Docker Hub style (no registry host)


def destination_ref(ref: str, registry: Registry) -> str:
    """Where an image or OCI artifact reference (`repository[:tag|@digest]`) lives in the private registry."""
    slash = ref.rfind("/")
    at = ref.find("@", slash + 1)
    cut = at if at >= 0 else ref.find(":", slash + 1)
    if cut < 0:
        return destination_repository(ref, registry)
    return destination_repository(ref[:cut], registry) + ref[cut:]


def kata_runtime_classes(site: Site, release: Release) -> list[dict[str, Any]]:
    """kataManager.config.runtimeClasses with each class's artifacts (an OCI artifact the Kata manager pulls by URL,
    not a component image) in the private registry, pulled with the site's pull secret."""
    secret = site.registry.pullSecret.name if site.registry.pullSecret else None
    out = []
    for rc in release.kata_runtime_classes:
        artifacts = dict(rc.get("artifacts") or {})
        if artifacts.get("url"):
            artifacts["url"] = destination_ref(str(artifacts["url"]), site.registry)
        if secret:
            artifacts["pullSecret"] = secret
        out.append({**rc, "artifacts": artifacts})
    return out


def destination_repository(repository: str, registry: Registry) -> str:
    """Where a source repository lives in the private registry (per registry.layout)."""
    base = registry.host + (f"/{registry.prefix}" if registry.prefix else "")
    if repository == base or repository.startswith(base + "/"):
        return repository  # already in the private registry (e.g. a user-built vGPU manager image)
    host, path = _split_host(repository)
    if registry.layout == "keep-host" and host:
        return f"{base}/{host}/{path}"
    return f"{base}/{path}"


# ---------------------------------------------------------------- helpers


def _set(values: dict[str, Any], path: str, value: Any) -> None:
    parts = split_path(path)
    node = values
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Merge extra into a copy of base; maps merge recursively, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def flatten_paths(values: dict[str, Any], release: Release, prefix: list[str] | None = None) -> list[str]:
    """Every path in a values tree, stopping at lists and at free-form subtrees."""
    out = []
    for k, v in values.items():
        parts = [*(prefix or []), str(k)]
        path = join_path(parts)
        out.append(path)
        if isinstance(v, dict) and path not in release.open_keys:
            out += flatten_paths(v, release, parts)
    return out


def check_keys(values: dict[str, Any], release: Release) -> None:
    bad = [p for p in flatten_paths(values, release) if not release.key_allowed(p)]
    if bad:
        raise ConfigError(
            f"GPU Operator {release.version} does not accept these values keys: {', '.join(bad)}",
            hint="remove them (see `gpu-install catalog diff` for keys renamed or removed between releases)",
        )


# ---------------------------------------------------------------- render


def resolve_components(site: Site, release: Release) -> dict[str, ResolvedComponent]:
    unknown = sorted(set(site.components) - set(release.components))
    if unknown:
        raise ConfigError(
            f"components: {', '.join(unknown)} not in GPU Operator {release.version}",
            hint=f"known components: {', '.join(release.components)}",
        )
    out = {}
    for name, spec in release.components.items():
        ov = site.components.get(name)
        repo, image, version = spec.repository, spec.image, spec.version
        if ov:
            repo = ov.repository or repo
            image = ov.image or image
            version = ov.version or version
        if name == "driver" and site.driver.version:
            version = site.driver.version
        if name == "driver" and site.driver.mode == "operator" and site.driver.version \
                and site.driver.version.isdigit():
            # the driver container's tags are <full version>-<osTag> (driver-image-tags.md): driver:580-ubuntu24.04
            # does not exist, and mirror pull would only say so after the connected side tried
            raise ConfigError(
                f"driver.version: {site.driver.version!r} is a driver branch; driver.mode operator needs the full "
                f"version its driver images are tagged with (GPU Operator {release.version} pins {spec.version})",
                hint=f"set driver.version: \"{spec.version}\" (or another full version of branch "
                     f"{site.driver.version}, e.g. {site.driver.version}.<minor>.<patch>), leave it out for the "
                     "release's, or use driver.mode: precompiled, whose images are tagged by branch")
        if name == "driver" and site.driver.mode == "precompiled":
            if not site.driver.version:
                version = (spec.version or "").split(".")[0]  # precompiled images are tagged by branch
            elif "." in site.driver.version:
                raise ConfigError(
                    f"driver.version: precompiled driver images are tagged by branch, not {site.driver.version}",
                    hint=f"use driver.version: \"{site.driver.version.split('.')[0]}\"",
                )
        if name == "toolkit" and site.toolkit.version:
            version = site.toolkit.version
        out[name] = ResolvedComponent(spec, repo, image, version)
    return out


def build_values(site: Site, release: Release, components: dict[str, ResolvedComponent]) -> dict[str, Any]:
    """The Helm values for this release (installer.plan.resolve calls it once per command)."""
    values: dict[str, Any] = {}
    secret = site.registry.pullSecret.name if site.registry.pullSecret else None

    from installer import features

    modes = features.component_modes(site)
    # images: every component pinned, pointing at the private registry
    for comp in components.values():
        spec = comp.spec
        if comp.repository and comp.version:
            dest = destination_repository(comp.repository, site.registry)
            if spec.is_nfd:
                _set(values, f"{spec.values_path}.repository", dest)
                _set(values, f"{spec.values_path}.tag", comp.version)
            else:
                _set(values, f"{spec.values_path}.repository", dest)
                if comp.image:
                    _set(values, f"{spec.values_path}.image", comp.image)
                _set(values, f"{spec.values_path}.version", comp.version)
        ov = site.components.get(comp.name)
        by_mode = {"driver": ("driver.mode", site.driver.mode, site.driver.mode in ("operator", "precompiled")),
                   "toolkit": ("toolkit.mode", site.toolkit.mode, site.toolkit.mode == "operator"),
                   **modes}.get(comp.name)  # and the components a requested feature decides (installer.features)
        if ov and ov.enabled is not None and by_mode and ov.enabled != by_mode[2]:
            field, mode, on = by_mode
            raise ConfigError(
                f"components.{comp.name}.enabled: {str(ov.enabled).lower()} contradicts {field}: {mode}, which "
                f"decides whether the operator deploys the {comp.name} ({'it does' if on else 'it does not'})",
                hint=f"drop components.{comp.name}.enabled and choose with {field}")
        if ov and ov.enabled is not None:
            if not spec.enabled_path:
                raise ConfigError(
                    f"components.{comp.name}.enabled: {comp.name} has no enabled switch in {release.version}",
                    hint="it follows its parent component; remove the override",
                )
            _set(values, spec.enabled_path, ov.enabled)

    if secret:
        _render_pull_secrets(release, values, secret)
    if release.kata_runtime_classes:
        _set(values, "kataManager.config.runtimeClasses", kata_runtime_classes(site, release))
    _render_driver(site, release, values)
    _render_toolkit(site, release, values)
    _render_mig(site, release, values)
    # the requested features' values: the device plugin's time-slicing/MPS config, monitoring's exporter and metrics,
    # mig-manager off under dynamic MIG
    features.operator_values(site, release, values)
    if release.has_key("operator.defaultRuntime"):
        values.setdefault("operator", {})["defaultRuntime"] = site.runtime
    if site.cdi.enabled is not None:
        _require(release, "cdi.enabled", "cdi.enabled", "CDI needs GPU Operator v23.3.0 or newer")
        _set(values, "cdi.enabled", site.cdi.enabled)
    if site.sandboxWorkloads.enabled:
        _set(values, "sandboxWorkloads.enabled", True)

    if site.values:
        check_image_overrides(site, release, components)
        values = deep_merge(values, site.values)
    check_keys(values, release)
    return values


#: values keys that say where an image comes from or how it is pulled: gpu-install owns them (private registry,
#: pinned versions, the pull secret), so `images` and the mirror list always match what the chart deploys
IMAGE_KEYS = ("repository", "image", "version", "tag", "registry", "imagePullSecrets")


def _get(tree: dict[str, Any], parts: list[str]) -> Any:
    node: Any = tree
    for part in parts:
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_image_overrides(site: Site, release: Release, components: dict[str, ResolvedComponent]) -> None:
    """Refuse site `values:` that would change an image's source, tag or pull secret behind the plan's back."""
    by_path = {c.spec.values_path: c.name for c in components.values()}
    problems, fixes = [], []
    for path in flatten_paths(site.values, release):
        parts = split_path(path)
        if parts[-1] not in IMAGE_KEYS or isinstance(_get(site.values, parts), dict):
            continue  # a mapping such as node-feature-discovery.image: its leaves are checked themselves
        parent = join_path(parts[:-1])
        comp = by_path.get(parent)
        problems.append(f"values.{path}")
        if parts[-1] == "imagePullSecrets" or parts[-1] == "registry":
            fixes.append("registry.pullSecret / registry.host")
        elif comp and parts[-1] in ("repository", "image", "version"):
            fixes.append(f"components.{comp}.{parts[-1]}")
        elif comp and parts[-1] == "tag":
            fixes.append(f"components.{comp}.version")
        else:
            fixes.append("components.<name>.repository/.image/.version")
    if problems:
        raise ConfigError(
            f"{', '.join(problems)}: image sources, tags and pull secrets are gpu-install's to set (every image from "
            f"{site.registry.host}, pinned, and listed by `gpu-install images`); a values override would deploy an "
            "image that `images` and the mirror do not list",
            hint="use " + ", ".join(dict.fromkeys(fixes)) + " in the site file instead")


def _require(release: Release, key: str, field_name: str, why: str) -> None:
    if not release.has_key(key):
        raise ConfigError(f"{field_name}: not available in GPU Operator {release.version}: {why}",
                          hint="choose a newer operator.version or drop the setting")


def _render_pull_secrets(release: Release, values: dict[str, Any], secret: str) -> None:
    """The pull secret on every component that has the field (GPU Operator: a list of names;
    the NFD subchart: Kubernetes-style [{name: …}])."""
    for key in sorted(release.allowed_keys):
        if not key.endswith(".imagePullSecrets") or key == "node-feature-discovery.global.imagePullSecrets":
            continue
        k8s_style = key.startswith("node-feature-discovery.")
        _set(values, key, [{"name": secret}] if k8s_style else [secret])


def _render_driver(site: Site, release: Release, values: dict[str, Any]) -> None:
    mode = site.driver.mode
    in_container = mode in ("operator", "precompiled")
    if release.has_key("driver.enabled"):
        _set(values, "driver.enabled", in_container)
    elif not in_container:
        raise ConfigError(f"driver.mode: {mode} needs a release with driver.enabled")
    if mode == "precompiled":
        _require(release, "driver.usePrecompiled", "driver.mode", "precompiled drivers need v23.3.0 or newer")
        _set(values, "driver.usePrecompiled", True)
    elif release.has_key("driver.usePrecompiled"):
        _set(values, "driver.usePrecompiled", False)
    kmt = site.driver.kernelModuleType
    if kmt:
        if release.has_key("driver.kernelModuleType"):
            _set(values, "driver.kernelModuleType", kmt)
        elif release.has_key("driver.useOpenKernelModules"):
            if kmt != "auto":
                _set(values, "driver.useOpenKernelModules", kmt == "open")
        elif kmt != "proprietary" and kmt != "auto":
            raise ConfigError(
                f"driver.kernelModuleType: {kmt} kernel modules are not selectable in GPU Operator {release.version}",
                hint="open kernel modules need v23.9.1 or newer; drop the setting",
            )
    # a full air gap: the driver container's package sources as ConfigMaps the operator mounts (installer.driver_repo
    # writes them at install), only under keys this release's chart has
    from installer import driver_repo

    for path, value in driver_repo.value_paths(site, release).items():
        _set(values, path, value)
    env = proxy_env(site)
    if env and not in_container:
        raise ConfigError(f"proxy.driverContainer: driver.mode {mode} runs no driver container",
                          hint="drop proxy.driverContainer (the nodes' own package managers use their own proxy "
                               "settings), or use driver.mode operator")
    if env:
        _require(release, "driver.env", "proxy.driverContainer", "this release's chart has no driver.env")
        own = site.values.get("driver")
        if isinstance(own, dict) and "env" in own:
            raise ConfigError("values.driver.env and proxy.driverContainer both set the driver container's environment "
                              "(a values list replaces the rendered one whole)",
                              hint="give the proxy in proxy: only, or drop proxy.driverContainer and put the proxy "
                                   "variables into values.driver.env yourself")
        _set(values, "driver.env", env)


def proxy_env(site: Site) -> list[dict[str, str]]:
    """The driver container's proxy environment (proxy.driverContainer): HTTP_PROXY, HTTPS_PROXY, NO_PROXY as given,
    each also in lowercase (apt reads http_proxy, curl both); [] when not asked."""
    p = site.proxy
    if not p.driverContainer:
        return []
    out = []
    for name, value in (("HTTP_PROXY", p.http), ("HTTPS_PROXY", p.https),
                        ("NO_PROXY", ",".join(p.noProxy) if p.noProxy else None)):
        if value:
            out += [{"name": name, "value": value}, {"name": name.lower(), "value": value}]
    return out


def _render_toolkit(site: Site, release: Release, values: dict[str, Any]) -> None:
    _set(values, "toolkit.enabled", site.toolkit.mode == "operator")


def _render_mig(site: Site, release: Release, values: dict[str, Any]) -> None:
    _set(values, "mig.strategy", site.mig.strategy)  # mixed under dynamic MIG (installer.config.Mig)
    if site.mig.configMap:
        _set(values, "migManager.config.name", site.mig.configMap)
    if site.mig.customConfigs:  # the chart creates the ConfigMap from data (installer.mig: configs checked there)
        from installer.mig import CUSTOM_CONFIGMAP, custom_configmap

        _require(release, "migManager.config.create", "mig.customConfigs",
                 "the chart creates a MIG ConfigMap from values from v24.6.0; below, create your own and name it in "
                 "mig.configMap")
        _set(values, "migManager.config.name", CUSTOM_CONFIGMAP)
        _set(values, "migManager.config.create", True)
        _set(values, "migManager.config.data", custom_configmap(site))
    if site.mig.config:  # the name is checked against the release with the nodes' layouts (installer.mig)
        _require(release, "migManager.config.default", "mig.config", "a default MIG config needs v23.3.0 or newer")
        _set(values, "migManager.config.default", site.mig.config)


def values_to_yaml(values: dict[str, Any], site: Site) -> str:
    """The values file `gpu-install render` writes (deterministic: keys sorted, embedded files as blocks)."""
    import yaml

    global _Dumper
    if _Dumper is None:
        _Dumper = _block_strings()
    header = (
        f"# Helm values for GPU Operator {site.operator.version}, rendered by gpu-install.\n"
        f"# Every image points at {site.registry.host}; do not edit, re-render from the site file.\n"
    )
    return header + yaml.dump(values, Dumper=_Dumper, sort_keys=True, default_flow_style=False, width=1000)


def _block_strings() -> type[Any]:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def str_rep(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
        style = "|" if "\n" in data else None  # multi-line strings (embedded config files) as readable blocks
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)

    Dumper.add_representer(str, str_rep)
    return Dumper


_Dumper: type[Any] | None = None  # set on first use (keeps yaml out of import time)
