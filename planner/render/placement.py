"""``plan3d placement``: the rank placement summary (planner.placement.summary) as text lines."""

from __future__ import annotations

from .console import out


def _short(group: list[int]) -> str:
    if len(group) <= 6:
        return "[" + ",".join(map(str, group)) + "]"
    return f"[{group[0]},{group[1]},...,{group[-1]}]"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def placement_text(data: dict) -> str:
    """The summary as lines: the nodes and rank order; per dimension its groups, stride, ranks
    per node and node span, then how many groups cross nodes and examples; the cost model's
    check."""
    lines = [f"{data['gpus']:,} GPUs on {_plural(data['nodes'], 'node')} of {data['gpus_per_node']}; "
             f"rank r is on node r // {data['gpus_per_node']}",
             f"rank order: {data['order_description']}"]
    for dim, d in data["dims"].items():
        ex = "; ".join(_short(g) for g in d["examples"])
        crossing = d["groups_crossing_nodes"]
        lines.append(f"{dim.upper():>3}  {_plural(d['groups'], 'group')} of {d['size']}, stride "
                     f"{d['stride']}, {d['ranks_per_node']} rank(s)/node, spans "
                     f"{d['nodes_per_group']} node(s)")
        lines.append(f"     {_plural(crossing, 'group')} cross{'es' if crossing == 1 else ''} nodes; "
                     f"e.g. {ex}")
    lines.append("TP groups cross a node: " + ("YES" if data["tp_crosses_node"] else "no"))
    cm = data["cost_model"]
    ok = all(v["agrees"] for v in cm.values())
    lines.append("cost model's placement assumption (formulas.md 5.3): " +
                 ("agrees" if ok else "DISAGREES: " + ", ".join(k for k, v in cm.items() if not v["agrees"])))
    lines.append(f"exports assume: {data['exports_assume']}")
    return "\n".join(lines)


def placement_report(data: dict) -> None:
    """Print ``placement_text`` (wrapped at spaces to the console's width)."""
    out.print(placement_text(data), markup=False)
