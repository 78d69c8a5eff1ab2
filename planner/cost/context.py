"""Context parallelism (CP) and Megatron's distributed optimizer in the cost model.

CP (formulas.md 3.4, 4.4, 5.3, 5.6, 5.7) splits every sequence over ``cp`` ranks placed right
after TP in Megatron's rank order (tp-cp-dp-pp). On one GPU it changes the terms exactly as a
micro-batch of b/cp sequences would, with the dense gradient/optimizer sharding group enlarged
from d to d*cp:
  - tokens per GPU s*b/cp: GEMM and elementwise work, activations, TP and PP message sizes,
    edge buffers (formulas.md 3.4: every per-layer term scales with s/c);
  - causal attention with Megatron's 2*cp-chunk load balancing: each rank does 1/cp of it;
  - micro-batches per step m = B/(d*b) unchanged; gradient reduction and ZeRO / distributed
    optimizer shard over n = d*cp (formulas.md 2.1, 5.6: ``intra_dp_cp_group``), ranks tp apart.
So ``cost_view`` rewrites (b, d, cp) -> (b/cp, d*cp, 1) and the rest of the model runs as is;
``ring_times`` adds what has no such equivalent, the CP ring's exposed KV exchange.

The distributed optimizer is costed as the ZeRO-1 row of formulas.md 2.1 and 5.6 (memory
2 + g + 12/n bytes per parameter; gradient reduce-scatter + parameter all-gather once per step),
which is how ``zero_stage`` 1 is costed: ``cost_view`` maps it there.
All arrays broadcast (flat (N,) or a grid); SI units.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..space import Candidates
from ..specs import ModelSpec, TrainingSpec
from .collectives import Links, p2p_time


def cost_view(c: Candidates) -> Candidates:
    """The candidates as the rest of the cost model sees them (returns ``c`` itself if no CP
    and no distributed optimizer): micro_batch_size b/cp (float), dp d*cp, cp 1, and the
    distributed optimizer as zero_stage 1."""
    has_cp = bool(np.any(c.cp != 1))
    has_dist = bool(np.any(c.distributed_optimizer))
    if not (has_cp or has_dist):
        return c
    view = c
    if has_cp:
        view = replace(view, micro_batch_size=c.micro_batch_size / c.cp, dp=c.dp * c.cp,
                       cp=np.ones_like(c.cp))
    if has_dist:
        view = replace(view, zero_stage=np.where(c.distributed_optimizer, 1, c.zero_stage),
                       distributed_optimizer=np.zeros_like(c.distributed_optimizer))
    return view


def kv_chunk_bytes(model: ModelSpec, training: TrainingSpec, c: Candidates) -> np.ndarray:
    """X_kv = 2 (K, V) * (s/cp) * b * d_h * max(g, tp)/tp * 2 B: the local KV block one CP
    rank passes to its ring neighbour per step (formulas.md 5.7; KV heads replicate when g < tp,
    formulas.md 1.3). Bytes, broadcast shape."""
    tp = np.asarray(c.tp, dtype=np.float64)
    heads = np.maximum(model.kv_heads, tp) / tp
    return 2.0 * (training.seq_length / c.cp) * c.micro_batch_size * model.kv_channels * heads * 2.0


def ring_times(model: ModelSpec, training: TrainingSpec, c: Candidates, links: Links,
               attention_forward: np.ndarray,
               attention_backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exposed CP ring seconds per layer per micro-batch on one GPU: (forward, backward).

    ``--cp-comm-type p2p`` (Megatron's default), formulas.md 5.7: forward cp-1 steps, each
    passing X_kv to the next rank while attention runs on the block in hand; backward cp-1
    steps moving KV and dKV (2 X_kv). A step exposes what its transfer takes beyond its share
    of the attention time (attention_forward / cp; attention_backward / cp):
        fwd = (cp-1) * max(0, t(X_kv) - t_attn_f/cp),  bwd = (cp-1) * max(0, t(2 X_kv) - t_attn_b/cp)
    with t(S) = alpha + S/B, on NVLink when the ring stays in a node (tp*cp <= G), else on the
    GPU's NIC share. ``attention_*`` are the per-GPU times of the local share (cost_view).
    Zero where cp = 1.
    """
    cp = np.asarray(c.cp, dtype=np.float64)
    x_kv = kv_chunk_bytes(model, training, c)
    crosses = c.tp * c.cp > links.gpus_per_node
    t_fwd = p2p_time(x_kv, crosses, links)
    t_bwd = p2p_time(2.0 * x_kv, crosses, links)
    steps = cp - 1
    forward = steps * np.maximum(0.0, t_fwd - attention_forward / cp)
    backward = steps * np.maximum(0.0, t_bwd - attention_backward / cp)
    return forward, backward


def ring_buffer_bytes(model: ModelSpec, training: TrainingSpec, c: Candidates) -> np.ndarray:
    """Receive buffers of the ring: two KV blocks, 2 * X_kv bytes where cp > 1 (formulas.md 3.4:
    transient receive buffers of 1-2 KV chunks)."""
    return np.where(c.cp > 1, 2.0 * kv_chunk_bytes(model, training, c), 0.0)
