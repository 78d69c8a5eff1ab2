"""Step-time error of `plan3d accuracy --json` grouped by hardware, precision, source or model kind.

Usage:  plan3d accuracy --dataset modern --resolve search --json | python benchmarks/accuracy_table.py [--by KEYS] [--runs all|moe|dense]

Reads the JSON on stdin and prints one plain-text table per --by (default: gpu,precision then
source): runs, mean / max |step-time error| in-sample and leave-one-source-out (LOSO: factors
fitted without the run's source), mean / max |peak-memory error| of the runs that measured it,
runs predicted not to fit ("no fit") and of those the false OOMs (runs that ran but that no
layout consistent with them fits, --resolve search). Keys: gpu (H100, B200, GB200, from the run's hardware profile), precision,
source, kind (dense or MoE: whether the run's model has a moe block). --runs keeps only MoE or
dense runs. The accuracy tables of docs/accuracy.md and docs/moe.md are this script's output
(benchmarks/readme_examples.py).
"""

from __future__ import annotations

import argparse
import json
import sys


GPU = {"dgx-h100": "H100", "grand-teton-h100": "H100", "hgx-h800": "H800", "dgx-h200": "H200",
       "dgx-b200": "B200", "gb200-nvl72": "GB200", "dgx-a100-80g": "A100", "dgx-a100-40g": "A100"}

ORDER = {"gpu": ["A100", "H100", "H800", "H200", "B200", "GB200"],
         "precision": ["bf16", "fp8", "fp8-blockwise", "mxfp8"], "kind": ["dense", "MoE"]}


def kind(run: dict, models: dict[str, bool]) -> str:
    """dense or MoE, from the run's model (the id's model via the facts, else the layout's ep)."""
    return "MoE" if models.get(run["id"], (run["layout"] or {}).get("ep", 1) > 1) else "dense"


def moe_by_run() -> dict[str, bool]:
    """Run id -> whether its model has MoE layers, for the shipped datasets (no search)."""
    from planner.fidelity.runs import DATASETS, load_datasets
    return {c.id: c.model is not None and c.model.moe is not None for c in load_datasets(list(DATASETS))}


def stats(values: list[float]) -> str:
    """'mean/max' of |values| in per cent, '-' when empty."""
    vals = [abs(v) for v in values if v is not None]
    return f"{100 * sum(vals) / len(vals):.1f}/{100 * max(vals):.1f}" if vals else "-"


def _figures(runs: list[dict]) -> list[str]:
    """The figures of one group: runs, step-time error in-sample and LOSO, peak-memory error (runs
    that measured it), runs predicted not to fit, of which false OOMs."""
    return [str(len(runs)), stats([r["step_error"] for r in runs]),
            stats([r.get("loso_step_error") for r in runs]),
            stats([(r.get("error") or {}).get("peak_memory") for r in runs]),
            str(sum(not r["fits"] for r in runs)), str(sum(not r["fits"] and bool(r["resolution"]) for r in runs))]


def table(runs: list[dict], keys: list[str], key_of) -> list[str]:
    """One table grouped by ``keys`` (a column each), rows by GPU and precision, else first seen."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault(tuple(key_of(r, k) for k in keys), []).append(r)
    order = sorted(groups, key=lambda g: tuple(ORDER.get(k, []).index(v) if v in ORDER.get(k, []) else 99
                                               for k, v in zip(keys, g)))
    head = keys + ["runs", "step %", "LOSO %", "memory %", "no fit", "false OOM"]  # % cells: mean/max
    rows = [[*g, *_figures(groups[g])] for g in order] + [["all"] + [""] * (len(keys) - 1) + _figures(runs)]
    width = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = lambda row: "  ".join(c.ljust(w) if i < len(keys) else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, width))).rstrip()
    return [fmt(head), fmt(["-" * w for w in width])] + [fmt(r) for r in rows]


def main(argv: list[str] | None = None) -> int:
    """Print the tables; exit 2 on input that is not `plan3d accuracy --json`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--by", action="append", help="comma-separated keys of one table (repeatable): "
                    "gpu, precision, source, kind; default gpu,precision and source")
    ap.add_argument("--runs", choices=["all", "moe", "dense"], default="all")
    args = ap.parse_args(argv)
    try:
        runs = [r for r in json.load(sys.stdin)["runs"] if r.get("step_error") is not None]
    except (ValueError, KeyError, TypeError) as e:
        print(f"error: stdin is not the output of `plan3d accuracy --json` ({e})", file=sys.stderr)
        return 2
    models = moe_by_run()
    key_of = {"gpu": lambda r: GPU.get(r["hardware"], r["hardware"]), "precision": lambda r: r["precision"],
              "source": lambda r: r["group"], "kind": lambda r: kind(r, models)}
    if args.runs != "all":
        runs = [r for r in runs if kind(r, models).lower() == args.runs]
    tables = [t.split(",") for t in (args.by or ["gpu,precision", "source"])]
    bad = [k for t in tables for k in t if k not in key_of]
    if bad:
        print(f"error: --by takes gpu, precision, source, kind; got {', '.join(bad)}", file=sys.stderr)
        return 2
    out = []
    for keys in tables:
        out += ([""] if out else []) + table(runs, keys, lambda r, k: key_of[k](r))
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
