"""An upstream package repository that needs a login: mirror.packageRepositories.<os>[].credentials names two
environment variables (never the values); they are checked when `mirror pull` starts (exit 2 before an image is pulled
or the bundle key made), and reach apt as a 0600 auth.conf, never its configuration, command line or environment.
tests/integration/test_package_credentials.py pulls through real apt and dnf from a Basic-auth server."""

from __future__ import annotations

import copy
import os
import stat
from pathlib import Path

import pytest

from installer.config import parse_site
from installer.errors import ConfigError

PASSWORD = "Pkg-Canary-Pw-41c9"
CREDS = {"usernameEnv": "PKG_USER", "passwordEnv": "PKG_PASSWORD"}
URL = "https://repo.example.com/artifactory/debian"


def _site(key: Path, source: dict | None = None) -> dict:
    src = {"url": URL, "suite": "stable", "key": str(key), "credentials": CREDS, **(source or {})}
    return {"operator": {"version": "v24.9.2"}, "registry": {"host": "127.0.0.1:9"},
            "driver": {"mode": "operator", "customImageOs": ["debian12"]},
            "toolkit": {"mode": "host", "version": "1.17.4"},
            "mirror": {"packageRepositories": {"debian12": [src]}}}


@pytest.fixture
def key(tmp_path) -> Path:
    path = tmp_path / "upstream.asc"
    path.write_text("-----BEGIN PGP PUBLIC KEY BLOCK-----\n(stand-in)\n-----END PGP PUBLIC KEY BLOCK-----\n")
    return path


def test_credentials_are_the_names_of_two_variables(key):
    site = parse_site(_site(key))
    cred = site.mirror.packageRepositories["debian12"][0].credentials
    assert cred is not None and (cred.usernameEnv, cred.passwordEnv) == ("PKG_USER", "PKG_PASSWORD")
    # the value itself where the name of a variable goes: refused, never echoed
    with pytest.raises(ConfigError) as err:
        parse_site(_site(key, {"credentials": {**CREDS, "passwordEnv": PASSWORD}}))
    assert "mirror.packageRepositories.debian12.0.credentials.passwordEnv" in err.value.message
    assert PASSWORD not in err.value.message and err.value.exit_code == 2
    # both or neither
    for field in CREDS:
        with pytest.raises(ConfigError, match=rf"credentials.{field}: required field is missing"):
            parse_site(_site(key, {"credentials": {k: v for k, v in CREDS.items() if k != field}}))


def test_credentials_for_a_local_copy_are_refused(key):
    with pytest.raises(ConfigError) as err:
        parse_site(_site(key, {"url": "file:///srv/mirror/debian"}))
    assert "file:///srv/mirror/debian is not an http(s) URL" in err.value.message
    assert "leave credentials out" in err.value.message and err.value.exit_code == 2


def test_a_url_with_userinfo_names_the_credentials_field(key):
    with pytest.raises(ConfigError) as err:
        parse_site(_site(key, {"url": f"https://robot:{PASSWORD}@repo.example.com/debian", "credentials": None}))
    assert "credentials.usernameEnv/passwordEnv" in err.value.message and PASSWORD not in err.value.message


@pytest.mark.parametrize(("unset", "field"), [("PKG_PASSWORD", "passwordEnv"), ("PKG_USER", "usernameEnv")])
def test_mirror_pull_with_an_unset_variable_stops_before_anything(cli, write_site, monkeypatch, tmp_path, key,
                                                                  unset, field):
    """Checked with the rest of the input: exit 2 naming the field and the variable before an image is pulled, the
    bundle key made or the bundle directory created."""
    from installer.mirror import images

    pulled: list[object] = []
    monkeypatch.setattr(images, "pull", lambda *a, **k: pulled.append(a))
    monkeypatch.setenv("PKG_USER", "robot")
    monkeypatch.setenv("PKG_PASSWORD", PASSWORD)
    monkeypatch.setenv(unset, "")  # empty is unset
    key_home = tmp_path / "key-home"
    rc, _, err = cli("mirror", "pull", "-s", write_site(_site(key)), "--os", "debian12", "-o", tmp_path / "bundle",
                     "--key-home", key_home, "-q")
    assert rc == 2, err
    assert (f"mirror.packageRepositories.debian12[0].credentials.{field}: environment variable {unset} is not set"
            in err), err
    assert f"export {unset}" in err and PASSWORD not in err
    assert pulled == [] and not key_home.exists() and not (tmp_path / "bundle").exists()


@pytest.mark.parametrize(("user", "password"), [("robot", "two words"), ("robot", "line\nbreak"),
                                                ("ro:bot", PASSWORD)])
def test_a_value_apt_or_dnf_cannot_carry_is_refused_unshown(cli, write_site, monkeypatch, tmp_path, key, user,
                                                             password):
    """Whitespace or a control character would end apt's auth.conf token or dnf's .repo line early (and could add
    a line of its own); a ':' in the user name would split HTTP Basic's user:password elsewhere."""
    monkeypatch.setenv("PKG_USER", user)
    monkeypatch.setenv("PKG_PASSWORD", password)
    rc, _, err = cli("mirror", "pull", "-s", write_site(_site(key)), "--os", "debian12", "-o", tmp_path / "bundle",
                     "--key-home", tmp_path / "key-home", "-q")
    assert rc == 2, err
    field = "usernameEnv" if user != "robot" else "passwordEnv"
    assert f"credentials.{field}: environment variable" in err and "cannot carry" in err, err
    assert password not in err and "two" not in err and not (tmp_path / "bundle").exists()


def test_a_dollar_is_refused_for_dnf_only(cli, write_site, monkeypatch, tmp_path, key):
    """dnf substitutes $releasever, $basearch... in a .repo file's values, the password too (a password holding
    '$releasever' fails against the repository): refused for a dnf OS, taken for an apt one."""
    from installer.mirror.packages import resolve

    monkeypatch.setenv("PKG_USER", "robot")
    monkeypatch.setenv("PKG_PASSWORD", "Pw$releasever")
    site = _site(key)
    site["driver"]["customImageOs"] = ["rocky9.4"]
    site["mirror"]["packageRepositories"] = {"rocky9.4": [{"url": URL, "key": str(key), "credentials": CREDS}]}
    rc, _, err = cli("mirror", "pull", "-s", write_site(site), "--os", "rocky9.4", "-o", tmp_path / "bundle",
                     "--key-home", tmp_path / "key-home", "-q")
    assert rc == 2, err
    assert ("mirror.packageRepositories.rocky9.4[0].credentials.passwordEnv: environment variable PKG_PASSWORD "
            "holds a '$'") in err and "Pw$releasever" not in err and not (tmp_path / "bundle").exists()
    src = parse_site(_site(key)).mirror.packageRepositories["debian12"][0]
    assert resolve._login(src, "x", "apt") == (URL, "robot", "Pw$releasever")


def test_apt_reads_the_login_from_a_0600_auth_conf_only(tmp_path, key):
    """The private apt configuration: one auth.conf (0600, a machine line with scheme, host, port and the
    repository's path) and an empty auth.conf.d of the work directory; the password in no other file and not in the
    environment apt gets."""
    from installer.mirror.packages import resolve

    site = parse_site(_site(key, {"url": "http://127.0.0.1:8080/repo/debian"}))
    sources = site.mirror.packageRepositories["debian12"]
    work = tmp_path / "apt"
    env = resolve._apt_conf(work, sources, None, [(sources[0].url, "robot", PASSWORD)],
                            {"PATH": os.environ["PATH"]})
    auth = work / "auth.conf"
    assert auth.read_text() == f"machine http://127.0.0.1:8080/repo/debian/ login robot password {PASSWORD}\n"
    assert stat.S_IMODE(auth.stat().st_mode) == 0o600
    conf = (work / "apt.conf").read_text()
    assert f'Dir::Etc::netrc "{auth}";' in conf and f'Dir::Etc::netrcparts "{work / "auth.conf.d"}";' in conf
    assert not any((work / "auth.conf.d").iterdir())
    assert [p for p in work.rglob("*") if p.is_file() and PASSWORD in p.read_text()] == [auth]
    assert PASSWORD not in repr(env)
    # no login: no auth.conf, and not the system's either
    plain = tmp_path / "plain"
    resolve._apt_conf(plain, sources, None)
    assert not (plain / "auth.conf").exists() and 'Dir::Etc::netrc "/dev/null";' in (plain / "apt.conf").read_text()


def test_the_tools_environment_lacks_the_credential_variables(monkeypatch, key):
    from installer.mirror.packages import resolve

    monkeypatch.setenv("PKG_USER", "robot")
    monkeypatch.setenv("PKG_PASSWORD", PASSWORD)
    env = resolve._tool_env(parse_site(_site(key)))
    assert "PKG_USER" not in env and "PKG_PASSWORD" not in env and PASSWORD not in repr(env) and "PATH" in env


def test_messages_hide_the_password_and_its_basic_token():
    import base64

    from installer.mirror.common import redact
    from installer.mirror.packages import resolve

    logins = [(URL, "robot", PASSWORD)]
    token = base64.b64encode(f"robot:{PASSWORD}".encode()).decode()
    text = redact(f"E: Failed to fetch {URL} (sent {token}, password {PASSWORD})", resolve._secrets(logins))
    assert PASSWORD not in text and token not in text and URL in text


def test_site_schema_has_the_field():
    from installer.config import site_schema

    schema = copy.deepcopy(site_schema())
    entry = schema["$defs"]["PackageSource"]["properties"]["credentials"]
    assert "EnvCredentials" in repr(entry) and "usernameEnv" in repr(schema["$defs"]["EnvCredentials"])


def test_a_tool_or_fetch_message_echoing_the_password_is_redacted(tmp_path, monkeypatch, key):
    """Should apt, dnf or a fetch ever echo the password (or its Basic token), the progress line and the lock's
    failure say *** instead."""
    import base64

    from installer.mirror import images, packages
    from installer.mirror.packages import resolve
    from installer.plan import Options
    from installer.plan import resolve as resolve_plan

    token = base64.b64encode(f"robot:{PASSWORD}".encode()).decode()
    monkeypatch.setenv("PKG_USER", "robot")
    monkeypatch.setenv("PKG_PASSWORD", PASSWORD)
    plan = resolve_plan(parse_site(_site(key)), Options(os_tags=("debian12",)))

    def echoing(*a, **k):
        raise ValueError(f"E: Failed to fetch {URL}/dists/stable/InRelease as robot:{PASSWORD} ({token})")

    def fetch_echoing(source, dest, ca, logins=()):
        raise OSError(f"{source}: refused for password {PASSWORD}")

    for name, fake in (("_apt_resolve", echoing), ("fetch", fetch_echoing)):
        if name == "fetch":
            monkeypatch.setattr(resolve, "_apt_resolve", lambda *a, **k: [
                {"uri": f"{URL}/pool/x_1_amd64.deb", "file": "x_1_amd64.deb", "size": 1, "sha256": None}])
        monkeypatch.setattr(resolve, name, fake)
        bundle = tmp_path / name
        images.pull(plan, [], bundle, finish=False)
        lines: list[str] = []
        with pytest.raises(packages.PackageFailures) as err:
            packages.pull(plan.site, plan.artifacts(()).packages, bundle, say=lines.append)
        text = "\n".join([*lines, err.value.message, (bundle / "bundle.lock.json").read_text()])
        assert "***" in text and PASSWORD not in text and token not in text, text
