"""Commands that list the catalogs: models, hardware, frameworks."""

from __future__ import annotations

from typing import Optional

import typer

from .. import catalog
from ..render import console
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


@app.command(short_help="List the model catalog, or --show one as YAML.")
@handle_errors
def models(json_out: bool = JSON,
           show: Optional[str] = typer.Option(None, "--show", help="Print one model (catalog name, "
                                              "YAML or HF config.json) as YAML, valid for --model.")) -> None:
    """List the model catalog: total and active parameters (MoE: router_topk experts, both
    embedding matrices counted), layers, widths, attention and MLP."""
    if show is not None:
        from ..render.catalog import show_yaml
        show_yaml(_model_dict(catalog.resolve_model(show)))
        return
    entries = catalog.models().values()
    if json_out:  # every field of the schema in every row, null where a model has none, and
        # the parameter counts the table prints (MoE: active = router_topk experts)
        from ..cost.model_counts import active_params, total_params
        console.print_json([{**m.model_dump(mode="json"), "total_params": int(total_params(m)),
                             "active_params": int(active_params(m))} for m in entries])
        return
    from ..render.catalog import models_table
    models_table(entries)


@app.command(short_help="List the hardware profiles.")
@handle_errors
def hardware(json_out: bool = JSON) -> None:
    """List the hardware profiles (the NVLink domain and GPUs per host differ on GB200 NVL72)."""
    entries = catalog.hardware_profiles().values()
    if json_out:
        console.print_json([h.model_dump(mode="python") for h in entries])  # SI numbers
        return
    from ..render.catalog import hardware_table
    hardware_table(entries)


@app.command(short_help="List the framework profiles, or --show one.")
@handle_errors
def frameworks(json_out: bool = JSON,
               show: Optional[str] = typer.Option(None, "--show", help="Print one framework profile "
                                                  "(name or YAML) with every fact and its source.")) -> None:
    """List the framework profiles (--framework): what each can run and how it runs it."""
    if show is not None:
        from ..render.catalog import show_yaml
        data = catalog.resolve_framework(show).model_dump(mode="json", exclude_none=True)
        for block in data.values():  # each block's facts first, their sources after them
            if isinstance(block, dict) and "sources" in block:
                block["sources"] = block.pop("sources")
        show_yaml(data)
        return
    entries = catalog.framework_profiles().values()
    if json_out:
        console.print_json([f.model_dump(mode="python") for f in entries])  # SI numbers
        return
    from ..render.catalog import frameworks_table
    frameworks_table(entries)
