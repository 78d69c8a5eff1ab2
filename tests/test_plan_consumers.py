"""Every command that consumes a plan (estimate --plan, export, placement, validate) rejects a plan
edited by hand into an invalid layout with one line, before exporting or running anything."""

import subprocess
import sys

import pytest
import yaml


def run(*args, cwd=None):
    proc = subprocess.run([sys.executable, "-c", "from planner.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plans") / "plan.yaml"
    code, _, err = run("search", "--model", "175b", "--gpus", "512", "--export", str(path))
    assert code == 0, err
    return path


def _edited(plan_file, tmp_path, **layout):
    data = yaml.safe_load(plan_file.read_text())
    lay = data["layout"]
    lay.update({k: v(lay) if callable(v) else v for k, v in layout.items()})
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit, rule", [
    # the winner's TP ranks moved to DP (the GPU count kept), SP left on
    ({"dp": lambda lay: lay["dp"] * lay["tp"], "tp": 1, "sequence_parallel": True},
     "sequence parallel needs tp > 1"),
    ({"vpp": 5}, "layers divisible by pp*vpp"),
])
@pytest.mark.parametrize("command", [
    ["export", "--to", "megatron"], ["export", "--to", "nemo"], ["placement"],
    ["validate", "--local"],
])
def test_invalid_plans_are_refused_by_every_consumer(plan_file, tmp_path, edit, rule, command):
    bad = _edited(plan_file, tmp_path, **edit)
    code, out, err = run(*command[:1], str(bad), *command[1:], cwd=tmp_path)
    if command[0] == "validate" and "pip install" in err:  # torch missing: the extra's error
        pytest.skip("torch not installed")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and rule in lines[0], err
    assert out == "" and not (tmp_path / "measured.json").exists()


def test_output_paths_and_flag_combinations(plan_file, tmp_path):
    code, _, err = run("export", str(plan_file), "--to", "megatron", "-o", str(tmp_path))
    assert code == 2 and "is a directory; give a file name" in err
    code, _, err = run("export", str(plan_file), "--to", "megatron", "--torchtitan-format", "toml")
    assert code == 2 and "--torchtitan-format applies to --to torchtitan only" in err
    code, _, err = run("validate", str(plan_file), "--local", "--timeout", "-1")
    if "pip install" not in err:
        assert code == 2 and "--timeout must be positive, got -1" in err
