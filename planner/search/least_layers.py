"""The least recompute and offload layers that make a layout fit, as the search's scan records
them (search.scan's memory pass) and reads them back (its step pass, search.as_scanned).

Full recompute of N layers per model chunk (cost.recompute) and activation offload of N layers
(cost.offload) are not grid axes: the memory pass solves each fitting layout's least N from the
per-rank totals it has computed and records it per flat grid index (GridLayers); the step pass
times the layout with it, and the search's winners carry it.
"""

from __future__ import annotations


import numpy as np

from ..cost import memory_total
from ..cost.offload import offers_host_offload, offload_layers_from_totals, offload_saving
from ..cost.recompute import layer_terms, layers_from_totals, least_recompute_layers
from ..layout.axes import KNOB_FIELDS
from .grid import Grid, full
from ..specs import HardwareProfile, ModelSpec, TrainingSpec

from ..layout import BY_NAME, Candidates
from .framework_rules import profile_for
from .options import SearchOptions
from .state import Scan

# The solved axes (layout.axes) this module solves: full recompute of the least N layers per
# model chunk that fits (cost.recompute), activation offload of the least N layers (cost.offload)
RECOMPUTE, OFFLOAD = "recompute_num_layers", "offload_layers"


def offers_recompute_layers(training: TrainingSpec, opts: SearchOptions) -> bool:
    """Whether the search may choose recompute_num_layers: not pinned, and the framework
    (opts.framework, else the one training names) recomputes N layers per chunk."""
    return opts.recompute_num_layers is None and \
        profile_for(training, opts.framework).rules.recompute_num_layers


def offers_offload(hw: HardwareProfile, training: TrainingSpec, opts: SearchOptions) -> bool:
    """Whether the search may choose offload_layers: not pinned, the hardware profile states a
    host link and host memory, and the framework (opts.framework, else the one training names)
    offloads activations to host memory."""
    return getattr(opts, OFFLOAD) is None and offers_host_offload(hw) and \
        "activations" in profile_for(training, opts.framework).rules.offload


def least_recompute(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
                    usable: float):
    """Flat candidates ``c`` with the recompute_num_layers the scan gives them: for each full
    recompute layout that fits with every layer recomputed and whose twin without
    recomputation does not fit, the least N that fits (record_least_layers; pinned values kept).
    A reference for tests: the scan computes the same on its sub-grids."""
    full_rc = np.asarray(c.recompute) == 2
    if not np.any(full_rc):
        return c
    fits = memory_total(model, hw, training, c) <= usable
    twin = memory_total(model, hw, training, c.replace(recompute=np.where(full_rc, 0, c.recompute))) <= usable
    n = least_recompute_layers(model, hw, training, c, usable, verify=False)
    given = np.asarray(c.recompute_num_layers)
    return c.replace(recompute_num_layers=np.where(given > 0, given, np.where(fits & ~twin, n, 0)))


def record_least_offload(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, sub: Grid, c,
                         totals: dict, usable: float, index: np.ndarray, total: np.ndarray, out: Scan,
                         most: bool = False) -> np.ndarray:
    """Record into ``out.solved`` the least activation offload N that fits of the
    sub-grid's layouts (cost.offload.offload_layers_from_totals; ``totals``: per rank kind,
    their memory without offload) and return ``total`` (flat over the sub-grid, bytes) with
    theirs lowered by what N layers in host memory save, (1 + a) x (N - 1) x B on the one
    pipeline rank (memory.offloaded_bytes; the linear form is exact, solved with MARGIN).
    ``most``: a layout that does not fit even so gets the most N the limits allow (the closest
    miss's probe)."""
    terms = layer_terms(model, training, c, tuple(totals))
    n = full(offload_layers_from_totals(model, hw, training, c, totals, usable, terms, most), sub.shape).ravel()
    if not np.any(n > 0):
        return total
    out.solved[OFFLOAD].add(index, n)
    stored = full(np.maximum.reduce([terms[k][0] for k in totals]), sub.shape).ravel()
    return total - offload_saving(training, n, stored)


def record_least_layers(model: ModelSpec, training: TrainingSpec, sub: Grid, c, totals: dict,
                  usable: float, index: np.ndarray, fits: np.ndarray, out: Scan) -> None:
    """Record into ``out.solved`` the least N (cost.recompute.layers_from_totals) of
    the fitting full-recompute layouts of sub-grid ``sub`` whose twin without recomputation
    does not fit (where it fits, it costs no recompute at all and N stays 0), computed on the
    code-2 slice only (``c``: the sub-grid's candidates, whose cached per-layer terms the
    memory pass computed; ``totals``: per rank kind, the sub-grid's memory with every layer
    recomputed; ``index``, ``fits``: flat over the sub-grid). The twin is valid whenever the
    full-recompute layout is (no rule depends on the recompute mode but the framework's, and
    every framework offers none), so it sits in the same sub-grid."""
    axis = KNOB_FIELDS.index("recompute") + 1
    codes = sub.knobs["recompute"]
    at, none = np.flatnonzero(codes == 2), np.flatnonzero(codes == 0)
    flat = np.arange(index.size).reshape(sub.shape)
    where = np.take(flat, at, axis=axis).ravel()
    need = fits[where]
    if none.size:
        need = need & ~fits[np.take(flat, none, axis=axis).ravel()]
    if not np.any(need):
        return
    values = [np.arange(n) for n in sub.shape[1:]]
    values[axis - 1] = at
    part = sub.take(np.arange(sub.shape[0]), values)

    def cut(a):  # the code-2 slice of an array of the sub-grid's broadcast shape
        a = np.asarray(a)
        return np.take(a, at, axis=axis) if a.ndim == len(sub.shape) and a.shape[axis] > 1 else a
    sliced = {k: np.take(full(v, sub.shape), at, axis=axis) for k, v in totals.items()}
    terms = {k: tuple(cut(x) for x in v) for k, v in layer_terms(model, training, c, tuple(totals)).items()}
    n = full(layers_from_totals(model, training, part.candidates(), sliced, usable, terms), part.shape)
    out.solved[RECOMPUTE].add(index[where], np.where(need, n.ravel(), 0))


def with_scanned_layers(c, passed: Scan, index: np.ndarray, shape: tuple | None = None):
    """Candidates ``c`` (the grid's layouts at flat ``index``; ``shape``: their sub-grid's, None
    for flat ones) with what the scan recorded for them: full recompute with the least N layers
    per chunk that fits, a layout that fits only with activation offload with its least N
    (Scan.solved), and the software the step pass chose (Scan.software, code + 1); unchanged
    where nothing is recorded."""
    for name, layers in passed.solved.items():
        n = layers.find(index)
        if np.any(n > 0):
            c = c.replace(**{name: n if shape is None else n.reshape(shape)})
    for name, layers in passed.software.items():
        code = layers.find(index)
        if np.any(code > 0):
            value = code - 1 if shape is None else (code - 1).reshape(shape)
            c = c.replace(**{name: value.astype(bool) if BY_NAME[name].kind is bool else value})
    return c


def as_scanned(grid: Grid, passed: Scan, at: np.ndarray) -> Candidates:
    """The grid's layouts at flat indices ``at`` as the scan timed them (with_scanned_layers)."""
    return with_scanned_layers(grid.flat(at), passed, at)
