"""--deadline (search and sweep), the expected time to train with failures and checkpoints in
the objectives, sweep --tokens, and the checkpoint flags and output of estimate."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner import catalog
from planner.cli import app
from planner.errors import DeadlineError, UsageError
from planner.search.objective import parse_deadline
from planner.search.state import DEADLINE_RULE
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.specs import ModelSpec, TrainingSpec

runner = CliRunner()
DAY = 86_400.0


def cli(*args):
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def llama7():
    """Llama 2 7B on H100, batch 1024 x 4096, its 2T tokens."""
    return (catalog.resolve_model("llama2-7b"), catalog.resolve_hardware("dgx-h100"),
            TrainingSpec(seq_length=4096, global_batch_size=1024, tokens=2e12))


@pytest.mark.parametrize("text, seconds", [("30d", 30 * DAY), ("720h", 30 * DAY),
                                           ("90min", 5400.0), ("1.5 d", 1.5 * DAY),
                                           ("45s", 45.0)])
def test_deadline_durations(text, seconds):
    assert parse_deadline(text) == seconds


@pytest.mark.parametrize("text", ["30", "30 days", "-1d", "0d", "abc", "1e400d", ""])
def test_deadline_refused_in_one_line(text):
    with pytest.raises(UsageError) as exc:
        parse_deadline(text)
    assert "\n" not in str(exc.value) and "'30d'" in str(exc.value)


def test_cost_with_deadline_is_the_cheapest_that_meets_it(llama7):
    """Without a deadline the cheapest is 16 GPUs (~126 days); with 70 days the 16-GPU layouts
    are out and the budget search must return the cheapest of the counts that meet it (each
    fixed count searched on its own with the same deadline is never cheaper)."""
    m, hw, tr = llama7
    free = search(m, hw, tr, None, SearchOptions(objective="cost", price_per_gpu_hour=2.0,
                                                 max_gpus=64))
    assert free.ranked.throughput["time_to_train_s"][0] > 70 * DAY
    opts = SearchOptions(objective="cost", price_per_gpu_hour=2.0, max_gpus=64,
                         deadline_s=70 * DAY)
    res = search(m, hw, tr, None, opts)
    th = res.ranked.throughput
    assert (th["time_to_train_s"] <= 70 * DAY).all()
    assert th["cost"][0] >= free.ranked.throughput["cost"][0]
    # the layouts that fit but miss the deadline are counted as pruned by it
    assert 0 < res.pruned[DEADLINE_RULE] < res.fitting and DEADLINE_RULE not in free.pruned
    for n in (32, 64):
        try:
            fixed = search(m, hw, tr, n, SearchOptions(objective="cost", price_per_gpu_hour=2.0,
                                                       deadline_s=70 * DAY))
        except DeadlineError:
            continue
        assert fixed.ranked.throughput["cost"][0] >= th["cost"][0] * (1 - 1e-12)


def test_unreachable_deadline_names_the_fastest(llama7):
    """No layout on at most 64 GPUs trains 2T tokens in 10 days: the error names the fastest,
    whose time is what --objective time-to-train ranked strictly finds (same goodput model)."""
    m, hw, tr = llama7
    with pytest.raises(DeadlineError) as exc:
        search(m, hw, tr, None, SearchOptions(max_gpus=64, deadline_s=10 * DAY))
    fastest = search(m, hw, tr, None, SearchOptions(max_gpus=64, objective="time-to-train", strict_rank=True))
    assert exc.value.seconds == pytest.approx(float(fastest.ranked.throughput["time_to_train_s"][0]))
    assert exc.value.fastest.candidates.layout(0) == fastest.ranked.candidates.layout(0)
    assert "within 10.0 days" in str(exc.value) and "\n" not in str(exc.value)


def test_deadline_needs_a_token_budget(llama7):
    m, hw, _ = llama7
    bare = ModelSpec(**{**m.model_dump(), "training": {"seq_length": 4096,
                                                       "global_batch_size": 1024}})
    tr = TrainingSpec(seq_length=4096, global_batch_size=1024)
    with pytest.raises(UsageError, match="--deadline needs a training token budget"):
        search(bare, hw, tr, 64, SearchOptions(deadline_s=DAY))


def test_cli_deadline_errors_and_exit_codes():
    code, out, err = cli("search", "-m", "llama2-7b", "--max-gpus", "64", "--deadline", "30")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --deadline must be a positive duration")
    code, out, err = cli("search", "-m", "llama2-7b", "--max-gpus", "64", "--deadline", "10d")
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: no layout of llama2-7b on at most 64 x H100-SXM5-80GB trains "
                          "2e12 tokens within 10.0 days: the fastest")


def test_sweep_tokens_time_to_train_and_deadline():
    """sweep --tokens: rows carry the expected time to train and the goodput; time x tokens/s x
    goodput = tokens. With --deadline the counts that miss it are error rows."""
    code, out, err = cli("sweep", "-m", "llama2-7b", "-g", "8:32", "--tokens", "1e12", "--json")
    assert code == 0, err
    rows = json.loads(out)
    for r in rows:
        assert r["time_to_train_s"] * r["tokens_per_s"] * r["goodput"] == pytest.approx(1e12)
        assert 0.99 < r["goodput"] < 1
    assert [r["gpus"] for r in rows] == [8, 16, 32]
    cutoff = (rows[0]["time_to_train_s"] + rows[1]["time_to_train_s"]) / 2 / DAY
    code, out, err = cli("sweep", "-m", "llama2-7b", "-g", "8:32", "--tokens", "1e12", "--json",
                         "--deadline", f"{cutoff:.3f}d")
    late = json.loads(out)
    assert code == 0 and late[0]["error"].startswith("no layout of llama2-7b on 8 x")
    assert all(r["error"] is None for r in late[1:])
    code, out, err = cli("sweep", "-m", "llama2-7b", "-g", "8:32", "--tokens", "1e12")
    assert code == 0 and "train" in out and "goodput" in out
    assert "Soonest trained: 32 GPUs" in out


def test_estimate_checkpoint_section_flags_and_json():
    base = ("estimate", "-m", "175b", "-g", "512", "--tp", "8", "--pp", "8")
    code, out, err = cli(*base)
    assert code == 0, err
    assert "Checkpoint (Megatron-Core torch_dist, async saves" in out
    assert "storage.aggregate is a placeholder" in out and "goodput" in out
    code, out, err = cli(*base, "--json", "--sync-save", "--failure-rate", "1e-4",
                         "--restart-time", "5min")
    assert code == 0, err
    ck = json.loads(out)["checkpoint"]
    # synchronous: the whole write stalls; M = 1/(512 x 1e-4) h = 19.53 h = 70,312.5 s
    assert not ck["async"] and ck["blocking_s"] == ck["write_s"] == ck["save_s"]
    assert ck["mtbf_s"] == pytest.approx(3600 / (512 * 1e-4))
    assert ck["restart_s"] == pytest.approx(300 + ck["load_s"])
    assert ck["failure_rate_source"] == "--failure-rate"
    for key in ("total_bytes", "largest_rank_bytes", "blocking_s", "save_s", "interval_steps",
                "optimal_interval_s", "goodput"):
        assert key in ck


@pytest.mark.parametrize("flags, message", [
    (("--failure-rate", "0"), "--failure-rate is interruptions per GPU-hour"),
    (("--failure-rate", "2"), "--failure-rate is interruptions per GPU-hour"),
    (("--restart-time", "10"), "--restart-time: '10' needs a unit, e.g. '5 us' or '10 min'")])
def test_checkpoint_flags_refused_in_one_line(flags, message):
    code, out, err = cli("estimate", "-m", "175b", "-g", "512", "--tp", "8", "--pp", "8", *flags)
    assert code == 2 and out == "" and err.startswith(f"error: {message}")
    assert len(err.strip().splitlines()) == 1


def test_plan_keeps_the_checkpoint_settings(tmp_path):
    """search --export writes the failure rate, restart time and save mode into the plan;
    estimate --plan re-evaluates with them and refuses the flags beside it."""
    plan = tmp_path / "plan.yaml"
    code, _, err = cli("search", "-m", "llama2-7b", "-g", "16", "--failure-rate", "5e-5",
                       "--sync-save", "--export", str(plan))
    assert code == 0, err
    code, out, err = cli("estimate", "--plan", str(plan), "--json")
    ck = json.loads(out)["checkpoint"]
    assert ck["failures_per_gpu_s"] == pytest.approx(5e-5 / 3600) and not ck["async_save"]
    code, out, err = cli("estimate", "--plan", str(plan), "--failure-rate", "1e-5")
    assert code == 2 and "--plan cannot be combined with --failure-rate" in err
