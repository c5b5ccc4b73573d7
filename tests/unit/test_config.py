"""Site file: validation messages name the field and the fix; exit code 2; schema and sample."""

from __future__ import annotations

import json

import pytest
import yaml

from installer.config import Site, load_site, sample_site, site_schema
from installer.errors import ConfigError


def test_unknown_release_names_nearest(cli, write_site, site_data):
    site_data["operator"]["version"] = "v24.9.9"
    rc, out, err = cli("render", "-s", write_site(site_data))
    assert rc == 2 and out == ""
    assert "operator.version: v24.9.9 is not in the catalog; nearest: v24.9.2" in err
    assert "gpu-install catalog list" in err


def test_release_without_v_prefix_is_normalised(write_site, site_data):
    site_data["operator"]["version"] = "23.9.2"
    from tests.conftest import plan_of

    plan = plan_of(load_site(write_site(site_data)))
    assert plan.site.operator.version == plan.release.version == "v23.9.2"


def test_malformed_yaml_points_at_position(cli, tmp_path):
    bad = tmp_path / "site.yaml"
    bad.write_text("operator:\n  version: v24.9.2\n registry: [\n")
    rc, _, err = cli("render", "-s", bad)
    assert rc == 2
    assert f"{bad}:3:" in err and "invalid YAML" in err


def test_unknown_field_suggests_the_right_one(cli, write_site, site_data):
    site_data["registry"]["hots"] = "x"
    site_data["driver"] = {"mod": "host"}
    rc, _, err = cli("images", "-s", write_site(site_data), "--os", "ubuntu22.04")
    assert rc == 2
    assert "registry.hots: unknown field; did you mean 'host'?" in err
    assert "driver.mod: unknown field; did you mean 'mode'?" in err


def test_unknown_field_inside_component_override(write_site, site_data):
    site_data["components"] = {"dcgm": {"enabld": True}}
    with pytest.raises(ConfigError, match=r"components\.dcgm\.enabld: unknown field; did you mean 'enabled'"):
        load_site(write_site(site_data))


def test_wrong_type_names_field_and_value(cli, write_site, site_data):
    site_data["devicePlugin"] = {"timeSlicing": {"replicas": "many"}}
    site_data["runtime"] = "podman"
    rc, _, err = cli("render", "-s", write_site(site_data))
    assert rc == 2
    assert "devicePlugin.timeSlicing.replicas:" in err and "'many'" in err
    assert "runtime: Input should be 'containerd' or 'docker' (got 'podman')" in err


def test_missing_required_and_missing_file(cli, write_site, tmp_path):
    rc, _, err = cli("render", "-s", write_site({"operator": {"version": "v24.9.2"}}))
    assert rc == 2 and "registry: required field is missing" in err
    rc, _, err = cli("render", "-s", tmp_path / "nope.yaml")
    assert rc == 2 and "not found" in err


@pytest.mark.parametrize(
    "registry, message",
    [
        ({"host": "https://reg.lab"}, "without scheme or path"),
        ({"host": "reg.lab", "prefix": "Bad Prefix"}, "not a valid repository path"),
        ({"host": "reg.lab", "pullSecret": {"name": "s", "usernameEnv": "U"}}, "go together"),
        (
            {"host": "reg.lab", "pullSecret": {"name": "s", "usernameEnv": "U", "passwordEnv": "P", "dockerConfigFile": "/x"}},
            "not both",
        ),
        ({"host": "reg.lab", "pullSecret": {"name": "Not_A_Name"}}, "not a valid Secret name"),
    ],
)
def test_registry_validation(write_site, site_data, registry, message):
    site_data["registry"] = registry
    with pytest.raises(ConfigError, match=message):
        load_site(write_site(site_data))


def test_set_flag_overrides_file(cli, write_site, site_data):
    rc, out, _ = cli("render", "-s", write_site(site_data), "--set", "registry.host=other.lab:443")
    assert rc == 0
    values = yaml.safe_load(out)
    assert values["operator"]["repository"] == "other.lab:443/nvidia"
    assert "registry.lab:5000" not in out


def test_schema_export_is_json_schema_of_the_model(cli):
    rc, out, _ = cli("config", "schema")
    assert rc == 0
    schema = json.loads(out)
    assert schema == json.loads(json.dumps(site_schema()))
    assert set(schema["required"]) == {"operator", "registry"}
    assert "layout" in schema["$defs"]["Registry"]["properties"]


def test_sample_is_a_valid_site_and_documents_every_top_level_field(tmp_path):
    text = sample_site()
    path = tmp_path / "site.yaml"
    path.write_text(text)
    site = load_site(path)
    assert isinstance(site, Site)
    for field in Site.model_fields:
        assert f"\n{field}:" in "\n" + text, field


def test_the_sample_is_package_data_the_wheel_carries(cli):
    """`config sample` prints installer/data/sample-site.yaml, read through importlib.resources: pyproject.toml's
    package-data globs cover every file in installer/data, so a wheel carries them (tests/integration/test_wheel.py
    runs `config sample` from a built wheel)."""
    import fnmatch
    import tomllib

    from tests.conftest import ROOT

    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["installer"]
    data = sorted(p.relative_to(ROOT / "installer").as_posix() for p in (ROOT / "installer" / "data").rglob("*")
                  if p.is_file())
    assert "data/sample-site.yaml" in data
    assert [d for d in data if not any(fnmatch.fnmatch(d, g) for g in globs)] == []
    rc, out, _ = cli("config", "sample")
    assert rc == 0 and out == (ROOT / "installer" / "data" / "sample-site.yaml").read_text() == sample_site()


def test_config_check_command(cli, write_site, site_data):
    # a pull Secret name alone renders, but apply cannot create the Secret from it: config check says so as apply does
    rc, out, err = cli("config", "check", "-s", write_site(site_data))
    assert rc == 2 and out == "" and "registry.pullSecret gpu-registry: no credentials to create it from" in err
    site_data["registry"]["pullSecret"].update(usernameEnv="REG_USER", passwordEnv="REG_PASSWORD")
    rc, out, _ = cli("config", "check", "-s", write_site(site_data))  # the variables are read where apply runs
    assert rc == 0 and "v24.9.2" in out


def test_secrets_are_never_inline(write_site, site_data):
    site_data["registry"]["pullSecret"]["password"] = "hunter2"
    with pytest.raises(ConfigError) as exc:
        load_site(write_site(site_data))
    assert "pullSecret.password: unknown field" in str(exc.value)
    assert "hunter2" not in str(exc.value)


def test_relative_files_are_relative_to_the_site_file(write_site, site_data, tmp_path, monkeypatch):
    site_data["registry"]["ca"] = "pki/ca.crt"
    site_data["registry"]["pullSecret"]["dockerConfigFile"] = "auth.json"
    site_data["operator"]["chart"] = "charts/gpu-operator-v24.9.2.tgz"
    path = write_site(site_data)
    monkeypatch.chdir("/")
    site = load_site(path)
    assert site.registry.ca == tmp_path / "pki" / "ca.crt"
    assert site.registry.pullSecret.dockerConfigFile == tmp_path / "auth.json"
    assert site.operator.chart == str(tmp_path / "charts" / "gpu-operator-v24.9.2.tgz")
    site_data["operator"]["chart"] = "oci://registry.lab:5000/charts/gpu-operator"
    assert load_site(write_site(site_data)).operator.chart == "oci://registry.lab:5000/charts/gpu-operator"


@pytest.mark.parametrize("serial, ok", [("25%", True), (1, True), ("3", True), ("0", False), ("101%", False), ("x", False)])
def test_driver_serial(write_site, site_data, serial, ok):
    site_data["driver"] = {"mode": "host", "serial": serial, "rebootPolicy": "if-needed"}
    if ok:
        assert load_site(write_site(site_data)).driver.serial in (serial, int(serial) if str(serial).isdigit() else serial)
    else:
        with pytest.raises(ConfigError, match="driver.serial"):
            load_site(write_site(site_data))


@pytest.mark.parametrize("field,value,want", [
    (("driver", "version"), 550, "550"),
    (("toolkit", "version"), 1, "1"),
    (("scheduler", "kubernetesVersion"), "v1.23", "v1.23"),
])
def test_version_fields_take_an_unquoted_integer_as_written(site_data, field, value, want):
    from installer.config import parse_site

    site_data.setdefault(field[0], {})[field[1]] = value
    assert getattr(getattr(parse_site(site_data), field[0]), field[1]) == want


@pytest.mark.parametrize("field,value", [(("driver", "version"), 535.1), (("scheduler", "kubernetesVersion"), 1.30),
                                         (("operator", "version"), 24.9), (("toolkit", "version"), 1.17),
                                         (("components", "dcgm"), 3.3)])
def test_version_fields_refuse_a_float_and_say_quote_it(site_data, field, value):
    """YAML reads 1.30 as 1.3 and 20.10 as 20.1: never turned back into a version silently."""
    from installer.config import parse_site

    if field[0] == "components":
        site_data["components"] = {"dcgm": {"version": value}}
    else:
        site_data.setdefault(field[0], {})[field[1]] = value
    with pytest.raises(ConfigError) as exc:
        parse_site(site_data)
    assert "is a YAML number" in exc.value.message and "quote the version" in exc.value.message


def test_inventory_os_version_float_is_refused(tmp_path):
    from tests.conftest import nodes_of

    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                   "        g1: {gpu_install_os_id: ubuntu, gpu_install_os_version: 20.10}\n")
    with pytest.raises(ConfigError, match=r"host g1: gpu_install_os_version is a YAML number \(20.1\)") as exc:
        nodes_of(inv)
    assert "quote it" in (exc.value.hint or "")
    inv.write_text(inv.read_text().replace("20.10", "'20.10'"))
    assert nodes_of(inv)[0].os_tag("v24.9.2") == "ubuntu20.10"
