"""Errors that the CLI turns into one line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

from typing import Any

# The optional extras of pyproject.toml, worded the same in every message and in the README
# (tests/test_outputs_and_setup.py checks the README carries these commands).
TORCH_CPU = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
PLOT_EXTRA = ("--plot needs matplotlib, plan3d's optional extra 'plot': pip install -e '.[plot]' "
              "in the plan3d source tree (or pip install 'matplotlib>=3.6')")
VALIDATE_EXTRA = ("plan3d validate needs PyTorch 2.13, plan3d's optional extra 'validate': on a "
                  f"machine without a GPU first {TORCH_CPU} (PyPI's default is a CUDA build), "
                  "then pip install -e '.[validate]' in the plan3d source tree")


class PlannerError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 2


class UsageError(PlannerError):
    """Bad input: unknown name, malformed file, value out of range. Exit code 2."""

    exit_code = 2


class NoFitError(PlannerError):
    """The input is valid but no layout fits in memory. Exit code 1.

    Attributes (set by the constructor; None when the raiser has no closest miss, e.g. a sweep
    that found no fit at any count):
    - ``closest``: the closest miss, a planner.cost.Estimate of one layout (index 0), the
      layout that needs the least memory per GPU;
    - ``usable``: bytes per GPU a layout may use (HBM capacity less any --min-memory-headroom);
    - ``to_fit``: the smallest GPU count above this one on which a layout fits, with the best
      layout there (planner.refusal.FitHint), None when no count up to the limit fits.
    """

    exit_code = 1

    def __init__(self, message: str, closest: Any = None, usable: float | None = None,
                 to_fit: Any = None) -> None:
        super().__init__(message)
        self.closest = closest
        self.usable = usable
        self.to_fit = to_fit


class DeadlineError(PlannerError):
    """Layouts fit, but none trains within the deadline (``--deadline``). Exit code 1.

    ``fastest``: the layout with the shortest expected time to train (a planner.cost.Estimate
    of one layout, index 0), None when the raiser has none; ``seconds``: that time; ``rows``:
    a sweep's rows (planner.sweep), each count marked with why it missed, else None."""

    exit_code = 1

    def __init__(self, message: str, fastest: Any = None, seconds: float | None = None,
                 rows: list | None = None) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.seconds = seconds
        self.rows = rows
