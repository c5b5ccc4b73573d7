"""Bad input never gets past the door: each class is a clear exit 2 naming the field (or file:line) and the fix,
with no traceback -- and a credential pasted into the wrong field is never echoed."""

from __future__ import annotations

import os

import pytest

from installer.errors import ConfigError

BASE = "operator: {version: v24.9.2}\nregistry: {host: registry.lab:5000}\n"


@pytest.mark.parametrize("host,why", [
    ("myreg", "would be read as a Docker Hub path"),
    ("reg.lab:0", "port 0 is not between 1 and 65535"),
    ("reg.lab:70000", "port 70000 is not between 1 and 65535"),
    ("-reg.lab", "is not a host name"),
    ("a..b", "is not a host name"),
    ("https://reg.lab", "without scheme or path"),
    ("reg.lab/mirror", "without scheme or path"),
    ("x" * 300 + ".lab", "is not a registry host (at most 255)"),
])
def test_registry_host_follows_the_runtimes_rules(cli, tmp_path, host, why):
    site = tmp_path / "site.yaml"
    site.write_text(f"operator: {{version: v24.9.2}}\nregistry: {{host: '{host}'}}\n")
    rc, out, err = cli("config", "check", "-s", site)
    assert rc == 2 and "registry.host:" in err and why in err and "Traceback" not in err
    assert len(err) < 1500  # a long name is not echoed whole


@pytest.mark.parametrize("host", ["localhost", "localhost:5000", "reg.lab", "reg.lab:5000", "10.0.0.1:5000",
                                  "[::1]:5000", "REG.Example.COM"])
def test_registry_hosts_that_are_fine(cli, tmp_path, host):
    site = tmp_path / "site.yaml"
    site.write_text(f"operator: {{version: v24.9.2}}\nregistry: {{host: '{host}'}}\n")
    rc, out, err = cli("config", "check", "-s", site)
    assert rc == 0, err


def test_ten_megabyte_host_is_refused_quickly(tmp_path):
    import time

    from installer.config import parse_site

    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="at most 255"):
        parse_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "a" * 10_000_000}})
    assert time.monotonic() - t0 < 5


CANARY = "s3cr3t-CANARY-7f1e"


@pytest.mark.parametrize("fields", [
    {"usernameEnv": "REG_USER", "passwordEnv": CANARY},
    {"usernameEnv": CANARY, "passwordEnv": "REG_PASS"},
    {"usernameEnv": "REG_USER"},  # a missing partner: the message is about the pair, never a value
])
def test_a_pasted_credential_is_never_echoed(cli, tmp_path, fields):
    site = tmp_path / "site.yaml"
    inner = ", ".join(f"{k}: '{v}'" for k, v in fields.items())
    site.write_text(f"operator: {{version: v24.9.2}}\nregistry: {{host: r.lab, pullSecret: {{name: p, {inner}}}}}\n")
    for args in (("config", "check", "-s", site), ("render", "-s", site),
                 ("config", "check", "-s", site, "--set", f"registry.pullSecret.passwordEnv={CANARY}")):
        rc, out, err = cli(*args)
        assert rc == 2 and CANARY not in out + err, err
    rc, _, err = cli("config", "check", "-s", site, "--set", f"registry.pullSecret.passwordEnv={CANARY}")
    assert "must be the NAME of an environment variable" in err


def test_credentials_from_env_never_reach_output_or_records(cli, tmp_path, monkeypatch):
    """A real password in the named variable: a failing operator stage prints neither it nor its base64."""
    import base64

    monkeypatch.setenv("REG_USER", "admin")
    monkeypatch.setenv("REG_PASS", CANARY)
    site = tmp_path / "site.yaml"
    site.write_text("operator: {version: v24.9.2}\nregistry: {host: r.lab, pullSecret: "
                    "{name: p, usernameEnv: REG_USER, passwordEnv: REG_PASS}}\n")
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n")
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    rc, out, err = cli("operator", "install", "-s", site, "--kubeconfig", kubeconfig, "--chart", chart)
    assert rc == 5
    both = out + err
    assert CANARY not in both and base64.b64encode(f"admin:{CANARY}".encode()).decode() not in both


def test_duplicate_keys_name_both_lines(cli, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(BASE + "driver: {mode: host}\nruntime: docker\ndriver: {mode: operator}\n")
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 2 and f"{site}:5: key 'driver' is given twice (first at line 3)" in err


@pytest.mark.parametrize("make,why", [
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "is not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "is not a regular file"),
    (lambda p: (p.parent / "loop").symlink_to(p) or p.symlink_to(p.parent / "loop"), "symbolic links"),
    (lambda p: p.write_bytes(b"a: 1\n" * 300_000), "more than 1048576"),
    (lambda p: p.write_bytes(b"operator: \xff\xfe\n"), "not UTF-8"),
    (lambda p: p.write_text("a: " + "[" * 50_000), "site"),
])
def test_site_file_that_is_not_a_file_is_exit_2_at_once(cli, tmp_path, make, why):
    site = tmp_path / "site.yaml"
    make(site)
    rc, out, err = cli("config", "check", "-s", site)
    assert rc == 2 and why in err and "internal error" not in err and "Traceback" not in err


@pytest.mark.parametrize("field,value,why", [
    ("driver", "{mode: precompiled, version: '550 $(reboot)'}", "driver.version: is not an image tag"),
    ("toolkit", "{version: 'v1.17.4; rm -rf /'}", "toolkit.version: is not an image tag"),
    ("components", "{dcgm: {version: 'a b'}}", "components.dcgm.version: 'a b' is not an image version"),
    ("components", "{dcgm: {repository: 'NVCR.io/X Y'}}", "is not an image repository"),
    ("components", "{dcgm: {image: 'Dcgm'}}", "components.dcgm.image: is not an image name"),
])
def test_free_text_that_becomes_an_image_reference_is_checked(cli, tmp_path, field, value, why):
    site = tmp_path / "site.yaml"
    site.write_text(BASE + f"{field}: {value}\n")
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 2 and why in err, err


def test_kernel_flag_and_inventory_kernel_are_kernel_releases(cli, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(BASE + "driver: {mode: precompiled}\n")
    rc, _, err = cli("images", "-s", site, "--os", "ubuntu22.04", "--kernel", "5.15 $(id)")
    assert rc == 2 and "--kernel: '5.15 $(id)' is not a kernel release" in err
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  children:\n    gpu_nodes:\n      hosts:\n"
                   "        g1: {gpu_install_os: ubuntu22.04, gpu_install_kernel: '`reboot`'}\n")
    rc, _, err = cli("images", "-s", site, "-i", inv)
    assert rc == 2 and "host g1: gpu_install_kernel: '`reboot`' is not a kernel release" in err


def test_home_in_file_references_is_expanded(tmp_path, monkeypatch):
    from installer.config import load_site

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    site = tmp_path / "site.yaml"
    site.write_text("operator: {version: v24.9.2, chart: ~/charts/gpu-operator.tgz}\n"
                    "registry: {host: r.lab, ca: ~/pki/ca.crt}\n")
    s = load_site(site)
    assert s.registry.ca == tmp_path / "home" / "pki" / "ca.crt"
    assert s.operator.chart == str(tmp_path / "home" / "charts" / "gpu-operator.tgz")


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_timeouts_must_be_positive_seconds(cli, tmp_path, value):
    site = tmp_path / "site.yaml"
    site.write_text(BASE)
    with pytest.raises(SystemExit) as exc:
        cli("operator", "uninstall", "-s", site, "--timeout", value)
    assert exc.value.code == 2


def test_registry_ca_is_checked_before_any_host(cli, tmp_path):
    from tests.conftest import ROOT

    site = tmp_path / "site.yaml"
    site.write_text("operator: {version: v24.9.2}\nregistry: {host: r.lab, ca: ca.pem}\n")
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 2 and f"registry.ca {tmp_path / 'ca.pem'} not found" in err
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 2 and "no PEM certificate in it" in err
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 2 and "not a valid PEM certificate" in err
    (tmp_path / "ca.pem").write_bytes((ROOT / "tests" / "fixtures" / "ca.pem").read_bytes())
    rc, _, err = cli("config", "check", "-s", site)
    assert rc == 0, err


def test_malformed_kubeconfig_is_exit_2_before_any_host(cli, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(BASE)
    kc = tmp_path / "kubeconfig"
    kc.write_text("apiVersion: v1\nkind: Config\nclusters: [}\n")
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    rc, _, err = cli("operator", "install", "-s", site, "--kubeconfig", kc, "--chart", chart)
    assert rc == 2 and f"kubeconfig {kc}" in err


def test_a_credential_that_looks_like_a_variable_name_is_not_echoed_either(cli, tmp_path, monkeypatch):
    """hunter2 is a valid variable name: the field takes it, and the run-time error names the field, not the value."""
    canary = "Canary_Secret_7f1e"
    monkeypatch.delenv(canary, raising=False)
    monkeypatch.setenv("REG_USER", "admin")
    site = tmp_path / "site.yaml"
    site.write_text(BASE)
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    rc, out, err = cli("operator", "install", "-s", site, "--chart", chart, "--set", "registry.pullSecret.name=p",
                       "--set", "registry.pullSecret.usernameEnv=REG_USER",
                       "--set", f"registry.pullSecret.passwordEnv={canary}")
    assert rc == 2 and "registry.pullSecret.passwordEnv" in err and canary not in out + err


@pytest.mark.parametrize("line,field", [
    ("devicePlugin: {timeSlicing: {replicas: true}}", "devicePlugin.timeSlicing.replicas"),
    ("devicePlugin: {timeSlicing: {replicas: '4'}}", "devicePlugin.timeSlicing.replicas"),
    ("registry: {host: registry.lab:5000, insecure: 'no'}", "registry.insecure"),
    ("registry: {host: registry.lab:5000, insecure: 1}", "registry.insecure"),
    ("driver: {serial: true}", "driver.serial"),
])
def test_booleans_and_integers_are_not_guessed(cli, tmp_path, line, field):
    """true is not 1 and 'no' is not false: a quoted or mistyped value is refused, naming the field."""
    path = tmp_path / "site.yaml"
    base = BASE if not line.startswith("registry") else "operator: {version: v24.9.2}\n"
    path.write_text(base + line + "\n")
    rc, _, err = cli("config", "check", "-s", path)
    assert rc == 2 and field in err, err


def test_a_trailing_newline_is_not_part_of_a_valid_value(cli, tmp_path):
    """`$` in a Python regex also matches before a final newline: every anchored check ends at the text's end
    (values that are trimmed first, --os and --kube-version, come out clean)."""
    path = tmp_path / "site.yaml"
    path.write_text(BASE)
    rc, out, err = cli("images", "-s", path, "--os", "ubuntu22.04", "--kernel", "5.15.0-105-generic\n",
                       "--set", "driver.mode=precompiled")
    assert rc == 2 and "--kernel" in err and not out, err
    rc, out, err = cli("images", "-s", path, "--os", "ubuntu22.04\n")
    assert rc == 0 and "-ubuntu22.04 " in out and "\n " not in out, err


def test_a_pull_secret_without_credentials_is_exit_2_at_install(cli, tmp_path, monkeypatch):
    """A name alone renders (values reference the Secret) but cannot create it: exit 2 before anything is contacted."""
    site = tmp_path / "site.yaml"
    site.write_text("operator: {version: v24.9.2}\nregistry: {host: registry.lab:5000, pullSecret: {name: pull}}\n")
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: standin\nversion: 0.1.0\n")
    rc, out, _ = cli("render", "-s", site)
    assert rc == 0 and "pull" in out
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    rc, _, err = cli("operator", "install", "-s", site, "--chart", chart)
    assert rc == 2 and "registry.pullSecret pull: no credentials to create it from" in err, err
    assert "internal error" not in err
