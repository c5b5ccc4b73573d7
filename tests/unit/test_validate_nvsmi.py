"""installer.validate.nvsmi (parsing `nvidia-smi -q -x`) and installer.validate.node (node checks).

Every expected value below was read from the recorded document (tests/fixtures/nvidia-smi/README.md gives each
one's source). Node checks run on the parsed corpus and on copies mutated here, never on edited fixture files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from installer.validate import node, nvsmi
from installer.validate.node import Expectations, check_node, nvidia_pci_devices
from installer.validate.nvsmi import (
    DriverNotLoaded,
    EccErrors,
    MigDevice,
    NvidiaSmi,
    NvidiaSmiError,
    RemappedRows,
    RetiredPages,
    parse_output,
    parse_xml,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi"
NO_ECC = EccErrors(volatile_double_bit=None, aggregate_double_bit=None)
NO_RETIRED = None  # every retired_pages value N/A: page retirement not supported, as NVML says it


def a100_mig(index: int, gi: int, sms: int, profile: str) -> MigDevice:
    return MigDevice(index=index, gpu_instance_id=gi, compute_instance_id=0, multiprocessors=sms, memory_mib=19968,
                     profile=profile, uuid=None)


# file → (document fields, the one GPU's fields)
CORPUS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "a100-sxm4-v12.xml": (
        dict(dtd_version=12, timestamp="Fri Aug  4 11:44:30 2023", driver_version="535.54.03", cuda_version="12.2",
             attached_gpus=4),
        dict(index=0, minor_number=1, uuid="GPU-513536b6-7d19-9063-b049-1e69664bb298",
             product_name="NVIDIA A100-SXM4-80GB", pci_bus_id="00000000:01:00.0", persistence_mode=False,
             mig_current=True, mig_pending=True,
             mig_devices=tuple(a100_mig(i, 3 + i, 14, "1g.20gb") for i in range(4)),
             ecc_current=True, ecc_pending=True, ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0),
             retired_pages=NO_RETIRED, remapped_rows=None, throttle_reasons=(), temperature_c=27,
             slowdown_temp_c=89, shutdown_temp_c=92, max_operating_temp_c=85, power_draw_w=67.03,
             power_limit_w=500.0, fan_speed_pct=None, fabric=nvsmi.Fabric(None, None)),
    ),
    "corpus/a100-sxm4-40gb-mig-v11.xml": (
        dict(dtd_version=11, timestamp="Fri Jan 27 11:32:31 2023", driver_version="510.47.03", cuda_version="11.6",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-27b94a00-ed54-5c24-b1fd-1054085de32a",
             product_name="NVIDIA A100-SXM4-40GB", pci_bus_id="00000000:00:04.0", persistence_mode=False,
             mig_current=True, mig_pending=True,
             mig_devices=(a100_mig(0, 1, 42, "3g.20gb"), a100_mig(1, 2, 42, "3g.20gb")),
             ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=None, aggregate_double_bit=0),  # volatile counters all N/A
             retired_pages=NO_RETIRED, remapped_rows=None, throttle_reasons=(), temperature_c=36,
             slowdown_temp_c=89, shutdown_temp_c=92, max_operating_temp_c=85, power_draw_w=66.92,
             power_limit_w=400.0, fan_speed_pct=None, fabric=None),
    ),
    "tesla-t4.xml": (
        dict(dtd_version=11, timestamp="Mon Apr 24 16:22:39 2023", driver_version="515.105.01", cuda_version="11.7",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a", product_name="Tesla T4",
             pci_bus_id="00000000:00:1E.0", persistence_mode=False, mig_current=None, mig_pending=None,
             mig_devices=(), ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0),
             retired_pages=RetiredPages(single_bit=0, double_bit=0, pending=False), remapped_rows=None,
             throttle_reasons=(), temperature_c=40, slowdown_temp_c=93, shutdown_temp_c=96, max_operating_temp_c=85,
             power_draw_w=26.78, power_limit_w=70.0, fan_speed_pct=None, fabric=None),
    ),
    "corpus/tesla-p100-pcie-v11.xml": (
        dict(dtd_version=11, timestamp="Sat Sep 17 17:06:50 2022", driver_version="510.47.03", cuda_version="11.6",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e",
             product_name="Tesla P100-PCIE-16GB", pci_bus_id="00000000:00:04.0", persistence_mode=False,
             mig_current=None, mig_pending=None, mig_devices=(), ecc_current=True, ecc_pending=True,
             # Pascal layout: volatile|aggregate/double_bit/total (aggregate single_bit/total is 3)
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0),
             retired_pages=RetiredPages(single_bit=0, double_bit=0, pending=False), remapped_rows=None,
             throttle_reasons=("gpu_idle",), temperature_c=38, slowdown_temp_c=82, shutdown_temp_c=85,
             max_operating_temp_c=None, power_draw_w=26.16, power_limit_w=250.0, fan_speed_pct=None, fabric=None),
    ),
    "corpus/quadro-p400.xml": (
        dict(dtd_version=None, timestamp="Mon Mar 11 17:03:27 2019", driver_version="418.43", cuda_version="10.1",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-8f750be4-dfbc-23b9-b33f-da729a536494", product_name="Quadro P400",
             pci_bus_id="00000000:43:00.0", persistence_mode=False, mig_current=None, mig_pending=None,
             mig_devices=(), ecc_current=None, ecc_pending=None, ecc_errors=NO_ECC, retired_pages=NO_RETIRED,
             remapped_rows=None, throttle_reasons=("gpu_idle",), temperature_c=33, slowdown_temp_c=100,
             shutdown_temp_c=103, max_operating_temp_c=None, power_draw_w=None, power_limit_w=None,
             fan_speed_pct=34, fabric=None),
    ),
    "corpus/rtx-3090-v12.xml": (
        dict(dtd_version=12, timestamp="Fri May  3 11:54:37 2024", driver_version="525.147.05", cuda_version="12.0",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
             product_name="NVIDIA GeForce RTX 3090", pci_bus_id="00000000:00:10.0", persistence_mode=True,
             mig_current=None, mig_pending=None, mig_devices=(), ecc_current=None, ecc_pending=None,
             ecc_errors=NO_ECC, retired_pages=NO_RETIRED, remapped_rows=None,
             throttle_reasons=("gpu_idle",),  # clocks_throttle_reasons under the v12 DTD
             temperature_c=37, slowdown_temp_c=95, shutdown_temp_c=98, max_operating_temp_c=93,
             power_draw_w=27.23, power_limit_w=200.0, fan_speed_pct=0, fabric=nvsmi.Fabric(None, None)),
    ),
    "corpus/rtx-4090-535-v12.xml": (
        dict(dtd_version=12, timestamp="Mon Aug 7 11:10:06 2023", driver_version="535.86.05", cuda_version="12.2",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-71d1acc2-662d-2166-bf9f-65272d2fc437",
             product_name="NVIDIA GeForce RTX 4090", pci_bus_id="00000000:84:00.0", persistence_mode=True,
             mig_current=None, mig_pending=None, mig_devices=(), ecc_current=False, ecc_pending=False,
             ecc_errors=NO_ECC, retired_pages=NO_RETIRED,
             remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
             throttle_reasons=("gpu_idle",),  # clocks_event_reasons
             # only T.Limit margins in this document (40 C, T.Limit headroom 43, margins -2/-7/0): derived as on
             # H100/H200 (installer/validate/nvsmi.py), 83 + 2 and 83 + 7; no NVML reading of this card to compare
             temperature_c=40, slowdown_temp_c=85, shutdown_temp_c=90, max_operating_temp_c=83, power_draw_w=26.84, power_limit_w=450.0, fan_speed_pct=0, fabric=nvsmi.Fabric(None, None)),
    ),
    "corpus/a10g-v11.xml": (
        dict(dtd_version=11, timestamp="Mon Apr 24 16:11:51 2023", driver_version="515.105.01", cuda_version="11.7",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94", product_name="NVIDIA A10G",
             pci_bus_id="00000000:00:1E.0", persistence_mode=False, mig_current=None, mig_pending=None,
             mig_devices=(), ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0), retired_pages=NO_RETIRED,
             remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
             throttle_reasons=("gpu_idle",), temperature_c=17, slowdown_temp_c=95, shutdown_temp_c=98,
             max_operating_temp_c=88, power_draw_w=25.58, power_limit_w=300.0, fan_speed_pct=0, fabric=None),
    ),
    "corpus/rtx-3080-v13.xml": (
        dict(dtd_version=13, timestamp="Fri Apr 10 10:23:01 2026", driver_version="595.58.03", cuda_version="13.2",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
             product_name="NVIDIA GeForce RTX 3080", pci_bus_id="00000000:0C:00.0", persistence_mode=False,
             mig_current=None, mig_pending=None, mig_devices=(), ecc_current=None, ecc_pending=None,
             ecc_errors=NO_ECC, retired_pages=NO_RETIRED, remapped_rows=None, throttle_reasons=(),
             temperature_c=27, slowdown_temp_c=95, shutdown_temp_c=98, max_operating_temp_c=93,
             power_draw_w=142.33,  # instant_power_draw (average_power_draw is 139.62)
             power_limit_w=320.0, fan_speed_pct=0, fabric=nvsmi.Fabric(None, None)),
    ),
    # Real H100 / H200 on driver 580 (tests/fixtures/nvidia-smi/README.md): no absolute temperature thresholds in the
    # document, only T.Limit margins; the thresholds here are NVML's on the same machines (89/95/87 C), not the XML's.
    "h100-80gb-hbm3-580-v13.xml": (
        dict(dtd_version=13, timestamp="Thu Nov 26 10:03:37 2026", driver_version="580.159.04", cuda_version="13.0",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-214dfeee-f8c8-f8d2-7e4e-f078d372d5a0",
             product_name="NVIDIA H100 80GB HBM3", pci_bus_id="00000000:00:06.0", persistence_mode=True,
             mig_current=False, mig_pending=False, mig_devices=(), ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0), retired_pages=None,
             remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
             throttle_reasons=("gpu_idle",), temperature_c=36, slowdown_temp_c=89, shutdown_temp_c=95,
             max_operating_temp_c=87, power_draw_w=71.81, power_limit_w=700.0, fan_speed_pct=None, fabric=nvsmi.Fabric(None, None)),
    ),
    "h200-580-v13.xml": (
        dict(dtd_version=13, timestamp="Thu Nov 26 10:05:50 2026", driver_version="580.159.04", cuda_version="13.0",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-af8d6c48-55af-fd5f-dead-4a982160bd0d",
             product_name="NVIDIA H200", pci_bus_id="00000000:00:06.0", persistence_mode=True,
             mig_current=False, mig_pending=False, mig_devices=(), ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0), retired_pages=None,
             remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
             throttle_reasons=("gpu_idle",), temperature_c=36, slowdown_temp_c=89, shutdown_temp_c=95,
             max_operating_temp_c=87, power_draw_w=80.14, power_limit_w=700.0, fan_speed_pct=None, fabric=nvsmi.Fabric(None, None)),
    ),
    "corpus/h200-580-v13-with-process.xml": (
        dict(dtd_version=13, timestamp="Thu Nov 26 10:06:06 2026", driver_version="580.159.04", cuda_version="13.0",
             attached_gpus=1),
        dict(index=0, minor_number=0, uuid="GPU-af8d6c48-55af-fd5f-dead-4a982160bd0d",
             product_name="NVIDIA H200", pci_bus_id="00000000:00:06.0", persistence_mode=True,
             mig_current=False, mig_pending=False, mig_devices=(), ecc_current=True, ecc_pending=True,
             ecc_errors=EccErrors(volatile_double_bit=0, aggregate_double_bit=0), retired_pages=None,
             remapped_rows=RemappedRows(correctable=0, uncorrectable=0, pending=False, failure=False),
             throttle_reasons=(),  # a CUDA process holds the GPU: not idle
             temperature_c=37, slowdown_temp_c=89, shutdown_temp_c=95,
             max_operating_temp_c=87, power_draw_w=123.23, power_limit_w=700.0, fan_speed_pct=None, fabric=nvsmi.Fabric(None, None)),
    ),
}


def load(name: str) -> NvidiaSmi:
    return parse_xml((FIXTURES / name).read_bytes())


def test_corpus_covers_every_document() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.xml")}
    assert on_disk == set(CORPUS)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_document_fields(name: str) -> None:
    doc_fields, gpu_fields = CORPUS[name]
    doc = load(name)
    for field, want in doc_fields.items():
        assert getattr(doc, field) == want, f"{name}: {field}"
    assert len(doc.gpus) == 1
    gpu = doc.gpus[0]
    assert {f.name for f in dataclasses.fields(gpu)} == set(gpu_fields), "every Gpu field is checked"
    for field, want in gpu_fields.items():
        assert getattr(gpu, field) == want, f"{name}: gpu.{field}"


def test_mig_profiles_match_the_recorded_nvidia_smi_l() -> None:
    """The -L output of the A100-80GB machine names its 4 MIG devices 1g.20gb; the profile derived from the XML
    must say the same."""
    listed = (FIXTURES / "a100-sxm4-80gb-mig-L.txt").read_text()
    assert listed.count("MIG 1g.20gb") == 4
    assert [d.profile for d in load("a100-sxm4-v12.xml").gpus[0].mig_devices] == ["1g.20gb"] * 4


@pytest.mark.parametrize("product, mib, sms, total, want", [
    # no recorded driver table for A100: SM count (14 a slice) and the share of the GPU's memory (8 slices)
    ("NVIDIA A100-SXM4-40GB", 4864, 14, 40960, "1g.5gb"),
    ("NVIDIA A100-SXM4-40GB", 9856, 14, 40960, "1g.10gb"),   # 1g.10gb and 2g.10gb share the memory: SMs decide
    ("NVIDIA A100-SXM4-40GB", 9856, 28, 40960, "2g.10gb"),
    ("NVIDIA A100-SXM4-40GB", 9856, None, 40960, None),      # …and without them it cannot be told
    ("NVIDIA A100-SXM4-40GB", 9856, 14, None, None),         # nor without the GPU's memory
    ("NVIDIA A100-SXM4-40GB", 40192, 98, 40960, "7g.40gb"),
    # H100 / H200: the driver's own table (values/mig/lgip.yaml); memory as `mig -lgip` gives it (GiB x 1024)
    ("NVIDIA H100 80GB HBM3", 40448, 60, None, "3g.40gb"),
    ("NVIDIA H100 80GB HBM3", 40448, 64, None, "4g.40gb"),
    ("NVIDIA H100 80GB HBM3", 81152, 132, None, "7g.80gb"),
    ("NVIDIA H200", 16384, 16, None, "1g.18gb"),             # 16.00 GiB: not 18 GB, named by the driver's table
    ("NVIDIA H200", 33280, 26, None, "1g.35gb"),             # 32.50 GiB, 26 SMs
    ("NVIDIA H200", 33280, 32, None, "2g.35gb"),             # 32.50 GiB, 32 SMs
    ("NVIDIA H200", 33280, None, None, None),                # 1g.35gb or 2g.35gb: the SMs decide
    ("NVIDIA H200", 33280, 16, None, None),                  # no profile has 16 SMs and 32.5 GiB
    ("Tesla T4", 15000, 40, 15360, None),                    # not a MIG model
    ("NVIDIA A100-SXM4-40GB", 30000, 42, 40960, None),       # no profile of that size
])
def test_mig_profile(product: str, mib: int, sms: int | None, total: int | None, want: str | None) -> None:
    assert nvsmi.mig_profile(product, mib, sms, total) == want


# --- malformed documents and nvidia-smi failures ------------------------------------------------------------------

def test_truncated_document_is_a_clear_error() -> None:
    text = (FIXTURES / "tesla-t4.xml").read_text()
    with pytest.raises(NvidiaSmiError, match="not well-formed XML.*line"):
        parse_xml(text[: len(text) // 2])


def test_wrong_root_element() -> None:
    with pytest.raises(NvidiaSmiError, match="root element is <gpus>"):
        parse_xml("<gpus><gpu/></gpus>")


def test_a_value_of_the_wrong_kind_names_the_gpu_and_element() -> None:
    text = (FIXTURES / "tesla-t4.xml").read_text().replace("<gpu_temp>40 C</gpu_temp>", "<gpu_temp>hot</gpu_temp>")
    with pytest.raises(NvidiaSmiError, match=r"GPU 0 \(00000000:00:1E.0\): <gpu_temp> is 'hot'"):
        parse_xml(text)
    text = (FIXTURES / "tesla-t4.xml").read_text().replace("<current_ecc>Enabled</current_ecc>",
                                                            "<current_ecc>Maybe</current_ecc>")
    with pytest.raises(NvidiaSmiError, match="ecc_mode/current_ecc> is 'Maybe'"):
        parse_xml(text)


def test_entities_are_refused() -> None:
    with pytest.raises(NvidiaSmiError, match="entities"):
        parse_xml('<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>')


def test_missing_elements_are_none() -> None:
    doc = parse_xml("<nvidia_smi_log><gpu id='00000000:3B:00.0'><product_name>X</product_name></gpu></nvidia_smi_log>")
    assert doc.driver_version is None and doc.attached_gpus is None and doc.dtd_version is None
    gpu = doc.gpus[0]
    assert gpu.pci_bus_id == "00000000:3B:00.0"  # from the gpu id attribute when pci/pci_bus_id is absent
    assert gpu.throttle_reasons is None and gpu.retired_pages is None and gpu.remapped_rows is None
    assert gpu.ecc_errors == NO_ECC and gpu.mig_devices == () and gpu.temperature_c is None


def test_driver_not_loaded_is_a_result() -> None:
    said = (FIXTURES / "corpus" / "driver-not-loaded.txt").read_text()
    result = parse_output(said, 9)
    assert result == DriverNotLoaded(9, said.strip())
    # the message alone says it too (a wrapper that lost the exit code)
    assert isinstance(parse_output(said.encode(), 1), DriverNotLoaded)


def test_other_failures_raise_with_nvidia_smis_words() -> None:
    with pytest.raises(NvidiaSmiError, match="exited with code 18: Failed to initialize NVML: Driver/library"):
        parse_output("Failed to initialize NVML: Driver/library version mismatch\n", 18)


def test_parse_output_success() -> None:
    assert parse_output((FIXTURES / "tesla-t4.xml").read_bytes(), 0) == load("tesla-t4.xml")


# --- node checks -------------------------------------------------------------------------------------------------

def checks(findings: list[node.Finding]) -> list[tuple[str, str]]:
    return [(f.check, f.severity) for f in findings]


def with_gpu(doc: NvidiaSmi, **changes: Any) -> NvidiaSmi:
    return dataclasses.replace(doc, gpus=(dataclasses.replace(doc.gpus[0], **changes),))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_recorded_documents_are_healthy_but_for_persistence(name: str) -> None:
    doc = load(name)
    want = [] if doc.gpus[0].persistence_mode else [("node.gpu.persistence", "warning")]
    assert checks(check_node("gpu-node-1", doc)) == want


def test_every_gpu_finding_names_host_and_gpu() -> None:
    doc = with_gpu(load("a100-sxm4-v12.xml"), mig_pending=False, ecc_errors=EccErrors(2, 7),
                   retired_pages=RetiredPages(1, 2, True), temperature_c=95,
                   throttle_reasons=("hw_thermal_slowdown",))
    findings = check_node("gpu-node-7", doc)
    assert {f.check for f in findings} == {"node.gpu.persistence", "node.mig.pending", "node.gpu.ecc-dbe",
                                           "node.gpu.retired-pages-pending", "node.gpu.temperature",
                                           "node.gpu.throttle"}
    for f in findings:
        assert f.host == "gpu-node-7" and f.message.startswith("gpu-node-7 GPU 0 (GPU-513536b6-")
        assert f.gpu_index == 0 and f.gpu_uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
        assert f.fix


def test_mig_pending_from_a_mutated_document() -> None:
    text = (FIXTURES / "a100-sxm4-v12.xml").read_text()
    assert text.count("<pending_mig>Enabled</pending_mig>") == 1
    doc = parse_xml(text.replace("<pending_mig>Enabled</pending_mig>", "<pending_mig>Disabled</pending_mig>"))
    [f] = [f for f in check_node("n1", doc) if f.check == "node.mig.pending"]
    assert f.severity == "error" and "MIG mode is enabled, disabled is pending" in f.message
    assert "reset" in f.fix and "reboot" in f.fix


def test_double_bit_errors_from_a_mutated_document() -> None:
    text = (FIXTURES / "corpus" / "tesla-p100-pcie-v11.xml").read_text()
    # the volatile double_bit total of the Pascal layout is the second <total>0</total> in the volatile block
    volatile = text.index("<volatile>")
    double = text.index("<double_bit>", volatile)
    total = text.index("<total>0</total>", double)
    doc = parse_xml(text[:total] + "<total>3</total>" + text[total + len("<total>0</total>"):])
    assert doc.gpus[0].ecc_errors == EccErrors(volatile_double_bit=3, aggregate_double_bit=0)
    [f] = [f for f in check_node("n1", doc) if f.check == "node.gpu.ecc-dbe"]
    assert f.severity == "error" and "3 double-bit" in f.message
    assert "drain the node" in f.fix and "RMA" in f.fix


def test_uncorrectable_counters_sum_in_the_turing_layout() -> None:
    text = (FIXTURES / "tesla-t4.xml").read_text()
    aggregate = text.index("<aggregate>")
    dram = text.index("<dram_uncorrectable>0</dram_uncorrectable>", aggregate)
    text = text[:dram] + "<dram_uncorrectable>2</dram_uncorrectable>" + text[dram + 41:]
    sram = text.index("<sram_uncorrectable>0</sram_uncorrectable>", aggregate)
    text = text[:sram] + "<sram_uncorrectable>1</sram_uncorrectable>" + text[sram + 41:]
    doc = parse_xml(text)
    assert doc.gpus[0].ecc_errors == EccErrors(volatile_double_bit=0, aggregate_double_bit=3)
    [f] = [f for f in check_node("n1", doc) if f.check == "node.gpu.ecc-dbe"]
    assert f.severity == "warning"  # lifetime only: none since the driver loaded


def test_retired_pages_pending() -> None:
    doc = with_gpu(load("corpus/tesla-p100-pcie-v11.xml"), retired_pages=RetiredPages(0, 1, True))
    [f] = [f for f in check_node("n1", doc) if f.check == "node.gpu.retired-pages-pending"]
    assert f.severity == "error" and "1 page(s) retired for double-bit" in f.message


@pytest.mark.parametrize("rows, check", [
    (RemappedRows(0, 3, False, True), "node.gpu.row-remap-failure"),
    (RemappedRows(0, 1, True, False), "node.gpu.row-remap-pending"),
])
def test_row_remapping(rows: RemappedRows, check: str) -> None:
    doc = with_gpu(load("corpus/rtx-4090-535-v12.xml"), remapped_rows=rows)
    assert checks(check_node("n1", doc)) == [(check, "error")]


def test_throttle_only_for_hardware_reasons() -> None:
    doc = load("corpus/rtx-3090-v12.xml")
    assert doc.gpus[0].throttle_reasons == ("gpu_idle",)
    assert check_node("n1", with_gpu(doc, throttle_reasons=("gpu_idle", "sw_power_cap"))) == []
    found = check_node("n1", with_gpu(doc, throttle_reasons=("hw_slowdown", "hw_power_brake_slowdown")))
    assert checks(found) == [("node.gpu.throttle", "warning")] * 2
    assert "power brake" in found[1].message


def test_throttle_reason_names_in_both_layouts() -> None:
    for name, block in (("corpus/rtx-3090-v12.xml", "clocks_throttle_reason"),
                        ("corpus/rtx-3080-v13.xml", "clocks_event_reason")):
        text = (FIXTURES / name).read_text()
        tag = f"<{block}_hw_thermal_slowdown>Not Active</{block}_hw_thermal_slowdown>"
        assert text.count(tag) == 1
        doc = parse_xml(text.replace(tag, tag.replace("Not Active", "Active")))
        assert "hw_thermal_slowdown" in (doc.gpus[0].throttle_reasons or ())
        assert ("node.gpu.throttle", "warning") in checks(check_node("n1", doc))


@pytest.mark.parametrize("temp, want", [(92, []), (93, [("node.gpu.temperature", "warning")]),
                                        (96, [("node.gpu.temperature", "error")])])
def test_temperature_against_thresholds(temp: int, want: list[tuple[str, str]]) -> None:
    doc = with_gpu(load("tesla-t4.xml"), temperature_c=temp, persistence_mode=True)  # T4: slowdown 93, shutdown 96
    assert checks(check_node("n1", doc)) == want


def test_power_over_limit() -> None:
    doc = with_gpu(load("corpus/rtx-4090-535-v12.xml"), power_draw_w=460.5)
    [f] = check_node("n1", doc)
    assert f.check == "node.gpu.power" and "460.5 W, over its 450 W limit" in f.message


@pytest.mark.parametrize("pin, ok", [("515", True), ("515.105.01", True), ("535", False), ("515.105.02", False),
                                     ("51", False), ("515.105", False)])
def test_driver_version_against_the_pin(pin: str, ok: bool) -> None:
    doc = with_gpu(load("tesla-t4.xml"), persistence_mode=True)
    found = check_node("n1", doc, Expectations(driver_version=pin))
    assert checks(found) == ([] if ok else [("node.driver.version", "error")])
    if not ok:
        assert "driver 515.105.01 is loaded" in found[0].message and pin in found[0].message


LSPCI = """\
0000:00:02.0 VGA compatible controller [0300]: Intel Corporation UHD Graphics 630 [8086:3e92]
0000:00:1e.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)
0000:00:1f.0 3D controller [0302]: NVIDIA Corporation TU104GL [Tesla T4] [10de:1eb8] (rev a1)
0000:65:00.1 Audio device [0403]: NVIDIA Corporation TU104 HD Audio Controller [10de:10f8] (rev a1)
0000:65:00.2 USB controller [0c03]: NVIDIA Corporation TU104 USB 3.1 Host Controller [10de:1ad8] (rev a1)
0000:c1:00.0 Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch] [10de:22a3] (rev a1)
"""


def test_nvidia_pci_devices() -> None:
    assert nvidia_pci_devices(LSPCI) == ("0000:00:1e.0", "0000:00:1f.0")
    assert nvidia_pci_devices(["01:00.0 VGA compatible controller: NVIDIA Corporation GA102 [GeForce RTX 3090] "
                               "(rev a1)", "01:00.1 Audio device: NVIDIA Corporation GA102 (rev a1)"]) \
        == ("0000:01:00.0",)
    assert node.normalize_bus_id("00000000:00:1E.0") == "0000:00:1e.0"


def test_gpu_count_against_pci() -> None:
    doc = with_gpu(load("tesla-t4.xml"), persistence_mode=True)
    assert check_node("n1", doc, pci_devices=["0000:00:1e.0"]) == []
    [f] = check_node("n1", doc, pci_devices=nvidia_pci_devices(LSPCI))
    assert (f.check, f.severity) == ("node.gpu.count", "error")
    assert "shows 1 GPU(s), the PCI bus has 2" in f.message and "0000:00:1f.0" in f.message
    [f] = check_node("n1", doc, pci_devices=[])
    assert (f.check, f.severity) == ("node.gpu.count", "warning")


@pytest.mark.parametrize("config, want", [
    ("all-1g.20gb", []), ("all-balanced", []), ("all-enabled", []),
    ("all-1g.10gb", ["MIG devices 1g.20gb found, config all-1g.10gb wants only 1g.10gb"]),
    ("all-disabled", ["MIG is enabled, the node's MIG config is all-disabled"]),
])
def test_mig_layout(config: str, want: list[str]) -> None:
    doc = with_gpu(load("a100-sxm4-v12.xml"), persistence_mode=True)
    found = check_node("n1", doc, Expectations(mig_config=config))
    assert [f.check for f in found] == ["node.mig.layout"] * len(want)
    for f, text in zip(found, want, strict=True):
        assert text in f.message


def test_mig_layout_on_a_gpu_with_mig_off() -> None:
    doc = with_gpu(load("a100-sxm4-v12.xml"), persistence_mode=True, mig_current=False, mig_pending=False,
                   mig_devices=())
    [f] = check_node("n1", doc, Expectations(mig_config="all-1g.20gb"))
    assert "MIG is disabled, the node's MIG config is all-1g.20gb" in f.message
    assert check_node("n1", doc, Expectations(mig_config="all-disabled")) == []
    # a GPU without MIG (mig_mode N/A) is not judged against a MIG layout
    assert check_node("n1", with_gpu(load("tesla-t4.xml"), persistence_mode=True),
                      Expectations(mig_config="all-1g.10gb")) == []


def test_driver_not_loaded_finding() -> None:
    result = parse_output((FIXTURES / "corpus" / "driver-not-loaded.txt").read_text(), 9)
    [f] = check_node("gpu-node-3", result, Expectations(driver_version="535"), pci_devices=["0000:01:00.0"])
    assert (f.check, f.severity, f.host) == ("node.driver.not-loaded", "error", "gpu-node-3")
    assert f.message.startswith("gpu-node-3: the NVIDIA driver is not loaded (1 NVIDIA GPU(s) on PCI): "
                                "nvidia-smi exited 9: NVIDIA-SMI has failed")
    for cause in ("reboot", "nouveau", "Secure Boot"):
        assert cause in f.fix
    [f] = check_node("gpu-node-3", result, nouveau_loaded=True)
    assert f.fix.startswith("nouveau holds the GPU")
    [f] = check_node("gpu-node-3", result, reboot_required=True, secure_boot=True)
    assert f.fix.startswith("a reboot is pending") and "; Secure Boot is on" in f.fix


def test_power_limit_is_the_enforced_one() -> None:
    """The recorded v12 documents run at their default limit; a copy with the limit lowered tells the current limit
    from the default."""
    text = (FIXTURES / "corpus" / "rtx-4090-535-v12.xml").read_text()
    tag = "<current_power_limit>450.00 W</current_power_limit>"
    assert text.count(tag) == 1
    doc = parse_xml(text.replace(tag, "<current_power_limit>300.00 W</current_power_limit>"))
    assert doc.gpus[0].power_limit_w == 300.0
    [f] = check_node("n1", with_gpu(doc, power_draw_w=310.0))
    assert f.check == "node.gpu.power"
