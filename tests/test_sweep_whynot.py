"""plan3d sweep, --why-not and the breakdown explanations (issue 4)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import UsageError
from planner.explain import memory_breakdown, term_deltas, time_breakdown
from planner.render.breakdown import bar
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.search.sweep import parse_batch_sizes, parse_gpu_counts, sweep, sweep_batches
from planner.search.whynot import parse_layout, why_not

runner = CliRunner()


def test_parse_gpu_counts(gpt3_h100):
    hw = gpt3_h100[1]
    assert parse_gpu_counts("64:4096", hw) == [64, 128, 256, 512, 1024, 2048, 4096]
    assert parse_gpu_counts("64:1000", hw) == [64, 128, 256, 512]  # 1024 > 1000
    assert parse_gpu_counts("512,64, 128", hw) == [64, 128, 512]
    for bad in ("4096:64", "a:b", "0:64", "64,100"):  # 100 is not whole 8-GPU nodes
        with pytest.raises(UsageError):
            parse_gpu_counts(bad, hw)


def test_sweep_tokens_never_fall_as_gpus_double(gpt3_h100):
    m, hw, tr = gpt3_h100
    # 1536 sequences split over dp up to 512 at 64..1024 GPUs: the batch allows every doubling
    rows = sweep(m, hw, tr, [64, 128, 256, 512, 1024])
    tps = [r["tokens_per_s"] for r in rows]
    assert all(b >= a for a, b in zip(tps, tps[1:]))
    assert rows[0]["scaling_efficiency"] is None
    for r in rows[1:]:  # eff = (tps/n) / (tps_64/64)
        assert r["scaling_efficiency"] == pytest.approx((r["tokens_per_s"] / r["gpus"]) / (tps[0] / 64))
    # the 512-GPU row is exactly the 512-GPU search's winner
    assert rows[3]["tokens_per_s"] == float(
        search(m, hw, tr, 512, SearchOptions(strict_rank=True)).ranked.throughput["tokens_per_s"][0])
    # Megatron-LM README (commit 0010ab7): GPT-3 175B strong scaling on H100 (with
    # --tp-comm-overlap), 47 % MFU on 96 GPUs to 42 % on 4608; every row inside that range is
    # within the project's 10 % MFU target of it: 0.42 x 0.9 = 0.378 <= MFU <= 0.47 x 1.1 = 0.517
    # (64 GPUs lie outside)
    assert all(0.42 * 0.9 <= r["mfu"] <= 0.47 * 1.1 for r in rows if r["gpus"] >= 96)


def test_batch_sweep(gpt3_h100):
    m, hw, tr = gpt3_h100
    assert parse_batch_sizes("768, 1536,768") == [768, 1536] and parse_batch_sizes(None) == [None]
    for bad in ("0", "x", "1536,-2"):
        with pytest.raises(UsageError):
            parse_batch_sizes(bad)
    rows = sweep_batches(m, hw, tr, [512], [768, 1536, 3072])
    assert [r["global_batch_size"] for r in rows] == [768, 1536, 3072]
    # at a fixed GPU count a bigger batch means more micro-batches per step: a smaller bubble
    # share, the same per-step DP and optimizer costs spread over more tokens
    tps = [r["tokens_per_s"] for r in rows]
    assert tps[0] < tps[1] < tps[2]
    assert rows[1]["tokens_per_s"] == float(search(m, hw, tr, 512, SearchOptions(strict_rank=True)).ranked.throughput["tokens_per_s"][0])


def test_sweep_reports_counts_without_a_fit(gpt3_h100):
    m, hw, tr = gpt3_h100
    rows = sweep(m, hw, tr, [16, 64])
    # 175B on 16 H100s: at least 174.6e9 x 18 B / 16 GPUs = 196 GB of weights+grads+optimizer
    # per GPU without ZeRO; with ZeRO-3 over dp the activations of 96 layers still do not fit
    assert "fits on 16" in rows[0]["error"] and rows[0]["scaling_efficiency"] is None
    assert rows[1]["error"] is None and rows[1]["scaling_efficiency"] is None  # 64 is the base


def test_why_not_rejects_a_layout_that_breaks_head_divisibility(gpt3_h100):
    m, hw, tr = gpt3_h100
    # GPT-3 175B has 96 heads; 96 % 5 = 1, so tp=5 can never split them (480 = 60 nodes, 5 | 480);
    # nor its FFN width: 49152 % 5 = 2
    verdict = why_not(m, hw, tr, 480, SearchOptions(), "tp=5")
    assert verdict.status == "invalid"
    assert verdict.reasons == ["attention heads divisible by tp", "ffn_hidden_size divisible by tp",
                               "Megatron-Core: tp divides the KV heads or is a multiple of them"]
    # Llama-3 70B: 64 heads, 8 KV heads; tp=16 (across nodes) divides the heads but not the KV
    # heads. Megatron-Core gives each TP rank one KV head when tp is a multiple of them
    # (transformer_config.py: 16 % 8 == 0 passes); torchtitan's attention needs tp | KV heads
    from planner import catalog
    from planner.frameworks.profile import resolve_training
    llama = catalog.resolve_model("llama3-70b")
    verdict = why_not(llama, hw, tr, 64, SearchOptions(allow_cross_node_tp=True), "tp=16")
    assert verdict.status != "invalid", verdict.reasons
    titan = catalog.resolve_framework("torchtitan")
    verdict = why_not(llama, hw, resolve_training(tr, titan), 64,
                      SearchOptions(allow_cross_node_tp=True, framework=titan), "tp=16")
    assert verdict.status == "invalid" and verdict.reasons == ["torchtitan: tp divides the KV heads"]
    assert why_not(llama, hw, tr, 64, SearchOptions(), "tp=8").status != "invalid"
    # tp=5 does not divide 512 GPUs at all: that is the reason there
    verdict = why_not(m, hw, tr, 512, SearchOptions(), "tp=5")
    assert verdict.status == "invalid" and verdict.reasons == ["tp=5 does not divide 512 GPUs"]
    # tp=16 crosses the 8-GPU NVLink domain
    verdict = why_not(m, hw, tr, 512, SearchOptions(), "tp=16")
    assert verdict.reasons == ["tp within the NVLink domain"]


def test_why_not_explains_a_slower_layout_term_by_term(gpt3_h100):
    m, hw, tr = gpt3_h100
    verdict = why_not(m, hw, tr, 512, SearchOptions(), "tp=2,pp=16,cp=1")
    assert verdict.status == "slower"
    lay = verdict.completion.candidates.layout(0)
    assert (lay.tp, lay.pp, lay.dp) == (2, 16, 16)
    best = search(m, hw, tr, 512).ranked
    assert verdict.winner.candidates.layout(0) == best.candidates.layout(0)
    gap = float(verdict.completion.time["step"][0] - best.time["step"][0])
    assert sum(d for _, d in verdict.deltas) == pytest.approx(gap, rel=1e-9)
    # the slower tokens/s ratio is the step ratio (same tokens per step)
    assert verdict.slower_by == pytest.approx(float(verdict.completion.time["step"][0] /
                                                    best.time["step"][0]) - 1)
    # terms largest first; the largest is a real slowdown
    assert [d for _, d in verdict.deltas] == sorted((d for _, d in verdict.deltas), reverse=True)
    assert verdict.deltas[0][1] > 0
    # the winner itself is judged the winner
    w = best.candidates.layout(0)
    assert why_not(m, hw, tr, 512, SearchOptions(), f"tp={w.tp},pp={w.pp},vpp={w.vpp}").status == "winner"


def test_parse_layout():
    assert parse_layout("tp=4, pp=16") == {"tp": 4, "pp": 16}
    assert parse_layout("zero=1,mbs=2,sp=1,recompute=full") == {
        "zero_stage": 1, "micro_batch_size": 2, "sequence_parallel": True, "recompute": "full"}
    for bad in ("", "tp", "tp=x", "tq=4", "zero=5", "recompute=some", "sp=maybe", "tp=0"):
        with pytest.raises(UsageError):
            parse_layout(bad)


@pytest.mark.parametrize("layout", [
    dict(tp=2, cp=4, pp=16, dp=8, ep=8, zero_stage=1, micro_batch_size=2, first_stage_layers=4,
         last_stage_layers=1, sequence_parallel=True),
    dict(tp=1, pp=2, dp=4, zero_stage=0, distributed_optimizer=True, micro_batch_size=1,
         recompute="full", recompute_num_layers=43, first_stage_layers=32, last_stage_layers=29),
    dict(tp=1, pp=1, dp=8, zero_stage=3, micro_batch_size=4, offload_layers=2, recompute="selective+"),
])
def test_why_not_reads_a_layout_as_the_tables_print_it(layout):
    # a printed row could not be pasted: "cannot read '(12+..+10'", "recompute must be ...,
    # got 'full:43'"; every field of Layout.short() reads back to the layout's value
    from planner.layout import Layout
    lay = Layout(**layout)
    pins = parse_layout(lay.short())
    for name, value in pins.items():
        assert getattr(lay, name) == value, (name, lay.short())
    expected = {k for k, v in layout.items() if v} | {"tp", "pp", "dp", "zero_stage", "micro_batch_size",
                                                       "vpp", "recompute"}
    assert expected <= set(pins), (expected - set(pins), lay.short())


@pytest.mark.parametrize("bad, words", [
    ("split=1+x", "split is the first and last stages' layers"),
    ("split=0+48", "a split's stages hold at least one layer"),
    ("recompute=full:4 recompute_num_layers=3", "recompute_num_layers is given twice"),
    ("recompute=full:x", "recompute=full:N needs a whole number of layers"),
])
def test_why_not_split_and_recompute_layers_errors(bad, words):
    with pytest.raises(UsageError, match=words):
        parse_layout(bad)


def test_breakdowns_sum_to_their_totals(gpt3_h100):
    m, hw, tr = gpt3_h100
    est = search(m, hw, tr, 512).ranked
    assert sum(v for _, v in time_breakdown(est)) == pytest.approx(float(est.time["step"][0]), rel=1e-12)
    assert sum(v for _, v in memory_breakdown(est)) == pytest.approx(float(est.memory["total"][0]),
                                                                     rel=1e-12)
    deltas = term_deltas(est, 1, est, 0)
    assert [d for _, d in deltas] == sorted((d for _, d in deltas), reverse=True)


def test_bar():
    assert bar(1.0, 1.0, 10) == "█" * 10
    assert bar(0.5, 1.0, 10) == "█" * 5
    assert bar(0.0625, 1.0, 10) == "▋"  # 0.625 cell = 5 eighths (▌ is 4)
    assert bar(0.0, 1.0, 10) == "" and bar(2.0, 1.0, 4) == "████"


def test_cli_why_not_and_bars():
    res = runner.invoke(app, ["search", "-m", "175b", "-g", "480", "--why-not", "tp=5"])
    assert res.exit_code == 0, res.output
    assert "breaks: attention heads divisible by tp" in res.output
    res = runner.invoke(app, ["search", "-m", "175b", "-g", "512", "--top", "2"])
    assert res.exit_code == 0, res.output
    assert "Winner's step time" in res.output and "Winner's memory per GPU" in res.output
    assert "Runner-up" in res.output


def test_cli_sweep_json_and_errors(tmp_path):
    res = runner.invoke(app, ["sweep", "-m", "175b", "-g", "64:128", "--json"])
    assert res.exit_code == 0, res.output
    assert '"gpus": 128' in res.output
    res = runner.invoke(app, ["sweep", "-m", "175b", "-g", "512", "--global-batch-size", "768,1536"])
    assert res.exit_code == 0, res.output
    assert "batch" in res.output and "1,536" in res.output
    res = runner.invoke(app, ["search", "-m", "175b", "-g", "512", "--objective", "cost"])
    assert res.exit_code == 2 and "--price-per-gpu-hour" in res.output
    res = runner.invoke(app, ["search", "-m", "175b", "-g", "512", "--max-gpus", "1024"])
    assert res.exit_code == 2 and "not both" in res.output
    existing = tmp_path / "plot.png"
    existing.write_text("mine")
    res = runner.invoke(app, ["sweep", "-m", "175b", "-g", "64", "--plot", str(existing)])
    assert res.exit_code == 2 and "--force" in res.output
    assert existing.read_text() == "mine"


def test_cli_sweep_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "s.png"
    res = runner.invoke(app, ["sweep", "-m", "175b", "-g", "64:128", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_why_not_by_cost(gpt3_h100):
    m, hw, tr = gpt3_h100
    opts = SearchOptions(max_gpus=512, objective="cost", price_per_gpu_hour=2.0)
    v = why_not(m, hw, tr, None, opts, "tp=8,pp=16")
    assert v.status == "slower" and v.reasons[1].startswith("by cost: ")
    # cost = GPUs x 3e11 tokens / (tokens_per_s x goodput) / 3600 s x 2.0 per GPU-hour, for both
    for est in (v.completion, v.winner):
        lay, th = est.candidates.layout(0), est.throughput
        assert th["cost"][0] == pytest.approx(
            lay.gpus * 3e11 / (th["tokens_per_s"][0] * th["goodput"][0]) / 3600 * 2.0)
    assert v.completion.throughput["cost"][0] > v.winner.throughput["cost"][0]
