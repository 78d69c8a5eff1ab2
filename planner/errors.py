"""Errors that the CLI turns into one line on stderr and an exit code (never a traceback)."""

from __future__ import annotations

from typing import Any


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
    - ``usable``: bytes per GPU a layout may use (HBM capacity less any --min-memory-headroom).
    """

    exit_code = 1

    def __init__(self, message: str, closest: Any = None, usable: float | None = None) -> None:
        super().__init__(message)
        self.closest = closest
        self.usable = usable


class DeadlineError(PlannerError):
    """Layouts fit, but none trains within the deadline (``--deadline``). Exit code 1.

    ``fastest``: the layout with the shortest expected time to train (a planner.cost.Estimate
    of one layout, index 0), None when the raiser has none; ``seconds``: that time."""

    exit_code = 1

    def __init__(self, message: str, fastest: Any = None, seconds: float | None = None) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.seconds = seconds
