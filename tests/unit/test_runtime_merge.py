"""Runtime config merges (library/ modules, pure functions): user keys kept, idempotent, bad input refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

LIBRARY = Path(__file__).resolve().parent.parent.parent / "library"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, LIBRARY / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


dj = load("gpu_install_daemon_json")

# ---------------------------------------------------------------- daemon.json

json_scalar = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8)
json_value = st.recursive(json_scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                          max_leaves=8)
OURS = {"runtimes", "default-runtime", "registry-mirrors", "insecure-registries"}
user_doc = st.dictionaries(st.text(min_size=1, max_size=12).filter(lambda k: k not in OURS), json_value, max_size=6)
user_runtimes = st.dictionaries(st.sampled_from(["runc", "crun", "kata", "nvidia"]),
                                st.fixed_dictionaries({"path": st.text(min_size=1, max_size=10)}), max_size=3)
MERGE = dict(default_runtime="nvidia", registry_mirrors=["https://m.lab"], insecure_registries=["reg.lab:5000"])


@settings(max_examples=150, deadline=None)
@given(user_doc, user_runtimes, st.lists(st.text(min_size=1, max_size=8), max_size=3))
def test_daemon_json_user_keys_kept_and_idempotent(doc, runtimes, mirrors):
    doc = dict(doc)
    if runtimes:
        doc["runtimes"] = runtimes
    if mirrors:
        doc["insecure-registries"] = mirrors
    out = dj.merge(doc, **MERGE)
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
