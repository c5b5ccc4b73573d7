"""Runtime config merges (the collection's modules, pure functions): user keys kept, idempotent, bad input refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.conftest import requires
from tests.unit.library_modules import load_module as load

dj = load("daemon_json")

# ---------------------------------------------------------------- daemon.json

json_scalar = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8)
json_value = st.recursive(json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                          max_leaves=8)
OURS = {"runtimes", "default-runtime", "registry-mirrors", "insecure-registries"}
user_doc = st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in OURS), json_value, max_size=6)
user_runtimes = st.dictionaries(st.sampled_from(["runc", "crun", "kata", "nvidia"]),
                                st.fixed_dictionaries({"path": st.text(min_size=1, max_size=10)}), max_size=3)
MERGE = dict(default_runtime="nvidia", registry_mirrors=["https://m.lab"], insecure_registries=["reg.lab:5000"])


registry_list = st.lists(st.sampled_from(["reg.lab:5000", "old:5000", "https://m.lab", "https://their.mirror"])
                         | st.text(min_size=1, max_size=8), max_size=3, unique=True)


@settings(max_examples=150, deadline=None)
@given(user_doc, user_runtimes, registry_list, registry_list, st.sampled_from([None, "runc", "nvidia"]))
def test_daemon_json_user_keys_kept_and_idempotent(doc, runtimes, mirrors, user_mirrors, default):
    """The user's own registry-mirrors / insecure-registries (also ones equal to ours) and default-runtime are
    generated too: ours are added once, theirs kept in order."""
    doc = dict(doc)
    if runtimes:
        doc["runtimes"] = runtimes
    if mirrors:
        doc["insecure-registries"] = mirrors
    if user_mirrors:
        doc["registry-mirrors"] = user_mirrors
    if default:
        doc["default-runtime"] = default
    out = dj.merge(doc, **MERGE)
    assert out["registry-mirrors"][: len(user_mirrors)] == user_mirrors
    assert out["registry-mirrors"].count("https://m.lab") == 1
    assert out["insecure-registries"].count("reg.lab:5000") == 1
    for key, value in doc.items():  # every user key survives with its value (ours only added to)
        if key not in OURS:
            assert out[key] == value
    for name, rt in runtimes.items():
        if name != "nvidia":
            assert out["runtimes"][name] == rt
    assert out["insecure-registries"][: len(mirrors)] == mirrors and "reg.lab:5000" in out["insecure-registries"]
    assert out["runtimes"]["nvidia"]["path"] == "/usr/bin/nvidia-container-runtime"
    assert out["default-runtime"] == "nvidia"
    assert list(out)[: len(doc)] == list(doc)  # key order kept
    again = dj.merge(dj.parse(dj.dump(out)), **MERGE)
    assert again == out  # second merge: no change


def test_daemon_json_empty_file_and_no_default_runtime():
    out = dj.merge(dj.parse("  \n"), default_runtime="")
    assert out == {"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}


def test_daemon_json_nvidia_entry_extra_keys_kept():
    doc = {"runtimes": {"nvidia": {"path": "/old", "runtimeArgs": ["--debug"], "x": 1}}}
    out = dj.merge(doc)
    assert out["runtimes"]["nvidia"] == {"path": "/usr/bin/nvidia-container-runtime", "runtimeArgs": [], "x": 1}
    assert doc["runtimes"]["nvidia"]["path"] == "/old"  # input not mutated


@pytest.mark.parametrize("text,match", [("{", "not valid JSON"), ('{"a": 1,}', "not valid JSON"),
                                        ("[1, 2]", "must hold a JSON object"), ('"x"', "must hold a JSON object")])
def test_daemon_json_invalid_refused(text, match):
    with pytest.raises(dj.MergeError, match=match):
        dj.parse(text, "/etc/docker/daemon.json")


@pytest.mark.parametrize("doc", [{"runtimes": []}, {"insecure-registries": "reg:5000"}])
def test_daemon_json_wrong_types_refused(doc):
    with pytest.raises(dj.MergeError, match="must be"):
        dj.merge(doc, **MERGE)


# ---------------------------------------------------------------- containerd

ct = load("containerd_runtime")
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tomllib  # noqa: E402

DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
PARAMS = dict(config="/etc/containerd/config.toml", runtime_name="nvidia", runtime_binary="/usr/bin/nvidia-container-runtime",
              set_default=True, registry_config_path="", config_version=0, containerd_version="")

toml_key = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)
toml_scalar = (st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(st.characters(codec="utf-8"), max_size=10)
               | st.floats(allow_nan=False))
toml_doc = st.recursive(st.dictionaries(toml_key, toml_scalar | st.lists(toml_scalar, max_size=3), max_size=4),
                        lambda c: st.dictionaries(toml_key, c | toml_scalar | st.lists(c, min_size=1, max_size=2),
                                                  max_size=3), max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(toml_doc)
@example({"0\n": False})  # a key ending in a newline is not a bare key (a `$` anchor once let it through)
def test_toml_emitter_round_trips(doc):
    assert tomllib.loads(ct.toml_dumps(doc)) == doc


def runtime_at(doc, version):
    plugin = ct.CRI_V2 if version == 2 else ct.CRI_V3_RUNTIME
    return doc["plugins"][plugin]["containerd"]


USER_V2 = """\
# user comment kept
version = 2
root = "/srv/containerd"
disabled_plugins = ["io.containerd.internal.v1.opt"]

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "reg.lab/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
"""


def test_containerd_v2_dropin_carries_cri_section_and_main_gets_import_only():
    new_main, dropin, version = ct.plan(USER_V2, DROPIN, PARAMS)
    assert version == 2
    assert new_main == USER_V2.replace("version = 2\n", f'version = 2\nimports = ["{DROPIN}"]\n')
    d = tomllib.loads(dropin)
    assert d["version"] == 2
    cri = d["plugins"][ct.CRI_V2]
    assert cri["sandbox_image"] == "reg.lab/pause:3.9"  # whole-section replacement in 1.x: carried over
    assert cri["containerd"]["runtimes"]["runc"]["options"] == {"SystemdCgroup": True}
    assert cri["containerd"]["runtimes"]["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": "/usr/bin/nvidia-container-runtime"}}
    assert cri["containerd"]["default_runtime_name"] == "nvidia"


def test_containerd_v3_dropin_only_ours_and_imports_array_extended():
    main = 'version = 3\nimports = [\n  "/etc/containerd/other.toml", # theirs\n]\n[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\nSystemdCgroup = true\n'
    new_main, dropin, version = ct.plan(main, DROPIN, dict(PARAMS, registry_config_path="/etc/containerd/certs.d"))
    assert version == 3
    assert tomllib.loads(new_main)["imports"] == ["/etc/containerd/other.toml", DROPIN]
    assert new_main.replace(f' "{DROPIN}"', "") == main  # nothing else touched
    d = tomllib.loads(dropin)
    assert set(d["plugins"]) == {ct.CRI_V3_RUNTIME, ct.CRI_V3_IMAGES}
    assert runtime_at(d, 3)["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert d["plugins"][ct.CRI_V3_IMAGES]["registry"]["config_path"] == "/etc/containerd/certs.d"
    assert "runc" not in runtime_at(d, 3)["runtimes"]  # the user declared it


def test_containerd_runc_declared_when_nobody_does():
    _, dropin, _ = ct.plan("version = 3\n", DROPIN, PARAMS)
    assert runtime_at(tomllib.loads(dropin), 3)["runtimes"]["runc"] == {"runtime_type": "io.containerd.runc.v2"}


def test_containerd_already_imported_by_glob_main_untouched():
    main = 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    new_main, _, _ = ct.plan(main, DROPIN, PARAMS)
    assert new_main is None


@pytest.mark.parametrize("main,version_text,expect", [
    ("", "containerd github.com/containerd/containerd v1.7.22 abc", 2),
    ("", "containerd containerd.io 2.0.4 1a43cb6", 3),
    ("# only a comment\n", "containerd 1.6.20~ds1", 2),
])
def test_containerd_version_from_binary_when_main_has_none(main, version_text, expect):
    new_main, dropin, version = ct.plan(main, DROPIN, dict(PARAMS, containerd_version=version_text))
    assert version == expect
    assert tomllib.loads(new_main) == {"version": expect, "imports": [DROPIN]}
    assert new_main.endswith(main)


@pytest.mark.parametrize("main,match", [
    ("version = 2\n[plugins.cri\n", "not valid TOML"),
    ('[plugins.cri]\nsandbox_image = "x"\n', "config version 1"),
    ("version = 4\n", "not supported"),
    ('version = 2\n[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]\nendpoint = ["https://m"]\n',
     "registry.mirrors"),
])
def test_containerd_bad_main_refused(main, match):
    with pytest.raises(ct.MergeError, match=match):
        ct.plan(main, DROPIN, dict(PARAMS, registry_config_path="/etc/containerd/certs.d"))


def test_containerd_v2_later_import_redefining_cri_refused():
    main = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    docs = {"/etc/containerd/conf.d/99-zz.toml": {"plugins": {ct.CRI_V2: {"sandbox_image": "x"}}}}
    orig = ct.import_order
    try:
        ct.import_order = lambda imports, dropin: [DROPIN, "/etc/containerd/conf.d/99-zz.toml"]
        with pytest.raises(ct.MergeError, match="replaces the whole CRI plugin section"):
            ct.plan(main, DROPIN, PARAMS, read_import=docs.get)
    finally:
        ct.import_order = orig


key_line = st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True).filter(lambda k: k not in ("version", "imports"))


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([2, 3]), st.dictionaries(key_line, toml_scalar, max_size=4),
       st.dictionaries(key_line, toml_scalar, max_size=4), st.booleans())
def test_containerd_user_keys_preserved_and_idempotent(version, top, cri_keys, with_imports):
    user = {"version": version, **top}
    if with_imports:
        user["imports"] = ["/etc/containerd/user.d/*.toml"]
    plugin = ct.CRI_V2 if version == 2 else ct.CRI_V3_RUNTIME
    user["plugins"] = {plugin: dict(cri_keys)}
    main = ct.toml_dumps(user)
    new_main, dropin, _ = ct.plan(main, DROPIN, PARAMS)
    after = tomllib.loads(new_main)
    assert {k: v for k, v in after.items() if k != "imports"} == {k: v for k, v in user.items() if k != "imports"}
    assert after["imports"] == user.get("imports", []) + [DROPIN]
    if version == 2:  # effective section = drop-in's, which carries every user key
        cri = tomllib.loads(dropin)["plugins"][plugin]
        assert {k: cri[k] for k in cri_keys} == cri_keys
    again_main, again_dropin, _ = ct.plan(new_main, DROPIN, PARAMS)
    assert again_main is None and again_dropin == dropin  # second run: no change


# ------------------------------------------------ real containerd validates what we write (config dump)

def containerd_binary() -> str | None:
    cached = Path(os.path.expanduser("~/.cache/gpu-install/pkgroot/usr/bin/containerd"))
    return shutil.which("containerd") or (str(cached) if cached.exists() else None)


@requires(containerd_binary(), "no containerd binary (Debian package containerd, or its files "
                    "extracted under ~/.cache/gpu-install/pkgroot)")
@pytest.mark.parametrize("user", [USER_V2, "", "version = 2\n"])
def test_real_containerd_config_dump_shows_nvidia_and_keeps_user_keys(tmp_path, user):
    config, dropin = tmp_path / "config.toml", tmp_path / "conf.d" / "99-nvidia.toml"
    config.write_text(user)
    version = subprocess.run([containerd_binary(), "--version"], capture_output=True, text=True).stdout
    new_main, dropin_text, _ = ct.plan(user, str(dropin), dict(PARAMS, config=str(config), containerd_version=version))
    dropin.parent.mkdir()
    dropin.write_text(dropin_text)
    config.write_text(new_main)
    out = subprocess.run([containerd_binary(), "--config", str(config), "config", "dump"], capture_output=True,
                         text=True, check=True).stdout
    eff = tomllib.loads(out)
    cri = eff["plugins"][ct.CRI_V2]
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == "/usr/bin/nvidia-container-runtime"
    assert cri["containerd"]["default_runtime_name"] == "nvidia"
    assert "runc" in cri["containerd"]["runtimes"]
    if user == USER_V2:
        assert cri["sandbox_image"] == "reg.lab/pause:3.9" and eff["root"] == "/srv/containerd"
        assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
        assert cri["containerd"]["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
