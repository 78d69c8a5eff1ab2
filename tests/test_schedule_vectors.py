"""The pipeline-schedule reference's op-order listings and test vectors TV1-TV10, reproduced
exactly (reference/pipeline_schedules.md, "Test vectors"; c = 0 and T_sync unless stated).
Expected values are the reference's, with its arithmetic in the comments."""

from __future__ import annotations

import pytest

from planner.schedule import build_schedule, group_table, simulate, split_pairs

# ---------------------------------------------------------------- op orders (§1-§11 listings)

LISTINGS = {
    ("gpipe", 4, 8, 1, None): ["F0 F1 F2 F3 F4 F5 F6 F7 B0 B1 B2 B3 B4 B5 B6 B7"] * 4,
    ("1f1b", 4, 8, 1, None): [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"],
    ("interleaved-1f1b", 4, 8, 2, 4): [
        "F0 F1 F2 F3 f0 f1 f2 f3 F4 F5 F6 b0 F7 b1 f4 b2 f5 b3 f6 B0 f7 B1 B2 B3 b4 b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 f1 f2 f3 F4 b0 F5 b1 F6 b2 F7 b3 f4 B0 f5 B1 f6 B2 f7 B3 b4 b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 f1 f2 b0 f3 b1 F4 b2 F5 b3 F6 B0 F7 B1 f4 B2 f5 B3 f6 b4 f7 b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 b0 f1 b1 f2 b2 f3 b3 F4 B0 F5 B1 F6 B2 F7 B3 f4 b4 f5 b5 f6 b6 f7 b7 B4 B5 B6 B7"],
    ("megatron-combined-1f1b", 4, 8, 2, None): [
        "F0 F1 F2 F3 f0 f1 f2 f3 F4 F5 F6 [F7&b0] [f4&b1] [f5&b2] [f6&b3] [f7&B0] B1 B2 B3 b4 b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 f1 f2 f3 F4 [F5&b0] [F6&b1] [F7&b2] [f4&b3] [f5&B0] [f6&B1] [f7&B2] B3 b4 b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 f1 f2 [f3&b0] [F4&b1] [F5&b2] [F6&b3] [F7&B0] [f4&B1] [f5&B2] [f6&B3] [f7&b4] b5 b6 b7 B4 B5 B6 B7",
        "F0 F1 F2 F3 f0 [f1&b0] [f2&b1] [f3&b2] [F4&b3] [F5&B0] [F6&B1] [F7&B2] [f4&B3] [f5&b4] [f6&b5] [f7&b6] b7 B4 B5 B6 B7"],
    ("looped-bfs", 4, 8, 2, None): [
        "F0 F1 F2 F3 F4 F5 F6 F7 f0 f1 f2 f3 f4 f5 f6 f7 b7 b6 b5 b4 b3 b2 b1 b0 B7 B6 B5 B4 B3 B2 B1 B0"] * 4,
    ("zb-h1", 4, 8, 1, None): [
        "F0 F1 F2 F3 I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7",
        "F0 F1 I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7",
        "F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7"],
    ("zb-h2", 4, 8, 1, None): [
        "F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7",
        "F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7",
        "F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7"],
    ("zbv", 4, 8, 2, None): [
        "F0 F1 F2 F3 F4 F5 F6 f0 i0 w0 f1 i1 w1 f2 i2 w2 f3 i3 w3 F7 I0 W0 f4 i4 w4 I1 W1 f5 i5 w5 I2 W2 f6 i6 w6 I3 W3 f7 i7 w7 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 F3 F4 f0 F5 f1 i0 w0 f2 i1 w1 f3 i2 w2 F6 I0 W0 f4 i3 w3 F7 I1 W1 f5 i4 w4 I2 W2 f6 i5 w5 I3 W3 f7 i6 w6 I4 i7 I5 W4 I6 W5 I7 W6 w7 W7",
        "F0 F1 F2 f0 F3 f1 F4 f2 i0 w0 f3 i1 w1 F5 I0 W0 f4 i2 w2 F6 I1 W1 f5 i3 w3 F7 I2 W2 f6 i4 w4 I3 W3 f7 i5 w5 I4 i6 I5 i7 I6 W4 I7 W5 w6 w7 W6 W7",
        "F0 f0 F1 f1 F2 f2 F3 f3 i0 w0 F4 I0 W0 f4 i1 w1 F5 I1 W1 f5 i2 w2 F6 I2 W2 f6 i3 w3 F7 I3 W3 f7 i4 w4 I4 i5 I5 i6 I6 i7 I7 W4 w5 w6 w7 W5 W6 W7"],
    ("interleaved-zero-bubble", 4, 8, 2, None): [
        "F0 F1 F2 F3 f0 f1 f2 f3 i0 w0 F4 i1 w1 F5 i2 w2 F6 i3 w3 F7 I0 W0 f4 I1 W1 f5 I2 W2 f6 I3 W3 f7 i4 w4 i5 w5 i6 w6 i7 w7 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 F3 f0 f1 f2 i0 f3 i1 w0 F4 i2 w1 F5 i3 w2 F6 I0 w3 F7 I1 W0 f4 I2 W1 f5 I3 W2 f6 i4 W3 f7 i5 w4 i6 w5 i7 w6 I4 w7 I5 W4 I6 W5 I7 W6 W7",
        "F0 F1 F2 F3 f0 f1 i0 f2 i1 f3 i2 w0 F4 i3 w1 F5 I0 w2 F6 I1 w3 F7 I2 W0 f4 I3 W1 f5 i4 W2 f6 i5 W3 f7 i6 w4 i7 w5 I4 w6 I5 w7 I6 W4 I7 W5 W6 W7",
        "F0 F1 F2 F3 f0 i0 f1 i1 f2 i2 f3 i3 w0 F4 I0 w1 F5 I1 w2 F6 I2 w3 F7 I3 W0 f4 i4 W1 f5 i5 W2 f6 i6 W3 f7 i7 w4 I4 w5 I5 w6 I6 w7 I7 W4 W5 W6 W7"],
    ("dualpipe", 4, 8, 1, None): [
        "F0 F1 F2 F0' I0' W0' F1' [F3&B1'] [F2'&B0] B2' [F3'&B1] B3' I2 W2 I3 W3",
        "F0 F0' F1 F1' F2 B0' [F2'&B0] [F3&B1'] [F3'&B1] B2' B2 I3' I3 W3' W3",
        "F0' F0 F1' F1 F2' B0 [F2&B0'] [F3'&B1] [F3&B1'] B2 B2' I3 I3' W3 W3'",
        "F0' F1' F2' F0 I0 W0 F1 [F3'&B1] [F2&B0'] B2 [F3&B1'] B3 I2' W2' I3' W3'"],
    ("dualpipev", 4, 8, 2, None): [
        "F0 F1 F2 F3 F4 F5 F6 f0 i0 w0 f1 i1 w1 f2 i2 w2 f3 [F7&b3] [f4&B0] b4 [f5&B1] b5 [f6&B2] b6 [f7&B3] b7 I4 W4 I5 W5 I6 W6 I7 W7",
        "F0 F1 F2 F3 F4 f0 F5 f1 i0 w0 f2 i1 w1 f3 [F6&b2] [f4&B0] [F7&b3] [f5&B1] b4 [f6&B2] b5 [f7&B3] b6 B4 i7 I5 w7 I6 W5 I7 W6 W7",
        "F0 F1 F2 f0 F3 f1 F4 f2 i0 w0 f3 [F5&b1] [f4&B0] [F6&b2] [f5&B1] [F7&b3] [f6&B2] b4 [f7&B3] b5 B4 b6 I5 i7 I6 W5 I7 w7 W6 W7",
        "F0 f0 F1 f1 F2 f2 F3 f3 F4 b0 [f4&B0] [F5&b1] [f5&B1] [F6&b2] [f6&B2] [F7&b3] [f7&B3] b4 B4 b5 B5 i6 I6 i7 I7 w6 W6 w7 W7"],
}


@pytest.mark.parametrize("key", list(LISTINGS), ids=[k[0] for k in LISTINGS])
def test_op_orders_match_the_reference_listings(key):
    name, p, m, v, g = key
    sched = build_schedule(name, p, m, v, g)
    assert [" ".join(sched.label(op) for op in ops) for ops in sched.ranks] == LISTINGS[key]


def test_interleaved_m10_g5_listing_and_pytorch_rounds():
    # §3: p=4, m=10, v=2, g=5 = PyTorch with rounds = max(1, 10 // 4) = 2, mpr = 10 // 2 = 5
    s0 = ("F0 F1 F2 F3 F4 f0 f1 f2 f3 f4 F5 F6 b0 F7 b1 F8 b2 F9 b3 f5 b4 f6 B0 f7 B1 f8 B2 f9 "
          "B3 B4 b5 b6 b7 b8 b9 B5 B6 B7 B8 B9")
    s3 = ("F0 F1 F2 F3 F4 f0 b0 f1 b1 f2 b2 f3 b3 f4 b4 F5 B0 F6 B1 F7 B2 F8 B3 F9 B4 f5 b5 f6 "
          "b6 f7 b7 f8 b8 f9 b9 B5 B6 B7 B8 B9")
    for sched in (build_schedule("interleaved-1f1b", 4, 10, 2, 5),
                  build_schedule("interleaved-1f1b", 4, 10, 2, variant="pytorch")):
        text = [" ".join(sched.label(op) for op in ops) for ops in sched.ranks]
        assert (text[0], text[3]) == (s0, s3)


def test_megatron_schedule_table_example():
    # Megatron's documented table, p=2 g=3 m=5 v=2 (schedules.py:1226-1237)
    table = group_table(5, 2, 3)
    assert [j for j, _ in table] == [0, 1, 2, 0, 1, 2, 3, 4, 3, 4]
    assert [c for _, c in table] == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]


# ---------------------------------------------------------------- TV1-TV10

def test_tv1_gpipe():
    r = simulate(build_schedule("gpipe", 4, 8), F=1, B=2)
    # last stage ends F7 at (p-1+m) t_F = 11, runs B0..B7 11 -> 27, B7 climbs 3 hops: 27 + 3*2 = 33
    assert r.t_sync == 33 and r.bubble == 9                 # (m+p-1)(t_F+t_B) = 11*3; 33 - 8*3
    assert r.busy.tolist() == [24] * 4 and r.peak_inflight.tolist() == [8] * 4


def test_tv2_one_f_one_b():
    r = simulate(build_schedule("1f1b", 4, 8), F=1, B=2)
    assert (r.t_sync, r.bubble) == (33, 9)                  # bubble (p-1)(t_F+t_B) = 3*3
    assert r.peak_inflight.tolist() == [4, 3, 2, 1]         # min(p-r, m)
    r = simulate(build_schedule("1f1b", 4, 2), F=1, B=2)
    assert r.t_sync == 15 and r.peak_inflight.tolist() == [2, 2, 2, 1]    # (2+3)*3
    with pytest.raises(ValueError, match="m >= p"):         # PyTorch Schedule1F1B raises
        build_schedule("1f1b", 4, 2, variant="pytorch")


@pytest.mark.parametrize("c, expected", [(0.0, 33), (0.25, 37), (0.5, 41)])
def test_tv2_one_f_one_b_latency_bound(c, expected):
    # Open items: under fixed order the steady state becomes latency-bound: 33, 37, 41
    assert simulate(build_schedule("1f1b", 4, 8), F=1, B=2, c=c).t_sync == expected


def test_tv3_interleaved_and_looped_bfs():
    chunk = dict(F=0.5, B=1.0)                               # stage t_F=1, t_B=2, v=2
    r = simulate(build_schedule("interleaved-1f1b", 4, 8, 2, 4), **chunk)
    assert r.t_sync == 28.5                                  # 24 + (p-1)(t_F+t_B)/v = 24 + 9/2
    assert r.peak_inflight_chunks.tolist() == [11, 9, 7, 5]  # 2(p-1-r) + (v-1)p + 1
    assert r.peak_inflight.tolist() == [5.5, 4.5, 3.5, 2.5]
    for sched in (build_schedule("interleaved-1f1b", 4, 10, 2, 5),
                  build_schedule("interleaved-1f1b", 4, 10, 2, variant="pytorch")):
        r = simulate(sched, **chunk)
        assert r.t_sync == 34.5                              # 30 + 4.5
        assert r.peak_inflight_chunks.tolist() == [12, 10, 8, 6]   # 6+5+1, ...
    with pytest.raises(ValueError, match="10 mod 4 = 2"):   # 10 mod 4 = 2 < 4
        build_schedule("interleaved-1f1b", 4, 10, 2, 4)
    r = simulate(build_schedule("looped-bfs", 4, 8, 2), **chunk)
    assert r.t_sync == 28.5                                  # (v m + p - 1) * 1.5 = 19 * 1.5
    assert r.peak_inflight_chunks.tolist() == [16] * 4 and r.peak_inflight.tolist() == [8] * 4
    assert simulate(build_schedule("looped-bfs", 4, 2, 2), **chunk).t_sync == 13.5  # 9 * 1.5


def test_tv4_zb_h1():
    zb = build_schedule("zb-h1", 4, 8)
    r = simulate(zb, F=1, I=1, W=1)
    assert r.t_sync == 27                                    # 24 + 3*max(1+1-1, 1, 1)
    assert simulate(build_schedule("1f1b", 4, 8), F=1, B=2).t_sync == 33
    assert r.peak_inflight.tolist() == [4, 3, 2, 1] and r.peak_pending_w.tolist() == [1, 2, 3, 4]
    gamma = 0.3                                              # 4, 3+g, 2+2g, 1+3g
    assert simulate(zb, F=1, I=1, W=1, gamma=gamma).peak_memory == pytest.approx(
        [4, 3 + gamma, 2 + 2 * gamma, 1 + 3 * gamma])
    assert simulate(zb, F=1, I=1, W=2).t_sync == 35          # 8*4 + 3*max(0, 1, 1); paper form: 32
    assert simulate(zb, F=1, I=1, W=0.5).t_sync == 24.5      # 8*2.5 + 3*1.5


def test_tv5_zb_h2():
    zb = build_schedule("zb-h2", 4, 8)
    r = simulate(zb, F=1, I=1, W=1)
    assert (r.t_span, r.t_sync) == (24, 27)                  # 24 + 3*max(0,0,0); 24 + 3*max(0,0,1)
    assert r.peak_inflight.tolist() == [7, 5, 3, 1] and r.peak_pending_w.tolist() == [1, 3, 5, 7]
    assert simulate(zb, F=1, I=1, W=1, c=0.5).t_span == 27   # 24 + (p-1)(1+1+2c-2) = 24 + 3
    assert simulate(zb, F=1, I=1, W=1, c=0.25).t_span == 25.5


def test_tv6_zbv():
    r = simulate(build_schedule("zbv", 4, 8, 2), F=1, I=1, W=1)   # chunk times
    assert r.busy.tolist() == [48] * 4                       # 2m*3
    assert (r.t_span, r.t_sync) == (48, 51)                  # zero bubble; 48 + (p-1)*1
    assert r.peak_inflight_chunks.tolist() == [8] * 4 and r.peak_inflight.tolist() == [4] * 4
    assert r.peak_pending_w.tolist() == [1, 3, 5, 7]
    # same stage times (2/2/2): 1F1B 8*6 + 3*6 = 66; ZB-H1 48 + 3*2 = 54
    assert simulate(build_schedule("1f1b", 4, 8), F=2, B=4).t_sync == 66
    assert simulate(build_schedule("zb-h1", 4, 8), F=2, I=2, W=2).t_sync == 54


def test_tv7_interleaved_zero_bubble():
    r = simulate(build_schedule("interleaved-zero-bubble", 4, 8, 2), F=1, I=1, W=1)
    assert r.t_sync == 51                                    # v m 3 + (p-1) max(1,1,1) = 48 + 3
    assert r.peak_inflight_chunks.tolist() == [8, 7, 6, 5]
    assert r.peak_pending_w.tolist() == [1, 2, 3, 4]
    plain = build_schedule("interleaved-1f1b", 4, 8, 2, variant="pytorch")
    assert simulate(plain, F=1, B=2).t_sync == 57            # 48 + 3*3


def test_tv8_dualpipev():
    sched = build_schedule("dualpipev", 4, 16, 2)
    r = simulate(sched, F=1, I=1, W=1, FB=3)
    assert r.busy.tolist() == [96] * 4                       # 2m(t_F+t_B) = 32*3
    assert r.t_sync == 102                                   # 96 + (p-1)(3+2-3)
    assert r.peak_inflight_chunks.tolist() == [9] * 4        # 2p+1
    r = simulate(sched, F=1, I=1, W=1, FB=2)
    assert (r.t_sync, r.busy[0], r.bubble) == (76, 75, 1)    # 2m-3p+1 = 21 pairs: 96-21, +1 idle
    assert simulate(split_pairs(sched), F=1, I=1, W=1).t_sync == 99
    assert simulate(build_schedule("dualpipe", 8, 32), F=1, I=1, W=1, FB=3).t_sync == 102


def test_tv9_dualpipe():
    r = simulate(build_schedule("dualpipe", 4, 8), F=1, I=1, W=1, FB=3)
    assert r.busy.tolist() == [24] * 4                       # m(t_F+t_B)
    assert r.t_sync == 26                                    # 24 + (p/2-1)(3+2-3)
    assert r.peak_inflight.tolist() == [5] * 4 and r.param_copies == 2   # p+1; two stages


def test_tv10_megatron_combined():
    pp1 = build_schedule("megatron-combined-1f1b", 1, 8)
    r = simulate(pp1, F=1, B=2, FB=2.5)
    assert r.t_sync == 20.5                                  # 1 + 7*2.5 + 2
    assert simulate(pp1, F=1, B=2).t_sync == 24              # no overlap: t_FB = t_F + t_B
    assert r.peak_inflight.tolist() == [2]
    assert simulate(build_schedule("1f1b", 1, 8), F=1, B=2).peak_inflight.tolist() == [1]
    pp4 = build_schedule("megatron-combined-1f1b", 4, 8, 2)
    r = simulate(pp4, F=1, B=2, FB=3)
    assert r.t_sync == 57                                    # 48 + (p-1)*3, plain interleaved
    assert simulate(pp4, F=1, B=2, FB=2).t_sync == 46        # regression value
    assert r.peak_inflight_chunks.tolist() == [12, 10, 8, 6]
    plain = simulate(build_schedule("interleaved-1f1b", 4, 8, 2), F=1, B=2)
    assert plain.peak_inflight_chunks.tolist() == [11, 9, 7, 5]


# ---------------------------------------------------------------- further [derived] values

def test_interleaved_zero_bubble_with_m_below_p():
    # §9: p=4, m=2, v=2, unit chunk times: 19, not the formula's 15
    assert simulate(build_schedule("interleaved-zero-bubble", 4, 2, 2), F=1, I=1, W=1).t_sync == 19


@pytest.mark.parametrize("p, m, times, bubble", [
    (4, 8, (2, 1, 1, 4), 4),      # formula (p/2-1)(FB+B-3W) = 3
    (8, 32, (1, 1, 1, 2), 1),     # formula 3
    (8, 32, (2, 2, 1, 3), 5),     # formula 9
    (8, 32, (2, 1, 1, 4), 12)])   # formula 9
def test_dualpipe_bubble_departs_from_the_published_formula(p, m, times, bubble):
    t_f, t_i, t_w, t_fb = times   # §10 [derived]
    assert simulate(build_schedule("dualpipe", p, m), F=t_f, I=t_i, W=t_w, FB=t_fb).bubble == bubble


@pytest.mark.parametrize("times, bubble", [((1, 1, 0.5), 3), ((1, 2, 1), 6), ((1, 1, 2), 5)])
@pytest.mark.parametrize("m", [8, 12, 16])
def test_zbv_unequal_times(m, times, bubble):
    t_f, t_i, t_w = times         # §8: chunk 1/1/0.5: +3 = (p-1) t_F; 1/2/1: +6; 1/1/2: +5
    assert simulate(build_schedule("zbv", 4, m, 2), F=t_f, I=t_i, W=t_w).bubble == bubble


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_v_shape_and_dualpipe_peaks_do_not_depend_on_gamma(gamma):
    zbv = simulate(build_schedule("zbv", 4, 8, 2), F=1, I=1, W=1, gamma=gamma)
    assert zbv.peak_memory.tolist() == [4] * 4              # p micro-batches on every rank
    dual = simulate(build_schedule("dualpipe", 8, 32), F=1, I=1, W=1, FB=3, gamma=gamma)
    assert dual.peak_memory.tolist() == [9] * 8             # p+1 stage-activations


@pytest.mark.parametrize("name, p, m, v, rule", [
    ("zbv", 4, 8, 1, "v = 2"), ("dualpipev", 4, 7, 2, "m >= 2p"),
    ("dualpipe", 3, 8, 1, "p even"), ("dualpipe", 4, 9, 1, "m even"),
    ("dualpipe", 4, 6, 1, "m >= 2p"), ("zb-h1", 4, 7, 1, "m >= 2p"),
    ("interleaved-1f1b", 4, 3, 2, "p=4 <= g <= m=3"),
    ("interleaved-zero-bubble", 4, 9, 2, "multiple of rounds"),
    ("megatron-combined-1f1b", 4, 8, 1, "VPP"), ("gpipe", 4, 8, 2, "v = 1")])
def test_generators_reject_their_constraints_in_one_line(name, p, m, v, rule):
    with pytest.raises(ValueError, match=rule) as err:
        build_schedule(name, p, m, v)
    assert "\n" not in str(err.value)
