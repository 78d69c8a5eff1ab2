"""Which models the per-GPU cost model covers: the one check to remove as it learns the rest.

The per-GPU cost model (memory, compute, volumes, step) knows dense MHA/GQA decoders. Model-level
counts (model_counts, model_flops) cover mixture-of-experts, MLA and MTP too, so `plan3d models`,
`models --show` and parameter counts work for them; costing a layout of such a model needs
expert parallelism (EP/ETP/EDP), MLA's activations and the MTP layers, which are not modelled
yet. Sliding windows are accepted: model FLOPs (MFU) count the window; per-GPU attention time
still counts full causal attention (model_flops.attention_core_flops_per_sequence is the
window-aware count for it).
"""

from __future__ import annotations

from ..errors import UsageError
from ..specs import ModelSpec


def refuse_unmodelled(model: ModelSpec) -> None:
    """UsageError (one line) if the per-GPU cost model cannot cost ``model`` yet: MoE layers
    (expert parallelism is not modelled yet), MLA attention or MTP modules. Called by every
    command that costs a layout (search, sweep, estimate, export, placement, validate, regress);
    remove it, and its calls, when expert parallelism, MLA and MTP are costed."""
    missing = []
    if model.moe is not None:
        missing.append("mixture-of-experts layers (expert parallelism is not modelled yet)")
    if model.attention_kind == "mla":
        missing.append("MLA attention")
    if model.mtp_layers:
        missing.append("MTP modules")
    if missing:
        raise UsageError(f"{model.name}: the per-GPU cost model does not cover "
                         f"{', '.join(missing)}; `plan3d models --show {model.name}` and its "
                         "parameter and FLOP counts work")
