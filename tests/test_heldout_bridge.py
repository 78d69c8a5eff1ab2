"""The held-out Megatron-Bridge rows load as runs the way the dataset's do (no plan3d estimate
here: benchmarks/heldout_bridge_archive.py prints those)."""

from __future__ import annotations

from tests.conftest import load_benchmark


def _script():
    return load_benchmark("heldout_bridge_archive")


def test_heldout_rows_load_with_their_facts(tmp_path):
    from planner.fidelity.runs import load_runs
    script = _script()
    cases = load_runs(script.write_inputs(tmp_path))
    assert len(cases) == len(script.ROWS) == 29 and not [c.id for c in cases if c.skipped]
    assert all(c.group.endswith("(held out)") for c in cases)
    by_id = {c.id: c for c in cases}
    # the table's figures: 26.04 DGX-B200 GPT-OSS-120B, EP 8, 13,045 tokens/s/GPU on 64 GPUs,
    # 1,280 x 4,096 tokens per step: 5,242,880 / 834,880 = 6.27979 s
    gptoss = by_id["mbridge2604-b200-bf16-gptoss120b-64gpu"]
    assert abs(gptoss.measured["iteration_s"] - 6.27979) < 1e-4 and gptoss.layout.ep == 8
    assert (gptoss.hardware.name, gptoss.training.precision) == ("dgx-b200", "bf16")
    assert gptoss.layout.recompute == "selective+"  # the 26.x GPT-OSS fact (Bridge @74695a06)
    # DeepSeek-V3 on pp 4 x vp 4: the recipe's layout map, 16 + 16 + 16 + 13 layers
    dsv3 = by_id["mbridge2604-gb200-mxfp8-deepseekv3-256gpu"]
    assert (dsv3.layout.first_stage_layers, dsv3.layout.last_stage_layers) == (16, 13)
    assert by_id["mbridge2604-h100-fp8-qwen3-30b-16gpu"].layout.recompute == "none"
