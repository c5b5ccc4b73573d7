"""packages.osMirror: the site's existing OS mirror for the operator's driver container -- http(s) URLs without
credentials, each once; refusals name the field and the entry (exit 2); the schema publishes the rule."""

from __future__ import annotations

import pytest

from installer.config import Site, parse_site, site_schema
from installer.errors import ConfigError


def with_mirror(value):
    return {"operator": {"version": "v25.10.1"}, "registry": {"host": "registry.lab:5000"},
            "packages": {"osMirror": value}}


def test_urls_are_taken_without_a_trailing_slash():
    s = parse_site(with_mirror(["http://mirror.lab/ubuntu/", "https://mirror.lab:8443/rocky/9/BaseOS/x86_64/os",
                                "https://mirror.lab/rhel/$releasever/appstream"]))
    assert s.packages.osMirror == ["http://mirror.lab/ubuntu", "https://mirror.lab:8443/rocky/9/BaseOS/x86_64/os",
                                   "https://mirror.lab/rhel/$releasever/appstream"]
    assert Site.model_validate({"operator": {"version": "v25.10.1"},
                                "registry": {"host": "r.lab:5000"}}).packages.osMirror == []


@pytest.mark.parametrize("value, said", [
    (["ftp://mirror.lab/ubuntu"], "packages.osMirror.0: not an http(s) URL of an OS mirror"),
    (["mirror.lab/ubuntu"], "packages.osMirror.0: not an http(s) URL"),
    (["http://mirror.lab/ubuntu?dist=jammy"], "no query or fragment"),
    (["http://mirror.lab/ubuntu", "deb http://mirror.lab/ubuntu jammy main"], "packages.osMirror.1: not an http(s)"),
    (["http://mirror.lab/ubuntu", "http://mirror.lab/ubuntu/"],
     "packages.osMirror: http://mirror.lab/ubuntu is given twice (entries 0 and 1)"),
    ("http://mirror.lab/ubuntu", "packages.osMirror: Input should be a valid list"),
    ([5], "packages.osMirror.0: Input should be a valid string"),
    ([f"http://mirror.lab/{i}" for i in range(17)], "packages.osMirror: List should have at most 16 items"),
    (["http://mirror.lab/" + "a" * 2100], "packages.osMirror.0: not an http(s) URL"),
])
def test_refused_naming_the_entry(value, said):
    with pytest.raises(ConfigError) as exc:
        parse_site(with_mirror(value))
    assert said in str(exc.value), str(exc.value)


def test_credentials_in_a_url_are_refused_and_never_shown():
    with pytest.raises(ConfigError) as exc:
        parse_site(with_mirror(["https://admin:s3cret-pw@mirror.lab/ubuntu"]))
    text = str(exc.value)
    assert "packages.osMirror.0: the URL carries a user name or password" in text, text
    assert "the driver container reads packages.osMirror without credentials" in text
    assert "s3cret-pw" not in text and "admin" not in text


def test_config_check_says_it_with_exit_2(cli, write_site):
    rc, out, err = cli("config", "check", "-s", write_site(with_mirror(["ftp://mirror.lab/ubuntu"])))
    assert rc == 2 and out == ""
    assert "packages.osMirror.0: not an http(s) URL of an OS mirror" in err, err


def test_the_schema_publishes_the_rule():
    field = site_schema()["$defs"]["Packages"]["properties"]["osMirror"]
    assert field["type"] == "array" and field["maxItems"] == 16
    assert field["items"]["type"] == "string" and field["items"]["pattern"].startswith("^https?://")
    assert "driver container" in field["description"] and "never trusted=yes" in field["description"]
