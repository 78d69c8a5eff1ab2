"""The memory reserve's NCCL communicators (formulas.md 3.10): with an expert mesh a rank also
joins Megatron-Core's EP group, the expert-data-parallel group and the expert-TP group where it
is not the TP group (megatron/core/parallel_state.py @d98e8a64ddf3), each a communicator of
600 MiB (NVIDIA/nccl#964). Counts derived by hand."""

from __future__ import annotations

import numpy as np
import pytest

from planner.layout import Candidates, Layout


def count(**layout) -> int:
    base = dict(tp=1, pp=1, cp=1, zero_stage=1, micro_batch_size=1)
    return int(Candidates.from_layouts([Layout(**{**base, **layout})]).communicators[0])


@pytest.mark.parametrize("layout, expected", [
    # Megatron-LM #6429's DeepSeek-V3 at 14 layers on 64 H100: PP (pp 4), the gradient group
    # dp*cp = 16, the model-parallel group tp*pp = 4, EP (ep 16); edp = 1*1*16/(1*16) = 1: 4
    (dict(pp=4, dp=16, ep=16), 4),
    # tp 2, dp 8, ep 4 on 16 GPUs: TP, dp*cp 8, tp*pp 2, EP, EDP (2*8/4 = 4 > 1); etp 1: 5
    (dict(tp=2, dp=8, ep=4, sequence_parallel=True), 5),
    # expert TP equal to TP (etp = tp = 2) shares the TP group; etp 2 at tp 1 is a group of its own
    (dict(tp=2, dp=8, ep=4, etp=2, sequence_parallel=True), 5),
    (dict(tp=1, dp=16, ep=4, etp=2), 1 + 1 + 1 + 1),  # dp*cp, EP, EDP (16/8 = 2), ETP
    # a dense layout is counted as before: TP, dp*cp, tp*pp
    (dict(tp=2, dp=4), 3),
])
def test_communicators_of_the_expert_mesh(layout, expected):
    assert count(**layout) == expected


def test_reserve_of_the_deepseek_v3_row():
    # reserve = runtime 1 GiB + 4 x 600 MiB + 0.2 x (activations + buffers): the EP group adds
    # 600 MiB to what the reserve counted (3 communicators) for the measured row of #6429
    from planner import catalog
    from planner.cost.estimate import reserve_bytes
    from planner.specs import TrainingSpec
    c = Candidates.from_layouts([Layout(tp=1, pp=4, dp=16, ep=16, zero_stage=0,
                                        distributed_optimizer=True, micro_batch_size=1)])
    tr = TrainingSpec(seq_length=2048, global_batch_size=256)
    got = reserve_bytes(catalog.resolve_hardware("dgx-h100"), tr, c, np.asarray([2.0**30]))
    assert float(got[0]) == pytest.approx(2.0**30 + 4 * 600 * 2.0**20 + 0.2 * 2.0**30)
