"""plan3d regress: the shipped golden cases against the shipped baseline, that the check bites
when one formula term moves, the stable baseline text, and cases the planner cannot evaluate."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from planner import baseline as bl
from planner import catalog
from planner.cli import app
from planner.cost import compute, memory, pipeline
from planner.cost.model_counts import total_params
from planner.regress import Change, compare, count_changed, evaluate_case, evaluate_cases, load_cases

GOLDEN = Path(__file__).parent / "golden"
CASES = GOLDEN / "cases.yaml"
BASELINE = GOLDEN / "baseline.yaml"


@pytest.fixture(scope="module")
def cases():
    return load_cases(CASES)


@pytest.fixture(scope="module")
def shipped():
    return bl.read(BASELINE)


@pytest.fixture(scope="module")
def current(cases):
    return evaluate_cases(cases)


def _drifted(changes: list[Change]) -> set[str]:
    return {c.case for c in changes}


# ----------------------------------------------------------------------------- the shipped set


def test_shipped_cases_match_shipped_baseline(current, shipped):
    changes = compare(shipped, current, rtol=1e-6)
    assert changes == [], (
        "predictions moved; if intended run `plan3d regress tests/golden/cases.yaml --baseline "
        f"tests/golden/baseline.yaml --update` and commit the diff. First: {changes[:5]}")
    assert all(v["status"] == "ok" for v in current.values())


def test_cli_clean_run_exits_0():
    result = CliRunner().invoke(app, ["regress", str(CASES), "--baseline", str(BASELINE)])
    assert result.exit_code == 0, result.output
    assert "match" in result.output


def test_shipped_cases_cover_catalogs_and_knobs(cases, shipped):
    models = {catalog.resolve_model(c.model).name for c in cases}
    # a new catalog model needs a golden case
    assert models == set(catalog.models())
    profiles = {catalog.resolve_hardware(c.hardware).name for c in cases}
    assert profiles == set(catalog.hardware_profiles())
    layouts = [c for c in cases if c.layout is not None]
    searches = [c for c in cases if c.search is not None]
    assert 2 <= len(searches) <= 5
    # every precision, by layout case (training.precision; bf16 when not set)
    assert {c.training.get("precision", "bf16") for c in layouts} == {"bf16", "fp8", "fp8-blockwise",
                                                                     "mxfp8"}
    knob = lambda k: {c.layout[k] for c in layouts}  # noqa: E731
    assert knob("zero_stage") == {0, 1, 2, 3}
    assert knob("recompute") == {"none", "selective", "full"}
    assert knob("sequence_parallel") == {False, True}
    assert 1 in knob("vpp") and max(knob("vpp")) > 1
    assert 1 in knob("pp") and max(knob("pp")) > 1
    assert 1 in knob("tp")
    assert any(c.layout["tp"] > catalog.resolve_hardware(c.hardware).gpus_per_node for c in layouts)
    sizes = [total_params(catalog.resolve_model(c.model)) for c in layouts]
    assert min(sizes) < 2e9 and max(sizes) >= 1e12  # a tiny and a 1T model
    assert any(shipped[c.name]["memory.fits"] is False for c in layouts)
    assert any(shipped[c.name]["memory.fits"] is True for c in layouts)


# ----------------------------------------------------------------------------- it bites


def _uses_pp(case, base: dict) -> bool:
    """Does this case evaluate a pipeline with pp > 1 (a layout, or any ranked search layout)?"""
    if case.layout is not None:
        return case.layout["pp"] > 1
    return any(v > 1 for k, v in base.items() if k.endswith(".layout.pp"))


def test_perturbed_bubble_drifts_exactly_the_pipelined_cases(cases, shipped, monkeypatch):
    # Both schedule functions: pipeline_time (uneven splits) and even_pipeline_time.
    for name in ("pipeline_time", "even_pipeline_time"):
        def bubble_plus_1pct(*args, _original=getattr(pipeline, name)):
            t, bubble = _original(*args)
            return t + 0.01 * bubble, 1.01 * bubble

        monkeypatch.setattr(pipeline, name, bubble_plus_1pct)
    changes = compare(shipped, evaluate_cases(cases), rtol=1e-6)
    expected = {c.name for c in cases if _uses_pp(c, shipped[c.name])}
    assert 0 < len(expected) < len(cases)
    assert _drifted(changes) == expected
    # Every moved bubble term moved by exactly the 1% injected (bubble > 0 whenever pp > 1).
    bubbles = [c for c in changes if c.term.endswith("time.bubble")]
    assert {c.case for c in bubbles} == expected
    assert all(c.rel == pytest.approx(0.01, rel=1e-6) for c in bubbles)


def test_perturbed_optimizer_time_drifts_every_case_by_one_percent(cases, shipped, monkeypatch):
    original = compute.optimizer_time
    monkeypatch.setattr(compute, "optimizer_time",
                        lambda p, hw, training=None, buffer=None, linear=None: 1.01 * original(
                            p, hw, training, buffer, linear))
    changes = compare(shipped, evaluate_cases(cases), rtol=1e-6)
    assert _drifted(changes) == {c.name for c in cases}
    opt = [c for c in changes if c.term == "time.optimizer"]
    assert len(opt) == sum(1 for c in cases if c.layout is not None)
    assert all(c.rel == pytest.approx(0.01, rel=1e-6) for c in opt)


def test_perturbed_transient_memory_drifts_only_sp_or_zero3_layouts(cases, shipped, monkeypatch):
    # transient_bytes = SP all-gather buffer + ZeRO-3 gathered layers + MoE dispatch buffers:
    # zero unless SP, ZeRO-3 or an MoE model.
    original = memory.transient_bytes
    monkeypatch.setattr(memory, "transient_bytes", lambda *a: 1.01 * original(*a))
    changes = compare(shipped, evaluate_cases(cases), rtol=1e-6)
    layouts = [c for c in cases if c.layout is not None]
    expected = {c.name for c in layouts
                if c.layout["sequence_parallel"] or c.layout["zero_stage"] == 3
                or catalog.resolve_model(c.model).moe is not None}
    assert 0 < len(expected) < len(layouts)
    assert _drifted(changes) & {c.name for c in layouts} == expected


def test_cli_reports_drift_as_table_and_exits_1(monkeypatch):
    original = compute.optimizer_time
    monkeypatch.setattr(compute, "optimizer_time",
                        lambda p, hw, training=None, buffer=None, linear=None: 1.01 * original(
                            p, hw, training, buffer, linear))
    result = CliRunner().invoke(app, ["regress", str(CASES), "--baseline", str(BASELINE)])
    assert result.exit_code == 1
    assert "Predictions that moved" in result.output
    assert "time.optimizer" in result.output and "+1.000%" in result.output
    # A tolerance above the 1% change (time.optimizer itself moved 1%) passes.
    result = CliRunner().invoke(app, ["regress", str(CASES), "--baseline", str(BASELINE),
                                      "--rtol", "0.0101"])
    assert result.exit_code == 0, result.output


# ----------------------------------------------------------------------------- stable text


def test_format_float_hand_values():
    assert bl.format_float(80.0) == "80.0"
    assert bl.format_float(80 * 2.0**30) == "8.589934592e+10"  # 85899345920 has 11 digits
    assert bl.format_float(1e16) == "1.0e+16"  # the dot makes YAML 1.1 read a float
    assert bl.format_float(0.1 + 0.2) == "0.3"  # 0.30000000000000004 at 10 digits
    assert bl.format_float(2.0 / 3.0) == "0.6666666667"
    assert bl.format_float(math.inf) == ".inf"
    for text in ("80.0", "8.589934592e+10", "1.0e+16", ".inf"):
        assert isinstance(yaml.safe_load(text), float)


def test_baseline_text_is_byte_stable(tmp_path, current):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    bl.write(a, current)
    bl.write(b, bl.read(a))  # load and write again
    assert a.read_bytes() == b.read_bytes()
    bl.write(a, current)
    assert a.read_bytes() == b.read_bytes()
    assert bl.read(a) == current  # values are stored rounded, so they compare equal


def test_baseline_text_sorted_one_block_per_case():
    results = {"b": {"z": 1.5, "a": True, "search.pruned.tp within a node (x)": 3},
               "a": {"status": "ok", "n": np.float64(2.0) / 3}}
    text = bl.dumps(results)
    body = text.split("cases:\n", 1)[1]
    assert body == ('\n  a:\n    n: 0.6666666667\n    status: "ok"\n'
                    '\n  b:\n    a: true\n    "search.pruned.tp within a node (x)": 3\n    z: 1.5\n')
    assert bl.loads(text, "t") == {"a": {"status": "ok", "n": 0.6666666667},
                                   "b": {"z": 1.5, "a": True, "search.pruned.tp within a node (x)": 3}}


def test_evaluating_twice_gives_identical_results(cases, current):
    assert evaluate_cases(cases[:3]) == {c.name: current[c.name] for c in cases[:3]}


# ----------------------------------------------------------------------------- comparison rules


def test_compare_rules_hand_values():
    base = {"c": {"status": "ok", "t": 200.0, "z": 0.0, "f": True, "gone": 1.0, "message": "x"}}
    cur = {"c": {"status": "ok", "t": 201.0, "z": 0.0, "f": False, "new": 2.0, "message": "y"}}
    # |201 - 200| / 200 = 0.005
    loose = compare(base, cur, rtol=0.01)
    assert [(c.term, c.kind) for c in loose] == [("f", "moved"), ("gone", "removed"), ("new", "added")]
    tight = compare(base, cur, rtol=0.001)
    moved = [c for c in tight if c.term == "t"]
    assert moved[0].rel == pytest.approx(0.005, rel=1e-12)
    assert compare({"c": {"status": "ok", "z": 0.0}}, {"c": {"status": "ok", "z": 1e-30}},
                   rtol=1e-6)[0].rel == math.inf
    kinds = {c.kind for c in compare({"x": {"status": "ok"}}, {"y": {"status": "ok"}}, 1e-6)}
    assert kinds == {"case_added", "case_removed"}
    # --update counts every line of the file that changes: t, f, gone, new and message.
    assert count_changed(base, cur) == (5, 1)


# ----------------------------------------------------------------------------- cases that fail


def _case_file(tmp_path: Path, cases: list[dict]) -> Path:
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump(cases, sort_keys=False))
    return path


GOOD = {"name": "tiny", "model": "megatron-1.7b", "hardware": "dgx-a100-80g", "gpus": 8,
        "layout": {"tp": 1, "pp": 1, "dp": 8, "zero_stage": 1, "micro_batch_size": 4,
                   "recompute": "none", "sequence_parallel": False, "vpp": 1}}


def test_removed_model_is_reported_not_crashed(tmp_path):
    runner = CliRunner()
    cases = _case_file(tmp_path, [GOOD, {**GOOD, "name": "renamed", "model": "megatron-1.7b"}])
    base = tmp_path / "baseline.yaml"
    assert runner.invoke(app, ["regress", str(cases), "--baseline", str(base), "--update"]).exit_code == 0
    # The catalog no longer knows the model the second case names.
    cases = _case_file(tmp_path, [GOOD, {**GOOD, "name": "renamed", "model": "megatron-1.7b-old"}])
    result = runner.invoke(app, ["regress", str(cases), "--baseline", str(base), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert [(c["case"], c["kind"], c["before"], c["after"]) for c in report["changes"]] == \
        [("renamed", "status", "ok", "error")]
    assert "unknown model 'megatron-1.7b-old'" in report["changes"][0]["message"]
    # Recording the failure on purpose makes the run clean again, and says what changed.
    result = runner.invoke(app, ["regress", str(cases), "--baseline", str(base), "--update"])
    assert result.exit_code == 0 and "recorded as error" in result.output
    assert runner.invoke(app, ["regress", str(cases), "--baseline", str(base)]).exit_code == 0


def test_rule_breaking_layout_is_a_status_and_cross_node_tp_opt_in():
    from planner.regress import Case
    tp16 = {**GOOD, "model": "gpt3-175b", "hardware": "dgx-h100", "gpus": 512,
            "layout": {**GOOD["layout"], "tp": 16, "pp": 4, "dp": 8, "micro_batch_size": 1}}
    out = evaluate_case(Case.model_validate(tp16))
    assert out["status"] == "error" and "tp within the NVLink domain" in out["message"]
    out = evaluate_case(Case.model_validate({**tp16, "allow_cross_node_tp": True}))
    assert out["status"] == "ok" and out["memory.fits"] in (True, False)


def test_layout_that_does_not_fit_is_a_valid_case(shipped):
    case = shipped["gpt3-175b-64-a100-40g-does-not-fit"]
    assert case["status"] == "ok" and case["memory.fits"] is False
    assert case["memory.total"] > case["memory.capacity"]


def test_model_file_paths_are_relative_to_the_case_file(tmp_path):
    # A user's own model YAML next to the case file, referenced by a relative path; the case is
    # the catalog's megatron-1.7b under another name, so it must predict the same numbers.
    spec = yaml.safe_load((catalog.catalog_dir("models") / "megatron-1.7b.yaml").read_text())
    (tmp_path / "plans").mkdir()
    (tmp_path / "plans" / "mine.yaml").write_text(yaml.safe_dump({**spec, "name": "mine", "aliases": []}))
    cases = load_cases(_case_file(tmp_path / "plans", [GOOD, {**GOOD, "name": "mine", "model": "mine.yaml"}]))
    out = evaluate_cases(cases)
    assert out["mine"]["status"] == "ok"
    assert out["mine"] == out["tiny"]


def test_cli_usage_errors_exit_2(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["regress", str(CASES), "--baseline", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "not found" in missing.output and "--update" in missing.output
    assert len(missing.output.strip().splitlines()) == 1
    # --update refuses to overwrite a file that is not a baseline (here: the case file itself).
    cases = _case_file(tmp_path, [GOOD])
    before = cases.read_bytes()
    clobber = runner.invoke(app, ["regress", str(cases), "--baseline", str(cases), "--update"])
    assert clobber.exit_code == 2 and cases.read_bytes() == before
    dup = _case_file(tmp_path, [GOOD, GOOD])
    result = runner.invoke(app, ["regress", str(dup), "--baseline", str(tmp_path / "b.yaml"), "--update"])
    assert result.exit_code == 2 and "duplicate case name 'tiny'" in result.output
    both = _case_file(tmp_path, [{**GOOD, "search": {"top": 3}}])
    result = runner.invoke(app, ["regress", str(both), "--baseline", str(tmp_path / "b.yaml"), "--update"])
    assert result.exit_code == 2 and "exactly one of 'layout' or 'search'" in result.output


def test_real_entry_point_missing_baseline_is_one_line_on_stderr(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", "regress",
                           str(CASES), "--baseline", str(tmp_path / "none.yaml")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: baseline ") and len(proc.stderr.splitlines()) == 1
