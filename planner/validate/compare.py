"""Measured against predicted: the checks of a validator run (no torch here; printed by
planner.render.validate).

Checks (each {"name", "measured", "predicted", "passed"}):
- ``loss step i``: the mean over DP ranks of the last stage's mean micro-batch loss against the
  single-process reference; relative tolerance by dtype (fp64 1e-12, fp32 1e-5, bf16 2e-2).
- ``comm pp<r> <group>:<kind>``: [calls, payload bytes] of the last (warm) step on every rank of
  pipeline rank r, which must equal planner.cost.volumes exactly; for an MoE run the expert
  groups (ep, etp, tp_ep, edp) too, each rank's token dispatch predicted from the per-expert
  counts its group recorded (cost.moe_dispatch; moe_plan.routed_volumes), shown summed over the
  ranks where they differ.
- ``<params|grads|optimizer>_bytes pp<r>``: bytes held per rank, within 2% of planner.cost.memory.
- ``checkpoint_bytes pp<r> tp<t>``: tensor bytes each rank wrote to a torch.distributed.checkpoint
  of its model and optimizer state (validate.checkpoint), equal to planner.cost.checkpoint's
  parameter groups at the run's element size exactly (miniature.checkpoint_bytes).
- ``activations pp<r>``: the peak of the bytes saved for backward on every rank of pipeline
  rank r against the plan's activation formula + named torch deltas (activations.py), within
  ACT_RTOL; the deltas and their sizes go to ``notes``. Reported instead of checked off the CPU.
- ``schedule order pp<r>`` / ``schedule peak pp<r>``: the op order every rank of pipeline rank r
  ran and its chunks in flight at the peak against the simulator's order of the plan's schedule
  (validate.schedule_check), equal exactly.
Reported beside them (not checked): the live-tensor peak minus the model states (saved
activations + transient buffers) and the median warm step time. ``notes`` (how the run maps
the plan, e.g. the distributed optimizer as ZeRO-1; the activation deltas) and
``not_exercised`` ({"feature", "reason"}: what of the plan the run does not exercise) are
copied from the Run and printed.
"""

from __future__ import annotations

import statistics

from .activations import activation_check, delta_notes
from .miniature import LOSS_RTOL, Run, predict
from .moe_plan import routed_volumes
from .schedule_check import schedule_checks

MEMORY_RTOL = 0.02


def _check(name: str, measured, predicted, passed: bool) -> dict:
    return {"name": name, "measured": measured, "predicted": predicted, "passed": bool(passed)}


def _comm_checks(pp_rank: int, base: dict, ranks: list[dict], routed: dict) -> list[dict]:
    """One check per collective key of pipeline rank ``pp_rank``: every rank's [calls, bytes]
    of the last step equals its prediction (the same for every rank, plus, for expert
    collectives, the volumes of the routing the rank's group recorded). Where the prediction
    differs between ranks (routed traffic) the check shows the sums over the ranks."""
    def want(r, key):
        a, b = base.get(key, [0, 0]), routed.get(r.get("rank"), {}).get(key, [0, 0])
        return [a[0] + b[0], a[1] + b[1]]
    keys = sorted(set(base) | {k for r in ranks for k in routed.get(r.get("rank"), {})}
                  | {k for r in ranks for k in r["comm"][-1]})
    out = []
    for key in keys:
        wants = [want(r, key) for r in ranks]
        seen = [r["comm"][-1].get(key, [0, 0]) for r in ranks]
        ok = all(s == w for s, w in zip(seen, wants))
        if all(w == wants[0] for w in wants):
            odd = next((s for s in seen if s != wants[0]), seen[0])
            out.append(_check(f"comm pp{pp_rank} {key}", odd, wants[0], ok))
        else:
            total = [sum(s[i] for s in seen) for i in (0, 1)]
            out.append(_check(f"comm pp{pp_rank} {key} (sum of {len(ranks)} ranks)", total,
                              [sum(w[i] for w in wants) for i in (0, 1)], ok))
    return out


def _checkpoint_checks(pp_rank: int, predicted: dict[int, int], ranks: list[dict]) -> list[dict]:
    """``checkpoint_bytes pp<r> tp<t>``: the tensor bytes every rank of (pipeline rank r, tensor
    rank t) wrote to the DCP checkpoint equal the prediction exactly (TP rank 0 also writes the
    TP replicas); one check per tp rank with the first rank that differs, if any."""
    out = []
    for t, want in sorted(predicted.items()):
        seen = [r["checkpoint_bytes"] for r in ranks
                if r["coord"]["tp"] == t and "checkpoint_bytes" in r]
        if seen:
            odd = next((s for s in seen if s != want), seen[0])
            out.append(_check(f"checkpoint_bytes pp{pp_rank} tp{t}", odd, want,
                              all(s == want for s in seen)))
    return out


def compare(run: Run, records: list[dict], reference: list[float] | None) -> dict:
    """The result object of ``plan3d validate --json``: run, checks, reported, passed.

    ``reference`` None (no single-process reference) reports the losses instead of checking them.
    """
    lay = run.layout
    checks: list[dict] = []
    reported: list[dict] = []
    activations: list[dict] = []
    # the ranks that hold the loss: the last pipeline rank, rank 0 in the V shapes
    last = [r for r in records if r["losses"] and r["coord"]["tp"] == 0]
    for i in range(run.steps):
        got = sum(r["losses"][i] for r in last) / len(last)
        if reference is None:
            reported.append({"name": f"loss step {i}", "measured": got, "predicted": None,
                             "note": "no single-process reference"})
            continue
        rel = abs(got - reference[i]) / max(abs(reference[i]), 1e-300)
        checks.append({**_check(f"loss step {i}", got, reference[i], rel <= LOSS_RTOL[run.dtype]),
                       "rel_diff": rel, "rtol": LOSS_RTOL[run.dtype]})
    routed = {}
    if run.model.moe is not None:
        routed = routed_volumes(run, records)
    checks += schedule_checks(run, records)  # the op order that ran and its in-flight peak
    for pp_rank in range(lay.pp):
        pred = predict(run, pp_rank)
        ranks = [r for r in records if r["coord"]["pp"] == pp_rank]
        checks += _comm_checks(pp_rank, pred["comm"], ranks, routed)
        for term, want in pred["memory"].items():
            seen = [r[term] for r in ranks]
            worst = max(seen, key=lambda v: abs(v - want))
            ok = abs(worst - want) <= MEMORY_RTOL * max(want, 1.0)
            checks.append(_check(f"{term} pp{pp_rank}", worst, want, ok))
        checks += _checkpoint_checks(pp_rank, pred.get("checkpoint", {}), ranks)
        act = activation_check(run, pp_rank, ranks)
        activations.append(act)
        (checks if act["passed"] is not None else reported).append(act)
        peak = max(r["live_peak"][-1] - r["params_bytes"] - r["grads_bytes"] - r["optimizer_bytes"]
                   for r in ranks)
        reported.append({"name": f"live peak pp{pp_rank}", "measured": peak, "predicted": None,
                         "note": "live tensor peak minus params, grads and optimizer states: "
                                 "saved activations + transient buffers (not checked)"})
        times = [t for r in ranks for t in r["step_s"][1:]] or [t for r in ranks for t in r["step_s"]]
        reported.append({"name": f"step time pp{pp_rank}", "measured": statistics.median(times),
                         "predicted": None, "note": "seconds, median after step 0; "
                                                    "CPU times say nothing about GPU time"})
    return {"run": {"model": run.model.model_dump(mode="json", exclude_none=True),
                    "training": run.training.model_dump(mode="json"),
                    "layout": lay.model_dump(), "dtype": run.dtype, "steps": run.steps,
                    "device": run.device, "world": run.world},
            "notes": list(run.notes) + delta_notes(activations)
            + list(dict.fromkeys(f"activations: {a['note']}" for a in activations if a.get("note"))),
            "not_exercised": [dict(d) for d in run.not_exercised],
            "checks": _same_keys(checks, reported), "reported": _same_keys(reported, checks),
            "passed": all(c["passed"] for c in checks)}


def _same_keys(rows: list[dict], others: list[dict]) -> list[dict]:
    """``rows`` with every key any check or reported row has (in first-seen order), None where a
    row has no value, so every row of ``--json`` has the same keys."""
    keys = list(dict.fromkeys(k for r in rows + others for k in r))
    return [{k: r.get(k) for k in keys} for r in rows]

