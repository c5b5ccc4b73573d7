"""Properties over every catalog release, cross-checked against the upstream chart facts."""

from __future__ import annotations

import json

import pytest
import yaml

from installer.catalog import Catalog, image_ref, split_path
from installer.config import parse_site
from installer.facts import Node
from installer.render.values import destination_repository
from tests.conftest import UPSTREAM, needs_upstream, plan_of

RELEASES = Catalog.default().releases()
NODES = [Node("u", "ubuntu", "22.04", "5.15.0-105-generic"), Node("r", "rhel", "9.4", "5.14.0-427.el9.x86_64")]

VARIANTS = {
    "operator-strip": {},
    "host-driver-keep-host-prefix": {
        "registry": {"host": "reg.lab:5000", "layout": "keep-host", "prefix": "mirror/gpu", "pullSecret": {"name": "pull"}},
        "driver": {"mode": "host"},
        "toolkit": {"mode": "host"},
        "runtime": "docker",
    },
    "everything-on": {
        "sandboxWorkloads": {"enabled": True},
        "components": {"dcgm": {"enabled": True}, "gds": {"enabled": True}, "nodeStatusExporter": {"enabled": True}},
    },
}


def make_site(release: str, variant: dict):
    data = {
        "operator": {"version": release},
        "registry": {"host": "registry.lab:5000", "pullSecret": {"name": "gpu-registry"}},
    }
    for k, v in variant.items():
        data[k] = v
    # node "r" (RHEL 9.4) has driver images of few releases: these properties are about values and images, not
    # about which OS a release publishes driver images for (tests/unit/test_platforms.py)
    data["driver"] = {**data.get("driver", {}), "customImageOs": ["rhel9.4", "rhel9"]}
    comps = data.get("components", {})
    data["components"] = {k: v for k, v in comps.items() if k in Catalog.default().get(release).components}
    rel = Catalog.default().get(release)
    if "gds" in data["components"] and "gds.enabled" not in rel.allowed_keys:
        data["components"].pop("gds")
    if variant.get("sandboxWorkloads") and "vgpuManager" in rel.components:
        # the vGPU manager image is user-built: give it coordinates in the private registry
        data["components"]["vgpuManager"] = {"repository": "registry.lab:5000/site", "version": "550.90.05"}
    return parse_site(data)


def get(values, path):
    node = values
    for p in split_path(path):
        if not isinstance(node, dict) or p not in node:
            return None
        node = node[p]
    return node


def upstream_allowed(release: str) -> set[str]:
    keys = set((UPSTREAM / "keys" / f"{release}.allowed.txt").read_text().split())
    keys |= set((UPSTREAM / "keys" / f"{release}.nfd-subchart.txt").read_text().split())
    # read by the NFD subchart templates though unset in its values (upstream changes.md)
    keys.add("node-feature-discovery.image.tag")
    return keys


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("release", RELEASES)
def test_release_properties(release, variant):
    site = make_site(release, VARIANTS[variant])
    p = plan_of(site, NODES)
    values = p.values
    base = site.registry.host + (f"/{site.registry.prefix}" if site.registry.prefix else "")
    secret = site.registry.pullSecret.name

    for comp in p.components.values():
        spec = comp.spec
        if comp.repository and comp.version:
            # pinned, explicit, in the private registry
            repo = get(values, f"{spec.values_path}.repository")
            assert repo.startswith(base + "/"), (spec.name, repo)
            if spec.is_nfd:
                assert get(values, f"{spec.values_path}.tag") == comp.version
            else:
                assert get(values, f"{spec.values_path}.version") == comp.version
                assert get(values, f"{spec.values_path}.image") == comp.image
        if spec.pull_secrets_path:
            want = [{"name": secret}] if spec.is_nfd else [secret]
            assert get(values, spec.pull_secrets_path) == want, spec.name

    images = p.images
    assert images, "an install always pulls something"
    for img in images:
        assert img.destination.startswith(base + "/"), img
        assert not img.source.startswith(base) or img.component == "vgpuManager"


@needs_upstream
@pytest.mark.parametrize("release", RELEASES)
def test_every_rendered_key_is_allowed_upstream(release):
    """Independent of our generated keys file: check against the upstream key lists directly."""
    allowed = upstream_allowed(release)
    defaults = yaml.safe_load((UPSTREAM / "values" / f"{release}.yaml").read_text())
    for variant in VARIANTS.values():
        values = plan_of(make_site(release, variant), NODES).values

        def walk(node, parts, dflt):
            for k, v in node.items():
                path = ".".join([*parts, k.replace(".", "\\.")])
                d = dflt.get(k) if isinstance(dflt, dict) else None
                assert path in allowed, f"{release}: {path} not in upstream allowed keys"
                free_form = d == {} or isinstance(d, list)
                if isinstance(v, dict) and not free_form:
                    walk(v, [*parts, k.replace(".", "\\.")], d if d is not None else {})

        walk(values, [], defaults)


@needs_upstream
@pytest.mark.parametrize("release", RELEASES)
def test_catalog_round_trips_upstream_matrix(release):
    """Every component the chart pins upstream is in the catalog with the same coordinates."""
    matrix = json.loads((UPSTREAM / "matrix.json").read_text())[release]
    rel = Catalog.default().get(release)
    for name, m in matrix.items():
        if name == "_meta" or not m.get("image_ref"):
            continue
        assert name in rel.components, name
        assert rel.components[name].image_ref == m["image_ref"], name


@needs_upstream
@pytest.mark.parametrize("release", RELEASES)
def test_component_with_pull_secret_field_gets_the_secret(release):
    allowed = upstream_allowed(release)
    values = plan_of(make_site(release, {}), NODES).values
    fields = [k[: -len(".imagePullSecrets")] for k in allowed if k.endswith(".imagePullSecrets")]
    fields = [f for f in fields if f != "node-feature-discovery.global"]
    assert fields
    for f in fields:
        got = get(values, f + ".imagePullSecrets")
        assert got in (["gpu-registry"], [{"name": "gpu-registry"}]), f"{release}: {f}"


@needs_upstream
def test_catalog_files_are_what_the_generator_makes(tmp_path):
    """values/catalog is data generated from the upstream facts: regenerating it gives the same bytes."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-catalog.py"), "--upstream", str(UPSTREAM),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    ours = ROOT / "values" / "catalog"
    curated = {"platforms.yaml", "PLATFORMS.md"}  # hand-curated with their sources, not generated
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file() and p.name not in curated)
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (ours / rel).read_bytes(), rel


def test_rendering_is_deterministic_across_processes(tmp_path):
    """Values and image lists of every release are the same bytes in two processes with different hash seeds
    (set and dict ordering cannot leak into the output)."""
    import hashlib
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = (
        "import hashlib, sys\n"
        "from tests.unit.test_render_all_releases import RELEASES, VARIANTS, NODES, make_site\n"
        "from tests.conftest import plan_of\n"
        "from installer.render.values import values_to_yaml\n"
        "h = hashlib.sha256()\n"
        "for r in RELEASES:\n"
        "    for v in sorted(VARIANTS):\n"
        "        s = make_site(r, VARIANTS[v]); p = plan_of(s, NODES)\n"
        "        h.update(values_to_yaml(p.values, s).encode()); h.update(repr(p.images).encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(next(iter(digests))) == len(hashlib.sha256().hexdigest())


def test_layouts_map_hosts():
    site = make_site("v24.9.2", {})
    reg = site.registry
    assert destination_repository("nvcr.io/nvidia/k8s", reg) == "registry.lab:5000/nvidia/k8s"
    keep = reg.model_copy(update={"layout": "keep-host", "prefix": "m"})
    assert destination_repository("nvcr.io/nvidia/k8s", keep) == "registry.lab:5000/m/nvcr.io/nvidia/k8s"
    # docker hub style (no host) keeps its path; already-private repositories are left alone
    assert destination_repository("nvidia/cuda", keep) == "registry.lab:5000/m/nvidia/cuda"
    assert destination_repository("registry.lab:5000/m/site/vgpu", keep) == "registry.lab:5000/m/site/vgpu"
    assert image_ref("r/x", "img", "sha256:abc") == "r/x/img@sha256:abc"


@pytest.mark.parametrize("release", RELEASES)
def test_values_cannot_undo_the_registry_guarantee(release):
    """Over every image-bearing component of every release: a site `values:` override of its repository, image,
    version (tag) or pull secrets is refused, naming the supported field; the supported override reaches both the
    rendered values and the image list (one source of truth)."""
    from installer.errors import ConfigError

    rel = Catalog.default().get(release)
    checked = 0
    for comp in rel.components.values():
        if not comp.repository or not comp.version:
            continue
        fields = ["repository", "tag"] if comp.is_nfd else ["repository", "image", "version"]
        if comp.pull_secrets_path:
            fields.append("imagePullSecrets")
        for field in fields:
            key = f"{comp.values_path}.{field}"
            if not rel.key_allowed(key):
                continue
            override: dict = {}
            node = override
            parts = split_path(key)
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = ["x"] if field == "imagePullSecrets" else "x"
            site = make_site(release, {"values": override})
            with pytest.raises(ConfigError) as exc:
                plan_of(site, NODES)
            want = ("registry.pullSecret" if field == "imagePullSecrets" else
                    f"components.{comp.name}.{'version' if field == 'tag' else field}")
            assert f"values.{key}" in exc.value.message and want in (exc.value.hint or ""), (key, exc.value)
            checked += 1
    assert checked >= 10, checked
    # the supported way: components.<name>.version changes values and images together
    comp = rel.components["devicePlugin"]
    site = make_site(release, {"components": {"devicePlugin": {"version": "v9.9.9-site"}}})
    p = plan_of(site, NODES)
    assert get(p.values, f"{comp.values_path}.version") == "v9.9.9-site"
    assert any(i.component == "devicePlugin" and i.source.endswith(":v9.9.9-site") for i in p.images)
