"""installer.features: the one list of features and what iterating it gives — the stage list a table shows, a new
feature reaching the plan, the mirror plan and the values through its registration alone, and no mode tested by name
outside the package."""

from __future__ import annotations

import importlib
import re
from typing import ClassVar

import pytest

from installer import features
from installer.config import parse_site
from installer.facts import Node
from installer.features import Feature, device_plugin, gpumanager, hami, monitoring, nos
from installer.features.base import Chart, site_images
from tests.conftest import ROOT, plan_of

NODES = [Node("gpu1", "ubuntu", "22.04", None, "gpu1")]
BASE = {"operator": {"version": "v24.9.2"}, "registry": {"host": "registry.example.com:5000"}}


def site(**extra):
    return parse_site({**BASE, **extra})


GPUMANAGER = {"sharing": {"mode": "gpumanager"}, "toolkit": {"mode": "host"},
              "components": {"devicePlugin": {"enabled": False}}}
HAMI = {"sharing": {"mode": "hami", "hami": {"kubernetesVersion": "v1.29.4"}},
        "components": {"devicePlugin": {"enabled": False}}}
NOS = {"mig": {"strategy": "mixed", "dynamic": "nos"}, "driver": {"mode": "host"}}


@pytest.mark.parametrize("doc,active,stages", [
    ({}, [], [None, None]),
    (GPUMANAGER, [gpumanager.FEATURE], [gpumanager.FEATURE, None]),
    ({**HAMI, "monitoring": {"enabled": True}}, [hami.FEATURE, monitoring.FEATURE], [hami.FEATURE, monitoring.FEATURE]),
    (NOS, [nos.FEATURE], [nos.FEATURE, None]),
    ({"devicePlugin": {"timeSlicing": {"replicas": 4}}}, [device_plugin.FEATURE], [None, None]),
])
def test_active_features_and_the_stage_list(doc, active, stages):
    s = site(**doc)
    assert features.active(s) == active
    rows = features.feature_stages(s)
    assert [name for name, _f, _why in rows] == ["sharing", "monitoring"]  # every stage, whatever runs
    assert [f for _name, f, _why in rows] == stages
    for _name, f, why in rows:
        assert bool(why) == (f is None)  # a stage that does not run says why
    assert features.sharing(s) is next((f for f in stages if f is not None and f.stage == "sharing"), None)


def test_nos_with_a_sharing_mode_is_requested_not_active_and_its_conflicts_are_reported():
    s = site(**{**NOS, "sharing": {"mode": "gpumanager"}, "toolkit": {"mode": "host"}})
    assert nos.FEATURE.requested(s) and not nos.FEATURE.active(s)
    assert features.active(s) == [gpumanager.FEATURE]
    found = features.conflicts(plan_of(s, NODES))
    assert found[0].startswith("sharing.mode gpumanager with mig.dynamic nos"), found  # nos' own, first in the list


def test_every_feature_stage_is_in_the_stage_list():
    for f in features.FEATURES:
        assert f.stage is None or f.stage in features.STAGES, f.name
        assert f.name and f is importlib.import_module(type(f).__module__).FEATURE  # one module, one FEATURE


class Example(Feature):
    """A feature as docs/architecture.md shows it: an image, a chart and an operator value."""

    name: ClassVar[str] = "example"

    def requested(self, site):
        return site.cdi.enabled is True

    def what(self, site):
        return "cdi.enabled true"

    def images(self, site):
        return site_images(site, {"example": "nvcr.io/nvidia/example:1.0"})

    def charts(self, site):
        return [Chart("example", "1.0.0", "https://example.invalid/charts", "example chart")]

    def operator_values(self, site, release, values):
        from installer.render.values import _set

        _set(values, "daemonsets.priorityClassName", "example-critical")


def test_a_registered_feature_reaches_the_plan_the_mirror_plan_and_the_values(monkeypatch):
    s = site(cdi={"enabled": True})
    before = plan_of(s, NODES)
    assert "priorityClassName" not in before.values.get("daemonsets", {})
    assert "example" not in {i.component for i in before.images}
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, Example()))  # the one registration line
    plan = plan_of(site(cdi={"enabled": True}), NODES)
    assert plan.values["daemonsets"]["priorityClassName"] == "example-critical"
    img = next(i for i in plan.images if i.component == "example")
    assert (img.source, img.destination) == ("nvcr.io/nvidia/example:1.0", "registry.example.com:5000/nvidia/example:1.0")
    arts = plan.artifacts()
    assert [n.setting for a in arts.images if a.component == "example" for n in a.needs] == ["cdi.enabled=true"]
    assert [(c.name, c.version, [n.setting for n in c.needs]) for c in arts.charts if c.name == "example"] == \
        [("example", "1.0.0", ["cdi.enabled=true"])]
    off = plan_of(site(), NODES)  # not requested: nothing of it
    assert "priorityClassName" not in off.values.get("daemonsets", {})
    assert "example" not in {c.name for c in off.artifacts().charts}


class Strict(Feature):
    """A feature with a rule on the sharing block: mode gpumanager only with a gpumanager namespace other than
    kube-system."""

    name: ClassVar[str] = "strict"

    def check_block(self, block):
        from installer.config import Sharing

        if isinstance(block, Sharing) and block.mode == "gpumanager" and block.gpumanager.namespace == "kube-system":
            raise ValueError("strict: give sharing.gpumanager.namespace")


def test_a_registered_features_site_rule_refuses_the_site_at_load_naming_the_block(monkeypatch):
    from installer.errors import ConfigError

    doc = {**GPUMANAGER, "sharing": {"mode": "gpumanager"}}
    assert site(**doc).sharing.mode == "gpumanager"  # not registered: the site loads
    monkeypatch.setattr(features, "FEATURES", (*features.FEATURES, Strict()))  # the one registration line
    with pytest.raises(ConfigError) as exc:
        site(**doc)
    assert exc.value.exit_code == 2
    assert exc.value.message.splitlines()[1:] == ["  sharing: strict: give sharing.gpumanager.namespace"]
    ok = site(**{**doc, "sharing": {"mode": "gpumanager", "gpumanager": {"namespace": "gpu-sharing"}}})
    assert ok.sharing.gpumanager.namespace == "gpu-sharing"
    assert site().sharing.mode == "none"  # another mode: the rule does not apply


#: a test of a feature's mode by its value, e.g. `mode == "hami"`, `dynamic != "nos"`, `in ("gpumanager", ...)`
MODE_TEST = re.compile(r"""([=!]=\s*["'](hami|gpumanager|nos)["'])|(["'](hami|gpumanager|nos)["']\s*[=!]=)"""
                       r"""|(\bin\s*[(\[{][^)\]}]*["'](hami|gpumanager|nos)["'])""")


def test_no_mode_is_tested_by_name_outside_the_feature_package():
    """The site model (config.py) declares the modes; what a mode means, its rules on the site included
    (Feature.check_block), is its feature's: everything else asks installer.features."""
    found = []
    for path in sorted((ROOT / "installer").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("installer/features/"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if MODE_TEST.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []


def test_the_mode_pattern_finds_what_it_is_for():
    for line in ('if site.sharing.mode == "hami":', "if 'nos' != x:", 'if mode in ("gpumanager", "hami"):'):
        assert MODE_TEST.search(line), line
    assert not MODE_TEST.search('name = "gpumanager"') and not MODE_TEST.search("from installer.features import nos")


@pytest.mark.parametrize("doc, says", [
    (NOS, "(mig.dynamic nos; its record /var/lib/gpu-install/mig_mode.json)"),
    ({}, "only where an earlier apply with mig.dynamic nos turned it on"),
])
def test_uninstall_preview_names_mig_mode_off_as_nos_work_only_on_a_nos_site(doc, says):
    from installer.pipeline import OperatorOptions, removal_plan

    lines = [x for x in removal_plan(plan_of(site(**doc), [Node("gpu1", "ubuntu", "22.04")]), OperatorOptions())
             if "MIG mode off" in x]
    assert len(lines) == 1 and says in lines[0], lines
