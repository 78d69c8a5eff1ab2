"""Pipeline-schedule simulator: op orders of the pipeline schedules (GPipe, 1F1B, interleaved
1F1B, looped BFS, ZB-H1/H2, interleaved zero bubble, ZB-V, DualPipe, DualPipeV, Megatron's
combined 1F1B), an event simulator of their step time, bubble and per-rank activation memory
(single case with events, or K time vectors at once), and the closed forms where they are
exact (reference/pipeline_schedules.md). A leaf package: numpy and the standard library only.
"""

from . import closed_forms
from .orders import SCHEDULES, Op, Schedule, build_schedule, group_table, split_pairs
from .simulate import (BatchResult, Event, SimResult, Transfer, memory_curve, simulate,
                       simulate_batch)

__all__ = ["SCHEDULES", "Op", "Schedule", "build_schedule", "group_table", "split_pairs",
           "Event", "Transfer", "SimResult", "BatchResult", "simulate", "simulate_batch",
           "memory_curve", "closed_forms"]
