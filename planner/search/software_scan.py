"""The training software's switches in the search (search.software_rules): each layout timed
with the first combination its rules allow, the best timed again with every allowed combination
(search.scan's step pass and its refinement).
"""

from __future__ import annotations

from dataclasses import fields as dataclass_fields

import numpy as np

from . import objective
from ..cost import evaluate
from ..layout import Candidates
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .framework_rules import profile_for
from .grid import Grid
from .least_layers import as_scanned
from .options import SearchOptions
from .software_rules import software_masks
from .state import Scan


# The step pass times each layout with the first combination of the software axes the rules
# allow in this order, each axis's most capable value first (EP overlap on, a fused dispatcher,
# layer CUDA graphs, TP overlap on): what NVIDIA's recipes run. The best REFINE of those are then
# timed with every allowed combination (refine_software), which may rank them anew: a switch
# can cost more than it saves (a host-bound dropless MoE with EP overlap; reference/
# moe_performance.md 3.3), and a layout outside the best REFINE would have to gain more from
# its software than the REFINE-th is behind the best to be missed (tests/test_software_search.py
# checks the two against timing every combination).
PREFERENCE = ("moe_a2a_overlap", "moe_dispatcher", "cuda_graphs", "tp_comm_overlap")
REFINE = 256  # layouts timed with every software combination, at least 8 x keep


def refined(opts: SearchOptions) -> int:
    """How many of the best layouts refine_software times with every software combination;
    each sub-grid keeps at least that many, so the refined set (the best by the first pass,
    ties included) does not depend on how the scan cut the grid."""
    return max(REFINE, 8 * opts.keep)


def _widened(c, software: dict) -> tuple:
    """(candidates ``c`` with the ``software`` axes ({axis: codes}) as trailing broadcast
    dimensions, c's broadcast shape, the axes' sizes)."""
    k = len(software)
    fields = {f.name: np.asarray(getattr(c, f.name)) for f in dataclass_fields(c)}
    base = np.broadcast_shapes(*(v.shape for v in fields.values()))
    fields = {n: v.reshape(v.shape + (1,) * k) for n, v in fields.items()}
    for j, (name, values) in enumerate(software.items()):
        fields[name] = values.reshape((1,) * len(base) + tuple(-1 if i == j else 1 for i in range(k)))
    return Candidates(**fields), base, tuple(v.size for v in software.values())


def _unravel(index: np.ndarray, sizes: tuple) -> tuple:
    """np.unravel_index of an array of any shape, through its flat copy: numpy 2.4.6 unravels
    some arrays with unit dimensions wrongly (shape (152, 4, 7, 4, 1, 3, 1): 40,293 of 51,072
    random indices into (2, 2, 2, 2); tests/test_software_search.py)."""
    flat = np.unravel_index(np.ravel(index), sizes)
    return tuple(x.reshape(np.shape(index)) for x in flat)


def _allowed(profile, hw: HardwareProfile, model: ModelSpec, training: TrainingSpec, wide,
             shape: tuple, axes: int | None = None) -> np.ndarray:
    """Where the software rules (search.software_rules) allow each combination: bool array of
    ``shape`` (candidates' shape + the axes' sizes); with ``axes`` (how many trailing axes are
    the software's), of the rules' own shape on the candidates' axes (length one where no rule
    depends on one) and the software axes' sizes."""
    ok = np.ones((), dtype=bool)
    for mask in software_masks(profile, model, training, wide, hw).values():
        ok = ok & mask  # each mask at its own fields' broadcast shape: no stacked copy
    if axes is not None:
        ok = np.reshape(ok, (1,) * (len(shape) - np.ndim(ok)) + np.shape(ok))
        shape = ok.shape[:len(shape) - axes] + shape[len(shape) - axes:]
    return np.broadcast_to(ok, shape)


def preferred_software(profile, hw: HardwareProfile, model: ModelSpec, training: TrainingSpec, c,
                       software: dict) -> dict:
    """{axis: codes of c's broadcast shape}: each candidate's first allowed combination of the
    ``software`` axes ({axis: codes}, Grid.software) in PREFERENCE order (the axes' defaults,
    which every framework runs, where none other is allowed)."""
    order = {n: software[n][::-1] for n in PREFERENCE if n in software}
    wide, base, sizes = _widened(c, order)
    ok = _allowed(profile, hw, model, training, wide, base + sizes, len(sizes))
    ok = ok.reshape(ok.shape[:len(base)] + (-1,))   # a copy on the rules' own shape only
    first = np.where(ok.any(axis=-1), np.argmax(ok, axis=-1), ok.shape[-1] - 1)
    picks = _unravel(first, sizes)
    return {name: _narrowest(values[picks[j]]) for j, (name, values) in enumerate(order.items())}


def _narrowest(codes: np.ndarray) -> np.ndarray:
    """``codes`` with every axis along which they do not change cut to length one: the same
    values once broadcast, and the cost model computes what depends on them on that smaller
    shape (DeepSeek-V3's sub-grids: the dispatcher one code, the CUDA-graph scope varying over
    the split rows, ZeRO stages and recomputation only: its step pass a third less CPU time).
    Array."""
    for axis in range(codes.ndim):
        if codes.shape[axis] > 1:
            first = codes[(slice(None),) * axis + (slice(0, 1),)]
            if np.array_equal(codes, np.broadcast_to(first, codes.shape)):
                codes = first
    return codes


def software_step(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, profile, c,
                  software: dict) -> tuple:
    """(step seconds, {axis: chosen code}) of candidates ``c`` with each one's fastest allowed
    combination of the ``software`` axes' values ({axis: codes}, search.grid.Grid.software):
    the axes appended to ``c`` as trailing broadcast dimensions, evaluated at once (what does
    not depend on them is computed once), combinations the software rules refuse
    (search.software_rules) timed as never ending; the first of equal ones (the defaults
    first). Arrays of ``c``'s broadcast shape."""
    if not software:
        return evaluate(model, hw, training, c, summary=True).time["step"], {}
    wide, base, sizes = _widened(c, software)
    step = np.broadcast_to(evaluate(model, hw, training, wide, summary=True).time["step"], base + sizes)
    ok = _allowed(profile, hw, model, training, wide, base + sizes)
    flat = np.where(ok, step, np.inf).reshape(base + (-1,))
    best = np.argmin(flat, axis=-1)
    picks = _unravel(best, sizes)
    return np.take_along_axis(flat, best[..., None], -1)[..., 0], \
        {name: values[picks[j]].astype(np.int64) for j, (name, values) in enumerate(software.items())}


def refine_software(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
                    opts: SearchOptions, tokens: float | None, out: Scan) -> None:
    """Time the pool's best max(REFINE, 8 x keep) layouts (and the exact ties at that cut) and
    the preferred pools' best ``keep`` with their fastest allowed software (software_step), and
    put them back in ``out``'s pools with their new scores and software; with a deadline, the
    fastest layout too."""
    if not grid.software:
        return
    profile = profile_for(training, opts.framework)
    if out.fastest_index >= 0 and opts.deadline_s is not None:  # the fastest, named when none is in time
        at = np.array([out.fastest_index])
        c = as_scanned(grid, out, at)
        step, chosen = software_step(model, hw, training, profile, c, grid.software)
        _, wall = objective.layout_scores(model, hw, training, c, step,
                                          training.global_batch_size * training.seq_length / step,
                                          opts, tokens)
        for name, codes in chosen.items():
            out.software[name].add(at, codes + 1)
        out.fastest_s = float(wall[0])
    if not out.pool_score:
        return
    scores, index = np.concatenate(out.pool_score), np.concatenate(out.pool_index)
    n = min(refined(opts), scores.size)
    cut = np.partition(scores, scores.size - n)[scores.size - n]
    top = scores >= cut
    at = index[top]
    extra = [np.zeros(0, dtype=at.dtype)]
    for ps, pi in out.pools.values():
        ps, pi = np.concatenate(ps), np.concatenate(pi)
        k = min(opts.keep, ps.size)
        if k:
            extra.append(pi[ps >= np.partition(ps, ps.size - k)[ps.size - k]])
    every = np.concatenate([at, np.setdiff1d(np.concatenate(extra), at)])
    c = as_scanned(grid, out, every)
    step, chosen = software_step(model, hw, training, profile, c, grid.software)
    tokens_per_s = training.global_batch_size * training.seq_length / step
    score, wall = objective.layout_scores(model, hw, training, c, step, tokens_per_s, opts, tokens)
    for name, codes in chosen.items():
        out.software[name].add(every, codes + 1)
    out.pool_score, out.pool_index = [scores[~top]], [index[~top]]
    out.keep(score[:at.size], at, at.size, None if opts.deadline_s is None else wall[:at.size])
    order = np.argsort(every)
    for name, (ps, pi) in list(out.pools.items()):
        ps, pi = np.concatenate(ps), np.concatenate(pi)
        where = np.minimum(np.searchsorted(every[order], pi), every.size - 1)
        found = every[order][where] == pi
        out.pools[name] = ([np.where(found, score[order][where], ps)], [pi])
