"""Context parallelism (CP): the terms that have no dense equivalent (formulas.md 3.4, 5.7).

CP splits every sequence over ``cp`` ranks placed right after TP in Megatron's rank order
(tp-cp-dp-pp). What it changes elsewhere is read from the layout (degrees.LayoutDegrees): a GPU
processes s*b/cp tokens per micro-batch and 1/(tp*cp) of its causal attention (Megatron cuts
every sequence into 2*cp chunks for load balance); micro-batches per step stay B/(dp*b); dense
gradients and ZeRO shards live on the dp*cp group. This module owns the K/V block the ring
passes and the ring's receive buffers; the ring's messages are listed with every other
collective in cost.volumes and timed in cost.step.
"""

from __future__ import annotations

import numpy as np

from ..specs import ModelSpec, TrainingSpec
from .blocks import kv_heads_per_rank


def kv_chunk_bytes(model: ModelSpec, training: TrainingSpec, c, act_bytes: float = 2.0) -> np.ndarray:
    """X_kv = 2 (K, V) * (s/cp) * b * d_h * (g/tp) * e: the local K/V block of one CP rank, which
    the ring passes to its neighbour at every step (formulas.md 5.7). blocks.kv_heads_per_rank KV heads
    per TP rank (max(g, t)/t). Bytes, broadcast shape."""
    heads = kv_heads_per_rank(model, c.tp)
    return 2.0 * c.tokens_per_microbatch(training.seq_length) * model.kv_channels * heads * act_bytes


def ring_buffer_bytes(model: ModelSpec, training: TrainingSpec, c) -> np.ndarray:
    """Receive buffers of the ring: two K/V blocks, 2 * X_kv bytes where cp > 1 (formulas.md 3.4:
    transient receive buffers of 1-2 KV chunks)."""
    return np.where(np.asarray(c.cp) > 1, 2.0 * kv_chunk_bytes(model, training, c), 0.0)
