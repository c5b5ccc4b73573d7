"""Hypothesis properties: registry mapping and values merging."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from installer.config import Registry
from installer.render.values import deep_merge, destination_repository

label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
host = st.builds(lambda parts, port: ".".join(parts) + (f":{port}" if port else ""),
                 st.lists(label, min_size=2, max_size=3), st.one_of(st.none(), st.integers(1, 65535)))
path = st.lists(label, min_size=1, max_size=4).map("/".join)


# source hosts as image references write them: a dotted name, host:port, localhost(:port) -- or none at all
# (Docker Hub style nvidia/cuda, whose first path component is not a host)
src_host = st.one_of(host, st.just("localhost"), st.builds("localhost:{}".format, st.integers(1, 65535)), st.none())


@given(reg_host=st.one_of(host, st.just("localhost:5000")), prefix=st.one_of(st.just(""), path), src_host=src_host,
       src_path=path, layout=st.sampled_from(["strip-host", "keep-host"]))
@settings(max_examples=400, deadline=None)
def test_destination_is_always_in_the_registry(reg_host, prefix, src_host, src_path, layout):
    reg = Registry(host=reg_host, prefix=prefix, layout=layout)
    base = reg.host + (f"/{reg.prefix}" if reg.prefix else "")
    src = f"{src_host}/{src_path}" if src_host else src_path
    dest = destination_repository(src, reg)
    assert dest == base or dest.startswith(base + "/")
    tail = dest[len(base) + 1 :]
    if src == base or src.startswith(base + "/"):
        assert dest == src  # already private: untouched
    elif layout == "keep-host" and src_host:
        assert tail == src
    else:
        assert tail == src_path  # strip-host, or nothing to keep (no host in the reference)
    assert destination_repository(dest, reg) == dest  # idempotent


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))
tree = st.recursive(json_leaf, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(label, c, max_size=3)),
                    max_leaves=12)
mapping = st.dictionaries(label, tree, max_size=5)


@given(base=mapping, extra=mapping)
@settings(max_examples=300, deadline=None)
def test_deep_merge(base, extra):
    before = repr(base)
    out = deep_merge(base, extra)
    assert repr(base) == before  # inputs untouched

    def check(b, e, o):
        for k in set(b) | set(e):
            if k not in e:
                assert o[k] == b[k]  # every base key survives
            elif isinstance(e[k], dict) and isinstance(b.get(k), dict):
                check(b[k], e[k], o[k])
            else:
                assert o[k] == e[k]  # extra wins

    check(base, extra, out)
    assert deep_merge(out, extra) == out  # idempotent
