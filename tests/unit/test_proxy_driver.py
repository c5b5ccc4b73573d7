"""proxy: a proxied (not air-gapped) site's proxy, passed where asked (proxy.driverContainer) to the operator's
driver container as driver.env, which installs the node kernel's packages from the network at start."""

from __future__ import annotations

import pytest
import yaml

SITE = {"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"}}
PROXY = {"http": "http://proxy.example.internal:3128", "https": "http://proxy.example.internal:3128",
         "noProxy": ["registry.lab", ".example.internal", "10.96.0.0/12"], "driverContainer": True}


def render(cli, write_site, site):
    rc, out, err = cli("render", "-s", write_site(site), "--os", "ubuntu22.04")
    return rc, (yaml.safe_load(out) if rc == 0 else None), err


def test_the_driver_container_gets_the_proxy_in_both_cases(cli, write_site):
    rc, values, err = render(cli, write_site, {**SITE, "proxy": PROXY})
    assert rc == 0, err
    env = {e["name"]: e["value"] for e in values["driver"]["env"]}
    assert env == {"HTTP_PROXY": PROXY["http"], "http_proxy": PROXY["http"], "HTTPS_PROXY": PROXY["https"],
                   "https_proxy": PROXY["https"], "NO_PROXY": "registry.lab,.example.internal,10.96.0.0/12",
                   "no_proxy": "registry.lab,.example.internal,10.96.0.0/12"}


def test_not_asked_nothing_is_passed(cli, write_site):
    rc, values, err = render(cli, write_site, {**SITE, "proxy": {**PROXY, "driverContainer": False}})
    assert rc == 0, err
    assert "env" not in values.get("driver", {})


@pytest.mark.parametrize("site,message", [
    ({**SITE, "proxy": {**PROXY, "http": "http://bob:secret@proxy:3128"}}, "proxy.http"),
    ({**SITE, "proxy": {**PROXY, "https": "proxy:3128"}}, "is not an http(s) URL"),
    ({**SITE, "proxy": {"driverContainer": True}}, "driverContainer is true without http or https"),
    ({**SITE, "proxy": {**PROXY, "noProxy": ["a b"]}}, "proxy.noProxy"),
    ({**SITE, "driver": {"mode": "host"}, "proxy": PROXY}, "proxy.driverContainer: driver.mode host runs no driver"),
    ({**SITE, "proxy": PROXY, "values": {"driver": {"env": [{"name": "X", "value": "1"}]}}},
     "values.driver.env and proxy.driverContainer both set"),
])
def test_refused_with_exit_2_naming_the_field(cli, write_site, site, message):
    rc, _, err = render(cli, write_site, site)
    assert rc == 2 and message in err, err
    assert "secret" not in err
