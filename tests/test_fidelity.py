"""Cost-model fidelity against published, measured training runs (issue 3).

The benchmark (benchmarks/fidelity.py) runs on the shipped dataset with the shipped profiles;
the thresholds below are the issue's targets. Where the model does not meet a target yet, the
test of the target is a strict xfail that says by how much (it fails once the target is met, so
the mark comes off); exact predicted numbers are pinned only by the golden baseline
(tests/golden), never by a threshold set at today's error.
"""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.fidelity import conventions as cv
from planner.fidelity.runs import load_runs, select_runs
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "benchmarks" / "published_runs.yaml"


def _bench():
    return load_benchmark("fidelity", "fidelity_bench")


@pytest.fixture(scope="module")
def bench():
    module = _bench()
    cases, comparisons, summary = module.run(SHIPPED)
    return module, cases, {c.case.id: c for c in comparisons}, summary


# ----------------------------------------------------------------------------- the dataset


def test_shipped_dataset_is_the_ground_truth_unchanged():
    shared = Path("/work/shared/validation/published_runs.yaml")
    rows = yaml.safe_load(SHIPPED.read_text())
    assert len(rows) == 60
    if shared.is_file():  # the copy must keep the numbers exactly
        assert yaml.safe_load(shared.read_text()) == rows


def test_loader_maps_rows_and_states_its_defaults():
    cases = {c.id: c for c in load_runs(SHIPPED)}
    skipped = {c.id: c.skipped for c in cases.values() if c.skipped}
    assert set(skipped) == {"palm-540b-tpuv4", "gopher-280b-tpuv3",
                            "megatron-readme-h100-gpt3-175b-strong-96gpu",
                            "megatron-readme-h100-gpt3-175b-strong-4608gpu"}
    assert "TPU" in skipped["palm-540b-tpuv4"]
    ptd = cases["megatron21-t2-ptd-530b-560gpu"]  # Table 2 gives only t*p = 280
    assert (ptd.layout.tp, ptd.layout.pp, ptd.layout.dp) == (8, 35, 2)
    assert "tp=8,pp=35 (tp*pp=280)" in ptd.assumptions
    k = cases["korthikanti22-175b-selective-sp"]
    assert not k.training.flash_attention and k.layout.vpp == 3 and k.layout.sequence_parallel
    assert k.hardware.name == "dgx-a100-80g"
    mpt = cases["mosaic-mpt-70b-a100_40gb-128gpu-seq2048"]
    assert mpt.hardware.name == "dgx-a100-40g" and mpt.layout.zero_stage == 3
    assert mpt.training.flash_attention and (mpt.layout.tp, mpt.layout.pp) == (1, 1)
    assert cases["mosaic-mpt-7b-h100_80gb-8gpu-seq2048"].hardware.name == "dgx-h100"
    assert "micro_batch=1" in cases["megatron21-t1-145.6b"].assumptions
    assert select_runs(list(cases.values()), ["megatron21-*"], "high")[0].id.startswith("korthikanti22")


# ----------------------------------------------------------------------------- FLOP conventions


def test_korthikanti_conventions_reproduce_published_mfu_and_hfu():
    # formulas.md Sec. 9 item 3: Table 5 selective+SP times -> README MFU 41.5/51.4/56.0/56.3 %,
    # HFU 43.7/52.8/57.0/57.0 % (312 TFLOP/s; 22B is off by the 2-digit rounding of 1.10 s).
    runs = [(6144, 48, 4, 8, 1.10, 41.65, 43.81), (12288, 96, 64, 64, 13.75, 51.39, 52.77),
            (20480, 105, 280, 280, 37.83, 56.05, 56.96), (25600, 128, 512, 512, 71.49, 56.27, 57.01)]
    for h, L, B, gpus, t, mfu, hfu in runs:
        f = cv.korthikanti_model_flops(B, 2048, L, h, 51200)
        assert 100 * f / (t * gpus * 312e12) == pytest.approx(mfu, abs=0.01)
        f = cv.korthikanti_hardware_flops(B, 2048, L, h, 51200)
        assert 100 * f / (t * gpus * 312e12) == pytest.approx(hfu, abs=0.01)


def test_narayanan_convention_links_the_2020_readme_times_and_tflops():
    # 1.16B row: 96*2048*1024*24*1920^2*(1 + 1024/11520 + 51200/737280) / (1.153 s * 128) = 139.80
    # TFLOP/s, as published (139.8): seq 1024 / vocab 51200 make the row self-consistent.
    cases = {c.id: c for c in load_runs(SHIPPED)}
    for rid in ("megatron-readme2020-dgxa100-1b-128gpu", "megatron-readme2020-dgxa100-8b-1024gpu"):
        c = cases[rid]
        f = cv.narayanan_flops(2048, 1024, c.model.num_layers, c.model.hidden_size, 51200)
        achieved = f / (c.measured["iteration_s"] * c.gpus)
        assert achieved == pytest.approx(c.measured["flops_per_gpu"], rel=1e-3)


def test_mosaic_convention_reproduces_published_mfu():
    # MPT-7B on 8 A100-80GB: N = 6,649,290,752; (6*N*2048 + 3*32*4*4096*2048^2) per sequence
    # x 37130/2048 seq/s / (8 * 312e12) = 64.14 % vs published 64.23 % (N from our spec).
    c = {c.id: c for c in load_runs(SHIPPED)}["mosaic-mpt-7b-a100_80gb-8gpu-seq2048"]
    f = cv.mosaic_flops(1, 2048, 32, 4096, 6_649_290_752)
    assert 100 * f * 37130 / 2048 / (8 * 312e12) == pytest.approx(64.14, abs=0.01)
    assert c.measured["mfu"] == pytest.approx(0.6423)


# ----------------------------------------------------------------------------- accuracy targets


def test_korthikanti_table4_layer_times():
    # Korthikanti 2022 Table 4 (as quoted in published_runs_SOURCES.md): one 22B layer (h 6144, a 64,
    # s 2048, b 4, t 8), forward + backward: 19.6 ms without recomputation, 27.2 ms with full
    # recomputation, 20.3 ms with selective recomputation + SP. Predicted within 3 % (max 2.4 %).
    import numpy as np

    from planner.catalog import resolve_hardware
    from planner.cost import compute
    from planner.cost.collectives import Links
    from planner.cost.comm import block_comm
    from planner.cost.step import block_cost
    from planner.cost.traffic import Elements
    from planner.layout import Candidates
    from planner.layout import Layout
    from planner.specs import ModelSpec, TrainingDefaults, TrainingSpec

    hw = resolve_hardware("dgx-a100-80g")
    model = ModelSpec(name="22b", source="Korthikanti 2022 Table 3", num_layers=48, hidden_size=6144,
                      num_attention_heads=64, vocab_size=51200, dropout=0.1, bias=True,
                      training=TrainingDefaults(seq_length=2048, global_batch_size=4))
    training = TrainingSpec(seq_length=2048, global_batch_size=4, flash_attention=False, dtype="fp16")
    for recompute, sp, published in (("none", False, 19.6e-3), ("full", False, 27.2e-3),
                                     ("selective", True, 20.3e-3)):
        c = Candidates.from_layouts([Layout(tp=8, pp=1, dp=1, zero_stage=0, micro_batch_size=4,
                                            recompute=recompute, sequence_parallel=sp)])
        times = compute.block_times(model, training, hw, c)
        comms = block_comm(model, training, c, Links.of(hw), times, Elements.of(training))
        total = float(sum(np.asarray(block_cost(times[k], comms[k], c).total)[0] for k in times))
        assert total == pytest.approx(published, rel=0.03), recompute


def _errors(comparisons, prefix, key=None):
    items = [c for rid, c in comparisons.items() if rid.startswith(prefix)]
    assert items, prefix
    return [abs(c.error[key or c.primary]) for c in items]


def test_korthikanti_table5_iteration_times(bench):
    _, _, comps, _ = bench
    errs = _errors({k: v for k, v in comps.items() if "2240" not in k}, "korthikanti22-", "iteration_s")
    assert len(errs) == 8
    # IN-SAMPLE (these rows are among the dgx-a100-80g calibration runs). Issue target max 6 %,
    # met: the 1T rows are +5-6 % (pp = 64, vpp not stated), max 5.6 %.
    assert max(errs) <= 0.06


@pytest.mark.xfail(strict=True, reason="mean 3.01 %, a hair above the 3 % target, since the cost "
                   "core times every collective of cost.volumes (cross-entropy and SP-norm "
                   "all-reduces, the output layer's input-gradient collective)")
def test_korthikanti_table5_mean_target(bench):
    _, _, comps, _ = bench
    errs = _errors({k: v for k, v in comps.items() if "2240" not in k}, "korthikanti22-", "iteration_s")
    assert sum(errs) / len(errs) <= 0.03  # issue target: mean 3 %


def test_narayanan_table1_tflops(bench):
    _, _, comps, _ = bench
    errs = _errors(comps, "megatron21-t1-", "flops_per_gpu")
    assert len(errs) == 10
    assert sum(errs) / len(errs) <= 0.05 and max(errs) <= 0.10  # issue target, met


def test_narayanan_table2_ptdp_within_10_percent(bench):
    _, _, comps, _ = bench
    assert max(_errors(comps, "megatron21-t2-ptd-", "flops_per_gpu")) <= 0.10  # issue target, met


@pytest.mark.xfail(strict=True, reason="mean 14.5 %, max 23.3 %: DeepSpeed ZeRO-3 of 2021 follows "
                   "no single parameter-gather rate (test_zero3_rows_follow_no_single_rate)")
def test_narayanan_table2_zero3_target(bench):
    _, _, comps, _ = bench
    errs = _errors(comps, "megatron21-t2-zero3-", "flops_per_gpu")
    # Issue target 10 %. DeepSpeed ZeRO-3 of 2021 moved parameters at ~21 GB/s per GPU, bound by
    # its synchronous per-submodule gathers (DeepSpeed issue #1174, PR #1188), with nothing
    # overlapped (fidelity/runs.py); the compute-heavy rows are predicted too slow, so some
    # overlap did happen.
    assert len(errs) == 6 and max(errs) <= 0.10


def test_zero3_rows_follow_no_single_rate():
    # Why the target above is open (benchmarks/zero3_2021.py). Narayanan's F per sequence for 175B:
    # 96*2048*96*12288^2*(1 + 2048/73728 + 51200/(16*96*12288)) = 2.93685e15 FLOP, so the
    # 1536-GPU row (mbs 1, 44 TFLOP/s) takes 2.93685e15/44e12 = 66.75 s and the 768-GPU row
    # (mbs 2, 88 TFLOP/s) 2*2.93685e15/88e12 = 66.75 s: twice the compute per GPU, same step.
    module = load_benchmark("zero3_2021")
    rows = {r["id"].removeprefix(module.PREFIX): r for r in module.analyse(load_runs(SHIPPED))}
    assert len(rows) == 6
    assert rows["175b-1536gpu"]["measured_s"] == pytest.approx(66.75, abs=0.01)
    assert rows["175b-768gpu"]["measured_s"] == pytest.approx(66.75, abs=0.01)
    # Neither reading gives one per-GPU rate: with nothing overlapped the rates spread 2x
    # (20.0-42.7 GB/s), with everything overlapped 1.4x (12.4-17.6 GB/s), beyond the 10 % target.
    for key in ("rate_no_overlap", "rate_full_overlap"):
        rates = [r[key] for r in rows.values()]
        assert None not in rates and max(rates) / min(rates) > 1.35


def test_ptdp_ranked_above_zero3(bench):
    # Issue target, met: on every GPU count where the paper measured PTD-P faster than ZeRO-3
    # (all of Table 2), plan3d predicts it faster too.
    _, _, comps, _ = bench
    pairs = [("175b-384gpu", "175b-384gpu"), ("175b-768gpu", "175b-768gpu"),
             ("175b-1536gpu", "175b-1536gpu"), ("530b-1120gpu", "530b-1120gpu"),
             ("530b-2240gpu", "530b-2240gpu")]
    for ptd, zero in pairs:
        p, z = comps[f"megatron21-t2-ptd-{ptd}"], comps[f"megatron21-t2-zero3-{zero}"]
        assert p.measured["flops_per_gpu"] > z.measured["flops_per_gpu"]  # what the paper measured
        assert p.predicted["flops_per_gpu"] > z.predicted["flops_per_gpu"], ptd


def test_mosaic_fsdp_mfu_within_10_percent(bench):
    _, _, comps, _ = bench
    errs = _errors(comps, "mosaic-", "mfu")
    assert len(errs) == 12 and max(errs) <= 0.10  # issue target, met


def test_no_published_run_predicted_not_to_fit(bench):
    _, _, comps, _ = bench
    assert [rid for rid, c in comps.items() if not c.fits] == []  # issue target, met


def test_peak_memory_where_measured(bench):
    _, _, comps, _ = bench
    errs = _errors(comps, "vocabpar-", "peak_memory")
    assert len(errs) == 8
    # Issue target 10 %, met: mean 5.6 %, max 8.0 %, with the source's "GB" read as GiB
    # (Megatron-LM's report_memory; fidelity/runs.py); as decimal GB it would be 11-16 %.
    assert max(errs) <= 0.10


def test_benchmark_writes_the_table(bench, tmp_path):
    module = bench[0]
    out = tmp_path / "fidelity.md"
    assert module.main([str(SHIPPED), "--out", str(out)]) == 0
    text = out.read_text()
    assert "| Korthikanti 2022 Table 5 | 8 | s/iter |" in text
    assert "palm-540b-tpuv4" in text  # skipped, with its reason


# ----------------------------------------------------------------------------- CLI


def test_accuracy_cli_json():
    result = CliRunner().invoke(app, ["accuracy", "--dataset", "published", "--json", "--no-loso"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["runs"]) == 56 and len(data["skipped"]) == 4
    assert "Korthikanti 2022 Table 5" in data["summary"]
    row = data["summary"]["Korthikanti 2022 Table 5"]
    # the step-time and tokens/s errors are the headline error seen as a time and as a rate
    assert row["step_mean_abs_error"] == pytest.approx(row["mean_abs_error"], rel=0.05)
    assert row["loso_mean_abs_error"] is None  # --no-loso


def test_accuracy_dataset_flag_is_checked():
    result = CliRunner().invoke(app, ["accuracy", "--dataset", "new", "--no-loso"])
    assert result.exit_code == 2 and "--dataset must be one of published, modern or all" in result.output
    result = CliRunner().invoke(app, ["accuracy", "--resolve", "best", "--no-loso"])
    assert result.exit_code == 2 and "--resolve must be default or search" in result.output


def test_accuracy_cli_bad_file_is_one_line(tmp_path):
    bad = tmp_path / "runs.yaml"
    bad.write_text("- id: x\n  model: {}\n")
    result = CliRunner().invoke(app, ["accuracy", str(bad)])
    assert result.exit_code == 2
    assert "run x" in result.output and "Traceback" not in result.output


def test_calibrate_cli_fits_writes_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "a100-40.yaml"
    args = ["calibrate", str(SHIPPED), "--hardware", "dgx-a100-40g", "-o", str(out), "--no-loo",
            "--exclude", "megatron-readme2020-*"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = out.read_text()
    profile = yaml.safe_load(text)
    assert "mosaic-mpt-7b-a100_40gb-128gpu-seq2048" in profile["efficiency"]["source"]
    # says which shipped profile it was fitted from; factors to 4 significant digits, T_misc in ms
    assert text.startswith("# Calibrated by `plan3d calibrate` from dgx-a100-40g.\n")
    eff = profile["efficiency"]
    assert all(float(f"{eff[k]:.4g}") == eff[k] for k in ("matmul", "attention", "hbm", "network"))
    assert str(eff["step_overhead"]).endswith(" ms")
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "--force" in again.output
    from planner.catalog import resolve_hardware
    # loadable by --hardware PATH, named apart from the shipped profile it started from
    assert resolve_hardware(str(out)).name == "dgx-a100-40g-calibrated"


def test_accuracy_on_a_users_own_runs(tmp_path):
    # A user's run in the same schema: an unknown id and source, iteration time only.
    rows = yaml.safe_load(SHIPPED.read_text())
    row = next(r for r in rows if r["id"] == "korthikanti22-175b-selective-sp")
    mine = dict(row, id="my-175b-run", source="My cluster, 2024", notes="[trust=high]")
    mine["measured"] = dict(row["measured"], mfu_percent=None, hfu_percent=None)
    nothing = dict(mine, id="no-figures", measured={k: None for k in row["measured"]})
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump([mine, nothing]))
    result = CliRunner().invoke(app, ["accuracy", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)  # valid JSON even where there is nothing to compare
    run = data["runs"][0]
    assert run["group"] == "My cluster" and run["primary"] == "iteration_s"
    assert run["measured"]["iteration_s"] == 13.75
    # 2024 run: flash attention and the Megatron-Core overlaps are assumed, so it is predicted
    # faster than the same layout run in 2022 (the shipped row).
    from planner.fidelity.compare import compare
    original = next(c for c in load_runs(SHIPPED) if c.id == "korthikanti22-175b-selective-sp")
    assert run["predicted"]["iteration_s"] < compare(original).step_s
    # a run with no measured figure is listed as skipped, not printed as an empty row
    assert len(data["runs"]) == 1
    assert data["skipped"] == [{"id": "no-figures", "reason": "no measured figure to compare"}]


def test_peak_memory_units_per_source(tmp_path):
    # The vocabulary-parallelism code builds on Megatron-LM, whose report_memory divides bytes by
    # 1024*1024 and prints "MB": its 14.86 "GB" is 14.86 GiB = 14.86 * 2**30 bytes.
    cases = {c.id: c for c in load_runs(SHIPPED)}
    vocab = cases["vocabpar-baseline-1f1b-4b-8gpu-seq2048-v32k"]
    assert vocab.measured["peak_memory"] == pytest.approx(14.86 * 2**30)
    # a fact of its source (benchmarks/published_runs_facts.yaml), with that source, not a default
    assert any("report_memory" in s for s in vocab.sources)
    assert not any("GiB" in a for a in vocab.assumptions)
    # A user's row: decimal GB unless its notes tag the unit.
    rows = yaml.safe_load(SHIPPED.read_text())
    row = next(r for r in rows if r["id"] == vocab.id)
    plain = dict(row, id="mine-gb", source="My cluster, 2024", notes="[trust=high]")
    tagged = dict(plain, id="mine-gib", notes="[trust=high] [memory=GiB]")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump([plain, tagged]))
    mine = {c.id: c for c in load_runs(path)}
    assert mine["mine-gb"].measured["peak_memory"] == pytest.approx(14.86e9)
    assert mine["mine-gib"].measured["peak_memory"] == pytest.approx(14.86 * 2**30)
    assert not any("GiB" in a for a in mine["mine-gib"].assumptions)  # stated by the row itself
