"""Refusals that name what fails: a split that does not use the GPU count names the product of
the degrees given (search, --why-not, estimate, regress, plans), and a layout that does not fit
names the shortfall per GPU and a GPU count that works, with its layout (search, sweep rows,
--why-not, estimate), and never a step time or throughput for a layout that cannot run."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.errors import NoFitError, UsageError
from planner.inputs import training_spec
from planner.regress import Case, evaluate_case
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.search.whynot import why_not

runner = CliRunner()
GIB = 2.0**30


def cli(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def gpt3():
    m = catalog.resolve_model("175b")
    return m, training_spec(m, {})


# ---------------------------------------------------------------- splits name the failing product

@pytest.mark.parametrize("gpus,text,reason", [
    # the issue's case: tp*dp = 2*8 = 16, twice the 8 GPUs (tp=2 alone divides 8)
    (8, "tp=2,dp=8", "tp*dp = 2*8 = 16 > 8 GPUs"),
    # cp and pp count too: 2*2*4 = 16 > 8
    (8, "tp=2,cp=2,pp=4", "tp*cp*pp = 2*2*4 = 16 > 8 GPUs"),
    # all four given: the product must equal the count, 4*2*2*2 = 32 != 16
    (16, "tp=4,cp=2,pp=2,dp=2", "tp*cp*pp*dp = 4*2*2*2 = 32 != 16 GPUs"),
    (16, "tp=1,cp=1,pp=2,dp=4", "tp*cp*pp*dp = 1*1*2*4 = 8 != 16 GPUs"),
    # 3*4 = 12 <= 16 but 16 % 12 = 4
    (16, "pp=3,dp=4", "pp*dp = 3*4 = 12 does not divide 16 GPUs"),
    (512, "dp=3", "dp=3 does not divide 512 GPUs"),
])
def test_why_not_names_the_product_that_fails(gpt3, gpus, text, reason):
    m, tr = gpt3
    verdict = why_not(m, catalog.resolve_hardware("dgx-h100"), tr, gpus, SearchOptions(), text)
    assert verdict.status == "invalid" and verdict.reasons == [reason]


def test_why_not_cli_prints_the_product():
    code, out, err = cli("search", "--model", "175b", "--gpus", 8, "--why-not", "tp=2,dp=8")
    assert code == 0, err
    assert "tp=2,dp=8: invalid — it breaks: tp*dp = 2*8 = 16 > 8 GPUs" in " ".join(out.split())


@pytest.mark.parametrize("args,message", [
    # search pins: cp free, so the product must divide: 2*16 = 32 > 16
    (["search", "--gpus", 16, "--tp", 2, "--dp", 16], "tp*dp = 2*16 = 32 > 16 GPUs"),
    (["search", "--gpus", 16, "--tp", 2, "--cp", 2, "--pp", 2, "--dp", 8],
     "tp*cp*pp*dp = 2*2*2*8 = 64 != 16 GPUs"),
    # estimate: the degrees not given are 1 (dp takes the rest), so with dp given it must equal
    (["estimate", "--gpus", 8, "--tp", 2, "--dp", 8], "tp*dp = 2*8 = 16 != 8 GPUs"),
    (["estimate", "--gpus", 64, "--tp", 2, "--cp", 2, "--pp", 32], "tp*cp*pp = 2*2*32 = 128 > 64 GPUs"),
    (["estimate", "--gpus", 48, "--pp", 32], "pp=32 does not divide 48 GPUs"),
    # a product that divides, but no free degree can make up the rest: 64 / (2*2) = 16 must be
    # cp*pp with cp <= 1 and pp a divisor of 96 up to 8 (1, 2, 3, 4, 6, 8): none is 16
    (["search", "--gpus", 64, "--tp", 2, "--dp", 2, "--max-cp", 1, "--max-pp", 8],
     "tp*dp = 2*2 = 4 leaves 16 of 64 GPUs for cp*pp, and no cp*pp makes 16"),
    # a budget: 8*16 = 128 GPUs are more than --max-gpus 64
    (["search", "--max-gpus", 64, "--tp", 8, "--pp", 16], "tp*pp = 8*16 = 128 > --max-gpus 64"),
])
def test_search_and_estimate_name_the_product(args, message):
    code, out, err = cli(args[0], "--model", "175b", *args[1:])
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err, err


@pytest.mark.parametrize("kind,fields,gpus,message", [
    ("layout", {"tp": 2, "dp": 8, "zero_stage": 1, "micro_batch_size": 1}, 8,
     "tp*dp = 2*8 = 16 != 8 GPUs"),
    ("layout", {"tp": 4, "cp": 2, "pp": 4, "zero_stage": 1, "micro_batch_size": 1}, 16,
     "tp*cp*pp = 4*2*4 = 32 > 16 GPUs"),
    ("search", {"tp": 2, "dp": 16}, 16, "tp*dp = 2*16 = 32 > 16 GPUs"),
])
def test_regress_cases_name_the_product(kind, fields, gpus, message):
    out = evaluate_case(Case(name="c", model="175b", gpus=gpus, **{kind: fields}))
    assert out["status"] == "error" and message in out["message"], out


def test_a_plan_edited_into_a_wrong_split_names_the_product(tmp_path):
    plan = tmp_path / "plan.yaml"
    assert cli("search", "--model", "175b", "--gpus", 512, "--export", plan)[0] == 0
    data = yaml.safe_load(plan.read_text())
    lay = data["layout"]
    lay["dp"] *= 2  # the product is now twice the plan's 512 GPUs
    plan.write_text(yaml.safe_dump(data))
    want = (f"tp*cp*pp*dp = {lay['tp']}*{lay['cp']}*{lay['pp']}*{lay['dp']} = 1,024 != 512 GPUs")
    for args in (["estimate", "--plan", plan], ["export", plan, "--to", "megatron"],
                 ["placement", plan]):
        code, out, err = cli(*args)
        assert code == 2 and want in err, (args, err)


# ---------------------------------------------------------------- no fit: a count that works


def _fails(model, hw, tr, n) -> bool:
    try:
        search(model, hw, tr, n, SearchOptions(keep=1))
    except (NoFitError, UsageError):
        return True
    return False


def test_the_issue_case_names_96_not_88(gpt3):
    # GPT-3 175B on 16 A100-40GB: 'roughly 88' by memory alone, but 88 = 8*11 admits no split
    # (11 divides neither 1536 nor 96 layers as a power-of-two tp/cp); 96 is the first count
    # with a layout that fits
    code, out, err = cli("search", "--model", "175b", "--gpus", 16, "--hardware", "dgx-a100-40g")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "roughly" not in err
    assert "the fewest GPUs on which a layout fits are 96 (" in err
    m, tr = gpt3
    hw = catalog.resolve_hardware("dgx-a100-40g")
    # every whole-node count between fails, and 96 works
    assert all(_fails(m, hw, tr, n) for n in range(24, 96, 8))
    assert not _fails(m, hw, tr, 96)
    named = err.split("are 96 (")[1].split(",")[0]
    best = search(m, hw, tr, 96).ranked.candidates.layout(0)
    assert named == best.short()  # the layout named is the search's best at that count


def test_llama3_405b_on_8_h100_estimate_says_what_fits_and_prints_no_throughput():
    # 405.9e9 parameters: weights 2 B + fp32 grads 4 B per parameter unsharded (tp=pp=1, ZeRO-1
    # shards only the 12 B of optimizer state over dp=8) cannot fit 79.65 GiB
    args = ("estimate", "--model", "llama3-405b", "--gpus", 8, "--tp", 1, "--pp", 1)
    code, out, err = cli(*args)
    assert code == 1
    flat = " ".join(out.split())
    assert "Step time" not in out and not re.search(r"(tokens/s|MFU|HFU|bubble) [0-9]", flat)
    assert "a layout that cannot run has no step time, tokens/s or MFU" in flat
    code_j, out_j, _ = cli(*args, "--json")
    d = json.loads(out_j)
    mem = d["memory"]
    assert code_j == 1 and mem["fits"] is False
    assert mem["shortfall_bytes"] == pytest.approx(mem["total"] - mem["capacity"])
    assert f"{(mem['total'] - mem['capacity']) / GIB:.2f} GiB more than the 79.6 GiB" in flat
    # no time or throughput for a layout that cannot run; the keys stay, null
    assert set(d["time"]) >= {"step", "compute", "bubble_fraction", "link"}
    assert all(v is None for k, v in d["time"].items() if k != "link")
    assert all(v is None for v in d["time"]["link"].values())
    assert all(v is None for v in d["throughput"].values())
    assert all(s["microbatch_time"] is None for s in d["stages"])
    # nothing fits on 8 H100s; the count named is one where a layout fits, and none below it
    hint = d["to_fit"]
    assert f"no layout fits on 8 GPUs; the fewest GPUs on which a layout fits are {hint['gpus']}" in flat
    m = catalog.resolve_model("llama3-405b")
    hw, tr = catalog.resolve_hardware("dgx-h100"), training_spec(m, {})
    assert all(_fails(m, hw, tr, n) for n in range(16, hint["gpus"], 8))
    lay = hint["layout"]
    code, out, err = cli("estimate", "--model", "llama3-405b", "--gpus", hint["gpus"], "--tp", lay["tp"],
                         "--cp", lay["cp"], "--pp", lay["pp"], "--zero-stage", lay["zero_stage"],
                         "--micro-batch-size", lay["micro_batch_size"], "--recompute",
                         lay["recompute"], "--vpp", lay["vpp"],
                         "--sequence-parallel" if lay["sequence_parallel"] else "--no-sequence-parallel",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["memory"]["total"] == pytest.approx(hint["memory_bytes"])


def test_estimate_no_fit_where_other_layouts_fit_on_the_same_gpus():
    # 175B unsharded over tp=pp=1 on 64 H100s does not fit, but the search has fits on 64
    code, out, err = cli("estimate", "--model", "175b", "--gpus", 64, "--json")
    d = json.loads(out)
    assert code == 1 and d["to_fit"]["gpus"] == 64
    best = search(catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100"),
                  training_spec(catalog.resolve_model("175b"), {}), 64).ranked
    assert d["to_fit"]["layout"] == best.candidates.layout(0).model_dump()
    code, out, err = cli("estimate", "--model", "175b", "--gpus", 64)
    assert f"To fit on these 64 GPUs: {best.candidates.layout(0).short()}" in " ".join(out.split())


def test_estimate_json_keys_are_the_same_whether_it_fits_or_not():
    fit = json.loads(cli("estimate", "--model", "175b", "--gpus", 512, "--tp", 8, "--pp", 8,
                         "--json")[1])
    miss = json.loads(cli("estimate", "--model", "175b", "--gpus", 64, "--json")[1])
    assert set(fit) == set(miss) and set(fit["memory"]) == set(miss["memory"])
    assert set(fit["time"]) == set(miss["time"]) and set(fit["throughput"]) == set(miss["throughput"])
    assert fit["to_fit"] is None and fit["memory"]["shortfall_bytes"] == 0


def test_sweep_rows_name_the_count_that_fits_and_share_keys():
    code, out, err = cli("sweep", "--model", "175b", "--gpus", "16,128", "--hardware",
                         "dgx-a100-40g", "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert len({tuple(r) for r in rows}) == 1  # every row has the same keys
    assert "the fewest GPUs on which a layout fits are 96 (" in rows[0]["error"]
    assert rows[0]["tokens_per_s"] is None and rows[0]["layout"] is None
    assert rows[1]["error"] is None and rows[1]["tokens_per_s"] > 0


def test_why_not_no_fit_names_a_count_for_the_pins(gpt3):
    m, tr = gpt3
    hw = catalog.resolve_hardware("dgx-h100")
    # nothing fits on 16 H100s at all; with tp=1, pp=2 pinned, the count named keeps the pins
    verdict = why_not(m, hw, tr, 16, SearchOptions(), "tp=1,pp=2")
    assert verdict.status == "no-fit"
    hint = verdict.to_fit
    lay = hint.estimate.candidates.layout(0)
    assert (lay.tp, lay.pp) == (1, 2)
    assert f"with these values, the fewest GPUs on which a layout fits are {hint.gpus}" in verdict.reasons[-1]
    search(m, hw, tr, hint.gpus, SearchOptions(tp=1, pp=2))  # it fits there
    below = [n for n in range(24, hint.gpus, 8)]
    assert all(_pinned_fails(m, hw, tr, n) for n in below)
    d = verdict.to_dict()
    assert d["to_fit"]["gpus"] == hint.gpus and d["completion"] is None


def _pinned_fails(m, hw, tr, n) -> bool:
    try:
        search(m, hw, tr, n, SearchOptions(tp=1, pp=2, keep=1))
    except (NoFitError, UsageError):
        return True
    return False


def test_why_not_json_has_the_same_keys_for_every_verdict():
    keys = None
    for text in ("tp=5", "tp=1,pp=1,zero=0", "tp=8,pp=8", "tp=2,cp=2,pp=16,vpp=6,mbs=1,zero=1,dp=8"):
        code, out, err = cli("search", "--model", "175b", "--gpus", 512, "--why-not", text, "--json")
        assert code == 0, err
        d = json.loads(out)
        keys = keys or set(d)
        assert set(d) == keys, text
    assert keys == {"layout", "status", "reasons", "completion", "winner", "slower_by",
                    "time_deltas_s", "to_fit", "tie_band", "fastest", "fastest_by"}


# ---------------------------------------------------------------- invariant: the fewest GPUs


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from planner.search.refusal import fewest_gpus  # noqa: E402
from tests.conftest import gpt  # noqa: E402


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.sampled_from([24, 40, 48, 60, 80]), hidden=st.sampled_from([6144, 8192, 12288]),
       batch=st.sampled_from([96, 256, 768, 1536]), start=st.sampled_from([8, 16, 24]),
       headroom=st.sampled_from([0.0, 0.1]))
def test_fewest_gpus_is_the_first_count_a_search_fits(layers, hidden, batch, start, headroom):
    # brute force: a search at every whole-node count above `start`, up to the first that
    # has a fitting layout, must agree with the memory-only pass over the budget grid
    m = gpt("t", layers, hidden, 64 if hidden % 64 == 0 else 32, batch=batch)
    hw = catalog.resolve_hardware("dgx-a100-40g")
    tr = training_spec(m, {})
    opts = SearchOptions(headroom_fraction=headroom)
    found = fewest_gpus(m, hw, tr, start, opts, limit=512)
    first = next((n for n in range(start + 8, 513, 8) if _fits_at(m, hw, tr, n, opts)), None)
    assert found == first


def _fits_at(m, hw, tr, n, opts) -> bool:
    from dataclasses import replace
    try:
        search(m, hw, tr, n, replace(opts, keep=1))
    except (NoFitError, UsageError):
        return False
    return True
