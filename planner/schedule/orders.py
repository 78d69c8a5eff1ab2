"""Op orders of pipeline schedules: the ops each pipeline rank runs, in order, produced by each
schedule's own generator rule (reference/pipeline_schedules.md §1-§11; sources cited as
repo@commit:file:lines). An op is F (forward), B (full backward), I (input-gradient backward),
W (weight-gradient backward) or FB (a forward and a full backward run as one overlapped node)
of one micro-batch on one chunk (virtual stage) of the rank, in one direction (DualPipe).

Placement of the S = p*v stages of a chain on the p ranks: ``loop``, chunk c of rank r is stage
c*p + r; ``v``, chunk 0 of rank r is stage r and chunk 1 stage 2p-1-r (v = 2); ``bidirectional``
(DualPipe), two chains of p stages, stage r of direction 0 and stage p-1-r of direction 1 on
rank r, m/2 micro-batches each.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

class Op(NamedTuple):
    """One op of a rank. For FB, (mb, chunk, direction) is the forward member and ``back`` the
    (mb, chunk, direction) of the full-backward member."""
    kind: str
    mb: int
    chunk: int
    direction: int = 0
    back: tuple[int, int, int] | None = None


@dataclass(frozen=True, eq=False)
class Schedule:
    """The op order of one schedule. ``ranks[r]`` is rank r's ops in issue order; ``m`` is the
    micro-batches per optimizer step (DualPipe: total over both directions); ``v`` chunks per
    rank; ``n_stages`` = p*v stages per chain (the length of per-stage time arrays);
    ``param_copies`` = 2 for DualPipe (two copies of the parameters)."""
    name: str
    p: int
    m: int
    v: int
    ranks: tuple[tuple[Op, ...], ...]
    placement: str = "loop"
    group: int | None = None
    param_copies: int = 1

    @property
    def n_stages(self) -> int:
        return self.p * self.v

    @property
    def chunk_fraction(self) -> float:
        """Activation of one chunk in units of a stage's activation A: 1/v."""
        return 1.0 / self.v

    def stage(self, rank: int, chunk: int, direction: int = 0) -> int:
        """Stage index (0 .. n_stages-1) of ``chunk`` of ``rank`` in chain ``direction``."""
        if self.placement == "loop":
            return chunk * self.p + rank
        flip = chunk if self.placement == "v" else direction
        return self.n_stages - 1 - rank if flip else rank

    def rank_of(self, stage: int, direction: int = 0) -> int:
        """Rank holding ``stage`` of chain ``direction``."""
        if self.placement == "loop":
            return stage % self.p
        flip = stage >= self.p if self.placement == "v" else direction
        return self.n_stages - 1 - stage if flip else stage

    def boundary(self, stage: int, direction: int = 0) -> int:
        """Index into the per-rank-boundary latency array c (shape (p,)) of the edge between
        ``stage`` and ``stage + 1``: c[r] joins ranks r and r+1, c[p-1] joins rank p-1 to rank 0
        (the wrap of looped placements); -1 when both stages sit on the same rank."""
        a, b = self.rank_of(stage, direction), self.rank_of(stage + 1, direction)
        if a == b:
            return -1
        if self.placement == "loop" and a == self.p - 1 and b == 0:
            return self.p - 1
        return min(a, b)

    @staticmethod
    def label(op: Op) -> str:
        """An op as the reference prints it: F3, b0 (chunk 1), F2' (direction 1), [F7&b0]."""
        one = lambda k, j, c, d: (k.lower() if c % 2 else k) + str(j) + "'" * d  # noqa: E731
        if op.kind == "FB":
            return f"[{one('F', *op[1:4])}&{one('B', *op.back)}]"
        return one(*op[:4])


def _fail(rule: str) -> None:
    raise ValueError(rule)   # one line naming the rule


def _check_ints(**values) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            _fail(f"{name} must be an integer >= 1, got {value!r}")


def _gpipe(p, m):
    """GPipe: all forwards, then all backwards, micro-batches ascending (pytorch@00722e648b74
    torch/distributed/pipelining/schedules.py ScheduleGPipe._step_microbatches)."""
    return [[Op("F", j, 0) for j in range(m)] + [Op("B", j, 0) for j in range(m)]
            for _ in range(p)]


def _one_f_one_b(p, m):
    """1F1B: w = min(p-r-1, m) warm-up forwards, m-w pairs F(w+i) B(i), w cool-down backwards
    (Megatron-LM@d98e8a64 megatron/core/pipeline_parallel/schedules.py:2277-2279, 2378, 2450)."""
    def rank(w):
        pairs = [op for i in range(m - w) for op in (Op("F", w + i, 0), Op("B", i, 0))]
        return [Op("F", j, 0) for j in range(w)] + pairs + [Op("B", j, 0) for j in range(m - w, m)]
    return [rank(min(p - r - 1, m)) for r in range(p)]


def _zb_hand(p, m, warmup_c):
    """ZB-H1 (warmup_c 1) / ZB-H2 (warmup_c 2), the authors' hand schedule: w = (p-1-r)*warmup_c
    forwards; per i: F(w+i) if any left, I(i), W (FIFO) once w+i >= (p-1)*warmup_c; then the
    remaining W (sail-sg/zero-bubble-pipeline-parallelism@f68d38794764
    megatron/core/pipeline_parallel/efficiency.py:110-125)."""
    def rank(w):
        ops, n_w = [Op("F", j, 0) for j in range(w)], 0
        for i in range(m):
            ops += [Op("F", w + i, 0)] * (w + i < m) + [Op("I", i, 0)]
            if w + i >= (p - 1) * warmup_c:
                ops.append(Op("W", n_w, 0))
                n_w += 1
        return ops + [Op("W", j, 0) for j in range(n_w, m)]
    return [rank((p - r - 1) * warmup_c) for r in range(p)]


def _looped_bfs(p, m, v):
    """Looped BFS: all forwards of chunk 0, then chunk 1, ...; backwards chunk-reversed and
    micro-batch-reversed (pytorch@00722e648b74 schedules.py
    ScheduleLoopedBFS._calculate_single_rank_operations)."""
    ops = [Op("F", j, c) for c in range(v) for j in range(m)]
    ops += [Op("B", j, c) for c in reversed(range(v)) for j in reversed(range(m))]
    return [list(ops) for _ in range(p)]


def group_table(m: int, v: int, g: int) -> list[tuple[int, int]]:
    """Megatron-Core's virtual micro-batch table: entry k = (micro-batch, chunk) of the k-th
    forward. Micro-batches in groups of g; inside a group every chunk in turn; a group with
    lo + g >= m takes all remaining ids (Megatron-LM@d98e8a64 schedules.py:989-1016).
    p=2, g=3, m=5, v=2: mb 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1."""
    table = []
    for lo in range(0, m, g):
        hi = m if lo + g >= m else lo + g
        table += [(j, c) for c in range(v) for j in range(lo, hi)]
    return table


def _interleaved_rank(p, m, v, g, r, mode):
    """Rank r's ops of the interleaved family. Warm-up 2(p-1-r) + (v-1)g (combined: +1; zero
    bubble: (p-1-r) + (v-1)g) capped at m*v; steady: forward k+warm-up with backward k;
    backward k runs chunk v-1-chunk(k), micro-batches FIFO per chunk (Megatron-LM@d98e8a64
    schedules.py:929-986, 1244-1249, 1731, 1954; pytorch@00722e648b74 schedules.py
    _get_warmup_ops, _get_1f1b_rank_ops). Zero bubble: after backward b >= r, the oldest W."""
    table, total = group_table(m, v, g), m * v
    factor, extra = (1, 0) if mode == "zb" else (2, 1 if mode == "combined" else 0)
    warm = min(factor * (p - 1 - r) + (v - 1) * g + extra, total)
    back = [(j, v - 1 - c) for j, c in table]
    ops, pending = [Op("F", *table[k]) for k in range(warm)], deque()
    for k in range(total):
        f = table[warm + k] if warm + k < total else None
        if mode == "combined" and f is not None:
            ops.append(Op("FB", f[0], f[1], back=(back[k][0], back[k][1], 0)))
            continue
        if f is not None:
            ops.append(Op("F", *f))
        ops.append(Op("I" if mode == "zb" else "B", *back[k]))
        if mode == "zb":
            pending.append(back[k])
            if k >= r:
                ops.append(Op("W", *pending.popleft()))
    return ops + [Op("W", *jc) for jc in pending]


def _megatron_group(p, m, g):
    """Megatron-Core's group g (default p) and its validity rule p <= g <= m and
    (m mod g == 0 or m mod g >= p) (Megatron-LM@d98e8a64 schedules.py:1160-1180,
    model_parallel_config.py:567-568)."""
    g = p if g is None else g
    if not p <= g <= m:
        _fail(f"interleaved (Megatron): micro-batch group g={g} must satisfy p={p} <= g <= m={m}")
    if 0 < m % g < p:
        _fail(f"interleaved (Megatron): m mod g = {m} mod {g} = {m % g} must be 0 or >= p={p}")
    return g


def _pytorch_group(p, m, g, name):
    """PyTorch's rounds = max(1, m // p), group mpr = m // rounds, valid iff m mod rounds == 0
    (pytorch@00722e648b74 schedules.py ScheduleInterleaved1F1B.__init__)."""
    rounds = max(1, m // p)
    if m % rounds:
        _fail(f"{name} (PyTorch): m={m} must be a multiple of rounds = max(1, m // p) = {rounds}")
    if g is not None and g != m // rounds:
        _fail(f"{name} (PyTorch): the group is m // rounds = {m // rounds}; do not pass g={g}")
    return m // rounds


class _Emitter:
    """Counter-driven op emission for DualPipe(V): FIFO micro-batch counters per (chunk,
    direction) key for forwards and backwards, and a FIFO queue of deferred W."""

    def __init__(self):
        self.ops, self.nf, self.nb, self.queue = [], {}, {}, deque()

    def _next(self, counter, key):
        counter[key] = counter.get(key, 0) + 1
        return counter[key] - 1

    def fwd(self, key):
        self.ops.append(Op("F", self._next(self.nf, key), *key))

    def bwd(self, key, split=False):
        self.ops.append(Op("I" if split else "B", self._next(self.nb, key), *key))
        if split:
            self.queue.append(self.ops[-1][1:4])

    def weight(self):
        if self.queue:
            self.ops.append(Op("W", *self.queue.popleft()))

    def pair(self, fkey, bkey):
        jf, jb = self._next(self.nf, fkey), self._next(self.nb, bkey)
        self.ops.append(Op("FB", jf, *fkey, back=(jb, *bkey)))


def _zbv_rank(p, m, r):
    """ZB-V (PyTorch): with n = max(2p-1, m): 2(p-r)-1 F0; r (F1, F0); p-r (F1, I1, W1); while
    f1 < f0 or f0 < n: [F0 if f0 < n], I0, W0, F1, I1, W1; cool-down r (I0, I1), p-r (I0, W0),
    then the remaining W1, W0; ops of micro-batches >= m are dropped (pytorch@00722e648b74
    schedules.py ScheduleZBVZeroBubble._calculate_single_rank_operations)."""
    n, ops, f, b = max(2 * p - 1, m), [], [0, 0], [0, 0]

    def fwd(c):
        ops.append(Op("F", f[c], c))
        f[c] += 1

    def back(c, weight=True):
        ops.extend([Op("I", b[c], c)] + ([Op("W", b[c], c)] if weight else []))
        b[c] += 1
    for c in [0] * (2 * (p - r) - 1) + [1, 0] * r:
        fwd(c)
    for _ in range(p - r):
        fwd(1)
        back(1)
    while f[1] < f[0] or f[0] < n:
        if f[0] < n:
            fwd(0)
        back(0)
        fwd(1)
        back(1)
    w = list(b)
    for c in [0, 1] * r:
        back(c, weight=False)
    for j in range(p - r):
        back(0, weight=False)
        ops.append(Op("W", w[0] + j, 0))
    ops += [Op("W", j, 1) for j in range(w[1], b[1])]
    ops += [Op("W", j, 0) for j in range(w[0] + p - r, b[0])]
    return [op for op in ops if op.mb < m]


def _dual_steps(e, k0, k1, n_half_ranks, h, main_steps, middle):
    """The eight steps of DualPipe / DualPipeV on one rank, with k0, k1 the (chunk, direction)
    keys of the rank's phase 0 and phase 1 and h its (half-)rank (deepseek-ai/DualPipe@3da1bbe
    dualpipe/dualpipe.py:358-425, dualpipe/dualpipev.py:330-396)."""
    for _ in range((n_half_ranks - h - 1) * 2):                 # 1: nF0
        e.fwd(k0)
    for _ in range(h + 1):                                      # 2: nF0F1
        e.fwd(k0)
        e.fwd(k1)
    for _ in range(n_half_ranks - h - 1):                       # 3: nI1W1F1 (zero bubble)
        e.bwd(k1, split=True)
        e.weight()
        e.fwd(k1)
    for i in range(main_steps):                                 # 4: n[F0&B1][F1&B0]
        if i == 0 and middle:                                   # not overlapped
            e.fwd(k0)
            e.bwd(k1)
        else:
            e.pair(k0, k1)
        e.pair(k1, k0)
    for _ in range(n_half_ranks - h - 1):                       # 5: nB1[F1&B0]
        e.bwd(k1)
        e.pair(k1, k0)
    split = False
    for i in range(h + 1):                                      # 6: nB1B0, I from half-way
        split = split or (i == (h + 1) // 2 and h % 2 == 1)
        e.bwd(k1, split)
        split = split or (i == (h + 1) // 2 and h % 2 == 0)
        e.bwd(k0, split)
    for _ in range(n_half_ranks - h - 1):                       # 7: nWI0
        e.weight()
        e.bwd(k0, split=True)
    for _ in range(h + 1):                                      # 8: nW
        e.weight()
    return e.ops


def _dualpipev(p, m):
    """DualPipeV (cut-in-half DualPipe, V placement): steps 1-8 with phase 0 = chunk 0 (stage r),
    phase 1 = chunk 1 (stage 2p-1-r); step 4 runs m-2p+r+1 times, its first pair on the last
    rank not overlapped (deepseek-ai/DualPipe@3da1bbe dualpipe/dualpipev.py:330-396; PyTorch
    ScheduleDualPipeV mirrors it)."""
    return [_dual_steps(_Emitter(), (0, 0), (1, 0), p, r, m - 2 * p + r + 1, r == p - 1)
            for r in range(p)]


def _dualpipe(p, m):
    """DualPipe (bidirectional): half-rank h = min(r, p-1-r); phase 0 is direction 0 on the first
    half of the ranks and direction 1 on the second; step 4 runs m/2-p+h+1 times, its first
    pair on the two middle ranks not overlapped (deepseek-ai/DualPipe@3da1bbe
    dualpipe/dualpipe.py:44-45, 345-425)."""
    return [_dual_steps(_Emitter(), (0, int(r >= p // 2)), (0, int(r < p // 2)), p // 2,
                        min(r, p - 1 - r), m // 2 - p + min(r, p - 1 - r) + 1,
                        r in (p // 2 - 1, p // 2)) for r in range(p)]


# ---------------------------------------------------------------- registry

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2",
             "interleaved-zero-bubble", "zbv", "dualpipev", "dualpipe", "megatron-combined-1f1b")
VARIANTS = {"1f1b": ("megatron", "pytorch"), "interleaved-1f1b": ("megatron", "pytorch")}
_INTERLEAVED = {"interleaved-1f1b": "1f1b", "interleaved-zero-bubble": "zb",
                "megatron-combined-1f1b": "combined"}


def _constraints(name, p, m, v, variant):
    """Each generator's own constraints: ZB-H1/H2 m >= 2p (efficiency.py:111); ZB-V and
    DualPipeV v = 2 (PyTorch), DualPipeV m >= 2p (dualpipev.py:318); DualPipe p, m even and
    m >= 2p (dualpipe.py:332-333); combined 1F1B needs VPP when PP > 1
    (transformer_config.py:3002-3071); PyTorch Schedule1F1B m >= p."""
    one, enough = (v == 1, "v = 1 (one stage per rank)"), (m >= 2 * p, "m >= 2p")
    rules = {"gpipe": [one], "1f1b": [one, (variant != "pytorch" or m >= p, "m >= p (PyTorch)")],
             "zb-h1": [one, enough], "zb-h2": [one, enough], "looped-bfs": [],
             "zbv": [(v == 2, "v = 2 (V shape)")],
             "dualpipev": [(v == 2, "v = 2 (V shape)"), enough],
             "dualpipe": [one, (p % 2 == 0, "p even"), (m % 2 == 0, "m even"), enough],
             "interleaved-1f1b": [(v >= 2, "v >= 2 (v = 1 is 1f1b)")],
             "interleaved-zero-bubble": [(v >= 2, "v >= 2 (v = 1 is zb-h1)")],
             "megatron-combined-1f1b": [(v == 1 if p == 1 else v >= 2,
                                         "v = 1 when p = 1 and v >= 2 (VPP) when p > 1")]}
    for ok, rule in rules[name]:
        if not ok:
            _fail(f"{name} needs {rule}, got p={p}, m={m}, v={v}")


def _build(name, p, m, v, g, variant):
    """(ranks, placement, group) of one schedule whose constraints hold."""
    mode = _INTERLEAVED.get(name)
    if mode == "combined" and p == 1:       # the PP = 1 loop F0, [F1&B0], ... (combined_1f1b.py)
        return [_interleaved_rank(1, m, 1, m, 0, mode)], "loop", None
    if mode is not None:
        g = (_pytorch_group(p, m, g, name) if mode == "zb" or variant == "pytorch"
             else _megatron_group(p, m, g))
        return [_interleaved_rank(p, m, v, g, r, mode) for r in range(p)], "loop", g
    if g is not None:
        _fail(f"{name} has no micro-batch group g")
    if name in ("zbv", "dualpipev", "dualpipe"):
        ranks = ([_zbv_rank(p, m, r) for r in range(p)] if name == "zbv" else
                 _dualpipev(p, m) if name == "dualpipev" else _dualpipe(p, m))
        return ranks, "bidirectional" if name == "dualpipe" else "v", None
    ranks = {"gpipe": _gpipe, "1f1b": _one_f_one_b, "looped-bfs": _looped_bfs,
             "zb-h1": _zb_hand, "zb-h2": _zb_hand}[name]
    args = {"looped-bfs": (v,), "zb-h1": (1,), "zb-h2": (2,)}.get(name, ())
    return ranks(p, m, *args), "loop", None


@lru_cache(maxsize=512)
def build_schedule(name: str, p: int, m: int, v: int = 1, g: int | None = None,
                   variant: str | None = None) -> Schedule:
    """The op order of schedule ``name`` (one of SCHEDULES) on p ranks, m micro-batches per
    optimizer step (DualPipe: both directions together), v chunks per rank; ``g`` is Megatron's
    micro-batch group of the interleaved schedules (default p); ``variant`` picks "megatron"
    (default) or "pytorch" for 1f1b and interleaved-1f1b (interleaved-zero-bubble is PyTorch's).
    Cached. ValueError (one line naming the rule) for an unknown name or variant or a violated
    constraint."""
    if name not in SCHEDULES:
        _fail(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")
    _check_ints(p=p, m=m, v=v)
    if variant is not None and variant not in VARIANTS.get(name, ()):
        _fail(f"{name} has no variant {variant!r}")
    _constraints(name, p, m, v, variant)
    ranks, placement, group = _build(name, p, m, v, g, variant)
    return Schedule(name, p, m, v, tuple(tuple(ops) for ops in ranks), placement, group,
                    2 if name == "dualpipe" else 1)


def split_pairs(sched: Schedule) -> Schedule:
    """``sched`` with every FB pair issued as its F, then its B: how PyTorch's runtime runs an
    OVERLAP_F_B action when no overlap function is registered (pytorch@00722e648b74
    schedules.py _PipelineScheduleRuntime._step_microbatches). TV8: DualPipeV 102 -> 99."""
    def ops(rank):
        for op in rank:
            yield from ((Op("F", *op[1:4]), Op("B", *op.back)) if op.kind == "FB" else (op,))
    return replace(sched, name=f"{sched.name} (pairs split)",
                   ranks=tuple(tuple(ops(rank)) for rank in sched.ranks))
