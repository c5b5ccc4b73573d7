"""installer.mig: which MIG config each GPU node gets, and the checks made before any node is labelled.
(The labelling itself runs against the lab API server: tests/integration/test_mig_labels.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from installer import mig
from installer.catalog import Catalog
from installer.config import parse_site
from installer.errors import ConfigError
from tests.conftest import BASE_SITE, ROOT, plan_of

MIG_UPSTREAM = ROOT.parent / "shared" / "upstream" / "mig-parted"


def site(config: str | None = "all-1g.10gb", version: str = "v24.9.2", **mig_fields):
    return parse_site({**BASE_SITE, "operator": {"version": version},
                       "mig": {"strategy": "mixed", "config": config, **mig_fields}})


def plan(node: str = "node1", config: str = "all-1g.10gb", source: str = "site mig.config") -> mig.Assignment:
    return mig.Assignment(node, node, config, source)


def check_names(s, assignments):
    return mig.check_names(s, Catalog.default().get(s.operator.version), assignments)


def check_node(s, a, labels):
    return mig.check_node(s, Catalog.default().get(s.operator.version), a, labels)


@pytest.mark.parametrize("product, model", [
    ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
    ("NVIDIA-A100-PCIE-40GB", "A100-40GB"),
    ("NVIDIA-A100-80GB-PCIe", "A100-80GB"),
    ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "A100-80GB"),  # single strategy: GFD appends the MIG profile
    ("NVIDIA-A800-SXM4-80GB", "A100-80GB"),
    ("NVIDIA-A30", "A30-24GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
    ("NVIDIA-H100-PCIe", "H100-80GB"),
    ("NVIDIA-H100-NVL", "H100-94GB (H100 NVL)"),
    ("NVIDIA-H100-80GB-HBM3-SHARED", "H100-80GB"),  # time-slicing rename
    ("NVIDIA-GH200-480GB", "H100-96GB / GH200 (96GB) / PG506-96GB / H20"),
    ("NVIDIA-GH200-144G-HBM3e", "GH200-144GB-HBM3e"),
    ("NVIDIA-H20", "H100-96GB / GH200 (96GB) / PG506-96GB / H20"),
    ("NVIDIA-H200", "H200-141GB"),
    ("NVIDIA-H200-NVL", "H200-141GB"),
    ("NVIDIA-B200", "B200"),
])
def test_gfd_product_to_mig_model(product, model):
    found = mig.model_of(product)
    assert found is not None and found.name == model


@pytest.mark.parametrize("product", ["Tesla-T4", "NVIDIA-L40S", "NVIDIA-A10", "NVIDIA-GeForce-RTX-4090", "", None])
def test_products_without_mig_or_unknown(product):
    assert mig.model_of(product) is None


@pytest.mark.skipif(not (MIG_UPSTREAM / "mig.json").is_file(), reason=f"no upstream facts at {MIG_UPSTREAM}")
def test_models_file_is_what_the_generator_makes(tmp_path):
    out = tmp_path / "models.yaml"
    import subprocess

    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-mig-models.py"), "--upstream", str(MIG_UPSTREAM),
                    "--out", str(out)], check=True, capture_output=True)
    from installer import content

    assert out.read_text() == content.mig_models_file().read_text()


def test_models_configs_are_release_config_names():
    from installer.catalog import Catalog

    newest = Catalog.default().get("v26.7.0").mig_configs
    for m in mig.models():
        assert m.configs <= set(newest), (m.name, m.configs - set(newest))
        assert {"all-disabled", "all-enabled", "all-balanced"} <= m.configs


def test_unknown_config_name_names_the_field_and_the_nearest():
    with pytest.raises(ConfigError, match=r"mig.config: all-1g.5gbb is not in GPU Operator v24.9.2's default MIG "
                                          r"configs; nearest: all-1g.5gb"):
        check_names(site("all-1g.5gbb"), [plan(config="all-1g.5gbb")])


def test_override_with_a_name_of_a_newer_release_names_the_host():
    s = site(version="v24.9.2")
    assert "all-7g.180gb" not in Catalog.default().get("v24.9.2").mig_configs  # B200 configs came later
    with pytest.raises(ConfigError, match=r"host gpu-7: gpu_install_mig_config: all-7g.180gb is not in GPU Operator "
                                          r"v24.9.2"):
        check_names(s, [plan(), mig.Assignment("gpu-7", "gpu-7", "all-7g.180gb", "inventory gpu_install_mig_config")])
    check_names(site(version="v25.10.0"), [mig.Assignment("gpu-7", "gpu-7", "all-7g.180gb", "inventory x")])


def test_custom_configmap_takes_any_valid_label_value():
    s = site("my-layout", configMap="site-mig-configs")
    check_names(s, [plan(config="my-layout")])
    with pytest.raises(ConfigError, match="not a valid label value"):
        check_names(s, [plan(config="bad layout!")])


A100_40 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/mig.capable": "true"}
H100_80 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/mig.capable": "true"}


def test_config_must_fit_the_nodes_gpu():
    s = site()
    assert check_node(s, plan(config="all-1g.10gb"), A100_40) is None  # 1g.10gb x4 exists on A100-40GB
    assert check_node(s, plan(config="all-3g.40gb"), H100_80) is None
    msg = check_node(s, plan(config="all-3g.40gb"), A100_40)
    assert msg and msg.startswith("node node1: all-3g.40gb (site mig.config) does not apply to its GPU "
                                  "NVIDIA-A100-SXM4-40GB (A100-40GB); configs for it in v24.9.2: ")
    assert "all-3g.20gb" in msg and "all-3g.40gb" not in msg.split("configs for it")[1]


def test_mig_capable_false_allows_only_all_disabled():
    t4 = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/mig.capable": "false"}
    msg = check_node(site(), plan(config="all-1g.10gb"), t4)
    assert msg and "nvidia.com/mig.capable=false (Tesla-T4); only all-disabled applies" in msg
    assert check_node(site(), plan(config="all-disabled"), t4) is None


def test_unknown_gpu_is_not_second_guessed():
    assert check_node(site(), plan(config="all-7g.80gb"), {}) is None  # no GFD labels yet
    assert check_node(site(), plan(config="all-7g.80gb"), {"nvidia.com/gpu.product": "NVIDIA-L40S"}) is None


def test_all_balanced_needs_a_release_with_a_layout_for_the_model():
    b200 = {"nvidia.com/gpu.product": "NVIDIA-B200", "nvidia.com/mig.capable": "true"}
    msg = check_node(site("all-balanced", version="v24.9.2"), plan(config="all-balanced"), b200)
    assert msg and "does not apply to its GPU NVIDIA-B200 (B200)" in msg
    assert check_node(site("all-balanced", version="v25.3.0"), plan(config="all-balanced"), b200) is None


def test_custom_configmap_skips_the_model_check_but_not_mig_capable():
    s = site("my-layout", configMap="site-mig-configs")
    assert check_node(s, plan(config="my-layout"), A100_40) is None
    assert check_node(s, plan(config="my-layout"), {"nvidia.com/mig.capable": "false"})


def inventory(tmp_path: Path, hosts: dict[str, dict]) -> Path:
    inv = {"all": {"children": {"gpu_nodes": {"hosts": hosts},
                                "kube_control_plane": {"hosts": {"cp1": {}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def test_plan_site_default_host_override_and_node_name(tmp_path):
    inv = inventory(tmp_path, {"gpu-a": {}, "gpu-b": {"gpu_install_mig_config": "all-3g.20gb"},
                               "gpu-c": {"gpu_install_node_name": "gpu-c.cluster.local"}})
    plans = plan_of(site("all-1g.10gb"), inventory=inv).mig
    assert [(p.host, p.node, p.config, p.source) for p in plans] == [
        ("gpu-a", "gpu-a", "all-1g.10gb", "site mig.config"),
        ("gpu-b", "gpu-b", "all-3g.20gb", "inventory gpu_install_mig_config"),
        ("gpu-c", "gpu-c.cluster.local", "all-1g.10gb", "site mig.config"),
    ]
    # no site default: only the overridden host is labelled
    assert [p.host for p in plan_of(site(None), inventory=inv).mig] == ["gpu-b"]


def test_plan_rejects_a_non_string_override(tmp_path):
    inv = inventory(tmp_path, {"gpu-a": {"gpu_install_mig_config": 7}})
    with pytest.raises(ConfigError, match="host gpu-a: gpu_install_mig_config must be a string"):
        _ = plan_of(site(), inventory=inv).mig


def test_nothing_configured_labels_nothing_without_a_cluster(tmp_path):
    inv = inventory(tmp_path, {"gpu-a": {}})
    lines: list[str] = []
    assert mig.label_nodes(plan_of(site(None), inventory=inv), "/nonexistent/kubeconfig", progress=lines.append) == []
    assert "nothing to label" in lines[0]


def test_bad_name_fails_before_the_cluster_is_asked(tmp_path):
    inv = inventory(tmp_path, {"gpu-a": {"gpu_install_mig_config": "all-9g.99gb"}})
    with pytest.raises(ConfigError, match="host gpu-a: gpu_install_mig_config: all-9g.99gb"):
        mig.label_nodes(plan_of(site(), inventory=inv), "/nonexistent/kubeconfig")  # no kubeconfig needed to refuse it


def test_smallest_profile_is_what_the_nos_smoke_pod_asks():
    from installer.mig import smallest_profile

    assert smallest_profile("NVIDIA-A100-SXM4-80GB") == "1g.10gb"
    assert smallest_profile("NVIDIA-A100-SXM4-40GB") == "1g.5gb"
    assert smallest_profile("NVIDIA-A30") == "1g.6gb"
    assert smallest_profile("Tesla-T4") is None and smallest_profile(None) is None
