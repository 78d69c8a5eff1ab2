"""The scan's sub-grids (search.scan): boxes of a mask, the sub-grids that cover them, and
memory that does not depend on what else a sub-grid holds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import catalog
from planner.cost import memory_total
from planner.cost.estimate import memory_by_rank
from planner.search.grid import Grid
from planner.search.scan import boxes_of, chunks
from planner.search.options import SearchOptions
from planner.search.grid import build_grid
from planner.layout import Layout
from planner.specs import TrainingSpec
from planner.layout import Candidates

shapes = st.lists(st.integers(1, 4), min_size=2, max_size=6).map(tuple)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), shape=shapes, density=st.floats(0.0, 1.0), seed=st.integers(0, 2**16))
def test_boxes_are_the_values_some_true_layout_of_the_row_has(rows, shape, density, seed):
    mask = np.random.default_rng(seed).random((rows, *shape)) < density
    for axis, box in enumerate(boxes_of(mask), start=1):
        others = tuple(a for a in range(1, mask.ndim) if a != axis)
        assert box.shape == (rows, mask.shape[axis])
        assert np.array_equal(box, mask.any(axis=others))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), shape=shapes, density=st.floats(0.05, 1.0),
       target=st.integers(1, 200), seed=st.integers(0, 2**16), data=st.data())
def test_sub_grids_cover_every_box_exactly_once(rows, shape, density, target, seed, data):
    """Every layout of every row's box lies in exactly one sub-grid, a row in one sub-grid only,
    rows ascending in each; a sub-grid holds at most ``target`` layouts unless one row's box
    alone is larger (it is then that row alone)."""
    rng = np.random.default_rng(seed)
    boxes = [rng.random((rows, n)) < density for n in shape]
    covered = np.zeros((rows, *shape), dtype=int)
    seen = []
    order = data.draw(st.permutations(range(len(shape))))
    for sub_rows, values in chunks(boxes, target, order):
        assert np.all(np.diff(sub_rows) > 0)
        seen += sub_rows.tolist()
        size = sub_rows.size * int(np.prod([v.size for v in values]))
        assert size <= target or sub_rows.size == 1
        covered[np.ix_(sub_rows, *values)] += 1
    wanted = np.ones((rows, *shape), dtype=bool)
    for axis, box in enumerate(boxes, start=1):
        wanted &= box.reshape((rows,) + tuple(box.shape[1] if a == axis else 1
                                              for a in range(1, len(shape) + 1)))
    assert np.all(covered[wanted] == 1) and np.all(covered <= 1)
    assert len(seen) == len(set(seen))


def test_layout_memory_does_not_depend_on_what_is_evaluated_with_it():
    """Llama 4 Maverick has an MoE layer every other layer (layer_freq 2): on pp 16 with 48
    layers, rank 0 holds layers 0-2 (one MoE layer, 1) and rank 1 layers 3-5 (two, 3 and 5),
    with fewer micro-batches in flight than rank 0 but more than the last rank. Its even
    split's peak memory is the largest of every rank kind's, alone or next to an uneven split
    (whose middle rank the scan always took)."""
    m, hw = catalog.resolve_model("llama4-maverick"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=m.training.seq_length, global_batch_size=m.training.global_batch_size)
    even = Layout(tp=2, cp=4, pp=16, dp=1, ep=8, zero_stage=2, micro_batch_size=1,
                  recompute="none", sequence_parallel=True, vpp=1)
    uneven = even.model_copy(update=dict(pp=8, dp=2, first_stage_layers=3, last_stage_layers=3))
    alone = memory_total(m, hw, tr, Candidates.from_layouts([even]))
    mixed = memory_total(m, hw, tr, Candidates.from_layouts([even, uneven]))
    per_rank = memory_by_rank(m, hw, tr, Candidates.from_layouts([even]), ("first", "middle", "last"))
    assert alone[0] == mixed[0] == max(float(v["total"][0]) for v in per_rank.values())
    assert per_rank["middle"]["total"][0] > max(per_rank["first"]["total"][0],
                                                per_rank["last"]["total"][0])


def test_sub_grid_indices_are_the_grid_layouts():
    m, hw = catalog.resolve_model("llama3-8b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    grid = build_grid(m, hw, tr, 16, SearchOptions(max_micro_batch_size=4, max_vpp=4))
    rows, values = np.array([1, 4, 5]), [np.array([0, 2]), np.array([1]), np.array([0, 3]),
                                         np.array([1]), np.array([0, 1]), np.array([0]),
                                         np.array([0])]  # the pipeline schedule: IMPLIED
    sub = grid.take(rows, values)
    index = grid.index_of(rows, values)
    assert isinstance(sub, Grid) and index.size == sub.size == 3 * 2 * 1 * 2 * 1 * 2 * 1 * 1
    assert np.all(np.diff(index) > 0)
    flat, mine = grid.flat(index), sub.flat(np.arange(sub.size))
    for name in ("tp", "pp", "dp", "zero_stage", "micro_batch_size", "recompute", "vpp",
                 "pipeline_schedule"):
        assert np.array_equal(getattr(flat, name), getattr(mine, name)), name


@settings(max_examples=10, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "gpt3-175b", "mixtral-8x7b", "deepseek-v2-lite",
                             "llama4-scout", "gpt-oss-20b"]),
       nodes=st.sampled_from([1, 2, 8]), batch=st.sampled_from([64, 512]),
       framework=st.sampled_from(["megatron-core", "deepspeed", "torchtitan"]))
def test_states_floor_is_below_every_layouts_memory(name, nodes, batch, framework):
    """The floor the scan drops layouts by (model states of the first and last rank plus the
    least reserve) never exceeds a layout's peak memory, on every framework's accounting."""
    from planner.cost.estimate import states_floor
    from planner.frameworks.profile import resolve_training
    from planner.search.grid import full
    m, hw = catalog.resolve_model(name), catalog.resolve_hardware("dgx-h100")
    tr = resolve_training(TrainingSpec(seq_length=4096, global_batch_size=batch),
                          catalog.resolve_framework(framework))
    grid = build_grid(m, hw, tr, 8 * nodes, SearchOptions(max_micro_batch_size=4, max_vpp=4))
    c = grid.candidates()
    floor = full(states_floor(m, hw, tr, c), grid.shape)
    assert np.all(floor <= full(memory_total(m, hw, tr, c), grid.shape))


def test_closest_miss_is_the_valid_layout_nearest_to_fitting():
    """GPT-3 175B on one H100 node fits nowhere, and most of its layouts are dropped by the
    model-states floor before their memory is computed; the closest miss is still the valid
    layout of the least memory over the usable (the lowest grid index on a tie), as a brute
    force over every layout finds it."""
    from planner.errors import NoFitError
    from planner.search.run import search
    from planner.search.rules import constraint_masks
    m, hw = catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=m.training.seq_length, global_batch_size=m.training.global_batch_size)
    with pytest.raises(NoFitError) as err:
        search(m, hw, tr, 8)
    grid = build_grid(m, hw, tr, 8, SearchOptions())
    flat = grid.flat(np.arange(grid.size))
    valid = np.logical_and.reduce([np.broadcast_to(ok, (len(flat),)) for ok in
                                   constraint_masks(m, tr, hw, flat).values()])
    # a layout with pp 1 and no recomputation is judged with the most activation offload its
    # limits allow (cost.offload, most=True): its least memory
    from planner.cost.estimate import memory_by_rank, rank_kinds
    from planner.cost.offload import offload_layers_from_totals
    capacity = float(hw.gpu.hbm_capacity)
    totals = {k: v["total"] for k, v in memory_by_rank(m, hw, tr, flat, rank_kinds(flat, m)).items()}
    flat = flat.replace(offload_layers=offload_layers_from_totals(m, hw, tr, flat, totals, capacity,
                                                                  most=True))
    over = np.where(valid, memory_total(m, hw, tr, flat) - capacity, np.inf)
    assert err.value.closest.candidates.layout(0) == flat.layout(int(np.argmin(over)))
