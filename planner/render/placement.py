"""``plan3d placement``: the rank placement summary (planner.placement.summary) as text lines
(a fixed-width table that fits 80 columns, then example groups and the verdicts)."""

from __future__ import annotations

from .console import out

LABELS = {"dp_cp": "DP-CP"}
# column header and width of each table column after the group's name (6 wide)
COLUMNS = (("size", "size", 5), ("groups", "groups", 7), ("stride", "stride", 7),
           ("ranks_per_node", "ranks/node", 11), ("nodes_per_group", "nodes", 6),
           ("domains_per_group", "domains", 8), ("groups_crossing_nodes", "off node", 9),
           ("groups_crossing_domains", "off domain", 11))


def _short(group: list[int]) -> str:
    if len(group) <= 6:
        return "[" + ",".join(map(str, group)) + "]"
    return f"[{group[0]},{group[1]},...,{group[-1]}]"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _label(dim: str) -> str:
    return LABELS.get(dim, dim.upper())


def _table(dims: dict) -> list[str]:
    """Header and one row per dimension: ranks per group, groups, stride, the fewest ranks of a
    group on one node, the most nodes and NVLink domains a group spans, and how many groups
    leave a node / a domain."""
    lines = ["group " + "".join(f"{head:>{w}}" for _, head, w in COLUMNS)]
    for dim, d in dims.items():
        cells = "".join(f"{d.get(key, 0):>{w},}" for key, _, w in COLUMNS)
        lines.append(f"{_label(dim):<6}{cells}")
    return lines


def _ep_verdict(data: dict) -> list[str]:
    """Whether the EP groups leave the NVLink domain, and where the dispatch then runs."""
    ep, dom = data["dims"]["ep"], data["nvlink_domain"]
    head = f"EP groups leave the NVLink domain of {dom} GPUs:"
    if not data["ep_leaves_nvlink_domain"]:
        return [f"{head} no (dispatch and combine on NVLink)"]
    return [f"{head} YES", f"  {ep['groups_crossing_domains']:,} of {ep['groups']:,} groups span "
            f"up to {ep['domains_per_group']} domains: dispatch and combine cross the network"]


def placement_text(data: dict) -> str:
    """The summary as lines: nodes, NVLink domains and rank order; a table of the groups of
    every dimension; example groups; whether TP crosses a node and EP leaves the NVLink domain;
    the cost model's check."""
    dom = data.get("nvlink_domain", data["gpus_per_node"])
    gpn = data["gpus_per_node"]
    whole = data.get("nvlink_domain_hardware", dom)
    used = "" if whole == dom else (f" (of the {whole} GPUs an NVLink domain has: layouts use "
                                    "power-of-two blocks of hosts)")
    lines = [f"{data['gpus']:,} GPUs on {_plural(data['nodes'], 'node')} of {gpn}, NVLink "
             f"domains of {dom} GPUs{used}", f"rank r: node r // {gpn}, NVLink domain r // {dom}",
             f"rank order: {data['order_description']}"]
    if data.get("expert_order_description"):
        lines.append(f"expert ranks: {data['expert_order_description']}")
    lines += _table(data["dims"])
    lines.append("examples (first, second, last group):")
    for dim, d in data["dims"].items():
        lines.append(f"{_label(dim):<6}" + "; ".join(_short(g) for g in d["examples"]))
    lines.append("TP groups cross a node: " + ("YES" if data["tp_crosses_node"] else "no"))
    if data.get("ep_leaves_nvlink_domain") is not None:
        lines += _ep_verdict(data)
    cm = data["cost_model"]
    ok = all(v["agrees"] for v in cm.values())
    lines.append("cost model's placement assumption (formulas.md 5.3): " +
                 ("agrees" if ok else "DISAGREES: " + ", ".join(k for k, v in cm.items() if not v["agrees"])))
    lines.append(f"exports assume: {data['exports_assume']}")
    return "\n".join(lines)


def placement_report(data: dict) -> None:
    """Print ``placement_text`` (wrapped at spaces to the console's width)."""
    out.print(placement_text(data), markup=False)
