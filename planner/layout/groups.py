"""The rank order, written once: which global ranks form each process group of a layout.

Megatron-Core numbers ranks with a RankGenerator per mesh, the first token of its order varying
fastest (NVIDIA/Megatron-LM @ d98e8a64ddf3 megatron/core/parallel_state.py,
generate_masked_orthogonal_rank_groups L269; formulas.md 5.3):

- dense: tp-cp-ep-dp-pp (with parallel folding the dense generator has ep = 1):
  rank = i_tp + tp*(i_cp + cp*(i_dp + dp*i_pp));
- expert: etp-ep-edp-pp (a second generator with tp = etp, cp = 1, dp = edp, L886-895): the
  expert layers fold each pipeline stage's tp*cp*dp GPUs as etp x ep x edp.

Other orders plan3d places (planner.placement): Megatron's --use-tp-pp-dp-mapping
(tp-cp-ep-pp-dp; expert etp-ep-pp-edp) and torchtitan's device mesh [pp, dp_replicate,
dp_shard, cp, tp] (the same groups as Megatron's default for these layouts; its sparse mesh
[pp, dp_replicate, efsdp, ep] is the expert order with etp = 1).

A group kind is a run of consecutive dims of an order: its size is their product and its
stride the product of the faster dims, so (size, stride) works on one layout (ints) and on N
(numpy arrays) alike. The cost model times collectives on these (cost.collectives.group_span),
placement enumerates them, the validator builds its process groups from them.
"""

from __future__ import annotations

import math

import numpy as np

ORDERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # name: (dense order, expert order), fastest first
    "megatron": (("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")),
    "torchtitan": (("tp", "cp", "dp", "pp"), ("etp", "ep", "edp", "pp")),
    "megatron-tp-pp-dp": (("tp", "cp", "pp", "dp"), ("etp", "ep", "pp", "edp")),
}
# group kind -> (mesh: 0 dense, 1 expert; its dims, consecutive in the order)
KINDS: dict[str, tuple[int, tuple[str, ...]]] = {
    "tp": (0, ("tp",)), "cp": (0, ("cp",)), "dp": (0, ("dp",)), "pp": (0, ("pp",)),
    # the dense-gradient and optimizer-sharding group: the dp*cp ranks of one (tp, pp) rank
    # (Megatron-Core ``intra_dp_cp`` group, formulas.md 5.7)
    "dp_cp": (0, ("cp", "dp")),
    "etp": (1, ("etp",)), "ep": (1, ("ep",)), "edp": (1, ("edp",)),
    # the etp*ep expert-model-parallel block (Megatron-Core's 'tp-ep' group)
    "ep_etp": (1, ("etp", "ep")),
}


def degrees(c) -> dict[str, object]:
    """The sizes of every dim of ``c`` (a Layout or Candidates): tp, cp, dp, pp, etp, ep, edp."""
    return {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp, "etp": c.etp, "ep": c.ep, "edp": c.edp}


def size_stride(c, kind: str, order: str = "megatron") -> tuple:
    """(size, stride) of group ``kind`` (KINDS, or ``embd``: the first and last pipeline stages'
    ranks that sum the tied embedding's gradients, (pp-1)*tp*cp*dp apart) of ``c`` under
    ``order``: ints for a Layout, arrays for Candidates. TP (tp, 1), CP (cp, tp), the gradient
    group (dp*cp, tp), PP (pp, tp*cp*dp), EP (ep, etp), EDP (edp, etp*ep)."""
    if kind == "embd":
        return 2, (np.asarray(c.pp) - 1) * c.stage_gpus
    mesh, dims = KINDS[kind]
    order_dims = ORDERS[order][mesh]
    sizes = degrees(c)
    first = order_dims.index(dims[0])
    stride = math.prod([sizes[d] for d in order_dims[:first]], start=1)
    size = math.prod([sizes[d] for d in dims], start=1)
    return size, stride


def ranks(sizes: dict[str, int], order: tuple[str, ...], dims: tuple[str, ...]) -> np.ndarray:
    """The groups of ``dims`` (consecutive or not in ``order``) as an (n_groups, group size) int
    array of global ranks, for one layout of ``sizes`` (every dim of ``order``): ranks are
    arange(N) reshaped slow -> fast and the group's axes moved last."""
    shape = [sizes[d] for d in reversed(order)]
    grid = np.arange(math.prod(shape)).reshape(shape)
    axes = [len(order) - 1 - order.index(d) for d in reversed(dims)]
    moved = np.moveaxis(grid, axes, list(range(-len(axes), 0)))
    return moved.reshape(-1, math.prod([sizes[d] for d in dims]))


def all_groups(c, order: str = "megatron", experts: bool = False) -> dict[str, np.ndarray]:
    """Every group kind of one layout ``c`` under ``order`` as (n_groups, size) rank arrays:
    tp, cp, dp, dp_cp, pp, and with ``experts`` etp, ep, edp, ep_etp."""
    sizes = {k: int(v) for k, v in degrees(c).items()}
    out = {}
    for kind, (mesh, dims) in KINDS.items():
        if mesh == 0 or experts:
            out[kind] = ranks(sizes, ORDERS[order][mesh], dims)
    return out
