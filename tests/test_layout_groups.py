"""The rank order is written once (planner.layout.groups): the (size, stride) the cost model times
a group with is the group placement enumerates and the validator builds."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.collectives import group_span
from planner.layout import Layout
from planner.layout.groups import KINDS, ORDERS, all_groups, ranks, size_stride

POW2 = st.sampled_from([1, 2, 4])


def _layout(tp, cp, dp, pp, etp, ep) -> Layout:
    return Layout(tp=tp, cp=cp, dp=dp, pp=pp, etp=etp, ep=ep, zero_stage=1, micro_batch_size=1)


def test_megatron_dense_order_by_hand():
    # tp=2 cp=2 dp=2 pp=2: rank = i_tp + 2*(i_cp + 2*(i_dp + 2*i_pp)) (formulas.md 5.3), so rank 5
    # = (i_tp 1, i_cp 0, i_dp 1, i_pp 0): its TP group [4, 5], CP [5, 7], DP [1, 5], the
    # gradient group dp*cp over ranks 2 apart [1, 3, 5, 7], PP [5, 13]
    g = all_groups(_layout(2, 2, 2, 2, 1, 1))
    mine = {k: next(row for row in v.tolist() if 5 in row) for k, v in g.items()}
    assert mine == {"tp": [4, 5], "cp": [5, 7], "dp": [1, 5], "pp": [5, 13], "dp_cp": [1, 3, 5, 7]}


def test_expert_order_by_hand():
    # a stage of tp*cp*dp = 8 GPUs folded as etp=2 x ep=2 x edp=2 (pp=1): rank = i_etp +
    # 2*(i_ep + 2*i_edp): EP groups ranks 2 apart [0, 2], EDP 4 apart [0, 4], ETP [0, 1]
    g = all_groups(_layout(2, 1, 4, 1, 2, 2), experts=True)
    assert g["ep"].tolist()[:2] == [[0, 2], [1, 3]]
    assert g["edp"].tolist()[0] == [0, 4] and g["etp"].tolist()[0] == [0, 1]
    assert g["ep_etp"].tolist()[0] == [0, 1, 2, 3]
    assert size_stride(_layout(2, 1, 4, 1, 2, 2), "edp") == (2, 4)


@settings(max_examples=60, deadline=None)
@given(tp=POW2, cp=POW2, dp=POW2, pp=POW2, etp=st.sampled_from([1, 2]), ep=POW2,
       domain=st.sampled_from([2, 4, 8, 16]), order=st.sampled_from(list(ORDERS)))
def test_size_stride_is_what_the_groups_are(tp, cp, dp, pp, etp, ep, domain, order):
    if (tp * cp * dp) % (etp * ep):
        return  # the expert mesh does not fold over a stage
    lay = _layout(tp, cp, dp, pp, etp, ep)
    for kind, groups in all_groups(lay, order, experts=True).items():
        size, stride = size_stride(lay, kind, order)
        assert groups.shape[1] == size
        assert sorted(groups.ravel().tolist()) == list(range(lay.gpus))  # a partition of the ranks
        if len(KINDS[kind][1]) == 1 and size > 1:  # one dim: members evenly `stride` apart
            assert set(np.diff(groups, axis=1).ravel().tolist()) == {stride}
        if order != "megatron":
            continue
        # the cost model's (ranks per domain, domains) against the enumerated groups: exact, or
        # a flat ring (1, size) where some group straddles a domain boundary unequally
        local, nodes = (int(x) for x in group_span(size, stride, domain))
        doms = groups // domain
        per_group = [np.unique(row, return_counts=True)[1] for row in doms]
        exact = all(len(c) == nodes and c.min() == local for c in per_group)
        flat = local == 1 and nodes == size > 1 and any(len(c) > 1 for c in per_group)
        assert exact or flat, (kind, size, stride, domain)


def test_ranks_of_non_adjacent_dims():
    # the tied-embedding pairs: the first and last member of each pipeline group, (pp-1)*stage apart
    sizes = {"tp": 2, "cp": 1, "dp": 2, "pp": 3}
    ends = ranks(sizes, ORDERS["megatron"][0], ("pp",))[:, [0, -1]]
    assert ends.tolist() == [[0, 8], [1, 9], [2, 10], [3, 11]]
    assert size_stride(_layout(2, 1, 2, 3, 1, 1), "embd") == (2, 8)
