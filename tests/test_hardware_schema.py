"""The hardware schema: NVLink domain vs host, host link, host memory, storage, capacities as
nvidia-smi reports them, and the new profiles (hgx-h800, gb200-nvl72)."""

from __future__ import annotations

import yaml
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner import catalog
from planner.errors import UsageError
from planner.specs import HardwareProfile

from .test_cli import run

MIB = 2**20
GIB = 2**30

# Usable HBM as nvidia-smi reports it, in MiB, and the source each profile cites for it. The
# bytes are MiB x 2^20: e.g. 81,559 MiB = 81,559 x 2^20 B = 85,520,809,984 B = 79.65 GiB.
NVIDIA_SMI_MIB = {
    "dgx-a100-40g": 40_960,   # bottlerocket-core-kit PR #834 (driver 580.126.09): 40960MiB
    "dgx-a100-80g": 81_920,   # NVIDIA/mig-parted issue #31 (driver 545.23.08): 81920MiB
    "dgx-h100": 81_559,       # MLPerf Training v4.0 Eos: "81559 MiB"
    "hgx-h800": 81_559,       # assumed = H100 SXM5 80GB (no H800 total found; profile says so)
    "dgx-h200": 143_771,      # MLPerf Training v4.0 H200: "143771 MiB"
    "dgx-b200": 183_359,      # NVIDIA/TensorRT-LLM issue #10278 (driver 580.95.05): 183359MiB
    "gb200-nvl72": 189_471,   # MLPerf Training v5.1 Tyche (GB200 NVL72): "189471 MiB"
    "grand-teton-h100": 98_304,  # assumed = 96 GiB from torchtitan's "96GB HBM2e" (profile says so)
}


def _profile_data(name: str = "dgx-h100") -> dict:
    """A shipped profile as the YAML schema writes it (units), to edit and reload."""
    return catalog.resolve_hardware(name).model_dump(mode="json")


def _load(tmp_path, data: dict) -> HardwareProfile:
    path = tmp_path / "hw.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return catalog.resolve_hardware(str(path))


# ----------------------------------------------------------------------------- capacities


@pytest.mark.parametrize("name, mib", NVIDIA_SMI_MIB.items())
def test_capacity_is_the_cited_nvidia_smi_total(name, mib):
    hw = catalog.resolve_hardware(name)
    assert hw.gpu.hbm_capacity == mib * MIB
    # the source names the very figure (as nvidia-smi or MLPerf print it: "81559MiB", "81559 MiB")
    assert f"{mib}MiB" in hw.gpu.source.replace(" MiB", "MiB")


def test_capacities_are_what_the_labels_mean_in_gib_not_gb():
    # "141 GB" H200: 143,771 MiB / 1024 = 140.4 GiB (141 GB decimal would be 131.3 GiB);
    # "180 GB" B200: 183,359 / 1024 = 179.06 GiB (180 GB decimal: 167.6 GiB)
    h200, b200 = catalog.resolve_hardware("h200"), catalog.resolve_hardware("b200")
    assert round(h200.gpu.hbm_capacity / GIB, 1) == 140.4 and 141e9 / GIB < 131.4
    assert round(b200.gpu.hbm_capacity / GIB, 2) == 179.06 and 180e9 / GIB < 167.7
    assert round(catalog.resolve_hardware("h100").gpu.hbm_capacity / GIB, 2) == 79.65


# ----------------------------------------------------------------------------- every block sourced


@pytest.mark.parametrize("name", sorted(NVIDIA_SMI_MIB))
def test_every_shipped_profile_sources_every_block(name):
    hw = catalog.resolve_hardware(name)
    assert hw.host_link is not None and hw.host_memory is not None and hw.storage is not None
    sources = [hw.gpu.source, hw.intra_node.source, hw.inter_node.source, hw.host_link.source,
               hw.host_memory.source, hw.storage.per_host.source, hw.storage.aggregate.source,
               hw.efficiency.source]
    assert all(len(s.strip()) > 20 for s in sources), sources
    # the runtime, NCCL and allocator reserve is the framework profile's, not the hardware's
    assert hw.framework_overhead is None
    # a storage number is either a fact of this system or says what the user should set
    for part in (hw.storage.per_host, hw.storage.aggregate):
        assert part.placeholder is None or "set your" in part.placeholder


def test_every_profile_file_has_a_golden_case_and_the_catalog_is_complete():
    assert set(catalog.hardware_profiles()) == set(NVIDIA_SMI_MIB)


def test_aliases_of_the_new_and_fixed_profiles():
    for alias, name in {"h200": "dgx-h200", "h800": "hgx-h800", "b200": "dgx-b200",
                        "gb200": "gb200-nvl72", "nvl72": "gb200-nvl72"}.items():
        assert catalog.resolve_hardware(alias).name == name


# ----------------------------------------------------------------------------- NVLink domain vs host


def test_gb200_nvl72_domain_is_72_gpus_on_18_hosts_of_4():
    hw = catalog.resolve_hardware("gb200-nvl72")
    assert (hw.nvlink_domain, hw.gpus_per_node, hw.gpus_per_host) == (72, 4, 4)
    assert hw.hosts_per_nvlink_domain == 18                    # 72 / 4
    assert hw.intra_node.bandwidth_per_gpu == 900e9            # 1.8 TB/s both directions / 2
    assert hw.network_bandwidth_per_gpu == 50e9                # 4 NICs x 400 Gb/s / 4 GPUs
    assert hw.host_link_bandwidth_per_gpu == 225e9             # C2C 900 GB/s / 2 dirs / 2 GPUs
    assert hw.host_memory_per_gpu == 240 * GIB                 # 960 GiB LPDDR5X / 4 GPUs
    assert hw.gpu.peak_tflops["mxfp8"] == hw.gpu.peak_tflops["fp8"] == 5000
    assert hw.gpu.peak_tflops["bf16"] == 2500


def test_h800_is_the_h100_with_cut_nvlink():
    h800, h100 = catalog.resolve_hardware("h800"), catalog.resolve_hardware("h100")
    assert h800.intra_node.bandwidth_per_gpu == 200e9          # 400 GB/s both directions / 2
    assert h800.network_bandwidth_per_gpu == 50e9              # 8 x 400 Gb/s / 8 GPUs = DSV3's 50 GB/s
    assert h800.storage_write_bandwidth_per_gpu == 50e9 / 8    # one 400 Gb/s storage NIC / 8 GPUs
    assert h800.gpu.peak_tflops == h100.gpu.peak_tflops and "mxfp8" not in h800.gpu.peak_tflops
    assert h800.efficiency.model_dump(exclude={"source", "a2a_source"}) == \
        h100.efficiency.model_dump(exclude={"source", "a2a_source"})


def test_dgx_profiles_have_one_domain_per_host():
    for name in ("dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "hgx-h800"):
        hw = catalog.resolve_hardware(name)
        assert hw.nvlink_domain == hw.gpus_per_node == 8 and hw.hosts_per_nvlink_domain == 1


def test_a_profile_without_nvlink_domain_has_one_domain_per_host(tmp_path):
    data = _profile_data("dgx-h100")
    del data["nvlink_domain"]
    data["gpus_per_node"] = 4
    data["inter_node"]["nics_per_node"] = 4
    assert _load(tmp_path, data).nvlink_domain == 4


@settings(max_examples=30, deadline=None)
@given(host=st.sampled_from([1, 2, 4, 8, 16]), domain=st.integers(1, 600))
def test_nvlink_domain_must_be_whole_hosts(host, domain):
    data = _profile_data("gb200-nvl72")
    data.update(gpus_per_node=host, nvlink_domain=domain)
    if domain % host == 0:
        hw = HardwareProfile.model_validate(data)
        assert hw.hosts_per_nvlink_domain * hw.gpus_per_host == hw.nvlink_domain
    else:
        with pytest.raises(ValidationError, match=f"{domain} is not a multiple of gpus_per_node"):
            HardwareProfile.model_validate(data)


# ----------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(nvlink_domain=12),
     "nvlink_domain: 12 is not a multiple of gpus_per_node (8); an NVLink domain is made of whole hosts"),
    (lambda d: d.update(nvlink_domain=-8), "nvlink_domain: Input should be greater than 0"),
    (lambda d: d["host_link"].update(bandwidth_per_gpu=64), "host_link.bandwidth_per_gpu: 64 needs a unit"),
    (lambda d: d["host_link"].update(bandwidth_per_gpu="-64 GB/s"), "must not be negative"),
    (lambda d: d["host_link"].update(bandwidth_per_gpu="0 GB/s"), "bandwidth_per_gpu must be positive"),
    (lambda d: d["host_memory"].update(capacity="2 TB/s"), "host_memory.capacity: unknown unit 'TB/s'"),
    (lambda d: d["storage"]["aggregate"].update(write_bandwidth="2 TB"),
     "storage.aggregate.write_bandwidth: unknown unit 'TB'"),
    (lambda d: d["storage"]["per_host"].update(read_bandwidth="0 Gb/s"), "read_bandwidth must be positive"),
    (lambda d: d["storage"]["aggregate"].update(placeholder=""), "storage.aggregate.placeholder"),
    (lambda d: d["storage"]["per_host"].update(source=""), "storage.per_host.source"),
    (lambda d: d["storage"].update(bandwidth="1 TB/s"), "storage.bandwidth: unknown field"),
    (lambda d: d["gpu"]["peak_tflops"].update(nvfp4=9000), "gpu.peak_tflops.nvfp4"),
    (lambda d: d["gpu"]["peak_tflops"].update(mxfp8=-1), "peak_tflops values must be positive"),
    (lambda d: d["gpu"].update(hbm_capacity=81559), "gpu.hbm_capacity: 81559 needs a unit"),
])
def test_schema_errors_are_one_line_naming_the_field(tmp_path, edit, message):
    data = _profile_data("dgx-h100")
    edit(data)
    with pytest.raises(UsageError) as err:
        _load(tmp_path, data)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_cli_refuses_a_bad_profile_in_one_line_with_exit_2(tmp_path):
    data = _profile_data("gb200-nvl72")
    data["nvlink_domain"] = 70
    path = tmp_path / "nvl.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    code, out, err = run("search", "--model", "llama3-8b", "--gpus", "8", "--hardware", str(path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert "nvlink_domain: 70 is not a multiple of gpus_per_node (4)" in err


# ----------------------------------------------------------------------------- optional blocks


def test_a_profile_without_host_link_memory_storage_loads_and_says_what_is_missing(tmp_path):
    # a user's (or an older plan's) profile written before these blocks existed still loads;
    # reading one of them then fails in one line, naming the block
    data = _profile_data("dgx-h100")
    for key in ("nvlink_domain", "host_link", "host_memory", "storage"):
        del data[key]
    hw = _load(tmp_path, data)
    assert hw.nvlink_domain == 8 and hw.storage_placeholders == ("storage",)
    for prop, block in (("host_link_bandwidth_per_gpu", "host_link"),
                        ("host_memory_per_gpu", "host_memory"),
                        ("storage_write_bandwidth_per_gpu", "storage"),
                        ("storage_read_bandwidth_per_gpu", "storage")):
        with pytest.raises(UsageError, match=f"hardware profile dgx-h100 has no {block} block"):
            getattr(hw, prop)


def test_profiles_round_trip_through_their_yaml_form(tmp_path):
    for hw in catalog.hardware_profiles().values():
        assert _load(tmp_path, hw.model_dump(mode="json")) == hw


def test_storage_placeholders_are_listed():
    assert catalog.resolve_hardware("h100").storage_placeholders == ("storage.aggregate",)
    assert catalog.resolve_hardware("gb200").storage_placeholders == (
        "storage.per_host", "storage.aggregate")


# ----------------------------------------------------------------------------- the listing


def test_hardware_listing_shows_domain_host_and_storage_placeholders():
    code, out, _ = run("hardware")
    assert code == 0
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("gb200-nvl72"))
    cells = [c.strip() for c in lines[at].split("│")]
    # 189,471 MiB as nvidia-smi reports it, 2500 TFLOP/s, 4 GPUs per host over a 72-GPU domain
    assert cells[1:5] == ["189,471", "2500", "4", "900 GB/s"]
    assert [c.strip() for c in lines[at + 1].split("│")][3] == "72"
    flat = " ".join(out.split())
    assert "gb200-nvl72 (per host, aggregate)" in flat and "dgx-h100 (aggregate)" in flat