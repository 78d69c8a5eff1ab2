"""The fields and notes tags a runs file (benchmarks/published_runs.yaml schema) may use.

A misspelled field (``layout.micro_batch_size`` for ``micro_batch``) or tag (``[memory=MiB]``)
would otherwise be ignored and the run compared under a default the user did not mean, so both
are rejected with a one-line UsageError. The accepted names are the union of what the shipped
datasets (published_runs.yaml, modern_runs.yaml) use and what planner/fidelity/runs.py reads (the
descriptive fields model.name, params_b, dense_layers, arch_notes, hardware.gpus_per_node,
intra_node and inter_node are not read, but the shipped rows carry them; the modern rows' MoE
block: num_experts, top_k, moe_ffn_hidden, shared_experts {count, ffn_hidden}, and layout.etp).
A row may add ``precision`` (bf16 | fp8 | fp8-blockwise | mxfp8) and ``hardware.profile`` (a
hardware profile) beside its ``framework``.
"""

from __future__ import annotations

import re

from ..errors import UsageError

TOP_FIELDS = ("id", "source", "model", "hardware", "layout", "measured", "notes", "framework",
              "precision")
SECTION_FIELDS: dict[str, tuple[str, ...]] = {
    "model": ("name", "catalog", "params_b", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
              "seq_len", "arch_notes", "num_experts", "top_k", "moe_ffn_hidden", "shared_experts",
              "dense_layers"),
    "hardware": ("gpu", "gpus", "gpus_per_node", "intra_node", "inter_node", "profile"),
    "layout": ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch", "global_batch",
               "zero_stage", "recompute", "sequence_parallel"),
    "measured": ("tflops_per_gpu", "mfu_percent", "hfu_percent", "tokens_per_s", "iteration_s",
                 "peak_memory_gb"),
}

# Notes tags that change how a row is read, and the values each accepts.
TAG_VALUES: dict[str, tuple[str, ...]] = {
    "flops": ("narayanan", "korthikanti", "mosaic"),
    "memory": ("GiB", "GB"),
    "trust": ("high", "medium", "low"),
}
# Any "[flops=...]" / "[memory=...]" / "[trust=...]" (key in any case, spaces around '='
# allowed), valid or not.
_TAG = re.compile(r"\[\s*(flops|memory|trust)\s*=\s*([^\]]*?)\s*\]", re.IGNORECASE)


def check_fields(row: dict) -> None:
    """UsageError naming the first unknown field (``layout.micro_batch_size``) of a run's row and
    the names accepted there; sections that are not mappings are left to the loader's checks."""
    _check(row, TOP_FIELDS, "")
    for section, accepted in SECTION_FIELDS.items():
        if isinstance(row.get(section), dict):
            _check(row[section], accepted, f"{section}.")


def _check(mapping: dict, accepted: tuple[str, ...], prefix: str) -> None:
    for key in mapping:
        if key not in accepted:
            raise UsageError(f"unknown field '{prefix}{key}' (accepted: {', '.join(accepted)})")


def notes_tags(notes: str) -> dict[str, str]:
    """The ``[flops=...]``, ``[memory=...]`` and ``[trust=...]`` tags of a run's notes, as
    {"flops": "mosaic", ...}.

    UsageError (naming the tag) for a value not in TAG_VALUES (``[memory=MiB]``) or for two tags
    of one key with different values (``[memory=GiB]`` and ``[memory=GB]``); the same tag twice
    is accepted.
    """
    found: dict[str, str] = {}
    for match in _TAG.finditer(notes):
        key, value = match.group(1).lower(), match.group(2)
        accepted = TAG_VALUES[key]
        if value not in accepted:
            raise UsageError(f"unknown notes tag {match.group(0)} (accepted: "
                             f"{', '.join(f'[{key}={v}]' for v in accepted)})")
        if key in found and found[key] != value:
            raise UsageError(f"conflicting notes tags [{key}={found[key]}] and [{key}={value}]: keep one")
        found[key] = value
    return found
