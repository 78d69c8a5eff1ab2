"""Where a command writes what it makes, the same for every command that takes an output path
(search --export, sweep --plot, export -o, validate --out, calibrate -o, regress --baseline with
--update):

- ``-`` (and ``/dev/stdout``, ``/dev/fd/1``) is stdout: the output goes there alone; the
  command's own report goes to stderr (``report_to_stderr``), and ``--json``, which also
  writes stdout, cannot go with it;
- an existing regular file is never overwritten without ``--force``; a device or a pipe
  (``/dev/null``, ``>(gzip > x.gz)``) is not a file of the user's and is written to;
- an output the user did not name (validate's measurements) takes a name that is free
  (``measured.json``, else ``measured-2.json``, ...), and the command says which.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from .errors import UsageError
from .explain import recompute_choice, tie_dict
from .render.console import out, write_stdout

STDOUT_NAMES = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


def is_stdout(path: Path | str | None) -> bool:
    """Whether ``path`` names stdout ('-', /dev/stdout, /dev/fd/1)."""
    return path is not None and str(path) in STDOUT_NAMES


def check_destination(path: Path, force: bool, flag: str = "--export",
                      example: str = "plan.yaml") -> None:
    """UsageError unless ``path`` can be written: stdout, or a name (not '' or '.', not a
    directory) in an existing directory that is not an existing regular file unless ``force``.
    ``flag`` and ``example`` only word the message."""
    if is_stdout(path):
        return
    if str(path) in ("", "."):
        raise UsageError(f"{flag} needs a file name (or - for stdout), got {str(path)!r}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give a file name such as {path / example}")
    if path.is_file() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    if not path.exists() and not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {path.parent} does not exist")


def refuse_json_too(path: Path | None, flag: str, json_out: bool) -> None:
    """UsageError when both ``flag`` (stdout) and --json would write stdout."""
    if json_out and is_stdout(path):
        raise UsageError(f"{flag} {path} and --json both write to stdout: give {flag} a file name, "
                         "or leave out --json")


def free_path(path: Path) -> Path:
    """``path`` if nothing is there, else the first free ``stem-N.suffix`` (N = 2, 3, ...)."""
    n = 2
    found = path
    while found.exists() or found.is_symlink():
        found = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return found


def write(path: Path, data: str | bytes, force: bool, flag: str = "--export",
          example: str = "plan.yaml") -> None:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` or stdout (check_destination first).
    UsageError when it cannot be written."""
    if is_stdout(path):
        write_stdout(data)
        return
    check_destination(path, force, flag, example)
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def shown(path: Path, what: str | None = None) -> str:
    """How a destination is named after 'Wrote': the path, or 'stdout' ('<what> to stdout'
    when ``what`` is given) for stdout."""
    if not is_stdout(path):
        return str(path)
    return f"{what} to stdout" if what else "stdout"


@contextlib.contextmanager
def report_to_stderr(active: bool):
    """Inside the block, what the command prints for people (planner.render.console.out) goes
    to stderr, when ``active`` (its output file is stdout)."""
    if not active:
        yield
        return
    before = getattr(out, "_file", None)  # None: rich follows sys.stdout as it is at each print
    out.file = sys.stderr
    try:
        yield
    finally:
        out.file = before


# ----------------------------------------------------------------------------- JSON of the commands


def search_json(model, result, explanation, top: int, currency: str) -> list[dict]:
    """``search --json``: one entry per group of tied layouts (explain.explain_search), best
    first, at most ``top``: ``layout``, ``gpus``, the estimate's keys (Estimate.to_dict with the
    usable memory), ``currency`` where costs are priced, ``recompute`` (explain.recompute_choice),
    ``ties`` (explain.tie_dict), ``checkpoint`` (None without a storage block) and ``to_fit``
    (None: every listed layout fits), as ``estimate --json`` has them."""
    best, ck = result.ranked, result.checkpoint
    extra = {"currency": currency} if "cost" in best.throughput else {}
    out = []
    for g in explanation.groups[:top]:
        entry = best.to_dict(g.first, result.usable)
        lay = entry.pop("layout")
        out.append({"layout": lay, "gpus": best.candidates.layout(g.first).gpus, **entry, "to_fit": None,
                    **extra, "recompute": recompute_choice(model, best, g.first),
                    "ties": tie_dict(best, g), "checkpoint": ck.to_dict(g.first) if ck else None})
    return out


def estimate_json(report) -> dict:
    """``estimate --json`` of an explain.EstimateReport: the estimate's keys, ``recompute``,
    ``to_fit`` (refusal.FitHint.to_dict or None), ``checkpoint`` (None when it does not fit or
    without a storage block) and ``pipeline``: each rank's memory and time, the binding and
    the slowest rank, the imbalance (cost.stages)."""
    stages, hint, ck = report.stages, report.to_fit, report.checkpoint
    return {**report.estimate.to_dict(0), "recompute": report.recompute,
            "to_fit": hint.to_dict() if hint else None, "checkpoint": ck.to_dict(0) if ck else None,
            "pipeline": {"ranks": stages.to_list(), "binding": stages.binding,
                         "slowest": stages.slowest, "imbalance": stages.imbalance}}
