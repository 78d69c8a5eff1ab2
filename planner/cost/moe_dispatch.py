"""Token dispatch and combine volumes of one MoE layer for a given routing (moe.md 4.1-4.2).

``moe_dispatch_volumes`` takes the routing that happened (or an expected one, ``uniform_counts``)
as per-expert row counts of every source rank of one expert-model-parallel group (ETP x EP
ranks, Megatron-Core's ``tp_ep`` group) and returns, per rank of that group, the calls and
payload bytes of each collective of the alltoall dispatcher for one forward (and its backward)
of one micro-batch. The validator checks it against the counted collectives of the routing its
ranks recorded; the MoE cost model can take its expectation.

Rank (t, p) is ETP rank t and EP rank p; expert e lives on EP rank e // (E/ep) (each of the etp
ranks of that EP rank holds a 1/etp shard of it). Rank (t, p) routes counts[t, p, e] rows
(token copies) to expert e: S = sum_e counts[t, p, e] = T*k rows in dropless routing. Per layer
per micro-batch, on rank (t, p), with h the hidden size and a the activation bytes:
- R = sum_q sum_{e on p} counts[t, q, e]: rows it receives (its EP group's tokens for its
  experts); O = S - sum_{e on p} counts[t, p, e]: rows it sends to other ranks;
- ``ep:all_to_all``: dispatch (receives R rows) and combine (receives its S rows back), forward;
  the same two in backward: 4 calls, payload (received, this rank's slot included)
  2*(R + S)*h*a. ``ep:all_to_all_offrank``: the bytes that leave the rank: dispatch O, combine
  R - (S - O), and the backward's the same: 2*(2*O + R - S)*h*a. Summed over ranks this is
  4*sum(O)*h*a; for uniform routing O = T*k*(ep-1)/ep (moe.md 4.2).
- ``etp:all_gather`` / ``etp:reduce_scatter`` (etp > 1): the received rows gathered over the
  ETP group before the expert GEMMs and the partial outputs reduce-scattered after, forward and
  backward (the AG's backward is a RS and vice versa): 2 of each, payload the gathered rows.
- ``tp_ep:all_gather``: the per-expert counts of every rank of the group (the receive sizes),
  forward only: etp*ep*E integers.
impl "megatron" (S1 token_dispatcher.py L557-908): the permuted probs travel with the tokens
(one more all-to-all each way, ``probs_bytes`` per row: fp32 with --moe-router-dtype fp32), the
ETP all-gather is exact (sum of the peers' R, plus the probs), and the combine's reduce-scatter
runs in the probs dtype; counts are int64. impl "torch" (planner.validate): no probs exchange
(the weights are applied on the source rank after the combine), and the ETP all-gather and
reduce-scatter are padded to the largest peer's R (gloo has no uneven all-gather), all in the
activation dtype. With ``recompute`` (full recompute, or the ``moe`` module) the forward
collectives run once more in backward.
"""

from __future__ import annotations

import numpy as np

from .moe import PROB_BYTES

Key = tuple[str, str]


def uniform_counts(tokens: float, topk: int, num_experts: int, ep: int, etp: int = 1) -> np.ndarray:
    """The expected routing of ``tokens`` tokens per rank, each to ``topk`` of ``num_experts``
    experts uniformly: (etp, ep, E) float array of T*k/E rows per expert."""
    return np.full((etp, ep, num_experts), tokens * topk / num_experts, dtype=np.float64)


def _rows(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, R, O) per rank (etp, ep) of counts (etp, ep, E); ValueError if E % ep."""
    etp, ep, n = counts.shape
    if n % ep:
        raise ValueError(f"{n} experts do not divide over ep={ep}")
    owner = np.arange(n) // (n // ep)                      # (E,) EP rank of each expert
    mine = owner[None, :] == np.arange(ep)[:, None]        # (ep, E): experts of EP rank p
    sent = counts.sum(axis=2)                              # S (etp, ep)
    received = np.einsum("tqe,pe->tp", counts, mine)       # R: rows for p's experts, all q
    local = np.einsum("tpe,pe->tp", counts, mine)          # rows that stay on the rank
    return sent, received, sent - local


def moe_dispatch_volumes(counts, hidden: int, act_bytes: float, *, impl: str = "megatron",
                         probs_bytes: float = PROB_BYTES, count_bytes: float = 8.0,
                         recompute: bool = False) -> dict[Key, tuple[np.ndarray, np.ndarray]]:
    """{(group, kind): (calls, payload bytes)} per rank of one tp_ep group for ONE MoE layer's
    forward and backward of ONE micro-batch (module docstring; moe.md 4.1-4.2).

    ``counts``: (etp, ep, E) rows each source rank routes to each expert (ints as measured, or
    floats from uniform_counts). ``hidden`` h; ``act_bytes`` a (2 bf16; the validator's 8 or 4).
    Returns arrays of shape (etp, ep). ValueError for a bad shape or impl.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 3 or impl not in ("megatron", "torch"):
        raise ValueError("counts must be (etp, ep, E) and impl megatron or torch")
    etp, ep, n = counts.shape
    S, R, O = _rows(counts)
    row = hidden * act_bytes
    fwd = 2.0 if recompute else 1.0                        # forward collectives run again
    one = np.ones((etp, ep))
    a2a_calls, a2a_bytes = (fwd + 1) * 2 * one, (fwd + 1) * (R + S) * row
    out: dict[Key, tuple[np.ndarray, np.ndarray]] = {}
    if impl == "megatron":  # probs: dispatched forward, their gradient returned in backward
        a2a_calls = a2a_calls + (fwd + 1) * one
        a2a_bytes = a2a_bytes + fwd * R * probs_bytes + S * probs_bytes
    off = (fwd + 1) * (2 * O + R - S) * row
    out[("ep", "all_to_all")] = (a2a_calls * (ep > 1), a2a_bytes * (ep > 1))
    out[("ep", "all_to_all_offrank")] = (a2a_calls * (ep > 1), off * (ep > 1))
    if etp > 1:
        if impl == "torch":
            gathered = np.broadcast_to(etp * R.max(axis=0, keepdims=True), (etp, ep)) * row
            ag = rs = gathered
            rs_back = ag_back = gathered
        else:
            total = np.broadcast_to(R.sum(axis=0, keepdims=True), (etp, ep))
            ag, rs = total * (row + probs_bytes), total * hidden * probs_bytes
            rs_back, ag_back = total * row, total * hidden * probs_bytes
        out[("etp", "all_gather")] = ((fwd + 1) * one, fwd * ag + ag_back)
        out[("etp", "reduce_scatter")] = ((fwd + 1) * one, fwd * rs + rs_back)
    out[("tp_ep", "all_gather")] = (fwd * one * (etp * ep > 1), fwd * one * etp * ep * n * count_bytes
                                    * (etp * ep > 1))
    return out
