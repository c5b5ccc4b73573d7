"""The published JSON schema (`gpu-install config schema`) carries the rules the site model enforces: an editor that
validates against it refuses what gpu-install refuses and accepts what it accepts.

Compared on whole site documents: the tool's verdict is installer.config.parse_site (the model; what needs the catalog
or the nodes -- a release, values keys, MIG names, component names -- is no schema matter), the schema's is the
`jsonschema` library's. What the schema cannot say is listed in NOT_IN_SCHEMA, each with its reason, and asserted to
be exactly that.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from installer.config import ConfigError, parse_site, sample_site, site_schema
from tests.conftest import ROOT

SCHEMA = site_schema()


def _ecma_pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """JSON-schema patterns are ECMA-262 regular expressions, where `$` is the end of the text; in Python's re it also
    matches before a final newline -- use \\Z for that one difference."""
    if validator.is_type(instance, "string"):
        py = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
        if not re.search(py, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _ecma_pattern})
VALIDATOR = Validator(SCHEMA)
BASE: dict[str, Any] = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"}}


def tool_accepts(doc: Any) -> bool:
    try:
        parse_site(copy.deepcopy(doc))
        return True
    except ConfigError:
        return False


def schema_accepts(doc: Any) -> bool:
    return VALIDATOR.is_valid(doc)


def with_value(path: tuple[Any, ...], value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    doc = copy.deepcopy(base if base is not None else BASE)
    node: Any = doc
    for p in path[:-1]:
        node = node.setdefault(p, {}) if isinstance(p, str) else node[p]
    node[path[-1]] = value
    return doc


def test_the_schema_is_a_valid_2020_12_schema():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


@pytest.mark.parametrize("doc", [yaml.safe_load(sample_site()), yaml.safe_load((ROOT / "inventories/sample/site.yaml").read_text())],
                         ids=["config-sample", "inventories-sample"])
def test_the_example_sites_satisfy_the_schema(doc):
    assert tool_accepts(doc) and schema_accepts(doc), list(VALIDATOR.iter_errors(doc))


# ---------------------------------------------------------------- one field at a time, generated values

EXTENDER = {"urlPrefix": "http://127.0.0.1:3456/scheduler"}
#: field → (where it is, the characters its values are drawn from, values worth trying every time)
FIELDS: dict[str, tuple[tuple[Any, ...], str, list[Any]]] = {
    "registry.host": (("registry", "host"), "aZ09.-:[]/_ ", [
        "myreg", "localhost", "LocalHost", "localhost:5000", "reg.lab:0", "reg.lab:65535", "reg.lab:65536",
        "reg.lab:05000", "reg.lab:000001", "[::1]", "[::1]:5000", "[::1]:0", "-reg.lab", "reg-.lab", "a..b", "a.b.",
        ".a.b", "https://reg.lab", "reg.lab/x", "x" * 63 + ".lab", "x" * 64 + ".lab", ("a" * 60 + ".") * 5 + "lab",
        "reg.lab\n", "reg.lab:50a", "réG.lab", "reg_x.lab", "10.0.0.1", "10.0.0.1:5000", ""]),
    "registry.prefix": (("registry", "prefix"), "az09._-/A", [
        "", "/", "///", "mirror/gpu", "/mirror/gpu/", "Mirror", "a//b", "a__b", "a___b", "a-----b", "a.-b", "a_", "_a"]),
    "operator.namespace": (("operator", "namespace"), "az09-A.", ["a", "-a", "a-", "a" * 63, "a" * 64, "A", ""]),
    "operator.releaseName": (("operator", "releaseName"), "az09-_", ["gpu-operator", "x" * 64]),
    "registry.pullSecret.name": (("registry", "pullSecret", "name"), "az09-.A_", [
        "a", "a.b", "a" * 253, "a" * 254, ".a", "a.", "A"]),
    "registry.pullSecret.passwordEnv": (("registry", "pullSecret", "passwordEnv"), "aZ09_-$ ", ["_", "9A", "A B"]),
    "driver.version": (("driver", "version"), "aZ09._-:$ ", [
        550, 0, -1, "550", "535.216.03", ".5", "-5", "_5", "x" * 128, "x" * 129, "sha256:" + "a" * 64]),
    "toolkit.version": (("toolkit", "version"), "aZ09._-$ ", ["v1.17.4", "v1.17.4; rm -rf /", 1]),
    "components.dcgm.version": (("components", "dcgm", "version"), "aZ09._-: ", [
        "3.3.9-3.6.1-ubuntu22.04", "sha256:" + "a" * 64, "sha256:" + "A" * 64, "sha256:" + "a" * 63, 7, -7]),
    "components.dcgm.repository": (("components", "dcgm", "repository"), "az09./:-_A[]", [
        "nvcr.io/nvidia/cloud-native", "nvidia", "a.b", "a.b/", "a.b/c", "a_b.c/x", "a__b/c", "localhost/x",
        "LOCALHOST/x", "localhost:5000/x", "reg:5000/x", "reg:0/x", "reg:x/y", "[::1]/x", "[::1]:5000/x",
        "NVCR.io/nvidia", "nvcr.io/Nvidia", "a/b/c/d", "x" * 256, "a//b", "nvidia/cuda:12"]),
    "components.dcgm.image": (("components", "dcgm", "image"), "az09._-A/", ["dcgm", "Dcgm", "dc gm", "a/b"]),
    "driver.serial": (("driver", "serial"), "0129%a-", [1, 0, -1, "1", "01", "25%", "100%", "101%", "0%", "5%",
                                                         "99%", "1%%", 10**6, "1\u0663", "\u0663%"]),
    "driver.runfileSha256": (("driver", "runfileSha256"), "0aF9g", ["a" * 64, "A" * 64, "a" * 63, "g" * 64]),
    "scheduler.kubernetesVersion": (("scheduler", "kubernetesVersion"), "v0129.-+a", [
        "v1.20.2", "1.23", "v1.29.0-rc.1", "v1", "1.2.3.4", "v1.20.2+k3s1", 1, "v1.\u0662\u0663"]),
    "scheduler.extenders.0.urlPrefix": (("scheduler", "extenders", 0, "urlPrefix"), "htps:/1.?#a ", [
        "http://127.0.0.1:3456/scheduler", "https://x", "http://", "ftp://x", "http://x/a b", "http://x?y",
        "http://x/#"]),
    "scheduler.extenders.0.httpTimeout": (("scheduler", "extenders", 0, "httpTimeout"), "0123.smhnu", [
        "30s", "1m30s", "500ms", "1.5h", "30", "s", "1d", "1.s", "\u0663s"]),
    "scheduler.extenders.0.weight": (("scheduler", "extenders", 0, "weight"), "", [0, 1, -1, None, 10**9]),
    "scheduler.extenders.0.managedResources.0.name": (
        ("scheduler", "extenders", 0, "managedResources", 0, "name"), "az.-/k_", [
            "nvidia.com/gpu", "gpu", "kubernetes.io/x", "xkubernetes.io/x", "k8s.kubernetes.io/x", "a.b/c/d",
            "a.b/" + "x" * 63, "a.b/" + "x" * 64, "A.b/c", "a.b/-c"]),
    "devicePlugin.timeSlicing.replicas": (("devicePlugin", "timeSlicing", "replicas"), "", [0, 1, 128, 129, -1]),
    "mirror.chartRepository": (("mirror", "chartRepository"), "htpsoci:/.aZ09-_?# [", [
        "https://helm.ngc.nvidia.com/nvidia", "https://helm.ngc.nvidia.com/nvidia/", "http://10.0.0.1:8080",
        "https://", "https:///x", "https://x/a b", "https://x?y", "ftp://x.example.com", "helm.ngc.nvidia.com",
        "oci://registry.lab:5000/charts", "oci://registry.lab:5000/charts/", "oci://registry.lab:5000",
        "oci://registry.lab", "oci://LOCALHOST", "oci://localhost/x", "oci://[::1]:5000/x", "oci://charts",
        "oci://r.lab/Charts", "oci://r.lab//x", "oci://r.lab/a//b", "oci://r.lab:0/x", "oci://", "oci:///x",
        "oci://r.lab/a__b", "oci://r.lab/a___b", "OCI://r.lab/x", "https://" + "x" * 2050]),
    "mirror.upstream.nvcr.io": (("mirror", "upstream", "nvcr.io"), "az09.:/-_A[]", [
        "mirror.internal:5000", "mirror.internal:5000/nvcr", "Mirror.Internal", "mirror.internal/a/b", "mirror",
        "mirror:5000", "localhost", "localhost/x", "[::1]:5000/x", "mirror.internal:5000/", "mirror.internal//x",
        "mirror.internal/Nvcr", "https://mirror.internal", "mirror.internal:0", "mirror.internal/a__b", "a.b\n",
        "x" * 2049, ""]),
}
#: values of any type, tried on every field
ANY = [None, 0, 1, -1, True, False, 1.5, [], {}, "", "x", ["x"]]


def _base_for(path: tuple[Any, ...]) -> dict[str, Any]:
    base = copy.deepcopy(BASE)
    if path[0] == "scheduler":
        ext = dict(EXTENDER)
        if "managedResources" in path:
            ext["managedResources"] = [{"name": "nvidia.com/gpu"}]
        base["scheduler"] = {"extenders": [ext]}
    if path[:2] == ("registry", "pullSecret"):
        base["registry"]["pullSecret"] = {"name": "p", "usernameEnv": "U", "passwordEnv": "P"}
    if path[:2] == ("driver", "runfileSha256"):
        base["driver"] = {"mode": "runfile", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run"}
    return base


def lax_coercion(path: tuple[Any, ...], value: Any) -> bool:
    """JSON has one number type: an integral float (550.0) is an integer to the schema. Booleans and integers are
    strict in the model (no 'no' for false, no true for 1, no '4' for 4), so nothing else may differ."""
    return isinstance(value, float) and value.is_integer()


def _leaf_schema(path: tuple[Any, ...]) -> dict[str, Any]:
    node: Any = SCHEMA
    defs = SCHEMA["$defs"]
    for p in path:
        while "$ref" in node or ("anyOf" in node and "properties" not in node):
            if "$ref" in node:
                node = defs[node["$ref"].split("/")[-1]]
            else:
                node = next((b for b in node["anyOf"] if "$ref" in b or "properties" in b or "items" in b
                             or "additionalProperties" in b), node["anyOf"][0])
        if isinstance(p, int):
            node = node["items"]
        elif "properties" in node and p in node["properties"]:
            node = node["properties"][p]
        else:
            node = node.get("additionalProperties", {})
    while "$ref" in node:
        node = defs[node["$ref"].split("/")[-1]]
    return node


def agree(path: tuple[Any, ...], value: Any) -> None:
    doc = with_value(path, value, _base_for(path))
    tool, schema = tool_accepts(doc), schema_accepts(doc)
    if tool != schema and tool and lax_coercion(path, value):
        return
    if tool != schema and not tool and isinstance(value, float) and value.is_integer():
        return  # JSON has one number type: 550.0 is 550 to a schema, a YAML float to the model
    errors = [e.message for e in VALIDATOR.iter_errors(doc)][:3]
    assert tool == schema, (f"{'.'.join(map(str, path))} = {value!r}: gpu-install {'accepts' if tool else 'refuses'}, "
                            f"the schema {'accepts' if schema else 'refuses'} ({errors})")


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_listed_values_get_the_same_verdict(field):
    path, _, values = FIELDS[field]
    for value in [*values, *ANY]:
        agree(path, value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), field=st.sampled_from(sorted(f for f, (_, chars, _) in FIELDS.items() if chars)))
def test_generated_values_get_the_same_verdict(data, field):
    path, chars, values = FIELDS[field]
    leaf = _leaf_schema(path)
    patterns = [b["pattern"] for b in leaf.get("anyOf", [leaf]) if "pattern" in b]
    strategies = [st.text(st.sampled_from(chars), max_size=24), st.sampled_from(values).map(
        lambda v: v if not isinstance(v, str) or not v else data.draw(st.sampled_from([v, v + v[-1], v[:-1]])))]
    strategies += [st.from_regex(p.replace("(?=[0-9]{1,5}(?![0-9]))", ""), fullmatch=True) for p in patterns]
    agree(path, data.draw(st.one_of(strategies)))


# ---------------------------------------------------------------- rules across fields

CROSS = [
    # pullSecret: usernameEnv and passwordEnv together, or dockerConfigFile alone
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p"}}}, True),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "usernameEnv": "U"}}}, False),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "passwordEnv": "P"}}}, False),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "usernameEnv": "U", "passwordEnv": None}}}, False),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "usernameEnv": "U", "passwordEnv": "P"}}}, True),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "dockerConfigFile": "c.json"}}}, True),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "dockerConfigFile": "c.json", "usernameEnv": "U",
                                                   "passwordEnv": "P"}}}, False),
    ({"registry": {"host": "r.lab", "pullSecret": {"name": "p", "dockerConfigFile": "c.json", "usernameEnv": None,
                                                   "passwordEnv": None}}}, True),
    # driver: runfile and its checksum belong to mode runfile, which needs them
    ({"driver": {"mode": "runfile"}}, False),
    ({"driver": {"mode": "runfile", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run"}}, True),
    ({"driver": {"mode": "host", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run"}}, False),
    ({"driver": {"runfile": "NVIDIA-Linux-x86_64-535.216.03.run"}}, False),
    ({"driver": {"runfile": None, "runfileSha256": None}}, True),
    ({"driver": {"mode": "host", "runfile": ""}}, True),
    ({"driver": {"mode": "operator", "runfileSha256": "a" * 64}}, False),
    # a URL runfile has its checksum given; a path on the controller is hashed there
    ({"driver": {"mode": "runfile", "runfile": "https://f.lab/NVIDIA-Linux-x86_64-535.216.03.run"}}, False),
    ({"driver": {"mode": "runfile", "runfile": "https://f.lab/NVIDIA-Linux-x86_64-535.216.03.run",
                 "runfileSha256": None}}, False),
    ({"driver": {"mode": "runfile", "runfile": "http://f.lab/NVIDIA-Linux-x86_64-535.216.03.run",
                 "runfileSha256": "a" * 64}}, True),
    # operator.chartSha256: 64 lower-case hex digits, the digest of the .tgz operator.chart names
    ({"operator": {"version": "v24.9.2", "chart": "b/charts/gpu-operator-v24.9.2.tgz", "chartSha256": "a" * 64}}, True),
    ({"operator": {"version": "v24.9.2", "chart": "x.tgz", "chartSha256": None}}, True),
    ({"operator": {"version": "v24.9.2", "chartSha256": "a" * 64}}, False),
    ({"operator": {"version": "v24.9.2", "chart": "oci://r.lab/charts/gpu-operator", "chartSha256": "a" * 64}}, False),
    ({"operator": {"version": "v24.9.2", "chart": "x.tgz", "chartSha256": "A" * 64}}, False),
    ({"operator": {"version": "v24.9.2", "chart": "x.tgz", "chartSha256": "a" * 63}}, False),
    ({"operator": {"version": "v24.9.2", "chart": "x.tgz", "chartSha256": "sha256:" + "a" * 64}}, False),
    # extenders: prioritizeVerb needs a positive weight; at most one binds
    ({"scheduler": {"extenders": [{**EXTENDER, "prioritizeVerb": "p"}]}}, False),
    ({"scheduler": {"extenders": [{**EXTENDER, "prioritizeVerb": "p", "weight": 0}]}}, False),
    ({"scheduler": {"extenders": [{**EXTENDER, "prioritizeVerb": "p", "weight": 2}]}}, True),
    ({"scheduler": {"extenders": [{**EXTENDER, "prioritizeVerb": "", "weight": 0}]}}, True),
    ({"scheduler": {"extenders": [{**EXTENDER, "weight": 0}]}}, True),
    ({"scheduler": {"extenders": [{**EXTENDER, "bindVerb": "b"}, {**EXTENDER, "bindVerb": "b"}]}}, False),
    ({"scheduler": {"extenders": [{**EXTENDER, "bindVerb": "b"}, {**EXTENDER, "bindVerb": ""}]}}, True),
    ({"scheduler": {"extenders": [{**EXTENDER, "bindVerb": "b"}, {**EXTENDER, "bindVerb": None}]}}, True),
    # mirror.upstream: keys are registry hosts, as registry.host is
    ({"mirror": {"upstream": {"nvcr.io": "m.lab:5000", "registry.k8s.io": "m.lab:5000/k8s"}}}, True),
    ({"mirror": {"upstream": {"localhost:5000": "m.lab"}}}, True),
    ({"mirror": {"upstream": {"nvcr": "m.lab"}}}, False),
    ({"mirror": {"upstream": {"https://nvcr.io": "m.lab"}}}, False),
    ({"mirror": {"upstream": {"nvcr.io/nvidia": "m.lab"}}}, False),
    ({"mirror": {"upstream": {"nvcr.io\n": "m.lab"}}}, False),
    ({"mirror": {"upstream": {"nvcr.io": None}}}, False),
    ({"mirror": {"upstream": []}}, False),
    ({"mirror": {"upstreamCa": "ca.pem"}}, True),
    ({"mirror": {"upstreamCa": 5}}, False),
    # unknown fields and missing required ones, at every level
    ({"registry": {"host": "r.lab", "hots": "x"}}, False),
    ({"registry": {}}, False),
    ({"operator": {}}, False),
    ({"driver": {"mode": "windows"}}, False),
    ({"components": {"dcgm": {"enabled": True, "tag": "x"}}}, False),
    ({"surprise": 1}, False),
]

#: refused by gpu-install, beyond what a JSON schema can say (each checked to stay refused)
NOT_IN_SCHEMA = [
    # the version inside a runfile name, and that it agrees with driver.version
    ({"driver": {"mode": "runfile", "runfile": "driver.run"}}, "needs the exact driver version"),
    ({"driver": {"mode": "runfile", "runfile": "NVIDIA-Linux-x86_64-535.216.03.run", "version": "550.1.1"}},
     "but driver.runfile is the 535.216.03 installer"),
    # a version comparison between two fields
    ({"scheduler": {"format": "policy", "kubernetesVersion": "v1.23.0"}}, "policy is gone from Kubernetes 1.23"),
    # two keys naming the same registry (registry names are case-insensitive)
    ({"mirror": {"upstream": {"nvcr.io": "m.lab", "NVCR.io": "n.lab"}}}, "given twice"),
    # unique by one property of the items (uniqueItems compares whole items)
    ({"scheduler": {"extenders": [{**EXTENDER, "managedResources": [{"name": "a.b/c"},
                                                                    {"name": "a.b/c", "ignoredByScheduler": True}]}]}},
     "duplicate managed resource"),
]


@pytest.mark.parametrize("change,accepted", CROSS, ids=[json.dumps(c)[:60] for c, _ in CROSS])
def test_rules_across_fields_get_the_same_verdict(change, accepted):
    doc = {**copy.deepcopy(BASE), **change}
    assert tool_accepts(doc) == accepted
    assert schema_accepts(doc) == accepted, list(VALIDATOR.iter_errors(doc))


@pytest.mark.parametrize("change,why", NOT_IN_SCHEMA, ids=[w for _, w in NOT_IN_SCHEMA])
def test_what_the_schema_cannot_say_is_still_refused_by_the_tool(change, why):
    doc = {**copy.deepcopy(BASE), **change}
    with pytest.raises(ConfigError, match=why):
        parse_site(doc)
    assert schema_accepts(doc)
