"""Ties by the error band and the pick inside the top tie group (planner.search.ties), by hand on
three or four layouts, and on the README's jobs through the search."""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.errors import UsageError
from planner.layout import Candidates, Layout
from planner.search import ties
from planner.search.options import SearchOptions, search_options
from planner.search.run import search
from planner.specs import TrainingSpec

GIB = 2**30


def _est(zero=(1, 1, 1, 1), memory=(50, 50, 50, 50)):
    c = Candidates.from_layouts([Layout(tp=8, pp=p, dp=8 // p, zero_stage=z, micro_batch_size=1)
                                 for z, p in zip(zero, (1, 2, 4, 8))])
    n = len(zero)
    return SimpleNamespace(candidates=c, memory={"total": np.array(memory, float) * GIB,
                                                 "capacity": np.full(n, 80.0 * GIB)})


def _features(roomy, unchecked=(0, 0, 0, 0), marks=(0, 0, 0, 0), pp=(1, 2, 4, 8), below=(0, 0, 0, 0),
              above=(0, 0, 0, 0)):
    n = len(roomy)
    return ties.Features(np.zeros(n), np.array(roomy, bool), {}, np.array(unchecked), {},
                         np.array(marks), np.array(pp), np.array(below, float), np.array(above, float))


TIE = math.log(1.05)  # a 5 % tie band


def test_the_group_forms_around_the_best_roomy_layout_and_picks_it_first():
    # A (score 100) leaves too little free; B (98) is the best roomy one: the reference.
    # A: ln(100/98) = 0.020 <= ln 1.05 = 0.049, a member; C (90): ln(98/90) = 0.085, out; D (97.9) in.
    score = np.array([100.0, 98.0, 90.0, 97.9])
    feats = _features([False, True, True, True])
    t = ties.tie_order(_est(), score, np.arange(4), feats, TIE, 0.1, strict=False)
    assert t.reference == 1 and t.fastest == 0 and t.group == 3
    assert list(t.order) == [1, 3, 0, 2]  # roomy B, D (by pp: 2 < 8), then A; C after the group
    assert t.deciding == ("headroom",)


def test_strict_ranking_is_the_score_alone():
    score = np.array([100.0, 98.0, 90.0, 97.9])
    t = ties.tie_order(_est(), score, np.arange(4), _features([False, True, True, True]), TIE, 0.1,
                       strict=True)
    assert list(t.order) == [0, 1, 3, 2] and t.group == 1


def test_an_unchecked_terms_widening_lets_a_slower_layout_tie():
    # C is 100/90 - 1 = 11.1 % slower than the reference A: out at 5 %, in when its step may be
    # 6 % lower: ln 1.05 + ln 1.06 = 0.107 >= ln(100/90) = 0.105
    score = np.array([100.0, 98.0, 90.0, 50.0])
    t = ties.tie_order(_est(), score, np.arange(4), _features([True] * 4), TIE, 0.1, strict=False)
    assert set(t.order[:t.group]) == {0, 1}
    feats = _features([True, True, True, True], below=(0, 0, 0.06, 0))
    t = ties.tie_order(_est(), score, np.arange(4), feats, TIE, 0.1, strict=False)
    assert set(t.order[:t.group]) == {0, 1, 2}


def test_preferences_in_order_checked_then_conventional_then_fewer_stages_then_speed():
    score = np.array([100.0, 99.0, 98.0, 97.0])
    base = dict(roomy=[True] * 4)
    t = ties.tie_order(_est(), score, np.arange(4), _features(**base, unchecked=(1, 0, 0, 0)), TIE, 0.1, False)
    assert t.order[0] == 1 and t.deciding == ("checked",)  # fewer unchecked terms beats speed
    t = ties.tie_order(_est(), score, np.arange(4), _features(**base, marks=(1, 1, 0, 0)), TIE, 0.1, False)
    assert t.order[0] == 2 and t.deciding == ("conventional",)
    t = ties.tie_order(_est(), score, np.arange(4), _features(**base, pp=(8, 4, 4, 2)), TIE, 0.1, False)
    assert t.order[0] == 3 and t.deciding == ("fewer pipeline stages",)
    t = ties.tie_order(_est(), score, np.arange(4), _features(**base, pp=(2, 2, 2, 2)), TIE, 0.1, False)
    assert t.order[0] == 0 and t.deciding == ()  # all equal: the fastest


def test_min_free_and_strict_rank_are_search_options():
    hw = catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=2048, global_batch_size=64)
    assert search_options(hw, tr, {"min_free": 0.2}).min_free == 0.2
    assert search_options(hw, tr, {"strict_rank": True}).strict_rank
    with pytest.raises(UsageError, match="min-free"):
        search_options(hw, tr, {"min_free": 1.5})
    code = CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512", "--min-free", "110%"])
    assert code.exit_code == 2 and "--min-free must be a share of HBM" in code.output


# The README's main job and the modern examples: the pick leaves at least the --min-free share
# and is the first of the top tie group (issue: recommendations a practitioner trusts).
EXAMPLES = [("gpt3-175b", 512, "dgx-h100", {}), ("llama3-70b", 64, "dgx-h100", {"global_batch_size": 128}),
            ("llama3-405b", 16384, "dgx-h100", {}), ("deepseek-v3", 1024, "dgx-h100", {}),
            ("qwen3-235b-a22b", 256, "dgx-h100", {}), ("gpt-oss-120b", 64, "dgx-b200", {})]


@pytest.mark.parametrize("name, gpus, hw_name, job", EXAMPLES)
def test_the_pick_leaves_the_free_share_and_leads_its_tie_group(name, gpus, hw_name, job):
    model, hw = catalog.resolve_model(name), catalog.resolve_hardware(hw_name)
    from planner.cli.app import _training
    _, tr = _training(model, job.get("global_batch_size"), None, {})
    result = search(model, hw, tr, gpus)
    assert not result.strict and result.tie_group >= 1
    f = result.features
    assert f.roomy[0] and f.free[0] >= result.min_free  # the free share it promises
    strict = search(model, hw, tr, gpus, SearchOptions(strict_rank=True))
    fastest = float(strict.ranked.time["step"][0])
    # within the tie band of the best roomy layout (the reference), which is no faster than the fastest
    ref = float(result.ranked.time["step"][result.reference])
    assert ref >= fastest * (1 - 1e-12)
    assert math.log(float(result.ranked.time["step"][0]) / ref) <= \
        result.tie_band + math.log1p(f.below[0] + f.above[result.reference]) + 1e-12


def test_the_tie_line_and_the_bands_line_or_strict_rank_say_what_they_did():
    runner = CliRunner()
    args = ["search", "--model", "llama2-7b", "--gpus", "16", "--top", "3"]
    out = runner.invoke(app, args).output
    assert "Bands: measured step -" in out and "Tie: " in out and "--min-free" in out
    strict = runner.invoke(app, args + ["--strict-rank"]).output
    assert "Tie: " not in strict and "Ranked strictly by the objective (--strict-rank)" in strict


def test_fp8_slower_than_bf16_is_explained_term_by_term():
    # Qwen3-30B-A3B on 8 H100 under torchtitan in FP8 (torchao casts weights at every use):
    # predicted slower than BF16 on the same layout; the terms, FP8 minus BF16, add up to it
    from planner.cli.app import _training
    from planner.cost.step import estimate_layout
    from planner.explain import precision_loss
    model, hw = catalog.resolve_model("qwen3-30b-a3b"), catalog.resolve_hardware("dgx-h100")
    _, tr = _training(model, None, None, {"framework": "torchtitan", "precision": "fp8"})
    result = search(model, hw, tr, 8)
    loss = precision_loss(model, hw, tr, result.ranked, 0)
    assert loss is not None and loss.step > loss.bf16_step
    assert sum(s for _, s, _ in loss.terms) == pytest.approx(loss.step - loss.bf16_step, rel=1e-9)
    names = [t for t, _, _ in loss.terms]
    assert names[0].startswith("FP8 quantize and cast kernels")  # the largest: the casts
    assert any(t == "linear GEMMs at the FP8 peak" and s < 0 for t, s, _ in loss.terms)
    bf16 = tr.model_copy(update={"precision": "bf16"})
    assert precision_loss(model, hw, bf16, estimate_layout(model, hw, bf16, result.ranked.candidates.layout(0)), 0) is None


def test_an_unreachable_min_free_picks_the_most_free_memory_not_the_tightest():
    # no layout is roomy: the group forms around the fastest (A, 100); B (98, 30 % free) and
    # D (97.9, 20 %) tie with it (ln(100/98) = 0.020, ln(100/97.9) = 0.021 <= ln 1.05); A leaves
    # 5 %: headroom picks B, the most free, and names headroom as what decided
    score = np.array([100.0, 98.0, 90.0, 97.9])
    feats = _features([False] * 4)
    feats = dataclasses.replace(feats, free=np.array([0.05, 0.30, 0.50, 0.20]))
    t = ties.tie_order(_est(), score, np.arange(4), feats, TIE, 0.99, strict=False)
    assert t.reference == 0 and t.group == 3
    assert list(t.order[:3]) == [1, 3, 0] and t.deciding == ("headroom",)


def test_min_free_with_strict_rank_is_refused():
    code = CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512", "--strict-rank",
                                    "--min-free", "20%"])
    assert code.exit_code == 2 and "--strict-rank turns off" in code.output


def test_why_not_of_the_pick_names_the_faster_layout_and_no_false_tie():
    # 175B on 512 H100: the tie pick (tp=8 pp=4) is not the fastest (tp=4 pp=8, the Tie line);
    # why-not of the pick says so; a layout slower than the group's reference by more than the
    # tie band is not called a tie
    res = CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512", "--json"])
    data = json.loads(res.stdout)
    pick = data[0]["layout"]
    pick_text = ",".join(f"{k}={pick[k]}" for k in ("tp", "pp", "dp", "micro_batch_size", "vpp"))
    res = CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512", "--why-not",
                                   pick_text.replace("micro_batch_size", "mbs"), "--json"])
    verdict = json.loads(res.stdout)
    assert verdict["status"] == "winner"
    if data[0]["tie_group"]["fastest"] not in (None, 1):  # the pick is not the fastest
        assert verdict["fastest_by"] > 0 and verdict["fastest"]
    else:
        assert verdict["fastest_by"] is None
    res = CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512", "--why-not",
                                   "vpp=5", "--json"])
    slow = json.loads(res.stdout)
    assert slow["status"] == "slower"
    ref = min(e["time"]["step"] for e in data if e["tie_group"]["member"])
    claims_tie = any("tie band" in r for r in slow["reasons"])
    assert claims_tie == (math.log(slow["completion"]["time"]["step"] / ref)
                          <= math.log1p(slow["tie_band"]) + 1e-9)
