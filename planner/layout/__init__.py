"""The parallel layout: its axes (one table), one layout (``Layout``) and N (``Candidates``),
what follows from its degrees, the pipeline split's geometry and the rank order of its process
groups. The one owner of the layout, below the cost model and the search: both import it,
it imports neither.
"""

from .axes import AXES, BY_NAME, RECOMPUTE_CODES, RECOMPUTE_NAMES, Axis
from .candidates import Candidates
from .degrees import LayoutDegrees, cached_per_candidates, split_problem
from .layout import Layout

__all__ = ["AXES", "BY_NAME", "RECOMPUTE_CODES", "RECOMPUTE_NAMES", "Axis", "Candidates",
           "Layout", "LayoutDegrees", "cached_per_candidates", "split_problem"]
