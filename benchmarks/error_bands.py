"""Write benchmarks/error_bands.yaml: plan3d's error bands from its own measured errors.

Runs what ``plan3d accuracy --dataset all --resolve search`` runs (every shipped measured run,
the settings a run leaves unknown resolved by the search, leave-one-source-out errors:
planner.fidelity.loso) and records, for planner.search.bands:

- per run: its source, regime (dense/MoE, BF16/FP8, GPU generation, framework) and the deviation
  d = T_measured / T_predicted - 1 of its LOSO step time; where it measured peak memory, the
  same for memory (allocated, without the reserve);
- the pairs of runs of one job (one source; same model, hardware, GPU count, sequence, batch and
  precision) with different layouts, and the error of their predicted step-time ratio,
  ln((1 + e_a) / (1 + e_b)): what the tie band is drawn from;
- per cost term of planner.search.bands.TERMS, the runs that exercised it and the least coverage
  key (CP: tokens per CP rank);
- the level: the least of bands.LEVELS whose leave-one-source-out coverage reaches
  bands.TARGET_COVERAGE over all runs (each run's band drawn from the other sources' runs, and
  widened by the terms no other source's run checked), and the coverage per regime at it.

Run it after a change to the cost model or the datasets; ``--check`` recomputes and exits 1 when
the shipped file differs (tests/test_bands.py runs it), ``--report`` prints the coverage only.

    python benchmarks/error_bands.py [--check | --report] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from planner import __version__
from planner.cost.step import estimate_layout
from planner.fidelity.compare import compare_all
from planner.fidelity.loso import loso_errors
from planner.fidelity.resolve import resolve
from planner.fidelity.runs import DATASETS, load_datasets
from planner.layout import Candidates
from planner.search import bands as B

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / B.FILE
MIN_RUNS = 9  # the least n whose conformal quantile at level 0.90 is one of its values
MIN_SOURCES = 2  # a band never rests on one source alone (it could not be tested without it)
DIGITS = 5  # deviations as written (rounded), and compared by --check
COMMAND = "python benchmarks/error_bands.py"


def measured() -> dict:
    """Every comparable shipped run with its LOSO step deviation, memory deviation, regime, the
    terms it uses, its estimate and its job key."""
    cases = load_datasets(list(DATASETS))
    for case in cases:
        if case.skipped is None:
            resolve(case)
    comparisons = compare_all(cases)
    held = loso_errors(cases)
    runs = []
    for comp in comparisons:
        case = comp.case
        if comp.primary is None or case.id not in held:
            continue
        c = Candidates.from_layouts([case.layout])
        est = estimate_layout(case.model, case.hardware, case.training, case.layout)
        m = case.model
        job = (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size,
               m.moe.num_experts if m.moe else 0, case.hardware.name, case.layout.gpus,
               case.training.seq_length, case.training.global_batch_size, case.training.precision)
        keys = {t.name: float(np.asarray(t.key(case.training, c))[0]) for t in B.TERMS if t.key}
        uses = {k: bool(np.asarray(v)[0]) for k, v in
                B.term_uses(case.model, case.hardware, case.training, c).items()}
        mem = comp.error.get("peak_memory")
        runs.append({"id": case.id, "source": case.group,
                     **B.regime(case.model, case.hardware, case.training),
                     "d": round(-math.log1p(held[case.id]), DIGITS),
                     "e": held[case.id],
                     "memory": None if mem is None else round(-math.log1p(mem), DIGITS),
                     "uses": uses, "keys": keys, "est": est, "case": case, "job": job,
                     "layout": case.layout.model_dump()})
    return {"runs": runs}


def pairs_of(runs: list[dict]) -> list[dict]:
    """Pairs of runs of one source and one job with different layouts: (a, b, ln ratio error)."""
    by_job = defaultdict(list)
    for r in runs:
        by_job[(r["source"], r["job"])].append(r)
    out = []
    for group in by_job.values():
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                if a["layout"] != b["layout"]:
                    out.append({"a": a["id"], "b": b["id"],
                                "d": round(math.log((1 + a["e"]) / (1 + b["e"])), DIGITS)})
    return out


def checked_of(runs: list[dict]) -> dict:
    """{term: {runs: [ids using it], key: least coverage key or None, seq: least sequence
    length or None}}."""
    out = {}
    for t in B.TERMS:
        using = [r for r in runs if r["uses"][t.name]]
        key = min((r["keys"][t.name] for r in using), default=None) if t.key else None
        seq = min((r["job"][7] for r in using), default=None)
        out[t.name] = {"runs": [r["id"] for r in using], "key": key, "seq": seq}
    return out


def bands_of(runs: list[dict], level: float, memory_level: float) -> B.Bands:
    """A Bands of these runs at ``level`` and ``memory_level`` (what the file holds, and what a
    held-out run's band is drawn from)."""
    step = [{k: r[k] for k in ("id", "source", *B.REGIME_DIMS, "d")} for r in runs]
    memory = [{**s, "d": r["memory"]} for s, r in zip(step, runs) if r["memory"] is not None]
    return B.Bands(level, memory_level, MIN_RUNS, MIN_SOURCES, step, memory, pairs_of(runs),
                   checked_of(runs))


def coverage(runs: list[dict], level: float) -> dict:
    """LOSO coverage at ``level``: per run whether its deviation falls in the band drawn without
    its source (widened by the terms no other source's run checked); summed per regime (kind,
    precision, generation) and over all; memory the same (at the same level)."""
    step, memory = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for r in runs:
        rest = bands_of([x for x in runs if x["source"] != r["source"]], level, level)
        case, est = r["case"], r["est"]
        c = est.candidates
        masks = B.unchecked(case.model, case.hardware, case.training, c, rest)
        below, above = B.widening(est, masks, case.model, case.hardware, case.training)
        query = {k: r[k] for k in B.REGIME_DIMS}
        low, high = rest.step(query).bounds(1.0, float(below[0]), float(above[0]))
        ok = bool(low <= math.exp(r["d"]) <= high)
        name = " ".join(r[k] for k in B.REGIME_DIMS[:3])
        for key in (name, "all"):
            step[key][0] += ok
            step[key][1] += 1
        if r["memory"] is not None:
            mband = rest.memory(query)
            ok = bool(mband.lo <= r["memory"] <= mband.hi)
            for key in (name, "all"):
                memory[key][0] += ok
                memory[key][1] += 1
    return {"step": dict(step), "memory": dict(memory)}


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compute() -> dict:
    """The file's contents (a mapping), provenance included."""
    runs = measured()["runs"]
    covs = {level: coverage(runs, level) for level in B.LEVELS}

    def least(part: str) -> float:  # the least level reaching the target over all runs
        return next((lv for lv in B.LEVELS if covs[lv][part]["all"][0] >= B.TARGET_COVERAGE *
                     covs[lv][part]["all"][1]), B.LEVELS[-1])
    chosen, memory_level = least("step"), least("memory")
    bands = bands_of(runs, chosen, memory_level)
    cells = {}
    for r in runs:
        query = {k: r[k] for k in B.REGIME_DIMS}
        name = " ".join(query.values())
        if name in cells:
            continue
        band = bands.step(query)
        cells[name] = {"below": round(band.below, DIGITS), "above": round(band.above, DIGITS),
                       "from": B.regime_text(band.basis), "runs": band.runs, "sources": band.sources}
    mem = bands.memory({})
    return {
        "generated": {"by": COMMAND, "date": dt.date.today().isoformat(), "commit": _commit(),
                      "plan3d": __version__, "datasets": list(DATASETS), "resolve": "search",
                      "errors": "leave-one-source-out (planner.fidelity.loso)"},
        "level": chosen, "memory_level": memory_level, "min_runs": MIN_RUNS,
        "min_sources": MIN_SOURCES,
        "coverage": {"step": dict(sorted(covs[chosen]["step"].items())),
                     "memory": dict(sorted(covs[memory_level]["memory"].items()))},
        "step": {"cells": cells,
                 "runs": [[r["id"], r["source"], *(r[k] for k in B.REGIME_DIMS), r["d"]] for r in runs]},
        "memory": {"band": {"below": round(mem.below, DIGITS), "above": round(mem.above, DIGITS),
                            "runs": mem.runs, "sources": mem.sources,
                            "min_free": round(bands.min_free(), DIGITS)},
                   "runs": [[r["id"], r["source"], *(r[k] for k in B.REGIME_DIMS), r["memory"]]
                            for r in runs if r["memory"] is not None]},
        "pairs": {"band": round(bands.tie(), DIGITS),
                  "runs": [[p["a"], p["b"], p["d"]] for p in bands.pairs]},
        "checked": bands.checked,
    }


HEADER = """\
# plan3d's error bands, from its own measured errors: GENERATED by python benchmarks/error_bands.py
# (do not edit; rerun it after a change to the cost model or the datasets). planner/search/bands.py
# reads it: step rows are [run, source, kind, precision, generation, framework, d] with
# d = ln(T_measured / T_predicted) of the run's leave-one-source-out prediction; memory rows the
# same for peak memory; pairs [run a, run b, ln of the error of the predicted step ratio a/b];
# checked: the runs that exercised each cost term (key: the least tokens per CP rank measured;
# seq: the least sequence length).
"""


def dump(data: dict) -> str:
    """The file's text: the header, then the mapping (rows one per line)."""
    class Flow(list):
        pass

    def flow(dumper, value):
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=True)
    yaml.add_representer(Flow, flow, Dumper=yaml.SafeDumper)
    data = dict(data)
    for section in ("step", "memory", "pairs"):
        data[section] = {**data[section], "runs": [Flow(row) for row in data[section]["runs"]]}
    data["checked"] = {k: {**v, "runs": Flow(v["runs"])} for k, v in data["checked"].items()}
    data["coverage"] = {k: {name: Flow(v) for name, v in part.items()} for k, part in data["coverage"].items()}
    return HEADER + yaml.safe_dump(data, sort_keys=False, width=100, default_flow_style=False)


def comparable(data: dict) -> dict:
    """The parts of the file a fresh run must reproduce (the provenance's date and commit may
    differ)."""
    return {k: v for k, v in data.items() if k != "generated"}


def report(data: dict) -> str:
    lines = [f"level {data['level']:.2f}, memory {data['memory_level']:.2f} (least of "
             f"{', '.join(f'{x:.2f}' for x in B.LEVELS)} with leave-one-source-out coverage >= "
             f"{B.TARGET_COVERAGE:.0%})",
             "step-time coverage (leave-one-source-out) per regime:"]
    for name, (ok, n) in data["coverage"]["step"].items():
        lines.append(f"  {name:34s} {ok:3d}/{n:<3d} {ok / n:6.1%}")
    lines.append("memory coverage:")
    for name, (ok, n) in data["coverage"]["memory"].items():
        lines.append(f"  {name:34s} {ok:3d}/{n:<3d} {ok / n:6.1%}")
    lines.append("step bands per regime (measured vs predicted):")
    for name, cell in data["step"]["cells"].items():
        lines.append(f"  {name:40s} -{100 * cell['below']:4.1f}% .. +{100 * cell['above']:5.1f}%  "
                     f"from {cell['from']} ({cell['runs']} runs, {cell['sources']} sources)")
    m = data["memory"]["band"]
    lines.append(f"memory band -{100 * m['below']:.1f}% .. +{100 * m['above']:.1f}% ({m['runs']} runs, "
                 f"{m['sources']} sources; default --min-free {100 * m['min_free']:.1f}%); "
                 f"tie band {100 * math.expm1(data['pairs']['band']):.1f}% "
                 f"({len(data['pairs']['runs'])} pairs)")
    unchecked = [k for k, v in data["checked"].items() if not v["runs"]]
    lines.append(f"terms no measured run exercised: {', '.join(unchecked) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 when the shipped file differs")
    mode.add_argument("--report", action="store_true", help="print the coverage; write nothing")
    ap.add_argument("--out", type=Path, default=OUT, help="the file to write or check")
    args = ap.parse_args(argv)
    data = compute()
    print(report(data))
    if args.report:
        return 0
    if args.check:
        shipped = yaml.safe_load(args.out.read_text()) if args.out.is_file() else {}
        fresh = yaml.safe_load(dump(data))
        if comparable(shipped) != comparable(fresh):
            print(f"{args.out} differs from what {COMMAND} computes: rerun it", file=sys.stderr)
            return 1
        print(f"{args.out} is what {COMMAND} computes")
        return 0
    args.out.write_text(dump(data))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
