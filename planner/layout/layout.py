"""``Layout``: one parallel layout as a pydantic model, its fields built from the axes table."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Literal

from pydantic import Field, create_model, model_validator

from ..quantities import _Strict
from .axes import AXES, REQUIRED, Axis, short
from .degrees import LayoutDegrees


class _LayoutBase(LayoutDegrees, _Strict):
    """What every Layout checks and prints, whatever its axes."""

    @model_validator(mode="before")
    @classmethod
    def _implied(cls, data):
        """An axis not stated whose value the others imply (axes.Axis.implied) takes it."""
        if isinstance(data, dict):
            for axis in AXES:
                if axis.implied is not None and data.get(axis.name) is None:
                    fields = SimpleNamespace(**{a.name: data.get(a.name, a.default) for a in AXES})
                    try:
                        data = {**data, axis.name: axis.value(axis.implied(fields))}
                    except (TypeError, ValueError):  # the fields it reads are invalid: the
                        pass  # field validation says so
        return data

    @model_validator(mode="after")
    def _split_pairs(self):
        if self.recompute_num_layers and self.recompute != "full":
            raise ValueError("recompute_num_layers (the layers of each model chunk recomputed in "
                             f"full) needs recompute full, got recompute {self.recompute}")
        if (self.first_stage_layers == 0) != (self.last_stage_layers == 0):
            raise ValueError(
                "an uneven pipeline split needs both first_stage_layers and last_stage_layers "
                f"(got {self.first_stage_layers} and {self.last_stage_layers}; 0 and 0 = even)")
        return self

    def short(self) -> str:
        """One line: tp=8 cp=2 pp=16 (7+..+7 layers) dp=8 ep=8 zero=1 mbs=1 vpp=4 recompute=none sp
        (recompute=full:5: the first 5 layers of each model chunk recomputed; axes.short)."""
        return short(self)

    @property
    def split_label(self) -> str:
        """The uneven split's first and last stage layers: 7+..+7 (middle stages between), 32+29
        with two stages."""
        middle = "+" if self.pp == 2 else "+..+"
        return f"{self.first_stage_layers}{middle}{self.last_stage_layers}"

    @property
    def recompute_label(self) -> str:
        """The recompute mode, with the block method's layer count: none, selective, selective+,
        full (every layer) or full:N (the first N layers of each model chunk)."""
        return f"full:{self.recompute_num_layers}" if self.recompute_num_layers else self.recompute


def _field(axis: Axis) -> tuple:
    """(type, pydantic Field) of one axis."""
    kind = Literal[axis.choices] if axis.kind is str else axis.kind
    limits = {} if axis.kind is not int else {"ge": axis.minimum, "le": axis.maximum}
    limits = {k: v for k, v in limits.items() if v is not None}
    default = ... if axis.default is REQUIRED else axis.default
    return kind, Field(default=default, description=axis.help, **limits)


Layout = create_model("Layout", __base__=_LayoutBase, __module__=__name__,
                      **{axis.name: _field(axis) for axis in AXES})
Layout.__doc__ = """One parallel layout: a field per row of the axes table (layout.axes.AXES).

tp*cp*pp*dp = GPUs; ``vpp`` = virtual stages (model chunks) per PP rank. ``cp``: context-parallel
size (the sequence split over cp ranks, formulas.md 5.7). ``ep`` / ``etp``: expert-parallel and
expert-tensor-parallel sizes; the expert layers fold over a stage's tp*cp*dp GPUs as etp x ep x
edp (degrees.LayoutDegrees); 1 for dense models. ``distributed_optimizer``: Megatron's
--use-distributed-optimizer, an alternative to ZeRO (zero_stage 0): ZeRO-1 memory, gradient
reduce-scatter + parameter all-gather per step. ``first_stage_layers`` / ``last_stage_layers``:
an uneven pipeline split (Megatron's --decoder-first/last-pipeline-num-layers; the middle stages
share the rest equally; 0 = the even split L/pp). ``recompute_num_layers`` (recompute full only):
0 = every layer recomputed; N >= 1 = the first N layers of each model chunk recomputed, the rest
store their activations (--recompute-method block --recompute-num-layers N; formulas.md 3.3).
Activation offload: the activations of that many layers moved to host memory over the host link
during forward and back for backward (Megatron-Core --cpu-offloading-num-layers; formulas.md
3.3.2); 0 = none. Derived quantities (GPUs, gradient group, micro-batches, layers per rank, ...)
come from degrees.LayoutDegrees.
"""
