"""Which global ranks form each TP, CP, DP and PP group, and which node each rank is on.

Rank orders (first = fastest-varying):
  megatron            tp-cp-ep-dp-pp, Megatron-Core's default RankGenerator order (formulas.md
                      5.3): rank = i_tp + t*(i_cp + c*(i_dp + d*i_pp)). The cost model
                      (planner.cost.collectives.placement) assumes this order.
  megatron-tp-pp-dp   tp-cp-ep-pp-dp, Megatron with --use-tp-pp-dp-mapping (DP outermost, as
                      Llama 3 ran): rank = i_tp + t*(i_cp + c*(i_pp + p*i_dp)).
  torchtitan          torchtitan's ParallelDims device mesh [pp, dp_replicate, dp_shard, cp, tp]
                      (row-major, last = fastest; pytorch/torchtitan
                      torchtitan/distributed/parallel_dims.py @0119de156de5). DP = dp_replicate x
                      dp_shard, so with cp = 1 its TP, DP and PP groups equal Megatron's default.
Nodes: rank r runs on node r // G (G GPUs per node), as torchrun/SLURM number local ranks.
Everything is built with numpy reshapes of arange(N); no Python loop over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import UsageError
from .specs import Plan

ORDERS = ("megatron", "torchtitan", "megatron-tp-pp-dp")
ORDER_TEXT = {
    "megatron": "Megatron-Core default tp-cp-ep-dp-pp (TP fastest, then CP, DP, PP)",
    "megatron-tp-pp-dp": "Megatron --use-tp-pp-dp-mapping tp-cp-ep-pp-dp (TP fastest, then CP, PP, DP)",
    "torchtitan": "torchtitan ParallelDims mesh [pp, dp_replicate, dp_shard, cp, tp] (tp fastest)",
}


@dataclass
class Placement:
    """Groups of one layout. ``groups[dim]`` is an int array (number of groups, group size);
    ``node`` maps rank -> node index. Dims: tp, cp, dp, pp."""

    order: str
    gpus_per_node: int
    sizes: dict[str, int]
    groups: dict[str, np.ndarray]
    node: np.ndarray

    def span(self, dim: str) -> tuple[np.ndarray, np.ndarray]:
        """Per group of ``dim``: (largest number of its ranks on one node, number of nodes it spans)."""
        nodes = self.node[self.groups[dim]]  # (n_groups, size)
        offset = nodes - nodes.min(axis=1, keepdims=True)
        counts = np.zeros((nodes.shape[0], int(offset.max()) + 1), dtype=np.int64)
        np.add.at(counts, (np.arange(nodes.shape[0])[:, None], offset), 1)
        per_node = counts.max(axis=1)
        distinct = np.count_nonzero(counts, axis=1)
        return per_node, distinct

    def crosses(self, dim: str) -> np.ndarray:
        """Boolean per group: does the group span more than one node?"""
        return self.span(dim)[1] > 1


def rank_grid(tp: int, cp: int, dp: int, pp: int, order: str) -> dict[str, np.ndarray]:
    """Groups of each dim as (n_groups, size) arrays of global ranks under ``order``."""
    n = tp * cp * dp * pp
    r = np.arange(n)
    if order in ("megatron", "torchtitan"):
        # axes slow -> fast: pp, dp, cp, tp (torchtitan: pp, dp_replicate*dp_shard, cp, tp)
        g = r.reshape(pp, dp, cp, tp)
        axes = {"pp": 0, "dp": 1, "cp": 2, "tp": 3}
    elif order == "megatron-tp-pp-dp":
        g = r.reshape(dp, pp, cp, tp)
        axes = {"dp": 0, "pp": 1, "cp": 2, "tp": 3}
    else:
        raise UsageError(f"unknown rank order {order!r}; choose one of {', '.join(ORDERS)}")
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    out = {}
    for dim, ax in axes.items():
        moved = np.moveaxis(g, ax, -1)
        out[dim] = moved.reshape(-1, sizes[dim])
    # the dense-gradient / optimizer-sharding group: the dp*cp ranks of one (tp, pp) coordinate
    out["dp_cp"] = np.moveaxis(g, (axes["dp"], axes["cp"]), (-2, -1)).reshape(-1, dp * cp)
    return out


def place(plan: Plan, order: str = "megatron") -> Placement:
    """The Placement of ``plan``'s layout (tp, cp, dp, pp)."""
    lay = plan.layout
    gpn = plan.hardware.gpus_per_node
    groups = rank_grid(lay.tp, lay.cp, lay.dp, lay.pp, order)
    node = np.arange(plan.gpus) // gpn
    return Placement(order, gpn, {"tp": lay.tp, "cp": lay.cp, "dp": lay.dp, "pp": lay.pp,
                                  "dp_cp": lay.grad_group}, groups, node)


def cost_model_check(plan: Plan, pl: Placement) -> dict[str, dict[str, object]]:
    """Compare the enumerated groups with where the cost model times them.

    The cost model (planner.cost.collectives.group_span, formulas.md 5.3) times a group of n
    ranks at stride s on NVLink domains of D GPUs as (ranks per domain, domains): TP (tp, 1),
    CP rings (cp, tp), the gradient group dp*cp at stride tp (key ``dp``), and pipeline p2p as
    crossing domains iff tp*cp*dp*pp > D (collectives.p2p_crosses). A group that straddles a
    domain boundary unequally is timed as a flat ring over the network, (1, n): that agrees when
    some enumerated group does straddle. Returns per dim the assumed and the enumerated values
    (for every group) and whether they agree.
    """
    from .cost.collectives import group_span, nvlink_domain, p2p_crosses
    lay = plan.layout
    domain = nvlink_domain(plan.hardware)
    dom = np.arange(plan.gpus) // domain
    result: dict[str, dict[str, object]] = {}
    checks = [("tp", "tp", lay.tp, 1), ("dp", "dp_cp", lay.grad_group, lay.tp)]
    if lay.cp > 1:
        checks.append(("cp", "cp", lay.cp, lay.tp))
    for key, dim, size, stride in checks:
        a_local, a_nodes = (int(x) for x in group_span(size, stride, domain))
        local, nodes = _span(dom[pl.groups[dim]])
        exact = bool(np.all(local == a_local) and np.all(nodes == a_nodes))
        flat = a_local == 1 and a_nodes == size > 1 and bool(np.any(nodes > 1))
        result[key] = {"assumed_ranks_per_node": a_local, "assumed_nodes": a_nodes,
                       "ranks_per_node": sorted({int(x) for x in local}),
                       "nodes": sorted({int(x) for x in nodes}), "agrees": exact or flat}
    pg = pl.groups["pp"]
    boundary_cross = dom[pg[:, 1:]] != dom[pg[:, :-1]] if lay.pp > 1 else np.zeros((1, 0), bool)
    any_cross = bool(boundary_cross.any())
    assumed_cross = lay.pp > 1 and bool(p2p_crosses(lay.stage_gpus, lay.pp, domain))
    result["pp"] = {"assumed_p2p_crosses_nodes": assumed_cross, "p2p_crosses_nodes": any_cross,
                    "crossing_boundaries": int(boundary_cross.sum()),
                    "boundaries": int(boundary_cross.size), "agrees": assumed_cross == any_cross}
    return result


def _span(domains: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (rows of ``domains``, the domain of each member): (fewest members on one of its
    domains, number of domains)."""
    offset = domains - domains.min(axis=1, keepdims=True)
    counts = np.zeros((domains.shape[0], int(offset.max()) + 1), dtype=np.int64)
    np.add.at(counts, (np.arange(domains.shape[0])[:, None], offset), 1)
    fewest = np.where(counts > 0, counts, counts.max() + 1).min(axis=1)
    return fewest, np.count_nonzero(counts, axis=1)


def _dims(pl: Placement) -> list[str]:
    """tp, dp, pp, and cp with the dp*cp gradient group only when cp is used (size > 1)."""
    return [d for d in ("tp", "cp", "dp", "dp_cp", "pp") if d not in ("cp", "dp_cp") or pl.sizes["cp"] > 1]


def summary(plan: Plan, order: str = "megatron", examples: int = 2) -> dict[str, object]:
    """Compact description: group counts, strides, example groups, node crossing, cost-model check."""
    pl = place(plan, order)
    dims = {}
    for dim in _dims(pl):
        g = pl.groups[dim]
        local, nodes = pl.span(dim)
        stride = int(g[0, 1] - g[0, 0]) if g.shape[1] > 1 else 0
        dims[dim] = {"size": pl.sizes[dim], "groups": int(g.shape[0]), "stride": stride,
                     "examples": [g[i].tolist() for i in range(min(examples, g.shape[0]))]
                     + ([g[-1].tolist()] if g.shape[0] > examples else []),
                     "ranks_per_node": int(local.min()), "nodes_per_group": int(nodes.max()),
                     "groups_crossing_nodes": int(np.count_nonzero(nodes > 1))}
    return {"order": order, "order_description": ORDER_TEXT[order], "gpus": plan.gpus,
            "gpus_per_node": pl.gpus_per_node, "nodes": -(-plan.gpus // pl.gpus_per_node),
            "dims": dims, "tp_crosses_node": bool(dims["tp"]["groups_crossing_nodes"]),
            "cost_model": cost_model_check(plan, pl),
            "exports_assume": "megatron (tp-cp-ep-dp-pp); torchtitan's and DeepSpeed's default "
                              "meshes give the same groups"}


def full(plan: Plan, order: str = "megatron") -> dict[str, object]:
    """Everything: the summary plus every group of every dim and the node of every rank."""
    pl = place(plan, order)
    data = summary(plan, order)
    data["groups"] = {dim: pl.groups[dim].tolist() for dim in _dims(pl)}
    data["node_of_rank"] = pl.node.tolist()
    return data

