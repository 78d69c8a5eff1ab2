"""The `plan3d` command line (typer). Thin: parse, call the planner, hand results to planner.render.

Each module registers its commands on the one app; the planner's heavy parts are imported inside
the commands, so start-up stays lean.
"""

from . import plan, estimate, stack, timeline, fidelity, catalogs  # register the commands, in --help order  # noqa: I001
from .app import app, main

__all__ = ["app", "main", "catalogs", "estimate", "fidelity", "plan", "stack", "timeline"]
