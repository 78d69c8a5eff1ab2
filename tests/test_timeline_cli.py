"""plan3d timeline, and --timeline on search and estimate: one step of a plan's pipeline schedule
as a Chrome trace that json.load reads, with one thread per pipeline rank and a span equal to the
predicted step, a PNG Gantt chart, a text strip; never over a file without --force; a missing
matplotlib or a step too long to draw is one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
# Llama 3 8B on 16 H100 with torchtitan, pp 4 as ZB-V (2 chunks per rank): m = 64 / 4 = 16
PLAN_ARGS = ("--model", "llama3-8b", "--gpus", 16, "--framework", "torchtitan",
             "--global-batch-size", 64, "--pp", 4, "--vpp", 2, "--pipeline-schedule", "zbv",
             "--dp", 4, "--micro-batch-size", 1)


def cli(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("timeline") / "plan.yaml"
    code, out, err = cli("search", *PLAN_ARGS, "--export", path)
    assert code == 0, err
    return path


def _span_and_threads(trace: Path):
    data = json.loads(trace.read_text())
    events = data["traceEvents"]
    names = [e["args"]["name"] for e in events if e.get("name") == "thread_name"]
    span = max(e["ts"] + e["dur"] for e in events if e["ph"] == "X")
    return data, names, span


def test_timeline_writes_a_trace_spanning_the_predicted_step(plan, tmp_path):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    code, out, err = cli("timeline", plan, "--trace", trace, "--png", png, "--width", 90)
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib missing: the PNG case is test_missing_matplotlib_is_one_line")
    assert code == 0, err
    data, names, span = _span_and_threads(trace)
    assert names == [f"rank {r}" for r in range(4)]            # one thread per rank, no p2p lane
    predicted = yaml.safe_load(plan.read_text())["estimate"]["time"]["step"]
    # ZB-V's step is the simulator's in the estimate too: the span is the plan's step, in us
    assert span == pytest.approx(predicted * 1e6, rel=1e-9)
    assert data["otherData"]["schedule"] == "zbv" and "schedule=zbv" in data["otherData"]["layout"]
    assert {e["name"] for e in data["traceEvents"] if e["ph"] == "X"} >= {"F", "I", "W", "idle",
                                                                         "optimizer step"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.splitlines()[0].startswith("r0 ") and max(map(len, out.splitlines()[:4])) <= 90


def test_no_overwrite_without_force_and_the_trace_alone(plan, tmp_path):
    trace = tmp_path / "t.json"
    assert cli("timeline", plan, "--trace", trace, "--no-png")[0] == 0
    code, _, err = cli("timeline", plan, "--trace", trace, "--no-png")
    assert code == 2 and err.count("\n") == 1 and "exists; pass --force" in err
    assert cli("timeline", plan, "--trace", trace, "--no-png", "--force")[0] == 0
    assert not (tmp_path / "t.png").exists()
    code, _, err = cli("timeline", plan, "--trace", plan, "--no-png", "--force")  # its own input
    assert code == 2 and err.count("\n") == 1


def test_missing_matplotlib_is_one_line(plan, tmp_path, monkeypatch):
    # a chart asked for by name needs matplotlib: one line, nothing written; the default chart
    # is left out and said so, the trace and the strip written (the README's set-up has no
    # extra 'plot')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    code, _, err = cli("timeline", plan, "--trace", tmp_path / "t.json", "--png", tmp_path / "t.png")
    assert code == 2 and err.count("\n") == 1 and "extra 'plot'" in err and "--no-png" in err
    assert not (tmp_path / "t.json").exists()
    code, out, err = cli("timeline", plan, "--trace", tmp_path / "t.json", "--width", 80)
    assert code == 0, err
    assert (tmp_path / "t.json").exists() and not (tmp_path / "plan.png").exists()
    assert "no Gantt chart: it needs matplotlib" in " ".join(err.split())
    assert out.startswith("r0 ") and max(map(len, out.splitlines())) <= 80


def test_a_strip_narrower_than_its_labels_is_one_line(plan, tmp_path):
    # 4 ranks: labels "r0 ".."r3 " take 3 columns, so 4 is the narrowest strip
    code, _, err = cli("timeline", plan, "--trace", tmp_path / "t.json", "--no-png", "--width", 3)
    assert code == 2 and err.count("\n") == 1 and "give at least 4" in err
    assert not (tmp_path / "t.json").exists()
    code, out, _ = cli("timeline", plan, "--trace", tmp_path / "t.json", "--no-png", "--width", 4)
    assert code == 0 and all(len(line) <= 4 for line in out.splitlines() if not line.startswith("Wrote"))


def test_a_step_too_long_to_draw_is_one_line(plan, tmp_path):
    # 4 ranks x 2 chunks x 16 micro-batches x 3 (F, I, W) = 384 ops
    code, _, err = cli("timeline", plan, "--trace", tmp_path / "t.json", "--no-png",
                       "--max-ops", 100)
    assert code == 2 and err.count("\n") == 1 and "384 ops" in err and "--max-ops" in err


def test_search_and_estimate_write_it_too(plan, tmp_path):
    trace = tmp_path / "s.json"
    code, out, err = cli("search", *PLAN_ARGS, "--top", 1, "--timeline", trace, "--json")
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib missing")
    assert code == 0, err
    json.loads(out)                                     # --json: stdout holds the JSON alone
    assert (tmp_path / "s.png").exists() and _span_and_threads(trace)[1] == [f"rank {r}" for r in range(4)]
    est = tmp_path / "e.json"
    code, out, err = cli("estimate", "--plan", plan, "--timeline", est)
    assert code == 0, err
    assert _span_and_threads(est)[2] == pytest.approx(_span_and_threads(trace)[2], rel=1e-12)
    code, _, err = cli("estimate", "--plan", plan, "--timeline", est)
    assert code == 2 and "exists; pass --force" in err
