"""Closed forms of pipeline step time and per-rank activation peaks where they are exact
(reference/pipeline_schedules.md summary table, [derived] rows, and the test vectors).

Exact only under the simulator's rules (§0.3) with equal stages and no communication (c = 0);
each function states the rest of its condition. Everything broadcasts (numpy): p, m, v, g, r
integers or integer arrays, times non-negative floats or arrays, in one unit (seconds or
stage-time units). Step times are T_sync unless stated.
"""

from __future__ import annotations

import numpy as np


def _f(x):
    return np.asarray(x, dtype=np.float64)


def gpipe_time(p, m, t_f, t_b):
    """GPipe: T = (m + p - 1)(t_F + t_B), bubble (p - 1)(t_F + t_B); any m >= 1. Stage times.
    [derived; GPipe paper] (TV1: p=4, m=8, 1 + 2 -> 33)."""
    return (_f(m) + p - 1) * (_f(t_f) + t_b)


def one_f_one_b_time(p, m, t_f, t_b):
    """1F1B (PipeDream-Flush, Megatron order): T = (m + p - 1)(t_F + t_B) for every m >= 1,
    m < p included. Stage times. [derived] (TV2)."""
    return gpipe_time(p, m, t_f, t_b)


def interleaved_time(p, m, v, t_f, t_b):
    """Interleaved 1F1B with stage times (a chunk takes t/v): m >= p (Megatron, any valid g, or
    PyTorch): T = m(t_F + t_B) + (p - 1)(t_F + t_B)/v; PyTorch with m < p:
    T = (v p + m - 1)(t_F + t_B)/v. Both are (v max(m, p) + min(m, p) - 1)(t_F + t_B)/v.
    [derived; Narayanan 2021 §2.2.2] (TV3: 28.5, 34.5)."""
    return looped_bfs_time(p, m, v, t_f, t_b)


def looped_bfs_time(p, m, v, t_f, t_b):
    """Looped BFS: T = (v max(m, p) + min(m, p) - 1)(t_F + t_B)/v for every m >= 1, stage times.
    [derived] (TV3: m=8 -> 28.5, m=2 -> 13.5)."""
    m = _f(m)
    return (v * np.maximum(m, p) + np.minimum(m, p) - 1) * (_f(t_f) + t_b) / v


def zb_h1_time(p, m, t_f, t_i, t_w):
    """ZB-H1 (authors' hand schedule, m >= 2p): T = m(t_F + t_I + t_W)
    + (p - 1) max(t_F + t_I - t_W, t_F, t_I). The paper's (p - 1)(t_F + t_I - t_W) holds iff
    t_W <= min(t_F, t_I). [derived] (TV4: 27; t_W = 2 -> 35; t_W = 0.5 -> 24.5)."""
    t_f, t_i, t_w = _f(t_f), _f(t_i), _f(t_w)
    tail = np.maximum(np.maximum(t_f + t_i - t_w, t_f), t_i)
    return _f(m) * (t_f + t_i + t_w) + (p - 1) * tail


def zb_h2_time(p, m, t_f, t_i, t_w):
    """ZB-H2 (authors' hand schedule, m >= 2p): (T_sync, T_span) with
    T_span = m(t_F + t_I + t_W) + (p - 1) max(t_F + t_I - 2t_W, t_I - t_F, 0) and T_sync the
    same with t_F in place of 0. [derived] (TV5: 27, 24)."""
    t_f, t_i, t_w = _f(t_f), _f(t_i), _f(t_w)
    work, core = _f(m) * (t_f + t_i + t_w), np.maximum(t_f + t_i - 2 * t_w, t_i - t_f)
    return work + (p - 1) * np.maximum(core, t_f), work + (p - 1) * np.maximum(core, 0.0)


def interleaved_zero_bubble_time(p, m, v, f, i, w):
    """PyTorch ScheduleInterleavedZeroBubble with CHUNK times f, i, w and m >= p (m a multiple of
    max(1, m // p)): T = v m (f + i + w) + (p - 1) max(f + i - w, f, i). Not exact for m < p.
    [derived] (TV7: 51)."""
    f, i, w = _f(f), _f(i), _f(w)
    return v * _f(m) * (f + i + w) + (p - 1) * np.maximum(np.maximum(f + i - w, f), i)


def zbv_equal_time(p, m, t):
    """ZB-V (PyTorch order) with equal chunk times t_F = t_I = t_W = t and m >= 2p - 1:
    (T_sync, T_span) = (6 m t + (p - 1) t, 6 m t). No closed form for unequal times.
    [derived] (TV6: 51, 48)."""
    work = 6 * _f(m) * t
    return work + (p - 1) * _f(t), work


def combined_pp1_time(m, t_f, t_b, t_fb):
    """Megatron combined 1F1B (EP all-to-all overlap) with PP = 1: F0, [F1&B0], ...,
    [F(m-1)&B(m-2)], B(m-1): T = t_F + (m - 1) t_FB + t_B. [derived] (TV10: 20.5)."""
    return _f(t_f) + (_f(m) - 1) * t_fb + t_b


def one_f_one_b_peak(p, m, r):
    """Peak in-flight micro-batches of 1F1B on rank r: min(p - r, m) (GPipe: m on every rank).
    [derived; formulas.md §3.5] (TV2: 4, 3, 2, 1)."""
    return np.minimum(_f(p) - r, m)


def interleaved_peak_chunks(p, m, v, g, r):
    """Peak in-flight chunks of Megatron interleaved 1F1B on rank r with group g:
    min(2(p - 1 - r) + (v - 1) g + 1, m v); divide by v for A units (rank 0 with g = p:
    p + (p - 1)/v). Megatron's combined 1F1B adds one chunk. [derived] (TV3: 11, 9, 7, 5)."""
    return np.minimum(2 * (_f(p) - 1 - r) + (_f(v) - 1) * g + 1, _f(m) * v)


def zb_h1_peak(p, r, gamma=0.0):
    """(peak in-flight micro-batches, peak pending W, peak memory at gamma) of ZB-H1 on rank r:
    (p - r, r + 1, (p - r) + gamma r). [derived] (TV4)."""
    r = _f(r)
    return p - r, r + 1, p - r + gamma * r


def zb_h2_peak(p, r, gamma=0.0):
    """(peak in-flight, peak pending W, peak memory at gamma) of ZB-H2 on rank r:
    (2(p - r) - 1, 2r + 1, 2(p - r) - 1 + 2 gamma r). [derived] (TV5)."""
    r = _f(r)
    return 2 * (p - r) - 1, 2 * r + 1, 2 * (p - r) - 1 + 2 * gamma * r


def interleaved_zero_bubble_peak_chunks(p, m, v, r):
    """Peak in-flight chunks of PyTorch interleaved zero bubble on rank r, m >= p:
    (v - 1) mpr + p - r with mpr = m // max(1, m // p); pending W up to r + 1 chunks.
    [derived] (TV7: 8, 7, 6, 5)."""
    m = np.asarray(m)
    mpr = m // np.maximum(1, m // p)
    return (_f(v) - 1) * mpr + p - _f(r)
