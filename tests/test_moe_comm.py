"""Expert-parallel communication of an MoE block: which collectives the busiest rank's extra
load (training.moe_imbalance) lengthens (moe.md 4.2)."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog import models, resolve_hardware
from planner.cost import compute
from planner.cost.collectives import Links
from planner.cost.comm import block_comm
from planner.cost.traffic import Elements
from planner.layout import Candidates
from planner.layout import Layout
from planner.specs import TrainingSpec


def _ep_link(ep: int, etp: int, gamma: float, dispatcher: str = "alltoall") -> float:
    m = models()["qwen3-30b-a3b"]
    hw = resolve_hardware("dgx-h100")
    t = TrainingSpec(seq_length=4096, global_batch_size=64, moe_imbalance=gamma)
    c = Candidates.from_layouts([Layout(tp=2, pp=1, dp=4, ep=ep, etp=etp, zero_stage=1,
                                        micro_batch_size=1, sequence_parallel=True,
                                        moe_dispatcher=dispatcher)])
    times = compute.block_times(m, t, hw, c)
    comm = block_comm(m, t, c, Links.of(hw), times, Elements.of(t))["moe"]
    return float(np.asarray(comm.ep_link).ravel()[0])


@pytest.mark.parametrize("ep, etp", [(1, 2), (4, 1), (4, 2)])
def test_the_busiest_rank_lengthens_dispatch_and_expert_tp_collectives(ep, etp):
    # Every collective of the alltoall dispatcher carries routed rows: the all-to-alls, and the
    # expert-TP all-gather / reduce-scatter of the rows each rank received. With 1.3x the
    # balanced rows on the busiest rank, each takes 1.3x (bandwidth terms; the payloads here are
    # tens of MB, so latency is under 0.1 % of them). ep 1, etp 2 has only expert-TP collectives:
    # they were priced at the balanced load.
    assert _ep_link(ep, etp, 1.3) / _ep_link(ep, etp, 1.0) == pytest.approx(1.3, rel=2e-3)


def test_the_allgather_dispatcher_moves_every_token_balanced():
    # the allgather dispatcher gathers all T tokens over etp x ep whatever the routing: no 1.3x
    assert _ep_link(4, 2, 1.3, "allgather") == pytest.approx(_ep_link(4, 2, 1.0, "allgather"))
