"""Commands that list the catalogs: models, hardware."""

from __future__ import annotations

from typing import Optional

import typer

from .. import catalog, report
from .app import JSON, app, handle_errors


# optional fields left out of `models --show` at these values (the schema's defaults)
_DEFAULTS = {"rotary_percent": 1.0, "mtp_layers": 0, "qk_norm": "none", "attention_sinks": False}


def _model_dict(model) -> dict:
    """A model as its YAML schema writes it: unset fields and optional fields at their defaults
    left out; an mla block keeps ``q_lora_rank: null`` (null is a value there, not unset)."""
    data = model.model_dump(mode="json", exclude_none=True)
    for key, default in _DEFAULTS.items():
        if key in data and data[key] == default:
            del data[key]
    if model.mla is not None:
        data["mla"] = model.mla.model_dump(mode="json")
    return data


def _mlp_column(m) -> str:
    """The MLP as listed: the activation, and for MoE 'top-k/E experts (+ shared)'."""
    if m.moe is None:
        return m.activation
    shared = f" +{m.moe.shared_experts} shared" if m.moe.shared_experts else ""
    return f"{m.activation}, top-{m.moe.router_topk}/{m.moe.num_experts}{shared}"


def _heads_column(m) -> str:
    """Attention heads / KV heads (MLA: heads and 'MLA'); '+ window w' with a sliding window."""
    heads = f"{m.num_attention_heads} MLA" if m.attention_kind == "mla" else \
        f"{m.num_attention_heads}/{m.kv_heads}"
    return heads + (f", window {m.sliding_window}" if m.sliding_window else "")


@app.command()
@handle_errors
def models(json_out: bool = JSON,
           show: Optional[str] = typer.Option(None, "--show", help="Print one model (catalog name, "
                                              "YAML or HF config.json) as YAML, valid for --model.")) -> None:
    """List the model catalog: total and active parameters (MoE: router_topk experts, both
    embedding matrices counted), layers, widths, attention and MLP."""
    from ..cost.model_counts import active_params, total_params
    if show is not None:
        import sys
        import yaml
        data = _model_dict(catalog.resolve_model(show))
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True))
        return
    entries = catalog.models().values()
    if json_out:
        report.print_json([_model_dict(m) for m in entries])
        return
    rows = [(m.name, report.param_count(total_params(m)), report.param_count(active_params(m)),
             str(m.num_layers), str(m.hidden_size), _heads_column(m), _mlp_column(m),
             ", ".join(m.aliases))
            for m in sorted(entries, key=total_params)]
    report.catalog_table("Models", rows, ("name", "params", "active", "layers", "hidden",
                                          "heads/kv", "mlp", "aliases"))


@app.command()
@handle_errors
def hardware(json_out: bool = JSON) -> None:
    """List the hardware profiles (the NVLink domain and GPUs per host differ on GB200 NVL72)."""
    entries = catalog.hardware_profiles().values()
    if json_out:
        report.print_json([h.model_dump(mode="python") for h in entries])  # SI numbers
        return
    rows = []
    for h in entries:
        d = h.model_dump(mode="json")
        rows.append((h.name, h.gpu.name, f"{h.gpu.hbm_capacity / 2**20:.0f} MiB",
                     f"{h.gpu.peak_tflops['bf16']:g}", str(h.gpus_per_host), str(h.nvlink_domain),
                     d["intra_node"]["bandwidth_per_gpu"],
                     f"{h.inter_node.nics_per_node} x {h.inter_node.bandwidth_per_nic * 8 / 1e9:g} Gb/s",
                     _storage_state(h)))
    report.catalog_table("Hardware profiles", rows, (
        "name", "GPU", "HBM (nvidia-smi)", "bf16 TFLOP/s", "GPUs/host", "NVLink domain",
        "NVLink/GPU (one way)", "NICs/host", "storage placeholders"))


def _storage_state(h) -> str:
    """Which storage numbers are placeholders the user should set: 'per host, aggregate',
    'aggregate', 'none' (all sourced), or 'no storage block'."""
    if h.storage is None:
        return "no storage block"
    return ", ".join(name.replace("_", " ") for name in h.storage.placeholders) or "none"
