"""Where a command writes what it makes, the same for every command that takes an output path
(search --export, sweep --plot, export -o, validate --out, calibrate -o, regress --baseline with
--update):

- ``-`` (and ``/dev/stdout``, ``/dev/fd/1``) is stdout: the output goes there alone; the
  command's own report goes to stderr (``report_to_stderr``), and ``--json``, which also
  writes stdout, cannot go with it;
- an existing regular file is never overwritten without ``--force``; a device or a pipe
  (``/dev/null``, ``>(gzip > x.gz)``) is not a file of the user's and is written to;
- a command's input file is never its output, even with ``--force`` (``refuse_input``: the
  same path, through symbolic links, or the same file through a hard link);
- a destination that cannot be checked or written (no such directory, a name too long, no
  permission, a full disk) is a UsageError naming the path (exit 2), stdout included;
- an output the user did not name (validate's measurements) takes a name that is free
  (``measured.json``, else ``measured-2.json``, ...), and the command says which.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from .errors import UsageError
from .explain import recompute_choice, tie_dict
from .explain_bands import estimate_band, preferences_of
from .render.console import out, write_stdout

STDOUT_NAMES = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


def is_stdout(path: Path | str | None) -> bool:
    """Whether ``path`` names stdout ('-', /dev/stdout, /dev/fd/1)."""
    return path is not None and str(path) in STDOUT_NAMES


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one existing file: os.path.samefile (device and inode, after
    following symbolic links), so a symbolic or hard link to a file is that file. False when
    either does not exist or cannot be examined."""
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_input(path: Path, inputs, flag: str = "--export") -> None:
    """UsageError when the output ``path`` is one of the command's input files ``inputs``
    (paths; None and stdout entries are skipped), whatever --force says: a command never
    overwrites what it reads. ``flag`` names the output option in the message."""
    if is_stdout(path):
        return
    for given in inputs:
        if given is not None and not is_stdout(given) and same_file(Path(path), Path(given)):
            same = "" if str(given) == str(path) else f" (the same file as {given})"
            raise UsageError(f"{flag} {path} is this command's input{same}; it is never "
                             "overwritten, even with --force: write to another file")


def check_destination(path: Path, force: bool, flag: str = "--export",
                      example: str = "plan.yaml", inputs=()) -> None:
    """UsageError unless ``path`` can be written: stdout, or a name (not '' or '.', not a
    directory) in an existing directory that is neither one of the command's ``inputs``
    (refuse_input, even with ``force``) nor an existing regular file unless ``force``. A path
    the system cannot examine (a name too long, no permission) is a UsageError naming it.
    ``flag`` and ``example`` only word the message."""
    if is_stdout(path):
        return
    if str(path) in ("", "."):
        raise UsageError(f"{flag} needs a file name (or - for stdout), got {str(path)!r}")
    refuse_input(path, inputs, flag)
    try:
        if path.is_dir():
            raise UsageError(f"{path} is a directory; give a file name such as {path / example}")
        if path.is_file() and not force:
            raise UsageError(f"{path} exists; pass --force to overwrite it")
        if not path.exists() and not path.parent.is_dir():
            raise UsageError(f"cannot write {path}: directory {path.parent} does not exist")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


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
    UsageError naming the path (or stdout) when it cannot be written; BrokenPipeError (the
    reader of stdout left) is the caller's."""
    if is_stdout(path):
        try:
            write_stdout(data)
        except BrokenPipeError:  # the reader left: the CLI's exit 141, not an error line
            raise
        except OSError as exc:
            raise UsageError(f"cannot write stdout: {exc.strerror or exc}") from None
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


def search_json(model, result, explanation, top: int, currency: str, hw=None,
                training=None) -> list[dict]:
    """``search --json``: one entry per group of tied layouts (explain.explain_search), best
    first, at most ``top``: ``layout``, ``gpus``, the estimate's keys (Estimate.to_dict with the
    usable memory), ``currency`` where costs are priced, ``recompute`` (explain.recompute_choice),
    ``ties`` (explain.tie_dict), ``checkpoint`` (None without a storage block) and ``to_fit``
    (None: every listed layout fits), as ``estimate --json`` has them; with the job (``hw``,
    ``training``) also ``band`` (explain_bands.estimate_band) and ``tie_group`` (tie_group_dict)."""
    best, ck = result.ranked, result.checkpoint
    extra = {"currency": currency} if "cost" in best.throughput else {}
    out = []
    for g in explanation.groups[:top]:
        entry = best.to_dict(g.first, result.usable)
        lay = entry.pop("layout")
        item = {"layout": lay, "gpus": best.candidates.layout(g.first).gpus, **entry, "to_fit": None,
                **extra, "recompute": recompute_choice(model, best, g.first),
                "ties": tie_dict(best, g), "checkpoint": ck.to_dict(g.first) if ck else None}
        if hw is not None and training is not None:
            item["band"] = estimate_band(model, hw, training, best, g.first)
            item["tie_group"] = tie_group_dict(result, explanation, g.first)
        out.append(item)
    return out


def tie_group_dict(result, explanation, i: int) -> dict:
    """``tie_group`` of a search --json entry for ranked layout i (search.ties): ``member`` (in
    the top tie group), ``picked`` (the pick: the first entry), ``layouts`` and ``rows`` of the
    group, ``tie_band`` (a fraction of the step), ``min_free`` (share of HBM), ``strict``
    (--strict-rank), ``picked_by`` (the preferences that put the pick before the fastest),
    ``fastest`` (the row of the best score, 1-based; null when not kept), and this layout's
    ``preferences``: ``free`` (share of HBM), ``free_bytes``, ``roomy``, ``unchecked`` and
    ``unconventional`` (their words), ``pp``."""
    tie = explanation.tie
    p = preferences_of(result, i)
    return {"member": bool(i < result.tie_group) and not result.strict, "picked": i == 0,
            "layouts": 1 if tie is None else tie.layouts, "rows": 1 if tie is None else tie.rows,
            "tie_band": None if explanation.bands is None else explanation.bands.tie,
            "min_free": result.min_free, "strict": bool(result.strict),
            "picked_by": list(result.deciding),
            "fastest": None if tie is None else (tie.fastest_row or 1),
            "preferences": {"free": p.free, "free_bytes": p.free_bytes, "roomy": p.roomy,
                            "unchecked": list(p.unchecked), "unconventional": list(p.marks),
                            "pp": p.pp}}


def estimate_json(report) -> dict:
    """``estimate --json`` of an explain.EstimateReport: the estimate's keys, ``band``
    (explain_bands.estimate_band), ``recompute``,
    ``to_fit`` (refusal.FitHint.to_dict or None), ``checkpoint`` (None when it does not fit or
    without a storage block) and ``pipeline``: each rank's memory and time, the binding and
    the slowest rank, the imbalance (cost.stages)."""
    stages, hint, ck = report.stages, report.to_fit, report.checkpoint
    band = {} if report.band is None else {"band": report.band}
    return {**report.estimate.to_dict(0), **band, "recompute": report.recompute,
            "to_fit": hint.to_dict() if hint else None, "checkpoint": ck.to_dict(0) if ck else None,
            "pipeline": {"ranks": stages.to_list(), "binding": stages.binding,
                         "slowest": stages.slowest, "imbalance": stages.imbalance}}
