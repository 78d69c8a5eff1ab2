"""Held-out check: plan3d against the MoE rows of Megatron-Bridge's 26.02-26.04.01 tables that the
dataset does not hold.

NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @067f987df03b, sections "26.02",
"26.02.01", "26.04" and "26.04.01 NeMo Container" (pre-training, force-balanced dropless MoE
routing), rows of DGX-H100, DGX-B200 and DGX-GB200 for the four MoE models of the catalog
(DeepSeek-V3, GPT-OSS-120B, Qwen3-30B-A3B, Qwen3-235B-A22B) in BF16, FP8 and MXFP8, less the 13 rows
that benchmarks/modern_runs.yaml holds: 29 rows, ROWS below as the tables print them. Each row
gets the facts the dataset's rows of its model get from benchmarks/modern_runs_facts.yaml (its
per-model and Megatron-Bridge-wide entries: recomputation per release, gradient dtype, cross
entropy; the training software where a release-wide entry states it, as 25.11's and 26.02's
GPT-OSS), its hardware profile, precision and catalog model, and DeepSeek-V3's
pipeline split from the recipe's layout map (pp 4 x vp 4: 16 + .. + 13 layers; pp 16: 4 + .. + 1);
what the table leaves unknown (the dispatcher, EP overlap, TP overlap and CUDA graphs of the other
rows, Qwen3-235B's uneven split) is resolved by the search,
as for the dataset. Nothing is fitted to these rows; the script writes only to a temporary
directory and prints ``plan3d accuracy --resolve search`` on them, then the error table by GPU and
precision and by release.

    python benchmarks/heldout_bridge_archive.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from planner.fidelity.facts import matching_entries

ROOT = Path(__file__).resolve().parents[1]
# (release, system, model, GPUs, precision, GBS, MBS, sequence, TP, PP, CP, VP (None: n/a), EP,
#  tokens/s/GPU), as printed
ROWS = [
    ("26.04.01", "gb200", "deepseekv3", 256, "mxfp8", 4096, 1, 4096, 1, 4, 1, 4, 64, 4256),
    ("26.04.01", "b200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 8, 13568),
    ("26.04.01", "h100", "gptoss120b", 64, "bf16", 1280, 1, 4096, 1, 4, 1, None, 8, 5824),
    ("26.04.01", "gb200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26112),
    ("26.04.01", "b200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 27136),
    ("26.04.01", "h100", "qwen3-30b", 16, "fp8", 1024, 1, 4096, 1, 1, 1, None, 16, 8960),
    ("26.04.01", "b200", "qwen3-235b", 256, "mxfp8", 8192, 1, 4096, 1, 8, 1, None, 8, 3776),
    ("26.04", "gb200", "deepseekv3", 256, "mxfp8", 4096, 1, 4096, 1, 4, 1, 4, 64, 4193),
    ("26.04", "b200", "deepseekv3", 256, "mxfp8", 4096, 1, 4096, 1, 16, 1, None, 8, 2815),
    ("26.04", "gb200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 64, 15938),
    ("26.04", "b200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 8, 13045),
    ("26.04", "h100", "gptoss120b", 64, "bf16", 1280, 1, 4096, 1, 4, 1, None, 8, 5810),
    ("26.04", "gb200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26032),
    ("26.04", "b200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26859),
    ("26.04", "h100", "qwen3-30b", 16, "fp8", 1024, 1, 4096, 1, 1, 1, None, 16, 8901),
    ("26.04", "gb200", "qwen3-235b", 256, "mxfp8", 8192, 1, 4096, 1, 8, 1, 3, 32, 5672),
    ("26.04", "h100", "qwen3-235b", 256, "fp8", 8192, 1, 4096, 2, 8, 1, 4, 32, 1686),
    ("26.02.01", "gb200", "deepseekv3", 256, "mxfp8", 4096, 1, 4096, 1, 4, 1, 4, 64, 4021),
    ("26.02.01", "b200", "deepseekv3", 256, "mxfp8", 4096, 1, 4096, 1, 16, 1, None, 8, 2790),
    ("26.02.01", "gb200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 64, 15754),
    ("26.02.01", "b200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 8, 13722),
    ("26.02.01", "h100", "gptoss120b", 64, "bf16", 1280, 1, 4096, 1, 4, 1, None, 8, 5984),
    ("26.02.01", "gb200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26373),
    ("26.02.01", "b200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26695),
    ("26.02.01", "gb200", "qwen3-235b", 256, "mxfp8", 8192, 1, 4096, 1, 8, 1, None, 32, 5530),
    ("26.02.01", "h100", "qwen3-235b", 256, "fp8", 8192, 1, 4096, 2, 8, 1, 4, 32, 1611),
    ("26.02", "b200", "gptoss120b", 64, "bf16", 1280, 4, 4096, 1, 1, 1, None, 64, 8047),
    ("26.02", "gb200", "qwen3-30b", 8, "mxfp8", 512, 4, 4096, 1, 1, 1, None, 8, 26084),
    ("26.02", "b200", "qwen3-30b", 8, "mxfp8", 512, 1, 4096, 1, 1, 1, None, 8, 9691),
]
HARDWARE = {"h100": "dgx-h100", "b200": "dgx-b200", "gb200": "gb200-nvl72"}
GPUS_PER_NODE = {"h100": 8, "b200": 8, "gb200": 4}
CATALOG = {"deepseekv3": "deepseek-v3", "gptoss120b": "gpt-oss-120b", "qwen3-30b": "qwen3-30b-a3b",
           "qwen3-235b": "qwen3-235b-a22b"}
# Megatron-Bridge src/megatron/bridge/recipes/deepseek/deepseek_v3.py layout map (as the dataset's
# DeepSeek-V3 facts): (pp, vp) -> (first, last) stage layers
DSV3_SPLIT = {(4, 4): (16, 13), (16, None): (4, 1)}
SOURCE = "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md @067f987df03b"


def _row(release, system, model, gpus, precision, gbs, mbs, seq, tp, pp, cp, vp, ep, per_gpu):
    """(run row in modern_runs.yaml's schema, its facts entry)."""
    rid = f"mbridge{release.replace('.', '')}-{system}-{precision}-{model}-{gpus}gpu"
    tokens = per_gpu * gpus
    row = {"id": rid, "source": f"{SOURCE}, {release} NeMo Container, {system.upper()}",
           "model": {"name": CATALOG[model], "seq_len": seq},
           "hardware": {"gpus": gpus, "gpus_per_node": GPUS_PER_NODE[system]},
           "layout": {"tp": tp, "pp": pp, "dp": gpus // (tp * pp * cp), "cp": cp, "ep": ep, "etp": 1,
                      "vpp": vp, "micro_batch": mbs, "global_batch": gbs},
           "measured": {"tokens_per_s": tokens, "iteration_s": round(gbs * seq / tokens, 4)},
           "notes": f"[trust=high] {per_gpu} tokens/s/GPU as printed (held out)"}
    facts = {"runs": rid, "group": f"Megatron-Bridge {release} (held out)",
             "hardware": HARDWARE[system], "precision": precision, "model": CATALOG[model],
             "source": f"{SOURCE}, {release} table ({system.upper()}, {precision})"}
    if model == "deepseekv3" and (pp, vp) in DSV3_SPLIT:
        first, last = DSV3_SPLIT[(pp, vp)]
        facts["layout"] = {"first_stage_layers": first, "last_stage_layers": last}
    return row, facts


def write_inputs(folder: Path) -> Path:
    """Write the held-out runs file and its facts file (the rows' own entries, then the shipped
    modern_runs_facts.yaml entries that match them) into ``folder``; return the runs file. SystemExit if a held-out id is
    also a dataset id."""
    rows, facts = zip(*(_row(*r) for r in ROWS))
    shipped = yaml.safe_load((ROOT / "benchmarks" / "modern_runs.yaml").read_text())
    clash = {r["id"] for r in rows} & {r["id"] for r in shipped}
    if clash:
        raise SystemExit(f"held-out ids also in the dataset: {sorted(clash)}")
    runs = folder / "heldout_runs.yaml"
    runs.write_text(yaml.safe_dump(list(rows), sort_keys=False))
    shipped_facts = matching_entries(ROOT / "benchmarks" / "modern_runs_facts.yaml", [r["id"] for r in rows])
    (folder / "heldout_runs_facts.yaml").write_text(yaml.safe_dump(list(facts) + shipped_facts, sort_keys=False))
    return runs


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        runs = write_inputs(Path(tmp))
        cmd = [sys.executable, "-c", "from planner.cli import main; main()", "accuracy", str(runs),
               "--resolve", "search", "--no-loso"]
        code = subprocess.call(cmd)
        if code:
            return code
        report = subprocess.run(cmd + ["--json"], capture_output=True, text=True, check=True).stdout
        table = [sys.executable, str(ROOT / "benchmarks" / "accuracy_table.py")]
        return subprocess.run(table, input=report, text=True).returncode


if __name__ == "__main__":
    sys.exit(main())
