"""Review round 3: what the output says (parameter counts, ties, single-count sweeps, DeepSpeed
notes) matches what was computed."""

from __future__ import annotations

from typer.testing import CliRunner

from planner import __version__, catalog
from planner.cli import app
from planner.frameworks import export_plan
from planner.fmt import params as param_count
from planner.layout import Layout
from planner.plan import Plan
from planner.specs import TrainingSpec


def test_parameter_counts_in_the_units_people_use():
    # 174.6e9 (GPT-3), 1.008e12 (Narayanan's 1T: two decimals below 10T), 66.8e6, 5,120
    assert param_count(174.6e9) == "174.6B"
    assert param_count(1.008e12) == "1.01T"
    assert param_count(66.8e6) == "66.8M"
    assert param_count(5120) == "5,120"
    # rounding never shows 1000.0B or 10.00T: 999.96e9 -> 1.00T, 9.996e12 -> 10.0T
    assert param_count(999.96e9) == "1.00T" and param_count(9.996e12) == "10.0T"


def test_models_show_leaves_out_a_full_rotation():
    runner = CliRunner()
    assert "rotary_percent" not in runner.invoke(app, ["models", "--show", "opt-175b"]).output
    assert "rotary_percent: 0.25" in runner.invoke(app, ["models", "--show", "gpt-neox-20b"]).output
    listing = runner.invoke(app, ["models"]).output
    assert "1.01T" in listing and "1008.0B" not in listing


def test_a_tie_with_the_winner_is_called_a_tie():
    # the distributed optimizer costs what ZeRO-1 costs: the same step, a different layout
    # (without activation offload the winner is a ZeRO-1 layout)
    res = CliRunner().invoke(app, ["search", "-m", "175b", "-g", "512", "--offload-layers", "0",
                                   "--why-not", "distopt=1"])
    assert res.exit_code == 0
    from planner import catalog
    from planner.inputs import training_spec
    from planner.search.options import SearchOptions
    from planner.search.run import search
    m = catalog.resolve_model("175b")
    winner = search(m, catalog.resolve_hardware("dgx-h100"), training_spec(m), 512,
                    SearchOptions(offload_layers=0)).ranked
    short = winner.candidates.layout(0).short()
    assert f"It ties the winner {short}" in " ".join(res.output.split())


def test_deepspeed_pipeline_note_only_with_a_pipeline():
    def notes(pp, dp):
        plan = Plan(plan3d_version=__version__, model=catalog.resolve_model("llama3-8b"),
                    hardware=catalog.resolve_hardware("dgx-h100"), gpus=64,
                    training=TrainingSpec(seq_length=8192, global_batch_size=128),
                    layout=Layout(tp=1, pp=pp, dp=dp, zero_stage=1, micro_batch_size=1))
        return " ".join(export_plan(plan, "deepspeed").notes)
    assert "pipeline:" not in notes(1, 64)
    assert "PipelineModule(num_stages=4)" in notes(4, 16)
