"""The hardware schema: ``hardware_profiles/*.yaml`` (and ``--hardware FILE``) as pydantic models.

A profile describes one kind of system: the GPU (usable HBM, peaks per precision), the NVLink
domain and the host -- which differ on GB200 NVL72 (72 GPUs share one NVLink fabric, 4 sit in one
host) -- the scale-out network per host, the device<->host link, host memory, the path to the
shared file system, and the efficiency factors fitted or taken for it. Every block carries a
``source``. SI inside (bytes, bytes/s, seconds); YAML writes units (planner.quantities).

Reading guide for the cost model (all SI; the properties raise a one-line UsageError naming the
block when a user-written profile leaves out an optional block):

- ``gpus_per_node`` (= ``gpus_per_host``): GPUs in one host (one OS instance, its NICs, its CPU
  memory); ranks r and r' share a host when r // gpus_per_node == r' // gpus_per_node.
- ``nvlink_domain``: GPUs on one NVLink/NVSwitch fabric, a multiple of ``gpus_per_node``;
  a group of GPUs inside one domain talks over ``intra_node`` (NVLink), otherwise over
  ``inter_node`` (the NICs). 8 on DGX/HGX systems, 72 on GB200 NVL72.
- ``network_bandwidth_per_gpu``: NICs per host x NIC bandwidth / GPUs per host.
- ``host_link_bandwidth_per_gpu``: device<->host, one direction, per GPU (activation offload,
  checkpoint staging to pinned host memory).
- ``host_memory_per_gpu``: host (CPU) memory per host / GPUs per host.
- ``storage_write_bandwidth_per_gpu`` / ``storage_read_bandwidth_per_gpu``: a host's path to the
  shared file system / GPUs per host; ``storage.aggregate``: the whole file system's bandwidth.
  ``storage_placeholders`` lists the storage numbers the user should replace with their own.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .errors import UsageError
from .quantities import NAME_PATTERN, Bandwidth, Bytes, Fraction, Seconds, _Strict

PeakKey = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "mxfp8", "fp4"]


def _positive(model: _Strict, *fields: str) -> None:
    """ValueError naming the first of ``fields`` that is not > 0 (units parse rejects < 0)."""
    for name in fields:
        if getattr(model, name) <= 0:
            raise ValueError(f"{name} must be positive")


# A bound that catches a wrong unit (a GPU of today holds at most 288 GB; 2 TiB leaves decades).
MAX_HBM = 2 * 2**40


class GPUSpec(_Strict):
    """One accelerator.

    - ``hbm_capacity``: usable HBM as the GPU reports it -- nvidia-smi's memory total in MiB
      (``nvidia-smi --query-gpu=memory.total``), not the datasheet label: an "80 GB" H100 reports
      81,559 MiB (79.6 GiB), a "141 GB" H200 143,771 MiB (140.4 GiB). ``source`` names where the
      MiB figure was read.
    - ``hbm_bandwidth``: HBM bandwidth per GPU (datasheet).
    - ``peak_tflops``: dense (no 2:4 sparsity) tensor-core peak per dtype, TFLOP/s; bf16 is
      required. ``fp8`` is per-tensor/blockwise FP8, ``mxfp8`` MXFP8 (1x32 blocks with E8M0 scales,
      Blackwell only; it runs on the FP8 tensor cores, so NVIDIA's FP8 figure), ``fp4`` FP4/NVFP4.
    - ``sm_count``: streaming multiprocessors (cudaDeviceProp.multiProcessorCount); what TP
      communication overlap takes SMs from (cost.comm). None: unknown, and TP communication
      overlap is then not offered (search.software_rules).
    """

    name: str
    hbm_capacity: Bytes
    hbm_bandwidth: Bandwidth
    peak_tflops: dict[PeakKey, float]
    sm_count: int | None = Field(default=None, gt=0, le=10_000)
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "GPUSpec":
        if "bf16" not in self.peak_tflops:
            raise ValueError("peak_tflops must give bf16")
        if any(v <= 0 for v in self.peak_tflops.values()):
            raise ValueError("peak_tflops values must be positive")
        if self.hbm_capacity <= 0 or self.hbm_bandwidth <= 0:
            raise ValueError("hbm_capacity and hbm_bandwidth must be positive")
        if self.hbm_capacity > MAX_HBM:
            raise ValueError(f"hbm_capacity {self.hbm_capacity / 2**40:.3g} TiB per GPU is beyond "
                             f"any accelerator (at most {MAX_HBM // 2**40} TiB here): check its unit")
        return self


class IntraNode(_Strict):
    """The NVLink/NVSwitch fabric inside one NVLink domain (``HardwareProfile.nvlink_domain``
    GPUs). ``bandwidth_per_gpu`` is ONE direction (the vendor's per-GPU figure counts both, /2)."""

    name: str
    bandwidth_per_gpu: Bandwidth
    latency: Seconds
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "IntraNode":
        _positive(self, "bandwidth_per_gpu")
        return self


class InterNode(_Strict):
    """The scale-out fabric (InfiniBand/RoCE) of one host: ``nics_per_node`` NICs per host (the
    compute NICs, not storage or management), ``bandwidth_per_nic`` one direction."""

    name: str
    nics_per_node: int = Field(gt=0, le=64)
    bandwidth_per_nic: Bandwidth
    latency: Seconds
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "InterNode":
        _positive(self, "bandwidth_per_nic")
        return self


class HostLink(_Strict):
    """Device <-> host link of one GPU (PCIe Gen4/Gen5 x16, NVLink-C2C on Grace systems):
    ``bandwidth_per_gpu`` is ONE direction, bytes/s, each GPU's share when GPUs share a link.
    ``carries_nic_traffic``: whether the GPU's traffic with its NIC (GPUDirect RDMA) crosses the
    same link, so that host copies and inter-node traffic share it (a GPU whose one PCIe x16
    interface reaches both the host and its NIC); None (not stated) is taken as True, the
    conservative case."""

    name: str
    bandwidth_per_gpu: Bandwidth
    carries_nic_traffic: bool | None = None
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "HostLink":
        _positive(self, "bandwidth_per_gpu")
        return self


class HostMemory(_Strict):
    """CPU memory of one host (``capacity``, bytes): room for offloaded activations, optimizer
    states, and pinned buffers that stage an asynchronous checkpoint."""

    name: str
    capacity: Bytes
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "HostMemory":
        _positive(self, "capacity")
        return self


class HostCPU(_Strict):
    """The host CPU that drives each GPU's work (cost.host): ``op_time``, seconds of host time
    per device operation the training framework launches eagerly (the Python and C++ code that
    issues a kernel or a collective, with the launch itself): a GPU whose work is issued faster
    than it runs never waits for its host; one that is not (small kernels, many per layer, a
    blocking device-to-host sync that stops the host running ahead) waits."""

    name: str
    op_time: Seconds
    source: str = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "HostCPU":
        _positive(self, "op_time")
        return self


class MoEDispatch(_Strict):
    """The fused MoE token dispatchers a cluster can run beside NCCL's all-to-all (Megatron-Core
    --moe-flex-dispatcher-backend): ``backends`` of deepep (DeepEP: NVSHMEM/IBGDA or NCCL Gin,
    SM80/SM90 and B200/B300) and hybridep (HybridEP: TMA over NVLink, MNNVL, RDMA via DOCA).
    Empty: only NCCL's all-to-all and all-gather dispatchers."""

    backends: list[Literal["deepep", "hybridep"]] = []
    source: str = Field(min_length=1)


class StorageLink(_Strict):
    """Write and read bandwidth (bytes/s) of one path to the shared file system.

    ``placeholder``: None when the numbers are sourced facts of this system; otherwise a note
    saying why they are placeholders (site-specific) and what the user should set -- the CLI
    shows it. ``source`` is always required: where the (placeholder) numbers came from.
    """

    write_bandwidth: Bandwidth
    read_bandwidth: Bandwidth
    source: str = Field(min_length=1)
    placeholder: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "StorageLink":
        _positive(self, "write_bandwidth", "read_bandwidth")
        return self


class Storage(_Strict):
    """The shared (parallel) file system checkpoints are written to.

    - ``per_host``: one host's path to it (its storage NICs or file-system client).
    - ``aggregate``: the file system's total bandwidth, shared by every writing host.
    """

    per_host: StorageLink
    aggregate: StorageLink

    @property
    def placeholders(self) -> tuple[str, ...]:
        """Names of the sub-blocks (``per_host``, ``aggregate``) that hold placeholder numbers."""
        return tuple(name for name in ("per_host", "aggregate")
                     if getattr(self, name).placeholder is not None)


class Efficiency(_Strict):
    """Achieved fractions of peak that the cost model applies; each with where it came from.

    - ``matmul``: best achieved fraction of the dense peak on large bf16 GEMMs.
    - ``matmul_fp8``: the same for per-tensor FP8 GEMMs, as a fraction of the FP8 peak (None:
      the GPU has no FP8, or it is not known; FP8 training is then refused).
    - ``matmul_half_flops``: FLOPs of one GEMM at which it reaches half of ``matmul``
      (efficiency falls for small per-GPU GEMMs: eta(F) = matmul * F / (F + matmul_half_flops)).
    - ``attention``: fraction of peak reached by the attention core (flash attention).
    - ``hbm``: fraction of HBM bandwidth reached by memory-bound kernels.
    - ``nvlink``, ``network``: achieved bus bandwidth (nccl-tests busbw) / link bandwidth.
    - ``a2a_nvlink``, ``a2a_network``: the same for the MoE token all-to-all (NCCL
      all_to_all_single, one rank per NIC rail), measured apart from the dense collectives the
      two factors above were fitted on (None: those factors); ``a2a_fused_nvlink``: the
      fused dispatchers' (DeepEP, HybridEP) NVLink bandwidth over its line rate, on the bytes
      they move after deduplicating a token's copies per rank (cost.moe.flex_shares; None:
      a2a_nvlink).
    - ``step_overhead``: T_misc, fixed seconds per optimizer step beyond the modelled kernels
      (data loading, grad-norm and clipping, loss all-reduces, logging, launch gaps; formulas.md
      7.1 "calibrate as a constant"). 0 unless fitted by ``plan3d calibrate``.
    """

    matmul: Fraction
    matmul_fp8: Fraction | None = None
    matmul_half_flops: float = Field(ge=0.0)
    attention: Fraction
    hbm: Fraction
    nvlink: Fraction
    network: Fraction
    a2a_nvlink: Fraction | None = None
    a2a_network: Fraction | None = None
    a2a_fused_nvlink: Fraction | None = None
    step_overhead: Seconds = 0.0
    source: str = Field(min_length=1)
    a2a_source: str = ""

    @model_validator(mode="after")
    def _a2a_sourced(self) -> "Efficiency":
        if (self.a2a_nvlink is not None or self.a2a_network is not None
                or self.a2a_fused_nvlink is not None) and not self.a2a_source.strip():
            raise ValueError("a2a_nvlink / a2a_network / a2a_fused_nvlink need a2a_source: where the all-to-all "
                             "bandwidth was measured")
        return self


class HardwareProfile(_Strict):
    """A system: GPU, host, NVLink domain and fabrics, with the efficiency factors for it.

    ``gpus_per_node``: GPUs per host. ``nvlink_domain``: GPUs per NVLink domain, a multiple of
    ``gpus_per_node``; when left out it is ``gpus_per_node`` (every DGX/HGX system). ``host_link``,
    ``host_memory`` and ``storage`` may be left out of a user's file (None: not stated); every
    shipped profile gives them, and the properties below refuse, in one line, when one is needed
    but missing. Raises (as pydantic ValidationError, reported by planner.catalog in one line):
    a non-positive or unit-less quantity, ``nvlink_domain`` not a multiple of ``gpus_per_node``,
    ``framework_overhead`` not below the HBM capacity.
    """

    name: str = Field(pattern=NAME_PATTERN)
    aliases: list[str] = []
    description: str = ""
    gpu: GPUSpec
    gpus_per_node: int = Field(gt=0, le=1024)
    nvlink_domain: int = Field(gt=0, le=100_000)
    intra_node: IntraNode
    inter_node: InterNode
    host_link: HostLink | None = None
    host_memory: HostMemory | None = None
    storage: Storage | None = None
    host_cpu: HostCPU | None = None
    moe_dispatch: MoEDispatch | None = None
    efficiency: Efficiency
    # Optional extra allowance per GPU a site needs beyond the framework profile's reserve (a
    # monitoring agent, MPS); the runtime, NCCL and allocator reserve is the framework's
    # (framework_profiles/, formulas.md 3.10). None (the shipped profiles): nothing extra.
    framework_overhead: Bytes | None = None
    framework_overhead_source: str = ""

    @model_validator(mode="before")
    @classmethod
    def _default_domain(cls, data: Any) -> Any:
        """A profile without ``nvlink_domain`` has one domain per host (DGX/HGX, 8 GPUs)."""
        if isinstance(data, dict) and "nvlink_domain" not in data and "gpus_per_node" in data:
            data = {**data, "nvlink_domain": data["gpus_per_node"]}
        return data

    @field_validator("nvlink_domain")
    @classmethod
    def _whole_hosts(cls, value: int, info: ValidationInfo) -> int:
        hosts = info.data.get("gpus_per_node")
        if isinstance(hosts, int) and value % hosts:
            raise ValueError(f"{value} is not a multiple of gpus_per_node ({hosts}); an NVLink "
                             "domain is made of whole hosts")
        return value

    @model_validator(mode="after")
    def _check(self) -> "HardwareProfile":
        if self.framework_overhead is not None and self.framework_overhead >= self.gpu.hbm_capacity:
            raise ValueError("framework_overhead must be smaller than gpu.hbm_capacity")
        return self

    def _need(self, block: str, purpose: str) -> Any:
        """The optional block ``block``, or UsageError saying the profile lacks it."""
        value = getattr(self, block)
        if value is None:
            raise UsageError(f"hardware profile {self.name} has no {block} block, needed for "
                             f"{purpose}; add one (docs/schemas.md, Hardware profiles)")
        return value

    @property
    def gpus_per_host(self) -> int:
        """GPUs per host (= ``gpus_per_node``; the name the NVL72 distinction calls for)."""
        return self.gpus_per_node

    @property
    def hosts_per_nvlink_domain(self) -> int:
        """Hosts that share one NVLink domain: nvlink_domain / gpus_per_node (GB200 NVL72: 18)."""
        return self.nvlink_domain // self.gpus_per_node

    @property
    def network_bandwidth_per_gpu(self) -> float:
        """Bytes/s per GPU, one direction, of the scale-out fabric (NICs per host / GPUs per host)."""
        return self.inter_node.nics_per_node * self.inter_node.bandwidth_per_nic / self.gpus_per_node

    @property
    def host_link_bandwidth_per_gpu(self) -> float:
        """Bytes/s device<->host per GPU, one direction; UsageError without a host_link block."""
        return self._need("host_link", "device<->host transfers").bandwidth_per_gpu

    def offload_bandwidth_per_gpu(self, multi_node):
        """Bytes/s per GPU, one direction, that host copies of activation offload get: the host
        link, less the NIC's share per GPU where the link carries NIC traffic and the layout's
        traffic reaches the NICs (``multi_node``, bool array: cost.offload.offload_bandwidth;
        the NIC traffic is taken to run at the NIC's rate while the copies run, the
        conservative case). 0 where nothing is left.
        Float array of ``multi_node``'s shape. UsageError without a host_link block."""
        link = self._need("host_link", "device<->host transfers")
        shared = link.carries_nic_traffic is not False
        nic = self.network_bandwidth_per_gpu if shared else 0.0
        return np.maximum(link.bandwidth_per_gpu - np.where(multi_node, nic, 0.0), 0.0)

    @property
    def host_memory_per_gpu(self) -> float:
        """Bytes of host memory per GPU (per host / GPUs per host); UsageError without host_memory."""
        return self._need("host_memory", "offload to host memory").capacity / self.gpus_per_node

    @property
    def storage_write_bandwidth_per_gpu(self) -> float:
        """Bytes/s per GPU of a host's write path to the shared file system (per_host / GPUs per
        host), when every GPU of the host writes at once; UsageError without a storage block."""
        return self._need("storage", "checkpoint writes").per_host.write_bandwidth / self.gpus_per_node

    @property
    def storage_read_bandwidth_per_gpu(self) -> float:
        """Bytes/s per GPU of a host's read path from the shared file system (checkpoint load)."""
        return self._need("storage", "checkpoint reads").per_host.read_bandwidth / self.gpus_per_node

    @property
    def storage_placeholders(self) -> tuple[str, ...]:
        """``storage.per_host`` / ``storage.aggregate`` where they hold placeholders ("storage"
        when the block is missing altogether); empty when every storage number is sourced."""
        if self.storage is None:
            return ("storage",)
        return tuple(f"storage.{name}" for name in self.storage.placeholders)
