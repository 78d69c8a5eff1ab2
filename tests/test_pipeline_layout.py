"""Megatron-Core's --pipeline-model-parallel-layout (layout.split.pipeline_layout): the string
plan3d writes for a split, read back by the grammar Megatron's parser takes (stages "|"
separated in layer order, stage s on rank s mod pp; "t*n" = n decoder layers; E first, the MTP
layers and L last: megatron/core/transformer/pipeline_parallel_layer_layout.py @d98e8a64)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

from planner import catalog
from planner.layout.split import pipeline_layout, split_of, uneven_layout_ok, uneven_shape_ok
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.specs import TrainingSpec


def _stages(text: str) -> list[list[str]]:
    """Each stage's layer letters, "t*3" expanded."""
    out = []
    for stage in text.split("|"):
        letters = []
        for letter, count in re.findall(r"([EtmL])(?:\*(\d+))?", stage):
            letters += [letter] * int(count or 1)
        assert "".join(re.findall(r"[EtmL](?:\*\d+)?", stage)) == stage, stage
        out.append(letters)
    return out


def test_deepseek_v3_on_pp8_vpp4():
    """DeepSeek-V3 (61 layers, one MTP layer) on pp 8, vpp 4 with 7 layers on the first rank
    and 6 on the last (7 + 6 x 8 + 6 = 61): 32 stages; rank 0's chunks hold 1, 2, 2, 2 layers
    (the embedding's chunk one fewer), the last rank's 2, 2, 1, 1 (the loss's one fewer) --
    the shape of Megatron-Bridge's Et|(tt|)*30mL."""
    stages = _stages(pipeline_layout(61, 8, 4, 7, 6, mtp_layers=1))
    assert len(stages) == 32
    assert stages[0] == ["E", "t"] and stages[-1] == ["t", "m", "L"]
    assert [stages[s].count("t") for s in (0, 8, 16, 24)] == [1, 2, 2, 2]
    assert [stages[s].count("t") for s in (7, 15, 23, 31)] == [2, 2, 1, 1]


@given(pp=st.integers(1, 16), vpp=st.integers(1, 6), first=st.integers(0, 12),
       last=st.integers(0, 12), middle=st.integers(1, 12), mtp=st.integers(0, 2))
def test_layout_places_every_layer_on_its_rank(pp, vpp, first, last, middle, mtp):
    """For any split of the modelled shape: pp x vpp stages, the embedding first, the MTP layers
    and the loss last, every decoder layer once, and each rank's stages (s mod pp) holding its
    share of the split."""
    if first == 0 or last == 0 or pp < 2:
        first = last = 0
    L = first + last + middle * max(pp - 2, 0) if first else middle * pp
    stages = _stages(pipeline_layout(L, pp, vpp, first, last, mtp))
    flat = [x for s in stages for x in s]
    assert len(stages) == pp * vpp
    assert flat[0] == "E" and flat[-1] == "L" and flat.count("t") == L and flat.count("m") == mtp
    assert "t" not in flat[flat.index("m"):] if mtp else True
    per_rank = [sum(stages[s].count("t") for s in range(r, pp * vpp, pp)) for r in range(pp)]
    want = [first] + [middle] * (pp - 2) + [last] if first else [middle] * pp
    assert per_rank == want


def test_an_empty_chunk_is_refused():
    """Every chunk needs a layer: 61 layers on pp 8, vpp 4 as 3+..+4 (3 + 6 x 9 + 4 = 61)
    leaves the first rank 3 layers for 4 chunks; 7+..+6 (7 + 6 x 8 + 6) fills every chunk."""
    split = split_of(61, np.array([8, 8]), np.array([7, 3]), np.array([6, 4]), np.array([4, 4]))
    ok, shape = uneven_layout_ok(61, split), uneven_shape_ok(61, split)
    assert ok.tolist() == [True, False] and shape.tolist() == [True, True]


@pytest.mark.parametrize("pp, vpp", [(8, 4), (8, 2), (4, 4)])
def test_deepseek_v3_interleaved_layouts_are_searched(pp, vpp):
    """Megatron-Bridge's DeepSeek-V3 recipes ship (pp, vpp) = (8, 2), (4, 2) and (4, 4), and
    Megatron-LM issue #1721 runs pp 8 vpp 4 (61 layers divide by none of them): the search
    finds a plan with them pinned."""
    m, hw = catalog.resolve_model("deepseek-v3"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=4096, global_batch_size=8192)
    r = search(m, hw, tr, 1024, SearchOptions(pp=pp, vpp=vpp, keep=1, max_cp=1))
    lay = r.ranked.candidates.layout(0)
    assert (lay.pp, lay.vpp) == (pp, vpp) and lay.first_stage_layers > 0


def test_deepseek_v3_pp8_vpp4_exports_a_layout_megatron_accepts():
    """The issue's question: DeepSeek-V3 on 1,024 H100 with pp 8 and vpp 4 pinned finds a plan,
    and its Megatron-LM export writes the pipeline layout (no vpp or split argument beside it)
    that the ported argument and layout checks of Megatron-LM accept; Megatron-Bridge gets the
    same string as model.pipeline_model_parallel_layout."""
    import yaml

    from planner import __version__
    from planner.frameworks import export_plan
    from planner.plan import Plan
    from tests import megatron_rules as rules
    m, hw = catalog.resolve_model("deepseek-v3"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=4096, global_batch_size=8192)
    lay = search(m, hw, tr, 1024, SearchOptions(pp=8, vpp=4, keep=1, max_cp=1)).ranked.candidates.layout(0)
    plan = Plan(plan3d_version=__version__, model=m, hardware=hw, gpus=1024, training=tr, layout=lay)
    args = rules.parse(export_plan(plan, "megatron").text)
    rules.validate(args, world=1024)
    stages = rules.layout_stages(args["pipeline_model_parallel_layout"])
    assert len(stages) == 32 and "num_virtual_stages_per_pipeline_rank" not in args
    bridge = yaml.safe_load(export_plan(plan, "nemo").text)["model"]
    assert bridge["pipeline_model_parallel_layout"] == args["pipeline_model_parallel_layout"]
    assert "num_layers_in_first_pipeline_stage" not in bridge


def test_the_ported_layout_check_refuses_what_megatron_refuses():
    """Megatron-Bridge's own DeepSeek-V3 string passes; a layout missing the loss, with a
    decoder layer after the MTP layer, or beside --num-virtual-stages-per-pipeline-rank fails."""
    from tests import megatron_rules as rules
    base = {"num_layers": 61, "mtp_num_layers": 1, "pipeline_model_parallel_size": 8,
            "tensor_model_parallel_size": 1}
    rules.validate({**base, "pipeline_model_parallel_layout": "Et|(tt|)*30mL"}, world=8)
    for bad in ({"pipeline_model_parallel_layout": "Et|(tt|)*30m"},
                {"pipeline_model_parallel_layout": "Et|(tt|)*29tmtL"},
                {"pipeline_model_parallel_layout": "Et|(tt|)*30mL", "num_virtual_stages_per_pipeline_rank": 4}):
        with pytest.raises(rules.MegatronRejects):
            rules.validate({**base, **bad}, world=8)
