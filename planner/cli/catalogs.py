"""Commands that list the catalogs: models, hardware."""

from __future__ import annotations

from typing import Optional

import typer

from .. import catalog
from ..render import console
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
    if show is not None:
        import sys
        import yaml
        data = _model_dict(catalog.resolve_model(show))
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True))
        return
    entries = catalog.models().values()
    if json_out:
        console.print_json([_model_dict(m) for m in entries])
        return
    from ..render.catalog import models_table
    models_table(entries)


@app.command()
@handle_errors
def hardware(json_out: bool = JSON) -> None:
    """List the hardware profiles."""
    entries = catalog.hardware_profiles().values()
    if json_out:
        console.print_json([h.model_dump(mode="python") for h in entries])  # SI numbers
        return
    from ..render.catalog import hardware_table
    hardware_table(entries)
