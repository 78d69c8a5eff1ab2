"""Properties of the pipeline-schedule simulator: it equals the closed forms wherever they are
exact, equals planner/cost/pipeline.py's in-flight counts (1F1B, Megatron interleaved), the
batched path equals the single-case path, a longer op never shortens the step, and bad input
or a deadlocking order is one ValueError line. Expected values come from closed forms."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import pipeline
from planner.schedule import (SCHEDULES, Op, Schedule, build_schedule, closed_forms as cf,
                              simulate, simulate_batch)

FAST = settings(max_examples=40, deadline=None)
time_value = st.sampled_from([0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0])   # exact in binary


def megatron_group(p, m):
    """A valid Megatron group for m >= p (pipeline.py's choice: p, else the least valid)."""
    return pipeline.microbatch_group(m, p)


def valid_args(name, p, m, v):
    """(p, m, v, g) that satisfy ``name``'s constraints, from arbitrary small draws."""
    g = None
    if name in ("gpipe", "1f1b", "zb-h1", "zb-h2", "dualpipe"):
        v = 1
    if name in ("zb-h1", "zb-h2", "dualpipev"):
        m = max(m, 2 * p)
    if name in ("zbv", "dualpipev"):
        v = 2
    if name == "dualpipe":
        p = p + p % 2
        m = max(m + m % 2, 2 * p)
    if name in ("interleaved-1f1b", "interleaved-zero-bubble", "megatron-combined-1f1b"):
        v, m = max(v, 2), max(m, p)
        if name == "interleaved-zero-bubble":
            m -= m % max(1, m // p)
        else:
            g = megatron_group(p, m)
        if name == "megatron-combined-1f1b" and p == 1:
            v, g = 1, None
    return p, m, v, g


def random_times(sched, rng, K=None):
    """Per-stage times (K, S) or (S,) for every kind the schedule may need, FB included."""
    shape = (sched.n_stages,) if K is None else (K, sched.n_stages)
    t = {k: rng.uniform(0.2, 2.0, shape) for k in ("F", "I", "W")}
    t["FB"] = rng.uniform(1.5, 4.0, shape)
    return t


# ---------------------------------------------------------------- closed forms

@FAST
@given(p=st.integers(1, 8), m=st.integers(1, 24), t_f=time_value, t_b=time_value)
def test_gpipe_and_1f1b_equal_their_closed_form(p, m, t_f, t_b):
    for name in ("gpipe", "1f1b"):
        r = simulate(build_schedule(name, p, m), F=t_f, B=t_b)
        assert r.t_sync == pytest.approx(float(cf.gpipe_time(p, m, t_f, t_b)), rel=1e-12)
        assert r.t_span == pytest.approx(r.t_sync, rel=1e-12)
    peaks = simulate(build_schedule("1f1b", p, m), F=t_f, B=t_b).peak_inflight
    assert peaks.tolist() == cf.one_f_one_b_peak(p, m, np.arange(p)).tolist()


@FAST
@given(p=st.integers(1, 6), extra=st.integers(0, 12), v=st.integers(2, 4), t_f=time_value,
       t_b=time_value, bump=st.integers(0, 3))
def test_megatron_interleaved_equals_closed_forms_for_every_valid_group(p, extra, v, t_f, t_b,
                                                                         bump):
    m = p + extra
    valid = [g for g in range(p, m + 1) if m % g == 0 or m % g >= p]
    g = valid[min(bump, len(valid) - 1)]
    r = simulate(build_schedule("interleaved-1f1b", p, m, v, g), F=t_f / v, B=t_b / v)
    assert r.t_sync == pytest.approx(float(cf.interleaved_time(p, m, v, t_f, t_b)), rel=1e-12)
    assert r.peak_inflight_chunks.tolist() == cf.interleaved_peak_chunks(
        p, m, v, g, np.arange(p)).tolist()


@FAST
@given(p=st.integers(1, 6), m=st.integers(1, 20), v=st.integers(1, 3), t_f=time_value,
       t_b=time_value)
def test_pytorch_interleaved_and_looped_bfs_equal_their_closed_form(p, m, v, t_f, t_b):
    expected = float(cf.looped_bfs_time(p, m, v, t_f, t_b))
    r = simulate(build_schedule("looped-bfs", p, m, v), F=t_f / v, B=t_b / v)
    assert r.t_sync == pytest.approx(expected, rel=1e-12)
    assert r.peak_inflight.tolist() == [m] * p
    if v >= 2 and m % max(1, m // p) == 0:
        sched = build_schedule("interleaved-1f1b", p, m, v, variant="pytorch")
        assert simulate(sched, F=t_f / v, B=t_b / v).t_sync == pytest.approx(expected, rel=1e-12)


@FAST
@given(p=st.integers(1, 6), extra=st.integers(0, 8), t_f=time_value, t_i=time_value,
       t_w=time_value, gamma=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_zb_h1_and_h2_equal_their_closed_forms(p, extra, t_f, t_i, t_w, gamma):
    m, ranks = 2 * p + extra, np.arange(p)
    r = simulate(build_schedule("zb-h1", p, m), F=t_f, I=t_i, W=t_w, gamma=gamma)
    assert r.t_sync == pytest.approx(float(cf.zb_h1_time(p, m, t_f, t_i, t_w)), rel=1e-12)
    inflight, pending, memory = cf.zb_h1_peak(p, ranks, gamma)
    assert r.peak_inflight.tolist() == inflight.tolist()
    assert r.peak_pending_w.tolist() == pending.tolist()
    assert r.peak_memory == pytest.approx(memory)
    r = simulate(build_schedule("zb-h2", p, m), F=t_f, I=t_i, W=t_w, gamma=gamma)
    t_sync, t_span = cf.zb_h2_time(p, m, t_f, t_i, t_w)
    assert (r.t_sync, r.t_span) == pytest.approx((float(t_sync), float(t_span)), rel=1e-12)
    inflight, pending, memory = cf.zb_h2_peak(p, ranks, gamma)
    assert r.peak_inflight.tolist() == inflight.tolist()
    assert r.peak_memory == pytest.approx(memory)


@FAST
@given(p=st.integers(1, 6), extra=st.integers(0, 12), v=st.integers(2, 3), f=time_value,
       i=time_value, w=time_value)
def test_interleaved_zero_bubble_equals_its_closed_form(p, extra, v, f, i, w):
    m = p + extra
    m -= m % max(1, m // p)
    r = simulate(build_schedule("interleaved-zero-bubble", p, m, v), F=f, I=i, W=w)
    assert r.t_sync == pytest.approx(
        float(cf.interleaved_zero_bubble_time(p, m, v, f, i, w)), rel=1e-12)
    assert r.peak_inflight_chunks.tolist() == cf.interleaved_zero_bubble_peak_chunks(
        p, m, v, np.arange(p)).tolist()


@FAST
@given(p=st.integers(1, 6), extra=st.integers(0, 8), t=time_value)
def test_zbv_equal_times_equal_the_closed_form(p, extra, t):
    m = 2 * p - 1 + extra
    r = simulate(build_schedule("zbv", p, m, 2), F=t, I=t, W=t)
    t_sync, t_span = cf.zbv_equal_time(p, m, t)
    assert (r.t_sync, r.t_span) == pytest.approx((float(t_sync), float(t_span)), rel=1e-12)


@FAST
@given(m=st.integers(1, 20), t_f=time_value, t_b=time_value, t_fb=time_value)
def test_megatron_combined_pp1_equals_its_closed_form(m, t_f, t_b, t_fb):
    r = simulate(build_schedule("megatron-combined-1f1b", 1, m), F=t_f, B=t_b, FB=t_fb)
    assert r.t_sync == pytest.approx(float(cf.combined_pp1_time(m, t_f, t_b, t_fb)), rel=1e-12)


# ---------------------------------------------------------------- planner/cost/pipeline.py

class _Layout:
    """The attributes planner.cost.pipeline reads from a layout (one candidate, one layer per
    model chunk, even split)."""

    def __init__(self, pp, vpp):
        self.pp, self.vpp = np.array([pp]), np.array([vpp])

    def rank_layers(self, num_layers, rank):
        return np.full(1, num_layers / self.pp[0])

    def rank_chunk_layers(self, num_layers, rank):
        return np.full(1, num_layers / (self.pp[0] * self.vpp[0])), np.full(1, -1)


@FAST
@given(p=st.integers(1, 8), m=st.integers(1, 24), v=st.integers(1, 4))
def test_inflight_counts_equal_cost_pipeline(p, m, v):
    if v > 1:
        m = max(m, p)
        sched = build_schedule("interleaved-1f1b", p, m, v, megatron_group(p, m))
    else:
        sched = build_schedule("1f1b", p, m)
    peaks = simulate(sched, F=1.0, B=2.0).peak_inflight_chunks
    layout = _Layout(p, v)
    today = [float(pipeline.inflight_layers(layout, p * v, m, r)[0]) for r in range(p)]
    assert peaks.tolist() == today


# ---------------------------------------------------------------- batched path, monotonicity

@FAST
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 5), m=st.integers(1, 12),
       v=st.integers(1, 3), seed=st.integers(0, 2**31), latency=st.booleans())
def test_batched_path_equals_single_case_path(name, p, m, v, seed, latency):
    p, m, v, g = valid_args(name, p, m, v)
    sched, rng = build_schedule(name, p, m, v, g), np.random.default_rng(seed)
    times, K = random_times(sched, rng, K=3), 3
    c = rng.uniform(0, 0.5, (K, p)) if latency else 0.0
    gamma = rng.uniform(0, 1, K)
    batch = simulate_batch(sched, **times, c=c, gamma=gamma)
    for k in range(K):
        one = simulate(sched, **{x: t[k] for x, t in times.items()},
                       c=c[k] if latency else 0.0, gamma=gamma[k])
        assert batch.t_sync[k] == pytest.approx(one.t_sync, rel=1e-12)
        assert batch.t_span[k] == pytest.approx(one.t_span, rel=1e-12)
        assert batch.busy[k] == pytest.approx(one.busy, rel=1e-12)
        assert batch.bubble[k] == pytest.approx(one.bubble, rel=1e-9, abs=1e-9)
        assert batch.peak_memory[k] == pytest.approx(one.peak_memory)
        assert max(e.end for e in one.events) == pytest.approx(one.t_sync, rel=1e-12)


@FAST
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 4), m=st.integers(1, 10),
       v=st.integers(1, 3), seed=st.integers(0, 2**31), delta=st.floats(0.01, 2.0))
def test_a_longer_op_never_shortens_the_step(name, p, m, v, seed, delta):
    p, m, v, g = valid_args(name, p, m, v)
    sched, rng = build_schedule(name, p, m, v, g), np.random.default_rng(seed)
    base = random_times(sched, rng)
    S, kinds = sched.n_stages, list(base)
    cases = {k: np.tile(x, (1 + len(kinds) * S, 1)) for k, x in base.items()}
    for i, k in enumerate(kinds):          # row 1 + i*S + s lengthens kind k on stage s
        cases[k][1 + i * S + np.arange(S), np.arange(S)] += delta
    c = rng.uniform(0, 0.3, p)
    t = simulate_batch(sched, **cases, c=c).t_sync
    assert np.all(t[1:] >= t[0] - 1e-9)
    longer_c = simulate_batch(sched, **base, c=np.stack([c, c + delta])).t_sync
    assert longer_c[1] >= longer_c[0] - 1e-9


def test_latency_forms_agree():
    sched = build_schedule("1f1b", 4, 8)
    scalar = simulate(sched, F=1, B=2, c=0.25).t_sync
    assert simulate(sched, F=1, B=2, c=[0.25] * 3).t_sync == scalar      # (p-1,) boundaries
    assert simulate(sched, F=1, B=2, c=[0.25] * 4).t_sync == scalar      # (p,) boundaries
    batch = simulate_batch(sched, F=1, B=2, c=np.array([[0.0], [0.25], [0.5]]))
    assert batch.t_sync.tolist() == [33, 37, 41]


def test_per_case_latency_with_two_ranks():
    # (K, 1) is one latency per case even where p - 1 = 1: interleaved on p = 2 crosses both
    # boundaries (0 -> 1 and the wrap 1 -> 0), each at the case's c
    sched = build_schedule("interleaved-1f1b", 2, 2, 2)
    batch = simulate_batch(sched, F=0.5, B=1.0, c=np.array([[0.0], [0.25]]))
    assert batch.t_sync.tolist() == [simulate(sched, F=0.5, B=1.0, c=c).t_sync for c in (0.0, 0.25)]


# ---------------------------------------------------------------- errors

def test_deadlock_is_one_value_error_line():
    bad = Schedule("bad", 2, 1, 1, ((Op("F", 0, 0), Op("B", 0, 0)),
                                    (Op("B", 0, 0), Op("F", 0, 0))))
    with pytest.raises(ValueError, match="deadlock") as err:
        simulate(bad, F=1, B=1)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ranks, match", [
    (((Op("F", 0, 0),), (Op("F", 0, 0), Op("B", 0, 0))), "expected 2 F and 2 I/B"),
    (((Op("F", 0, 0), Op("B", 0, 0)), (Op("F", 0, 0), Op("B", 0, 0), Op("B", 0, 0))),
     "appears twice")])
def test_incomplete_or_duplicated_orders_are_rejected(ranks, match):
    with pytest.raises(ValueError, match=match):
        simulate(Schedule("bad", 2, 1, 1, ranks), F=1, B=1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(F=1, B=2), "give I and W"), (dict(F=-1, I=1, W=1), ">= 0"),
    (dict(F=[1, 2], I=1, W=1), "2 entries"), (dict(F=1, I=1, W=1, c=[1, 2, 3, 4, 5]), "c of shape"),
    (dict(F=1, I=1, W=1, gamma=2), "gamma")])
def test_bad_inputs_are_one_value_error_line(kwargs, match):
    with pytest.raises(ValueError, match=match) as err:
        simulate(build_schedule("zb-h1", 4, 8), **kwargs)
    assert "\n" not in str(err.value)


def test_wrapping_schedules_need_every_boundary():
    with pytest.raises(ValueError, match="give p entries"):
        simulate(build_schedule("interleaved-1f1b", 4, 8, 2), F=1, B=2, c=[0.1] * 3)


def test_batches_run_in_slices_give_the_same_steps(monkeypatch):
    sim = importlib.import_module("planner.schedule.simulate")   # the module, not the function
    sched, rng = build_schedule("zbv", 4, 8, 2), np.random.default_rng(7)
    times, c = random_times(sched, rng, K=37), rng.uniform(0, 0.5, (37, 4))
    whole = simulate_batch(sched, **times, c=c)
    monkeypatch.setattr(sim, "_RING_BYTES", 1000)          # a few cases per slice
    sliced = simulate_batch(sched, **times, c=c)
    assert sliced.t_sync.tolist() == whole.t_sync.tolist()
    assert sliced.t_span.tolist() == whole.t_span.tolist()


def test_gamma_per_case_sets_k():
    # ZB-H1 rank r peaks at (p - r) + gamma r (TV4)
    r = simulate_batch(build_schedule("zb-h1", 4, 8), F=1, I=1, W=1, gamma=np.array([0, 1.0]))
    assert r.t_sync.tolist() == [27, 27]
    assert r.peak_memory.tolist() == [[4, 3, 2, 1], [4, 4, 4, 4]]
