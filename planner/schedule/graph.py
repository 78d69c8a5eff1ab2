"""Dependency graph and inputs of the pipeline-schedule simulator (reference/pipeline_schedules.md
§0.3, §0.4): the graph of a schedule's op order (dependencies, latency boundaries, topological
levels, deadlock detection), the per-stage duration and per-boundary latency tables, and the
activation-memory profile, which depends on the op order only.

Shapes: K cases (time vectors), S = p*v stages per chain, p ranks. Times in seconds or any one
unit; memory in chunks (a chunk holds A/v, A = activation of one stage of L/p layers).
"""

from __future__ import annotations

import numpy as np

from .orders import Schedule

_BLOCK = {"F": 0, "B": 1, "I": 2, "W": 3}   # duration-table block of each kind; pairs from 4*S
_FAMILY = {"F": "F", "FB": "F", "B": "X", "I": "X", "W": "W"}   # X: the I or B of a stage


class _Graph:
    """Dependency graph of a schedule (built once, cached on the Schedule). Node ids are
    rank-major in issue order; ``deps[n]`` lists (node, boundary) with boundary -1 for no
    latency; ``levels`` are topological waves; ValueError on a missing dependency or deadlock."""

    def __init__(self, sched: Schedule):
        self.sched, self.p, self.S = sched, sched.p, sched.n_stages
        self.rank, self.col, self.start_of_rank, self.pairs = [], [], [], {}
        self.members = []                      # per node: [(family, direction, stage, mb)]
        producer = {}
        for r, ops in enumerate(sched.ranks):
            self.start_of_rank.append(len(self.rank))
            for op in ops:
                self._add(r, op, producer)
        self.start_of_rank.append(len(self.rank))
        self.n = len(self.rank)
        self._check_complete(producer)
        resolved = [self._resolve(n, producer) for n in range(self.n)]
        self.deps = [[(d, b) for d, b, _, _ in deps] for deps in resolved]
        # cross-rank edges (consumer, producer, boundary, "F" activation or "B" gradient, mb)
        self.edges = [(n, d, b, "B" if fam == "X" else "F", j) for n, deps in enumerate(resolved)
                      for d, b, fam, j in deps if b >= 0]
        self.level = self._levels()
        # a dependency on an earlier op of the same rank is implied by the rank's order
        self.ext = [[(d, b) for d, b in deps if self.rank[d] != self.rank[n]]
                    for n, deps in enumerate(self.deps)]
        order = np.argsort(self.level, kind="stable")
        bounds = np.searchsorted(self.level[order], np.arange(self.level.max(initial=-1) + 2))
        self.levels = [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        self.counts = np.zeros((self.p, 4 * self.S + len(self.pairs)))
        np.add.at(self.counts, (np.asarray(self.rank, int), np.asarray(self.col, int)), 1.0)
        self.kinds = {k for ops in sched.ranks for k in (op.kind for op in ops)}
        self._plan = None
        self.memory = memory_profile(self)

    def _add(self, r, op, producer):
        sched, n = self.sched, len(self.rank)
        fam = _FAMILY[op.kind]
        members = [(fam, op.direction, sched.stage(r, op.chunk, op.direction), op.mb)]
        if op.kind == "FB":
            mb, chunk, d = op.back
            members.append(("X", d, sched.stage(r, chunk, d), mb))
            pair = (members[0][2], members[1][2])
            col = 4 * self.S + self.pairs.setdefault(pair, len(self.pairs))
        else:
            col = _BLOCK[op.kind] * self.S + members[0][2]
        for key in members:
            if key in producer:
                raise ValueError(f"{sched.name}: {key[0]} of stage {key[2]}, micro-batch "
                                 f"{key[3]} appears twice in the op order")
            producer[key] = n
        self.rank.append(r)
        self.col.append(col)
        self.members.append((members, op.kind))

    def _check_complete(self, producer):
        """Every stage runs F and I/B once per micro-batch, and one W per I."""
        fams = [key[0] for key in producer]
        n_i = sum(kind == "I" for _, kind in self.members)
        want = self.S * self.sched.m
        if fams.count("F") != want or fams.count("X") != want or fams.count("W") != n_i:
            raise ValueError(f"{self.sched.name}: the order has {fams.count('F')} F, "
                             f"{fams.count('X')} I/B and {fams.count('W')} W for {n_i} I; "
                             f"expected {want} F and {want} I/B (stages x micro-batches)")

    def _resolve(self, n, producer):
        """Dependencies of node n as [(node, boundary, family, micro-batch)]."""
        out = []
        for fam, d, s, j in self.members[n][0]:
            if fam == "F":
                need = [(("F", d, s - 1, j), self.sched.boundary(s - 1, d))] if s > 0 else []
            elif fam == "X" and s < self.S - 1:
                need = [(("X", d, s + 1, j), self.sched.boundary(s, d))]
            else:
                need = [(("F" if fam == "X" else "X", d, s, j), -1)]
            for key, b in need:
                node = producer.get(key)
                if node is None or (fam == "W" and self.members[node][1] != "I"):
                    what = {"F": "F", "X": "I/B", "W": "W"}[key[0]] if fam != "W" else "I"
                    raise ValueError(f"{self.sched.name}: {fam.replace('X', 'I/B')} of stage "
                                     f"{s}, micro-batch {j} needs {what} of stage {key[2]}, "
                                     "which no rank runs")
                out.append((node, b, fam, j))
        return out

    def _levels(self) -> np.ndarray:
        """Level of each node = 1 + max level of its predecessors (rank order and deps);
        ValueError when no rank can proceed (deadlock)."""
        level, pos = [-1] * self.n, list(self.start_of_rank[:-1])
        ends, done, deps = self.start_of_rank[1:], 0, self.deps
        while done < self.n:
            progress = False
            for r in range(self.p):
                n = pos[r]
                while n < ends[r] and all(level[d] >= 0 for d, _ in deps[n]):
                    lv = level[n - 1] + 1 if n > self.start_of_rank[r] else 0
                    level[n] = max([lv] + [level[d] + 1 for d, _ in deps[n]])
                    n, done, progress = n + 1, done + 1, True
                pos[r] = n
            if not progress:
                stuck = [f"rank {r} at op {pos[r] - self.start_of_rank[r]} "
                         f"({self.sched.ranks[r][pos[r] - self.start_of_rank[r]].kind})"
                         for r in range(self.p) if pos[r] < ends[r]]
                raise ValueError(f"{self.sched.name}: deadlock, no rank can proceed: "
                                 + "; ".join(stuck[:4]))
        return np.array(level)


def graph(sched: Schedule) -> _Graph:
    """The cached dependency graph of ``sched`` (ValueError on deadlock or a missing op)."""
    g = sched.__dict__.get("_graph")
    if g is None:
        g = _Graph(sched)
        object.__setattr__(sched, "_graph", g)
    return g


# ---------------------------------------------------------------- inputs

def _stage_times(x, K, S, name) -> np.ndarray:
    """Times of one kind as (K, S): a scalar, (S,) per stage, (K, 1) per case or (K, S)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1 and a.shape[0] != S:
        raise ValueError(f"{name} times have {a.shape[0]} entries, the schedule has {S} stages")
    try:
        a = np.broadcast_to(a, (K, S))
    except ValueError:
        raise ValueError(f"{name} times of shape {np.shape(x)} do not fit (K={K}, S={S})") from None
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"{name} times must be finite and >= 0")
    return a


def duration_table(g: _Graph, K: int, F, B=None, I=None, W=None, FB=None) -> np.ndarray:
    """(4*S + pairs, K) durations: F, B, I, W per stage, then one row per FB (forward stage,
    backward stage) pair: FB[forward stage] if given, else F + B of the two members. B defaults
    to I + W. ValueError naming the missing kind."""
    name, S, kinds = g.sched.name, g.S, g.kinds
    f = _stage_times(F, K, S, "F")
    split = [_stage_times(x, K, S, k) if x is not None else None for x, k in ((I, "I"), (W, "W"))]
    missing = any(x is None for x in split)
    if kinds & {"I", "W"} and missing:
        raise ValueError(f"{name} splits the backward into I and W: give I and W times")
    needs_b = "B" in kinds or ("FB" in kinds and FB is None)
    if B is None and needs_b and missing:
        raise ValueError(f"{name} runs full backwards: give B (or I and W) times")
    b = _stage_times(B, K, S, "B") if B is not None else (
        split[0] + split[1] if not missing else None)
    pairs = np.asarray(sorted(g.pairs, key=g.pairs.get), dtype=int).reshape(-1, 2)
    D = np.zeros((4 * S + len(pairs), K))
    for block, x in enumerate((f, b, *split)):
        if x is not None:
            D[block * S:(block + 1) * S] = x.T
    if len(pairs):
        D[4 * S:] = (_stage_times(FB, K, S, "FB")[:, pairs[:, 0]] if FB is not None
                     else f[:, pairs[:, 0]] + b[:, pairs[:, 1]]).T
    return D


def latency_table(sched: Schedule, K: int, c) -> np.ndarray | None:
    """(p+1, K) point-to-point latency per rank boundary (row p: zero, for same-rank edges),
    or None when all zero. ``c``: scalar, (p,) per boundary (c[r] joins ranks r and r+1,
    c[p-1] ranks p-1 and 0), (p-1,) when no edge wraps, (K, 1) or (K, p) per case."""
    p = sched.p
    a = np.asarray(c, dtype=np.float64)
    per_case = a.ndim == 2 and a.shape[-1] == 1          # (K, 1): one latency per case
    if a.ndim >= 1 and a.shape[-1] == p - 1 and p > 1 and not per_case:
        wraps = sched.placement == "loop" and sched.v > 1
        if wraps:
            raise ValueError(f"c has p-1={p - 1} entries; {sched.name} also crosses the rank "
                             f"{p - 1} -> 0 boundary: give p entries")
        a = np.concatenate([a, np.zeros(a.shape[:-1] + (1,))], axis=-1)
    try:
        a = np.broadcast_to(a, (K, p))
    except ValueError:
        raise ValueError(f"c of shape {np.shape(c)} does not fit (K={K}, p={p})") from None
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError("c must be finite and >= 0")
    if not a.any():
        return None
    return np.ascontiguousarray(np.concatenate([a, np.zeros((K, 1))], axis=1).T)


def memory_profile(g: _Graph) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(peak in-flight chunks (p,), peak pending-W chunks (p,), per rank the distinct
    (in-flight, pending) pairs at the starts of F and FB). In-flight: chunks whose F started and
    whose I/B has not ended; pending: chunks between the end of their I and the end of their W
    (reference §0.3 rule 4). Ops of a rank run one after another, so these depend on the op
    order only; memory at weight gamma = in-flight + gamma * pending peaks at an F start."""
    inflight, pending, points = [], [], []
    for ops in g.sched.ranks:
        a = b = top_a = top_b = 0
        seen = {(0, 0)}
        for op in ops:
            if op.kind in ("F", "FB"):
                a += 1
                top_a = max(top_a, a)
                seen.add((a, b))
            if op.kind in ("B", "FB", "I"):
                a -= 1
                b += op.kind == "I"
                top_b = max(top_b, b)
            elif op.kind == "W":
                b -= 1
        inflight.append(top_a)
        pending.append(top_b)
        points.append(np.array(sorted(seen), dtype=np.float64))
    return np.array(inflight), np.array(pending), points


def peak_memory(points: list[np.ndarray], gamma) -> np.ndarray:
    """Peak of in-flight + gamma * pending chunks per rank: (p,) for a scalar gamma, (K, p) for
    gamma of shape (K,). ValueError unless 0 <= gamma <= 1."""
    gam = np.asarray(gamma, dtype=np.float64)
    if gam.ndim > 1 or np.any(~np.isfinite(gam)) or np.any((gam < 0) | (gam > 1)):
        raise ValueError(f"gamma must be a number or (K,) array in [0, 1], got {gamma!r}")
    peaks = [np.max(pts[:, 0] + np.multiply.outer(gam, pts[:, 1]), axis=-1) for pts in points]
    return np.stack(peaks, axis=-1)
