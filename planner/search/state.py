"""What a scan of a search grid records (planner.search.scan): counts per rule, the best layouts
of each sub-grid, the closest miss, and the least recompute / offload layers each fitting layout
needs, by flat grid index."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..layout.axes import SOFTWARE_FIELDS, SOLVED_FIELDS

FIT_RULE = "does not fit in HBM"
DEADLINE_RULE = "expected time to train beyond the deadline"


@dataclass
class GridLayers:
    """The value of a solved axis (layout.axes: a layer count) of the layouts of a grid of ``size``
    layouts, by flat index (0 where none is recorded): one small integer per layout, allocated
    at the first non-zero one."""

    size: int = 0
    dtype: type = np.uint16  # N <= a chunk's layers: uint8 for models of fewer than 256 layers
    values: np.ndarray | None = None

    def add(self, index: np.ndarray, layers: np.ndarray) -> None:
        """Record ``layers`` (> 0) of the layouts at flat ``index``."""
        keep = layers > 0
        if not np.any(keep):
            return
        if self.values is None:
            self.values = np.zeros(self.size, dtype=self.dtype)
        self.values[index[keep]] = layers[keep]

    def find(self, index: np.ndarray) -> np.ndarray:
        """The recorded layers of the layouts at flat ``index`` (0 where none). Int64."""
        if self.values is None:
            return np.zeros(np.shape(index), dtype=np.int64)
        return self.values[index].astype(np.int64)


@dataclass
class Scan:
    """What one pass over a grid keeps: counts per rule, the best ``keep`` of each sub-grid
    (score and flat index into the grid), and the closest miss when nothing fits."""

    pruned: dict[str, int] = field(default_factory=dict)
    alive_after: dict[str, int] = field(default_factory=dict)
    pool_score: list = field(default_factory=list)
    pool_index: list = field(default_factory=list)
    miss_index: int = -1
    miss_over: float = np.inf
    # the solved axes of the closest miss (where the probe chose them: the most activation
    # offload its limits allow), as Candidates fields of length one
    miss_layers: dict = field(default_factory=dict)
    fitting: int = 0
    fastest_index: int = -1  # with a deadline: the fitting layout with the shortest time to train
    fastest_s: float = np.inf
    # per solved axis, the least value that fits of each fitting layout (search.least_layers)
    solved: dict = field(default_factory=dict)
    # per software axis the step pass chose among, each timed layout's choice: code + 1
    software: dict = field(default_factory=dict)
    # with tie groups (search.ties): which fitting layouts leave the preferred free memory (flat
    # bool array over the grid, allocated at the first), and per class of preferred layouts
    # ("roomy"; "preferred": roomy, no unchecked term, nothing unconventional) the best of each
    # sub-grid: {class: ([scores], [flat indices])}
    roomy: np.ndarray | None = None
    pools: dict = field(default_factory=dict)

    @classmethod
    def of_grid(cls, size: int, dtype: type = np.uint16) -> "Scan":
        """A Scan of a grid of ``size`` layouts with a GridLayers per solved and software axis."""
        return cls(solved={name: GridLayers(size, dtype) for name in SOLVED_FIELDS},
                   software={name: GridLayers(size, np.uint8) for name in SOFTWARE_FIELDS})

    def layers_at(self, index: int) -> dict:
        """The solved axes recorded for the layout at flat ``index`` (the non-zero ones), as
        Candidates fields of length one."""
        values = {name: int(g.find(np.array([max(index, 0)]))[0]) for name, g in self.solved.items()}
        return {name: np.array([v]) for name, v in values.items() if v}

    def fit(self, total: np.ndarray, alive: np.ndarray, index: np.ndarray, usable: float) -> np.ndarray:
        """Record the fit test of the valid layouts (``alive``) of a sub-grid: ``total`` = their
        memory in bytes, ``index`` = their flat grid indices, ascending; flat arrays of the
        sub-grid. Returns which fit within ``usable`` bytes, and keeps the closest miss."""
        fits = alive & (total <= usable)
        n_alive, n_fit = int(np.count_nonzero(alive)), int(np.count_nonzero(fits))
        self.fitting += n_fit
        self.pruned[FIT_RULE] = self.pruned.get(FIT_RULE, 0) + n_alive - n_fit
        if n_alive and not n_fit:
            over = np.where(alive, total - usable, np.inf)
            j = int(np.argmin(over))
            at = int(index[j])
            # the closest miss; an exact tie goes to the lower grid index, whatever the path
            if over[j] < self.miss_over or (over[j] == self.miss_over and at < self.miss_index):
                self.miss_over, self.miss_index = float(over[j]), at
        return fits

    def note_roomy(self, index: np.ndarray, roomy: np.ndarray, size: int) -> None:
        """Record which layouts at flat ``index`` (of a grid of ``size``) are roomy."""
        if self.roomy is None:
            self.roomy = np.zeros(size, dtype=bool)
        self.roomy[index] = roomy

    def keep_class(self, name: str, score: np.ndarray, index: np.ndarray, keep: int) -> None:
        """Keep the best ``keep`` of these scored layouts of class ``name`` (and the exact ties
        of the ``keep``-th) in that class's pool, beside the pool of all (keep)."""
        finite = np.isfinite(score)
        score, index = score[finite], index[finite]
        k = min(keep, score.size)
        if k:
            kth = np.partition(score, score.size - k)[score.size - k]
            best = np.flatnonzero(score >= kth)
            scores, indices = self.pools.setdefault(name, ([], []))
            scores.append(score[best])
            indices.append(index[best])

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
