"""Candidate layouts as one struct of numpy arrays, and the constraints that prune them.

Every field is an int64 (or bool) array of the same length N; the cost model evaluates all N at
once. Nothing here loops over candidates in Python: the space is a Cartesian product built with
numpy, then filtered by boolean masks, each rule named so the search can say what it pruned.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .specs import RECOMPUTE_CODES, Layout, ModelSpec, TrainingSpec

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}


@dataclass(frozen=True)
class Candidates:
    """N layouts: arrays of shape (N,). ``recompute`` holds codes 0 none, 1 selective, 2 full."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    vpp: np.ndarray

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
                      sequence_parallel=bool(self.sequence_parallel[i]), vpp=int(self.vpp[i]))

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
                   vpp=col(lambda x: x.vpp))

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


def constraint_masks(model: ModelSpec, training: TrainingSpec, gpus_per_node: int,
                     c: Candidates, allow_cross_node_tp: bool = False) -> dict[str, np.ndarray]:
    """Named validity rules -> boolean arrays (True = the candidate passes that rule).

    Rules follow Megatron-LM's argument checks: heads and KV heads divisible by tp (or tp a
    multiple of the KV heads), layers divisible by pp*vpp, the global batch divisible by
    dp*micro_batch_size, interleaving needs pp > 1 and at least pp micro-batches, SP needs tp > 1
    and seq_length divisible by tp.
    """
    a, g, L = model.num_attention_heads, model.kv_heads, model.num_layers
    B, s = training.global_batch_size, training.seq_length
    tp, pp, dp, mbs, vpp = c.tp, c.pp, c.dp, c.micro_batch_size, c.vpp
    m = B // np.maximum(dp * mbs, 1)
    rules = {
        "tp within a node (NVLink domain)": (tp <= gpus_per_node) | allow_cross_node_tp,
        "heads divisible by tp": (a % tp == 0) & ((g % tp == 0) | (tp % g == 0)),
        "layers divisible by pp*vpp": (L % (pp * vpp) == 0),
        "global batch divisible by dp*micro_batch_size": (B % (dp * mbs) == 0),
        "interleaving needs pp > 1 and >= pp micro-batches": (vpp == 1) | ((pp > 1) & (m >= pp)),
        "sequence parallel needs tp > 1 and seq_length divisible by tp":
            ~c.sequence_parallel | ((tp > 1) & (s % tp == 0)),
    }
    return rules
