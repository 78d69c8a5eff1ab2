"""``Candidates``: N layouts as one struct of numpy arrays, a field per row of the axes table.

Every field is an int64 (or bool) array of the same length N, or broadcast-shaped over a search
grid (search.grid); the cost model evaluates all N at once. A choice axis (recompute) holds its
code (axes.Axis.code: 0 none, 1 selective, 2 full, 3 selective+). A field not given takes the
axis's default (cp, ep, etp 1; the even split; no offload; ...), or the value the other fields
imply (axes.Axis.implied: the pipeline schedule from vpp), as does a field given as IMPLIED.
"""

from __future__ import annotations

from dataclasses import field, fields, make_dataclass

import numpy as np

from .axes import AXES, BY_NAME, IMPLIED, REQUIRED
from .degrees import LayoutDegrees
from .layout import Layout


def _post_init(self) -> None:
    shape = np.shape(self.tp)
    for axis in AXES:
        given = getattr(self, axis.name)
        if given is not None and axis.implied is not None and np.any(np.asarray(given) == IMPLIED):
            object.__setattr__(self, axis.name, np.where(np.asarray(given) == IMPLIED,
                                                         axis.implied(self), given))
        elif given is None and axis.implied is not None:
            object.__setattr__(self, axis.name, np.broadcast_to(
                axis.implied(self), np.broadcast_shapes(shape, np.shape(axis.implied(self)))).copy())
        elif getattr(self, axis.name) is None:
            if axis.array_default is REQUIRED:
                raise TypeError(f"Candidates needs {axis.name}")
            dtype = bool if axis.kind is bool else np.int64
            object.__setattr__(self, axis.name, np.full(shape, axis.array_default, dtype=dtype))
    object.__setattr__(self, "memo", {})  # degrees.cached_per_candidates: terms computed once


def _len(self) -> int:
    return int(self.tp.shape[0])


def _take(self, index: np.ndarray) -> "Candidates":
    """The candidates selected by a boolean mask or an index array."""
    return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def _replace(self, **values: np.ndarray) -> "Candidates":
    """These candidates with some fields replaced (a new memo)."""
    return Candidates(**{f.name: values.get(f.name, getattr(self, f.name)) for f in fields(self)})


def _layout(self, i: int) -> Layout:
    """Candidate i as a Layout."""
    return Layout(**{f.name: BY_NAME[f.name].value(getattr(self, f.name)[i]) for f in fields(self)})


@classmethod
def _from_layouts(cls, layouts: list) -> "Candidates":
    """Arrays of length len(layouts), one entry per layout."""
    def col(axis):
        dtype = bool if axis.kind is bool else np.int64
        return np.array([axis.code(getattr(x, axis.name)) for x in layouts], dtype=dtype)
    return cls(**{axis.name: col(axis) for axis in AXES})


Candidates = make_dataclass(
    "Candidates", [(axis.name, np.ndarray, field(default=None)) for axis in AXES],
    bases=(LayoutDegrees,), frozen=True,
    namespace={"__post_init__": _post_init, "__len__": _len, "take": _take, "replace": _replace,
               "layout": _layout, "from_layouts": _from_layouts})
Candidates.__module__ = __name__
Candidates.__doc__ = """N layouts: arrays of shape (N,) (or broadcast-shaped, search.grid), a field
per axis (layout.axes.AXES); a choice axis holds codes (recompute: 0 none, 1 selective, 2 full,
3 selective+). Fields not given take the axis default: cp, ep, etp 1, the distributed optimizer
off, first/last_stage_layers 0 (the even split), recompute_num_layers 0 (with full recompute:
every layer), no activation offload. Derived quantities come from degrees.LayoutDegrees."""
