"""Held-out check: plan3d against Megatron-Bridge's 26.08 GB200 table, which is not in the dataset.

NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md @067f987df03b ("26.08 NeMo Container",
DGX-GB200, MXFP8, force-balanced dropless MoE routing) measured four MoE layouts that the dataset
holds from earlier releases: DeepSeek-V3 (256 GPUs, PP4 VP4 EP64), GPT-OSS-120B (64, EP64, MBS 4),
Qwen3-30B-A3B (8, EP8, MBS 4) and Qwen3-235B-A22B (256, PP8 VP3 EP32). This script copies the
dataset's row of the same layout, puts the 26.08 tokens/s/GPU in it, takes the facts of those rows
(the Megatron-Bridge-wide and per-model entries of benchmarks/modern_runs_facts.yaml:
recomputation, gradient dtype, split; the training software is stated per release and row there,
so the 26.08 rows' dispatcher, EP overlap, TP overlap and CUDA graphs are left to the search) and
runs
``plan3d accuracy --resolve search`` on them. Nothing is fitted to these rows; it writes only to a
temporary directory.

    python benchmarks/heldout_bridge_2608.py
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from planner.fidelity.facts import matching_entries

ROOT = Path(__file__).resolve().parents[1]
# (row of the same layout in modern_runs.yaml, model catalog name, 26.08 tokens/s/GPU, GPUs)
ROWS = [("mbridge2602-gb200-mxfp8-deepseekv3-256gpu", "deepseekv3", 4912, 256),
        ("mbridge260401-gb200-bf16-gptoss120b-64gpu", "gptoss120b", 28672, 64),
        ("mbridge2511-gb200-fp8mx-qwen3-30b-8gpu", "qwen3-30b", 39936, 8),
        ("mbridge260401-gb200-mxfp8-qwen3-235b-256gpu", "qwen3-235b", 7280, 256)]
FACTS = """- runs: mbridge2608-*
  group: Megatron-Bridge 26.08 (held out)
  precision: mxfp8
  hardware: gb200-nvl72
  source: Megatron-Bridge 26.08 table (DGX-GB200, MXFP8)
- runs: mbridge2608-*-deepseekv3-*
  model: deepseek-v3
  layout: {first_stage_layers: 16, last_stage_layers: 13}
  source: as mbridge2602-gb200-mxfp8-deepseekv3-256gpu (the recipe's pp 4 x vp 4 layout map)
- runs: mbridge2608-*-gptoss120b-*
  model: gpt-oss-120b
  source: as the earlier GPT-OSS rows
- runs: mbridge2608-*-qwen3-30b-*
  model: qwen3-30b-a3b
  source: as the earlier Qwen3 rows
- runs: mbridge2608-*-qwen3-235b-*
  model: qwen3-235b-a22b
  source: as the earlier Qwen3 rows
"""


def main() -> int:
    rows = {r["id"]: r for r in yaml.safe_load((ROOT / "benchmarks" / "modern_runs.yaml").read_text())}
    out = []
    for template, name, per_gpu, gpus in ROWS:
        row = copy.deepcopy(rows[template])
        row["id"] = f"mbridge2608-gb200-mxfp8-{name}-{gpus}gpu"
        tokens = per_gpu * gpus
        batch = row["layout"]["global_batch"] * row["model"]["seq_len"]
        row["measured"] = {"tflops_per_gpu": None, "mfu_percent": None, "hfu_percent": None,
                           "tokens_per_s": tokens, "iteration_s": round(batch / tokens, 4),
                           "peak_memory_gb": None}
        row["source"] = "Megatron-Bridge docs/performance-summary.md @067f987df03b, 26.08, DGX-GB200"
        row["notes"] = f"[trust=high] [precision=MXFP8] {per_gpu} tokens/s/GPU; layout as {template}"
        out.append(row)
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "mbridge2608_runs.yaml"
        runs.write_text(yaml.safe_dump(out, sort_keys=False))
        shipped = matching_entries(ROOT / "benchmarks" / "modern_runs_facts.yaml", [r["id"] for r in out])
        (Path(tmp) / "mbridge2608_runs_facts.yaml").write_text(FACTS + yaml.safe_dump(shipped, sort_keys=False))
        return subprocess.call([sys.executable, "-c", "from planner.cli import main; main()",
                                "accuracy", str(runs), "--resolve", "search", "--no-loso"])


if __name__ == "__main__":
    sys.exit(main())
