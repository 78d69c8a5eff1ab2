"""The checkpoint section of ``plan3d estimate`` and of the search's winner: size per rank and in
all, what a save stalls and how long it writes, the load and restart, the failure rate behind the
interval, the interval and the goodput (planner.cost.checkpoint, formulas.md 12), each with the
inputs it rests on, and a line for every storage number that is a placeholder."""

from __future__ import annotations

from .. import fmt
from . import tables
from .console import out
from ..cost.checkpoint import unavailable

STAGE_NAMES = {0: "pipeline rank 0", 1: "a middle pipeline rank"}


def _stage(stage: int, pp: int) -> str:
    if pp == 1:
        return "the only pipeline rank"
    return "the last pipeline rank" if stage == pp - 1 else STAGE_NAMES.get(stage, f"rank {stage}")


def rows(d: dict, pp: int, gpus: int) -> list[tuple[str, str]]:
    """(label, text) of the section, from a checkpoint object (CheckpointEstimate.to_dict)."""
    host = "*" if "storage.per_host" in d["placeholders"] else ""
    star = "*" if "storage.aggregate" in d["placeholders"] else ""
    size = (f"{fmt.binary_bytes(d['total_bytes'])} in all ({fmt.significant(d['bytes_per_param'])} "
            f"B/param); {fmt.binary_bytes(d['largest_rank_bytes'])} from the GPU that writes the "
            f"most (TP rank 0 of {_stage(d['largest_stage'], pp)})")
    links = (f"a host's link {fmt.bandwidth(d['write_bytes_per_s_per_gpu'])}{host} per GPU, file system "
             f"{fmt.bandwidth(d['aggregate_write_bytes_per_s'])}{star}")
    written = f"{fmt.seconds(d['write_s'])} to write ({links})"
    if d["async"]:
        save = (f"stalls training {fmt.seconds(d['stage_s'])} (async: the copy to host memory at "
                f"{fmt.bandwidth(d['host_link_bytes_per_s'])}); {written} in the background")
    else:
        why = "" if not d["async_save"] else " (the state does not fit in host memory)"
        save = f"stalls training {fmt.seconds(d['blocking_s'])}: the whole write{why} ({links})"
    source = "Llama 3" if d["failure_rate_source"] != "--failure-rate" else "--failure-rate"
    rate = d["failures_per_gpu_s"] * 3600
    return [
        ("size", size),
        ("save", save),
        ("restart", f"{fmt.seconds(d['restart_s'])}: {fmt.seconds(d['restart_time_s'])} to "
                    f"restart + {fmt.seconds(d['load_s'])} to read the checkpoint"),
        ("failures", f"{fmt.number(rate, 4)} per GPU-hour ({source}) x {fmt.count(gpus)} GPUs: "
                     f"one every {fmt.seconds(d['mtbf_s'])} (MTBF)"),
        ("interval", f"save every {fmt.count(d['interval_steps'])} "
                     f"{'step' if d['interval_steps'] == 1 else 'steps'} = "
                     f"{fmt.seconds(d['interval_s'])} (Young/Daly optimum "
                     f"{fmt.seconds(d['optimal_interval_s'])})"),
        ("goodput", f"{fmt.percent(d['goodput'], 2)} of wall-clock time advances training"
                    + _stalled(d)),
    ]


def _stalled(d: dict) -> str:
    """Why goodput is near nothing, when a restart takes longer than the time between failures
    (the job restarts more than it trains): the numbers to check (--failure-rate, --restart-time)."""
    if d["restart_s"] < d["mtbf_s"]:
        return ""
    return (f": a restart ({fmt.seconds(d['restart_s'])}) takes longer than the time between "
            f"failures ({fmt.seconds(d['mtbf_s'])}), so the job mostly restarts; check "
            "--failure-rate (per GPU-hour) and --restart-time")


def checkpoint_report(ck, i: int, hw, layout, title: str) -> None:
    """The section for candidate ``i`` (of ``layout``) of a CheckpointEstimate; one line saying
    why not when ``ck`` is None (the hardware profile lacks a block it needs)."""
    if ck is None:
        out.print(f"{title}: not estimated, the hardware profile has no "
                  f"{unavailable(hw)} block", markup=False)
        return
    d = ck.to_dict(i)
    t = tables.new()
    tables.code_column(t, "")
    tables.text_column(t, "")
    t.show_header = False
    for label, text in rows(d, layout.pp, layout.gpus):
        t.add_row(label, text)
    out.print(f"{title} ({d['format']}, {'async' if d['async_save'] else 'synchronous'} saves; "
              "formulas.md 12)", markup=False)
    out.print(t)
    for name in d["placeholders"]:  # the starred numbers, and the load times that read them
        note = getattr(hw.storage, name.split(".")[-1]).placeholder
        out.print(f"* {name} is a placeholder: {note}", markup=False)
