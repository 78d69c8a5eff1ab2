"""Time of collectives on a group, given where its ranks sit (formulas.md 5.1-5.3).

Cost model: t = alpha + phi * S / busbw (nccl-tests' bus-bandwidth convention), split in two
phases for a group with ``n_local`` ranks per node on ``n_nodes`` nodes (formulas.md 5.2): an
intra-node phase on NVLink, then an inter-node phase in which each GPU moves S/n_local over its
own share of the node's NICs. A group inside one node never touches the NICs.
All arrays have shape (N,); sizes in bytes, bandwidths in bytes/s, times in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..layout.groups import size_stride
from ..specs import HardwareProfile


@dataclass(frozen=True)
class Links:
    """Achieved bus bandwidths and per-collective latencies of one system (SI units), and the
    NVLink domain groups are placed on."""

    intra_bw: float  # NVLink busbw per GPU, one direction, after efficiency
    inter_bw: float  # NIC busbw per GPU, one direction, after efficiency
    intra_latency: float
    inter_latency: float
    domain: int  # GPUs of one NVLink domain (formulas.md 5.3): groups inside it use NVLink
    inter_peak: float = 0.0  # NIC bandwidth per GPU, one direction, before efficiency
    a2a_intra_bw: float = 0.0  # the MoE token all-to-all's NVLink bandwidth (0: intra_bw)
    a2a_inter_bw: float = 0.0  # its NIC bandwidth (0: inter_bw)
    fused_intra_bw: float = 0.0  # the fused dispatchers' NVLink bandwidth (0: a2a_intra_bw)

    @classmethod
    def of(cls, hw: HardwareProfile) -> "Links":
        eff = hw.efficiency
        nvl, nic = hw.intra_node.bandwidth_per_gpu, hw.network_bandwidth_per_gpu
        return cls(intra_bw=nvl * eff.nvlink, inter_bw=nic * eff.network,
                   intra_latency=hw.intra_node.latency, inter_latency=hw.inter_node.latency,
                   domain=nvlink_domain(hw), inter_peak=nic,
                   a2a_intra_bw=nvl * (eff.a2a_nvlink or eff.nvlink),
                   a2a_inter_bw=nic * (eff.a2a_network or eff.network),
                   fused_intra_bw=nvl * (eff.a2a_fused_nvlink or eff.a2a_nvlink or eff.nvlink))

    def a2a(self) -> "Links":
        """These links with the MoE token all-to-all's own bandwidths (Efficiency.a2a_nvlink,
        a2a_network: measured apart from the dense collectives)."""
        return replace(self, intra_bw=self.a2a_intra_bw or self.intra_bw,
                       inter_bw=self.a2a_inter_bw or self.inter_bw)


def nvlink_domain(hw: HardwareProfile) -> int:
    """GPUs of one NVLink domain as layouts use them: the largest power-of-two number of hosts
    that fits in the profile's NVLink domain (hosts of ``gpus_per_node`` GPUs). Power-of-two
    groups tile such blocks; on a GB200 NVL72 rack (18 trays of 4 GPUs) that is 16 trays, 64
    GPUs, as NVIDIA recommends placing large (128+ GPU, e.g. MoE) jobs, in segments of 16 nodes
    per NVL72 domain, the rest of the rack serving other jobs or as spares (NVIDIA technical
    blog, "Achieving Peak System and Workload Efficiency on NVIDIA GB200 NVL72 with Slurm Block
    Scheduling", developer.nvidia.com/blog/?p=116606). 8-GPU hosts with 8-GPU domains: 8."""
    host = int(hw.gpus_per_node)
    hosts = max(1, int(getattr(hw, "nvlink_domain", host) or host) // host)
    return host * 2 ** (hosts.bit_length() - 1)


def group_span(size, stride, domain: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranks per domain, domains) that time a group of ``size`` ranks spaced ``stride`` apart,
    in Megatron's rank order (groups tile blocks of size*stride consecutive ranks), on NVLink
    domains of ``domain`` GPUs (formulas.md 5.3). Int64 arrays, broadcast.

    - the block fits a domain and divides it (size*stride | domain): (size, 1), all on NVLink;
    - blocks of whole domains with domain/stride ranks in each (domain | size*stride and
      stride | domain): (domain/stride, size*stride/domain), the two-phase cost of
      collective_time;
    - one rank per domain (domain | stride): (1, size);
    - otherwise some group straddles a domain boundary with unequal parts (e.g. tp = 4 on
      6-GPU nodes: ranks 4-7 sit 2 + 2): the collective runs as a flat ring whose every step
      crosses the network in the worst group, (1, size).
    A group of one rank is (1, 1).
    """
    size = np.asarray(size, dtype=np.int64)
    stride = np.maximum(np.asarray(stride, dtype=np.int64), 1)
    block = size * stride
    inside = domain % block == 0
    whole = (block % domain == 0) & (domain % stride == 0)
    n_local = np.where(inside, size, np.where(whole, domain // stride, 1))
    n_nodes = np.where(inside, 1, np.where(whole, block // domain, size))
    return n_local, n_nodes


def span(c, kind: str, domain: int) -> tuple[np.ndarray, np.ndarray]:
    """group_span of group ``kind`` of candidates ``c`` (layout.groups.size_stride: TP, CP, the
    dp*cp gradient group, EP, ETP, EDP, the tied-embedding pair, ...)."""
    return group_span(*size_stride(c, kind), domain)


def p2p_crosses(stage_gpus, pp, domain: int) -> np.ndarray:
    """Whether pipeline neighbours (``stage_gpus`` = tp*cp*dp ranks apart) sit in different NVLink
    domains for some pipeline rank: the pipeline group spans more than one domain. Bool."""
    return np.asarray(stage_gpus) * np.asarray(pp) > domain


_PHASE_FACTOR = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0}


def collective_time(op: str, size_bytes: np.ndarray, n_local: np.ndarray, n_nodes: np.ndarray,
                    links: Links, shares: tuple | None = None) -> np.ndarray:
    """Seconds for ``op`` (all_reduce | reduce_scatter | all_gather | all_to_all) of S bytes per
    rank on a group of n_local ranks per NVLink domain on n_nodes domains.

    S is the buffer per rank for all-reduce, the total (gathered/unscattered) size for
    reduce-scatter and all-gather, and what one rank sends for all-to-all. Two-phase
    (hierarchical) ring cost, formulas.md 5.2:
      k*(n_l-1)/n_l * S/B_nvl + k*(n_r-1)/n_r * (S/n_l)/B_ib  (k = 2 for all-reduce, else 1)
    plus one latency per phase that is used. All-to-all (formulas.md 5.8): a rank sends
    (n_l - 1)/n of S over NVLink and (n - n_l)/n over its NIC share at the same time, so
    max(S*(n_l-1)/n / B_nvl, S*(n-n_l)/n / B_ib) plus the latencies; ``shares`` (all-to-all
    only) replaces those two fractions of S by (NVLink share, NIC share), as a deduplicating
    dispatcher sends (moe.flex_shares). A group of one rank costs 0.
    """
    n_local = np.asarray(n_local, dtype=np.float64)
    n_nodes = np.asarray(n_nodes, dtype=np.float64)
    size = np.asarray(size_bytes, dtype=np.float64)
    latency = np.where(n_local > 1, links.intra_latency, 0.0) + \
        np.where(n_nodes > 1, links.inter_latency, 0.0)
    if op == "all_to_all":
        n = n_local * n_nodes
        nvl, nic = shares if shares is not None else ((n_local - 1) / n, (n - n_local) / n)
        return np.maximum(size * nvl / links.intra_bw, size * nic / links.inter_bw) + latency
    k = _PHASE_FACTOR[op]
    intra = k * (n_local - 1) / n_local * size / links.intra_bw
    inter = k * (n_nodes - 1) / n_nodes * (size / n_local) / links.inter_bw
    return intra + inter + latency


def p2p_time(size_bytes: np.ndarray, crosses_node: np.ndarray, links: Links) -> np.ndarray:
    """Seconds for one point-to-point message: alpha + S/B on NVLink or on the GPU's NIC share."""
    size = np.asarray(size_bytes, dtype=np.float64)
    return np.where(crosses_node, links.inter_latency + size / links.inter_bw,
                    links.intra_latency + size / links.intra_bw)
