"""The schedule timeline: Chrome trace (json round trip, span = step time), Gantt PNG (skipped
without matplotlib), text strip (fits the width; GPipe's rows follow TV1's arithmetic)."""

from __future__ import annotations

import json
import sys
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.render.timeline import TimelineLabels, chrome_trace, gantt_png, text_strip, title
from planner.schedule import SCHEDULES, build_schedule, simulate

from .test_schedule_properties import random_times, valid_args


def _complete(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_trace_round_trips_and_names_the_ranks():
    result = simulate(build_schedule("interleaved-1f1b", 4, 8, 2), F=0.5, B=1.0, c=0.1)
    trace = json.loads(json.dumps(chrome_trace(result, {"layout": "tp2 pp4 vpp2 dp8",
                                                        "unit": ""})))
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert [names[r] for r in range(4)] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert {e["pid"] for e in trace["traceEvents"]} == {0}          # one process
    ops = [e for e in _complete(trace) if e["name"] in ("F", "B")]
    assert len(ops) == len(result.events) == 4 * 2 * 8 * 2
    assert all({"microbatch", "chunk"} <= set(e["args"]) for e in ops)
    assert {e["name"] for e in _complete(trace)} == {"F", "B", "idle", "p2p"}
    assert trace["otherData"]["schedule"] == "interleaved-1f1b"


def test_each_rank_row_partitions_the_step_and_p2p_lanes_never_overlap():
    result = simulate(build_schedule("1f1b", 4, 8), F=1, B=2, c=0.5)   # TV2 at c = 0.5: 41
    trace = chrome_trace(result, TimelineLabels(us_per_unit=1.0))
    rows = defaultdict(list)
    for e in _complete(trace):
        rows[e["tid"]].append((e["ts"], e["ts"] + e["dur"]))
    for tid, spans in rows.items():
        spans.sort()
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:]))   # no overlap
        if tid < 4:                                      # a rank: ops + idle tile [0, 41]
            assert spans[0][0] == 0 and spans[-1][1] == pytest.approx(41)
            assert sum(b - a for a, b in spans) == pytest.approx(41)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(SCHEDULES), p=st.integers(1, 4), m=st.integers(1, 8),
       v=st.integers(1, 3), seed=st.integers(0, 2**31), c=st.sampled_from([0.0, 0.2]))
def test_trace_span_equals_the_step_time(name, p, m, v, seed, c):
    import numpy as np
    p, m, v, g = valid_args(name, p, m, v)
    sched = build_schedule(name, p, m, v, g)
    result = simulate(sched, **random_times(sched, np.random.default_rng(seed)), c=c)
    events = _complete(json.loads(json.dumps(chrome_trace(result))))
    span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    assert span == pytest.approx(result.t_sync * 1e6, rel=1e-9)


def test_gantt_png_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    result = simulate(build_schedule("dualpipev", 4, 8, 2), F=1, I=1, W=1, FB=2.5, gamma=0.5)
    path = tmp_path / "timeline.png"
    gantt_png(result, TimelineLabels(layout="pp4 ep8", unit=""), path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) > 10_000


def test_gantt_without_matplotlib_is_a_one_line_import_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    result = simulate(build_schedule("1f1b", 2, 2), F=1, B=2)
    with pytest.raises(ImportError, match="plan3d\\[plot\\]") as err:
        gantt_png(result, None, tmp_path / "x.png")
    assert "\n" not in str(err.value)


def test_title_names_layout_schedule_and_step():
    result = simulate(build_schedule("1f1b", 4, 8), F=0.01, B=0.02)     # seconds
    assert title(result, {"layout": "tp8 pp4 dp16"}) == "tp8 pp4 dp16 | 1f1b | step 330 ms"


def test_gpipe_strip_follows_tv1():
    # TV1: rank 3 runs F0..F7 from 3 to 11, B0..B7 from 11 to 27, idle to 33; rank 0 runs
    # F0..F7 from 0 to 8 and its backwards back-to-back until 33 (8 x 2 from 17)
    result = simulate(build_schedule("gpipe", 4, 8), F=1, B=2)
    lines = text_strip(result, width=3 + 33)                   # "rN " + one column per unit
    assert lines[3] == "r3 " + "..." + "F" * 8 + "B" * 16 + "." * 6
    assert lines[0] == "r0 " + "F" * 8 + "." * 9 + "B" * 16
    assert lines[4].startswith("F fwd") and " ".join(lines[4:]).endswith("the pipeline 33")


@pytest.mark.parametrize("width", [8, 20, 40, 80, 132])
@pytest.mark.parametrize("name, v", [("zbv", 2), ("dualpipe", 1), ("interleaved-1f1b", 2)])
def test_text_strip_fits_the_width(name, v, width):
    sched = build_schedule(name, 4, 16, v)
    result = simulate(sched, F=1, I=1, W=1, FB=2.5)
    lines = text_strip(result, width)
    assert all(len(line) <= width for line in lines)      # the legend wrapped below the ranks
    assert all(len(line) == width for line in lines[:4]) and lines[4].startswith("F fwd")
    assert set("".join(line[3:] for line in lines[:4])) <= set("FBIWX.")


def test_text_strip_too_narrow_is_a_value_error():
    with pytest.raises(ValueError, match="no column"):
        text_strip(simulate(build_schedule("1f1b", 4, 4), F=1, B=1), width=3)
