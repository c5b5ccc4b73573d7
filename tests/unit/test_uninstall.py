"""Removal (`gpu-install uninstall`, roles' tasks/remove.yml, the merge modules' state=absent), the docker
rollback, and apply's operator stage checks -- pure functions, then the roles and the CLI through the real
seam with ansible_connection=local against files in a temp directory (no daemons here: restarts off, except
for the rollback test, which uses a service that does not exist so the restart fails for real)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from installer import content
from installer.errors import EXIT_HOST_FAILURES, EXIT_OK
from tests.conftest import need
from tests.unit.library_modules import load_module as load
from tests.unit.test_ansible_roles import USER_TOML, apply_role, backups, containerd_bin, containerd_vars, docker_vars


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_INSTALL_STATE", str(tmp_path / "state"))




dj = load("daemon_json")
ct = load("containerd_runtime")

# ---------------------------------------------------------------- daemon.json: record + unmerge (pure)

json_scalar = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8)
json_value = st.recursive(json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                          max_leaves=8)
OURS = {"runtimes", "default-runtime", "registry-mirrors", "insecure-registries", "iptables"}
user_doc = st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in OURS), json_value, max_size=6)
MERGE = dict(default_runtime="nvidia", registry_mirrors=["https://m.lab"], insecure_registries=["reg.lab:5000"],
             options={"iptables": False})


def deploy(before: dict, state=None, **kw) -> tuple[dict, dict]:
    args = {**MERGE, **kw}
    after = dj.merge(before, **args)
    lists = [k for k, a in (("registry-mirrors", "registry_mirrors"), ("insecure-registries", "insecure_registries"))
             if args.get(a)]
    opts = (["default-runtime"] if args.get("default_runtime") else []) + list(args.get("options") or {})
    return after, dj.record(state, before, after, "nvidia", lists, opts)


@settings(max_examples=150, deadline=None)
@given(user_doc,
       st.sampled_from([None, {}, {"runc": {"path": "runc"}}, {"nvidia": {"path": "/their/nvidia"}}]),
       st.sampled_from([None, "runc", "nvidia"]),
       st.sampled_from([None, [], ["old:5000"], ["reg.lab:5000"]]),
       st.sampled_from([None, True, False]))
def test_unmerge_gives_back_the_original(doc, runtimes, default, insecure, iptables):
    """merge (twice, as two applies would) then unmerge == the document before the first merge."""
    before = dict(doc)
    for key, value in (("runtimes", runtimes), ("default-runtime", default), ("insecure-registries", insecure),
                       ("iptables", iptables)):
        if value is not None:
            before[key] = value
    after, state = deploy(before)
    again, state2 = deploy(after, state)
    assert again == after and state2 == state  # second apply: nothing new to record
    state = json.loads(json.dumps(state))  # it travels through a JSON file
    assert dj.unmerge(again, state) == before


def test_unmerge_leaves_what_the_user_changed_after_us():
    after, state = deploy({"default-runtime": "runc", "log-level": "warn"})
    after["default-runtime"] = "crun"  # the admin's later choice: not ours any more
    after["log-level"] = "debug"
    out = dj.unmerge(after, state)
    assert out == {"default-runtime": "crun", "log-level": "debug"}


def test_unmerge_later_apply_records_new_registries():
    after, state = deploy({"insecure-registries": ["old:5000"]}, insecure_registries=["a:1"])
    after2, state2 = deploy(after, state, insecure_registries=["b:2"])
    assert after2["insecure-registries"] == ["old:5000", "a:1", "b:2"]
    assert dj.unmerge(after2, state2)["insecure-registries"] == ["old:5000"]


def test_unmerge_without_record_removes_only_what_is_unmistakably_ours():
    doc = {"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}, "crun": {"path": "c"}},
           "default-runtime": "nvidia", "insecure-registries": ["reg.lab:5000"]}
    assert dj.unmerge(doc, None, default_runtime="nvidia") == {"runtimes": {"crun": {"path": "c"}},
                                                              "insecure-registries": ["reg.lab:5000"]}
    theirs = {"runtimes": {"nvidia": {"path": "/opt/their-runtime"}}, "default-runtime": "nvidia"}
    assert dj.unmerge(theirs, None, default_runtime="nvidia")["runtimes"] == theirs["runtimes"]


# ---------------------------------------------------------------- containerd: remove_import (pure)

DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"


@pytest.mark.parametrize("text,want", [
    (f'version = 2\nimports = ["{DROPIN}"]\n# mine\n[plugins.x]\n  a = 1\n', 'version = 2\n# mine\n[plugins.x]\n  a = 1\n'),
    (f'version = 2\nimports = ["/etc/a.toml", "{DROPIN}"]\n', 'version = 2\nimports = ["/etc/a.toml"]\n'),
    (f'version = 2\nimports = [\n  "{DROPIN}",\n  "/etc/b.toml",  # theirs\n]\n', 'version = 2\nimports = ["/etc/b.toml"]\n'),
    (f"version = 3\nimports = ['{DROPIN}']  \n", "version = 3\n"),
])
def test_remove_import_minimal_edit(text, want):
    assert ct.remove_import(text, DROPIN) == want


def test_remove_import_not_listed_or_only_by_glob():
    assert ct.remove_import('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n', DROPIN) is None
    assert ct.remove_import("version = 2\n", DROPIN) is None


def test_remove_import_round_trips_add_import():
    for main in ("version = 2\n", 'version = 2\nimports = ["/x.toml"]\n[plugins.a]\n b = "c"\n', "# top\nversion=2\n"):
        added = ct.add_import(main, DROPIN, ct.scan_top(main))
        removed = ct.remove_import(added, DROPIN)
        assert ct.toml_loads(removed, "t") == ct.toml_loads(main, "t")


# ---------------------------------------------------------------- roles: deploy then remove (local)

def remove_vars(v: dict) -> dict:
    return {**v, "gpu_install_action": "remove"}


def state_of(path: Path) -> Path:
    return path.parent / f".{path.name}.gpu-install-state"


@pytest.mark.parametrize("original", [
    '{\n    "log-level": "warn",\n    "default-runtime": "runc",\n    "insecure-registries": ["old.lab:5000"]\n}\n',
    '{"data-root": "/srv/d", "runtimes": {"crun": {"path": "/usr/bin/crun"}}}',
    None,  # no daemon.json before apply
])
def test_docker_remove_restores_the_original_bytes_then_changed_0(tmp_path, original):
    path = tmp_path / "etc" / "docker" / "daemon.json"
    path.parent.mkdir(parents=True)
    if original is not None:
        path.write_text(original)
    v = docker_vars(path, docker_runtime_options={"iptables": False})
    assert apply_role(tmp_path, "docker_runtime", v).exit_code() == EXIT_OK
    doc = json.loads(path.read_text())
    assert doc["default-runtime"] == "nvidia" and "nvidia" in doc["runtimes"]
    rec = json.loads(state_of(path).read_text())
    assert oct(state_of(path).stat().st_mode & 0o777) == "0o600"
    assert rec["existed"] is (original is not None)
    assert apply_role(tmp_path, "docker_runtime", v).hosts["node"].changed == 0  # the record is not rewritten
    res = apply_role(tmp_path, "docker_runtime", remove_vars(v))
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1, res.recap()
    if original is None:
        assert not path.exists()
    else:
        assert path.read_text() == original  # byte for byte: the backup of the original came back
    assert not state_of(path).exists()
    again = apply_role(tmp_path, "docker_runtime", remove_vars(v))
    assert again.exit_code() == EXIT_OK and again.hosts["node"].changed == 0


def test_docker_remove_keeps_keys_added_after_apply(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"log-level": "warn"}')
    v = docker_vars(path)
    apply_role(tmp_path, "docker_runtime", v)
    doc = json.loads(path.read_text())
    doc["max-concurrent-downloads"] = 5  # the admin's later key
    path.write_text(json.dumps(doc))
    assert apply_role(tmp_path, "docker_runtime", remove_vars(v), check=True).hosts["node"].changed == 1
    assert json.loads(path.read_text()) == doc  # check mode wrote nothing
    assert apply_role(tmp_path, "docker_runtime", remove_vars(v)).exit_code() == EXIT_OK
    assert json.loads(path.read_text()) == {"log-level": "warn", "max-concurrent-downloads": 5}


def test_docker_restart_failure_rolls_back_and_fails_the_host(tmp_path):
    """The restart fails for real (a service that does not exist): the previous daemon.json is put back byte
    for byte, the record this run started is dropped, and the host fails saying it was rolled back."""
    path = tmp_path / "daemon.json"
    original = '{"log-level":   "warn"}\n'
    path.write_text(original)
    v = docker_vars(path, docker_runtime_restart=True, docker_runtime_service="gpu-install-no-such-docker",
                    docker_runtime_ready_retries=1, docker_runtime_ready_delay=0)
    res = apply_role(tmp_path, "docker_runtime", v)
    assert res.exit_code() == EXIT_HOST_FAILURES and res.failed == ["node"]
    msg = res.failures[-1].message
    assert "docker did not come back" in msg and "ROLLED BACK" in msg and "restored from" in msg, msg
    assert path.read_text() == original
    assert not state_of(path).exists()


@pytest.mark.parametrize("validate", [False, True])
def test_containerd_remove_restores_the_original_bytes(tmp_path, validate):
    if validate:
        need(containerd_bin(), "no containerd binary to validate with (Debian package containerd; scripts/bootstrap)")
    config = tmp_path / "config.toml"
    config.write_text(USER_TOML)
    v = containerd_vars(tmp_path, containerd_runtime_validate=validate,
                        containerd_runtime_registry_config_path="/etc/containerd/certs.d")
    assert apply_role(tmp_path, "containerd_runtime", v).exit_code() == EXIT_OK
    assert (tmp_path / "conf.d" / "99-nvidia.toml").exists() and state_of(config).exists()
    res = apply_role(tmp_path, "containerd_runtime", remove_vars(v))
    assert res.exit_code() == EXIT_OK and res.hosts["node"].changed == 1, res.recap()
    assert config.read_text() == USER_TOML
    assert not (tmp_path / "conf.d").exists()  # the drop-in directory was ours
    assert not state_of(config).exists() and backups(config)
    assert apply_role(tmp_path, "containerd_runtime", remove_vars(v)).hosts["node"].changed == 0


def test_containerd_remove_after_user_edit_takes_out_only_our_import(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text(USER_TOML)
    v = containerd_vars(tmp_path, containerd_runtime_validate=False)
    apply_role(tmp_path, "containerd_runtime", v)
    config.write_text(config.read_text() + '\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/x"\n')
    assert apply_role(tmp_path, "containerd_runtime", remove_vars(v)).exit_code() == EXIT_OK
    assert config.read_text() == USER_TOML + '\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/x"\n'
    assert not (tmp_path / "conf.d" / "99-nvidia.toml").exists()


def test_containerd_remove_of_a_config_we_created(tmp_path):
    v = containerd_vars(tmp_path, containerd_runtime_validate=False)
    apply_role(tmp_path, "containerd_runtime", v)
    assert (tmp_path / "config.toml").exists()
    apply_role(tmp_path, "containerd_runtime", remove_vars(v))
    assert not (tmp_path / "config.toml").exists() and not (tmp_path / "conf.d").exists()


def test_registry_trust_remove_only_our_files(tmp_path):
    """Directories under tmp: OS store off (it needs root), docker certs.d and containerd hosts dir."""
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    v = {"registry_trust_host": "reg.lab:5000", "registry_trust_ca_src": str(ca), "registry_trust_os_store": False,
         "registry_trust_docker_certs_d": str(tmp_path / "docker-certs.d"),
         "registry_trust_containerd_config_path": str(tmp_path / "certs.d")}
    assert apply_role(tmp_path, "registry_trust", v).exit_code() == EXIT_OK
    theirs = tmp_path / "certs.d" / "other:443"
    theirs.mkdir()
    (theirs / "hosts.toml").write_text('server = "https://other"\n')
    (tmp_path / "docker-certs.d" / "reg.lab:5000" / "client.cert").write_text("theirs")
    res = apply_role(tmp_path, "registry_trust", remove_vars(v))
    assert res.exit_code() == EXIT_OK, res.recap()
    assert not (tmp_path / "certs.d" / "reg.lab:5000").exists()
    assert (theirs / "hosts.toml").exists()
    assert sorted(p.name for p in (tmp_path / "docker-certs.d" / "reg.lab:5000").iterdir()) == ["client.cert"]
    assert apply_role(tmp_path, "registry_trust", remove_vars(v)).hosts["node"].changed == 0


# ---------------------------------------------------------------- pipeline: operator stage checks, uninstall

@pytest.fixture
def local_setup(tmp_path, write_site):
    import sys

    import yaml

    from tests.unit.test_ansible_apply import fake_node

    node = fake_node(tmp_path / "node")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    daemon = tmp_path / "daemon.json"
    daemon.write_text('{"log-level": "warn"}\n')
    inv = tmp_path / "hosts.yml"
    gpu_vars = {"preflight_root": str(node), "preflight_min_free_gb": 0.001, "docker_runtime_daemon_json": str(daemon),
                "docker_runtime_restart": False, "docker_runtime_options": {"iptables": False},
                "nvidia_driver_enabled": False, "nvidia_container_toolkit_enabled": False}
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_nodes": {"hosts": {"gpu1": local}, "vars": gpu_vars},
        "kube_control_plane": {"hosts": {"cp": local}}}}}))
    site = write_site({"operator": {"version": "v24.9.2"}, "registry": {"host": "reg.lab:5000", "insecure": True},
                       "runtime": "docker", "toolkit": {"mode": "host"}, "driver": {"mode": "operator"}})
    return site, inv, daemon


# role_vars() turns the toolkit role on (toolkit.mode host) as an extravar: it would install packages on this
# machine, so the CLI runs here skip the driver and toolkit plays (tested on lab nodes).
NODES_ONLY = ("-q", "--skip-tags", "driver,toolkit")


def test_apply_without_chart_or_kubeconfig_exit_2_before_any_host(local_setup, cli, tmp_path, monkeypatch):
    site, inv, daemon = local_setup
    monkeypatch.delenv("GPU_INSTALL_CHART", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY)
    assert rc == 2 and "no GPU Operator chart given" in err and "--chart" in err and "--skip-operator" in err, err
    chart = Path(__file__).resolve().parent.parent / "fixtures" / "charts" / "gpu-operator-fixture"
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--chart", chart)
    assert rc == 2 and "kubeconfig not found" in err and "KUBECONFIG" in err and "--skip-operator" in err, err
    assert daemon.read_text() == '{"log-level": "warn"}\n'
    assert not (Path(str(tmp_path / "state")) / "runs").exists()  # no playbook ran at all


def test_apply_bad_mig_layout_exit_2_before_any_host(local_setup, cli, tmp_path):
    import yaml

    site, inv, daemon = local_setup
    doc = yaml.safe_load(inv.read_text())
    doc["all"]["children"]["gpu_nodes"]["hosts"]["gpu1"]["gpu_install_mig_config"] = "all-1g.10gbb"
    inv.write_text(yaml.safe_dump(doc))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\nusers: []\ncontexts: []\n")
    chart = Path(__file__).resolve().parent.parent / "fixtures" / "charts" / "gpu-operator-fixture"
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--chart", chart, "--kubeconfig", kubeconfig)
    assert rc == 2, (out, err)
    assert "host gpu1: gpu_install_mig_config: all-1g.10gbb is not in GPU Operator v24.9.2" in err, err
    assert "all-1g.10gb" in err  # the nearest names
    assert daemon.read_text() == '{"log-level": "warn"}\n'
    assert not (Path(str(tmp_path / "state")) / "runs").exists()  # no playbook ran at all


def test_apply_skip_operator_summary_then_uninstall(local_setup, cli):
    site, inv, daemon = local_setup
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator")
    assert rc == 0, err
    assert re.search(r"preflight +ok", out) and re.search(r"nodes +changed", out), out
    assert re.search(r"operator +skipped +--skip-operator", out), out
    assert re.search(r"mig +skipped", out), out
    assert re.search(r"validate +skipped +runs after the operator stage", out), out
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator", "--skip-validate")
    assert rc == 0 and re.search(r"validate +skipped +--skip-validate", out), out
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator")
    assert rc == 0 and re.search(r"nodes +unchanged +changed=0", out) and "apply ok: nodes changed=0" in out, out

    applied = daemon.read_text()
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator")
    assert rc == 2 and "not confirmed; nothing was changed" in err and "daemon.json" in err and "--yes" in err, err
    assert "the NVIDIA container toolkit and driver packages gpu-install installed (its record in /var/lib/gpu-install; " \
           "packages that were there before stay)" in err
    assert daemon.read_text() == applied
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator", "--yes")
    assert rc == 0, err
    # the driver and toolkit plays are skipped here (NODES_ONLY): nothing of theirs removed
    assert re.search(r"nodes +changed", out) and re.search(r"packages +kept +no package gpu-install installed", out), out
    assert daemon.read_text() == '{"log-level": "warn"}\n'


def test_uninstall_needs_kubeconfig_before_touching_hosts(local_setup, cli, tmp_path, monkeypatch):
    site, inv, daemon = local_setup
    cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator")
    applied = daemon.read_text()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--yes")
    assert rc == 2 and "kubeconfig not found" in err and "--skip-operator" in err
    assert daemon.read_text() == applied


def test_operator_stage_selection():
    from installer import apply, pipeline

    op = pipeline.OperatorOptions()
    assert pipeline.operator_selected(apply.RunOptions(), op) is None
    assert pipeline.operator_selected(apply.RunOptions(tags="runtime"), op) == "--tags runtime does not include operator"
    assert pipeline.operator_selected(apply.RunOptions(tags="runtime,operator"), op) is None
    assert pipeline.operator_selected(apply.RunOptions(skip_tags="operator"), op) == "--skip-tags operator"
    assert pipeline.operator_selected(apply.RunOptions(), pipeline.OperatorOptions(enabled=False)) == "--skip-operator"
    limited = pipeline.operator_selected(apply.RunOptions(), op, limit="gpu3")
    assert limited and limited.startswith("--limit gpu3: the operator is cluster-wide")
    assert pipeline.operator_selected(apply.RunOptions(), pipeline.OperatorOptions(with_limit=True), "gpu3") is None


def test_limit_never_widens_uninstall(local_setup, cli, tmp_path, monkeypatch):
    """Retiring one node must not remove the operator from the cluster: with --limit the operator stage is skipped
    (no kubeconfig needed, none touched), the output says so, and only the limited hosts are changed."""
    site, inv, daemon = local_setup
    cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--skip-operator")
    applied = daemon.read_text()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))  # would be exit 2 if the operator stage ran
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--limit", "gpu1")
    assert rc == 2 and "Helm release" not in err  # the preview: nothing cluster-wide
    assert "not the GPU Operator release: --limit gpu1" in err and "kube_control_plane hosts" not in err
    assert "on the gpu_nodes hosts (gpu1)" in err
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--limit", "gpu1", "--yes")
    assert rc == 0, err
    assert re.search(r"operator +skipped +--limit gpu1: the operator is cluster-wide \(add --include-operator", out), out
    assert daemon.read_text() != applied  # gpu1 itself was uninstalled
    rc, out, err = cli("uninstall", "-s", site, "-i", inv, *NODES_ONLY, "--limit", "gpu1", "--yes",
                       "--include-operator")
    assert rc == 2 and "kubeconfig not found" in err  # opted in: the operator stage runs (and needs a cluster)


def test_limit_never_widens_apply(local_setup, cli, tmp_path, monkeypatch):
    site, inv, daemon = local_setup
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "nope"))
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--limit", "gpu1")
    assert rc == 0, err
    assert re.search(r"operator +skipped +--limit gpu1", out) and re.search(r"mig +skipped", out), out
    rc, out, err = cli("apply", "-s", site, "-i", inv, *NODES_ONLY, "--limit", "gpu1", "--include-operator")
    assert rc == 2 and "operator stage: no GPU Operator chart given" in err and not out  # checked before any host


def test_uninstall_playbook_reverses_every_role_in_reverse_order():
    import yaml

    text = (content.playbooks_dir() / "uninstall.yml").read_text()
    plays = yaml.safe_load(text)
    roles = [r["role"] for p in plays for r in p.get("roles", [])]
    assert roles == [content.fqcn(r) for r in ("docker_runtime", "containerd_runtime", "registry_trust",
                                                "nvidia_container_toolkit", "mig_mode", "nvidia_driver", "package_repo",
                                                "scheduler_policy")]
    sched = next(p for p in plays if any(r["role"] == content.fqcn("scheduler_policy") for r in p.get("roles", [])))
    assert sched["hosts"] == "kube_control_plane" and sched["vars"]["gpu_install_action"] == "remove"
    for play in plays[1:]:
        assert play["vars"]["gpu_install_action"] == "remove"
    for role in roles:
        assert (content.role_dir(role) / "tasks" / "remove.yml").is_file()
    # every role of site.yml has a removal in uninstall.yml
    site = [r["role"] for p in yaml.safe_load((content.playbooks_dir() / "site.yml").read_text()) for r in p.get("roles", [])]
    assert sorted(site) == sorted(roles)
