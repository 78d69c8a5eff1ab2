"""Tables people can read: every command's output at 80 columns (what a pipe gets, and an
80-column terminal) cuts no number ('…') and no line is wider than 80; numbers of an estimate
appear whole; tied layouts share one row; costs carry their currency."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.cost.step import MEMORY_TERMS, TIME_TERMS, estimate_layout
from planner.render.console import out
from planner.layout import Layout
from planner.specs import TrainingSpec
from tests.conftest import wide_console

runner = CliRunner()
GIB = 2.0**30


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _check_80(text: str) -> None:
    assert "…" not in text, text
    wide = [line for line in _lines(text) if len(line) > 80]
    assert not wide, wide
    padded = [line for line in _lines(text) if line != line.rstrip()]
    assert not padded, padded


BLOOM = "bloom-176b-448-a100-80g-tp4pp14"


@pytest.fixture
def regress_drift(tmp_path):
    """A baseline where one case (bloom) recorded a 1% longer step and 1e9 B more memory than
    the shipped one; returns the command and the shipped (step, memory)."""
    import yaml
    case = yaml.safe_load(open("tests/golden/baseline.yaml"))["cases"][BLOOM]
    step, mem = float(case["time.step"]), float(case["memory.total"])
    head, _, tail = open("tests/golden/baseline.yaml").read().partition(f"  {BLOOM}:\n")
    lines = tail.split("\n")
    for i, line in enumerate(lines):
        if line and not line.startswith("    "):
            break  # the next case
        if line.startswith("    time.step: "):
            lines[i] = f"    time.step: {step * 1.01!r}"
        if line.startswith("    memory.total: "):
            lines[i] = f"    memory.total: {mem + 1e9!r}"
    (tmp_path / "b.yaml").write_text(head + f"  {BLOOM}:\n" + "\n".join(lines))
    return ["regress", "tests/golden/cases.yaml", "--baseline", str(tmp_path / "b.yaml")], step, mem


COMMANDS = [
    ["search", "--model", "175b", "--gpus", "512"],
    ["search", "--model", "175b", "--max-gpus", "1024", "--objective", "cost",
     "--price-per-gpu-hour", "2.5", "--top", "3"],
    ["search", "--model", "llama3-8b", "--gpus", "8"],
    ["search", "--model", "175b", "--gpus", "512", "--why-not", "tp=8,pp=8"],
    ["estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8", "--zero-stage", "1",
     "--sequence-parallel", "--recompute", "selective", "--vpp", "3"],
    ["sweep", "--model", "175b", "--gpus", "64:4096"],
    ["sweep", "--model", "175b", "--gpus", "256:512", "--global-batch-size", "768,1536"],
    ["accuracy"], ["models"], ["hardware"], ["frameworks"],
    ["estimate", "--model", "175b", "--gpus", "512", "--tp", "4", "--pp", "32", "--zero-stage", "1",
     "--recompute", "full", "--framework", "deepspeed", "--no-flash-attention"],  # merged middles
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:3]))
def test_every_number_whole_at_80_columns(args):
    assert out.width == 80  # tests see what a pipe sees
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    _check_80(res.stdout)


def test_regress_drift_table_at_80_columns(regress_drift):
    args, step_now, mem_now = regress_drift
    res = runner.invoke(app, args)
    assert res.exit_code == 1, res.output
    _check_80(res.stdout)
    lines = [[c.strip() for c in line.split("│")] for line in _lines(res.stdout) if "│" in line]
    step = next(i for i, c in enumerate(lines) if c[0] == "time.step")
    # the baseline says 1.01 x the step, now the step: a change of 1/1.01 - 1 = -0.9901%
    assert lines[step][1:] == [f"{step_now * 1.01:.2f} s", "-0.9901%"]
    assert lines[step + 1][1] == f"{step_now:.2f} s"
    mem = next(i for i, c in enumerate(lines) if c[0] == "memory.total")
    # the baseline says memory + 1e9 B, now the memory: -1e9 / (memory + 1e9)
    change = -1e9 / (mem_now + 1e9) * 100
    assert lines[mem][1:] == [f"{(mem_now + 1e9) / 2**30:.2f} GiB", f"{change:.3f}%"]
    assert lines[mem + 1][1] == f"{mem_now / 2**30:.2f} GiB"
    assert "e+" not in res.stdout  # one format: no '1.03e+10' beside '3271557120.0'


@pytest.mark.parametrize("args", COMMANDS[:3], ids=lambda a: " ".join(a[:3]))
def test_wide_terminal_uses_one_column_per_figure_and_cuts_nothing(args):
    with wide_console(200):
        res = runner.invoke(app, args)
    assert res.exit_code == 0 and "…" not in res.stdout
    assert "TFLOP/s/GPU" in res.stdout  # the wide layout's header


def test_estimate_numbers_appear_whole_in_an_80_column_console():
    from planner.render.console import PlainEndConsole

    from planner.render import breakdown
    m, hw = catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100")
    lay = Layout(tp=8, pp=8, dp=8, zero_stage=1, micro_batch_size=1, recompute="selective",
                 sequence_parallel=True, vpp=3)
    est = estimate_layout(m, hw, TrainingSpec(seq_length=2048, global_batch_size=1536), lay)
    buf = io.StringIO()
    console = PlainEndConsole(file=buf, width=80, highlight=False)  # plan3d's console class
    saved = breakdown.out
    breakdown.out = console
    try:
        breakdown.estimate_report(est)
    finally:
        breakdown.out = saved
    text = buf.getvalue()
    _check_80(text)
    cap = float(est.memory["capacity"][0])
    for term in MEMORY_TERMS:  # GiB to two decimals, share of the 80 GiB capacity
        v = float(est.memory[term][0])
        assert f"{v / GIB:.2f}" in text and f"{100 * v / cap:.1f}%" in text
    assert "shares of the GPU's 79.6 GiB" in text  # 81,559 MiB as nvidia-smi reports it
    step = float(est.time["step"][0])
    # one unit for the time column: seconds (the step is over 1 s), four decimals so that the
    # smallest positive term (a few ms: pipeline p2p) keeps two significant digits
    assert step > 1 and 0.001 < min(float(est.time[t][0]) for t in TIME_TERMS if est.time[t][0] > 0) < 0.01
    for term in TIME_TERMS:
        v = float(est.time[term][0])
        assert f"{v:.4f} s" in text and f"{100 * v / step:.1f}%" in text
    assert f"{step:.4f} s" in text
    assert " ms" not in text.split("Step time")[1].split("tokens/s")[0]
    assert f"{float(est.throughput['tokens_per_s'][0]):,.0f}" in text
    assert f"MFU {100 * float(est.throughput['mfu'][0]):.1f}%" in text


def test_tied_layouts_share_one_row_in_the_table_and_the_json():
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--json", "--top", "20"])
    assert res.exit_code == 0, res.output
    entries = json.loads(res.stdout)
    keys = [(e["time"]["step"], e["memory"]["total"]) for e in entries]
    assert len(set(keys)) == len(keys)  # one entry per (step time, memory)
    tied = [e for e in entries if e["ties"]["count"] > 1]
    assert tied  # llama3-8b on 8 GPUs: cp/dp/mbs permutations predict the same step and memory
    for e in tied:
        t = e["ties"]
        assert len(t["layouts"]) == t["count"] - 1
        for other in t["layouts"]:  # they differ from the entry only in the varying fields
            assert {k for k in other if other[k] != e["layout"][k]} <= set(t["varying"])
            # the same tokens per GPU per micro-batch: mbs / cp equal (sequence split over cp)
            assert other["micro_batch_size"] * e["layout"]["cp"] == \
                e["layout"]["micro_batch_size"] * other["cp"]
    table = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8"]).stdout
    n = tied[0]["ties"]["count"]
    assert f"×{n}" in table and "stand for several layouts" in table


def test_tie_groups_by_hand():
    from planner.cost import Estimate
    from planner.explain import tie_groups
    from planner.layout import Candidates
    lays = [Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1),
            Layout(tp=1, pp=1, dp=4, cp=2, zero_stage=1, micro_batch_size=2),
            Layout(tp=2, pp=1, dp=4, zero_stage=1, micro_batch_size=1),
            Layout(tp=1, pp=1, dp=2, cp=4, zero_stage=1, micro_batch_size=4)]
    est = Estimate(Candidates.from_layouts(lays), {"total": np.array([5.0, 5.0, 5.0, 6.0])},
                   {"step": np.array([1.0, 1.0, 2.0, 1.0])}, {})
    groups = tie_groups(est)  # (1 s, 5 B) twice, then (2 s, 5 B), then (1 s, 6 B)
    assert [g.members for g in groups] == [(0, 1), (2,), (3,)]
    assert groups[0].varying == ("dp", "micro_batch_size", "cp")  # Layout field order
    assert groups[1].varying == () and groups[1].count == 1


def test_costs_carry_their_currency():
    args = ["search", "--model", "175b", "--max-gpus", "512", "--objective", "cost",
            "--price-per-gpu-hour", "2", "--currency", "eur", "--top", "2"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    for e in json.loads(res.stdout):
        assert e["currency"] == "EUR"
        # cost = GPUs x T_train / 3600 s x 2 per GPU-hour, T_train = tokens / tokens_per_s
        th = e["throughput"]
        assert th["cost"] == pytest.approx(e["gpus"] * th["time_to_train_s"] / 3600 * 2)
    table = runner.invoke(app, args).stdout
    assert "EUR " in table
    bad = runner.invoke(app, [*args[:-2], "--currency", "euros"])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: --currency must be a three-letter")
    alone = runner.invoke(app, ["search", "--model", "175b", "--gpus", "512", "--currency", "EUR"])
    assert alone.exit_code == 2 and "--price-per-gpu-hour" in alone.stderr


def test_search_explanation_as_data(gpt3_h100):
    from planner.explain import explain_search
    from planner.search.run import search
    m, hw, tr = gpt3_h100
    result = search(m, hw, tr, 512)
    e = explain_search(result)
    p = e.pruning  # every layout is pruned by one rule or fits
    assert sum(p.pruned.values()) + p.fitting == p.enumerated
    assert sum(g.count for g in e.groups) == len(result.ranked)
    assert e.runner_up.row == 2 and e.runner_up.slower_by > 0
    step = float(result.ranked.time["step"][0])
    assert e.winner.step_s == step and 0 < e.winner.compute_share < 1
    if e.cp_fallback is not None and e.cp_fallback.row is not None:
        first = e.groups[e.cp_fallback.row - 1].first
        assert result.ranked.candidates.layout(first).cp == 1


def test_no_fit_error_declares_the_closest_miss():
    from planner.errors import NoFitError
    from planner.search.run import search
    m, hw = catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100")
    with pytest.raises(NoFitError) as info:
        search(m, hw, TrainingSpec(seq_length=2048, global_batch_size=8), 8)
    exc = info.value
    assert exc.usable == float(hw.gpu.hbm_capacity)  # no headroom: the whole HBM
    assert float(exc.closest.memory["total"][0]) > exc.usable
    assert NoFitError("x").closest is None and NoFitError("x").usable is None
