"""The scan of a search grid: rules, then memory, then step time, in blocks (planner.search).

Every layout of the grid is checked against the rules (space.constraint_masks, boolean masks
on the broadcast block); the valid ones get their peak memory per GPU, the ones that fit their
step time and score, and each block keeps its best. Memory and step time run on the whole
broadcast block where many layouts are still in, or on flat arrays of just those layouts,
batched across blocks, where few are. Both give the same values (tests/test_search_scale.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from . import objective
from .cost import Estimate, evaluate, memory_total
from .cost.collectives import nvlink_domain
from .grid import Grid, full
from .space import Candidates, constraint_masks
from .specs import HardwareProfile, ModelSpec, TrainingSpec

if TYPE_CHECKING:
    from .search import SearchOptions

FIT_RULE = "does not fit in HBM"
DEADLINE_RULE = "expected time to train beyond the deadline"
CHUNK = 65_536  # layouts per evaluated block: big enough for numpy, small enough for the cache
FLAT_COST = 8  # one layout evaluated as flat arrays costs about this many grid layouts (measured)


@dataclass
class Scan:
    """What one pass over a grid keeps: counts per rule, the best ``keep`` of each block (score
    and flat index into the grid), and the closest miss when nothing fits."""

    pruned: dict[str, int] = field(default_factory=dict)
    alive_after: dict[str, int] = field(default_factory=dict)
    pool_score: list = field(default_factory=list)
    pool_index: list = field(default_factory=list)
    miss_index: int = -1
    miss_over: float = np.inf
    fitting: int = 0
    fastest_index: int = -1  # with a deadline: the fitting layout with the shortest time to train
    fastest_s: float = np.inf

    def fit(self, total: np.ndarray, usable: float, base: int, n_alive: int,
            alive: np.ndarray | None = None, index: np.ndarray | None = None) -> np.ndarray:
        """Record the fit test of ``n_alive`` valid layouts: ``total`` = their memory in bytes,
        either a whole block in flat (C) order starting at grid index ``base`` with the ``alive``
        mask of the rules, or the layouts at flat grid ``index``. Returns the grid indices that
        fit (ascending) and keeps the closest miss."""
        fits = total <= usable
        if alive is not None:
            fits &= alive
        ok = np.flatnonzero(fits)
        ok = ok + base if index is None else index[ok]
        self.fitting += ok.size
        self.pruned[FIT_RULE] = self.pruned.get(FIT_RULE, 0) + n_alive - ok.size
        if ok.size == 0:
            over = total - usable if alive is None else np.where(alive, total - usable, np.inf)
            j = int(np.argmin(over))
            at = base + j if index is None else int(index[j])
            # the closest miss; an exact tie goes to the lower grid index, whatever the path
            if over[j] < self.miss_over or (over[j] == self.miss_over and at < self.miss_index):
                self.miss_over, self.miss_index = float(over[j]), at
        return ok

    def keep(self, score: np.ndarray, index: np.ndarray, keep: int,
             wall: np.ndarray | None = None) -> None:
        """Keep the best ``keep`` of these scored layouts (flat grid indices) and every exact
        tie of the ``keep``-th best, so no path through the scan drops one that another keeps.
        Layouts scored -inf (they miss a deadline) are not kept; ``wall`` (their expected times
        to train, with a deadline) keeps the fastest of all, the lower grid index on a tie."""
        if wall is not None and wall.size:
            j = int(np.argmin(wall))
            if wall[j] < self.fastest_s or (wall[j] == self.fastest_s and index[j] < self.fastest_index):
                self.fastest_s, self.fastest_index = float(wall[j]), int(index[j])
        finite = np.isfinite(score)
        if not finite.all():
            self.pruned[DEADLINE_RULE] = self.pruned.get(DEADLINE_RULE, 0) + int(score.size - finite.sum())
            score, index = score[finite], index[finite]
        k = min(keep, score.size)
        if k:
            kth = np.partition(score, score.size - k)[score.size - k]
            best = np.flatnonzero(score >= kth)
            self.pool_score.append(score[best])
            self.pool_index.append(index[best])


def _batches(parts: list[np.ndarray], size: int):
    """The concatenated flat indices of ``parts`` in slices of at most ``size``."""
    if parts:
        flat = np.concatenate(parts)
        for lo in range(0, flat.size, size):
            yield flat[lo:lo + size]


def scan(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, grid: Grid,
         opts: "SearchOptions", usable: float, tokens: float | None) -> Scan:
    """Evaluate ``grid`` in blocks of about CHUNK layouts: rules, fit within ``usable`` bytes,
    score by the objective, keep the best. Cost grows linearly with grid.size.

    Every layout goes through the rules (boolean masks on the broadcast block). Memory and then
    step time are computed on the whole broadcast block where many layouts are still in, or
    else gathered as flat arrays of just those layouts, batched across blocks (a flat layout
    costs about FLAT_COST grid layouts, plus a fixed cost per call). Both give the same values
    (tests/test_search_scale.py)."""
    out = Scan()
    pruned, alive_after = out.pruned, out.alive_after
    per_row = grid.size // max(grid.shape[0], 1)
    rows = grid.rows_per_chunk(CHUNK)
    sparse_alive: list[np.ndarray] = []  # valid layouts of sparse blocks: memory as flat arrays
    sparse_fit: list[np.ndarray] = []  # fitting layouts of sparse blocks: step time as flat arrays

    def keep(est: Estimate, c: Candidates, index: np.ndarray, shape=None, base: int = 0) -> None:
        score, wall = objective.layout_scores(model, hw, training, c, est.time["step"],
                                              est.throughput["tokens_per_s"], opts, tokens)
        if shape is not None:  # a broadcast block: the fitting layouts' entries
            score = np.broadcast_to(score, shape).ravel()[index - base]
            wall = None if wall is None else np.broadcast_to(wall, shape).ravel()[index - base]
        out.keep(score, index, opts.keep, wall if opts.deadline_s is not None else None)

    for lo in range(0, grid.shape[0], rows):
        hi = min(lo + rows, grid.shape[0])
        shape = (hi - lo, *grid.shape[1:])
        c = grid.candidates(lo, hi)
        alive = np.ones(shape, dtype=bool)
        n_alive = alive.size
        for rule, ok in constraint_masks(model, training, nvlink_domain(hw), c,
                                         opts.allow_cross_node_tp, opts.framework).items():
            alive &= ok
            left = int(np.count_nonzero(alive))
            pruned[rule] = pruned.get(rule, 0) + n_alive - left
            alive_after[rule] = alive_after.get(rule, 0) + left
            n_alive = left
        if n_alive == 0:
            continue
        base = lo * per_row
        if n_alive * FLAT_COST < alive.size:
            sparse_alive.append(np.flatnonzero(alive) + base)
            continue
        total = full(memory_total(model, hw, training, c), shape).ravel()
        index = out.fit(total, usable, base, n_alive, alive=alive.ravel())
        if index.size * FLAT_COST < alive.size:
            sparse_fit.append(index)
        elif index.size:
            keep(evaluate(model, hw, training, c, summary=True), c, index, shape, base)
    for index in _batches(sparse_alive, CHUNK):
        total = memory_total(model, hw, training, grid.flat(index))
        sparse_fit.append(out.fit(total, usable, 0, index.size, index=index))
    for index in _batches(sparse_fit, CHUNK):
        fit = grid.flat(index)
        keep(evaluate(model, hw, training, fit, summary=True), fit, index)
    pruned.setdefault(FIT_RULE, 0)
    return out
