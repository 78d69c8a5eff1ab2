"""The flex dispatcher (DeepEP / HybridEP): deduplicated rows over NVLink and the network
(moe.md 4.4), hand-derived."""

from __future__ import annotations

import numpy as np
import pytest

from planner.catalog import models


def load_model(name):
    return models()[name]
from planner.cost.collectives import Links, collective_time
from planner.cost.moe import FLEX_NIC_EFFICIENCY, flex_links, flex_shares, miss_probability


def test_miss_probability_small_case():
    # E = 4 experts, k = 2, a set of 2 experts missed: C(2,2)/C(4,2) = 1/6
    # = (4-2-0)/(4-0) * (4-2-1)/(4-1) = 2/4 * 1/3 = 1/6
    assert float(miss_probability(4, 2, 2)) == pytest.approx(1 / 6)
    # holding more than E - k experts: always hit
    assert float(miss_probability(4, 2, 3)) == 0.0


def test_distinct_ranks_match_moe_md():
    # moe.md 4.4 [calc]: DeepSeek-V3 (E 256, k 8) ep 8 -> D_r = 5.29; ep 64 -> 7.68;
    # Qwen3-30B (E 128, k 8) ep 8 -> 5.34
    for E, ep, d in ((256, 8, 5.29), (256, 64, 7.68), (128, 8, 5.34)):
        assert ep * (1 - float(miss_probability(E, 8, E / ep))) == pytest.approx(d, abs=0.01)


def test_flex_shares_deepseek_ep32_on_four_8gpu_nodes():
    m = load_model("deepseek-v3")
    nvl, nic = flex_shares(m, np.array([8]), np.array([4]))
    # q(64 of 256, k 8) = prod_{i<8} (192 - i)/(256 - i) = 0.09645; remote domains
    # D = 3 * (1 - 0.09645) = 2.7107 -> NIC share 2.7107 / 8 = 0.3388 (the all-to-all's 24/32 = 0.75)
    assert float(nic[0]) == pytest.approx(0.3388, abs=5e-4)
    # q(8 of 256) = C(248, 8)/C(256, 8) = prod (248 - i)/(256 - i) = 0.77291; D_rank = 32 *
    # 0.22709 = 7.2668, NVLink share 7.2668 * 7/8 / 8 = 0.7948
    assert float(nvl[0]) == pytest.approx(0.7948, abs=5e-4)


def test_flex_inside_one_domain_sends_no_network_bytes():
    m = load_model("qwen3-30b-a3b")
    nvl, nic = flex_shares(m, np.array([8]), np.array([1]))
    assert float(nic[0]) == 0.0
    # D_rank = 5.339 (moe.md 4.4); 5.339 * 7/8 / 8 = 0.5840 (the all-to-all's 7/8 = 0.875)
    assert float(nvl[0]) == pytest.approx(0.5840, abs=5e-4)


def test_flex_all_to_all_time_uses_the_shares_and_rdma_rate():
    links = Links(intra_bw=400e9, inter_bw=25e9, intra_latency=0.0, inter_latency=0.0,
                  domain=8, inter_peak=50e9)
    fl = flex_links(links)
    assert fl.inter_bw == pytest.approx(50e9 * FLEX_NIC_EFFICIENCY)
    # 1 GB sent, shares (0.5, 0.25): max(0.5 GB / 400 GB/s, 0.25 GB / 43 GB/s) = 5.81 ms
    t = collective_time("all_to_all", np.array([1e9]), np.array([8]), np.array([4]), fl, (0.5, 0.25))
    assert float(t[0]) == pytest.approx(0.25e9 / 43e9)
    # plain all-to-all on the same group: 24/32 of 1 GB over 25 GB/s = 30 ms
    t0 = collective_time("all_to_all", np.array([1e9]), np.array([8]), np.array([4]), links)
    assert float(t0[0]) == pytest.approx(0.75e9 / 25e9)
