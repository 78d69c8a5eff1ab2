"""The typer app, its error handling and the options shared by the commands."""

from __future__ import annotations

import functools
import os
import sys
from enum import Enum

if not sys.stdout.isatty():  # typer's --help piped or captured: don't cut option names at 80
    # (plan3d's own output is laid out by planner.render.console, 80 columns when piped)
    os.environ.setdefault("TERMINAL_WIDTH", "160")

import typer  # noqa: E402

from .. import __version__  # noqa: E402
from ..render import console  # noqa: E402
from ..errors import PlannerError, UsageError  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Plan 3D-parallel (TP/PP/DP/ZeRO) training of large transformers.")


def _version(value: bool) -> None:
    if value:
        console.out.print(f"plan3d {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan 3D-parallel (TP/PP/DP/ZeRO) training of large transformers."""


class RecomputeChoice(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


def handle_errors(func):
    """Turn planner errors into one line on stderr and their exit code; never a traceback."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except PlannerError as exc:
            console.error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except (typer.Exit, typer.Abort):
            raise
        except BrokenPipeError:  # `plan3d ... | head`: the reader left, nothing to report
            console.stdout_closed()  # exit 141 (128 + SIGPIPE), not 1 ("no layout fits")
        except OSError as exc:
            console.error(f"cannot write the output: {exc.strerror or exc}")
            raise typer.Exit(74) from None  # EX_IOERR
        except KeyboardInterrupt:
            console.error("interrupted")
            raise typer.Exit(130) from None
        except Exception as exc:  # a bug: still one line, the traceback on request
            if os.environ.get("PLAN3D_DEBUG"):
                raise
            console.error(f"internal error: {type(exc).__name__}: {exc} "
                         "(set PLAN3D_DEBUG=1 for the traceback and please report it)")
            raise typer.Exit(3) from None
    return wrapper


# Shared options --------------------------------------------------------------------------------
MODEL = typer.Option(None, "--model", "-m", help="Catalog model name or alias (e.g. 175b), or a YAML file.")
GPUS = typer.Option(None, "--gpus", "-g", help="Number of GPUs (whole nodes beyond one node).")
HARDWARE = typer.Option("dgx-h100", "--hardware", help="Hardware profile name or YAML file.")
GBS = typer.Option(None, "--global-batch-size", help="Sequences per optimizer step (default: the model's).")
SEQ = typer.Option(None, "--seq-length", help="Tokens per sequence (default: the model's).")
JSON = typer.Option(False, "--json", help="Print JSON (SI units: bytes, seconds) instead of tables.")
HEADROOM = typer.Option(None, "--min-memory-headroom",
                        help="Memory to leave free per GPU beyond the framework's reserve: '4GiB' or '10%'.")
# The training framework and single facts of it (planner.frameworks.profile.Overrides)
FRAMEWORK = typer.Option(None, "--framework", help="Framework profile name or YAML file "
                         "(plan3d frameworks) \\[default: megatron-core].")
FLASH = typer.Option(None, "--flash-attention/--no-flash-attention",
                     help="Override the framework's flash attention.")
GRAD_DTYPE = typer.Option(None, "--grad-dtype", help="Gradient dtype: fp32 or bf16 (default: the framework's).")
ALLOCATOR = typer.Option(None, "--allocator-reserve", help="Allocator reserve as a fraction of the "
                         "working set, e.g. 0.1 (default: the framework's).")
MAX_SEQ_LENGTH = 10_000_000
MAX_BATCH = 100_000_000


def _training(model, global_batch_size, seq_length, framework=None, flash=None, grad_dtype=None,
              allocator=None):
    """(framework profile, TrainingSpec): the job from the flags and the model's defaults, run by
    the ``--framework`` profile with the single-fact overrides (frameworks.profile). UsageError on
    bad input."""
    from ..catalog import resolve_framework
    from ..frameworks.profile import Overrides, resolve_training
    if grad_dtype is not None and grad_dtype.strip().lower() not in ("fp32", "bf16"):
        raise UsageError(f"--grad-dtype must be fp32 or bf16, got {grad_dtype!r}")
    profile = resolve_framework(framework)
    job = _job(model, global_batch_size, seq_length)
    return profile, resolve_training(job, profile, Overrides(
        flash_attention=flash, grad_dtype=grad_dtype.strip().lower() if grad_dtype else None,
        allocator_reserve=allocator))


def _job(model, global_batch_size, seq_length):
    from ..catalog import validate
    from ..specs import TrainingSpec
    for name, value, top in (("--global-batch-size", global_batch_size, MAX_BATCH),
                             ("--seq-length", seq_length, MAX_SEQ_LENGTH)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be positive, got {value}")
        if value is not None and value > top:
            raise UsageError(f"{name} {value:,} is beyond what plan3d models (at most {top:,})")
    limit = model.max_position_embeddings
    if seq_length and model.position_embedding == "learned" and limit and seq_length > limit:
        raise UsageError(f"--seq-length {seq_length} exceeds the {limit} learned position "
                         f"embeddings of {model.name}")
    data = {"seq_length": seq_length or model.training.seq_length,
            "global_batch_size": global_batch_size or model.training.global_batch_size,
            "tokens": model.training.tokens}
    return validate(TrainingSpec, data, "training")


def _require(value, flag: str):
    if value is None:
        raise UsageError(f"missing option {flag}")
    return value


def _check_bounds(allow_zero: bool, values: dict) -> None:
    """UsageError unless each given value is a finite number > 0 (>= 0 with ``allow_zero``);
    integers at most search.MAX_GPUS (no size, degree or count plan3d models is larger; a
    larger one would overflow the cost model's int64 arrays)."""
    import math
    from ..search import MAX_GPUS
    for name, value in values.items():
        if value is None:
            continue
        flag = f"--{name.replace('_', '-')}"
        if isinstance(value, float) and not math.isfinite(value):
            raise UsageError(f"{flag} must be a finite number, got {value}")
        if value < 0 or (value == 0 and not allow_zero):
            raise UsageError(f"{flag} must be {'0 or more' if allow_zero else 'positive'}, got {value}")
        if isinstance(value, int) and value > MAX_GPUS:
            raise UsageError(f"{flag} {value:,} is beyond what plan3d models (at most {MAX_GPUS:,})")


def _check_positive(**values) -> None:
    """Sizes, degrees, counts, prices and token budgets: > 0 (see _check_bounds)."""
    _check_bounds(False, values)


def _check_count(**values) -> None:
    """Counts where 0 is allowed (e.g. the even-split default of --first-stage-layers)."""
    _check_bounds(True, values)


def main() -> None:
    """Console entry point: usage errors (bad flag, bad value) become one line on stderr, exit 2.

    Typer parses with (its vendored copy of) click in non-standalone mode so that its errors
    reach us; they carry ``format_message()`` and ``exit_code`` in every typer/click version.
    """
    import sys
    try:
        code = app(standalone_mode=False)
    except (typer.Abort, KeyboardInterrupt):
        console.error("aborted")
        sys.exit(130)
    except BrokenPipeError:  # the reader of stdout left outside a command (help, version)
        console.stdout_closed()
    except Exception as exc:
        if not (hasattr(exc, "format_message") and hasattr(exc, "exit_code")):
            raise
        ctx = getattr(exc, "ctx", None)
        if ctx is not None and not exc.format_message().strip():  # bare `plan3d`: show help
            console.out.print(ctx.get_help())
            sys.exit(0)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        console.error(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
