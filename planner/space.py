"""Candidate layouts as one struct of numpy arrays, and the constraints that prune them.

Every field is an int64 (or bool) array of the same length N; the cost model evaluates all N at
once. Nothing here loops over candidates in Python: the space is a Cartesian product built with
numpy, then filtered by boolean masks, each rule named so the search can say what it pruned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import SimpleNamespace

import numpy as np

from .specs import RECOMPUTE_CODES, Layout, ModelSpec, TrainingSpec

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}


@dataclass(frozen=True)
class Candidates:
    """N layouts: arrays of shape (N,). ``recompute`` holds codes 0 none, 1 selective, 2 full.

    ``cp`` (context parallel, int) and ``distributed_optimizer`` (bool) default to 1 / False;
    ``first_stage_layers`` / ``last_stage_layers`` (int) to 0, the even pipeline split.
    """

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray = field(default=None)  # type: ignore[assignment]
    distributed_optimizer: np.ndarray = field(default=None)  # type: ignore[assignment]
    first_stage_layers: np.ndarray = field(default=None)  # type: ignore[assignment]
    last_stage_layers: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in ("first_stage_layers", "last_stage_layers"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros_like(self.tp))
        if self.cp is None:
            object.__setattr__(self, "cp", np.ones_like(self.tp))
        if self.distributed_optimizer is None:
            object.__setattr__(self, "distributed_optimizer", np.zeros(np.shape(self.tp), dtype=bool))

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index: np.ndarray) -> "Candidates":
        """The candidates selected by a boolean mask or an index array."""
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def layout(self, i: int) -> Layout:
        """Candidate i as a Layout."""
        return Layout(tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]),
                      zero_stage=int(self.zero_stage[i]),
                      micro_batch_size=int(self.micro_batch_size[i]),
                      recompute=RECOMPUTE_NAMES[int(self.recompute[i])],  # type: ignore[arg-type]
                      sequence_parallel=bool(self.sequence_parallel[i]), vpp=int(self.vpp[i]),
                      cp=int(self.cp[i]), distributed_optimizer=bool(self.distributed_optimizer[i]),
                      first_stage_layers=int(self.first_stage_layers[i]),
                      last_stage_layers=int(self.last_stage_layers[i]))

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> "Candidates":
        """Arrays of length len(layouts), one entry per layout."""
        def col(get, dtype=np.int64):
            return np.array([get(x) for x in layouts], dtype=dtype)
        return cls(tp=col(lambda x: x.tp), pp=col(lambda x: x.pp), dp=col(lambda x: x.dp),
                   zero_stage=col(lambda x: x.zero_stage),
                   micro_batch_size=col(lambda x: x.micro_batch_size),
                   recompute=col(lambda x: RECOMPUTE_CODES[x.recompute]),
                   sequence_parallel=col(lambda x: x.sequence_parallel, bool),
                   vpp=col(lambda x: x.vpp), cp=col(lambda x: x.cp),
                   distributed_optimizer=col(lambda x: x.distributed_optimizer, bool),
                   first_stage_layers=col(lambda x: x.first_stage_layers),
                   last_stage_layers=col(lambda x: x.last_stage_layers))

    def num_microbatches(self, global_batch_size: int) -> np.ndarray:
        """m = B / (dp * micro_batch_size), float (exact when the layout is valid)."""
        return global_batch_size / (self.dp * self.micro_batch_size)


def divisors(n: int) -> np.ndarray:
    """All positive divisors of n, ascending (int64)."""
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def product(**axes: np.ndarray) -> dict[str, np.ndarray]:
    """Cartesian product of named 1-D arrays, as flat arrays of equal length (C order)."""
    grids = np.meshgrid(*axes.values(), indexing="ij")
    return {name: grid.ravel() for name, grid in zip(axes, grids)}


# Megatron-Core's attention splits the heads and the KV heads (query groups) over TP with
# divide(), which asserts divisibility: no KV-head replication when tp exceeds them.
HEADS_RULE = "heads and KV heads divisible by tp"
UNEVEN_RULE = "uneven pipeline split: edge stages of 1..middle layers, interleaved as Megatron-Core allows"


def constraint_masks(model: ModelSpec, training: TrainingSpec, gpus_per_node: int,
                     c: Candidates, allow_cross_node_tp: bool = False) -> dict[str, np.ndarray]:
    """Named validity rules -> boolean arrays (True = the candidate passes that rule).

    Rules follow Megatron-LM's argument checks: heads and KV heads divisible by tp
    (Megatron-Core's attention divides both by the TP size; formulas.md 1.3 also allows tp a
    multiple of the KV heads with replication, which Megatron-Core and torchtitan do not run),
    layers divisible by pp*vpp, the global batch divisible by
    dp*micro_batch_size, interleaving needs pp > 1 and at least pp micro-batches, SP needs tp > 1
    and seq_length divisible by tp; CP needs seq_length divisible by 2*cp (times tp with SP) and
    flash attention; the distributed optimizer goes with zero_stage 0. Masks broadcast.
    """
    a, g, L = model.num_attention_heads, model.kv_heads, model.num_layers
    B, s = training.global_batch_size, training.seq_length
    tp, pp, dp, mbs, vpp = c.tp, c.pp, c.dp, c.micro_batch_size, c.vpp
    m = B // np.maximum(dp * mbs, 1)
    rules = {
        "tp within a node (NVLink domain)": (tp <= gpus_per_node) | allow_cross_node_tp,
        HEADS_RULE: (a % tp == 0) & (g % tp == 0),
        "layers divisible by pp*vpp": (L % (pp * vpp) == 0) | (c.first_stage_layers > 0),
        "global batch divisible by dp*micro_batch_size": (B % (dp * mbs) == 0),
        "interleaving needs pp > 1 and >= pp micro-batches": (vpp == 1) | ((pp > 1) & (m >= pp)),
        "sequence parallel needs tp > 1 and seq_length divisible by tp":
            ~c.sequence_parallel | ((tp > 1) & (s % tp == 0)),
        # context parallel (formulas.md 5.7): Megatron splits the sequence into 2*cp chunks for
        # causal load balance, each CP rank's share then split by tp under SP; TE's CP runs in
        # its fused (flash) attention only.
        "seq_length divisible by 2*cp (2*cp*tp with SP)":
            (c.cp == 1) | (s % (2 * c.cp * np.where(c.sequence_parallel, tp, 1)) == 0),
        "context parallel needs flash attention": (c.cp == 1) | training.flash_attention,
        "distributed optimizer replaces ZeRO (zero_stage 0 only)":
            ~c.distributed_optimizer | (c.zero_stage == 0),
        UNEVEN_RULE: _uneven_ok(L, c),
    }
    return rules


def _uneven_ok(num_layers: int, c: Candidates) -> np.ndarray:
    """True for an even split, or an uneven one Megatron-Core accepts and plan3d models: first
    and last stage at least one layer, the rest L - first - last divided equally among the
    pp - 2 middle stages, at least as many layers as either edge stage (pp = 2: first + last = L).
    With interleaving (vpp > 1) one of Megatron-Core's two ways must hold:
    (a) ``--decoder-first/last-pipeline-num-layers``: each stage's layers divisible by vpp, pp > 2
        (get_transformer_layer_offset's interleaved branch divides by the middle stages' count);
    (b) ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``: the
        embedding and the loss count as one layer each, so first = last = middle - 1 and
        (L + 2) = pp * middle splits into pp*vpp chunks of middle/vpp (Megatron-Core's layer
        offsets add one layer for each; Llama-3 405B, 126 layers on pp = 16: 7 + 14*8 + 7).
    Broadcast bool array."""
    f, la, pp, v = c.first_stage_layers, c.last_stage_layers, c.pp, c.vpp
    if not np.any((f > 0) | (la > 0)):
        return np.ones(np.shape(f), dtype=bool)
    rest = num_layers - f - la
    mid = np.where(pp > 2, rest // np.maximum(pp - 2, 1), 0)
    shape_ok = (f >= 1) & (la >= 1) & (pp >= 2) & \
        np.where(pp > 2, (rest > 0) & (rest % np.maximum(pp - 2, 1) == 0) & (mid >= f) & (mid >= la),
                 rest == 0)
    # (a) needs middle stages: Megatron-Core's interleaved layer offset divides by their count
    per_stage = (f % v == 0) & (la % v == 0) & (pp > 2) & (mid % v == 0)
    valid = shape_ok & ((v == 1) | per_stage | embedding_loss_split(num_layers, c))
    return ((f == 0) & (la == 0)) | valid


def embedding_loss_split(num_layers: int, c) -> np.ndarray:
    """True where an uneven split is Megatron-Core's embedding-and-loss-as-layers split (way (b)
    of _uneven_ok): first = last = (L + 2)/pp - 1 with (L + 2) divisible by pp*vpp, and at least
    two layers' worth per chunk, so that the chunks holding the embedding or the loss keep a
    transformer layer. ``c``: any object with pp, vpp, first_stage_layers, last_stage_layers
    (arrays or ints). Bool array."""
    f, la = np.asarray(c.first_stage_layers), np.asarray(c.last_stage_layers)
    pp, vpp = np.asarray(c.pp), np.asarray(c.vpp)
    return (f > 0) & (f == la) & ((num_layers + 2) == pp * (f + 1)) & \
        ((f + 1) % vpp == 0) & (f + 1 >= 2 * vpp)


def uneven_vpp_options(num_layers: int, pp: int, first: int, last: int, upto: int = 16) -> list[int]:
    """The vpp values in 1..``upto`` with which the uneven split first+..+last of ``num_layers``
    layers on ``pp`` stages passes _uneven_ok (for messages). [] if none does."""
    vpp = np.arange(1, upto + 1)
    c = SimpleNamespace(first_stage_layers=np.full_like(vpp, first), last_stage_layers=np.full_like(vpp, last),
                        pp=np.full_like(vpp, pp), vpp=vpp)
    return [int(v) for v in vpp[_uneven_ok(num_layers, c)]]


def uneven_problem(num_layers: int, pp: int, first: int, last: int, vpp: int) -> str:
    """Why the uneven split first+..+last of ``num_layers`` on ``pp`` stages fails _uneven_ok, in
    words (for error messages); "" if it passes."""
    rest, middle = num_layers - first - last, max(pp - 2, 0)
    if pp < 2:
        return "an uneven split needs pp >= 2"
    if middle == 0:
        if rest != 0:
            return f"on pp=2 first + last must be the {num_layers} layers"
        if vpp > 1 and vpp not in uneven_vpp_options(num_layers, pp, first, last, vpp):
            return ("interleaving an uneven split on pp=2 needs the embedding-and-loss form "
                    "(first = last, their layers + 1 divisible by vpp, at least 2 per chunk)")
    elif rest <= 0 or rest % middle:
        return f"the {rest} layers left do not divide over the {middle} middle stages"
    elif rest // middle < max(first, last):
        return f"an edge stage holds more than a middle stage's {rest // middle} layers"
    works = uneven_vpp_options(num_layers, pp, first, last, max(vpp, 16))
    if vpp not in works:
        other = [v for v in works if v > 1]
        return (f"with vpp {vpp} neither is every stage's layer count divisible by vpp nor is it the "
                "embedding-and-loss split (first = last = middle - 1, at least 2 layers per chunk)"
                + (f"; vpp {', '.join(map(str, other))} would do" if other else "; only vpp 1 works"))
    return ""
