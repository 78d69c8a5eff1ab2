"""The search space as a broadcast grid: parallel splits on one axis, the other knobs on their own.

A flat ``Candidates`` holds N equal-length arrays. A grid holds the same layouts without writing
them out: the parallel split (tp, cp, pp, dp: the rows allowed by the GPU count) varies along
axis 0 and each knob of the axes table (layout.axes: zero_stage, micro_batch_size, recompute,
sequence_parallel, vpp, distributed_optimizer) along an axis of its own, every field shaped to broadcast against the
others. The cost model is elementwise numpy, so it evaluates a grid unchanged; a term that
depends only on (tp, mbs, SP) is then computed once per such combination instead of once per
layout, and only the final compositions run at the full size. Results are identical to evaluating the flattened layouts
(tests/test_search_scale.py checks it element by element).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from ..cost.collectives import nvlink_domain
from ..layout import BY_NAME, Candidates
from ..layout.axes import IMPLIED_FIELDS, KNOB_FIELDS, SOFTWARE_FIELDS, SOLVED_FIELDS, SPLIT_FIELDS
from ..layout.split import divisors, uneven_splits
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from .framework_rules import profile_for
from .options import SearchOptions
from .rules import folds


def parallel_splits(tps: np.ndarray, pps: np.ndarray, gpus: int | None = None,
                    dps: np.ndarray | None = None, max_gpus: int | None = None,
                    gpus_per_node: int = 8, cps: np.ndarray | None = None,
                    num_layers: int | None = None) -> dict[str, np.ndarray]:
    """The (tp, cp, pp, dp, pipeline split) rows of the space, as flat int64 arrays of length Q.

    Fixed count: every tp x cp x pp that divides ``gpus``, dp = gpus / (tp*cp*pp).
    Budget (``max_gpus``): every tp x cp x pp x dp (dp from ``dps``) whose product is at most
    ``max_gpus`` and a whole number of nodes (or, below one node, a divisor of it).
    ``cps`` defaults to [1]. Also returns ``gpus`` (tp*cp*pp*dp) per row, ``ep`` and ``etp``
    (1: the expert mesh of a dense model) and the pipeline split: each row once with the even
    split (first_stage_layers = last_stage_layers = 0) where pp divides ``num_layers``, and once
    per uneven split space.uneven_splits lists for its pp.
    """
    cps = np.array([1], dtype=np.int64) if cps is None else np.asarray(cps, dtype=np.int64)
    if max_gpus is None:
        if gpus is None:
            raise ValueError("parallel_splits needs gpus or max_gpus")
        tp, cp, pp = (g.ravel() for g in np.meshgrid(tps, cps, pps, indexing="ij"))
        keep = gpus % (tp * cp * pp) == 0
        tp, cp, pp = tp[keep], cp[keep], pp[keep]
        dp = gpus // (tp * cp * pp)
    else:
        tp, cp, pp, dp = (g.ravel() for g in np.meshgrid(tps, cps, pps, dps, indexing="ij"))
        n = tp * cp * pp * dp
        whole = (n % gpus_per_node == 0) | ((n < gpus_per_node) & (gpus_per_node % n == 0))
        keep = (n <= max_gpus) & whole
        tp, cp, pp, dp = tp[keep], cp[keep], pp[keep], dp[keep]
    rows = {"tp": tp.astype(np.int64), "cp": cp.astype(np.int64), "pp": pp.astype(np.int64),
            "dp": dp.astype(np.int64)}
    first, last, row = _pipeline_splits(rows["pp"], num_layers)
    out = {k: v[row] for k, v in rows.items()}
    out["first_stage_layers"], out["last_stage_layers"] = first, last
    out["ep"] = out["etp"] = np.ones_like(out["tp"])
    out["gpus"] = out["tp"] * out["cp"] * out["pp"] * out["dp"]
    return out


def _pipeline_splits(pp: np.ndarray, num_layers: int | None) -> tuple[np.ndarray, ...]:
    """(first, last, row): the split options of each row's pp, rows repeated once per option
    (space.uneven_splits, and the even split where pp divides the layers). Int64 arrays."""
    if num_layers is None:
        zeros = np.zeros_like(pp)
        return zeros, zeros, np.arange(pp.size)
    options = {}
    for p in np.unique(pp).tolist():
        options[p] = ([(0, 0)] if num_layers % p == 0 else []) + uneven_splits(num_layers, p)
    count = np.array([len(options[p]) for p in pp.tolist()], dtype=np.int64)
    row = np.repeat(np.arange(pp.size), count)
    pairs = np.array([pair for p in pp.tolist() for pair in options[p]], dtype=np.int64).reshape(-1, 2)
    return pairs[:, 0], pairs[:, 1], row


@dataclass(frozen=True)
class Grid:
    """Q parallel splits x the knob axes; ``shape`` = (Q, len(knob_0), ..., len(knob_4))."""

    split: dict[str, np.ndarray]
    knobs: dict[str, np.ndarray]
    # Fields every layout of the grid shares (a pinned recompute_num_layers), int per name.
    fixed: dict[str, int] = field(default_factory=dict)
    # The software axes the step pass chooses among (layout.axes role "software"): the values
    # tried per axis where more than one (a pinned or single value is in ``fixed``)
    software: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.split["tp"]), *(len(self.knobs[k]) for k in KNOB_FIELDS))

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def rows_per_chunk(self, target: int) -> int:
        """How many split rows make a chunk of about ``target`` layouts (at least 1)."""
        per_row = max(1, self.size // max(self.shape[0], 1))
        return max(1, target // per_row)

    def candidates(self, lo: int = 0, hi: int | None = None) -> Candidates:
        """Split rows lo:hi as broadcast-shaped Candidates (fields of shape (q,1,..) / (1,..,k,..))."""
        ndim = 1 + len(KNOB_FIELDS)
        fields = {}
        for name in SPLIT_FIELDS:
            fields[name] = self.split[name][lo:hi].reshape((-1,) + (1,) * (ndim - 1))
        for axis, name in enumerate(KNOB_FIELDS, start=1):
            shape = [1] * ndim
            shape[axis] = -1
            fields[name] = self.knobs[name].reshape(shape)
        fields.update({k: np.full((1,) * ndim, v, dtype=_dtype(k)) for k, v in self.fixed.items()})
        return Candidates(**fields)

    def rows(self, lo: int, hi: int) -> "Grid":
        """The grid of split rows lo:hi (every knob value)."""
        return Grid({k: v[lo:hi] for k, v in self.split.items()}, self.knobs, self.fixed, self.software)

    def take(self, rows: np.ndarray, values: list[np.ndarray]) -> "Grid":
        """The sub-grid of split rows ``rows`` and, on each knob axis (KNOB_FIELDS order), the
        values at ``values[k]``: the layouts of their Cartesian product, still a broadcast grid."""
        return Grid({k: v[rows] for k, v in self.split.items()},
                    {name: self.knobs[name][sel] for name, sel in zip(KNOB_FIELDS, values)}, self.fixed,
                    self.software)

    def index_of(self, rows: np.ndarray, values: list[np.ndarray]) -> np.ndarray:
        """Flat indices into this grid of the layouts of ``take(rows, values)``, in that
        sub-grid's flat (C) order: ascending where ``rows`` and each ``values[k]`` are. Int64."""
        knobs = np.ravel_multi_index(np.ix_(*values), self.shape[1:]).ravel()
        return (np.asarray(rows, dtype=np.int64)[:, None] * (self.size // max(self.shape[0], 1))
                + knobs).ravel()

    def flat(self, index: np.ndarray, row_offset: int = 0) -> Candidates:
        """Flat Candidates for flat indices into the grid of rows row_offset: (C order)."""
        sub_shape = (self.shape[0] - row_offset, *self.shape[1:])
        idx = np.unravel_index(np.asarray(index, dtype=np.int64), sub_shape)
        fields = {name: self.split[name][idx[0] + row_offset] for name in SPLIT_FIELDS}
        for axis, name in enumerate(KNOB_FIELDS, start=1):
            fields[name] = self.knobs[name][idx[axis]]
        fields.update({k: np.full(np.shape(idx[0]), v, dtype=_dtype(k)) for k, v in self.fixed.items()})
        return Candidates(**fields)


def _dtype(name: str) -> type:
    return bool if BY_NAME[name].kind is bool else np.int64


def full(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` broadcast to ``shape`` (a read-only view; no copy)."""
    return np.broadcast_to(np.asarray(array), shape)


def axis(values: np.ndarray, pin: int | None, upper: int | None = None) -> np.ndarray:
    if pin is not None:
        return np.array([pin], dtype=np.int64)
    if upper is not None:
        values = values[values <= upper]
    return values.astype(np.int64)


def pinned_split(split: dict[str, np.ndarray], num_layers: int, first: int | None,
                  last: int | None) -> dict[str, np.ndarray]:
    """The split rows whose pipeline split has ``first`` layers on the first stage and ``last``
    on the last (None: any); an even split (stored as 0, 0) matches when every stage holds
    that many."""
    pp = split["pp"]
    even = (split["first_stage_layers"] == 0) & (num_layers % pp == 0)
    per_stage = num_layers // pp
    keep = pp >= 2  # a split has two stages at least
    for pin, column in ((first, "first_stage_layers"), (last, "last_stage_layers")):
        if pin is not None:
            keep &= (split[column] == pin) | (even & (per_stage == pin))
    return {k: v[keep] for k, v in split.items()}


def expert_mesh(split: dict[str, np.ndarray], num_experts: int, ep: int | None = None,
                etp: int | None = None, max_ep: int | None = None) -> dict[str, np.ndarray]:
    """The split rows, each repeated once per expert mesh (ep, etp) its stage can fold
    (Megatron-Core parallel folding: etp*ep divides tp*cp*dp, ep divides the experts): ep over
    the powers of two up to ``max_ep`` (default: the experts), etp 1 (Megatron's guidance for
    fine-grained experts, moe.md 6) or tp (its default, arguments.py L587-588); a pinned ``ep`` or
    ``etp`` is taken as given. Rows in (etp choice, ep) order."""
    ep_axis = 2 ** np.arange(0, int(np.log2(num_experts)) + 1)
    ep_axis = axis(ep_axis[num_experts % ep_axis == 0], ep, max_ep)
    stage = split["tp"] * split["cp"] * split["dp"]
    if etp is not None:
        choices = [np.full_like(split["tp"], etp)]
    else:  # etp = 1, and etp = tp where that is another mesh
        choices = [np.ones_like(split["tp"]), np.where(split["tp"] > 1, split["tp"], 0)]
    rows, eps, etps = [], [], []
    for etps_of in choices:
        for e in ep_axis.tolist():
            idx = np.flatnonzero(folds(stage, etps_of, e))
            rows.append(idx)
            eps.append(np.full(idx.size, e, dtype=np.int64))
            etps.append(etps_of[idx])
    order = np.concatenate(rows)
    out = {k: v[order] for k, v in split.items()}
    out["ep"], out["etp"] = np.concatenate(eps), np.concatenate(etps)
    return out


def build_grid(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int | None,
               opts: SearchOptions) -> Grid:
    """The space as a broadcast grid (search.grid): parallel splits x knob axes.

    tp: powers of two up to the NVLink domain (up to the GPU count with --allow-cross-node-tp);
    cp: powers of two up to ``max_cp``; pp: divisors of the layer count, and powers of two up to
    it that have an uneven split; each pp with its even split (where pp divides the layers) and
    every uneven split space.uneven_splits lists (a pinned pp is taken as given); dp = gpus/(tp*cp*pp), or
    with ``max_gpus`` every divisor of the global batch (no other dp splits it) such that
    tp*cp*pp*dp is whole nodes within the budget;
    each knob axis its values (knob_values: the axes table's; zero_stage 0-3; micro_batch_size
    the divisors of the global batch up to ``max_micro_batch_size``; recompute none / selective /
    full / selective+; SP on and off; vpp the divisors of the layer count up to ``max_vpp`` and
    those an uneven split interleaves with; the distributed optimizer off unless pinned); a
    pinned solved axis (the recompute layers, the offloaded layers) fixed for every layout.
    """
    budget = opts.max_gpus if opts.max_gpus is not None else gpus
    top = budget if opts.allow_cross_node_tp else min(nvlink_domain(hw), budget)
    tps = axis(2 ** np.arange(0, int(np.log2(max(top, 1))) + 1), opts.tp, opts.max_tp)
    L = model.num_layers  # pp: divisors of L (even splits), powers of two up to L (uneven splits)
    pps = np.union1d(divisors(L), 2 ** np.arange(0, int(np.log2(L)) + 1))
    pps = axis(np.array([p for p in pps.tolist() if L % p == 0 or uneven_splits(L, p)], dtype=np.int64),
                opts.pp, opts.max_pp)
    cps = axis(2 ** np.arange(0, int(np.log2(max(opts.max_cp, 1))) + 1), opts.cp)
    if opts.max_gpus is None:
        split = parallel_splits(tps, pps, gpus=gpus, cps=cps, num_layers=L)
    else:
        dps = axis(divisors(training.global_batch_size), opts.dp)
        split = parallel_splits(tps, pps, dps=dps, max_gpus=opts.max_gpus,
                                gpus_per_node=hw.gpus_per_node, cps=cps, num_layers=L)
    if opts.dp is not None:
        keep = split["dp"] == opts.dp
        split = {k: v[keep] for k, v in split.items()}
    if opts.first_stage_layers is not None or opts.last_stage_layers is not None:
        split = pinned_split(split, L, opts.first_stage_layers, opts.last_stage_layers)
    if model.moe is not None:
        split = expert_mesh(split, model.moe.num_experts, opts.ep, opts.etp, opts.max_ep)
    ctx = SimpleNamespace(model=model, training=training, hardware=hw,
                          framework=profile_for(training, opts.framework), pps=pps)
    knobs = {name: knob_values(ctx, opts, name) for name in KNOB_FIELDS}
    fixed = {name: BY_NAME[name].code(getattr(opts, name)) for name in SOLVED_FIELDS + IMPLIED_FIELDS
             if getattr(opts, name) is not None}
    software = {name: knob_values(ctx, opts, name) for name in SOFTWARE_FIELDS}
    fixed.update({name: int(v[0]) for name, v in software.items() if v.size == 1})
    return Grid(split, knobs, fixed, {name: v for name, v in software.items() if v.size > 1})


def knob_values(ctx, opts: SearchOptions, name: str) -> np.ndarray:
    """The values axis ``name`` takes in the search (layout.axes: its ``values`` within its
    bound, from ``ctx``: model, training, hardware, framework, pps), or its pin alone; a choice as
    its code. Int64 (bool for a bool axis)."""
    a = BY_NAME[name]
    pin = getattr(opts, name)
    dtype = bool if a.kind is bool else np.int64
    if pin is not None:
        return np.array([a.code(pin)], dtype=dtype)
    if a.offered is not None:  # from the framework's rules (IMPLIED: what the others imply)
        return np.asarray(a.offered(ctx.framework.rules), dtype=dtype)
    bound = getattr(opts, a.bound) if a.bound else None
    values = np.asarray(a.values(SimpleNamespace(**vars(ctx), bound=bound)))
    return (values if bound is None else values[values <= bound]).astype(dtype)


def enumerate_space(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, gpus: int,
                    opts: SearchOptions) -> Candidates:
    """The whole space of ``build_grid`` written out as flat Candidates (for tests and tools)."""
    grid = build_grid(model, hw, training, gpus, opts)
    return grid.flat(np.arange(grid.size))
