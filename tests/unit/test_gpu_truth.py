"""What real H100 80GB HBM3 and H200 machines (driver 580.159.04) said, read right.

The documents are real nvidia-smi output (../shared/upstream/nvidia-smi, copied byte for byte into
tests/fixtures/nvidia-smi/ with provenance in its README). The expected values are what NVML read on the same machines
at the same time (the README table beside the recordings, README-h100-h200-580.md here), written out literally:
never what the parser returns.
"""

from __future__ import annotations

import dataclasses
import hashlib
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

from installer import mig
from installer.validate import compare, local, node
from installer.validate.nvsmi import Gpu, NvidiaSmi, parse_xml
from tests.conftest import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
UPSTREAM = ROOT.parent / "shared" / "upstream" / "nvidia-smi"
FACTS_README = FIXTURES / "README-h100-h200-580.md"

# corpus copy -> path under ../shared/upstream/nvidia-smi
COPIES = {
    "README-h100-h200-580.md": "README.md",
    "h100-80gb-hbm3-580-v13.xml": "h100-80gb-hbm3/q-x.xml",
    "h200-580-v13.xml": "h200/q-x.xml",
    "corpus/h200-580-v13-with-process.xml": "h200/q-x-with-process.xml",
    **{f"h100-80gb-hbm3/{n}": f"h100-80gb-hbm3/{n}" for n in ("q.txt", "L.txt", "plain.txt", "mig-lgip.txt")},
    **{f"h200/{n}": f"h200/{n}" for n in ("q.txt", "L.txt", "plain.txt", "plain-with-process.txt", "mig-lgip.txt")},
}

# document -> (product, NVML: slowdown, shutdown, max operating C; MIG current, pending; retired pages)
NVML_FACTS = {
    "h100-80gb-hbm3-580-v13.xml": ("NVIDIA H100 80GB HBM3", 89, 95, 87, False, False, None),
    "h200-580-v13.xml": ("NVIDIA H200", 89, 95, 87, False, False, None),
    "corpus/h200-580-v13-with-process.xml": ("NVIDIA H200", 89, 95, 87, False, False, None),
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recorded_hashes() -> dict[str, str]:
    """file -> sha256 as tests/fixtures/nvidia-smi/README.md records it for the H100/H200 documents."""
    out = {}
    for line in (FIXTURES / "README.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.split("|")]
        if len(cells) > 3 and cells[1] in COPIES and len(cells[-2]) == 64:
            out[cells[1]] = cells[-2]
    return out


@pytest.mark.parametrize("copy", sorted(COPIES))
def test_corpus_copy_is_the_recording(copy: str) -> None:
    """Each copy is byte for byte the recording: against ../shared/upstream where this checkout has it, and always
    against the sha256 the corpus README records."""
    assert recorded_hashes().get(copy) == sha256(FIXTURES / copy), f"{copy}: README sha256"
    src = UPSTREAM / COPIES[copy]
    if src.is_file():
        assert (FIXTURES / copy).read_bytes() == src.read_bytes()


def test_the_readme_table_says_what_the_tests_expect() -> None:
    """The literal expectations below are the README's NVML table."""
    text = FACTS_README.read_text()
    assert "| slowdown threshold (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN) | 89 C | 89 C |" in text
    assert "| shutdown threshold (..._SHUTDOWN) | 95 C | 95 C |" in text
    assert "| max operating (..._GPU_MAX) | 87 C | 87 C |" in text
    assert "| retired pages (nvmlDeviceGetRetiredPages) | not supported (row remapping instead) | not supported |" in text
    assert "| MIG mode current / pending | Disabled / Disabled | Disabled / Disabled |" in text


@pytest.mark.parametrize("document", sorted(NVML_FACTS))
def test_document_reads_as_nvml_read_the_machine(document: str) -> None:
    product, slowdown, shutdown, max_operating, mig_current, mig_pending, retired = NVML_FACTS[document]
    doc = parse_xml((FIXTURES / document).read_bytes())
    [gpu] = doc.gpus
    assert gpu.product_name == product
    assert (gpu.slowdown_temp_c, gpu.shutdown_temp_c, gpu.max_operating_temp_c) == (slowdown, shutdown, max_operating)
    assert (gpu.mig_current, gpu.mig_pending) == (mig_current, mig_pending)
    assert gpu.retired_pages is retired
    assert doc.driver_version == "580.159.04" and doc.cuda_version == "13.0"


@pytest.mark.parametrize("document", sorted(NVML_FACTS))
def test_thermal_check_acts_on_derived_thresholds(document: str) -> None:
    """The node layer's thermal check works on driver-580 nodes: at NVML's slowdown (89 C) a warning, at its shutdown
    (95 C) an error; at the recorded temperature nothing."""
    doc = parse_xml((FIXTURES / document).read_bytes())
    assert not [f for f in node.check_node("n1", doc) if f.check == "node.gpu.temperature"]
    for temp, severity in ((89, "warning"), (95, "error")):
        hot = dataclasses.replace(doc, gpus=(dataclasses.replace(doc.gpus[0], temperature_c=temp),))
        [f] = [f for f in node.check_node("n1", hot) if f.check == "node.gpu.temperature"]
        assert f.severity == severity, (temp, f)


# --- the driver's MIG profile tables ------------------------------------------------------------------------------

# (name, instances, memory GiB, SMs, CE, DEC, JPEG, OFA), read from the recorded tables by hand
H100_TABLE = [
    ("1g.10gb", 7, 9.75, 16, 1, 1, 1, 0), ("1g.10gb+me", 1, 9.75, 16, 1, 1, 1, 1), ("1g.20gb", 4, 19.62, 26, 1, 1, 1, 0),
    ("2g.20gb", 3, 19.62, 32, 2, 2, 2, 0), ("3g.40gb", 2, 39.50, 60, 3, 3, 3, 0), ("4g.40gb", 1, 39.50, 64, 4, 4, 4, 0),
    ("7g.80gb", 1, 79.25, 132, 8, 7, 7, 1),
]
H200_TABLE = [
    ("1g.18gb", 7, 16.00, 16, 1, 1, 1, 0), ("1g.18gb+me", 1, 16.00, 16, 1, 1, 1, 1),
    ("1g.35gb", 4, 32.50, 26, 1, 1, 1, 0), ("2g.35gb", 3, 32.50, 32, 2, 2, 2, 0), ("3g.71gb", 2, 69.75, 60, 3, 3, 3, 0),
    ("4g.71gb", 1, 69.75, 64, 4, 4, 4, 0), ("7g.141gb", 1, 140.00, 132, 8, 7, 7, 1),
]
TABLES = {"h100-80gb-hbm3/mig-lgip.txt": ("NVIDIA H100 80GB HBM3", "H100-80GB", H100_TABLE),
          "h200/mig-lgip.txt": ("NVIDIA H200", "H200-141GB", H200_TABLE)}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_parse_lgip(table: str) -> None:
    rows = mig.parse_lgip((FIXTURES / table).read_text())
    got = [(r.name, r.total, r.memory_gib, r.sms, r.ce, r.dec, r.jpeg, r.ofa) for r in rows]
    assert got == TABLES[table][2]
    assert all(r.gpu == 0 and r.free == r.total and not r.p2p and r.enc == 0 for r in rows)
    assert [r.profile_id for r in rows] == [19, 20, 15, 14, 9, 5, 0]


def test_parse_lgip_names_a_bad_line() -> None:
    text = (FIXTURES / "h200/mig-lgip.txt").read_text().replace("16.00      No     16", "16.00      No     xx", 1)
    with pytest.raises(ValueError, match=r"line 6 is not a profile row: .*1g\.18gb"):
        mig.parse_lgip(text)
    lines = (FIXTURES / "h200/mig-lgip.txt").read_text().splitlines()
    with pytest.raises(ValueError, match="line 7: the CE/JPEG/OFA line of 1g.18gb is missing"):
        mig.parse_lgip("\n".join(lines[:6]))


@pytest.mark.parametrize("table", sorted(TABLES))
def test_models_yaml_matches_the_real_table(table: str) -> None:
    """values/mig/models.yaml (from mig-parted's facts) has exactly the profiles and instance counts the driver lists."""
    product, model_name, _ = TABLES[table]
    model = mig.model_of(product)
    assert model is not None and model.name == model_name
    rows = mig.parse_lgip((FIXTURES / table).read_text())
    assert dict(model.profiles) == {r.name: r.total for r in rows}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_shipped_table_is_the_recorded_one(table: str) -> None:
    """values/mig/lgip.yaml holds the recorded table lines unchanged."""
    _, model_name, _ = TABLES[table]
    shipped = {t["model"]: t["table"] for t in yaml.safe_load((ROOT / "values/mig/lgip.yaml").read_text())["tables"]}
    recorded = [ln for ln in (FIXTURES / table).read_text().splitlines() if ln.startswith(("+-", "|"))]
    assert shipped[model_name].splitlines() == recorded


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_profile_of_the_real_table_is_named(table: str) -> None:
    """A MIG device reports its profile's memory (the table's GiB, as MiB) and SMs: each is named as the driver names
    it (`+me` has its base profile's memory and SMs: the base name is what can be told)."""
    product, _, rows = TABLES[table]
    for name, _, gib, sms, *_ in rows:
        want = name.split("+", 1)[0]
        assert mig.profile_of(product, round(gib * 1024), sms) == want, name


# --- the two readers compared -------------------------------------------------------------------------------------

def fake_nvml(doc: NvidiaSmi, facts: tuple[Any, ...]) -> types.SimpleNamespace:
    """pynvml (its real constants and errors) answering for one machine: the README's NVML facts for what NVML was
    recorded reading (thresholds, MIG mode, retired pages not supported); for the rest, which NVML's record does not
    give, the document's own values (those fields compare equal by construction)."""
    import pynvml

    _, slowdown, shutdown, max_operating, mig_current, mig_pending, _ = facts
    g: Gpu = doc.gpus[0]
    not_supported = pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def raise_ns(*_: Any) -> Any:
        raise not_supported

    thresholds = {pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: slowdown,
                  pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: shutdown,
                  pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: max_operating}
    ns = types.SimpleNamespace(**{k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML", "nvmlErr"))})
    ns.nvmlInit = ns.nvmlShutdown = lambda: None
    ns.nvmlSystemGetCudaDriverVersion_v2 = lambda: 13000
    ns.nvmlSystemGetCudaDriverVersion = lambda: 13000
    ns.nvmlSystemGetDriverVersion = lambda: doc.driver_version
    ns.nvmlDeviceGetCount = lambda: 1
    ns.nvmlDeviceGetHandleByIndex = lambda i: "h0"
    ns.nvmlDeviceGetName = lambda h: g.product_name
    ns.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=g.pci_bus_id.encode())
    ns.nvmlDeviceGetMigMode = lambda h: [int(mig_current), int(mig_pending)]
    ns.nvmlDeviceGetEccMode = lambda h: [1, 1]
    ns.nvmlDeviceGetRetiredPages = raise_ns
    ns.nvmlDeviceGetRetiredPagesPendingStatus = raise_ns
    ns.nvmlDeviceGetRemappedRows = lambda h: (0, 0, 0, 0)
    ns.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x1 if g.throttle_reasons else 0
    ns.nvmlDeviceGetTemperature = lambda h, sensor: g.temperature_c
    ns.nvmlDeviceGetTemperatureThreshold = lambda h, which: thresholds[which]
    ns.nvmlDeviceGetPowerUsage = lambda h: 75_000  # mW: a reading of its own moment
    ns.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    ns.nvmlDeviceGetUUID = lambda h: g.uuid
    ns.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=81559 * 1024 * 1024)
    ns.nvmlDeviceGetMinorNumber = lambda h: 0
    ns.nvmlDeviceGetPersistenceMode = lambda h: 1
    ns.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: 0
    ns.nvmlDeviceGetFanSpeed = raise_ns
    # the fabric as the document says it (state 0: not supported, nvidia-smi's N/A)
    states = {None: 0, "Not Started": 1, "In Progress": 2, "Completed": 3}
    ns.c_nvmlGpuFabricInfo_t = pynvml.c_nvmlGpuFabricInfo_t

    def fabric(h: Any, ref: Any) -> int:
        if g.fabric is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        ref._obj.state = states[g.fabric.state]
        ref._obj.status = pynvml.NVML_SUCCESS
        return pynvml.NVML_SUCCESS

    ns.nvmlDeviceGetGpuFabricInfo = fabric
    return ns


@pytest.mark.parametrize("document", sorted(NVML_FACTS))
def test_xml_and_nvml_agree_but_for_explained_fields(document: str) -> None:
    doc = parse_xml((FIXTURES / document).read_bytes())
    nvml = local.read_nvml(fake_nvml(doc, NVML_FACTS[document]))
    assert isinstance(nvml, NvidiaSmi)
    assert nvml.gpus[0].retired_pages is None  # the same shape as the XML's all-N/A block
    diffs = compare.compare(doc, nvml)
    assert compare.unexplained(diffs) == []
    assert {d.field for d in diffs} == {"dtd_version", "timestamp", "power_draw_w"}
    assert "0 unexplained" in compare.report(diffs, compare.fields_compared(doc))


@pytest.mark.parametrize("document", sorted(NVML_FACTS))
def test_compare_flags_thresholds_lost_from_the_xml(document: str) -> None:
    """What the parser read before T.Limit margins were used (no thresholds) is three unexplained differences."""
    doc = parse_xml((FIXTURES / document).read_bytes())
    nvml = local.read_nvml(fake_nvml(doc, NVML_FACTS[document]))
    assert isinstance(nvml, NvidiaSmi)
    lost = dataclasses.replace(doc, gpus=(dataclasses.replace(doc.gpus[0], slowdown_temp_c=None, shutdown_temp_c=None,
                                                              max_operating_temp_c=None),))
    bad = compare.unexplained(compare.compare(lost, nvml))
    assert [(d.field, d.xml, d.nvml) for d in bad] == [
        ("slowdown_temp_c", None, 89), ("shutdown_temp_c", None, 95), ("max_operating_temp_c", None, 87)]
    assert "UNEXPLAINED" in bad[0].line()


def test_compare_pairs_gpus_and_reports_missing_ones() -> None:
    doc = parse_xml((FIXTURES / "h200-580-v13.xml").read_bytes())
    other = dataclasses.replace(doc, gpus=(dataclasses.replace(doc.gpus[0], uuid="GPU-other"),))
    fields = [(d.where.split(" (")[0], d.field, d.explained) for d in compare.compare(doc, other)]
    assert fields == [("GPU 0", "gpu", None), ("GPU 0", "gpu", None)]


def test_compare_main_on_a_saved_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    """`python -m installer.validate.compare --xml FILE --json OUT`: NVML read in-process (here the fake), the exit
    code says whether anything is unexplained."""
    doc_path = FIXTURES / "h100-80gb-hbm3-580-v13.xml"
    doc = parse_xml(doc_path.read_bytes())
    fake = fake_nvml(doc, NVML_FACTS["h100-80gb-hbm3-580-v13.xml"])
    monkeypatch.setattr(local, "read_nvml", lambda nvml=None: local.__dict__["_read"](fake))
    out = tmp_path / "compare.json"
    assert compare.main(["--xml", str(doc_path), "--json", str(out)]) == 0
    assert "0 unexplained" in capsys.readouterr().out
    import json

    assert json.loads(out.read_text())["unexplained"] == 0
    fake.nvmlDeviceGetTemperatureThreshold = lambda h, which: 90  # NVML disagrees: unexplained
    assert compare.main(["--xml", str(doc_path)]) == 6
    assert "slowdown_temp_c: XML 89 vs NVML 90 (UNEXPLAINED)" in capsys.readouterr().out


@pytest.mark.parametrize("state,status,expect", [
    (0, 0, (None, None)), (1, 0, ("Not Started", None)), (2, 0, ("In Progress", None)), (3, 0, ("Completed", "Success")),
    (3, 23, ("Completed", "Insufficient Resources")), ("missing", 0, None), ("unsupported", 0, (None, None)),
])
def test_nvml_reads_the_fabric_as_nvidia_smi_words_it(state: Any, status: int, expect: Any) -> None:
    """nvmlDeviceGetGpuFabricInfo's state and status in nvidia-smi's words (node.fabric judges them alike from either
    reader); no such call: None (not read); the GPU cannot tell: N/A."""
    import pynvml

    ns = types.SimpleNamespace(NVMLError=pynvml.NVMLError, NVML_SUCCESS=pynvml.NVML_SUCCESS,
                               NVMLError_FunctionNotFound=pynvml.NVMLError_FunctionNotFound,
                               c_nvmlGpuFabricInfo_t=pynvml.c_nvmlGpuFabricInfo_t,
                               nvmlErrorString=lambda code: b"Insufficient Resources" if code == 23 else b"?")

    def info(h: Any, ref: Any) -> int:
        if state == "unsupported":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        ref._obj.state, ref._obj.status = state, status
        return 0

    if state != "missing":
        ns.nvmlDeviceGetGpuFabricInfo = info
    got = local._fabric(ns, "h0")
    assert (None if got is None else (got.state, got.status)) == expect
