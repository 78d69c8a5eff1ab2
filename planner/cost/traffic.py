"""What the volumes list is made of: the element sizes a layout moves (``Elements``) and one
kind of collective call of one GPU (``Collective``: group, kind, when, what may hide it, calls
and bytes per call). cost.volumes lists them, cost.comm times them, the validator counts them."""

from __future__ import annotations

from dataclasses import dataclass

from ..specs import TrainingSpec
from . import precision


@dataclass(frozen=True)
class Elements:
    """Element sizes in bytes: activations and p2p messages, gathered weights, reduced gradients,
    and the SP all-gathers of linear inputs and output gradients (``gather``; None: ``act``)."""

    act: float = 2.0
    weight: float = 2.0
    grad: float = 4.0
    gather: float | None = None

    @classmethod
    def of(cls, training: TrainingSpec) -> "Elements":
        """bf16 activations, the training's gradient bytes (fp32 main grads: 4); weights and SP
        gathers as the precision moves them (precision.param_gather_bytes, gather_bytes: FP8
        where Transformer Engine quantizes before the gather)."""
        return cls(grad=float(training.grad_bytes), weight=precision.param_gather_bytes(training),
                   gather=precision.gather_bytes(training))

    @property
    def gathered(self) -> float:
        """Bytes per element of an SP all-gather of a linear input or output gradient."""
        return self.act if self.gather is None else self.gather


@dataclass(frozen=True)
class Collective:
    """One kind of collective call of one GPU (see the module docstring).

    ``per``: layer (per block of kind ``block`` per micro-batch) | microbatch | step. ``phase``: forward |
    backward | recompute | step. ``overlap``: what may hide it: "" (nothing: exposed), "wgrad"
    (the TP backward window of the weight-gradient and input-gradient GEMMs), "attention" (the
    attention of the block in hand), "forward"/"backward" (the stage's compute of that phase:
    DP/ZeRO with overlap_grad_reduce), "schedule" (pipeline p2p, timed by the schedule).
    ``calls``: per unit, ``payload``: bytes per call; arrays broadcast over candidates."""

    group: str
    kind: str
    per: str
    phase: str
    overlap: str
    calls: object
    payload: object
    what: str
    block: str = ""  # per == "layer": the block kind it belongs to (blocks.block_kinds)
