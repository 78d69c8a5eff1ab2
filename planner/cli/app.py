"""The typer app, its error handling and the options shared by the commands."""

from __future__ import annotations

import functools
import os

import typer

from .. import __version__
from ..render import console
from ..errors import PlannerError, UsageError

# rich_markup_mode None: click's own help layout, which wraps the help text beside whole option
# names at any width (typer's rich panels cut option names at 80 columns: "--global-batch-s…")
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Plan the parallel layout of large-transformer training, dense or "
                       "mixture-of-experts: TP/SP, CP, PP, EP, DP and ZeRO, recomputation, "
                       "precision; then export it and validate it.")


def _version(value: bool) -> None:
    if value:
        console.out.print(f"plan3d {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Plan 3D-parallel (TP/PP/DP/ZeRO) training of large transformers."""


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
MIN_FREE = typer.Option(None, "--min-free", help="Share of HBM a layout should leave free to be "
                        "picked inside a tie group, '10%' or 0.1 [default: the memory band's, "
                        "benchmarks/error_bands.yaml].")
STRICT_RANK = typer.Option(False, "--strict-rank", help="Rank by the objective alone: no tie "
                           "groups, no preferences (exact ties: no offload, lower ZeRO stage, less memory).")
EXPORT = typer.Option(None, "--export", help="Write the best layout as a plan YAML "
                      "(- for stdout; the table then goes to stderr).")
FORCE = typer.Option(False, "--force", help="Overwrite an existing --export (or --timeline) file.")
CURRENCY = typer.Option(None, "--currency", help="Currency of --price-per-gpu-hour, a three-letter "
                        "code such as EUR, printed as given (nothing is converted) [default: USD].")
MAX_GPUS = typer.Option(None, "--max-gpus",
                        help="A budget of at most N GPUs; the search picks the count (whole nodes, or a divisor of one).")
WHY_NOT = typer.Option(None, "--why-not",
                       help="Explain a (partial) layout, e.g. 'tp=4,pp=16', against the winner.")
DEADLINE = typer.Option(None, "--deadline", help="Train within this time, failures and "
                        "checkpoints counted: '30d', '720h' (needs a token budget).")


def _checkpoint(failure_rate, restart_time, async_save) -> dict:
    """The TrainingSpec ``checkpoint`` block from the flags (defaults where not given);
    UsageError for a rate that is not in (0, 1) per GPU-hour or a restart time without a unit."""
    import math
    out: dict = {}
    if failure_rate is not None:
        if not (math.isfinite(failure_rate) and 0 < failure_rate < 1):
            raise UsageError(f"--failure-rate is interruptions per GPU-hour, above 0 and below 1 "
                             f"(Llama 3: 1.97e-5; for next to no failures give e.g. 1e-12), got "
                             f"{failure_rate:g}")
        out["failures_per_gpu_hour"] = failure_rate
    if restart_time is not None:
        from ..units import parse_quantity
        out["restart_time"] = parse_quantity(str(restart_time), "time", "--restart-time")
    if async_save is not None:
        out["async_save"] = async_save
    return out


def _moe_job(model, capacity_factor: float | None) -> dict:
    """The TrainingSpec MoE fields from --moe-capacity-factor (only if given); UsageError for a
    factor that is not a positive number, or one given for a model without experts."""
    if capacity_factor is None:
        return {}
    if model.moe is None:
        raise UsageError(f"--moe-capacity-factor applies to mixture-of-experts models; "
                         f"{model.name} has no experts")
    import math
    if not (math.isfinite(capacity_factor) and 0 < capacity_factor <= 64):
        raise UsageError(f"--moe-capacity-factor is the rows an expert takes over its balanced "
                         f"share, above 0 (1.0: exactly the share), got {capacity_factor:g}")
    return {"moe_capacity_factor": capacity_factor}


def _training(model, global_batch_size, seq_length, job: dict | None = None):
    """(framework profile, TrainingSpec): the job from the flags and the model's defaults
    (planner.inputs.training_spec, the one check) run by the ``--framework`` profile with the
    single-fact overrides (frameworks.profile.resolve_training), with the checkpoint block's
    values (_checkpoint) set on it, and the MoE settings (_moe_job); ``job``: the JOB options of
    cli.options by name (None or absent = not given). UsageError on bad input."""
    job = job or {}
    checkpoint = _checkpoint(job.get("failure_rate"), job.get("restart_time"), job.get("async_save"))
    moe = _moe_job(model, job.get("moe_capacity_factor"))
    framework, flash, precision = job.get("framework"), job.get("flash_attention"), job.get("precision")
    grad_dtype, allocator = job.get("grad_dtype"), job.get("allocator_reserve")
    from ..catalog import resolve_framework
    from ..frameworks.profile import Overrides, resolve_training
    from ..inputs import training_spec
    if grad_dtype is not None and grad_dtype.strip().lower() not in ("fp32", "bf16"):
        raise UsageError(f"--grad-dtype must be fp32 or bf16, got {grad_dtype!r}")
    profile = resolve_framework(framework)
    job = training_spec(model, {"global_batch_size": global_batch_size, "seq_length": seq_length,
                                "precision": precision,
                                **(moe or {})})
    training = resolve_training(job, profile, Overrides(
        flash_attention=flash, grad_dtype=grad_dtype.strip().lower() if grad_dtype else None,
        allocator_reserve=allocator))
    if checkpoint:
        training = training.model_copy(update={"checkpoint": training.checkpoint.model_copy(
            update=checkpoint)})
    if moe:  # token dropping: refused up front where the framework has none
        from ..search.framework_rules import check_model
        check_model(profile, model, training)
    return profile, training


def _require(value, flag: str):
    if value is None:
        raise UsageError(f"missing option {flag}")
    return value


def _keep_freed_memory() -> None:
    """With glibc, keep freed memory in the process rather than returning it to the system after
    each numpy array: the search allocates and frees arrays of a sub-grid's size (0.5 MB and up)
    thousands of times, and glibc maps each anew above its mmap threshold, its pages faulted in
    and zeroed again. Thresholds of 256 MB (mmap) and 1 GB (trim), 64 MB of top pad
    (mallopt(3)); DeepSeek-V3 on 1,024 GPUs: 252,000 page faults, 1.3 s of system time -> 45,000
    and 0.25 s; its first search about 13 % faster in three runs each. Nothing on another C
    library."""
    try:
        import ctypes
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    # M_MMAP_THRESHOLD first: glibc before 2.26 or so refuses one above 32 MB (HEAP_MAX_SIZE / 2),
    # and the trim and top-pad settings alone would pin its threshold at 128 KB, the opposite
    if mallopt(-3, 256 << 20) != 1 and mallopt(-3, 32 << 20) != 1:
        return
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    mallopt(-2, 64 << 20)  # M_TOP_PAD


def main() -> None:
    """Console entry point: usage errors (bad flag, bad value) become one line on stderr, exit 2.

    Typer parses with (its vendored copy of) click in non-standalone mode so that its errors
    reach us; they carry ``format_message()`` and ``exit_code`` in every typer/click version.
    """
    import sys
    _keep_freed_memory()
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
        # bare `plan3d`: the help (older click raises an empty error, click >= 8.2 a
        # NoArgsIsHelpError whose message is the help itself), not an "error:" line
        if ctx is not None and (not exc.format_message().strip()
                                or type(exc).__name__ == "NoArgsIsHelpError"):
            console.out.print(ctx.get_help(), markup=False)
            sys.exit(0)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        console.error(f"{exc.format_message()}{hint}")
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
