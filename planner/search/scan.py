"""The scan of a search grid: rules, then memory, then step time, on sub-grids (planner.search).

Every layout of the grid is checked against the rules (search.rules.constraint_masks, boolean
masks on broadcast blocks of split rows). What a split row keeps is close to a box: some values of each
knob axis (SP only where tp > 1, the micro-batch sizes that divide the batch with its dp, the
vpp values its pipeline split interleaves with, ...), and what fits of those is again close to a
box (the ZeRO stages whose model states fit, the micro-batch sizes whose activations do). So
the rows are sorted by their box, rows of similar boxes merged, and each group evaluated as a
sub-grid (Grid.take) of about CHUNK layouts: the cost model still broadcasts (a term of tp and
the micro-batch size is computed once per such pair), and it computes only the boxes' layouts.
Memory runs on the boxes of the valid layouts, step time on the boxes of the fitting ones;
before memory, the layouts whose model states alone exceed the usable memory (on the small
shape of split rows x ZeRO stage, cost.estimate.states_floor) are counted as not fitting and
dropped. A layout's values do not depend on the sub-grid that holds it (tests/test_scan.py,
tests/test_search_scale.py).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from . import objective
from ..cost import evaluate
from ..cost.estimate import states_floor
from ..cost.estimate import memory_by_rank, rank_kinds
from ..cost.offload import offload_candidates, offload_runs, uses_host_memory
from .least_layers import (offers_offload, offers_recompute_layers, record_least_layers,
                           record_least_offload, with_scanned_layers)
from .options import SearchOptions
from .parallel import run_parts
from .state import FIT_RULE, Scan
from .software_scan import preferred_software, refine_software, refined
from .framework_rules import profile_for
from ..layout.axes import KNOB_FIELDS
from .grid import Grid, full
from .rules import constraint_masks
from .ties import Prefer, preferred
from ..specs import HardwareProfile, ModelSpec, TrainingSpec


HOST_RULE = "offloaded activations within the host memory, with host-link bandwidth left"
CHUNK = 65_536  # layouts per evaluated sub-grid: big enough for numpy, small enough for the cache
RULES_CHUNK = 8 * CHUNK  # layouts per block of the rules (boolean masks: 1 byte a layout)
# One more call of the cost model costs about as much as this many layouts of a sub-grid
# (measured on the MoE searches: ~3.5 ms a call of the step time against ~0.2 us a layout).
CALL_COST = 16_384
# Rows are sorted by their box on these axes first: SP and vpp follow from the split (SP with
# tp > 1 for MoE, the vpp an uneven split allows), so rows of one kind sit together and a merge
# rarely doubles a box; then recomputation, ZeRO stage and micro-batch size (measured: about
# half the sub-grids and a fifth fewer layouts than the grid's own axis order).
SORT_AXES = tuple(KNOB_FIELDS.index(name) for name in (
    "sequence_parallel", "vpp", "pipeline_schedule", "recompute", "zero_stage", "micro_batch_size",
    "distributed_optimizer"))

Boxes = list  # per knob axis k, a (split rows, len(knob k)) bool array: the values a row keeps


def scan(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
         opts: SearchOptions, usable: float, tokens: float | None, prefer: Prefer | None = None) -> Scan:
    """Evaluate ``grid``: rules, fit within ``usable`` bytes, score by the objective, keep the
    best (and, with ``prefer``, the best preferred layouts: search.ties). Cost grows linearly
    with grid.size.

    Every layout goes through the rules (boolean masks on broadcast blocks of RULES_CHUNK
    layouts) and the model-states floor; memory is computed on the sub-grids that hold the
    valid layouts, step time on the sub-grids that hold the fitting ones (``chunks``). When
    nothing fits, the closest miss is taken over every valid layout, the floor's included."""
    small = np.uint8 if model.num_layers < 256 else np.uint16
    out = Scan.of_grid(grid.size, small)
    state, boxes = rules_pass(model, hw, training, grid, opts, out, usable)  # state: valid
    boxes = memory_pass(model, hw, training, grid, usable, state, boxes, out,  # state: fits
                        offers_recompute_layers(training, opts), offers_offload(hw, training, opts),
                        roomy=None if prefer is None else prefer.roomy_bytes)
    if out.fitting == 0 and out.pruned.get(FIT_RULE, 0):  # the closest miss, of every valid layout
        probe = Scan.of_grid(grid.size, small)
        valid, every = rules_pass(model, hw, training, grid, opts, probe)
        memory_pass(model, hw, training, grid, usable, valid, every, probe,
                    choose_offload=offers_offload(hw, training, opts), most_offload=True)
        out.miss_index, out.miss_over = probe.miss_index, probe.miss_over
        out.miss_layers = probe.layers_at(probe.miss_index)
    step_pass(model, hw, training, grid, opts, tokens, state, boxes, out, prefer)
    refine_software(model, hw, training, grid, opts, tokens, out)
    out.pruned.setdefault(FIT_RULE, 0)
    return out


def first_fit(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
              opts: SearchOptions, usable: float) -> int | None:
    """The fewest GPUs (``grid.split["gpus"]``) of a layout of ``grid`` that passes the rules and
    fits within ``usable`` bytes (with the least activation offload where the search would
    choose one), for a grid whose split rows ascend in GPU count: rules_pass and memory_pass on
    blocks of rows, the first block with a fit ending the scan. None if no layout fits."""
    rows = grid.rows_per_chunk(RULES_CHUNK)
    per_row = grid.size // max(grid.shape[0], 1)
    offload = offers_offload(hw, training, opts)
    for lo in range(0, grid.shape[0], rows):
        part = grid.rows(lo, lo + rows)
        out = Scan.of_grid(part.size)
        fits, boxes = rules_pass(model, hw, training, part, opts, out, usable)
        memory_pass(model, hw, training, part, usable, fits, boxes, out, choose_offload=offload)
        if out.fitting:  # memory_pass turned ``fits`` from valid into fitting
            return int(part.split["gpus"][np.flatnonzero(fits) // per_row].min())
    return None


def step_pass(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
              opts: SearchOptions, tokens: float | None, fits: np.ndarray, boxes: Boxes,
              out: Scan, prefer: Prefer | None = None) -> None:
    """Step time and score of the fitting layouts (``fits``, flat over the grid), on the
    sub-grids of their ``boxes``; each sub-grid's best go to ``out.keep``, and with ``prefer``
    the best of its preferred layouts (roomy, memory_pass; no unchecked term, nothing
    unconventional: search.ties.preferred) to ``out.keep_preferred``. Full recompute is timed
    with the least N layers per chunk that fits, a layout that fits only with activation
    offload with its least N (``out.solved``, memory_pass). The sub-grids are dealt over
    processes where the pass is large (search.parallel); what is kept does not depend on it."""
    profile = profile_for(training, opts.framework)
    parts = list(chunks(boxes, CHUNK))
    sizes = [len(rows) * int(np.prod([len(v) for v in values])) for rows, values in parts]

    def work(mine: list, into: Scan) -> None:
        for rows, values in mine:
            _step_sub_grid(model, hw, training, grid, opts, tokens, fits, into, prefer, profile,
                           rows, values)
    run_parts(work, parts, sizes, out)


def _step_sub_grid(model, hw, training, grid, opts, tokens, fits, out, prefer, profile, rows,
                   values) -> None:
    """step_pass on one sub-grid (rows, knob value indices) into ``out``."""
    index = grid.index_of(rows, values)
    sub = grid.take(rows, values)
    c = with_scanned_layers(sub.candidates(), out, index, sub.shape)  # least N (memory_pass)
    chosen = preferred_software(profile, hw, model, training, c, grid.software) if grid.software else {}
    # the simulated pipeline schedules are simulated only where the layout fits
    est = evaluate(model, hw, training, c.replace(**chosen), summary=True,
                   where=fits[index].reshape(sub.shape))
    step = est.time["step"]
    score, wall = objective.layout_scores(model, hw, training, c, step,
                                          est.throughput["tokens_per_s"], opts, tokens)
    fit = np.flatnonzero(fits[index])
    for name, codes in chosen.items():
        out.software[name].add(index[fit], full(codes.astype(np.int64) + 1, sub.shape).ravel()[fit])
    score = full(score, sub.shape).ravel()[fit]
    wall = None if opts.deadline_s is None else full(wall, sub.shape).ravel()[fit]
    n = refined(opts) if grid.software else opts.keep
    out.keep(score, index[fit], n, wall)
    if prefer is not None and out.roomy is not None:
        ok = out.roomy[index[fit]]
        if np.any(ok):
            out.keep_class("roomy", score[ok], index[fit][ok], n)
            ok &= full(preferred(model, hw, training, c.replace(**chosen), prefer.bands,
                                 prefer.framework), sub.shape).ravel()[fit]
            out.keep_class("preferred", score[ok], index[fit][ok], n)


def rules_pass(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
               opts: SearchOptions, out: Scan, usable: float | None = None) -> tuple[np.ndarray, Boxes]:
    """Every layout of ``grid`` through the rules, in blocks of split rows; counts what each
    rule prunes into ``out``. With ``usable`` (bytes), the valid layouts whose model states
    alone exceed it (cost.estimate.states_floor) are counted as not fitting and dropped.
    Returns (valid: flat bool array over the grid, boxes that hold the valid layouts: per knob
    axis, the values each row keeps under every rule)."""
    valid = np.zeros(grid.size, dtype=bool)
    boxes = [np.zeros((grid.shape[0], n), dtype=bool) for n in grid.shape[1:]]
    per_row = grid.size // max(grid.shape[0], 1)
    rows = grid.rows_per_chunk(RULES_CHUNK)
    if usable is not None:  # model states depend on the split and ZeRO fields only: all rows at once
        light = states_floor(model, hw, training, grid.candidates()) <= usable
    for lo in range(0, grid.shape[0], rows):
        hi = min(lo + rows, grid.shape[0])
        shape = (hi - lo, *grid.shape[1:])
        alive, kept = np.ones(shape, dtype=bool), [np.ones((shape[0], n), dtype=bool) for n in shape[1:]]
        n_alive = alive.size
        c = grid.candidates(lo, hi)
        for rule, ok in constraint_masks(model, training, hw, c,
                                         opts.allow_cross_node_tp, opts.framework).items():
            left = n_alive
            if not np.all(ok):  # most rules pass every layout: no pass over the block for them
                alive &= ok
                left = int(np.count_nonzero(alive))
                kept = [a & b for a, b in zip(kept, boxes_of(ok, shape))]
            out.pruned[rule] = out.pruned.get(rule, 0) + n_alive - left
            out.alive_after[rule] = out.alive_after.get(rule, 0) + left
            n_alive = left
        if usable is not None:
            alive &= light[lo:hi]
            out.pruned[FIT_RULE] = out.pruned.get(FIT_RULE, 0) + n_alive - int(np.count_nonzero(alive))
            kept = [a & b for a, b in zip(kept, boxes_of(light[lo:hi], shape))]
        valid[lo * per_row:hi * per_row] = alive.ravel()
        anywhere = alive.reshape(shape[0], -1).any(axis=1)[:, None]
        for box, values in zip(boxes, kept):
            box[lo:hi] = values & anywhere
    return valid, boxes


def memory_pass(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
                usable: float, state: np.ndarray, boxes: Boxes, out: Scan,
                choose_layers: bool = False, choose_offload: bool = False,
                most_offload: bool = False, roomy: float | None = None) -> Boxes:
    """Peak memory of the valid layouts (``state``, flat over the grid), on the sub-grids of
    their ``boxes``; records the fit test into ``out`` and turns ``state`` into which layouts
    fit. Full recompute is tested with every layer recomputed (the most it saves); with
    ``choose_layers`` each fitting one gets the least N layers per chunk that fits
    (scan_layers.record_least_layers, from the same per-rank totals) in
    ``out.solved``; with ``choose_offload`` a layout with pp 1 and no recomputation
    that does not fit is tested with the least activation offload that fits
    (cost.offload), recorded in ``out.solved`` (with
    ``most_offload``, one that does not fit even so with the most the limits allow: the closest
    miss's probe). With ``roomy`` (bytes), which fitting layouts stay within it
    (``out.note_roomy``). Returns the boxes of the fitting layouts. The sub-grids are dealt
    over processes where the pass is large (search.parallel); what it records does not depend
    on it."""
    fitting = [np.zeros_like(box) for box in boxes]
    parts = list(chunks(boxes, CHUNK))
    sizes = [len(rows) * int(np.prod([len(v) for v in values])) for rows, values in parts]

    def work(mine: list, into: Scan) -> list:
        return [_memory_sub_grid(model, hw, training, grid, usable, state, into, choose_layers,
                                 choose_offload, most_offload, roomy, rows, values)
                for rows, values in mine]

    def apply(part: tuple, result: tuple) -> None:  # this process: the state, roomy and boxes
        rows, values = part
        index = grid.index_of(rows, values)
        fits, is_roomy = result
        if roomy is not None:
            out.note_roomy(index, is_roomy, grid.size)
        state[index] = fits
        shape = (len(rows), *(len(v) for v in values))
        for box, kept, sel in zip(fitting, boxes_of(fits.reshape(shape)), values):
            box[np.ix_(rows, sel)] = kept
    run_parts(work, parts, sizes, out, apply, own_solved=True)
    return fitting


def _memory_sub_grid(model, hw, training, grid, usable, state, out, choose_layers, choose_offload,
                     most_offload, roomy, rows, values) -> tuple:
    """memory_pass on one sub-grid (rows, knob value indices): counts, closest miss and solved
    axes into ``out``; returns (which fit, which of them stay within ``roomy`` or None), flat
    over the sub-grid. ``state`` is read, not written."""
    index = grid.index_of(rows, values)
    sub = grid.take(rows, values)
    c = sub.candidates()
    kinds = rank_kinds(c, model)
    totals = {k: v["total"] for k, v in memory_by_rank(model, hw, training, c, kinds).items()}
    plain = full(np.maximum.reduce(list(totals.values())), sub.shape).ravel()
    total = plain
    alive = state[index]
    candidates = offload_candidates(c) if choose_offload else False
    if np.any(candidates) and np.any(alive & (plain > usable) & full(candidates, sub.shape).ravel()):
        total = record_least_offload(model, hw, training, sub, c, totals, usable, index, plain, out,
                                     most_offload)
    elif np.any(uses_host_memory(c)):  # pinned: a rule of its own (HOST_RULE)
        runs = full(offload_runs(model, hw, training, c), sub.shape).ravel()
        out.pruned[HOST_RULE] = out.pruned.get(HOST_RULE, 0) + int(np.count_nonzero(alive & ~runs))
        out.alive_after[HOST_RULE] = out.alive_after.get(HOST_RULE, 0) + int(np.count_nonzero(alive & runs))
        alive = alive & runs
    fits = out.fit(total, alive, index, usable)
    if choose_layers and np.any(sub.knobs["recompute"] == 2):  # twins judged without offload
        record_least_layers(model, training, sub, c, totals, usable, index, alive & (plain <= usable), out)
    return fits, None if roomy is None else fits & (total <= roomy)


def boxes_of(mask: np.ndarray, shape: tuple[int, ...] | None = None) -> Boxes:
    """Per knob axis k (axes 1..), a (rows, len(k)) bool array: which values of k some True
    layout of each row has. ``mask`` broadcasts to ``shape`` (default: its own) and is reduced
    on its own shape, first over the axes before k (long contiguous runs), then those after."""
    mask = np.asarray(mask)
    shape = mask.shape if shape is None else shape
    mask = mask.reshape((1,) * (len(shape) - mask.ndim) + mask.shape)
    rows, own = mask.shape[0], mask.shape[1:]
    anywhere = mask.reshape(rows, -1).any(axis=1)[:, None]
    out = []
    for axis, n in enumerate(own):
        if n == 1:
            kept = anywhere
        else:
            before, after = int(np.prod(own[:axis])), int(np.prod(own[axis + 1:]))
            kept = mask.reshape(rows, before, n * after)
            kept = np.logical_or.reduce(kept, axis=1) if before > 1 else kept[:, 0]
            kept = kept.reshape(rows, n, after).any(axis=2) if after > 1 else kept
        out.append(np.broadcast_to(kept, (shape[0], shape[axis + 1])))
    return out


def chunks(boxes: Boxes, target: int, order=SORT_AXES) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """Sub-grids (rows ascending, knob value indices per axis) that cover every row's box:
    rows sorted by their box (its axes in ``order``), equal boxes together, neighbouring boxes
    merged into their union while that costs fewer layouts than another call of the cost model
    (CALL_COST) and stays within ``target`` layouts; a box beyond ``target`` is split by rows.
    Rows with an empty box (nothing kept) are in none."""
    rows = np.flatnonzero(np.logical_and.reduce([box.any(axis=1) for box in boxes]))
    if rows.size == 0:
        return
    key = np.concatenate(boxes, axis=1)[rows]
    by = np.concatenate([boxes[axis][rows] for axis in order], axis=1)
    order = np.lexsort(by.T[::-1])
    rows, key = rows[order], key[order]
    starts = np.flatnonzero(np.r_[True, (key[1:] != key[:-1]).any(axis=1)])
    offsets = np.r_[0, np.cumsum([box.shape[1] for box in boxes])[:-1]]

    def size(box: np.ndarray) -> int:  # layouts per row of a box (per-axis masks, concatenated)
        return int(np.prod(np.add.reduceat(box, offsets, dtype=np.int64)))

    group, union, n, per_row = [], None, 0, 0  # rows of the sub-grid being built, its box
    for lo, hi in zip(starts.tolist(), np.r_[starts[1:], rows.size].tolist()):
        box, box_size = key[lo], size(key[lo])
        if union is not None:
            merged = (n + hi - lo) * size(union | box)
            if merged <= min(target, n * per_row + (hi - lo) * box_size + CALL_COST):
                group.append(rows[lo:hi])
                union, n, per_row = union | box, n + hi - lo, merged // (n + hi - lo)
                continue
            yield _sub_grid(group, union, offsets)
        step = max(1, target // box_size)
        whole = (hi - lo - 1) // step  # a box beyond target: sub-grids of ``step`` rows of it
        for start in range(lo, lo + whole * step, step):
            yield _sub_grid([rows[start:start + step]], box, offsets)
        group, union, n, per_row = [rows[lo + whole * step:hi]], box, hi - lo - whole * step, box_size
    if union is not None:
        yield _sub_grid(group, union, offsets)


def _sub_grid(group: list[np.ndarray], key: np.ndarray, offsets: np.ndarray):
    """(rows ascending, value indices per knob axis) of a box."""
    return np.sort(np.concatenate(group)), [np.flatnonzero(part) for part in np.split(key, offsets[1:])]
