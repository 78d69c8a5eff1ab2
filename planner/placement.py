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
Expert groups (MoE plans): the expert layers fold each pipeline stage's tp*cp*dp GPUs as
etp x ep x edp (LayoutDegrees.edp). Megatron-Core builds a second RankGenerator for them with
tp = etp, cp = 1, ep, dp = edp in the same order string (NVIDIA/Megatron-LM @ d98e8a64ddf3
megatron/core/parallel_state.py L886-895; the first token varies fastest,
generate_masked_orthogonal_rank_groups L269):
  megatron            etp-ep-edp-pp: rank = i_etp + etp*(i_ep + ep*(i_edp + edp*i_pp));
  megatron-tp-pp-dp   etp-ep-pp-edp, which Megatron-Core allows with pp > 1 only when
                      edp = dp (L896-900; its PP groups must equal the dense ones, L904-907);
  torchtitan          the sparse mesh [pp, dp_replicate, efsdp, ep], ep fastest, no expert TP
                      (torchtitan 0.3, pytorch/torchtitan @0014ac2ca45a
                      torchtitan/distributed/parallel_dims.py L167-203): Megatron's groups with
                      etp = 1.
The cost model times the EP dispatch on ep ranks etp apart (etp*ep consecutive ranks for the
allgather dispatcher; cost.moe.ep_group), ETP on etp consecutive ranks and EDP on edp ranks
etp*ep apart (cost.comm): cost_model_check compares those with the enumerated groups.
Nodes: rank r runs on node r // G (G GPUs per node), as torchrun/SLURM number local ranks;
NVLink domains: rank r is in domain r // D (D = cost.collectives.nvlink_domain: 8 on DGX
H100/B200, 64 on a GB200 NVL72 rack).
Everything is built with numpy reshapes of arange(N); no Python loop over ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost.collectives import group_span, nvlink_domain, p2p_crosses
from .cost.moe import ep_group
from .errors import UsageError
from .frameworks.torchtitan_parallelism import expert_parallel
from .layout.groups import ORDERS, all_groups, size_stride
from .plan import Plan

ORDER_TEXT = {
    "megatron": "Megatron-Core default tp-cp-ep-dp-pp (TP fastest, then CP, DP, PP)",
    "megatron-tp-pp-dp": "Megatron --use-tp-pp-dp-mapping tp-cp-ep-pp-dp (TP fastest, DP last)",
    "torchtitan": "torchtitan mesh [pp, dp_replicate, dp_shard, cp, tp] (tp fastest)",
}


@dataclass
class Placement:
    """Groups of one layout. ``groups[dim]`` is an int array (number of groups, group size);
    ``node`` maps rank -> node index, ``domain`` rank -> NVLink domain index. Dims: tp, cp, dp,
    dp_cp, pp, and for MoE models ep, etp, edp and ep_etp (the etp*ep expert-model-parallel
    block, Megatron-Core's 'tp-ep' group)."""

    order: str
    gpus_per_node: int
    sizes: dict[str, int]
    groups: dict[str, np.ndarray]
    node: np.ndarray
    domain_size: int = 0
    domain: np.ndarray | None = None

    def span(self, dim: str, by_domain: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Per group of ``dim``: (largest number of its ranks on one node, number of nodes it
        spans); with ``by_domain`` the same over NVLink domains."""
        where = self.domain if by_domain else self.node
        nodes = where[self.groups[dim]]  # (n_groups, size)
        offset = nodes - nodes.min(axis=1, keepdims=True)
        counts = np.zeros((nodes.shape[0], int(offset.max()) + 1), dtype=np.int64)
        np.add.at(counts, (np.arange(nodes.shape[0])[:, None], offset), 1)
        per_node = counts.max(axis=1)
        distinct = np.count_nonzero(counts, axis=1)
        return per_node, distinct

    def crosses(self, dim: str) -> np.ndarray:
        """Boolean per group: does the group span more than one node?"""
        return self.span(dim)[1] > 1


def check_expert_order(plan: Plan, order: str) -> None:
    """UsageError where ``order``'s framework cannot place ``plan``'s expert mesh:
    --use-tp-pp-dp-mapping with pp > 1 and edp != dp (Megatron-Core parallel_state.py
    L896-900), torchtitan 0.3 with etp > 1 or ep not dividing its FSDP x CP x TP ranks
    (frameworks.torchtitan.expert_parallel, the export's rule)."""
    lay = plan.layout
    if order == "megatron-tp-pp-dp" and lay.pp > 1 and lay.edp != lay.dp:
        raise UsageError(f"Megatron-Core refuses --use-tp-pp-dp-mapping with pp > 1 unless the "
                         f"expert data-parallel size equals dp (etp*ep = tp*cp); the plan has "
                         f"edp={lay.edp} dp={lay.dp} (parallel_state.py L896-900)")
    if order == "torchtitan":
        expert_parallel(plan, "overrides", 1 if lay.sharding_stage == 0 else lay.dp)


def place(plan: Plan, order: str = "megatron") -> Placement:
    """The Placement of ``plan``'s layout (tp, cp, dp, pp; ep, etp, edp for MoE models) with
    nodes of the hardware's gpus_per_node and NVLink domains of collectives.nvlink_domain.
    UsageError for an unknown order or one that cannot place the expert mesh."""
    lay = plan.layout
    gpn = plan.hardware.gpus_per_node
    if order not in ORDERS:
        raise UsageError(f"unknown rank order {order!r}; choose one of {', '.join(ORDERS)}")
    moe = plan.model.moe is not None
    if moe:
        check_expert_order(plan, order)
    groups = all_groups(lay, order, experts=moe)
    sizes = {kind: int(size_stride(lay, kind, order)[0]) for kind in groups}
    node = np.arange(plan.gpus) // gpn
    domain = nvlink_domain(plan.hardware)
    return Placement(order, gpn, sizes, groups, node, domain, np.arange(plan.gpus) // domain)


def cost_model_check(plan: Plan, pl: Placement) -> dict[str, dict[str, object]]:
    """Compare the enumerated groups with where the cost model times them.

    The cost model (planner.cost.collectives.group_span, formulas.md 5.3) times a group of n
    ranks at stride s on NVLink domains of D GPUs as (ranks per domain, domains): TP (tp, 1),
    CP rings (cp, tp), the gradient group dp*cp at stride tp (key ``dp``), the expert dispatch
    on cost.moe.ep_group (ep ranks etp apart; the etp*ep block for the allgather dispatcher),
    ETP (etp, 1), EDP (edp, etp*ep), and pipeline p2p as crossing domains iff
    tp*cp*dp*pp > D (collectives.p2p_crosses). A group that straddles a domain boundary
    unequally is timed as a flat ring over the network, (1, n): that agrees when some
    enumerated group does straddle. Returns per dim the assumed and the enumerated values
    (for every group) and whether they agree.
    """
    lay = plan.layout
    checks = [("tp", "tp"), ("dp", "dp_cp")] + [("cp", "cp")] * (lay.cp > 1)
    if "ep" in pl.groups:
        checks.append(("ep", ep_group(plan.layout)))
        checks += [("etp", "etp")] * (lay.etp > 1) + [("edp", "edp")]
    result = {key: _check(pl, dim, *(int(x) for x in size_stride(lay, dim))) for key, dim in checks}
    dom = pl.domain
    pg = pl.groups["pp"]
    boundary_cross = dom[pg[:, 1:]] != dom[pg[:, :-1]] if lay.pp > 1 else np.zeros((1, 0), bool)
    any_cross = bool(boundary_cross.any())
    assumed_cross = lay.pp > 1 and bool(p2p_crosses(lay.stage_gpus, lay.pp, pl.domain_size))
    result["pp"] = {"assumed_p2p_crosses_nodes": assumed_cross, "p2p_crosses_nodes": any_cross,
                    "crossing_boundaries": int(boundary_cross.sum()),
                    "boundaries": int(boundary_cross.size), "agrees": assumed_cross == any_cross}
    return result


def _check(pl: Placement, dim: str, size: int, stride: int) -> dict[str, object]:
    """The cost model's (ranks per domain, domains) of a group of ``size`` ranks ``stride``
    apart against the enumerated groups of ``dim``."""
    a_local, a_nodes = (int(x) for x in group_span(size, stride, pl.domain_size))
    local, nodes = _span(pl.domain[pl.groups[dim]])
    exact = bool(np.all(local == a_local) and np.all(nodes == a_nodes))
    flat = a_local == 1 and a_nodes == size > 1 and bool(np.any(nodes > 1))
    return {"assumed_ranks_per_node": a_local, "assumed_nodes": a_nodes,
            "ranks_per_node": sorted({int(x) for x in local}),
            "nodes": sorted({int(x) for x in nodes}), "agrees": exact or flat}


def _span(domains: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (rows of ``domains``, the domain of each member): (fewest members on one of its
    domains, number of domains)."""
    offset = domains - domains.min(axis=1, keepdims=True)
    counts = np.zeros((domains.shape[0], int(offset.max()) + 1), dtype=np.int64)
    np.add.at(counts, (np.arange(domains.shape[0])[:, None], offset), 1)
    fewest = np.where(counts > 0, counts, counts.max() + 1).min(axis=1)
    return fewest, np.count_nonzero(counts, axis=1)


EXPERT_ORDER_TEXT = {
    "megatron": "Megatron-Core etp-ep-edp-pp (ETP fastest, then EP, EDP, PP)",
    "megatron-tp-pp-dp": "Megatron-Core etp-ep-pp-edp (ETP fastest, then EP, PP, EDP)",
    "torchtitan": "torchtitan sparse mesh [pp, dp_replicate, efsdp, ep] (ep fastest; no ETP)",
}


def _dims(pl: Placement) -> list[str]:
    """tp, cp and the dp*cp gradient group (only when cp > 1), dp, pp; for MoE plans ep, etp
    (only when etp > 1) and edp."""
    dense = [d for d in ("tp", "cp", "dp", "dp_cp", "pp") if d not in ("cp", "dp_cp") or pl.sizes["cp"] > 1]
    if "ep" not in pl.groups:
        return dense
    return dense + [d for d in ("ep", "etp", "edp") if d != "etp" or pl.sizes["etp"] > 1]


def _dim_summary(pl: Placement, dim: str, examples: int) -> dict[str, object]:
    """One dim's group count, stride, examples and its spread over nodes and NVLink domains."""
    g = pl.groups[dim]
    local, nodes = pl.span(dim)
    dlocal, domains = pl.span(dim, by_domain=True)
    stride = int(g[0, 1] - g[0, 0]) if g.shape[1] > 1 else 0
    return {"size": pl.sizes[dim], "groups": int(g.shape[0]), "stride": stride,
            "examples": [g[i].tolist() for i in range(min(examples, g.shape[0]))]
            + ([g[-1].tolist()] if g.shape[0] > examples else []),
            "ranks_per_node": int(local.min()), "nodes_per_group": int(nodes.max()),
            "groups_crossing_nodes": int(np.count_nonzero(nodes > 1)),
            "ranks_per_domain": int(dlocal.min()), "domains_per_group": int(domains.max()),
            "groups_crossing_domains": int(np.count_nonzero(domains > 1))}


def summary(plan: Plan, order: str = "megatron", examples: int = 2) -> dict[str, object]:
    """Compact description: group counts, strides, example groups, node and NVLink-domain
    crossing (``nvlink_domain``: the GPUs of a domain as layouts use them, a power-of-two block
    of hosts, collectives.nvlink_domain; ``nvlink_domain_hardware``: the profile's whole
    domain), the cost-model check; for MoE plans the expert groups and
    ``ep_leaves_nvlink_domain`` (some EP group spans more than one domain; None without
    experts)."""
    pl = place(plan, order)
    dims = {dim: _dim_summary(pl, dim, examples) for dim in _dims(pl)}
    moe = "ep" in dims
    return {"order": order, "order_description": ORDER_TEXT[order],
            "expert_order_description": EXPERT_ORDER_TEXT[order] if moe else None,
            "gpus": plan.gpus, "gpus_per_node": pl.gpus_per_node,
            "nodes": -(-plan.gpus // pl.gpus_per_node), "nvlink_domain": pl.domain_size,
            "nvlink_domain_hardware": int(plan.hardware.nvlink_domain or pl.gpus_per_node),
            "nvlink_domains": -(-plan.gpus // pl.domain_size),
            "dims": dims, "tp_crosses_node": bool(dims["tp"]["groups_crossing_nodes"]),
            "ep_leaves_nvlink_domain": bool(dims["ep"]["groups_crossing_domains"]) if moe else None,
            "moe_dispatcher": plan.layout.moe_dispatcher if moe else None,
            "cost_model": cost_model_check(plan, pl),
            "exports_assume": "megatron (tp-cp-ep-dp-pp); torchtitan, DeepSpeed: same groups"}


def full(plan: Plan, order: str = "megatron") -> dict[str, object]:
    """Everything: the summary plus every group of every dim, the node and the NVLink domain
    of every rank."""
    pl = place(plan, order)
    data = summary(plan, order)
    data["groups"] = {dim: pl.groups[dim].tolist() for dim in _dims(pl)}
    data["node_of_rank"] = pl.node.tolist()
    data["nvlink_domain_of_rank"] = pl.domain.tolist()
    return data
