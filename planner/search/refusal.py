"""Why no layout runs, in words that name what fails, and the GPU count that would work.

- ``no_split_reason``: no (tp, cp, pp, dp) split of the pins uses the GPUs (the product that
  fails, degrees.split_problem, or which free degree cannot make up the rest);
- ``fewest_gpus`` / ``fit_hint``: the smallest whole-node count above a given one on which a
  valid layout fits, found by a memory-only pass over the budget grid in ascending GPU count
  (it stops at the first block with a fit), and the best layout there (a search at that count);
- ``no_fit_message``: the closest miss, how far over it is per GPU, what dominates, and the
  count that fits (search, sweep rows, --why-not, estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import fmt
from ..cost import Estimate
from ..cost.collectives import nvlink_domain
from ..errors import UsageError
from ..inputs import MAX_GPUS
from ..layout.degrees import SPLIT_DEGREES, product_expr, split_problem
from ..layout.split import uneven_splits
from ..specs import HardwareProfile, ModelSpec, TrainingSpec
from . import objective
from .check import CROSS_NODE_HINT
from .grid import Grid, build_grid
from .options import SearchOptions
from .rules import FOLDING_RULE, TP_RULE, folds
from .scan import first_fit



def no_split_reason(model: ModelSpec, hw: HardwareProfile, gpus: int | None,
                    opts: SearchOptions) -> str:
    """Why no tp x cp x pp x dp split of ``opts``' pins uses ``gpus`` GPUs (or, with
    ``opts.max_gpus``, a whole number of nodes within the budget): the product of the pinned
    degrees that fails ('tp*dp = 2*8 = 16 > 8 GPUs'), or which free degree cannot make up the
    rest. One line, no trailing period."""
    pins = {k: getattr(opts, k) for k in SPLIT_DEGREES}
    L = model.num_layers
    folding = _folding_problem(gpus, opts)
    if folding:
        return folding
    if opts.pp is not None and L % opts.pp and not uneven_splits(L, opts.pp):
        return f"pp={opts.pp} splits the {L} layers neither evenly nor unevenly"
    if opts.max_gpus is not None:
        problem = split_problem(opts.max_gpus, pins, exact=False,
                                count=f"--max-gpus {opts.max_gpus:,}")
        if problem and " > " in problem:
            return problem
        fixed = ", ".join(f"{k}={v}" for k, v in pins.items() if v is not None)
        return (f"no tp*cp*pp*dp split{' with ' + fixed if fixed else ''} is a whole number of "
                f"{hw.gpus_per_node}-GPU nodes within --max-gpus {opts.max_gpus:,} (dp a divisor "
                f"of the global batch)")
    problem = split_problem(gpus, pins, exact=None not in pins.values())
    if problem:
        return problem
    given = {k: v for k, v in pins.items() if v is not None}
    rest = gpus // int(np.prod(list(given.values()) or [1]))
    free = [k for k in SPLIT_DEGREES if pins[k] is None]
    top = gpus if opts.allow_cross_node_tp else min(nvlink_domain(hw), gpus)
    rules = {"tp": f"tp a power of two up to {min(top, opts.max_tp or top)}",
             "cp": f"cp a power of two up to {opts.max_cp}",
             "pp": f"pp a divisor of the {L} layers, or a power of two with an uneven split"
                   + (f", up to {opts.max_pp}" if opts.max_pp else "")}
    lead = f"{product_expr(given)} leaves {rest:,} of {gpus:,} GPUs for {'*'.join(free)}" if given else \
        f"{gpus:,} GPUs"
    return (f"{lead}, and no {'*'.join(free)} makes {rest:,} "
            f"({'; '.join(rules[k] for k in free if k in rules)})")


def _folding_problem(gpus: int | None, opts: SearchOptions) -> str | None:
    """Why pinned ep / etp cannot fold over any pipeline stage (space.FOLDING_RULE): a stage
    holds gpus/pp GPUs (pp pinned) or at most all of them (at most --max-gpus with a budget)."""
    etp, ep = opts.etp or 1, opts.ep or 1
    if etp * ep == 1:
        return None
    if opts.max_gpus is not None:
        stage, fits = opts.max_gpus, etp * ep <= opts.max_gpus
        where = f"the --max-gpus budget of {stage:,} GPUs"
    else:
        pp = opts.pp if opts.pp and gpus % opts.pp == 0 else 1
        stage = gpus // pp
        fits = bool(folds(stage, etp, ep))
        where = (f"the {stage:,} GPU{'s' if stage != 1 else ''} of a pipeline stage ({gpus:,} GPUs / "
                 f"pp {pp})" if pp > 1 else f"the {gpus:,} GPUs, so no pipeline stage's share of them")
    if fits:
        return None
    if opts.etp and opts.ep:
        product = product_expr({"etp": etp, "ep": ep})
    else:  # one pinned: no value of the other can help (a multiple never divides what it cannot)
        product = f"etp {etp} (with any ep)" if opts.etp else f"ep {ep} (with any etp)"
    return f"{product} does not divide {where}: the rule '{FOLDING_RULE}'"


@dataclass(frozen=True)
class FitHint:
    """The smallest GPU count above a given one on which a layout fits, and the best layout
    there: ``estimate`` is one layout (index 0)."""

    gpus: int
    estimate: Estimate

    def text(self) -> str:
        """'the fewest GPUs on which a layout fits are 96 (tp=8 pp=4 dp=3 ..., 36.2 GiB)'."""
        est = self.estimate
        return (f"the fewest GPUs on which a layout fits are {self.gpus:,} "
                f"({est.candidates.layout(0).short()}, {fmt.gib(float(est.memory['total'][0]))})")

    def to_dict(self) -> dict:
        """JSON: gpus, layout (dict), layout_short, memory_bytes (peak per GPU)."""
        lay = self.estimate.candidates.layout(0)
        return {"gpus": self.gpus, "layout": lay.model_dump(), "layout_short": lay.short(),
                "memory_bytes": float(self.estimate.memory["total"][0])}


def fewest_gpus(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, above: int,
                opts: SearchOptions, limit: int = MAX_GPUS) -> int | None:
    """The smallest count of GPUs in (above, limit], whole nodes, on which some layout of the
    search space of ``opts`` (its pins, bounds and headroom) passes every rule and fits; None if
    none does. Memory only, no step time: the budget grid's split rows in ascending GPU count,
    through the scan's own rules and memory passes block by block (scan.first_fit), stopping at
    the first block with a fit."""
    grid = build_grid(model, hw, training, None, replace(opts, max_gpus=limit))
    counts = grid.split["gpus"]
    order = np.argsort(counts, kind="stable")
    order = order[counts[order] > above]
    grid = Grid({k: v[order] for k, v in grid.split.items()}, grid.knobs, grid.fixed)
    usable = objective.usable_memory(float(hw.gpu.hbm_capacity), opts.headroom_bytes,
                                     opts.headroom_fraction)
    return first_fit(model, hw, training, grid, opts, usable)


def no_fit_message(model: ModelSpec, hw: HardwareProfile, gpus: int, miss: Estimate,
                   usable: float, hint: FitHint | None) -> str:
    """The closest miss, how far over the usable memory it is per GPU, its largest memory term,
    and the count that fits (``hint``), else what else could help. One line."""
    mem = {k: float(v[0]) for k, v in miss.memory.items()}
    total, cap = mem["total"], mem["capacity"]
    of = f"{fmt.capacity(cap)} GiB" if usable == cap else \
        f"{fmt.gib(usable)} usable (of {fmt.capacity(cap)} GiB, after the headroom)"
    states = mem["weights"] + mem["gradients"] + mem["optimizer"]
    if states >= mem["activations"]:
        what = f"model states ({fmt.gib(states)}) dominate"
    else:
        what = f"activations ({fmt.gib(mem['activations'])}) dominate"
    if hint is not None:
        remedy = f"{hint.text()}; or use GPUs with more memory"
    else:
        ways = ["a shorter sequence"] * (states < mem["activations"]) + \
            ["less headroom"] * (usable < cap) + ["GPUs with more memory"]
        ways = ", ".join(ways[:-1]) + " or " + ways[-1] if len(ways) > 1 else ways[0]
        remedy = f"no count of GPUs up to {MAX_GPUS:,} has a layout that fits: use {ways}"
    return (f"no layout of {model.name} fits on {gpus:,} x {hw.gpu.name}: the closest, "
            f"{miss.candidates.layout(0).short()}, needs {fmt.gib(total)} of {of} per GPU "
            f"({fmt.gib(total - usable)} over); {what}: {remedy}")


def nothing_valid_message(model: ModelSpec, training: TrainingSpec, gpus: int, rule: str,
                          grid: Grid) -> str:
    """The one-line reason no layout is valid: ``rule`` removed the last ones (a batch that no
    dp x micro-batch divides is said as such; a tp beyond the NVLink domain gets its hint)."""
    if rule == "global batch divisible by dp*micro_batch_size":
        dps = sorted(set(grid.split["dp"].tolist()))
        mbs = sorted(set(grid.knobs["micro_batch_size"].tolist()))
        if len(mbs) == 1 and any(training.global_batch_size % d == 0 for d in dps):
            return (f"--micro-batch-size {mbs[0]} does not divide the per-replica batch "
                    f"{training.global_batch_size}/dp for any dp in {{{', '.join(map(str, dps))}}}")
        return (f"global batch size {training.global_batch_size} is not divisible by any "
                f"data-parallel degree available on {gpus} GPUs (dp in {{{', '.join(map(str, dps))}}}); "
                f"choose a batch that is a multiple of one of them")
    hint = f" ({CROSS_NODE_HINT})" if rule == TP_RULE else ""
    return f"no layout of {model.name} on {gpus} GPUs passes the rule '{rule}'{hint}"


def never_done_error(training: TrainingSpec, gpus: int) -> UsageError:
    """The error when no fitting layout ever finishes training: on ``gpus`` GPUs failures come
    faster than a restart completes (goodput 0, an infinite expected time), so no objective
    that counts the time to train can rank them."""
    ck = training.checkpoint
    mtbf = 1.0 / (gpus * ck.failures_per_gpu_s)
    return UsageError(
        f"no layout ever finishes training: on {gpus:,} GPUs at {ck.failures_per_gpu_hour:.3g} "
        f"failures per GPU-hour one comes every {fmt.seconds(mtbf)}, and a restart ({fmt.seconds(ck.restart_time)} "
        "plus reading the checkpoint) does not complete in between; check --failure-rate "
        "(per GPU-hour) and --restart-time")
