"""The formatters (planner.render.fmt) and the per-command value formats built on them: every
expected string is derived by hand in the comment beside it."""

from __future__ import annotations

import pytest

from planner import catalog
from planner import fmt
from planner.render.console import MIN_WIDTH, layout_width
from planner.render.regress import change_text, pair_text, value_text
from planner.render.validate import value_text as check_value


def test_number_keeps_significant_digits_without_exponents():
    assert fmt.number(0.011301759494192475, 4) == "0.01130"  # 1.130e-2: four digits, zero kept
    assert fmt.number(11.301759, 4) == "11.30"
    assert fmt.number(123456.7, 4) == "123457"  # never "1.235e+05"
    assert fmt.number(123456.7, 4, grouping=True) == "123,457"
    assert fmt.number(9.99996, 4) == "10.00"  # rounding up adds a digit: one decimal fewer
    assert fmt.number(1.13966857899999, 12) == "1.13966857900"  # the validator's losses
    assert fmt.number(1.5e-7, 3) == "1.50e-07"  # below 1e-4: scientific
    assert fmt.number(0) == "0" and fmt.number(float("nan")) == "nan"


def test_significant_and_durations_read_back_with_units():
    assert fmt.significant(0.80123456) == "0.8012"
    assert fmt.significant(0.231) == "0.231"  # trailing zeros dropped
    assert fmt.duration_text(0.011301759494192475) == "11.3 ms"  # 11.30 ms, zero dropped
    assert fmt.duration_text(2.5e-5) == "25 us"
    assert fmt.duration_text(1.5) == "1.5 s" and fmt.duration_text(0.0) == "0 s"
    from planner.units import parse_quantity
    assert parse_quantity(fmt.duration_text(0.0113), "time") == pytest.approx(0.0113)


def test_seconds_bytes_bandwidth_parameters_percentages():
    assert fmt.seconds(0.0659) == "65.9 ms" and fmt.seconds(13.567) == "13.57 s"
    assert fmt.seconds(5400) == "1.5 h" and fmt.seconds(4.89e6) == "56.6 days"  # 4.89e6/86400
    # 1,000 days and beyond in Julian years: 5,192.6 days / 365.25 = 14.2 years; a run that
    # would not end (3.8e20 days) is not printed as a 21-digit number
    assert fmt.seconds(999.9 * 86400) == "999.9 days" and fmt.seconds(5192.6 * 86400) == "14.2 years"
    assert fmt.seconds(3.776e20 * 86400) == "> 10,000 years" and fmt.seconds(float("inf")) == "never"
    assert fmt.signed_seconds(2.09) == "+2.09 s" and fmt.signed_seconds(-0.2534) == "−253.4 ms"
    assert fmt.gib(66_140_079_104) == "61.6 GiB"  # 66140079104 / 2^30 = 61.598
    assert fmt.capacity(80 * 2**30) == "80" and fmt.capacity(141e9) == "131.3"  # 141e9/2^30
    assert fmt.binary_bytes(3 * 2**20) == "3.000 MiB" and fmt.binary_bytes(512) == "512 B"
    assert fmt.bandwidth(450e9) == "450 GB/s" and fmt.bandwidth(50e9, bits=True) == "400 Gb/s"
    assert fmt.params(174.6e9) == "174.6B" and fmt.params(1.008e12) == "1.01T"
    assert fmt.percent(0.4858) == "48.6%" and fmt.percent(0.021, signed=True) == "+2.1%"
    assert fmt.percent(None) == "" and fmt.percent(float("nan")) == ""
    assert fmt.tokens_per_s(231786.87) == "231,787"
    assert fmt.tflops(480.73e12) == "481"


def test_money_always_carries_its_currency():
    assert fmt.money(434758.2, "USD") == "USD 434,758"
    assert fmt.money(2.5, "EUR") == "EUR 2.50"  # under 100: cents kept


def test_percent_change_never_uses_an_exponent():
    assert fmt.percent_change(0.01, 4) == "+1.000%"
    assert fmt.percent_change(-1.544e-6, 4) == "-0.0001544%"  # 1.544e-4 %: 7 decimals
    assert fmt.percent_change(0.25) == "+25.0%"


def test_piped_output_is_laid_out_for_at_least_80_columns(monkeypatch, tmp_path):
    with open(tmp_path / "f", "w") as stream:  # a file is not a terminal
        monkeypatch.delenv("COLUMNS", raising=False)
        assert layout_width(stream) == MIN_WIDTH == 80
        monkeypatch.setenv("COLUMNS", "132")
        assert layout_width(stream) == 132
        monkeypatch.setenv("COLUMNS", "40")  # narrower than the tables' design: 80
        assert layout_width(stream) == 80


def test_regress_values_carry_their_units_in_one_format():
    # memory.total 66140079104 B = 61.598... GiB; 61.60 vs 62.53 differ at four digits
    assert pair_text("memory.total", 66_140_079_104.0, 67_140_079_104.0) == ("61.60 GiB", "62.53 GiB")
    # 1e-6 apart: digits added until they differ (231,786.9 vs 231,787.1 at seven)
    assert pair_text("rank1.throughput.tokens_per_s", 231786.8722, 231787.104) == \
        ("231,786.9 tokens/s", "231,787.1 tokens/s")
    assert value_text("time.bubble_fraction", 0.01230752924) == "1.231%"
    assert value_text("throughput.mfu", 0.4956504449) == "49.57%"
    assert value_text("rank3.layout.tp", 8) == "8" and value_text("memory.fits", True) == "true"
    assert value_text("search.enumerated", 253440) == "253,440"
    assert value_text("time.step", 64.76323211) == "64.76 s"
    assert value_text("throughput.model_tflops_per_gpu", 480.7272487) == "480.7 TFLOP/s"

    class Moved:
        kind, before, after = "moved", 10.0, 10.1
        rel = 0.01
    assert change_text(Moved) == "+1.000%"


def test_validate_values_are_consistent():
    assert check_value("loss step 0", 1.13966857899999) == "1.13966857900"
    assert check_value("loss step 1", 5.5) == "5.50000000000"  # same 12 digits for every loss
    assert check_value("comm pp0 tp:all_gather", [36, 1179648]) == "36 x 1,179,648 B"
    assert check_value("params_bytes pp0", 181248) == "181,248 B"
    assert check_value("step time pp0", 2.131) == "2.13 s"
    assert check_value("loss step 2", None) == "-"


def test_calibrated_profile_writes_rounded_factors_with_units(tmp_path):
    from planner.fidelity.calibrate import with_factors
    from planner.fidelity.profile_io import write_profile
    hw = catalog.resolve_hardware("dgx-h100")
    fitted = with_factors(hw, {"matmul": 0.80123456, "step_overhead": 0.011301759494192475})
    fitted = fitted.model_copy(update={"name": "dgx-h100-calibrated"})
    path = tmp_path / "p.yaml"
    write_profile(fitted, path, calibrated_from=hw.name)
    text = path.read_text()
    assert text.startswith("# Calibrated by `plan3d calibrate` from dgx-h100.\n")
    assert "  matmul: 0.8012\n" in text and "  step_overhead: 11.3 ms\n" in text
    again = catalog.resolve_hardware(str(path))  # reloads: 11.3 ms = 0.0113 s
    assert again.efficiency.step_overhead == pytest.approx(0.0113)
    assert again.efficiency.matmul == 0.8012


def test_placement_names_what_crosses_nodes():
    from planner.render.placement import placement_text
    dims = {"pp": {"size": 2, "groups": 64, "stride": 8, "examples": [[0, 8]], "ranks_per_node": 1,
                   "nodes_per_group": 2, "groups_crossing_nodes": 64},
            "tp": {"size": 8, "groups": 1, "stride": 1, "examples": [[0, 1]], "ranks_per_node": 8,
                   "nodes_per_group": 1, "groups_crossing_nodes": 1}}
    data = {"gpus": 16, "nodes": 2, "gpus_per_node": 8, "order_description": "x", "dims": dims,
            "tp_crosses_node": False, "cost_model": {"tp": {"agrees": True}}, "exports_assume": "y"}
    text = placement_text(data)
    # columns: size, groups, stride, ranks/node, nodes, domains, off node, off domain (absent: 0)
    rows = {ln.split()[0]: ln.split()[1:4] + ln.split()[-2:-1] for ln in text.splitlines()
            if ln.startswith(("PP ", "TP ")) and ln.split()[1].isdigit()}
    assert rows["PP"] == ["2", "64", "8", "64"] and rows["TP"] == ["8", "1", "1", "1"]
    assert "2 nodes of 8" in text


def test_sweep_plot_is_log_log_with_ideal_scaling_and_mfu_on_its_own_axis():
    pytest.importorskip("matplotlib")
    from planner.render.plot import IDEAL_GID, scaling_figure
    rows = [{"gpus": 64, "global_batch_size": 1536, "tokens_per_s": 30_000.0, "mfu": 0.50},
            {"gpus": 128, "global_batch_size": 1536, "tokens_per_s": 58_000.0, "mfu": 0.48},
            {"gpus": 256, "global_batch_size": 1536, "error": "no fit", "scaling_efficiency": None},
            {"gpus": 512, "global_batch_size": 1536, "tokens_per_s": 200_000.0, "mfu": 0.42}]
    fig = scaling_figure(rows, "t")
    try:
        tps, mfu = fig.axes
        assert (tps.get_xscale(), tps.get_yscale()) == ("log", "log")
        assert mfu.get_xscale() == "log" and mfu.get_yscale() == "linear"
        assert "MFU" in mfu.get_ylabel() and "tokens/s" in tps.get_ylabel()
        ideal = [line for line in tps.get_lines() if line.get_gid() == IDEAL_GID]
        assert len(ideal) == 1
        x, y = ideal[0].get_data()
        # linear from the first point: 30,000 tokens/s x n / 64 -> 60,000 at 128, 240,000 at 512
        assert list(x) == [64, 128, 512] and list(y) == [30_000.0, 60_000.0, 240_000.0]
        (measured,) = [line for line in tps.get_lines() if line.get_gid() != IDEAL_GID]
        assert list(measured.get_ydata()) == [30_000.0, 58_000.0, 200_000.0]  # the error row left out
        assert list(mfu.get_lines()[0].get_ydata()) == [50.0, 48.0, 42.0]  # in %
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


def test_only_render_and_cli_print():
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "planner"
    for path in root.rglob("*.py"):
        if path.relative_to(root).parts[0] in ("render", "cli"):
            continue
        text = path.read_text()
        assert not re.search(r"(?<![\w.])print\(|sys\.std(out|err)\.write|\bConsole\(", text), path
