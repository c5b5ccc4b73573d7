"""Shape checks for the curated platform facts in values/catalog/platforms.yaml.

The facts themselves (Kubernetes floors, NVIDIA's validated ranges, driver OS lists) are hand-curated
with sources; these tests only make sure the file stays complete and machine-readable.
"""

import re
from pathlib import Path

import pytest
import yaml

CATALOG = Path(__file__).resolve().parents[2] / "values" / "catalog"
PLATFORMS = CATALOG / "platforms.yaml"

MINOR = re.compile(r"^1\.(0|[1-9][0-9]*)$")
RELEASE = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")
OS_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # os-release ID: lowercase, 0-9, ".", "_", "-"
VERSION_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]*(\*)?$")


def _minor(v: str) -> tuple[int, int]:
    major, minor = v.split(".")
    return int(major), int(minor)


@pytest.fixture(scope="module")
def data() -> dict:
    with PLATFORMS.open() as f:
        return yaml.safe_load(f)


def _catalog_series() -> set[str]:
    series = set()
    for p in CATALOG.glob("v*.yaml"):
        m = RELEASE.match(p.stem)
        if m:
            series.add(f"v{m.group(1)}.{m.group(2)}")
    return series


def test_catalog_has_releases():
    assert _catalog_series(), f"no v*.yaml releases found in {CATALOG}"


def test_every_catalog_series_has_an_entry(data):
    missing = _catalog_series() - set(data["series"])
    assert not missing, f"series without platform facts: {sorted(missing)}"


def test_no_entry_for_unknown_series(data):
    extra = set(data["series"]) - _catalog_series()
    assert not extra, f"platform facts for series not in the catalog: {sorted(extra)}"


def test_kubernetes_versions(data):
    for name, entry in data["series"].items():
        k8s = entry["kubernetes"]
        if "min" in k8s:
            assert isinstance(k8s["min"], str) and MINOR.match(k8s["min"]), (name, k8s["min"])
            assert isinstance(k8s.get("minReason"), str) and k8s["minReason"].strip(), name
        if "validated" in k8s:
            lo, hi = k8s["validated"]
            for v in (lo, hi):
                assert isinstance(v, str) and MINOR.match(v), (name, v)
            assert _minor(lo) <= _minor(hi), (name, lo, hi)
            assert "source" in k8s, name


def test_sources_are_https(data):
    for name, entry in data["series"].items():
        for section in ("kubernetes", "driverOs"):
            if section in entry and "source" in entry[section]:
                src = entry[section]["source"]
                assert isinstance(src, str) and src.startswith("https://"), (name, section, src)
                assert " " not in src, (name, section, src)


def test_driver_os_ids_and_versions(data):
    for name, entry in data["series"].items():
        oses = {k: v for k, v in entry.get("driverOs", {}).items() if k != "source"}
        if oses:
            assert "source" in entry["driverOs"], name
        for os_id, versions in oses.items():
            assert OS_ID.match(os_id), (name, os_id)
            assert isinstance(versions, list) and versions, (name, os_id)
            for v in versions:
                assert isinstance(v, str) and VERSION_ID.match(v), (name, os_id, v)
            assert len(set(versions)) == len(versions), (name, os_id, versions)
