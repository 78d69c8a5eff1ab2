"""One training step of a layout as a timeline (data; render.timeline draws it).

The cost model's per-op times of each stage (cost.step.evaluate with ``exact``: every schedule's
pipeline part simulated, each stage's F, I and W from its rank kind's terms, cost.schedules)
run through the schedule's op order with events (planner.schedule.simulate); after the last op
of the pipeline comes the step's once-per-step tail: the overlapped point-to-point fill and
drain, the gradient synchronisation (DP/ZeRO, the SP norm all-reduce) and the optimizer step
(T_sync: every rank waits for the slowest before the optimizer, schedule/simulate.py). So the
timeline spans the predicted step. Its activation memory holds deferred-W chunks at the
layout's gamma (memory.deferred_w_fraction). The search and ``estimate`` take 1F1B, interleaved 1F1B,
GPipe, looped BFS and interleaved zero bubble in closed form (cost.schedules), exact for equal
stages; where the stages are uneven the timeline's step can differ from theirs, and says by
how much (``fast_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .cost.memory import deferred_w_fraction
from .cost.schedule_sim import op_order
from .cost.step import evaluate
from .errors import UsageError
from .layout import Candidates, Layout
from .schedule import SimResult, simulate

MAX_OPS = 60_000  # ops of one step the timeline simulates with events (pure Python, ~20 us each)
# the schedules that split the backward into I and W: memory held for deferred W at gamma
SPLIT = ("interleaved-zero-bubble", "zbv", "dualpipev", "dualpipe")


@dataclass(frozen=True)
class StepTimeline:
    """One step of ``layout``: the simulated pipeline (``result``: events per rank, times in
    seconds), the predicted step (seconds; = result.t_sync + sum of ``tail``), ``tail``: the
    once-per-step seconds after the pipeline, {"sync": p2p fill + gradient sync + norm,
    "optimizer": the optimizer step}, and ``fast_step``: the step of the search's and
    estimate's evaluation (closed forms where they apply)."""

    layout: Layout
    result: SimResult
    step: float
    tail: dict[str, float]
    fast_step: float

    @property
    def schedule(self) -> str:
        return self.layout.pipeline_schedule


def step_ops(model, training, layout: Layout) -> int:
    """Ops of one step of ``layout``'s schedule: pp*vpp stages x m micro-batches x 2 (F and B)
    or 3 (F, I, W: the zero-bubble, V and DualPipe schedules split the backward). Int."""
    m = training.global_batch_size // (layout.dp * layout.micro_batch_size)
    return layout.pp * layout.vpp * m * (3 if layout.pipeline_schedule in SPLIT else 2)


def step_timeline(model, hw, training, layout: Layout, max_ops: int = MAX_OPS) -> StepTimeline:
    """The StepTimeline of ``layout`` (module docstring). UsageError (one line) where one step
    has more than ``max_ops`` ops (step_ops) or the schedule's generator refuses the layout."""
    ops = step_ops(model, training, layout)
    if ops > max_ops:
        m = training.global_batch_size // (layout.dp * layout.micro_batch_size)
        raise UsageError(f"one step of this plan is {ops:,} ops ({m:,} micro-batches on "
                         f"{layout.pp * layout.vpp} stages); the timeline draws at most "
                         f"{max_ops:,}: raise --max-ops, or plan a smaller batch to see the schedule")
    c = Candidates.from_layouts([layout])
    record: list = []
    exact = evaluate(model, hw, training, c, exact=True, record=record)
    fast = evaluate(model, hw, training, c, summary=True)
    if not record or not np.isfinite(exact.time["step"][0]):
        raise UsageError(f"the {layout.pipeline_schedule} schedule cannot run {layout.short()} "
                         "(its generator's constraints: plan3d search --pipeline-schedule ...)")
    name, p, v, m, F, I, W, _ = record[0]
    gamma = float(deferred_w_fraction(model, training, c)[0]) if name in SPLIT else 0.0
    result = simulate(op_order(name, p, int(m[0]), v), F[0], I=I[0], W=W[0], gamma=gamma)
    step, optimizer = float(exact.time["step"][0]), float(exact.time["optimizer"][0])
    sync = max(step - result.t_sync - optimizer, 0.0)
    return StepTimeline(layout, result, step, {"sync": sync, "optimizer": optimizer},
                        float(fast.time["step"][0]))
