"""Kinds of output mistakes, one test per kind, across the commands that can make them: a share
printed beside the step that is not a share of it, a rule named after another framework, units
mixed on one screen, a baseline rewrite that calls new entries changed, tied rows that hide
their layouts, --json without a figure its table prints, a README sentence that is not true."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from planner import catalog, fmt
from planner.cli import app
from planner.layout import Candidates, Layout
from planner.specs import TrainingSpec

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _ok(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


# ------------------------------------------------------------------ a column beside "step"

def test_bubble_beside_the_step_is_a_share_of_the_step():
    # GPT-3 175B on 512 GPUs with a batch of 7: at most 7 micro-batches for 32 stages, so the
    # bubble over the busiest stage's work, (pp - 1)/m = 31/7 for equal stages, is over 400%.
    # Beside the step it is a share of the step: bubble / step <= (pp-1)/(m+pp-1) with vpp 1
    # (the step is at least (m + pp - 1) micro-batch times, the bubble (pp - 1) of them).
    args = ["search", "--model", "175b", "--gpus", "512", "--global-batch-size", "7", "--top", "3"]
    entries = json.loads(_ok(args + ["--json"]))
    text = _ok(args)
    for e in entries:
        t, lay = e["time"], e["layout"]
        m = 7 // (lay["dp"] * lay["micro_batch_size"])
        assert t["bubble_share"] == pytest.approx(t["bubble"] / t["step"], rel=1e-12)
        assert 0 <= t["bubble_share"] <= 1
        if lay["vpp"] == 1:
            assert t["bubble_share"] <= (lay["pp"] - 1) / (m + lay["pp"] - 1) + 1e-9
        assert t["bubble_fraction"] > 1  # the old meaning, kept under its key, is not a share
        assert fmt.percent(t["bubble_share"]) in text
    shown = [float(x) for x in re.findall(r"│\s+([\d.]+)% │\s+[\d,]+ │", text)]
    assert len(shown) == len(entries) and all(v <= 100 for v in shown)
    # estimate says which is which
    est = _ok(["estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "32", "--cp", "2",
               "--zero-stage", "1", "--sequence-parallel", "--global-batch-size", "7"])
    assert re.search(r"bubble [\d.]+% of the step \([\d.]+% of the busiest stage's work\)", est)


# ------------------------------------------------------------------ rule names

def test_every_rule_is_named_after_its_own_framework_or_none():
    # a search for DeepSpeed or torchtitan printed "... interleaved as Megatron-Core allows": a
    # rule's name names the framework whose rule it is, or none (the rules every framework
    # shares); checked on layouts that make the conditional rules appear (an interleaved uneven
    # split, activation offload), for a dense and an MoE model, under every shipped profile
    from planner.search.framework_rules import framework_masks
    from planner.search.rules import constraint_masks
    from planner.search.software_rules import software_masks
    profiles = catalog.framework_profiles().values()
    displays = {p.display for p in profiles} | {"Megatron-LM", "Megatron-Core", "DeepSpeed"}
    c = Candidates.from_layouts([
        Layout(tp=2, pp=4, dp=1, zero_stage=1, micro_batch_size=1, vpp=2, first_stage_layers=1,
               last_stage_layers=1),
        Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1, offload_layers=1)])
    for model in (catalog.resolve_model("175b"), catalog.resolve_model("mixtral-8x7b")):
        for p in profiles:
            tr = TrainingSpec(seq_length=4096, global_batch_size=64, framework=p.name)
            hw = catalog.resolve_hardware("dgx-h100")
            names = constraint_masks(model, tr, hw, c, framework=p)
            own = {**framework_masks(p, model, tr, c), **software_masks(p, model, tr, c, hw)}
            for name in names:
                named = {d for d in displays if d in name}
                if name in own:  # its own display (or the family name it begins with) only
                    assert all(p.display.startswith(d) for d in named), (p.name, name)
                else:
                    assert not named, (p.name, name)


# ------------------------------------------------------------------ units on one screen

def test_sizes_are_binary_and_each_duration_column_has_one_unit():
    # GPT-3 175B at tp=8 pp=8, dp*cp = 8: the checkpoint is 14 B x 174,615,846,912 =
    # 2,444,621,856,768 B = 2.223 TiB; TP rank 0 of pipeline rank 0 writes 4,939,780,608 B =
    # 4.601 GiB (tests/test_checkpoint.py derives both)
    text = _ok(["estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8",
                "--zero-stage", "1", "--sequence-parallel", "--recompute", "selective", "--vpp", "3"])
    assert "2.223 TiB in all" in text and "4.601 GiB from the GPU" in text
    assert not re.search(r"\d (kB|MB|GB|TB|PB)(?!/s)\b", text)  # decimal only for bandwidths
    # the sweep's train column: 8 to 4,096 GPUs on 3e12 tokens spans 2.5 years to a few weeks
    args = ["sweep", "--model", "175b", "--gpus", "64:4096", "--tokens", "3e12"]
    rows = [r for r in json.loads(_ok(args + ["--json"])) if not r.get("error")]
    text = _ok(args)
    days = [r["time_to_train_s"] / 86400 for r in rows]
    assert max(days) > 365 and min(days) < 100  # years and days would both read best
    for d in days:
        assert f"{d:,.1f} days" in text
    assert "years" not in text
    # the winner's step bars: one unit
    bars = _ok(["search", "--model", "175b", "--gpus", "512", "--top", "1"]).split(
        "Winner's step time")[1].split("Winner's memory")[0]
    units = set(re.findall(r"│\s+[\d,.]+ (ms|s|h|days) │", bars))
    assert len(units) == 1, bars
    assert fmt.duration_unit([2000 * 86400, 5 * 86400]) == ("days", 1)
    assert fmt.duration_unit([0.0153, 12.3]) == ("s", 3)  # 0.015 s keeps two digits


def test_mfu_of_an_fp8_run_says_which_peak():
    args = ["search", "--model", "llama3-8b", "--gpus", "8", "--top", "1"]
    assert "BF16 peak" not in _ok(args)
    text = _ok(args + ["--precision", "fp8"])
    assert "MFU is against the dense BF16 peak (989 TFLOP/s per GPU)" in " ".join(text.split())


# ------------------------------------------------------------------ regress --update

def test_a_new_baseline_has_new_entries_not_changed_ones(tmp_path):
    from planner.regress import baseline_diff
    old = {"a": {"status": "ok", "x": 1.0, "gone": 2.0}, "b": {"status": "ok"}}
    new = {"a": {"status": "ok", "x": 1.5, "added": 3.0}, "c": {"status": "ok", "y": 1.0}}
    d = baseline_diff(old, new)
    # a: x changed, gone removed, added new; b removed (its status entry); c new (2 entries)
    assert (d.new, d.changed, d.removed) == (3, 1, 2)
    assert (d.cases_new, d.cases_changed, d.cases_removed) == (1, 1, 1)
    cases = tmp_path / "cases.yaml"
    cases.write_text("- name: a\n  model: llama3-8b\n  gpus: 8\n"
                     "  layout: {tp: 1, pp: 1, zero_stage: 1, micro_batch_size: 1}\n")
    base = tmp_path / "base.yaml"
    first = _ok(["regress", str(cases), "--baseline", str(base), "--update"])
    entries = len([line for line in base.read_text().splitlines() if line.startswith("    ")])
    assert f"entries: {entries} new, 0 changed, 0 removed" in " ".join(first.split())
    assert "cases: 1 new, 0 changed, 0 removed" in " ".join(first.split())
    again = json.loads(_ok(["regress", str(cases), "--baseline", str(base), "--update", "--json"]))
    assert again["entries"] == {"new": 0, "changed": 0, "removed": 0} and again["entries_changed"] == 0


# ------------------------------------------------------------------ tied rows

def test_a_tied_row_lists_the_layouts_it_stands_for():
    args = ["search", "--model", "llama3-8b", "--gpus", "8", "--top", "6"]
    entries = json.loads(_ok(args + ["--json"]))
    text = " ".join(_ok(args).split())
    tied = [(n, e) for n, e in enumerate(entries, start=1) if e["ties"]["count"] > 1]
    assert tied
    for n, e in tied:
        assert f"#{n} ×{e['ties']['count']}" in text
        for other in e["ties"]["layouts"][:3]:
            assert Layout(**other).short() in text


def test_a_tie_group_beyond_three_layouts_says_how_many_more():
    from planner.explain import TieGroup
    from planner.render.search import _ties_text
    c = Candidates.from_layouts([Layout(tp=1, pp=1, dp=8 // k, cp=k, zero_stage=1,
                                        micro_batch_size=k) for k in (1, 2, 4, 8)] * 2)
    lines = _ties_text([TieGroup(tuple(range(7)), ("cp", "dp", "micro_batch_size"))], c)
    assert "and 3 more (--json lists them all)" in lines[1]  # 6 others, 3 listed
    assert lines[1].count("tp=1") == 3


# ------------------------------------------------------------------ --json carries the table

def test_models_json_has_the_parameter_counts_the_table_prints():
    entries = {m["name"]: m for m in json.loads(_ok(["models", "--json"]))}
    # published: DeepSeek-V3 671B total / 37B active; Mixtral 8x7B 46.7B / 12.9B (both
    # embedding matrices counted: planner.cost.model_counts)
    assert entries["deepseek-v3"]["total_params"] == 671_026_404_352
    assert 37e9 < entries["deepseek-v3"]["active_params"] < 38e9
    assert entries["mixtral-8x7b"]["total_params"] == 46_702_792_704
    assert round(entries["mixtral-8x7b"]["active_params"] / 1e9, 1) == 12.9
    dense = entries["llama3-8b"]
    assert dense["total_params"] == dense["active_params"]
    table = _ok(["models"])
    for m in entries.values():
        assert fmt.params(m["total_params"]) in table


def test_search_json_has_every_figure_of_its_table():
    entry = json.loads(_ok(["search", "--model", "llama3-8b", "--gpus", "8", "--top", "1",
                            "--tokens", "1e12", "--json"]))[0]
    figures = {"mem/GPU": entry["memory"]["total"], "step": entry["time"]["step"],
               "bubble": entry["time"]["bubble_share"], "MFU": entry["throughput"]["mfu"],
               "tokens/s": entry["throughput"]["tokens_per_s"],
               "TFLOP/s": entry["throughput"]["model_tflops_per_gpu"],
               "train": entry["throughput"]["time_to_train_s"], "GPUs": entry["gpus"]}
    assert all(isinstance(v, (int, float)) for v in figures.values()), figures


# ------------------------------------------------------------------ README

def test_readme_says_what_ci_installs():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = " ".join((ROOT / "README.md").read_text().split())
    torch = re.findall(r"pip install (torch\S*)(.*)", ci)
    assert torch, ci
    sentence = readme[readme.index("`.ci/run` runs"):][:700]
    for spec, rest in torch:
        assert f"pip install {spec}" in sentence
        if "/whl/cpu" not in rest:  # nothing in the command asks for the CPU build
            assert "installs the CPU build" not in sentence
            assert "CUDA" in sentence  # what PyPI alone gives


def test_no_decimal_size_left_in_the_formatters():
    assert not hasattr(fmt, "decimal_bytes")
    assert fmt.binary_bytes(2_444_621_856_768) == "2.223 TiB"
    assert np.isclose(2_444_621_856_768 / 2**40, 2.2234, atol=1e-4)
