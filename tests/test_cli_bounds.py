"""Second new-user round: huge and infinite values, flags that cannot go together, a local
folder named like a catalog model. Each error is one exact line on stderr, exit 2."""

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.fmt import capacity as gib

runner = CliRunner()
HUGE = "99999999999999999999"  # > 2**63: used to overflow numpy's int64 (exit 3, internal error)


def cli(*args):
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.parametrize("args", [
    ("search", "--tp", HUGE), ("search", "--pp", HUGE), ("search", "--max-cp", HUGE),
    ("estimate", "--tp", "8", "--pp", "8", "--vpp", HUGE),
    ("estimate", "--tp", "8", "--pp", "8", "--micro-batch-size", HUGE),
    ("estimate", "--tp", "8", "--pp", "8", "--first-stage-layers", HUGE),
])
def test_huge_integers_are_usage_errors(args):
    code, out, err = cli(args[0], "--model", "175b", "--gpus", "512", *args[1:])
    flag = args[-2]
    assert (code, out) == (2, "")
    assert err == f"error: {flag} {int(HUGE):,} is beyond what plan3d models (at most 1,000,000)\n"


def test_huge_why_not_value():
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", "--why-not", f"tp={HUGE}")
    assert code == 2
    assert err == f"error: --why-not: tp {int(HUGE):,} is beyond what plan3d models (at most 1,000,000)\n"


def test_why_not_reads_spaces_around_equals():
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--why-not", " tp = 8 ")
    assert code == 0, err
    assert "best completion tp=8 " in out


@pytest.mark.parametrize("args, flag", [
    (("--objective", "cost", "--price-per-gpu-hour", "inf"), "--price-per-gpu-hour"),
    (("--objective", "time-to-train", "--tokens", "1e400"), "--tokens"),  # a count: 'inf' is no number
])
def test_infinite_price_or_tokens_are_refused(args, flag):
    # inf made every cost inf, so the "winner" was arbitrary (1.3% MFU) and --json wrote Infinity
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", *args)
    assert (code, err) == (2, f"error: {flag} must be a finite number, got inf\n")


def test_export_and_why_not_together_are_refused(tmp_path):
    target = tmp_path / "plan.yaml"
    code, _, err = cli("search", "--model", "175b", "--gpus", "512", "--why-not", "tp=8",
                       "--export", str(target))
    assert code == 2 and err.startswith("error: --export writes the search's best plan and "
                                        "--why-not judges your layout instead")
    assert not target.exists()  # used to exit 0 having written nothing


def test_local_folder_named_like_a_catalog_model_is_ambiguous(tmp_path, monkeypatch):
    (tmp_path / "llama3-8b").mkdir()
    (tmp_path / "llama3-8b" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    code, _, err = cli("search", "--model", "llama3-8b", "--gpus", "64")
    assert code == 2
    assert err == ("error: 'llama3-8b' is both a catalog model and a folder here: write "
                   "./llama3-8b for the folder, or run from another directory for the catalog "
                   "model\n")


def test_capacity_printed_without_rounding_below_the_total():
    # 80 GiB prints whole; the H200's 141 GB = 131.32 GiB prints 131.3 (it printed "131", so a
    # 131.2 GiB layout read "131.2/131 GiB", as if over capacity)
    assert gib(80 * 2**30) == "80"
    assert gib(141e9) == "131.3"
    assert gib(81_559 * 2**20) == "79.6"  # the H100 as nvidia-smi reports it: 79.647 GiB


def test_headroom_is_named_in_the_pruning_line():
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--top", "1",
                         "--min-memory-headroom", "25%")
    assert code == 0, err
    flat = " ".join(out.split())
    # 25% of the H100's 81,559 MiB left free: 81,559 x 0.75 / 1024 = 59.74 GiB usable, of 79.65
    assert "(fit = within 59.7 GiB of the 79.6 GiB, leaving the --min-memory-headroom free)" in flat


def test_a_cp_winner_is_flagged_with_its_fallback():
    # When the winner uses cp > 1 (the least checked term of the model), the explanation names
    # the best kept layout without CP, its rank and the gap in tokens/s, all of which the JSON of
    # the same search gives independently.
    import json
    code, out, err = cli("search", "--model", "175b", "--gpus", "512", "--top", "3")
    assert code == 0, err
    code, js, err = cli("search", "--model", "175b", "--gpus", "512", "--top", "256", "--json")
    rows = json.loads(js)
    if rows[0]["layout"]["cp"] == 1:
        assert "The winner uses context parallelism" not in out
        return
    k = next(i for i, r in enumerate(rows) if r["layout"]["cp"] == 1)
    gap = (1 - rows[k]["throughput"]["tokens_per_s"] / rows[0]["throughput"]["tokens_per_s"]) * 100
    flat = " ".join(out.split())
    assert f"The winner uses context parallelism (cp={rows[0]['layout']['cp']})" in flat
    assert f"the best kept layout without it, #{k + 1} (" in flat
    assert f"runs {gap:.1f}% fewer tokens/s (--max-cp 1 pins it off)." in flat
