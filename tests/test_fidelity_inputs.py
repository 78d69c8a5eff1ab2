"""A user's own runs file for `plan3d accuracy` / `plan3d calibrate` and the benchmark scripts:
misspelled fields and tags are rejected, user text is printed literally, calibration says which
runs it leaves out, and the scripts fail on bad arguments with one line, never a traceback."""

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.errors import UsageError
from planner.fidelity.runs import load_runs
from tests.conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "benchmarks" / "published_runs.yaml"
BASE_ID = "korthikanti22-175b-selective-sp"  # A100-SXM4-80GB, 13.75 s/iter, MFU 51.4 %


def _script(name):
    return load_benchmark(name, f"bench_{name}")


def _row(rid="my-run", notes="[trust=high]", **measured):
    """The shipped Korthikanti 175B row as a user's 2024 run; ``measured`` replaces its figures."""
    rows = yaml.safe_load(SHIPPED.read_text())
    row = next(r for r in rows if r["id"] == BASE_ID)
    row = dict(row, id=rid, source="My cluster, 2024", notes=notes,
               layout=dict(row["layout"]), model=dict(row["model"]), hardware=dict(row["hardware"]))
    if measured:
        row["measured"] = {k: None for k in row["measured"]} | measured
    return row


def _write(tmp_path, rows, name="mine.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(rows))
    return path


def _load_error(tmp_path, rows) -> str:
    with pytest.raises(UsageError) as exc:
        load_runs(_write(tmp_path, rows))
    return str(exc.value)


# ----------------------------------------------------------------------------- rich markup


def test_accuracy_prints_hints_ids_and_sources_literally(tmp_path):
    # MFU without a FLOP convention: skipped, and the hint must keep its "[flops=...]" text,
    # which rich would otherwise take for a markup tag and drop.
    mfu_only = _row("mfu-only", mfu_percent=51.4)
    timed = _row("run-x", iteration_s=13.75)
    timed["source"] = "[italic]Lab[/italic], 2024"
    tpu = _row("tpu-run", iteration_s=13.75)  # skipped (TPU): printed with its reason
    tpu["hardware"]["gpu"] = "TPU v4 [pod]"
    result = CliRunner().invoke(app, ["accuracy", str(_write(tmp_path, [mfu_only, timed, tpu]))])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())  # lines wrap at 80 columns
    assert "(tag the notes [flops=narayanan|korthikanti|mosaic])" in flat
    assert "tpu-run: hardware not modelled by plan3d (TPU v4 [pod]; name a profile" in flat
    assert "[italic]Lab[/italic]" in flat  # the source group, in the summary


# ----------------------------------------------------------------------------- unknown fields


def test_shipped_rows_all_load_with_the_field_check():
    cases = load_runs(SHIPPED)
    assert len(cases) == 60 and len({c.id for c in cases}) == 60


@pytest.mark.parametrize("where, key, accepted", [
    ("layout", "micro_batch_size", "tp, pp, dp, cp, ep, etp, vpp, micro_batch, global_batch, "
                                   "zero_stage, recompute, sequence_parallel"),
    ("layout", "zero", None),
    ("model", "layer", "name, catalog, params_b, layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, "
                       "arch_notes, num_experts, top_k, moe_ffn_hidden, shared_experts, dense_layers"),
    ("hardware", "gpu_count", "gpu, gpus, gpus_per_node, intra_node, inter_node, profile"),
    ("measured", "mfu", "tflops_per_gpu, mfu_percent, hfu_percent, tokens_per_s, iteration_s, "
                        "peak_memory_gb"),
    (None, "foo", "id, source, model, hardware, layout, measured, notes, framework, precision"),
])
def test_unknown_field_is_named_with_the_accepted_ones(tmp_path, where, key, accepted):
    row = _row()
    (row[where] if where else row)[key] = 4
    message = _load_error(tmp_path, [row])
    field = f"{where}.{key}" if where else key
    assert f"run my-run: unknown field '{field}' (accepted: " in message
    if accepted:
        assert message.endswith(f"(accepted: {accepted})")


def test_unknown_field_from_the_cli_is_one_line(tmp_path):
    row = _row()
    row["layout"]["micro_batch_size"] = 2
    result = CliRunner().invoke(app, ["accuracy", str(_write(tmp_path, [row]))])
    assert result.exit_code == 2
    assert "unknown field 'layout.micro_batch_size'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


# ----------------------------------------------------------------------------- notes tags, ids


@pytest.mark.parametrize("notes, named", [
    ("[memory=MiB]", "[memory=MiB]"),
    ("[memory=GiB] [memory=GB]", "[memory=GiB] and [memory=GB]"),
    ("[flops=foo]", "[flops=foo]"),
    ("[flops=narayanan] [flops=mosaic]", "[flops=narayanan] and [flops=mosaic]"),
    ("[Memory = gib]", "[Memory = gib]"),  # a misspelled unit is not silently decimal GB
])
def test_bad_or_conflicting_notes_tags(tmp_path, notes, named):
    message = _load_error(tmp_path, [_row(notes=f"[trust=high] {notes}", peak_memory_gb=30.0)])
    assert "run my-run:" in message and named in message
    assert "\n" not in message


def test_good_tags_still_apply_and_repeating_one_is_fine(tmp_path):
    row = _row(notes="[memory=GiB] [flops=korthikanti] [memory=GiB]", mfu_percent=51.4,
               peak_memory_gb=30.0)
    (case,) = load_runs(_write(tmp_path, [row]))
    assert case.convention == "korthikanti"
    assert case.measured["peak_memory"] == pytest.approx(30.0 * 2**30)  # 30 GiB in bytes


def test_duplicate_run_ids_are_rejected(tmp_path):
    message = _load_error(tmp_path, [_row("twice"), _row("other"), _row("twice")])
    assert "duplicate run id 'twice' (entries 1 and 3)" in message


# ----------------------------------------------------------------------------- calibrate


def test_calibrate_reports_unused_runs_and_a_weak_fit(tmp_path):
    used = _row("mine-used", iteration_s=13.75)
    h100 = _row("mine-h100", iteration_s=13.75)
    h100["hardware"]["gpu"] = "H100-80GB"
    h100["hardware"]["profile"] = "dgx-h100"  # no profile's GPU is named "H100-80GB"
    no_convention = _row("mine-mfu", mfu_percent=51.4)
    excluded = _row("mine-excluded", iteration_s=13.75)
    out = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(app, ["calibrate", str(_write(tmp_path, [used, h100, no_convention, excluded])),
                                      "--hardware", "dgx-a100-80g", "-o", str(out), "--no-loo",
                                      "--exclude", "*-excluded"])
    assert result.exit_code == 0, result.output
    err = " ".join(result.stderr.split())  # notes wrap at 80 columns
    assert "note: 1 of 4 runs usable to calibrate dgx-a100-80g; not used:" in err
    assert "other hardware (dgx-h100): mine-h100" in err
    assert "without a FLOP convention (tag the notes [flops=narayanan|korthikanti|mosaic]): mine-mfu" in err
    assert "excluded by --exclude: mine-excluded" in err
    assert "warning: 1 run for 7 factors: the priors hold most of them; treat the fit as weak" in err
    assert "mine-used" in yaml.safe_load(out.read_text())["efficiency"]["source"]


def test_calibrate_says_when_the_filters_leave_no_run(tmp_path):
    path = _write(tmp_path, [_row(iteration_s=13.75)])
    result = CliRunner().invoke(app, ["calibrate", str(path), "--hardware", "dgx-a100-80g",
                                      "-o", str(tmp_path / "x.yaml"), "--min-trust", "high",
                                      "--exclude", "my-*"])
    assert result.exit_code == 2
    assert "no usable measured run on hardware dgx-a100-80g after --exclude/--min-trust" in result.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_calibrate_output_directory_is_named_as_such(tmp_path):
    result = CliRunner().invoke(app, ["calibrate", str(SHIPPED), "--hardware", "dgx-a100-80g",
                                      "-o", str(tmp_path)])
    assert result.exit_code == 2
    assert f"{tmp_path} is a directory" in result.stderr


# ----------------------------------------------------------------------------- scripts


@pytest.mark.parametrize("repeat", ["0", "-1"])
def test_search_speed_rejects_a_repeat_below_one(repeat, capsys):
    with pytest.raises(SystemExit) as exc:
        _script("search_speed").main(["--repeat", repeat])
    assert exc.value.code == 2
    assert f"--repeat must be >= 1, got {repeat}" in capsys.readouterr().err


def test_fidelity_script_bad_runs_file_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"\xff\xfe\x00\x81binary")
    module = _script("fidelity")
    for runs, says in ((junk, "is not a UTF-8 text"), (tmp_path, "is a directory")):
        assert module.main([str(runs)]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1


def test_fidelity_script_out_needs_a_directory_and_force(tmp_path, capsys):
    runs = str(_write(tmp_path, [_row(iteration_s=13.75)]))
    module = _script("fidelity")
    assert module.main([runs, "--out", str(tmp_path / "missing" / "t.md")]) == 2
    assert "directory" in capsys.readouterr().err and not (tmp_path / "missing").exists()
    mine = tmp_path / "notes.md"
    mine.write_text("my notes\n")
    assert module.main([runs, "--out", str(mine)]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert mine.read_text() == "my notes\n"  # untouched
    assert module.main([runs, "--out", str(mine), "--force"]) == 0
    assert "| my-run | s/iter | 13.75 |" in mine.read_text()


def test_trust_tag_values_are_checked_and_flops_tag_beats_the_prefix(tmp_path):
    # [trust=hgih] used to read as "unknown", so --min-trust silently dropped the run; a
    # [flops=...] tag on an id with a shipped prefix used to be overridden by the prefix.
    rows = yaml.safe_load(SHIPPED.read_text())
    row = next(r for r in rows if r["id"] == "korthikanti22-175b-selective-sp")
    bad = dict(row, id="mine", source="Mine, 2024", notes="[trust=hgih]")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump([bad]))
    with pytest.raises(UsageError, match=r"unknown notes tag \[trust=hgih\]"):
        load_runs(path)
    tagged = dict(row, id="mosaic-mine", notes="[trust=high] [flops=korthikanti]")
    path.write_text(yaml.safe_dump([tagged]))
    case = load_runs(path)[0]
    assert case.convention == "korthikanti" and case.trust == "high"


def test_run_id_must_be_usable_as_a_name(tmp_path):
    rows = yaml.safe_load(SHIPPED.read_text())
    row = dict(rows[0], id="my run[bold]")
    path = tmp_path / "ids.yaml"
    path.write_text(yaml.safe_dump([row]))
    with pytest.raises(UsageError, match=r"run id 'my run\[bold\]': use letters, digits and"):
        load_runs(path)


def test_zero3_script_bad_input_is_one_line(tmp_path, capsys):
    module = _script("zero3_2021")
    runs = str(_write(tmp_path, [_row(iteration_s=13.75)]))  # a valid file without ZeRO-3 rows
    for path, says in ((runs, "no run whose id starts with 'megatron21-t2-zero3-'"),
                       (str(tmp_path / "missing.yaml"), "cannot read")):
        assert module.main([path]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1
