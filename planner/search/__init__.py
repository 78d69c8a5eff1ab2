"""The search: every layout of the axes (planner.layout) that the rules admit and that fits,
ranked by the cost model (planner.cost).

- ``options``: pins and bounds of the axes, the objective, the GPU count or budget;
- ``rules`` and ``framework_rules``: the named, vectorized masks of what may run;
- ``grid``: the space as a broadcast grid (parallel splits x knob axes);
- ``scan`` and ``least_layers``: rules, memory and step time on sub-grids, the least
  recompute/offload layers that fit;
- ``run``: the search itself; ``check``: one layout given by hand;
- ``refusal`` and ``whynot``: why nothing (or a given layout) runs, on the scan's passes;
- ``objective`` and ``sweep``: what is ranked, and a search per GPU count.
"""

from .options import SearchOptions
from .run import SearchResult, search

__all__ = ["SearchOptions", "SearchResult", "search"]
