"""The published recipes as a regression test of plan3d's recommendation.

For each tuned published configuration of benchmarks/published_recipes.yaml (Megatron-Bridge's
performance recipes, the Megatron-Core MoE report's, torchtitan's runs, Meta's Llama 3 405B):

(a) **fits**: the published layout, with the software its source states (what it leaves unknown
    resolved by the search, as ``plan3d accuracy --resolve search`` does), fits in plan3d's
    memory model;
(b) **band**: its measured step time is within plan3d's error band of the prediction: for a
    shipped run its leave-one-source-out prediction against the band drawn without its source
    (benchmarks/error_bands.py's coverage test, unchecked terms widening it), for an external
    recipe the prediction against the shipped band;
(c) **group**: it is inside the top tie group of ``plan3d search`` for the same question (model,
    hardware, GPUs, batch, sequence, precision, framework; every layout axis and software switch
    free): its predicted step is no slower than the group's reference (planner.search.ties) by
    more than the tie band (widened by both layouts' unchecked terms), or plan3d names the term
    that separates it from the pick (the step-time term it loses most on).

A recipe passes when (a), (b) and (c) hold; each miss is listed with its term (memory: the
largest term and the in-flight micro-batches behind the activations; time: how far outside the
band; group: the step-time term). The share that passes is reported per source, and beside it
the share inside the top tie group.

    python benchmarks/recipes.py [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from fnmatch import fnmatch
from pathlib import Path

import numpy as np

from planner import catalog
from planner.cli.app import _training
from planner.cost.model_flops import model_flops_per_step
from planner.cost.pipeline import inflight_layers
from planner.cost.step import estimate_layout
from planner.errors import PlannerError
from planner.explain import term_deltas
from planner.files import read_yaml
from planner.layout import Layout
from planner.layout.split import uneven_vpp_options
from planner.render.labels import TIME_LABELS
from planner.search import bands as B
from planner.search import ties
from planner.search.options import SearchOptions
from planner.search.run import search

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import error_bands  # noqa: E402  (benchmarks/error_bands.py: the held-out bands)

RECIPES = ROOT / "benchmarks" / "published_recipes.yaml"


def _group_check(model, hw, training, gpus, recipe_est, framework) -> dict:
    """(c) for one recipe: the search for the same question, whether the recipe is in its top
    tie group, and the separating term when not."""
    bands = B.shipped()
    try:
        result = search(model, hw, training, gpus, SearchOptions(framework=framework))
    except PlannerError as exc:
        return {"group": False, "term": f"the search finds no layout ({exc})"[:160]}
    best = result.ranked
    ref = result.reference
    feats = ties.features(model, hw, training, recipe_est, result.min_free, bands, framework)
    ref_f = result.features
    t_recipe, t_ref = float(recipe_est.time["step"][0]), float(best.time["step"][ref])
    if t_recipe <= t_ref:
        widen = 0.0
    else:
        widen = float(feats.below[0] + ref_f.above[ref])
    gap = math.log(t_recipe / t_ref)
    inside = gap <= result.tie_band + math.log1p(widen) + 1e-12
    pick = best.candidates.layout(0)
    out = {"group": bool(inside), "gap": gap, "limit": result.tie_band + math.log1p(widen),
           "pick": pick.short(), "pick_step": float(best.time["step"][0]),
           "same_degrees": all(getattr(pick, k) == getattr(recipe_est.candidates.layout(0), k)
                               for k in ("tp", "cp", "pp", "dp", "ep"))}
    if not inside:
        deltas = term_deltas(recipe_est, 0, best, 0)
        term, seconds = deltas[0]
        out["term"] = f"{TIME_LABELS[term]} +{seconds:.3g} s of the recipe's step"
    return out


def dataset_recipes(entries: list[dict], runs: list[dict]) -> list[dict]:
    """The shipped runs that are recipes, with their held-out band check (b)."""
    out = []
    for entry in entries:
        for r in runs:
            if not fnmatch(r["id"], entry["runs"]):
                continue
            rest = error_bands.bands_of([x for x in runs if x["source"] != r["source"]],
                                        B.shipped().level, B.shipped().memory_level)
            case, est = r["case"], r["est"]
            masks = B.unchecked(case.model, case.hardware, case.training, est.candidates, rest)
            below, above = B.widening(est, masks, case.model, case.hardware, case.training)
            low, high = rest.step({k: r[k] for k in B.REGIME_DIMS}).bounds(1.0, float(below[0]),
                                                                          float(above[0]))
            ratio = math.exp(r["d"])  # measured / predicted (LOSO)
            out.append({"id": r["id"], "source": entry["source"], "case": case, "est": est,
                        "fits": bool(est.fits[0]), "band": bool(low <= ratio <= high),
                        "ratio": ratio, "low": low, "high": high})
    return out


def external_recipes(entries: list[dict]) -> list[dict]:
    """The external recipes: each evaluated with its stated layout (the ``search`` axes over
    the values plan3d's rules allow: the fastest that fits, else the fastest)."""
    out = []
    bands = B.shipped()
    for e in entries:
        model = catalog.resolve_model(e["model"])
        hw = catalog.resolve_hardware(e["hardware"])
        profile, training = _training(model, e["training"]["global_batch_size"],
                                      e["training"]["seq_length"],
                                      {"framework": e.get("framework"), "precision": e["training"].get("precision"),
                                       "grad_dtype": e["training"].get("grad_dtype")})
        base = dict(e["layout"])
        options = [1]
        if "vpp" in e.get("search", []):
            options = [v for v in uneven_vpp_options(model.num_layers, base["pp"], base.get("first_stage_layers", 0),
                                                     base.get("last_stage_layers", 0)) if v > 1] or [1]
        best = None
        for vpp in options:
            lay = Layout(**{**base, "vpp": vpp})
            est = estimate_layout(model, hw, training, lay)
            key = (not bool(est.fits[0]), float(est.time["step"][0]))
            if best is None or key < best[0]:
                best = (key, est)
        est = best[1]
        flops = float(np.asarray(model_flops_per_step(model, training.seq_length, training.global_batch_size,
                                                      np.asarray([est.candidates.tp[0]])))[0])
        measured_step = flops / (e["measured"]["model_tflops_per_gpu"] * 1e12 * e["gpus"])
        predicted = float(est.time["step"][0])
        low, high = bands.step(B.regime(model, hw, training)).bounds(1.0)
        ratio = measured_step / predicted
        out.append({"id": e["id"], "source": e["source"], "est": est, "model": model, "hw": hw,
                    "training": training, "profile": profile, "gpus": e["gpus"],
                    "fits": bool(est.fits[0]), "band": bool(low <= ratio <= high), "ratio": ratio,
                    "low": low, "high": high,
                    "over_bytes": max(float(est.memory["total"][0] - est.memory["capacity"][0]), 0.0),
                    "memory": {k: float(est.memory[k][0]) for k in ("weights", "gradients", "optimizer",
                                                                    "activations", "other", "reserve", "total")}})
    return out


def run(runs: list[dict] | None = None) -> dict:
    """Every recipe's checks, and the share that passes per source (``runs``: error_bands.measured's,
    when already computed)."""
    spec = read_yaml(RECIPES)
    runs = error_bands.measured()["runs"] if runs is None else runs
    recipes = dataset_recipes(spec["dataset"], runs) + external_recipes(spec.get("external", []))
    for r in recipes:
        if "case" in r:
            case = r["case"]
            model, hw, training, gpus = case.model, case.hardware, case.training, case.gpus
            framework = catalog.resolve_framework(training.framework)
        else:
            model, hw, training, gpus, framework = r["model"], r["hw"], r["training"], r["gpus"], r["profile"]
        r.update(_group_check(model, hw, training, gpus, r["est"], framework))
        r["layout"] = r["est"].candidates.layout(0).short()
        r["named"] = r["group"] or bool(r.get("term"))
        r["pass"] = r["fits"] and r["band"] and r["named"]
        if not r["fits"]:
            r["miss"] = "does not fit: " + _no_fit_term(r)
        elif not r["band"]:
            r["miss"] = (f"measured step {r['ratio']:.2f} x predicted, outside the band "
                         f"{r['low']:.2f}-{r['high']:.2f}")
        elif not r["group"] and "gap" not in r:
            r["miss"] = r["term"]
        elif not r["group"]:
            r["miss"] = f"outside the top tie group ({100 * math.expm1(r['gap']):.1f}% slower than its " \
                        f"reference): {r['term']}"
    per, group = defaultdict(lambda: [0, 0]), defaultdict(lambda: [0, 0])
    for r in recipes:
        for key in (r["source"], "all"):
            per[key][0] += r["pass"]
            per[key][1] += 1
            group[key][0] += r["group"]
            group[key][1] += 1
    return {"recipes": recipes, "share": dict(per), "in_group": dict(group)}


def _no_fit_term(r: dict) -> str:
    """The memory term of a recipe that does not fit: how far over, its largest term, and for
    the activations the layers held in flight on the peak pipeline rank (pipeline.inflight_layers:
    micro-batches x the rank's layers under the interleaved or 1F1B schedule)."""
    est = r["est"]
    model = r["case"].model if "case" in r else r["model"]
    training = r["case"].training if "case" in r else r["training"]
    over = float(est.memory["total"][0] - est.memory["capacity"][0])
    terms = {k: float(est.memory[k][0]) for k in ("weights", "gradients", "optimizer", "activations", "reserve")}
    big = max(terms, key=terms.get)
    text = f"{over / 2**30:.1f} GiB over; largest: {big} {terms[big] / 2**30:.1f} GiB"
    if big == "activations":
        c = est.candidates
        rank = np.asarray([int(est.memory["peak_stage"][0])])
        m = c.num_microbatches(training.global_batch_size)
        held = float(np.ravel(inflight_layers(c, model.num_layers, m, rank))[0])
        per_layer = terms["activations"] / max(held, 1.0)
        room = terms["activations"] - over / (1.0 + training.reserve_allocator)
        count = int(np.ravel(m)[0])
        every = held >= count * float(np.ravel(c.rank_layers(model.num_layers, rank))[0])
        text += (f" = {held:.0f} layer-micro-batches in flight on pipeline rank {int(rank[0])} "
                 f"({count} micro-batches; {per_layer / 2**30:.2f} GiB each): it fits "
                 f"with at most {max(room, 0.0) / per_layer:.0f} in flight")
        if every:   # the schedule's warm-up covers the step: every micro-batch is held
            text += (f"; the schedule's warm-up spans all {count} micro-batches of the step, so "
                     "its depth does not bound them")
    return text


def report(data: dict) -> str:
    lines = ["recipe                                               fits band group  measured/pred  note"]
    for r in data["recipes"]:
        mark = lambda ok: "yes " if ok else "NO  "  # noqa: E731
        lines.append(f"{r['id'][:52]:52s} {mark(r['fits'])} {mark(r['band'])} {mark(r['group'])}  "
                     f"{r['ratio']:5.2f} ({r['low']:.2f}-{r['high']:.2f})  {r.get('miss', '')}")
    lines.append("share that passes (fits, within the band, in the top tie group or its term named) "
                 "and share inside the top tie group:")
    for source, (ok, n) in data["share"].items():
        inside = data["in_group"][source][0]
        lines.append(f"  {source:90s} {ok:3d}/{n:<3d} {ok / n:6.1%}   in group {inside:3d}/{n:<3d} {inside / n:6.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args(argv)
    data = run()
    if args.json:
        keys = ("id", "source", "layout", "fits", "band", "group", "named", "pass", "ratio", "low", "high",
                "gap", "limit", "pick", "same_degrees", "miss")
        print(json.dumps({"recipes": [{k: r.get(k) for k in keys} for r in data["recipes"]],
                          "share": data["share"], "in_group": data["in_group"]}, indent=1))
    else:
        print(report(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
