"""The pull Secret gpu-install builds from registry.pullSecret (installer.kube, pure part)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

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


TWO_REGISTRIES = {
    "auths": {
        "https://registry.lab:5000/v1/": {"auth": base64.b64encode(b"site-user:site-pw").decode()},
        "ghcr.io": {"auth": base64.b64encode(b"admin:ghp_personal-token").decode()},
        "nvcr.io": {"username": "$oauthtoken", "password": "nvapi-key"},
    },
    "credsStore": "desktop",
    "credHelpers": {"gcr.io": "gcloud"},
    "HttpHeaders": {"User-Agent": "x"},
}


def test_docker_config_file_keeps_only_the_site_registry(tmp_path):
    """The admin's config.json usually holds every registry they use: the Secret and skopeo's authfile get the site
    registry's entry and nothing else (no other registry's auth, no credsStore/credHelpers/headers)."""
    from installer.mirror.images import authfile

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TWO_REGISTRIES))
    reg = registry(dockerConfigFile=str(cfg))
    expected = {"auths": {"https://registry.lab:5000/v1/": {"auth": "c2l0ZS11c2VyOnNpdGUtcHc="}}}  # site-user:site-pw

    body = kube.pull_secret_body(reg, "gpu-operator", {})
    payload = base64.b64decode(body["data"][".dockerconfigjson"])
    assert json.loads(payload) == expected
    with authfile(kube.docker_config_json(reg, {})) as path:
        assert path is not None
        on_disk = Path(path).read_bytes()
    assert json.loads(on_disk) == expected
    for blob in (payload, on_disk):
        for other in (b"ghcr.io", b"ghp_personal-token", b"nvcr.io", b"nvapi-key", b"desktop", b"gcloud", b"User-Agent"):
            assert other not in blob
    # the file itself is left as it was
    assert json.loads(cfg.read_text()) == TWO_REGISTRIES


def test_docker_config_file_every_spelling_of_the_site_registry_is_kept(tmp_path):
    cfg = tmp_path / "config.json"
    entries = {"registry.lab:5000": {"auth": "YTpi"}, "REGISTRY.lab:5000/team": {"auth": "Yzpk"},
               "http://registry.lab:5000": {"auth": "ZTpm"},
               "registry.lab:5001": {"auth": "other-port"}, "registry.lab": {"auth": "no-port"}}
    cfg.write_text(json.dumps({"auths": entries}))
    doc = json.loads(kube.docker_config_json(registry(dockerConfigFile=str(cfg)), {}))
    assert doc == {"auths": {"registry.lab:5000": {"auth": "YTpi"}, "REGISTRY.lab:5000/team": {"auth": "Yzpk"},
                             "http://registry.lab:5000": {"auth": "ZTpm"}}}


def test_docker_config_file_without_the_site_registry_names_file_and_host(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {"ghcr.io": {"auth": "Z2hwOnRva2Vu"}}}))
    with pytest.raises(ConfigError) as err:
        kube.docker_config_json(registry(dockerConfigFile=str(cfg)), {})
    assert err.value.exit_code == 2
    assert str(cfg) in err.value.message and "registry.lab:5000" in err.value.message
    assert "docker login" in (err.value.hint or "") and "registry.lab:5000" in (err.value.hint or "")
    assert "Z2hwOnRva2Vu" not in str(err.value)


def test_docker_config_file_site_entry_not_an_object(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {"registry.lab:5000": "eDp5"}}))
    with pytest.raises(ConfigError, match="the auths entry for registry.lab:5000 is not an object") as err:
        kube.docker_config_json(registry(dockerConfigFile=str(cfg)), {})
    assert "eDp5" not in str(err.value)


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
