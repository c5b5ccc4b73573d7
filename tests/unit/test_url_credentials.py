"""No credential in a URL (issue 37 item 5): every URL field of the site model refuses user[:password]@ at load
(exit 2, the field named, the password never echoed, the way that kind of source takes credentials instead), the
published schema refuses it too, extravars refuse a URL carrying one, and what `mirror plan` prints or writes never
holds one; the chart repository's credentials come from the environment variables mirror.chartCredentials names."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from installer.config import parse_site, site_schema
from installer.errors import ConfigError
from installer.patterns import no_userinfo, strip_userinfo

PASSWORD = "Url-Canary-Pw-7f3a"
BASE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"}}
RUNFILE = "NVIDIA-Linux-x86_64-535.54.03.run"

#: (field path as the message names it, the site with that field's URL carrying credentials, the fix named)
CASES = [
    ("mirror.chartRepository", {"mirror": {"chartRepository": f"https://robot:{PASSWORD}@charts.example.com/nvidia"}},
     "mirror.chartCredentials.usernameEnv/passwordEnv"),
    ("mirror.chartRepository", {"mirror": {"chartRepository": f"oci://robot:{PASSWORD}@reg.example.com:5000/charts"}},
     "mirror.chartCredentials.usernameEnv/passwordEnv"),
    ("mirror.packageRepositories.ubuntu22.04.0.url", {"mirror": {"packageRepositories": {"ubuntu22.04": [
        {"url": f"https://robot:{PASSWORD}@apt.example.com/ubuntu", "suite": "jammy", "key": "ubuntu.asc"}]}}},
     "mirror.packageRepositories.<os>[].credentials.usernameEnv/passwordEnv"),
    ("packages.url", {"packages": {"url": f"http://robot:{PASSWORD}@repo.example.com/gpu-install", "key": "k.asc"}},
     "without them inside the site"),
    ("driver.runfile", {"driver": {"mode": "runfile", "runfile": f"https://robot:{PASSWORD}@files.example.com/{RUNFILE}",
                                   "runfileSha256": "a" * 64}}, "a path on the controller"),
    ("operator.chart", {"operator": {"version": "v24.9.2",
                                     "chart": f"oci://robot:{PASSWORD}@reg.example.com:5000/charts/gpu-operator"}},
     "helm registry login"),
    ("scheduler.extenders.0.urlPrefix", {"scheduler": {"extenders": [
        {"urlPrefix": f"http://robot:{PASSWORD}@127.0.0.1:3456/scheduler"}]}}, "without credentials"),
    ("sharing.gpumanager.extenderUrl", {"sharing": {"mode": "gpumanager", "gpumanager": {
        "extenderUrl": f"http://robot:{PASSWORD}@gpu-quota-admission.kube-system.svc:3456/scheduler"}}},
     "without credentials"),
]


def _site(extra: dict) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in extra.items():
        data[key] = {**data.get(key, {}), **value}
    return data


@pytest.mark.parametrize(("field", "extra", "fix"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_a_url_with_credentials_is_refused_naming_the_field_and_the_fix(field, extra, fix):
    with pytest.raises(ConfigError) as err:
        parse_site(_site(extra))
    msg = err.value.message
    assert f"{field}: the URL carries a user name or password" in msg, msg
    assert fix in msg and PASSWORD not in msg and "robot" not in msg, msg
    assert err.value.exit_code == 2
    # the same URL without its credentials is taken
    parse_site(json.loads(json.dumps(_site(extra)).replace(f"robot:{PASSWORD}@", "")))


@pytest.mark.parametrize("url", [f"https://{PASSWORD}@charts.example.com",  # a token as the user name
                                 f"https://robot:{PASSWORD}@charts.example.com",
                                 f"https://robot:Pw@{PASSWORD}@charts.example.com/x"])  # an unencoded '@'
def test_any_userinfo_is_refused_and_never_shown(url):
    with pytest.raises(ValueError) as err:
        no_userinfo(url, "fix")
    assert PASSWORD not in str(err.value)
    assert PASSWORD not in strip_userinfo(f"pulling {url} failed") and "***@charts.example.com" in strip_userinfo(url)


def test_an_at_sign_in_the_path_or_a_controller_path_is_no_credential():
    assert no_userinfo("https://files.example.com/a@b/x.run", "fix") == "https://files.example.com/a@b/x.run"
    assert no_userinfo("/srv/a@b/x.run", "fix") == "/srv/a@b/x.run"
    site = parse_site(_site({"driver": {"mode": "runfile", "runfile": f"https://files.example.com/a@b/{RUNFILE}",
                                        "runfileSha256": "a" * 64}}))
    assert site.driver.runfile == f"https://files.example.com/a@b/{RUNFILE}"


def test_the_schema_refuses_userinfo_too():
    """`gpu-install config schema` (what an editor checks with) refuses what the model refuses."""
    validator = jsonschema.Draft202012Validator(site_schema())
    for field, extra, _ in CASES:
        if field in ("driver.runfile", "operator.chart"):  # paths or references: only the model decides
            continue
        errors = list(validator.iter_errors(_site(extra)))
        assert errors, f"the schema takes {field} with credentials"
        assert not list(validator.iter_errors(json.loads(json.dumps(_site(extra)).replace(f"robot:{PASSWORD}@", ""))))


def test_set_with_credentials_never_echoes_them(cli, write_site):
    site = write_site(BASE)
    rc, out, err = cli("config", "check", "-s", site, "--set",
                       f"mirror.chartRepository=https://robot:{PASSWORD}@charts.example.com/nvidia")
    assert rc == 2, err
    assert "mirror.chartRepository: the URL carries a user name or password" in err, err
    assert PASSWORD not in out + err


def test_extravars_refuse_a_url_with_credentials():
    from installer.ansible import check_extravars

    check_extravars({"nvidia_driver_runfile": f"https://files.example.com/{RUNFILE}", "x": ["https://h/a@b"]})
    for extravars in ({"nvidia_driver_runfile": f"https://robot:{PASSWORD}@files.example.com/{RUNFILE}"},
                      {"repos": [f"deb https://robot:{PASSWORD}@apt.example.com/ubuntu jammy main"]},
                      {"outer": {"list": [{"url": f"http://robot:{PASSWORD}@h/x"}]}}):
        with pytest.raises(ConfigError) as err:
            check_extravars(extravars)
        assert "holds a URL with a user name or password" in err.value.message and PASSWORD not in err.value.message


def test_mirror_plan_json_shows_no_userinfo_of_an_artifact():
    """Defence in depth behind the load-time refusal: an artifact built with a credential URL (a Site made without
    validation) is written without it."""
    from installer.mirror.plan import ChartArtifact, FileArtifact, Need

    chart = ChartArtifact("gpu-operator", "v24.9.2", f"https://robot:{PASSWORD}@charts.example.com", (Need("x", "y"),))
    file = FileArtifact(f"https://robot:{PASSWORD}@files.example.com/{RUNFILE}", RUNFILE, None, ())
    text = json.dumps([chart.as_dict(), file.as_dict()])
    assert PASSWORD not in text and "robot" not in text and "https://***@charts.example.com" in text


def test_chart_credentials_are_env_names_and_never_reach_mirror_plan(cli, write_site, monkeypatch, tmp_path):
    monkeypatch.setenv("CHART_USER", "robot")
    monkeypatch.setenv("CHART_PASSWORD", PASSWORD)
    creds = {"usernameEnv": "CHART_USER", "passwordEnv": "CHART_PASSWORD"}
    site = write_site(_site({"mirror": {"chartRepository": "https://charts.example.com/nvidia",
                                        "chartCredentials": creds}}))
    for fmt in ("text", "json"):
        rc, out, err = cli("mirror", "plan", "-s", site, "--os", "ubuntu22.04", "--format", fmt)
        assert rc == 0, err
        assert PASSWORD not in out + err and "https://charts.example.com/nvidia" in out
    with pytest.raises(ConfigError) as err:  # the value itself where the name of a variable goes
        parse_site(_site({"mirror": {"chartCredentials": {**creds, "passwordEnv": PASSWORD}}}))
    assert "mirror.chartCredentials.passwordEnv" in err.value.message and PASSWORD not in err.value.message
    with pytest.raises(ConfigError, match="mirror.chartCredentials.passwordEnv: required field is missing"):
        parse_site(_site({"mirror": {"chartCredentials": {"usernameEnv": "CHART_USER"}}}))


def test_mirror_pull_with_an_unset_chart_credential_stops_before_anything(cli, write_site, monkeypatch, tmp_path):
    """The chart login's variables are checked with the rest of the input: exit 2 naming the variable before an
    image is pulled or the bundle key is made."""
    from installer.mirror import images

    pulled: list[object] = []
    monkeypatch.setattr(images, "pull", lambda *a, **k: pulled.append(a))
    monkeypatch.setenv("CHART_USER", "robot")
    monkeypatch.delenv("CHART_PASSWORD", raising=False)
    site = write_site(_site({"mirror": {"chartRepository": "https://charts.example.com/nvidia", "chartCredentials": {
        "usernameEnv": "CHART_USER", "passwordEnv": "CHART_PASSWORD"}}}))
    key_home = tmp_path / "key-home"
    rc, _, err = cli("mirror", "pull", "-s", site, "--os", "ubuntu22.04", "-o", tmp_path / "bundle",
                     "--key-home", key_home, "-q")
    assert rc == 2, err
    assert "mirror.chartCredentials.passwordEnv: environment variable CHART_PASSWORD is not set" in err
    assert pulled == [] and not key_home.exists() and not (tmp_path / "bundle").exists()
