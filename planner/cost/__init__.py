"""The analytical cost model. Every function takes scalars from the specs and arrays of
candidates (shape (N,), or broadcast over a search grid) and returns arrays of that shape, in SI
units (bytes, seconds, FLOPs).
"""

from .estimate import Estimate, memory_total
from .step import evaluate

__all__ = ["Estimate", "evaluate", "memory_total"]
