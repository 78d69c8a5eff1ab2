"""The least full recomputation that fits: N layers of each model chunk (formulas.md 3.3).

Megatron's block method (--recompute-granularity full --recompute-method block
--recompute-num-layers N) recomputes the first N layers of each model chunk and lets the rest
store their activations. On pipeline rank r with c_r layers per chunk, q_r = min(N, c_r)/c_r
of its in-flight layers keep only their input (memory.block_recompute_layer), so below c_r its
memory falls linearly in N:

    M_r(N) = M_r(none) - (1 + a) * H_r * (N / c_r) * (S_r - F_r),    N < c_r

with M_r(none) its memory without recomputation, H_r its in-flight layers
(pipeline.inflight_layers), S_r / F_r a layer's bytes stored / fully recomputed
(memory.activation_per_layer) and a the allocator's share of the working set
(estimate.reserve_bytes). The least N is the largest over ranks of the least N_r with
M_r(N_r) <= usable; the step time grows with N (N layers' forward again per chunk), so it is
the cheapest full recomputation that fits. Everything is elementwise over candidates.
"""

from __future__ import annotations

import numpy as np

from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import memory, pipeline
from .estimate import memory_by_rank, memory_total, rank_kinds
from .blocks import block_kinds


# The linear form is solved for usable x (1 - MARGIN), so that rounding in memory_total (a few
# ulps) never puts the chosen N over ``usable``.
MARGIN = 1e-9


def least_recompute_layers(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                           usable: float, verify: bool = True) -> np.ndarray:
    """recompute_num_layers per candidate: for full recompute (code 2), the least N >= 1 such
    that recomputing the first N layers of each model chunk fits within ``usable`` bytes per GPU;
    0 (every layer, Megatron's uniform method with 1 layer) where N would cover the largest
    chunk, where even that does not fit, or for the other recompute modes. Candidates with a
    recompute_num_layers already set keep it. Int64 array, broadcast shape of ``c``.

    A rank with N >= c_r recomputes every layer, as with N = 0. ``verify``: check N with
    memory_total (the search's own fit test) and return 0 where it does not fit (a rank whose
    all-layers memory exceeds its N < c_r one); a layout that fits with every layer
    recomputed needs no check: each rank fits, with N < c_r by the linear form (solved with
    MARGIN), with N >= c_r as with every layer. Raises nothing."""
    full = np.asarray(c.recompute) == 2
    given = np.asarray(c.recompute_num_layers)
    if not np.any(full):
        return np.zeros(np.shape(full), dtype=np.int64) + given
    every = c.replace(recompute_num_layers=np.zeros_like(given))
    kinds = rank_kinds(c, model)
    per_rank = memory_by_rank(model, hw, training, every, kinds)
    n = layers_from_totals(model, training, every, {k: per_rank[k]["total"] for k in kinds}, usable)
    n = np.where(given > 0, given, n)
    if verify and np.any((n > 0) & (given == 0)):
        fits = memory_total(model, hw, training, c.replace(recompute_num_layers=n)) <= usable
        n = np.where(fits | (given > 0), n, 0)
    return n


def layers_from_totals(model: ModelSpec, training: TrainingSpec, c, totals: dict, usable: float,
                       terms: dict | None = None) -> np.ndarray:
    """The least N of the module docstring from each rank kind's memory with every layer
    recomputed (``totals``: {rank kind: bytes}, memory_by_rank's totals for ``c`` with
    recompute_num_layers 0): M_r(none) = M_r(all) + (1 + a)(H_r (S_r - F_r) - S_r) (the all-layers
    memory holds F_r per layer and one layer's working set S_r), then N_r as above. 0 where
    the recompute code is not 2 or some rank's N_r would cover every chunk. ``terms``: {rank
    kind: (S_r, F_r, H_r)} computed by the caller (layer_terms), else here. Int64 array."""
    full = np.asarray(c.recompute) == 2
    grow = 1.0 + training.reserve_allocator
    need, largest = 1.0, 1.0
    terms = terms or layer_terms(model, training, c, tuple(totals))
    for kind, total in totals.items():
        rank = memory.rank_index(c, kind)
        chunk = np.maximum(c.rank_chunk_layers(model.num_layers, rank)[0], 1.0)
        stored, recomputed, held = terms[kind]
        saving = grow * held * (stored - recomputed)  # none -> every layer, less the working set
        deficit = total + (saving - grow * stored) - usable * (1.0 - MARGIN)
        with np.errstate(over="ignore"):    # no saving (nothing held in flight): inf, every layer
            n_rank = np.where(deficit <= 0, 1.0, np.ceil(deficit * chunk / np.maximum(saving, 1e-300)))
        n_rank = np.where(n_rank >= chunk, np.inf, np.maximum(n_rank, 1.0))  # inf: every layer
        need, largest = np.maximum(need, n_rank), np.maximum(largest, chunk)
    return np.where(full & np.isfinite(need) & (need < largest), need, 0.0).astype(np.int64)


def layer_terms(model: ModelSpec, training: TrainingSpec, c, kinds) -> dict:
    """{rank kind: (S_r, F_r, H_r)}: a layer's stored and fully recomputed bytes (_layer_bytes)
    and the in-flight layers of each rank kind in ``kinds``. Broadcast arrays."""
    m = c.num_microbatches(training.global_batch_size)
    layer = _layer_bytes(model, training, c, None) if _uniform(model) else None
    out = {}
    for kind in kinds:
        rank = memory.rank_index(c, kind)
        stored, recomputed = layer or _layer_bytes(model, training, c, rank)
        out[kind] = (stored, recomputed, pipeline.inflight_layers(c, model.num_layers, m, rank))
    return out


def _layer_bytes(model: ModelSpec, training: TrainingSpec, c, rank) -> tuple:
    """(S_r, F_r): a layer's stored and fully recomputed bytes on pipeline rank ``rank`` (None:
    the model's mean layer, which memory.activation_bytes_by_stage takes where every layer is
    alike). Broadcast arrays on the activation fields' shapes."""
    stored = memory.activation_per_layer(model, training, c, np.zeros_like(c.recompute), rank)
    recomputed = memory.activation_per_layer(model, training, c, np.full_like(c.recompute, 2), rank)
    return stored, recomputed


def _uniform(model: ModelSpec) -> bool:
    """Whether every layer is an attention + MLP block (memory.activation_bytes_by_stage takes
    the model's mean layer then, and so does this)."""
    return block_kinds(model) == ("attention", "mlp")
