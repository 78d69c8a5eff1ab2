"""The least activation offload that fits: N layers' activations in host memory (formulas.md 3.3.2).

Megatron-Core's CPU offload (--cpu-offloading-num-layers N; pp 1 and no recomputation,
search.framework_rules) moves the stored activations of N layers to host memory after their forward
and back before their backward, keeping one layer in transfer on the GPU
(memory.offloaded_bytes). On the one pipeline rank, with H in-flight layers of B bytes each
(recompute none), its memory is linear in N:

    M(N) = M(0) - (1 + a) * (min(N, H) - 1) * B,    N >= 1

with a the allocator's share of the working set (estimate.reserve_bytes). So the least N that
fits is N = 1 + ceil((M(0) - usable) / ((1 + a) * B)) where M(0) > usable, 0 where the layout
fits without offload, and none (0, the layout does not fit) where N would reach the layers
(Megatron-Core refuses N >= L), the N x B offloaded bytes would exceed the host memory per
GPU (hardware profile ``host_memory`` / GPUs per host, host_layers), or the host link has no
bandwidth left beside the NIC's traffic (offload_bandwidth). Its time (step.offload_time) grows with N: the least N is the
cheapest offload that fits. Everything is elementwise over candidates.
"""

from __future__ import annotations

import numpy as np

from ..errors import UsageError
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .estimate import memory_by_rank, memory_total, rank_kinds
from .recompute import MARGIN, layer_terms
from .collectives import nvlink_domain


def schedule_stall(layers, n, work, move) -> np.ndarray:
    """Seconds by which moving N = ``n`` of ``layers`` layers' activations over the host link
    stretches one pass (forward or backward) of ``layers`` layers of ``work`` seconds each, each
    move taking ``move`` seconds: Transformer Engine's default offload schedule
    (docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst @d0067d0da): the first
    N layers are offloaded in order on one copy stream, and at most R = layers - N layers'
    activations stay on the GPU, so compute stalls until a slot is free. As a max-plus
    recursion over layers j = 1..layers (s_j: start of layer j, e_i: end of layer i's copy,
    which starts when its forward ends):

        s_j = max(s_{j-1} + work, e_{j-R}),   e_i = max(e_{i-1}, s_i + work) + move  (i <= N)

    stall = s_layers + work - layers x work. R = 1 serialises (N x move exposed: TE warns that
    compute and transfers cannot overlap); a fast link (move <= work, R >= 2) hides every copy.
    The backward is the same pass mirrored (reloads in reverse order, freed slots ahead of
    them). Broadcast arrays in (layers, n whole numbers), seconds out; 0 where n = 0."""
    layers, n, work, move = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64)
                                                  for x in (layers, n, work, move)))
    out = np.zeros(layers.shape)
    # a copy no longer than a layer with two or more slots never stalls: only the rest is run
    at = np.flatnonzero((n.ravel() > 0) & ((move.ravel() > work.ravel()) | (layers.ravel() - n.ravel() < 2)))
    if at.size == 0:
        return out
    L, N, f, t = (x.ravel()[at] for x in (layers, n, work, move))
    R = np.maximum(L - N, 1.0).astype(np.int64)
    top, cols = int(L.max()), np.arange(at.size)
    ends = np.zeros((top + 1, at.size))    # ends[i] = e_i (ends[0] = 0: nothing before layer 1)
    starts = np.zeros((top + 1, at.size))  # starts[j] = s_j
    for j in range(1, top + 1):
        start = starts[j - 1] + f if j > 1 else starts[0]
        gate = j - R
        starts[j] = np.where(gate >= 1, np.maximum(start, ends[np.maximum(gate, 0), cols]), start)
        ends[j] = np.where(j <= N, np.maximum(ends[j - 1], starts[j] + f) + t, ends[j - 1])
    last = starts[L.astype(np.int64), cols]  # each candidate's own s_L
    stall = last + f - L * f
    out.ravel()[at] = np.where(stall > 1e-9 * L * f, stall, 0.0)  # rounding of the sums: none
    return out


def offers_host_offload(hw: HardwareProfile) -> bool:
    """Whether ``hw`` states the host link and host memory that activation offload needs."""
    return hw.host_link is not None and hw.host_memory is not None


def check_offload_hardware(hw: HardwareProfile, pins) -> None:
    """UsageError (one line) when ``pins`` (a layout's Candidates, or the search's options)
    offload layers (offload_layers > 0; None = free) on a hardware profile that states no host
    link or no host memory."""
    layers = 0 if pins.offload_layers is None else int(np.max(pins.offload_layers))
    if layers and not offers_host_offload(hw):
        raise UsageError(f"activation offload (offload_layers {layers}) needs the hardware "
                         f"profile's host_link and host_memory; {hw.name} states "
                         f"{'no host_link' if hw.host_link is None else 'no host_memory'}")


def uses_host_memory(c) -> np.ndarray:
    """Where candidates ``c`` keep activations in host memory (offload_layers > 0). Bool array."""
    return np.asarray(c.offload_layers) > 0


def offload_allowed(c) -> np.ndarray:
    """Where Megatron-Core runs activation offload: pp 1 and no recomputation
    (transformer_config.py L1884-1899 @d98e8a64; the megatron-core profile's rule,
    search.framework_rules). Bool array."""
    return (np.asarray(c.pp) == 1) & (np.asarray(c.recompute) == 0)


def offload_candidates(c) -> np.ndarray:
    """Layouts whose memory activation offload can lower: offload_allowed and no offload set.
    Bool array."""
    return offload_allowed(c) & (np.asarray(c.offload_layers) == 0)


def host_bytes(model: ModelSpec, training: TrainingSpec, c) -> np.ndarray:
    """Host memory per GPU that the offloaded activations take, bytes: N x B with N =
    ``offload_layers`` and B a layer's stored bytes on the (one) pipeline rank (no recompute,
    recompute.layer_terms). Broadcast array; 0 where N = 0."""
    stored = layer_terms(model, training, c, ("first",))["first"][0]
    return np.asarray(c.offload_layers, dtype=np.float64) * stored


def host_offload(model: ModelSpec, training: TrainingSpec, c, i: int = 0) -> tuple[int, float]:
    """(layers offloaded, host bytes per GPU) of candidate ``i``: (0, 0.0) without offload."""
    return int(np.ravel(c.offload_layers)[i]), float(np.ravel(host_bytes(model, training, c))[i])


def offload_bandwidth(hw: HardwareProfile, c) -> np.ndarray:
    """Bytes/s per GPU, one direction, the offload copies of candidates ``c`` get
    (HardwareProfile.offload_bandwidth_per_gpu): the NIC carries the layout's traffic only when
    it spans more GPUs than one NVLink domain (collectives.nvlink_domain; a group inside it never
    touches the NICs). Float array of ``c.gpus``' shape."""
    return hw.offload_bandwidth_per_gpu(np.asarray(c.gpus) > nvlink_domain(hw))


def host_layers(hw: HardwareProfile, stored) -> np.ndarray:
    """The most layers of ``stored`` bytes each whose activations fit in the host memory per GPU
    (host_memory / GPUs per host). Float array of ``stored``'s shape."""
    return np.floor(hw.host_memory_per_gpu / np.maximum(np.asarray(stored, dtype=np.float64), 1e-300))


def offload_saving(training: TrainingSpec, n, stored) -> np.ndarray:
    """Bytes per GPU that N = ``n`` offloaded layers of ``stored`` bytes save against none:
    (1 + a) x (N - 1) x B (memory.offloaded_bytes keeps one layer in transfer; a the allocator's
    share of the working set, estimate.reserve_bytes); 0 where N = 0. Broadcast array."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n > 0, (1.0 + training.reserve_allocator) * (n - 1.0) * stored, 0.0)


def offload_runs(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> np.ndarray:
    """Which candidates' activation offload can run: none set, or ``hw`` states its host link and
    host memory, N is within host_layers and the host link has bandwidth left for the copies
    (offload_bandwidth). Bool array of ``c.offload_layers``' shape broadcast with the layer
    terms and the GPU count."""
    n = np.asarray(c.offload_layers)
    if not np.any(n > 0) or not offers_host_offload(hw):
        return n == 0
    stored = layer_terms(model, training, c, ("first",))["first"][0]
    return (n == 0) | ((n <= host_layers(hw, stored)) & (offload_bandwidth(hw, c) > 0))


def check_host_memory(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> None:
    """UsageError (one line) when candidate 0's activation offload cannot run (offload_runs):
    ``hw`` states no host link or host memory (check_offload_hardware), its offloaded bytes
    exceed the host memory per GPU (with the most layers that would fit, host_layers), or its
    host link has no bandwidth left beside the NIC's traffic."""
    n = int(np.asarray(c.offload_layers).ravel()[0])
    check_offload_hardware(hw, c)
    if n == 0 or bool(np.ravel(offload_runs(model, hw, training, c))[0]):
        return
    need = float(np.ravel(host_bytes(model, training, c))[0])
    if need > hw.host_memory_per_gpu:
        most = int(np.ravel(host_layers(hw, need / n))[0])
        fits = f"at most {most} layers" if most else "not one layer's activations fit"
        raise UsageError(f"offloading the activations of {n} layers puts {need / 2**30:,.1f} GiB "
                         f"per GPU in host memory; {hw.name} has {hw.host_memory_per_gpu / 2**30:,.1f} "
                         f"GiB per GPU (host_memory / GPUs per host): {fits}")
    raise UsageError(f"{hw.name}'s host link ({hw.host_link_bandwidth_per_gpu / 1e9:,.0f} GB/s per "
                     f"GPU) also carries the NIC's traffic ({hw.network_bandwidth_per_gpu / 1e9:,.0f} "
                     "GB/s per GPU) and leaves nothing for offload copies on a layout beyond one "
                     "NVLink domain (host_link.carries_nic_traffic)")


def offload_layers_from_totals(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                               totals: dict, usable: float, terms: dict | None = None,
                               most: bool = False) -> np.ndarray:
    """The least N of the module docstring per candidate, from each rank kind's memory without
    offload (``totals``: {rank kind: bytes}, memory_by_rank's totals of ``c``): 0 where the
    layout fits already, where it is not an offload candidate (offload_candidates), or where
    N would reach the model's layers or the rank's in-flight layers, or N x B the host memory
    per GPU of ``hw``, or where no host-link bandwidth is left for the copies
    (HardwareProfile.offload_bandwidth_per_gpu). ``terms``: {rank kind:
    (stored, recomputed, held)} from recompute.layer_terms, computed here when None. Int64
    array, broadcast shape of the inputs. ``most``: where N would pass those limits, the most N
    they allow instead (a layout that does not fit, at its least memory: the closest miss)."""
    grow = 1.0 + training.reserve_allocator
    terms = terms or layer_terms(model, training, c, tuple(totals))
    need = np.zeros(np.shape(np.asarray(c.pp)), dtype=np.float64)
    room = np.full_like(need, float(model.num_layers - 1))  # N < L
    for kind, total in totals.items():
        stored, _, held = terms[kind]
        deficit = total - usable * (1.0 - MARGIN)
        n_rank = np.where(deficit > 0, 1.0 + np.ceil(deficit / np.maximum(grow * stored, 1e-300)), 0.0)
        need, room = np.maximum(need, n_rank), np.minimum(np.minimum(room, held), host_layers(hw, stored))
    moving = offload_bandwidth(hw, c) > 0
    if most:
        need = np.minimum(need, room)
    ok = offload_candidates(c) & (need > 1) & (need <= room) & moving
    return np.where(ok, need, 0.0).astype(np.int64)


def least_offload_layers(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                         usable: float) -> np.ndarray:
    """offload_layers per candidate: the least N that fits within ``usable`` bytes per GPU for
    the offload candidates that do not fit without it (offload_layers_from_totals), checked
    with memory_total (0 where it still does not fit); candidates with offload_layers set keep
    it. Int64 array, broadcast shape of ``c``. Raises nothing."""
    given = np.asarray(c.offload_layers)
    kinds = rank_kinds(c, model)
    totals = {k: v["total"] for k, v in memory_by_rank(model, hw, training, c, kinds).items()}
    n = offload_layers_from_totals(model, hw, training, c, totals, usable)
    if np.any(n > 0):
        fits = memory_total(model, hw, training, c.replace(offload_layers=n)) <= usable
        n = np.where(fits, n, 0)
    return np.where(given > 0, given, n)


def offload_stall(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c, times,
                  counts: dict, rank) -> np.ndarray:
    """Exposed seconds per micro-batch of activation offload on rank kind ``kind`` (formulas.md
    3.3.2) on pipeline rank ``rank`` (``times``: compute.block_times; ``counts``: its blocks):
    N = ``offload_layers`` of the rank's layers copy their stored bytes B (memory.
    activation_per_layer, no recompute) to the host in forward and back in backward over the
    host link (offload.offload_bandwidth: one direction each way, less the NIC's share where
    the link carries NIC traffic and the layout spans NVLink domains; B/bw a copy), at
    most layers - N of them on the GPU: offload.schedule_stall of the forward pass (the rank's
    mean layer forward seconds) plus that of the backward (mean layer backward seconds).
    Broadcast array."""
    layers = np.maximum(c.rank_layers(model.num_layers, rank), 1.0)
    stored = layer_terms(model, training, c, ("first",))["first"][0]  # B, no recompute (pp 1)
    bandwidth = offload_bandwidth(hw, c)
    move = np.where(bandwidth > 0, stored / np.maximum(bandwidth, 1e-300), np.inf)
    forward = sum(counts[k] * times[k].forward for k in counts) / layers
    backward = sum(counts[k] * times[k].backward for k in counts) / layers
    n = np.minimum(np.asarray(c.offload_layers, dtype=np.float64), layers - 1.0)
    return schedule_stall(layers, n, forward, move) + schedule_stall(layers, n, backward, move)
