#!/usr/bin/env python3
"""Generate values/catalog/ from the upstream GPU Operator chart facts.

    scripts/gen-catalog.py [--upstream ../shared/upstream/gpu-operator] [--out values/catalog]

Inputs (facts, not code): matrix.json (component → repository/image/version/enabled per release),
values/<release>.yaml (chart defaults), keys/<release>.allowed.txt and keys/<release>.nfd-subchart.txt.

Outputs, re-runnable and deterministic:
  values/catalog/<release>.yaml       pinned components of the release (every image explicit)
  values/catalog/keys/<release>.txt   every values key the release accepts; lines ending in " *" are
                                      free-form subtrees (empty maps and lists in the defaults)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

# Components deployed only for sandbox (VM) workloads: their images are pulled only when
# sandboxWorkloads.enabled is true (KubeVirt / Kata / confidential computing).
SANDBOX = {
    "vgpuManager",
    "vgpuManager.driverManager",
    "vgpuDeviceManager",
    "vfioManager",
    "vfioManager.driverManager",
    "sandboxDevicePlugin",
    "kataSandboxDevicePlugin",
    "kataManager",
    "ccManager",
}
# Driver sidecars / OS-suffixed images (operator appends -<osTag> to the tag at run time).
OS_SUFFIX = {"driver", "gds", "gdrcopy", "vgpuManager"}
# Containers that run inside the driver DaemonSet: pulled only when the driver container is.
NEEDS_DRIVER = {"gds", "gdrcopy"}
# Extra gates (values paths that must be true) for components rendered into another CR.
EXTRA_GATES = {"draDriver": ["gpuCluster.deployCR"]}
NOT_IMAGES = {"cdi", "nfd", "psa", "psp", "sandboxWorkloads", "mig", "clusterPolicy", "gpuCluster"}


def release_key(tag: str) -> tuple[int, ...]:
    return tuple(int(x) for x in tag.lstrip("v").split("."))


def flatten(d, prefix=""):
    """Yield (path, value) for every node; literal dots in keys are escaped as '\\.'."""
    if isinstance(d, dict):
        for k, v in d.items():
            p = f"{prefix}.{k.replace('.', chr(92) + '.')}" if prefix else k.replace(".", "\\.")
            yield p, v
            yield from flatten(v, p)


# Keys read by templates but absent from values.yaml carry no type; these names are Kubernetes
# free-form maps/lists wherever they appear (labels, annotations, env …).
FREE_FORM_NAMES = {"labels", "annotations", "nodeSelector", "tolerations", "affinity", "env", "args",
                   "resources", "securityContext", "podSecurityContext", "data", "extraObjects"}


# Template-only keys whose whole subtree the chart's templates pass on with toYaml (read in the real charts
# v1.11.0, v22.9.2, v23.9.2, templates/clusterpolicy.yaml: `config: {{ toYaml .Values.dcgmExporter.config }}`;
# from v24.9.0 the chart lists config.name/create/data and reads only .name: not open there).
TEMPLATE_PASSTHROUGH = {"dcgmExporter.config"}


def open_paths(defaults: dict, allowed: set[str]) -> set[str]:
    """Free-form subtrees: empty maps and lists in the chart defaults, and template-only keys
    with a well-known free-form name or passed on whole."""
    out = set()
    in_values = set()
    for path, value in flatten(defaults):
        in_values.add(path)
        if value == {} or isinstance(value, list):
            out.add(path)
    for path in allowed - in_values:
        passed_whole = path in TEMPLATE_PASSTHROUGH and not any(a.startswith(path + ".") for a in allowed)
        if path.rsplit(".", 1)[-1] in FREE_FORM_NAMES or passed_whole:
            out.add(path)
    return out


def component_entry(tag: str, name: str, m: dict, allowed: set[str]) -> dict | None:
    if name == "node-feature-discovery":
        return {
            "valuesPath": "node-feature-discovery.image",
            "repository": m["repository"],
            "image": None,
            "version": m["version_effective"],
            "enabled": bool(m.get("enabled", True)),
            "enabledPath": "nfd.enabled",
            "gates": [],
            "osSuffix": False,
            "pullSecretsPath": "node-feature-discovery.imagePullSecrets",
            "pullSecretsStyle": "objects",
            "subchart": m.get("subchart"),
        }
    if name in NOT_IMAGES or m.get("image") is None and m.get("repository") is None:
        return None
    version = m.get("version_effective")
    if version is None:
        version = m.get("version")
    if version == "":
        version = None
    parent = name.split(".")[0] if "." in name else None
    enabled_path = f"{name}.enabled" if f"{name}.enabled" in allowed else None
    gates: list[str] = []
    if parent and f"{parent}.enabled" in allowed:
        gates.append(f"{parent}.enabled")
    if name in SANDBOX or (parent and parent in SANDBOX):
        gates.append("sandboxWorkloads.enabled")
    if name in NEEDS_DRIVER and "driver.enabled" in allowed:
        gates.append("driver.enabled")
    gates += EXTRA_GATES.get(name, [])
    secrets = f"{name}.imagePullSecrets"
    return {
        "valuesPath": name,
        "repository": m.get("repository") or None,
        "image": m.get("image"),
        "version": version,
        "enabled": m.get("enabled"),
        "enabledPath": enabled_path,
        "gates": gates,
        "osSuffix": name in OS_SUFFIX,
        "pullSecretsPath": secrets if secrets in allowed else None,
        "pullSecretsStyle": "names",
        "userSupplied": not m.get("repository") or not version,
    }


def mig_config_names(upstream: Path, tag: str) -> list[str]:
    """Names in the operator's default MIG ConfigMap for this release (mig-parted facts)."""
    path = upstream.parent / "mig-parted" / "mig.json"
    if not path.is_file():
        return []
    per_tag = json.loads(path.read_text())["gpu_operator_default_mig_parted_config"]
    entry = per_tag.get(tag, {})
    while "same_as" in entry:
        entry = per_tag[entry["same_as"]]
    return list(entry.get("config_names", []))


def build(upstream: Path, out: Path) -> list[str]:
    matrix = json.loads((upstream / "matrix.json").read_text())
    tags = sorted(matrix, key=release_key)
    (out / "keys").mkdir(parents=True, exist_ok=True)
    written = []
    for tag in tags:
        allowed = set((upstream / "keys" / f"{tag}.allowed.txt").read_text().split())
        nfd_keys = set((upstream / "keys" / f"{tag}.nfd-subchart.txt").read_text().split())
        # The NFD subchart templates read image.tag (default .Chart.AppVersion) although its values
        # leave it unset at most tags (upstream changes.md, "NFD image tag is not set").
        nfd_keys.add("node-feature-discovery.image.tag")
        defaults = yaml.safe_load((upstream / "values" / f"{tag}.yaml").read_text())
        comps = {}
        for name, m in matrix[tag].items():
            if name == "_meta":
                continue
            entry = component_entry(tag, name, m, allowed | nfd_keys)
            if entry:
                comps[name] = entry
        meta = matrix[tag]["_meta"]
        doc = {
            "release": tag,
            "chart": {
                "name": "gpu-operator",
                "version": tag,
                "source": f"github.com/NVIDIA/gpu-operator@{tag} ({meta['git_commit'][:12]})",
            },
            "nfdChart": {
                "version": str(meta["Chart.lock_nfd"]["version"] if meta.get("Chart.lock_nfd") else meta["nfd_dependency"]["version"]).lstrip("v"),
                "repository": meta["nfd_dependency"]["repository"],
            },
            "migConfigs": mig_config_names(upstream, tag),
            # the Kata manager's runtime classes (from v23.6): each pulls an OCI artifact by URL, not a component image
            **({"kataRuntimeClasses": kata} if (kata := ((defaults.get("kataManager") or {}).get("config") or {})
                                                   .get("runtimeClasses")) else {}),
            "defaults": {
                # chart defaults that render and image decisions depend on
                k: v
                for k, v in flatten(defaults)
                if k.endswith(".enabled") and not isinstance(v, dict)
                or k
                in {
                    "gpuCluster.deployCR",
                    "cdi.enabled",
                    "cdi.default",
                    "mig.strategy",
                    "operator.defaultRuntime",
                    "driver.kernelModuleType",
                    "driver.useOpenKernelModules",
                    "migManager.config.default",
                    "migManager.config.name",
                    "devicePlugin.config.name",
                    "toolkit.installDir",
                }
            },
            "components": comps,
        }
        header = (
            f"# GPU Operator {tag}: pinned components. Generated by scripts/gen-catalog.py from the\n"
            "# upstream chart facts; do not edit by hand (re-run the script).\n"
        )
        (out / f"{tag}.yaml").write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120))
        opens = open_paths(defaults, allowed)
        lines = []
        for k in sorted(allowed | nfd_keys):
            lines.append(f"{k} *" if k in opens else k)
        (out / "keys" / f"{tag}.txt").write_text(
            f"# values keys accepted by GPU Operator {tag} (chart values + template reads + NFD subchart);\n"
            "# ' *' = free-form subtree. Generated by scripts/gen-catalog.py.\n" + "\n".join(lines) + "\n"
        )
        written.append(tag)
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", type=Path, default=ROOT.parent / "shared" / "upstream" / "gpu-operator")
    ap.add_argument("--out", type=Path, default=ROOT / "values" / "catalog")
    args = ap.parse_args()
    if not (args.upstream / "matrix.json").is_file():
        print(f"error: {args.upstream}/matrix.json not found (pass --upstream)", file=sys.stderr)
        return 2
    tags = build(args.upstream, args.out)
    print(f"wrote {len(tags)} releases to {args.out}: {tags[0]} … {tags[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
