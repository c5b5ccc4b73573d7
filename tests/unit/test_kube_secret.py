"""The pull Secret gpu-install builds from registry.pullSecret (installer.kube, pure part)."""

from __future__ import annotations

import base64
import json

import pytest

from installer import kube
from installer.config import parse_site
from installer.errors import ConfigError


def registry(**pull_secret):
    site = parse_site({"operator": {"version": "v24.9.2"},
                       "registry": {"host": "Registry.Lab:5000", "pullSecret": {"name": "gpu-registry", **pull_secret}}})
    return site.registry


ENV_REF = {"usernameEnv": "T_REG_USER", "passwordEnv": "T_REG_PASS"}


def test_env_credentials_make_a_docker_config_json():
    env = {"T_REG_USER": "mirror", "T_REG_PASS": "p@ss:word/1"}
    doc = json.loads(kube.docker_config_json(registry(**ENV_REF), env))
    assert list(doc) == ["auths"]
    entry = doc["auths"]["registry.lab:5000"]  # the host as the site normalised it
    assert entry["username"] == "mirror" and entry["password"] == "p@ss:word/1"
    assert base64.b64decode(entry["auth"]).decode() == "mirror:p@ss:word/1"  # split at the first ':' by kubelets


def test_secret_body_shape():
    env = {"T_REG_USER": "u", "T_REG_PASS": "pw"}
    body = kube.pull_secret_body(registry(**ENV_REF), "gpu-operator", env)
    assert body["type"] == "kubernetes.io/dockerconfigjson"
    assert body["metadata"] == {"name": "gpu-registry", "namespace": "gpu-operator",
                                "labels": {"app.kubernetes.io/managed-by": "gpu-install"}}
    assert list(body["data"]) == [".dockerconfigjson"]
    payload = json.loads(base64.b64decode(body["data"][".dockerconfigjson"]))
    assert payload["auths"]["registry.lab:5000"]["username"] == "u"
    # deterministic: the same input gives byte-identical data, so a second apply sees no change
    assert kube.pull_secret_body(registry(**ENV_REF), "gpu-operator", dict(env)) == body


@pytest.mark.parametrize("missing,field", [("T_REG_USER", "usernameEnv"), ("T_REG_PASS", "passwordEnv")])
def test_missing_env_var_names_the_field_not_the_variable(missing, field):
    """The field is named; the variable's name is not (had a credential been pasted into the field, it would be the
    secret itself)."""
    env = {"T_REG_USER": "u", "T_REG_PASS": "the-password"}
    env[missing] = ""  # empty counts as missing
    with pytest.raises(ConfigError) as err:
        kube.docker_config_json(registry(**ENV_REF), env)
    assert f"registry.pullSecret.{field}" in err.value.message
    assert "the environment variable it names is not set" in err.value.message
    assert missing not in str(err.value) and "the-password" not in str(err.value)
    del env[missing]  # unset: the same
    with pytest.raises(ConfigError, match=f"registry.pullSecret.{field}: the environment variable it names"):
        kube.docker_config_json(registry(**ENV_REF), env)


def test_docker_config_file_used_as_is(tmp_path):
    cfg = tmp_path / "config.json"
    raw = json.dumps({"auths": {"https://registry.lab:5000": {"auth": base64.b64encode(b"a:b").decode()}}}).encode()
    cfg.write_bytes(raw)
    assert kube.docker_config_json(registry(dockerConfigFile=str(cfg)), {}) == raw


@pytest.mark.parametrize("content,needle", [
    ("not json", "not valid JSON"),
    ('{"credsStore": "desktop"}', 'no "auths" entries'),
    ('{"auths": {"other.example:5000": {"auth": "eDp5"}}}', "no auths entry for the site registry registry.lab:5000"),
])
def test_docker_config_file_problems(tmp_path, content, needle):
    cfg = tmp_path / "config.json"
    cfg.write_text(content)
    with pytest.raises(ConfigError, match=needle) as err:
        kube.docker_config_json(registry(dockerConfigFile=str(cfg)), {})
    assert "eDp5" not in str(err.value)  # the credentials of the other entry are not echoed


def test_docker_config_file_missing(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it"):
        kube.docker_config_json(registry(dockerConfigFile=str(tmp_path / "nope.json")), {})


def test_no_pull_secret_configured():
    site = parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.lab:5000"}})
    with pytest.raises(ConfigError, match="registry.pullSecret is not set"):
        kube.docker_config_json(site.registry, {})


def test_kubeconfig_resolution(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    b.write_text("apiVersion: v1\n")
    assert kube.resolve_kubeconfig(b, environ={}) == b
    assert kube.resolve_kubeconfig(None, environ={"KUBECONFIG": f"{a}:{b}"}) == b  # first existing entry
    with pytest.raises(ConfigError, match="--kubeconfig") as err:
        kube.resolve_kubeconfig(a, environ={"KUBECONFIG": str(b)})
    assert "KUBECONFIG" in err.value.hint
    with pytest.raises(ConfigError, match=r"\$KUBECONFIG"):
        kube.resolve_kubeconfig(None, environ={"KUBECONFIG": str(a)})
