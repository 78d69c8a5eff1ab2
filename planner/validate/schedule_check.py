"""The pipeline-schedule checks of a validation run: the op order each pipeline rank ran (the
worker records every forward, backward, input-gradient and weight-gradient call of its stages,
worker._record_ops) against the order plan3d's simulator builds for the schedule
(planner.schedule.build_schedule, PyTorch's variant where it has one), and the per-rank peak of
chunks in flight (forward started, input gradient or full backward not yet ended: reference
§0.3 rule 4) of what ran against the simulator's. No torch import: records in, checks out.
"""

from __future__ import annotations

from ..schedule import build_schedule, split_pairs

# The schedules torch.distributed.pipelining runs (worker.SCHEDULE_CLASSES) and the variant of
# plan3d's generator that is PyTorch's order (schedule.orders.VARIANTS)
TORCH_VARIANT = {"1f1b": "pytorch", "interleaved-1f1b": "pytorch"}


def simulated_orders(schedule: str, p: int, m: int, v: int) -> list[list[list]]:
    """Per rank, the simulator's op order as [kind, stage, micro-batch] (a stage index of the
    chain, as torch numbers its stages); an overlapped F&B pair (DualPipeV) as its F then its B,
    the order PyTorch's runtime runs them in without an overlap function (schedule.split_pairs).
    ValueError (one line) for (p, m, v) the generator refuses."""
    sched = split_pairs(build_schedule(schedule, p, m, v, variant=TORCH_VARIANT.get(schedule)))
    return [[[op.kind, sched.stage(r, op.chunk, op.direction), op.mb] for op in ops]
            for r, ops in enumerate(sched.ranks)]


def peak_in_flight(ops: list[list]) -> int:
    """Peak count of chunks whose forward ran and whose input gradient (I) or full backward (B)
    has not: +1 at F, -1 at I or B (W frees the deferred share only). Int."""
    held = peak = 0
    for kind, _, _ in ops:
        held += 1 if kind == "F" else -1 if kind in ("I", "B") else 0
        peak = max(peak, held)
    return peak


def _first_difference(ran: list[list], want: list[list]) -> str:
    """Where two op orders part, in words: 'op 7: ran I s1 mb2, simulated W s1 mb0'."""
    word = lambda op: f"{op[0]} s{op[1]} mb{op[2]}" if op else "nothing"  # noqa: E731
    for i in range(max(len(ran), len(want))):
        a = ran[i] if i < len(ran) else None
        b = want[i] if i < len(want) else None
        if a != b:
            return f"op {i}: ran {word(a)}, simulated {word(b)}"
    return "same"


def schedule_checks(run, records: list[dict]) -> list[dict]:
    """``schedule order pp<r>`` and ``schedule peak pp<r>`` per pipeline rank of a run with
    pp > 1 whose records hold the ops that ran (worker record "ops"): the ops of every rank of
    that pipeline rank (its tp, cp, dp replicas run the same order) against simulated_orders,
    and their in-flight peak against the simulated order's. [] without pipelining."""
    lay = run.layout
    if lay.pp == 1 or not all("ops" in r for r in records):
        return []
    m = run.training.global_batch_size // (lay.dp * lay.micro_batch_size)
    orders = simulated_orders(lay.pipeline_schedule, lay.pp, m, lay.vpp)
    out = []
    for pp_rank, want in enumerate(orders):
        ran = [r["ops"] for r in records if r["coord"]["pp"] == pp_rank]
        odd = next((ops for ops in ran if ops != want), ran[0])
        out.append({"name": f"schedule order pp{pp_rank}", "measured": len(odd),
                    "predicted": len(want), "passed": all(ops == want for ops in ran),
                    "note": f"{lay.pipeline_schedule}: {_first_difference(odd, want)}"})
        peaks = [peak_in_flight(ops) for ops in ran]
        want_peak = peak_in_flight(want)
        worst = max(peaks, key=lambda x: abs(x - want_peak))
        out.append({"name": f"schedule peak pp{pp_rank}", "measured": worst,
                    "predicted": want_peak, "passed": all(x == want_peak for x in peaks),
                    "note": "chunks in flight (F run, I/B not yet)"})
    return out
