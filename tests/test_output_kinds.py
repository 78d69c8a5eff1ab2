"""Kinds of output mistakes, one test per kind, across the commands that can make them: a share
printed beside the step that is not a share of it, a rule named after another framework, units
mixed on one screen, a baseline rewrite that calls new entries changed, tied rows that hide
their layouts, --json without a figure its table prints, a README sentence that is not true."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import catalog, fmt
from planner.cli import app
from planner.layout import Candidates, Layout
from planner.specs import TrainingSpec

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def _ok(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.stdout


# ------------------------------------------------------------------ rule names

def test_every_rule_is_named_after_its_own_framework_or_none():
    # a search for DeepSpeed or torchtitan printed "... interleaved as Megatron-Core allows": a
    # rule's name names the framework whose rule it is, or none (the rules every framework
    # shares); checked on layouts that make the conditional rules appear (an interleaved uneven
    # split, activation offload), for a dense and an MoE model, under every shipped profile
    from planner.search.framework_rules import framework_masks
    from planner.search.rules import constraint_masks
    profiles = catalog.framework_profiles().values()
    displays = {p.display for p in profiles} | {"Megatron-LM", "Megatron-Core", "DeepSpeed"}
    c = Candidates.from_layouts([
        Layout(tp=2, pp=4, dp=1, zero_stage=1, micro_batch_size=1, vpp=2, first_stage_layers=1,
               last_stage_layers=1),
        Layout(tp=1, pp=1, dp=8, zero_stage=1, micro_batch_size=1, offload_layers=1)])
    for model in (catalog.resolve_model("175b"), catalog.resolve_model("mixtral-8x7b")):
        for p in profiles:
            tr = TrainingSpec(seq_length=4096, global_batch_size=64, framework=p.name)
            names = constraint_masks(model, tr, 8, c, framework=p)
            own = framework_masks(p, model, tr, c)
            for name in names:
                named = {d for d in displays if d in name}
                if name in own:  # its own display (or the family name it begins with) only
                    assert all(p.display.startswith(d) for d in named), (p.name, name)
                else:
                    assert not named, (p.name, name)
