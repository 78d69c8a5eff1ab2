"""The options the planning commands share, declared once and generated from tables.

- The layout axes (layout.axes.AXES): ``search`` pins each (``--tp 8``) and bounds some
  (``--max-tp``); ``estimate`` states each, taking the value a layout given by hand defaults to.
- The job (JOB): the training framework and its single facts, the precision, the MoE job
  settings, checkpoints and failures; on search, sweep and estimate.

``with_options(...)`` adds the options to a typer command's signature and hands the command
their values as dicts (``axes``, ``bounds``, ``job``), so a command declares only its own.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional

import typer

from ..layout.axes import AXES, REQUIRED, Axis

PrecisionChoice = Enum("PrecisionChoice", {"bf16": "bf16", "fp8": "fp8",
                                           "fp8_blockwise": "fp8-blockwise", "mxfp8": "mxfp8"}, type=str)


def _choice(axis: Axis) -> type:
    """A typer choice type of a str axis's values."""
    return Enum(f"{axis.name.title()}Choice", {c.replace("+", "_plus"): c for c in axis.choices}, type=str)


_CHOICES = {a.name: _choice(a) for a in AXES if a.kind is str}


def _type(axis: Axis) -> Any:
    return Optional[_CHOICES.get(axis.name, axis.kind)]


# A choice axis whose values would not fit beside the option name at 80 columns is shown as
# NAME, its values in the help instead
_LONG_CHOICES = 40


def _metavar(axis: Axis) -> str | None:
    return "NAME" if len("|".join(axis.choices)) > _LONG_CHOICES else None


def axis_help(axis: Axis, mode: str) -> str:
    """An axis option's help: search pins it ("Pin tensor-parallel size."; a solved axis is the
    least N that fits unless pinned), estimate states it ("Tensor-parallel size [default: 1]."); a
    choice shown as NAME lists its values."""
    text = axis.help[0].upper() + axis.help[1:]
    names = f" NAME: {axis.words}." if _metavar(axis) else ""
    if mode == "search":
        free = " [default: the least N that fits where a layout needs it; 0 = never]" \
            if axis.role == "solved" else ""
        if axis.offered is not None:
            free = " [default: any the framework runs]"
        return f"Pin {axis.help}{free}.{names}"
    return f"{text} [default: {axis.stated_words}].{names}"


def axis_params(mode: str) -> list[inspect.Parameter]:
    """The typer parameters of the layout axes for ``mode`` (search | estimate), and with search
    the axis bounds (--max-tp ...)."""
    params = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, annotation=_type(a),
                                default=typer.Option(None, a.flag, help=axis_help(a, mode),
                                                     metavar=_metavar(a)))
              for a in AXES if a.flag]
    if mode == "search":
        for a in AXES:
            if a.bound:
                default = "" if a.bound_default is None else \
                    f" [default: {a.bound_default}, or the {a.flag} pin]"
                params.append(inspect.Parameter(
                    a.bound, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int],
                    default=typer.Option(None, "--" + a.bound.replace("_", "-"),
                                         help=f"Upper bound on {a.keys[0]}{default}.")))
    return params


@dataclass(frozen=True)
class JobOption:
    """One option of the job: its name (the command receives it in ``job``), flag, type, help."""

    name: str
    flag: str
    kind: Any
    help: str


JOB = (
    JobOption("framework", "--framework", Optional[str], "Framework profile name or YAML file "
              "(plan3d frameworks) [default: megatron-core]."),
    JobOption("flash_attention", "--flash-attention/--no-flash-attention", Optional[bool],
              "Override the framework's flash attention."),
    JobOption("grad_dtype", "--grad-dtype", Optional[str],
              "Gradient dtype: fp32 or bf16 (default: the framework's)."),
    JobOption("allocator_reserve", "--allocator-reserve", Optional[float], "Allocator reserve as a "
              "fraction of the working set, e.g. 0.1 (default: the framework's)."),
    JobOption("precision", "--precision", Optional[PrecisionChoice], "Linear layers in bf16, fp8 "
              "(per-tensor scaling), fp8-blockwise (1x128/128x128 blocks) or mxfp8 (Blackwell) "
              "[default: bf16]."),
    JobOption("moe_capacity_factor", "--moe-capacity-factor", Optional[float], "MoE token "
              "dropping: each expert takes at most F x its balanced share of rows, padded to it "
              "(Megatron-Core --moe-expert-capacity-factor with --moe-pad-expert-input-to-"
              "capacity) [default: dropless]."),
    JobOption("failure_rate", "--failure-rate", Optional[float], "Unexpected interruptions per "
              "GPU-hour [default: Llama 3's 1.97e-5: 419 in 54 days on 16,384 H100]."),
    JobOption("restart_time", "--restart-time", Optional[str], "From a failure to training "
              "again, before the checkpoint is read: '10min' [default: 10min]."),
    JobOption("async_save", "--async-save/--sync-save", Optional[bool], "Checkpoints copied to "
              "host memory and written in the background, or stalling for the whole write "
              "[default: async]."),
)


def job_params() -> list[inspect.Parameter]:
    """The typer parameters of JOB."""
    return [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, annotation=o.kind,
                              default=typer.Option(None, o.flag, help=o.help)) for o in JOB]


def with_options(axes: str | None = None, job: bool = True) -> Callable:
    """Decorator: the command gains the layout-axis options of mode ``axes`` (search |
    estimate; None: none) and the JOB options; it receives their values as the keyword
    arguments ``axes`` (axis name -> value, None = not given; with search also the bounds
    under their names), and ``job`` (JOB name -> value)."""
    extra = (axis_params(axes) if axes else []) + (job_params() if job else [])
    names = {p.name: ("job" if any(o.name == p.name for o in JOB) else "axes") for p in extra}

    def decorate(func: Callable) -> Callable:
        own = [p for p in inspect.signature(func).parameters.values() if p.name not in ("axes", "job")]

        @functools.wraps(func)
        def wrapper(**kwargs):
            groups: dict[str, dict] = {"axes": {}, "job": {}}
            for name, group in names.items():
                groups[group][name] = _plain(kwargs.pop(name, None))
            given = {g: v for g, v in groups.items() if g in ("axes", "job") and
                     (g == "job" and job or g == "axes" and axes)}
            return func(**kwargs, **given)

        wrapper.__signature__ = inspect.Signature(own + extra)
        wrapper.__annotations__ = {**{p.name: p.annotation for p in own}, **{p.name: p.annotation for p in extra}}
        return wrapper
    return decorate


def _plain(value: Any) -> Any:
    """An enum choice as its value; anything else as it is."""
    return value.value if isinstance(value, Enum) else value


def stated_default(axis: Axis) -> Any:
    """What a layout given by hand takes for ``axis`` when not stated: its Layout default, else
    its ``stated`` value (None: derived, e.g. dp from the GPUs, or the value the other axes
    imply, e.g. the pipeline schedule from vpp: the Layout fills it)."""
    if axis.implied is not None:
        return None
    return axis.stated if axis.default is REQUIRED else axis.default
