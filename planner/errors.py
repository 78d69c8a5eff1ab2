"""Errors that the CLI turns into one line on stderr and an exit code (never a traceback)."""


class PlannerError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 2


class UsageError(PlannerError):
    """Bad input: unknown name, malformed file, value out of range. Exit code 2."""

    exit_code = 2


class NoFitError(PlannerError):
    """The input is valid but no layout fits in memory. Exit code 1."""

    exit_code = 1
