"""An inventory Ansible cannot read as written is exit 2 naming the file, the line and its text: a line the INI parser
stops at, a line it reads with a warning (and would otherwise use differently than written), a YAML syntax error or a
duplicate key -- never a smaller inventory, and never a secret variable's value."""

from __future__ import annotations

import pytest

from installer.errors import ConfigError
from installer.plan import load_inventory

HEAD = "# GPU nodes\n[kube_control_plane]\ncp1\n\n[gpu_nodes]\ng1 ansible_host=10.0.0.1\n"


@pytest.mark.parametrize("bad,why", [
    ("[gpu_nodes:children", "not enough values to unpack"),  # no text of the line in Ansible's message
    ("h[1:", "not enough values to unpack"),
    ('g8 "unterminated', "No closing quotation"),
    ("[group:weird]", "has unknown type: weird"),
    ("[a b]", "Invalid section entry"),
    ("h1 a=1 b", "Expected key=value host variable assignment"),
    ("g9 =bad", "invalid name ''"),  # a warning only: Ansible reads the line, with a variable named ''
])
def test_ini_inventory_errors_name_the_line(tmp_path, bad, why):
    inv = tmp_path / "hosts.ini"
    inv.write_text(HEAD + bad + "\ng5\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(str(inv))
    assert f"inventory {inv}:7 ({bad!r})" in exc.value.message and why in exc.value.message


def test_ini_group_vars_line(tmp_path):
    inv = tmp_path / "hosts"
    inv.write_text(HEAD + "\n[gpu_nodes:vars]\ngpu_install_os=ubuntu22.04\nnovalue\n")
    with pytest.raises(ConfigError, match=r"hosts:10 \('novalue'\): .*Expected key=value, got: novalue"):
        load_inventory(str(inv))


def test_a_line_inside_an_inventory_directory_names_its_file(tmp_path):
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "10-hosts.ini").write_text(HEAD)
    (tmp_path / "inv" / "20-more.ini").write_text("[gpu_nodes]\ng2\n[x:y]\n")
    with pytest.raises(ConfigError, match=r"20-more\.ini:3 \('\[x:y\]'\)"):
        load_inventory(str(tmp_path / "inv"))


@pytest.mark.parametrize("text,line,why", [
    ("all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1: {a: 1}\n        g1: {a: 2}\n", 6,
     "duplicate mapping key 'g1'"),
    ("all:\n  children:\n    gpu_nodes:\n      hosts:\n        g1: {a: 1\n        g2:\n", 6, "YAML parsing failed"),
])
def test_yaml_inventory_errors_name_the_line(tmp_path, text, line, why):
    inv = tmp_path / "hosts.yml"
    inv.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_inventory(str(inv))
    assert f"inventory {inv}:{line} (" in exc.value.message and why in exc.value.message
    assert "'ini' plugin" not in exc.value.message  # the INI parser's view of a YAML file is noise


def test_a_secret_on_the_offending_line_is_not_shown(tmp_path):
    inv = tmp_path / "hosts.ini"
    inv.write_text(HEAD + "g2 ansible_password=hunter2-c4nary =bad\n")
    with pytest.raises(ConfigError) as exc:
        load_inventory(str(inv))
    assert ":7 (" in exc.value.message and "hunter2-c4nary" not in str(exc.value)


def test_a_clean_inventory_still_loads(tmp_path):
    from tests.conftest import ROOT

    assert load_inventory(str(ROOT / "inventories" / "sample" / "hosts.yml")).hosts
    inv = tmp_path / "hosts.ini"
    inv.write_text(HEAD + "g2 ansible_port=2222\n")
    assert load_inventory(str(inv)).groups["gpu_nodes"] == ("g1", "g2")
