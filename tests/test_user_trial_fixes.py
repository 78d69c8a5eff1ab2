"""Problems a new-user trial found (README set-up, COLUMNS=80, bad input), each fixed: the
estimate's default ZeRO stage follows the framework, NaN/infinite numbers in input files, the
reason for an expert group larger than the GPUs, a restart time far beyond the MTBF, an empty
catalog name, placement's rank order from the plan's framework, a price without a cost, the EP
overlap where it cannot run, the split label of two stages, wording."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.layout import Layout
from tests.cli_errors import one_line_error
from tests.test_frameworks import unwrapped

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def estimate_layout(args: list[str]) -> dict:
    res = runner.invoke(app, ["estimate", *args, "--json"])
    assert res.exit_code in (0, 1), res.stderr
    return json.loads(res.stdout)["layout"]


@pytest.mark.parametrize("framework, model, extra, zero", [
    ("torchtitan", "llama3-8b", [], 3),  # offers 0 and 3 (FSDP): its highest
    ("megatron-lm-2021", "gpt3-175b", ["--tp", "8", "--pp", "8"], 0),  # offers 0 only
    ("megatron-core", "llama3-8b", [], 1),  # ZeRO-1 (the distributed optimizer's memory)
    ("deepspeed", "llama3-8b", ["--pp", "2"], 1),  # ZeRO-2/3 need pp = 1 there; 1 is offered
])


def test_estimate_default_zero_stage_follows_the_framework(framework, model, extra, zero):
    gpus = "64" if model == "gpt3-175b" else "8"
    lay = estimate_layout(["-m", model, "-g", gpus, "--framework", framework, *extra])
    assert lay["zero_stage"] == zero


def test_estimate_given_zero_stage_is_kept():
    # a stage the framework does not offer stays an error naming the framework's rule
    line = one_line_error(["estimate", "-m", "llama3-8b", "-g", "8", "--framework", "torchtitan",
                           "--zero-stage", "1"])
    assert "torchtitan offers ZeRO stages 0, 3" in line


@pytest.mark.parametrize("old, new, field", [
    ("bf16: 989.4", "bf16: .nan", "gpu.peak_tflops.bf16"),
    ("bf16: 989.4", "bf16: .inf", "gpu.peak_tflops.bf16"),
    ("  matmul: 0.605", "  matmul: .nan", "efficiency.matmul"),
])


def test_nan_and_infinite_numbers_are_refused(tmp_path, old, new, field):
    text = (ROOT / "hardware_profiles" / "dgx-h100.yaml").read_text()
    assert old in text
    path = tmp_path / "hw.yaml"
    path.write_text(text.replace(old, new, 1))
    line = one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--hardware", str(path)])
    assert f"{field}: Input should be a finite number" in line


def test_infinite_rope_base_is_refused_for_every_framework(tmp_path):
    data = yaml.safe_load((ROOT / "models" / "qwen3-30b-a3b.yaml").read_text())
    data["rope_theta"] = float("inf")
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data))
    for framework in ("megatron-core", "torchtitan"):
        line = one_line_error(["search", "-m", str(path), "-g", "8", "--framework", framework])
        assert "rope_theta: Input should be a finite number" in line


@pytest.mark.parametrize("args, group", [
    (["-m", "qwen3-30b-a3b", "-g", "8", "--ep", "16"], "ep 16 (with any etp) does not divide the 8 GPUs,"),
    (["-m", "deepseek-v3", "-g", "1024", "--etp", "3"], "etp 3 (with any ep) does not divide the 1,024 GPUs,"),
    # pp 16 on 16 GPUs leaves one GPU per stage: 16 % 2 == 0 but 1 % 2 != 0
    (["-m", "qwen3-30b-a3b", "-g", "16", "--pp", "16", "--ep", "2"],
     "ep 2 (with any etp) does not divide the 1 GPU of a pipeline stage (16 GPUs / pp 16)"),
    (["-m", "qwen3-30b-a3b", "--max-gpus", "8", "--ep", "16"],
     "ep 16 (with any etp) does not divide the --max-gpus budget of 8 GPUs"),
])


def test_an_expert_group_that_cannot_tile_the_gpus_is_named(args, group):
    line = one_line_error(["search", *args])
    assert group in line and "'etp*ep dividing the tp*cp*dp GPUs of a pipeline stage'" in line


def test_estimate_names_the_folding_rule_apart_from_the_expert_count():
    # 128 experts are divisible by 16; 16 does not divide the 8 GPUs of the (single) stage
    line = one_line_error(["estimate", "-m", "qwen3-30b-a3b", "-g", "8", "--ep", "16"])
    assert "etp*ep dividing the tp*cp*dp GPUs of a pipeline stage" in line
    assert "experts divisible by ep" not in line


@pytest.mark.filterwarnings("error")  # pytest captures warnings: make numpy's fail the test
def test_restart_time_far_beyond_the_mtbf_gives_no_warnings():
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--restart-time", "1e9d",
                              "--top", "1"])
    assert res.exit_code == 0, res.stderr
    assert "Warning" not in res.stderr and "overflow" not in res.stderr
    assert "0.00% of wall-clock time advances training" in res.stdout


def test_failure_rate_zero_says_what_is_allowed():
    line = one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--failure-rate", "0"])
    assert "above 0 and below 1" in line and "1e-12" in line


def test_empty_catalog_name():
    assert "an empty name" in one_line_error(["models", "--show", ""])
    assert "an empty name" in one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--hardware", " "])


def test_placement_takes_the_plans_framework_order(tmp_path):
    plan = tmp_path / "tt.yaml"
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "16", "--framework", "torchtitan",
                              "--tp", "2", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    shown = runner.invoke(app, ["placement", str(plan)])
    assert "rank order: torchtitan mesh" in shown.stdout
    forced = runner.invoke(app, ["placement", str(plan), "--order", "megatron"])
    assert forced.exit_code == 0, forced.stderr
    assert "rank order: Megatron" in forced.stdout and "rank order: torchtitan" not in forced.stdout


def test_price_alone_prices_the_run():
    # llama3-8b's 15T-token budget: the cost column appears with a price alone
    res = runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--price-per-gpu-hour", "2",
                              "--top", "1", "--json"])
    assert res.exit_code == 0, res.stderr
    entry = json.loads(res.stdout)[0]
    # cost = GPU-hours x price: 8 GPUs x the time to train / 3600 x 2 USD
    assert entry["throughput"]["cost"] == pytest.approx(
        8 * entry["throughput"]["time_to_train_s"] / 3600 * 2, rel=1e-9)
    # a model without a token budget cannot be priced
    line = one_line_error(["search", "-m", "megatron-3.6b", "-g", "8", "--price-per-gpu-hour", "2"])
    assert "needs a token budget" in line and "--tokens" in line


def test_ep_overlap_that_cannot_run_is_refused():
    # pp 2 without interleaving: Megatron-Core's combined 1F1B cannot pair micro-batches
    # (transformer_config.py L3007-3011); the EP overlap is a layout axis, refused by its rule
    base = ["estimate", "-m", "qwen3-30b-a3b", "-g", "16", "--pp", "2", "--ep", "8", "--moe-a2a-overlap"]
    line = one_line_error(base)
    assert "EP overlap needs ep > 1, vpp > 1 with pp > 1" in line
    res = runner.invoke(app, [*base, "--vpp", "2"])
    assert res.exit_code == 0, res.stderr


def test_split_label_of_two_stages():
    lay = Layout(tp=1, pp=2, dp=4, zero_stage=1, micro_batch_size=1, first_stage_layers=32,
                 last_stage_layers=29)
    assert "pp=2 (32+29 layers)" in lay.short()
    lay = lay.model_copy(update={"pp": 4, "dp": 2})
    assert "pp=4 (32+..+29 layers)" in lay.short()


def test_hbm_capacity_in_a_wrong_unit_is_refused(tmp_path):
    text = (ROOT / "hardware_profiles" / "dgx-h100.yaml").read_text()
    path = tmp_path / "hw.yaml"
    path.write_text(text.replace("hbm_capacity: 81559 MiB", "hbm_capacity: 81559 TiB", 1))
    line = one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--hardware", str(path)])
    assert "beyond any accelerator" in line
    # every shipped profile (GB200's 184 GiB the largest) loads: far below the 2 TiB bound
    listing = runner.invoke(app, ["hardware"])
    assert listing.exit_code == 0 and "gb200-nvl72" in listing.stdout, listing.stderr


def test_default_zero_stage_with_pipeline_stages():
    # a profile offering ZeRO 0 and 3 with ZeRO-3 only at pp = 1: pp 1 -> 3, pp 2 -> 0;
    # megatron-core (0-3, any with pp) -> 1 either way
    from planner import catalog
    from planner.search.framework_rules import default_zero_stage
    rules = catalog.resolve_framework("torchtitan").rules.model_copy(
        update={"zero_stages": [0, 3], "max_zero_stage_with_pp": 0})
    assert (default_zero_stage(rules, 1), default_zero_stage(rules, 2)) == (3, 0)
    core = catalog.resolve_framework("megatron-core").rules
    assert (default_zero_stage(core, 1), default_zero_stage(core, 4)) == (1, 1)


# --- second trial: exports, Hugging Face configs, runs files ---

HF = ROOT / "tests" / "data" / "hf"


def test_bridge_export_leaves_an_unknown_norm_epsilon_out(tmp_path):
    # gpt3-175b states no norm epsilon: null would replace the provider's float (1e-5)
    plan = tmp_path / "p.yaml"
    res = runner.invoke(app, ["search", "--model", "175b", "--gpus", "512", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    out = runner.invoke(app, ["export", str(plan), "--to", "nemo"])
    assert out.exit_code == 0, out.stderr
    assert "layernorm_epsilon: null" not in out.stdout and "layernorm_epsilon=null" not in out.stdout
    assert "layernorm_epsilon (Megatron-Core default 1e-5) applies" in unwrapped(out.stdout)


@pytest.mark.parametrize("source, field, value, words", [
    ("mixtral-8x7b.json", "tie_word_embeddings", "no", "tie_word_embeddings must be true or false"),
    ("mixtral-8x7b.json", "num_attention_heads", 0, "num_attention_heads must be a positive integer"),
    ("qwen3-30b-a3b.json", "decoder_sparse_step", 0, "decoder_sparse_step must be at least 1"),
])


def test_hugging_face_fields_out_of_range(tmp_path, source, field, value, words):
    cfg = json.loads((HF / source).read_text())
    cfg[field] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert words in one_line_error(["models", "--show", str(path)])


def test_runs_file_batch_not_whole_micro_batches(tmp_path, monkeypatch):
    # korthikanti22-175b-selective-sp: dp 1 (64 GPUs, tp 8, pp 8), micro-batch 1, batch 64;
    # with dp stated as 2 (tp 8, pp 4) and micro_batch 1 a batch of 63 splits 31.5 per rank
    rows = yaml.safe_load((ROOT / "benchmarks" / "published_runs.yaml").read_text())
    row = next(r for r in rows if r["id"] == "korthikanti22-175b-selective-sp")
    row = dict(row, id="mylab-175b", notes="[flops=korthikanti]",
               layout=dict(row["layout"], pp=4, dp=2, micro_batch=1, global_batch=63))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump([row]))
    line = one_line_error(["accuracy", "runs.yaml"])
    assert "run mylab-175b: layout.global_batch 63 is not a multiple of dp x micro_batch = 2 x 1 = 2" in line


def test_interleaved_warmup_uses_the_micro_batch_group():
    # Megatron-Core: m = 10 micro-batches on pp 4 run in groups of G = 5 (10 mod 4 = 2 < 4; 10 mod 5
    # = 0); rank 0's warm-up is 2*(pp-1) + (vpp-1)*G = 6 + 5 = 11 chunk forwards, + 1 in flight =
    # 12 (with groups of pp: 6 + 4 + 1 = 11). Forward k runs chunk (k // 5) % 2: k 0-4 chunk 0,
    # 5-9 chunk 1, 10-11 chunk 0: 7 forwards of chunk 0.
    from types import SimpleNamespace

    from planner.cost.pipeline import _forwards_held, chunk_forwards, microbatch_group
    assert (microbatch_group(10, 4), microbatch_group(9, 4), microbatch_group(8, 4)) == (5, 5, 4)
    c = SimpleNamespace(pp=[4, 4], vpp=[2, 2])
    n, interleaved, group = _forwards_held(c, [10, 8], 0)
    assert n.tolist() == [12.0, 11.0] and group.tolist() == [5.0, 4.0] and interleaved.all()
    assert float(chunk_forwards(12, 0, 5, 2)) == 7.0


def test_estimate_counts_the_group_in_memory():
    # 175B on 512 GPUs, tp 2 cp 2 pp 16 vpp 6 dp 8: batch 1536 -> 192 micro-batches (16 divides),
    # 1544 -> 193 (groups of 22 by microbatch_group): more activations in flight, not fewer
    def peak(batch):
        res = runner.invoke(app, ["estimate", "--model", "175b", "--gpus", "512", "--tp", "2", "--cp", "2",
                                  "--pp", "16", "--vpp", "6", "--sequence-parallel",
                                  "--global-batch-size", str(batch), "--json"])
        data = json.loads(res.stdout)
        assert data["layout"]["vpp"] == 6
        return data["memory"]["activations"]
    assert peak(1544) > 1.2 * peak(1536)


@pytest.mark.parametrize("model, eps", [("qwen3-235b-a22b", "1e-06"), ("llama3-70b", "1e-05")])
def test_megatron_export_writes_the_catalog_norm_epsilon(tmp_path, model, eps):
    # Qwen3 MoE normalises with 1e-6 (Bridge Qwen3MoEModelProvider), not Megatron-Core's default
    # 1e-5; Llama 3 states its 1e-5 (Llama3ModelProvider): neither falls back to the default
    plan = tmp_path / "p.yaml"
    res = runner.invoke(app, ["search", "--model", model, "--gpus", "256", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    out = runner.invoke(app, ["export", str(plan), "--to", "megatron"])
    assert out.exit_code == 0, out.stderr
    assert f"--norm-epsilon {eps}" in out.stdout and "not known" not in out.stdout


@pytest.mark.parametrize("text, value", [
    ("2T", 2e12), ("2t", 2e12), ("300B", 3e11), ("15 T", 1.5e13), ("1.5M", 1.5e6), ("2e12", 2e12),
    ("250G", 2.5e11), ("4096", 4096.0), ("3k", 3e3)])


def test_token_counts_take_decimal_suffixes(text, value):
    from planner.units import parse_count
    assert parse_count(text, "--tokens") == value


def test_token_count_suffix_reaches_the_time_to_train():
    # the same search with 2T and 2e12 tokens trains for the same time, twice that of 1T (the
    # goodput of failures and checkpoints does not depend on the token count)
    def seconds(tokens):
        res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "64", "--tokens", tokens,
                                  "--objective", "time-to-train", "--json"])
        assert res.exit_code == 0, res.stderr
        return json.loads(res.stdout)[0]["throughput"]["time_to_train_s"]
    assert seconds("2T") == seconds("2e12") == pytest.approx(2 * seconds("1T"), rel=1e-9)


@pytest.mark.parametrize("text", ["2X", "abc", "2TB", "1e3e3", "nan"])
def test_a_token_count_that_is_not_one_is_refused(text):
    line = one_line_error(["search", "--model", "llama3-8b", "--gpus", "64", "--tokens", text])
    assert "--tokens" in line and "2T" in line


def test_max_gpus_is_a_budget_not_a_node_count():
    # --max-gpus 12 on 8-GPU nodes: counts of whole nodes within 12 (8), or below a node its
    # divisors; 4 was taken while 12 was refused as "not a whole number of nodes"
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--max-gpus", "12", "--top", "3", "--json"])
    assert res.exit_code == 0, res.stderr
    counts = {row["gpus"] for row in json.loads(res.stdout)}
    assert counts and all(n <= 12 and (n % 8 == 0 or 8 % n == 0) for n in counts)
    assert "--max-gpus must be positive" in one_line_error(["search", "--model", "llama3-8b", "--max-gpus", "0"])


def _plan_with(tmp_path, version, extra=None):
    plan = tmp_path / f"p{len(list(tmp_path.iterdir()))}.yaml"
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    data = yaml.safe_load(plan.read_text())
    data["plan3d_version"] = version
    data.update(extra or {})
    plan.write_text(yaml.safe_dump(data))
    return str(plan)


def test_a_plan_from_a_newer_plan3d_says_so_when_it_cannot_be_read(tmp_path):
    from planner import __version__
    newer = f"{int(__version__.split('.')[0]) + 1}.0.0"
    plan = _plan_with(tmp_path, newer, {"future_field": 1})
    for args in (["export", plan, "--to", "megatron"], ["estimate", "--plan", plan]):
        line = one_line_error(args)
        assert "future_field: unknown field" in line and f"written by plan3d {newer}, newer than" in line
    # an older plan with the same problem is just that problem
    line = one_line_error(["estimate", "--plan", _plan_with(tmp_path, "0.0.1", {"future_field": 1})])
    assert line.endswith("future_field: unknown field")


@pytest.mark.parametrize("version", ["banana", "1", ""])
def test_a_plan3d_version_that_is_no_version_is_refused(tmp_path, version):
    line = one_line_error(["estimate", "--plan", _plan_with(tmp_path, version)])
    assert "plan3d_version" in line and "is not a plan3d version" in line


def test_wide_search_table_has_a_column_for_every_setting_that_varies(monkeypatch):
    # at 220 columns the table has one column per setting: an MoE winner's ep, and the
    # activation offload where a ranked layout uses it (they were in the narrow table's text only);
    # --strict-rank: ranked by speed alone the fastest layouts offload (the tie pick does not)
    from planner.render.console import out
    monkeypatch.setattr(out, "width", 220)
    res = runner.invoke(app, ["search", "--model", "gpt-oss-120b", "--gpus", "64", "--hardware",
                              "gb200-nvl72", "--top", "3", "--strict-rank"])
    assert res.exit_code == 0, res.stderr
    header = next(line for line in res.stdout.splitlines() if " tp " in line and " dp " in line)
    cols = [c.strip() for c in header.replace("┃", "|").split("|")]
    assert {"ep", "zero", "mbs", "offload"} <= set(cols), header
    rows = json.loads(runner.invoke(app, ["search", "--model", "gpt-oss-120b", "--gpus", "64",
                                          "--hardware", "gb200-nvl72", "--top", "3", "--strict-rank",
                                          "--json"]).stdout)
    first = next(line for line in res.stdout.splitlines() if line.lstrip().startswith("1 "))
    cells = [c.strip() for c in first.replace("│", "|").split("|")]
    assert cells[cols.index("ep")] == str(rows[0]["layout"]["ep"])
    assert cells[cols.index("offload")] == str(rows[0]["layout"]["offload_layers"])


def test_hardware_capacity_below_the_reserve_names_the_profile_field(tmp_path):
    # no headroom was given: the error used to blame a "--headroom-bytes 0" flag that does not exist
    data = yaml.safe_load((ROOT / "hardware_profiles" / "dgx-h100.yaml").read_text())
    data["gpu"]["hbm_capacity"] = "1 MiB"
    (tmp_path / "hw.yaml").write_text(yaml.safe_dump(data))
    for headroom in ([], ["--min-memory-headroom", "1GiB"]):  # no headroom can make room
        line = one_line_error(["search", "--model", "llama3-8b", "--gpus", "16", "--hardware",
                               str(tmp_path / "hw.yaml"), *headroom])
        assert "gpu.hbm_capacity of H100-SXM5-80GB is 0 GiB" in line and "headroom" not in line


def test_runner_up_terms_sum_to_the_gap():
    # Qwen3-235B on up to 1,024 H100 by cost: the runner-up (ZeRO 1 -> 2) is slower by more DP
    # traffic but its slowest stage spends less on expert dispatch; the sentence listed only the
    # terms that grew (+1.06 s for a +64 ms gap). The printed terms (0.1 ms each) now add up to
    # the printed gap (percent of the winner's step, 0.01 % rounding).
    import re
    res = runner.invoke(app, ["search", "--model", "qwen3-235b-a22b", "--max-gpus", "1024", "--objective",
                              "cost", "--tokens", "300B", "--price-per-gpu-hour", "2.5"])
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    step = float(re.search(r"of its ([0-9.]+) s step", text).group(1))
    sentence = re.search(r"Runner-up \([^)]*\) is ([0-9.]+)% slower: (.*?)\.(?: [A-Z]|$)", text)
    pct, terms = float(sentence.group(1)), sentence.group(2)
    values = [float(v) * (1e-3 if unit == "ms" else 1.0)
              for v, unit in re.findall(r"([+-][0-9.]+) (ms|s)\b", terms)]
    assert sum(values) == pytest.approx(pct / 100 * step, abs=2e-4 * step)
    assert ("; less: " in terms) == any(v < 0 for v in values)  # the terms that shrank are named too


def test_token_count_has_an_upper_bound():
    # 1e30 tokens printed 41,985,899,457,561,280,512.0 days and squeezed the table
    assert "--tokens 1e+30 is beyond what plan3d models (at most 1e+16)" in one_line_error(
        ["search", "--model", "mixtral-8x7b", "--gpus", "64", "--tokens", "1e30"])
    assert one_line_error(["search", "--model", "mixtral-8x7b", "--gpus", "64", "--tokens", "-2T"]) \
        == "error: --tokens must be positive, got -2e+12"


def test_models_table_keeps_every_name_and_alias_whole_at_80_columns():
    # 'llama4-maverick-17b-128e' was printed as 'llama4-maverick-17b-128' + 'e': not copyable
    from planner.catalog import models
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    cells = {c.strip().rstrip(",") for line in lines for part in line.split("│")[:1]
             for c in part.split(", ")}
    for m in models().values():
        assert m.name in cells and set(m.aliases) <= cells, m.name
    assert any("top-8/256 +1sh" in line for line in lines)  # DeepSeek-V3's experts, uncut


def test_why_not_says_how_many_times_slower_past_double():
    # pp 32 on 64 GPUs for an 8B model: the winner runs over 2x its tokens/s; "231% slower" read
    # as a percentage of a time, so past 2x the verdict is the ratio of times per token, which is
    # the ratio of the two token rates the same sentence prints
    import re
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "64", "--why-not", "pp=32"])
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stdout.split())
    ratio = re.search(r"([0-9.]+)x the time per token of the winner", text)
    mine, best = re.search(r"runs ([0-9,]+) tokens/s against the winner's ([0-9,]+)", text).groups()
    tps = float(best.replace(",", "")) / float(mine.replace(",", ""))
    assert ratio and tps > 2 and float(ratio.group(1)) == pytest.approx(tps, abs=0.006)


def test_moe_exports_name_the_same_unmodelled_routing_fields(tmp_path):
    # the Megatron comment listed --moe-router-topk-scaling-factor and --moe-router-dtype, the
    # Bridge comment did not; Bridge's 61-layer moe_layer_freq was a 61-line YAML list
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["search", "--model", "deepseek-v3", "--gpus", "1024", "--export", str(plan)]).exit_code == 0
    meg = runner.invoke(app, ["export", str(plan), "--to", "megatron"]).stdout
    nemo = runner.invoke(app, ["export", str(plan), "--to", "nemo"]).stdout
    for field in ("moe_router_topk_scaling_factor", "moe_router_dtype", "moe_aux_loss_coeff"):
        assert f"--{field.replace('_', '-')}" in meg and field in nemo
    body = yaml.safe_load(nemo)
    assert body["model"]["moe_layer_freq"] == [0] * 3 + [1] * 58  # DeepSeek-V3: 3 dense layers
    assert "moe_layer_freq: [0, 0, 0, 1, 1" in nemo  # on one (wrapped) line, not 61 "- 1" lines


def test_deepspeed_moe_plans_run_zero_3_through_autoep_only_at_tp_1():
    # DeepSpeed @edaa72212672 runs MoE at ZeRO-3 through its AutoEP layers
    # (runtime/engine.py L1872-1915 _validate_zero3_moe_compatibility), which refuse AutoTP, TP
    # from the model code (L587-590) and expert TP: ZeRO-3 is searched at tp = etp = 1 only
    res = runner.invoke(app, ["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--framework",
                              "deepspeed", "--zero-stage", "3", "--top", "20", "--json"])
    assert res.exit_code == 0, res.stderr
    rows = json.loads(res.stdout)
    assert rows and all(r["layout"]["zero_stage"] == 3 and r["layout"]["tp"] == 1 and
                        r["layout"]["etp"] == 1 for r in rows)
    line = one_line_error(["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--framework",
                           "deepspeed", "--zero-stage", "3", "--etp", "2"])
    assert "DeepSpeed: MoE layers with ZeRO-3 need tp = 1 and etp = 1" in line
    assert runner.invoke(app, ["search", "--model", "qwen3-30b-a3b", "--gpus", "16", "--framework",
                               "deepspeed", "--zero-stage", "2", "--etp", "2"]).exit_code == 0
    # a dense model keeps ZeRO-3 at any tp on DeepSpeed
    dense = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "16", "--framework",
                                "deepspeed", "--zero-stage", "3", "--tp", "2", "--json"])
    assert dense.exit_code == 0 and json.loads(dense.stdout)[0]["layout"]["zero_stage"] == 3


def test_a_framework_profile_written_before_a_rule_existed_still_loads(tmp_path):
    # plans embed their framework profile: one written without max_zero_stage_with_moe takes its
    # default (no limit) and that default's source
    from planner.catalog import resolve_framework
    from planner.framework_spec import FrameworkProfile
    data = resolve_framework("megatron-core").model_dump(mode="json")
    del data["rules"]["max_zero_stage_with_moe"], data["rules"]["sources"]["max_zero_stage_with_moe"]
    rules = FrameworkProfile.model_validate(data).rules
    assert rules.max_zero_stage_with_moe == 3 and "no ZeRO stage limit" in rules.sources["max_zero_stage_with_moe"]


def test_export_of_a_plan_that_does_not_fit_says_so(tmp_path):
    # a plan edited to ZeRO-0 no longer fits (estimate --plan exits 1); export still writes the
    # arguments but says so first
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["search", "--model", "llama3-70b", "--gpus", "64", "--export", str(plan)]).exit_code == 0
    data = yaml.safe_load(plan.read_text())
    data["layout"]["zero_stage"], data["layout"]["distributed_optimizer"] = 0, False
    plan.write_text(yaml.safe_dump(data))
    assert runner.invoke(app, ["estimate", "--plan", str(plan)]).exit_code == 1
    out = runner.invoke(app, ["export", str(plan), "--to", "megatron"])
    assert out.exit_code == 0 and out.stderr.startswith("note: this plan does not fit: it needs ")
    fits = tmp_path / "q.yaml"
    assert runner.invoke(app, ["search", "--model", "llama3-70b", "--gpus", "64", "--export", str(fits)]).exit_code == 0
    assert "does not fit" not in runner.invoke(app, ["export", str(fits), "--to", "megatron"]).stderr


def test_a_plan_whose_framework_is_a_name_says_how_to_get_one(tmp_path):
    # the framework block was edited to a name: pydantic's "valid dictionary or instance of
    # FrameworkProfile" named a class; the error says what a plan holds and what to run
    plan = _plan_with(tmp_path, "0.1.0", {"framework": "torchtitan"})
    line = one_line_error(["estimate", "--plan", plan])
    assert "framework: a plan embeds its framework profile in full" in line
    assert "delete the framework line" in line and "FrameworkProfile" not in line
    # and deleting it works: the plan takes training.framework's profile
    data = yaml.safe_load(Path(plan).read_text())
    del data["framework"]
    Path(plan).write_text(yaml.safe_dump(data))
    assert runner.invoke(app, ["export", plan, "--to", "megatron"]).exit_code == 0


@pytest.mark.parametrize("zero, fmt", [(1, "Megatron-Core torch_dist"), (2, "Megatron-Core fsdp_dtensor (Megatron-FSDP)")])
def test_checkpoint_format_follows_the_sharding_the_export_writes(tmp_path, zero, fmt):
    # the Megatron export writes --ckpt-format fsdp_dtensor under Megatron-FSDP (ZeRO-2/3) and
    # torch_dist otherwise; estimate's checkpoint said torch_dist for both
    plan = tmp_path / "p.yaml"
    res = runner.invoke(app, ["search", "--model", "llama3-8b", "--gpus", "8", "--zero-stage", str(zero),
                              "--recompute", "full", "--export", str(plan)])
    assert res.exit_code == 0, res.stderr
    est = json.loads(runner.invoke(app, ["estimate", "--plan", str(plan), "--json"]).stdout)
    assert est["checkpoint"]["format"] == fmt
    args = runner.invoke(app, ["export", str(plan), "--to", "megatron"]).stdout
    assert f"--ckpt-format {fmt.split()[1]}" in args


@pytest.mark.parametrize("model, tp, flag, sp", [
    ("qwen3-30b-a3b", "2", [], True),  # MoE, tp 2: SP on (was off, and the rule then refused it)
    ("qwen3-30b-a3b", "1", [], False),  # tp 1: nothing to split
    ("llama3-8b", "2", [], False),  # dense: the stated default, off
    ("llama3-8b", "2", ["--sequence-parallel"], True),
])
def test_estimate_turns_sequence_parallelism_on_where_moe_needs_it(model, tp, flag, sp):
    res = runner.invoke(app, ["estimate", "-m", model, "-g", "16", "--tp", tp, "--json", *flag])
    assert res.exit_code in (0, 1), res.stderr
    assert json.loads(res.stdout)["layout"]["sequence_parallel"] is sp
    assert ("sequence parallelism on: an MoE model with tp > 1 needs it" in res.stderr) is (sp and not flag)


def test_estimate_moe_without_sequence_parallelism_is_still_refused():
    line = one_line_error(["estimate", "-m", "qwen3-30b-a3b", "-g", "16", "--tp", "2",
                           "--no-sequence-parallel"])
    assert "MoE with tp > 1 needs sequence parallelism" in line


def test_layers_rule_names_the_uneven_split_flags():
    # DeepSeek-V3's 61 layers on pp 8: 61 - 8*7 = 5 left; 6 on the first stage, 7 on the last
    # and 8 on each of the 6 middle ones (6 + 7 + 48 = 61); the hint named YAML fields only
    line = one_line_error(["estimate", "-m", "deepseek-v3", "-g", "1024", "--tp", "2", "--pp", "8",
                           "--ep", "64", "--sequence-parallel"])
    assert "layers divisible by pp*vpp" in line
    assert "--first-stage-layers 6 --last-stage-layers 7" in line


@pytest.mark.parametrize("args, words", [
    (["search", "-m", "llama3-8b", "-g", "8", "--force"], "--force lets --export (and --timeline) overwrite a file"),
    (["sweep", "-m", "llama3-8b", "-g", "8", "--force"], "--force lets --plot overwrite a file"),
])
def test_force_without_a_file_to_overwrite_is_refused(args, words):
    # --force was accepted and did nothing
    assert words in one_line_error(args)


def test_export_force_without_output_is_refused(tmp_path):
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--export", str(plan)]).exit_code == 0
    assert "--force lets --output overwrite a file" in one_line_error(["export", str(plan), "--force"])


@pytest.mark.parametrize("where", ["flag", "model"])
def test_a_token_budget_below_one_step_is_refused(tmp_path, where):
    # 1.5 tokens trained in "0.0 ms"; llama3-8b's step is 64 x 8,192 = 524,288 tokens here
    args = ["search", "-m", "llama3-8b", "-g", "8", "--global-batch-size", "64", "--objective", "time-to-train"]
    if where == "flag":
        args += ["--tokens", "1.5"]
    else:
        data = yaml.safe_load((ROOT / "models" / "llama3-8b.yaml").read_text())
        data["training"]["tokens"] = 1.5
        (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
        args[2] = str(tmp_path / "m.yaml")
    line = one_line_error(args)
    assert "a training budget of 1.5 tokens is less than one optimizer step (524,288 tokens" in line


@pytest.mark.parametrize("text, value", [("2e12", 2e12), ("2T", 2e12), ("300B", 3e11), (2.0e12, 2e12)])
def test_model_token_budget_reads_as_the_flag_does(tmp_path, text, value):
    # PyYAML reads 2e12 (no dot) as a string; the model file refused it ("valid number")
    from planner.catalog import resolve_model
    data = yaml.safe_load((ROOT / "models" / "llama3-8b.yaml").read_text())
    data["training"]["tokens"] = text
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    assert resolve_model(str(tmp_path / "m.yaml")).training.tokens == value


def test_sweep_without_a_budget_for_its_deadline_says_so_once():
    # was "no GPU count in 64..128 has a layout of ... that fits: --deadline needs ..."
    line = one_line_error(["sweep", "-m", "mistral-7b", "-g", "8,16", "--deadline", "30d"])
    assert line == "error: --deadline needs a training token budget: the model gives none, pass --tokens"


def test_sweep_that_misses_its_deadline_everywhere_still_prints_the_table():
    # 1e12 tokens at about 1.4e5 tokens/s on 8 H100 is months, on 16 still more than a day
    res = runner.invoke(app, ["sweep", "-m", "llama3-8b", "-g", "8,16", "--tokens", "1T",
                              "--deadline", "1d"])
    assert res.exit_code == 1
    assert "misses the 1.0 days deadline:" in " ".join(res.stdout.split())
    assert "no GPU count in 8..16 trains llama3-8b within the deadline; on 16 GPUs: misses" in res.stderr


@pytest.mark.parametrize("args, words", [
    # two rules that pass alone but not together: both named (was "(together with the rules before it)")
    (["--framework", "deepspeed", "--why-not", "tp=2"],
     "DeepSpeed has no sequence parallelism, together with: MoE with tp > 1 needs sequence parallelism"),
    # 48 layers on pp 4 with 13 + 11 on the edges: 24 left, 12 per middle stage, below 13
    (["--why-not", "pp=4 split=13+..+11"],
     "split 13+..+11 on pp=4: an edge stage holds more than a middle stage's 12 layers"),
])
def test_why_not_names_what_breaks(args, words):
    res = runner.invoke(app, ["search", "-m", "qwen3-30b-a3b", "-g", "64", *args])
    assert res.exit_code == 0, res.stderr
    assert words in " ".join(res.stdout.split())


@pytest.mark.parametrize("args, words", [
    # each listed the fields the file lacked ("source: missing required field (and 15 more problems)")
    (["search", "--model", "hardware_profiles/dgx-h100.yaml", "--gpus", "8"],
     "hardware_profiles/dgx-h100.yaml is a hardware profile file, not a model; pass it as --hardware"),
    (["estimate", "--plan", "models/qwen3-30b-a3b.yaml"],
     "models/qwen3-30b-a3b.yaml is a model file, not a plan; pass it as --model"),
    (["export", "models/qwen3-30b-a3b.yaml"], "is a model file, not a plan"),
    (["placement", "hardware_profiles/dgx-h100.yaml"], "is a hardware profile file, not a plan"),
    (["search", "-m", "llama3-8b", "-g", "8", "--hardware", "models/llama3-8b.yaml"],
     "is a model file, not a hardware profile; pass it as --model"),
    (["search", "-m", "llama3-8b", "-g", "8", "--framework", "hardware_profiles/dgx-h100.yaml"],
     "is a hardware profile file, not a framework profile"),
    (["search", "--model", "framework_profiles/deepspeed.yaml", "-g", "8"],
     "is a framework profile file, not a model; pass it as --framework"),
])
def test_a_file_of_another_kind_says_what_it_is(monkeypatch, args, words):
    monkeypatch.chdir(ROOT)
    assert words in one_line_error(args)


def test_sweep_cell_of_a_count_without_a_fit_is_brief():
    # the cell held the search's whole sentence, 11 lines at 80 columns; --json keeps it in full
    res = runner.invoke(app, ["sweep", "-m", "deepseek-v3", "-g", "128,256", "--hardware", "dgx-h100", "--json"])
    assert res.exit_code == 0, res.stderr
    first = json.loads(res.stdout)[0]
    assert first["error"].startswith("no layout of deepseek-v3 fits on 128 x H100-SXM5-80GB: the closest, tp=")
    assert first["error_brief"].startswith("no fit: the closest needs ") and "fits from " in first["error_brief"]


def test_a_dispatcher_without_an_expert_group_is_noted():
    # (HybridEP: DeepEP over one expert rank is refused, token_dispatcher.py L1836)
    res = runner.invoke(app, ["search", "-m", "qwen3-30b-a3b", "-g", "64", "--moe-dispatcher",
                              "hybridep", "--ep", "1", "--top", "1"])
    assert res.exit_code == 0, res.stderr
    assert "the hybridep token dispatcher has nothing to move on this layout (ep = etp = 1" in \
        " ".join(res.stderr.split())  # the note wraps at 80 columns


def test_messages_print_emoji_codes_as_written():
    # rich turned ":100:" into an emoji in "--gpus '8:100:5'"
    line = one_line_error(["sweep", "-m", "llama3-8b", "--gpus", "8:100:5"])
    assert "'8:100:5'" in line


def test_time_to_train_when_no_layout_ever_finishes_is_one_line():
    # a restart of 1e9 days never completes between failures: goodput 0, every time infinite;
    # the search indexed a fastest layout that did not exist (IndexError, exit 3)
    line = one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--restart-time", "1e9d",
                           "--objective", "time-to-train"])
    assert line.startswith("error: no layout ever finishes training: on 8 GPUs at ")
    assert "check --failure-rate (per GPU-hour) and --restart-time" in line


def test_a_small_model_budget_does_not_stop_a_throughput_search(tmp_path):
    # the model file's tokens (100) only matter where the time to train is asked for: estimate's
    # "To fit" search had failed on it and said no count of GPUs fits
    data = yaml.safe_load((ROOT / "models" / "llama3-8b.yaml").read_text())
    data["training"]["tokens"] = 100
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    res = runner.invoke(app, ["estimate", "-m", str(tmp_path / "m.yaml"), "-g", "16", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["to_fit"]["gpus"] == 16
    line = one_line_error(["search", "-m", str(tmp_path / "m.yaml"), "-g", "16", "--objective", "time-to-train"])
    assert "a training budget of 100 tokens is less than one optimizer step" in line
    assert "or training.tokens in the model file" in line


def test_why_not_of_a_printed_layout_takes_its_omitted_fields_as_printed():
    # a table row without "sp" has sp off; why-not completed it with sp on and called it the
    # winner. The completion must be the layout as printed.
    from planner.layout import Layout
    text = "tp=2 cp=2 pp=16 dp=4 zero=1 mbs=1 vpp=6 recompute=none"
    res = runner.invoke(app, ["search", "-m", "gpt3-175b", "-g", "256", "--why-not", text, "--json"])
    assert res.exit_code == 0, res.stderr
    done = Layout(**json.loads(res.stdout)["completion"]["layout"])
    assert done.short() == text


@pytest.mark.parametrize("why, words", [
    # 7 + 2 x 41 + 7: Megatron-Core's layout form would interleave it, but no search tries it
    ("pp=4 vpp=2 split=7+..+7", "not among the splits the search tries"),
    ("pp=1 split=32+32", "split 32+..+32 on pp=1: an uneven split needs pp >= 2"),
    ("pp=2 split=31+1", "split 31+1 on pp=2: on pp=2 first + last must be the 96 layers"),
    # above the default --max-vpp 16: judged, not refused (the layout form interleaves 49+47 on pp 2)
    ("vpp=32", "vpp=32: best completion"),
])
def test_why_not_split_and_bound_verdicts(why, words):
    res = runner.invoke(app, ["search", "-m", "gpt3-175b", "-g", "256", "--why-not", why])
    assert res.exit_code == 0, res.stderr
    assert words in " ".join(res.stdout.split())


@pytest.mark.parametrize("text, words", [
    # a shipped name on another profile: tables and plans could not tell them apart
    ("name: megatron-core\nextends: megatron-core\n", "name 'megatron-core' is a shipped framework profile's"),
    # a misspelt fact was first reported as a fact without a source
    ("name: mine\nextends: megatron-core\nrules:\n  zero_stagez: [0, 1]\n",
     "rules.zero_stagez: unknown field (the rules facts: tensor_parallel"),
])
def test_framework_profile_file_errors(tmp_path, text, words):
    (tmp_path / "fw.yaml").write_text(text)
    assert words in one_line_error(["search", "-m", "llama3-8b", "-g", "8", "--framework", str(tmp_path / "fw.yaml")])


def test_export_to_a_framework_profile_file_uses_its_exporter(tmp_path):
    (tmp_path / "fw.yaml").write_text("name: mine\nextends: megatron-core\n")
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--export", str(plan)]).exit_code == 0
    res = runner.invoke(app, ["export", str(plan), "--to", str(tmp_path / "fw.yaml")])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.startswith("# Megatron-LM pretrain_gpt.py arguments")


def test_export_to_another_framework_says_the_estimate_is_not_its_own(tmp_path):
    plan = tmp_path / "p.yaml"
    assert runner.invoke(app, ["search", "-m", "llama3-8b", "-g", "8", "--framework", "torchtitan",
                               "--recompute", "selective", "--export", str(plan)]).exit_code == 0
    res = runner.invoke(app, ["export", str(plan), "--to", "megatron"])
    assert res.exit_code == 0, res.stderr
    flat = " ".join(res.stderr.split())
    assert "the plan was costed for torchtitan: its memory and step time follow that framework's runtime" in flat
    assert "re-plan with --framework megatron-core" in flat
    assert "the plan assumed per-op selective checkpointing (torchtitan's)" in res.stdout


def test_a_validator_result_given_as_a_plan_says_what_it_is(tmp_path):
    (tmp_path / "measured.json").write_text(json.dumps({"run": {}, "notes": [], "checks": [],
                                                        "reported": [], "passed": True}))
    line = one_line_error(["estimate", "--plan", str(tmp_path / "measured.json")])
    assert "measured.json is a validator result file, not a plan; plan3d validate wrote it" in line


def test_a_world_larger_than_the_miniature_is_noted():
    from planner.validate.miniature import miniature
    from planner import catalog
    from planner.plan import Plan
    from planner.specs import TrainingSpec
    lay = Layout(tp=4, pp=8, dp=16, zero_stage=1, micro_batch_size=2, sequence_parallel=True, vpp=12)
    p = Plan(plan3d_version="0.1.0", model=catalog.resolve_model("175b"),
             hardware=catalog.resolve_hardware("dgx-h100"), gpus=lay.gpus,
             training=TrainingSpec(seq_length=2048, global_batch_size=1536), layout=lay)
    # tp', pp', dp' at most 2 each (cp 1): 8 ranks of the 16 asked for
    run = miniature(p, 16)
    assert run.world == 8
    assert "--world 16: the miniature needs 8 ranks (tp' 2 x cp' 1 x pp' 2 x dp' 2) and runs on 8" in run.notes


def test_bare_plan3d_prints_help_not_an_error():
    # click >= 8.2 raises NoArgsIsHelpError, printed as "error: Usage: ..." with exit 2
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()"],
                         capture_output=True, text=True, env={"COLUMNS": "80", "PATH": ""})
    assert res.returncode == 0 and res.stdout.startswith("Usage: ") and "error" not in res.stderr
    # every command's summary fits its 80-column line whole (click cut them with "...")
    commands = res.stdout.split("Commands:")[1].splitlines()
    assert commands and not any(line.rstrip().endswith("...") for line in commands)
