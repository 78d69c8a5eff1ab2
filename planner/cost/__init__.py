"""The analytical cost model. Every function takes scalars from the specs and arrays of
candidates (shape (N,)) and returns arrays of shape (N,), in SI units (bytes, seconds, FLOPs).
"""

from .step import Estimate, evaluate, memory_total

__all__ = ["Estimate", "evaluate", "memory_total"]
