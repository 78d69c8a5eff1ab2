"""Defects a new-user test found in search / sweep / estimate: each error is one exact line on
stderr with its exit code (2 = bad input, 1 = valid input that does not fit)."""

import json
import re
import subprocess
import sys

import pytest

from planner.layout import Layout
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from tests.conftest import wide_console
from planner.inputs import MAX_GPUS
from planner.search.options import SearchOptions
from planner.search.whynot import why_not

runner = CliRunner()
GIB = 2.0**30


def cli(*args):
    """(exit code, stdout, stderr) of ``plan3d args`` run in-process."""
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("flag", ["--tp", "--pp", "--cp", "--micro-batch-size", "--vpp", "--dp"])
def test_estimate_size_flags_must_be_positive_not_defaulted(flag):
    # the defaults (tp or 1 ...) used to turn an explicit 0 into 1 and estimate that layout
    code, out, err = cli("estimate", "--model", "175b", "--gpus", "512", flag, "0")
    assert (code, out, err) == (2, "", f"error: {flag} must be positive, got 0\n")


def test_distributed_optimizer_implies_zero_stage_0():
    code, out, err = cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8",
                         "--distributed-optimizer", "--json")
    assert code == 0, err
    lay = json.loads(out)["layout"]
    assert (lay["zero_stage"], lay["distributed_optimizer"], lay["dp"]) == (0, True, 8)  # 512/64
    code, out, err = cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "8", "--pp", "8",
                         "--distributed-optimizer", "--zero-stage", "1")
    assert code == 2 and out == ""
    assert err == ("error: --distributed-optimizer replaces ZeRO, so it needs --zero-stage 0 (got 1): "
                   "drop --zero-stage, or drop --distributed-optimizer to keep ZeRO-1\n")


def test_headroom_needs_a_unit():
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--min-memory-headroom", "4")
    assert (code, out, err) == (2, "", "error: --min-memory-headroom: 4 needs a unit, e.g. '4GiB' "
                                       "or '4%'\n")


@pytest.mark.parametrize("command,gpus", [("search", "512"), ("sweep", "256:512")])
@pytest.mark.parametrize("headroom,left", [("1TiB", "0.0"), ("79.9GiB", "0.0"), ("78.7GiB", "0.9")])
def test_headroom_leaving_no_room_is_refused_up_front(command, gpus, headroom, left):
    # dgx-h100: 81,559 MiB = 79.65 GiB of HBM (printed 79.6); megatron-core's runtime reserve
    # 1 GiB (framework_profiles/megatron-core.yaml) is the least any layout keeps;
    # 79.65 - 79.9 < 0 -> 0.0 GiB, 79.65 - 78.7 = 0.95 -> 0.9 GiB, both below 1 GiB
    code, out, err = cli(command, "--model", "175b", "--gpus", gpus, "--min-memory-headroom", headroom)
    assert (code, out) == (2, "")
    assert err == (f"error: --min-memory-headroom {headroom} leaves {left} GiB of the 79.6 GiB per "
                   "H100-SXM5-80GB, no more than its 1.0 GiB runtime reserve: no layout can fit\n")


def test_no_fit_with_a_large_headroom_names_a_count_that_works_or_none():
    # 72 GiB headroom leaves 81,559 MiB - 72 GiB = 79.65 - 72 = 7.65 GiB (printed 7.6) per GPU.
    # The count named must be one on which the same search (same headroom) finds that layout.
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--min-memory-headroom", "72GiB")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "of 7.6 GiB usable (of 79.6 GiB, after the headroom)" in err
    found = re.search(r"the fewest GPUs on which a layout fits are ([0-9,]+) \((tp=[^,]+), ", err)
    need, layout = int(found.group(1).replace(",", "")), found.group(2)
    assert 512 < need <= MAX_GPUS and need % 8 == 0
    code, out, err = cli("search", "--model", "175b", "--gpus", str(need), "--min-memory-headroom",
                         "72GiB", "--top", "1", "--json")
    assert code == 0, err
    assert json.loads(out)[0]["layout"] == Layout(**_layout_dict(layout)).model_dump()
    # 76 GiB leaves 3.65 GiB: beyond the 1 GiB runtime reserve, but below what any layout needs
    # with its communicators' and allocator's reserve: no count fits, and none is named
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--min-memory-headroom",
                         "76GiB")
    assert code == 1 and "fewest" not in err
    assert err.endswith("no count of GPUs up to 1,000,000 has a layout that fits: use less "
                        "headroom or GPUs with more memory\n"), err


def _layout_dict(short: str) -> dict:
    """The Layout fields of a short form 'tp=8 cp=16 pp=96 dp=64 zero=2 mbs=1 vpp=1 recompute=full sp'."""
    names = {"zero": "zero_stage", "mbs": "micro_batch_size"}
    fields = dict(cp=1, ep=1, etp=1, distributed_optimizer=False, first_stage_layers=0,
                  last_stage_layers=0, sequence_parallel=False, recompute_num_layers=0,
                  offload_layers=0)
    for part in short.split():
        key, _, value = part.partition("=")
        if key == "sp":
            fields["sequence_parallel"] = True
        elif key == "offload":
            fields["offload_layers"] = int(value)
        elif key in ("tpoverlap", "a2aoverlap"):  # software switches (layout.axes): on when named
            fields["tp_comm_overlap" if key == "tpoverlap" else "moe_a2a_overlap"] = True
        elif key in ("dispatcher", "graphs", "schedule"):
            fields[{"dispatcher": "moe_dispatcher", "graphs": "cuda_graphs",
                    "schedule": "pipeline_schedule"}[key]] = value
        elif key == "recompute":  # full:N = full recompute of N layers per chunk
            mode, _, n = value.partition(":")
            fields["recompute"], fields["recompute_num_layers"] = mode, int(n or 0)
        else:
            fields[names.get(key, key)] = int(value)
    return fields


def test_sweep_without_any_fit_exits_1_like_search():
    # 175B on 8 or 16 H100s: model states alone are ~184 GiB per GPU (see the message)
    code, out, err = cli("sweep", "--model", "175b", "--gpus", "8:16")
    assert code == 1 and out == "" and err.count("\n") == 1
    assert err.startswith("error: no GPU count in 8..16 has a layout of gpt3-175b that fits: no "
                          "layout of gpt3-175b fits on 16 x H100-SXM5-80GB: the closest, ")


def test_sweep_json_leaves_stderr_empty_and_header_lists_every_batch():
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", "sweep",
                           "--model", "175b", "--gpus", "256:512", "--json"],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == ""
    assert [r["gpus"] for r in json.loads(proc.stdout)] == [256, 512]
    code, out, err = cli("sweep", "--model", "175b", "--gpus", "512", "--global-batch-size", "768,1536")
    assert code == 0 and err == ""
    flat = " ".join(out.split())
    assert "on 512 x H100-SXM5-80GB (dgx-h100), global batch 768,1536 x 2048 tokens" in flat  # one count


@pytest.mark.parametrize("pins,why,message", [
    (["--tp", "8"], "tp=4", "--why-not tp=4 contradicts the search pin --tp 8; drop one of them"),
    (["--no-sequence-parallel"], "sp=1",
     "--why-not sp=1 contradicts the search pin --no-sequence-parallel; drop one of them"),
    (["--max-tp", "4"], "tp=8",
     "--why-not tp=8 is above the search bound --max-tp 4; raise the bound or pick a smaller value"),
    ([], "tp=2,tp=4", "--why-not: tp is given twice in 'tp=2,tp=4'; give each dimension once"),
    ([], "zero=1,zero_stage=2",
     "--why-not: zero is given twice in 'zero=1,zero_stage=2'; give each dimension once"),
    ([], "sp=maybe", "--why-not: sp must be 1, true, yes or on (or 0, false, no, off), got 'maybe'"),
])
def test_why_not_input_errors(pins, why, message):
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", *pins, "--why-not", why)
    assert (code, out, err) == (2, "", f"error: {message}\n")


def test_why_not_no_fit_speaks_of_this_layout(gpt3_h100):
    m, hw, tr = gpt3_h100
    verdict = why_not(m, hw, tr, 512, SearchOptions(), "tp=1,pp=1,zero=0")
    assert verdict.status == "no-fit"
    (reason,) = verdict.reasons
    # 174.6e9 parameters unsharded (tp=pp=1, no ZeRO) cannot fit 81,559 MiB = 79.65 GiB (printed
    # 79.6), yet the search has fits
    # and with tp=pp=1 and ZeRO-0 every GPU holds all 174.6e9 x 18 B of model states, whatever
    # the count: no count makes it fit, and the reason says so
    assert reason.startswith("its closest completion, tp=1 ") and reason.endswith(
        ", while other layouts fit; with these values no count of GPUs has a completion that fits")
    assert "no layout of" not in reason
    total = float(verdict.completion.memory["total"][0])
    cap = 81_559 * 2**20
    assert f"needs {total / GIB:.1f} GiB of 79.6 GiB per GPU ({(total - cap) / GIB:.1f} GiB over)" in reason


def test_search_json_has_gpus_and_max_gpus_table_shows_them():
    code, out, err = cli("search", "--model", "175b", "--max-gpus", "1024", "--top", "3", "--json")
    assert code == 0, err
    for entry in json.loads(out):
        assert set(entry) == {"layout", "gpus", "memory", "time", "throughput", "stages", "ties",
                              "to_fit", "checkpoint", "recompute", "band", "tie_group"}
        lay = entry["layout"]
        assert entry["gpus"] == lay["tp"] * lay["cp"] * lay["pp"] * lay["dp"] <= 1024
    with wide_console():  # one column per dimension and figure
        code, out, err = cli("search", "--model", "175b", "--max-gpus", "1024", "--top", "3")
    assert code == 0, err
    head = next(line for line in out.splitlines() if line.lstrip().startswith("#"))
    cols = [c.strip() for c in head.split("┃")]
    assert cols[-1] == "GPUs"  # every shown layout uses 1,024: the column still says so
    degrees = [c for c in cols if c in ("tp", "cp", "pp", "dp")]
    assert cols[1:1 + len(degrees)] == degrees  # as in "tp=2 cp=2 pp=16": cp beside tp
    assert degrees[:1] == ["tp"] and degrees[-1] == "dp"
    code, out, err = cli("search", "--model", "175b", "--max-gpus", "1024", "--top", "3")
    head = [line for line in out.splitlines() if "┃" in line][:3]  # 80 columns: stacked figures
    assert [c.strip() for c in head[2].split("┃")][2] == "GPUs"  # third line of the first stack


def test_top_beyond_the_kept_layouts_says_so():
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--top", "100000", "--json")
    rows = json.loads(out)  # a row stands for the layouts that tie with it exactly (ties)
    shown = re.fullmatch(r"note: --top 100,000 shows the best ([0-9]+) rows \(256 layouts\) of the "
                         r"[0-9,]+ layouts that fit \(the search keeps 256\)", " ".join(err.split()))
    assert code == 0 and shown and int(shown.group(1)) == len(rows) <= 256, err  # search.KEEP
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--top", "3", "--json")
    assert code == 0 and err == ""


def test_cross_node_tp_is_suggested_and_available_on_estimate():
    hint = "(pass --allow-cross-node-tp to let tp span nodes)"
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--tp", "16")
    assert (code, out) == (2, "")
    assert err == ("error: no layout of gpt3-175b on 512 GPUs passes the rule 'tp within the NVLink "
                   f"domain' {hint}\n")
    code, out, err = cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "16")
    assert (code, out) == (2, "")
    assert err == ("error: layout tp=16 pp=1 dp=32 zero=1 mbs=1 vpp=1 recompute=none breaks: tp "
                   f"within the NVLink domain {hint}\n")
    code, out, err = cli("estimate", "--model", "175b", "--gpus", "512", "--tp", "16", "--pp", "8",
                         "--allow-cross-node-tp", "--json")
    assert code == 0, err
    assert json.loads(out)["layout"]["tp"] == 16 and catalog.resolve_hardware("dgx-h100").gpus_per_node == 8


def test_estimate_plan_with_cross_node_tp(tmp_path):
    # a plan exported by a search that allowed tp=16 is evaluated as is (like every plan consumer)
    plan = tmp_path / "plan.yaml"
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", "--tp", "16", "--pp", "8",
                       "--allow-cross-node-tp", "--export", str(plan), "--json", "--top", "1")
    assert code == 0, err
    code, out, err = cli("estimate", "--plan", str(plan), "--json")
    assert code == 0, err
    assert json.loads(out)["layout"]["tp"] == 16
    code, out, err = cli("estimate", "--plan", str(plan), "--allow-cross-node-tp")
    assert (code, out) == (2, "")
    assert err.startswith("error: --plan cannot be combined with --allow-cross-node-tp: ")


def test_estimate_help_shows_its_defaults():
    # "[default: 1]" unescaped is rich markup: the help used to print "Tensor-parallel size ."
    code, out, _ = cli("estimate", "--help")
    assert code == 0
    out = " ".join(out.split())  # click wraps the help text at the width
    assert "Tensor-parallel size [default: 1]." in out
    assert "ZeRO stage 0-3 [default: 1, else the framework's highest (torchtitan: 3)" in out


def test_help_keeps_option_names_whole_at_80_columns():
    # typer's rich panels cut long option names at 80 columns ("--global-batch-s…"); click's
    # layout wraps the help text beside them instead
    import os
    import subprocess
    import sys
    env = {**os.environ, "COLUMNS": "80"}
    for command in ("search", "estimate", "sweep"):
        out = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", command,
                              "--help"], env=env,
                             capture_output=True, text=True, check=True).stdout
        assert "…" not in out and max(map(len, out.splitlines())) <= 80, command
        for name in ("--global-batch-size", "--allocator-reserve"):
            assert name in out, (command, name)
