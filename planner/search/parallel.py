"""The memory and step passes' sub-grids over worker processes (planner.search.scan).

A pass works sub-grid by sub-grid: the memory pass records which layouts fit, the counts per
rule, the closest miss and the least recompute or offload layers; the step pass adds each
sub-grid's best layouts to the scan's pools (search.state.Scan.keep), whose union, ranked by
score then grid index (search.run._best), does not depend on which process timed which
sub-grid nor in what order. So the sub-grids are dealt to ``jobs()`` processes, largest first to
the least loaded; the workers are forked (Linux: they inherit the grid and the earlier passes'
results without a copy) and send back what they recorded, merged here (_merge) in a fixed
order; the parent works one share itself.

Processes: ``PLAN3D_JOBS`` (a positive integer; 1 = none forked) if set, else the CPUs this
process may run on, at most DEFAULT_MAX_JOBS; only on Linux (fork), and only for a pass of at
least MIN_PARALLEL layouts (below it a fork costs more than it saves). A memory-pass worker
records its solved axes as the pairs it adds (SparseLayers), not an array over the grid; a
step-pass worker reads the software of each sub-grid as it times it, so it keeps GridLayers
(one byte a layout: a lookup in the pairs, redone per sub-grid, made a DeepSeek-V3 search
3.3 -> 4.5 s).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable

import numpy as np

from ..errors import UsageError
from .state import GridLayers, Scan

# Layouts a step pass must hold before it is split over processes: a forked worker costs
# ~20-40 ms to start and to send back; a sub-grid of the step pass is timed at ~1 us a layout
MIN_PARALLEL = 200_000

# Processes by default at most: a large search has some 20-70 sub-grids in a pass
DEFAULT_MAX_JOBS = 8

_JOB: tuple | None = None  # (work, groups, out): what a forked worker inherits


def jobs() -> int:
    """Processes the passes may use: ``PLAN3D_JOBS`` if set (UsageError unless a positive
    integer), else the CPUs this process may run on, at most DEFAULT_MAX_JOBS; 1 where fork is
    not the platform's way."""
    text = os.environ.get("PLAN3D_JOBS")
    if text is not None:
        word = text.strip()
        if not (word.isascii() and word.isdigit()) or int(word) < 1:
            raise UsageError(f"PLAN3D_JOBS={text!r}: give a positive whole number of processes")
        wanted = int(word)
    else:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        wanted = min(cpus, DEFAULT_MAX_JOBS)
    return wanted if sys.platform.startswith("linux") else 1


class SparseLayers:
    """A worker's record of a solved or software axis (search.state.GridLayers' add and find),
    kept as the (index, value) pairs it adds rather than one value per layout of the grid: a
    worker records only its share."""

    def __init__(self):
        self.index: list[np.ndarray] = []
        self.value: list[np.ndarray] = []

    def add(self, index: np.ndarray, layers: np.ndarray) -> None:
        """Record ``layers`` (> 0, below 65,536: a layer count or a code) of the layouts at flat
        ``index``."""
        keep = np.asarray(layers) > 0
        if np.any(keep):
            self.index.append(np.asarray(index)[keep])
            self.value.append(np.asarray(layers)[keep].astype(np.uint16))

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(flat indices ascending, their values), the last recorded value of an index."""
        if not self.index:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        index, value = np.concatenate(self.index), np.concatenate(self.value)
        last = len(index) - 1 - np.unique(index[::-1], return_index=True)[1]
        return index[last], value[last].astype(np.int64)

    def find(self, index: np.ndarray) -> np.ndarray:
        """The recorded values at flat ``index`` (0 where none). Int64."""
        at, value = self.pairs()
        out = np.zeros(np.shape(index), dtype=np.int64)
        if at.size:
            pos = np.clip(np.searchsorted(at, index), 0, at.size - 1)
            hit = at[pos] == index
            out[hit] = value[pos[hit]]
        return out


def deal(sizes: list[int], n: int) -> list[list[int]]:
    """Part indices dealt to ``n`` groups, largest first to the least loaded (by layouts); empty
    groups dropped. ``sizes``: layouts per part."""
    loads, groups = [0] * n, [[] for _ in range(n)]
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        g = loads.index(min(loads))
        groups[g].append(i)
        loads[g] += sizes[i]
    return [sorted(g) for g in groups if g]


def run_parts(work: Callable, parts: list, sizes: list[int], out: Scan,
              apply: Callable | None = None, own_solved: bool = False) -> None:
    """``work(parts, scan)`` over ``parts`` (sub-grids of ``sizes`` layouts), adding to ``out``:
    in this process alone, or dealt over jobs() processes (module docstring) and merged. ``work``
    returns one result per part (or None); ``apply(part, result)`` takes each in this process,
    in part order. ``own_solved``: the workers record solved axes (the memory pass) into Scans of
    their own, merged here; else they read ``out``'s (the step pass)."""
    n = min(jobs(), len(parts))
    if n <= 1 or sum(sizes) < MIN_PARALLEL or multiprocessing.current_process().daemon:
        _apply(apply, parts, range(len(parts)), work(parts, out))
        return
    global _JOB
    groups = deal(sizes, n)
    _JOB = (work, [[parts[i] for i in g] for g in groups], out, own_solved)
    results: dict = {}
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(len(groups) - 1, mp_context=context) as pool:
            futures = [pool.submit(_worker, g) for g in range(1, len(groups))]
            results[0] = work(_JOB[1][0], out)
            for g, future in enumerate(futures, start=1):
                part = future.result()
                _merge(out, part)
                results[g] = part["results"]
    except (OSError, BrokenProcessPool):  # no fork here, or a worker lost: the rest in this one
        for g in range(len(groups)):
            if g not in results:
                results[g] = work(_JOB[1][g], out)
    finally:
        _JOB = None
    for g, members in enumerate(groups):
        _apply(apply, parts, members, results[g])


def _apply(apply: Callable | None, parts: list, members, results) -> None:
    """``apply(part, result)`` for each member part of a group and its result."""
    if apply is not None:
        for i, result in zip(members, results):
            apply(parts[i], result)


def _worker(group: int) -> dict:
    """In a forked worker: group ``group``'s parts timed into a Scan of its own that reads the
    parent's solved axes and roomy layouts (or records its own solved axes); what the parent
    merges (_merge)."""
    work, groups, parent, own_solved = _JOB
    if own_solved:   # the memory pass: records only, never read back during the pass
        mine = Scan(solved={name: SparseLayers() for name in parent.solved},
                    software={name: SparseLayers() for name in parent.software})
    else:            # the step pass reads each sub-grid's software (with_scanned_layers)
        mine = Scan(solved=parent.solved, roomy=parent.roomy,
                    software={name: GridLayers(g.size, np.uint8) for name, g in parent.software.items()})
    results = work(groups[group], mine)
    fastest = [np.array([mine.fastest_index])] if mine.fastest_index >= 0 else []
    kept = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *mine.pool_index, *fastest,
                                     *(i for _, pi in mine.pools.values() for i in pi)]))
    found = {name: g.pairs() for name, g in mine.solved.items()} if own_solved else {}
    return {"pool_score": mine.pool_score, "pool_index": mine.pool_index, "pools": mine.pools,
            "pruned": mine.pruned, "alive_after": mine.alive_after, "fitting": mine.fitting,
            "miss": (mine.miss_over, mine.miss_index), "solved": found,
            "fastest": (mine.fastest_s, mine.fastest_index), "kept": kept,
            "software": {name: g.find(kept) for name, g in mine.software.items()},
            "results": results}


def _merge(out: Scan, part: dict) -> None:
    """A worker's results into ``out``: its pools appended, its counts per rule and of fitting
    layouts added, its closest miss and fastest layout taken where closer or faster (a tie: the
    lower grid index), its solved axes and software recorded."""
    out.pool_score += part["pool_score"]
    out.pool_index += part["pool_index"]
    for name, (scores, indices) in part["pools"].items():
        mine = out.pools.setdefault(name, ([], []))
        mine[0].extend(scores)
        mine[1].extend(indices)
    for counts, into in ((part["pruned"], out.pruned), (part["alive_after"], out.alive_after)):
        for rule, n in counts.items():
            into[rule] = into.get(rule, 0) + n
    out.fitting += part["fitting"]
    over, at = part["miss"]
    if at >= 0 and (over < out.miss_over or (over == out.miss_over and at < out.miss_index)):
        out.miss_over, out.miss_index = over, at
    fastest_s, fastest_index = part["fastest"]
    if fastest_index >= 0 and (fastest_s < out.fastest_s or
                               (fastest_s == out.fastest_s and fastest_index < out.fastest_index)):
        out.fastest_s, out.fastest_index = fastest_s, fastest_index
    for name, (at, values) in part["solved"].items():
        out.solved[name].add(at, values)
    for name, codes in part["software"].items():
        out.software[name].add(part["kept"], codes)
