"""Output paths (every command that writes a file takes '-' and /dev/stdout for stdout, never
overwrites a file without --force, and a rerun of validate does not collide) and the set-up a
contributor needs (regress --update refuses an installed copy that is not the source tree;
the optional extras are named the same in errors and README)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import baseline as bl
from planner.cli import app
from planner.errors import PLOT_EXTRA, TORCH_CPU, VALIDATE_EXTRA, UsageError
from planner.outputs import check_destination, free_path
from planner.validate import measured_destination, write_measured

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def cli(*args):
    res = runner.invoke(app, [str(a) for a in args])
    return res.exit_code, res.stdout, res.stderr


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plans") / "plan.yaml"
    assert cli("search", "--model", "175b", "--gpus", 512, "--export", path)[0] == 0
    return path


@pytest.mark.parametrize("dash", ["-", "/dev/stdout"])
def test_search_export_to_stdout_holds_the_plan_alone(dash):
    code, out, err = cli("search", "--model", "175b", "--gpus", 512, "--top", 1, "--export", dash)
    assert code == 0, err
    data = yaml.safe_load(out)  # stdout is the plan, nothing else
    assert data["gpus"] == 512 and data["model"]["name"] == "gpt3-175b"
    assert "Winner:" in err and err.rstrip().endswith("Wrote the best plan to stdout")
    code, out, err = cli("search", "--model", "175b", "--gpus", 512, "--export", dash, "--json")
    assert (code, out) == (2, "") and "both write to stdout" in err


@pytest.mark.parametrize("dash", ["-", "/dev/stdout"])
def test_export_to_stdout_is_what_export_prints(plan, dash):
    plain = cli("export", plan, "--to", "megatron")
    code, out, err = cli("export", plan, "--to", "megatron", "-o", dash)
    assert code == 0 and out == plain[1] and out.startswith("# Megatron-LM")
    assert "Wrote" not in err


def test_existing_files_need_force_but_devices_do_not(plan, tmp_path):
    target = tmp_path / "args.txt"
    target.write_text("mine\n")
    code, out, err = cli("export", plan, "--to", "megatron", "-o", target)
    assert code == 2 and err == f"error: {target} exists; pass --force to overwrite it\n"
    assert target.read_text() == "mine\n"
    assert cli("export", plan, "--to", "megatron", "-o", target, "--force")[0] == 0
    assert target.read_text().startswith("# Megatron-LM")
    code, out, err = cli("export", plan, "--to", "megatron", "-o", "/dev/null")
    assert code == 0 and out == ""  # a device is not a file of the user's
    with pytest.raises(UsageError):
        check_destination(tmp_path, False, "--out")  # a directory


def test_calibrate_to_stdout_writes_the_profile_alone():
    runs = ROOT / "benchmarks" / "published_runs.yaml"
    code, out, err = cli("calibrate", runs, "--hardware", "dgx-a100-80g", "-o", "-", "--no-loo")
    assert code == 0, err
    assert out.startswith("# Calibrated by `plan3d calibrate` from dgx-a100-80g.\n")
    assert yaml.safe_load(out)["name"] == "dgx-a100-80g-calibrated"
    assert "Wrote the calibrated profile to stdout" in err


def test_regress_update_to_stdout(tmp_path):
    cases = tmp_path / "cases.yaml"
    cases.write_text(yaml.safe_dump([{"name": "a", "model": "175b", "gpus": 512,
                                      "layout": {"tp": 8, "pp": 8, "zero_stage": 1,
                                                 "micro_batch_size": 1}}]))
    code, out, err = cli("regress", cases, "--baseline", "-", "--update")
    assert code == 0, err
    assert set(bl.loads(out, "stdout")) == {"a"} and "Wrote stdout: 1 case;" in err
    code, out, err = cli("regress", cases, "--baseline", "-")
    assert code == 2 and "only" not in out and "--baseline - is stdout" in err


def test_sweep_plot_to_stdout_is_a_png():
    pytest.importorskip("matplotlib")
    res = CliRunner().invoke(app, ["sweep", "--model", "175b", "--gpus", "256:512", "--plot", "-"])
    assert res.exit_code == 0, res.stderr
    assert res.stdout_bytes.startswith(b"\x89PNG\r\n\x1a\n")  # the PNG signature, and nothing before
    assert "Wrote the plot to stdout" in res.stderr


def test_validate_destination_takes_a_free_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert measured_destination(None, False, False) == Path("measured.json")
    Path("measured.json").write_text("{}")
    Path("measured-2.json").write_text("{}")
    assert measured_destination(None, False, False) == Path("measured-3.json")
    assert free_path(Path("other.json")) == Path("other.json")
    with pytest.raises(UsageError, match="measured.json exists; pass --force"):
        measured_destination(Path("measured.json"), False, False)
    assert measured_destination(Path("measured.json"), True, False) == Path("measured.json")
    with pytest.raises(UsageError, match="both write to stdout"):
        measured_destination(Path("-"), False, True)


def test_validate_measurements_to_stdout(capsys):
    write_measured(Path("-"), {"passed": True, "checks": []}, [{"rank": 0}], force=False)
    assert json.loads(capsys.readouterr().out) == {"passed": True, "checks": [], "ranks": [{"rank": 0}]}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (extra 'validate')")
def test_validate_rerun_does_not_collide(tmp_path, monkeypatch):
    # Llama-3 8B on 8 GPUs, tp=pp=cp=1: its miniature runs as dp=2 on --world 2 (about 5 s)
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "small.yaml"
    assert cli("search", "--model", "llama3-8b", "--gpus", 8, "--tp", 1, "--pp", 1, "--cp", 1,
               "--export", plan)[0] == 0
    for n, name in ((1, "measured.json"), (2, "measured-2.json")):
        code, out, err = cli("validate", plan, "--local", "--world", 2, "--steps", 2)
        assert code == 0, err
        assert out.rstrip().endswith(f"Wrote {name}") and (tmp_path / name).is_file()
    first = json.loads((tmp_path / "measured.json").read_text())
    assert first["passed"] and len(first["ranks"]) == 2


# ---------------------------------------------------------------- set-up for contributors


def test_regress_update_refuses_a_planner_that_is_not_the_cases_source_tree(tmp_path):
    # a source tree of plan3d (planner/ and pyproject.toml) that is not the planner running
    tree = tmp_path / "plan3d-checkout"
    (tree / "planner").mkdir(parents=True)
    (tree / "planner" / "__init__.py").write_text("")
    (tree / "pyproject.toml").write_text("[project]\nname = 'plan3d'\n")
    (tree / "tests").mkdir()
    cases = tree / "tests" / "cases.yaml"
    cases.write_text((ROOT / "tests" / "golden" / "cases.yaml").read_text())
    baseline = tree / "tests" / "baseline.yaml"
    code, out, err = cli("regress", cases, "--baseline", baseline, "--update")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"the cases are in the source tree {tree}, but the planner running is " in err
    assert f"(cd {tree} && pip install -e '.[dev]')" in err
    assert not baseline.exists()


def test_regress_update_accepts_the_tree_it_runs_from():
    from planner.cli.regress import refuse_other_source, source_tree
    import planner
    golden = ROOT / "tests" / "golden" / "cases.yaml"
    if source_tree(golden.parent) != Path(planner.__file__).resolve().parents[1]:
        pytest.skip("the planner under test is an installed copy, not this tree")
    refuse_other_source(golden)  # no error: the planner running is this tree's


def test_extras_are_named_the_same_in_errors_readme_and_pyproject():
    readme = " ".join((ROOT / "README.md").read_text().split())
    for command in ("pip install -e '.[plot]'", "pip install -e '.[validate]'", TORCH_CPU,
                    "pip install -e '.[dev]'"):
        assert command in readme, command
    assert "pip install -e '.[plot]'" in PLOT_EXTRA and "matplotlib>=3.6" in readme
    assert TORCH_CPU in VALIDATE_EXTRA and "pip install -e '.[validate]'" in VALIDATE_EXTRA
    assert "plan3d[" not in readme  # no name of a package that is not on PyPI
    if sys.version_info >= (3, 11):
        import tomllib
        extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"]
        assert extras["validate"] == ["torch==2.13.*"] and "2.13.0" in TORCH_CPU  # the tested version
        assert set(extras) == {"dev", "validate", "plot"}
    code, out, err = cli("sweep", "--model", "175b", "--gpus", 512, "--plot", "x.png") \
        if importlib.util.find_spec("matplotlib") is None else (None, None, None)
    if code is not None:
        assert err == f"error: {PLOT_EXTRA}\n"
