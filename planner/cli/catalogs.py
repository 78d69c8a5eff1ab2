"""Commands that list the catalogs: models, hardware."""

from __future__ import annotations

from typing import Optional

import typer

from .. import catalog, report
from .app import JSON, app, handle_errors


def _model_dict(model) -> dict:
    """A model as its YAML schema writes it: unset fields and a full rotation left out."""
    data = model.model_dump(mode="json", exclude_none=True)
    if data.get("rotary_percent") == 1.0:
        del data["rotary_percent"]
    return data


@app.command()
@handle_errors
def models(json_out: bool = JSON,
           show: Optional[str] = typer.Option(None, "--show", help="Print one model (catalog name, "
                                              "YAML or HF config.json) as YAML, valid for --model.")) -> None:
    """List the model catalog."""
    from ..cost.flops import total_params
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
    rows = [(m.name, report.param_count(total_params(m)), str(m.num_layers), str(m.hidden_size),
             f"{m.num_attention_heads}/{m.kv_heads}", m.activation, ", ".join(m.aliases))
            for m in sorted(entries, key=total_params)]
    report.catalog_table("Models", rows, ("name", "params", "layers", "hidden", "heads/kv", "mlp", "aliases"))


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
