"""Error bands of predictions, from plan3d's own measured errors, and the terms no measured run
has checked.

The data is ``benchmarks/error_bands.yaml`` (in a wheel ``planner/_catalog/error_bands.yaml``),
written by ``python benchmarks/error_bands.py`` from ``plan3d accuracy --dataset all --resolve
search`` with leave-one-source-out (LOSO) errors: each shipped measured run with its source, its
regime and the error of its step time predicted by factors fitted without its source
(planner.fidelity.loso), its peak-memory error where it measured one, the pairs of runs of one
job that differ in layout, and which run exercised each term below. Nothing here is tuned by
hand: this module only reads that file and derives bands from it the one way the script
checks them (tests/test_bands.py: the shipped file is what the script computes).

- **Regime** (``regime``): dense or MoE, BF16 or FP8 (fp8, fp8-blockwise, mxfp8), the GPU
  generation (ampere: no FP8 peak; hopper: an FP8 peak; blackwell: an MXFP8 peak, as the
  hardware profile's peaks say) and the framework profile. A band is drawn from the runs of
  the most specific regime with at least ``min_runs`` runs of ``min_sources`` sources, dropping
  the framework, then the generation, then the precision, then the kind (``select``).
- **Band** (``conformal``): with the n runs' deviations d = ln(T_measured / T_predicted), the
  symmetric split-conformal interval at the file's ``level`` L: +-q, q the ceil((n+1) L)-th
  smallest |d| (the largest where n is too small), so the measured step lies in
  [T e^-q, T e^q]. (Two-sided quantiles of the signed d were tried: a source whose bias has the
  other sign than the rest's falls outside them, and their leave-one-source-out coverage stayed
  under 80 % at every level.) The level is the least of 0.80, 0.85, 0.90, 0.95 whose LOSO
  coverage (each run's band drawn without its source) reaches 80 % over all runs; the file
  records the coverage per regime. Peak memory the same (allocated memory: the reserve is not
  measured), at its own level; tokens/s is the step band's mirror (tokens/s = tokens / step).
- **Tie band** (``Bands.tie``): the error of the predicted ratio of two layouts' step times of
  one job, |ln((1 + e_a) / (1 + e_b))| with e the LOSO step errors of two measured runs of one
  source with the same model, hardware, GPU count, sequence, batch and precision, and different
  layouts, at the same conformal level. Two layouts of one search tie when their step times
  differ by less than it (search.ties).
- **Unchecked terms** (``TERMS``): a cost term a layout uses that no measured run exercised in
  its regime (CP ring exposure inside or across the NVLink domain at fewer tokens per CP rank
  than any measured run, activation offload, TP across the NVLink domain, a software switch no
  run stated, ...) widens the layout's band by the term's whole link time (fully hidden to
  fully exposed, ``widening``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..cost.collectives import nvlink_domain, span
from ..cost.offload import host_bytes, offload_bandwidth, uses_host_memory
from ..cost.precision import FP8, blackwell
from ..errors import UsageError
from ..files import read_yaml
from ..framework_spec import CUDA_GRAPHS, MOE_DISPATCHERS
from ..specs import HardwareProfile, ModelSpec, TrainingSpec

FILE = "error_bands.yaml"
_HERE = Path(__file__).resolve()
PATHS = (_HERE.parents[2] / "benchmarks" / FILE, _HERE.parents[1] / "_catalog" / FILE)
REGIME_DIMS = ("kind", "precision", "generation", "framework")
LEVELS = (0.80, 0.85, 0.90, 0.95)  # nominal levels the script chooses among
TARGET_COVERAGE = 0.80  # the LOSO coverage the chosen level must reach over all runs


def generation(hw: HardwareProfile) -> str:
    """The GPU generation as its tensor-core formats tell it: blackwell (an MXFP8 peak), hopper
    (an FP8 peak), ampere (neither)."""
    if blackwell(hw):
        return "blackwell"
    return "hopper" if "fp8" in hw.gpu.peak_tflops else "ampere"


def regime(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec) -> dict[str, str]:
    """{kind: dense | moe, precision: bf16 | fp8, generation, framework} of a job (fp16 counts as
    bf16, every 8-bit recipe as fp8)."""
    return {"kind": "moe" if model.moe is not None else "dense",
            "precision": "fp8" if training.precision in FP8 else "bf16",
            "generation": generation(hw), "framework": training.framework}


def regime_text(basis: dict[str, str]) -> str:
    """'MoE FP8 hopper megatron-core' (the dims a band is drawn from; 'all runs' for none)."""
    words = {"moe": "MoE", "dense": "dense", "fp8": "FP8", "bf16": "BF16"}
    return " ".join(words.get(v, v) for v in basis.values()) or "all"


def conformal(values, level: float) -> tuple[float, float]:
    """(-q, q): the symmetric split-conformal interval of ``values`` at ``level``, q the
    ceil((n+1) L)-th smallest |value| (the largest where n is too small; tie_band). (0, 0) for
    no values."""
    q = tie_band(values, level)
    return -q, q


def select(records: list[dict], query: dict[str, str], min_runs: int,
           min_sources: int) -> tuple[tuple[str, ...], list[dict]]:
    """(dims, records) of the most specific regime of ``query`` (REGIME_DIMS, dropped from the
    last) whose records number at least ``min_runs`` from at least ``min_sources`` sources; all
    records (dims ()) when none does."""
    for n in range(len(REGIME_DIMS), -1, -1):
        dims = REGIME_DIMS[:n]
        chosen = [r for r in records if all(r[d] == query.get(d) for d in dims)]
        if len(chosen) >= min_runs and len({r["source"] for r in chosen}) >= min_sources:
            return dims, chosen
    return (), list(records)


@dataclass(frozen=True)
class Band:
    """Where a measured value falls around a prediction: [value x e^lo, value x e^hi] for the
    ``level`` share of measured runs (lo <= 0 <= hi, natural logs of the ratio). ``basis``: the
    regime it is drawn from ({dim: value}); ``runs`` / ``sources``: how many runs and sources."""

    lo: float
    hi: float
    level: float
    basis: dict = field(default_factory=dict)
    runs: int = 0
    sources: int = 0

    def bounds(self, value, below=0.0, above=None):
        """(low, high) of ``value`` (a number or an array), the low side widened by ``below``
        and the high side by ``above`` (shares of the value: unchecked terms', widening;
        ``above`` None: as ``below``)."""
        above = below if above is None else above
        return value * np.maximum(np.exp(self.lo) - below, 0.0), value * (np.exp(self.hi) + above)

    @property
    def below(self) -> float:
        """How far under the prediction the measured value may be, a fraction: 1 - e^lo."""
        return float(1.0 - np.exp(self.lo))

    @property
    def above(self) -> float:
        """How far over the prediction the measured value may be, a fraction: e^hi - 1."""
        return float(np.exp(self.hi) - 1.0)

    def to_dict(self) -> dict:
        return {"below": self.below, "above": self.above, "level": self.level,
                "regime": dict(self.basis), "runs": self.runs, "sources": self.sources}


@dataclass(frozen=True)
class Bands:
    """The contents of error_bands.yaml: the chosen ``level`` (step time and ties) and
    ``memory_level``, the regime-selection minima, per run the step and memory deviations
    (records: id, source, regime dims, ``d`` = ln(measured / predicted)), the tie pairs' log-ratio errors, the runs that checked each term
    (``checked``: {term: {runs: [...], key: least coverage key or None}}) and the provenance."""

    level: float
    memory_level: float
    min_runs: int
    min_sources: int
    step_runs: list[dict]
    memory_runs: list[dict]
    pairs: list[dict]
    checked: dict[str, dict]
    generated: dict = field(default_factory=dict)
    path: str = ""

    def step(self, query: dict[str, str]) -> Band:
        """The step-time band of a regime (select, conformal)."""
        return self._band(self.step_runs, query, self.level)

    def memory(self, query: dict[str, str]) -> Band:
        """The peak-memory band (allocated memory, without the reserve) of a regime."""
        return self._band(self.memory_runs, query, self.memory_level)

    def _band(self, records: list[dict], query: dict[str, str], level: float) -> Band:
        dims, chosen = select(records, query, self.min_runs, self.min_sources)
        lo, hi = conformal([r["d"] for r in chosen], level)
        return Band(lo, hi, level, {d: query[d] for d in dims}, len(chosen),
                    len({r["source"] for r in chosen}))

    def tie(self) -> float:
        """The tie band (module docstring): a fraction of the step time."""
        return tie_band([p["d"] for p in self.pairs], self.level)

    def min_free(self) -> float:
        """The default --min-free, a share of HBM: 1 - e^-q with +-q the memory band of all
        runs, so that a layout leaving it free still fits when its peak is q over the
        prediction (a predicted total T fits as T e^q <= capacity)."""
        return float(1.0 - np.exp(-self._band(self.memory_runs, {}, self.memory_level).hi))


def tie_band(values, level: float) -> float:
    """The conformal one-sided quantile (ceil((n+1) L)-th smallest, the largest where n is too
    small) of the absolute pair errors ``values``; 0 for none."""
    a = sorted(abs(float(v)) for v in values)
    if not a:
        return 0.0
    k = math.ceil((len(a) + 1) * level - 1e-9)
    return a[min(k, len(a)) - 1]


def load(path: Path) -> Bands:
    """Bands of an error_bands.yaml. UsageError when it is malformed."""
    data = read_yaml(path)
    try:
        dims = ("id", "source") + REGIME_DIMS + ("d",)
        step = [dict(zip(dims, row)) for row in data["step"]["runs"]]
        memory = [dict(zip(dims, row)) for row in data["memory"]["runs"]]
        pairs = [dict(zip(("a", "b", "d"), row)) for row in data["pairs"]["runs"]]
        return Bands(float(data["level"]), float(data["memory_level"]), int(data["min_runs"]),
                     int(data["min_sources"]), step, memory, pairs, dict(data["checked"]),
                     dict(data.get("generated", {})), str(path))
    except (KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"{path}: not an error-bands file ({exc}); regenerate it with "
                         "python benchmarks/error_bands.py") from None


@functools.cache
def shipped() -> Bands:
    """The shipped bands (the repository's benchmarks/ copy, else the wheel's). UsageError when
    neither exists."""
    for path in PATHS:
        if path.is_file():
            return load(path)
    raise UsageError(f"the shipped {FILE} is missing from this installation")


# ----------------------------------------------------------------------------- checked terms


@dataclass(frozen=True)
class Term:
    """A cost term a layout may use. ``uses(model, hw, training, c)``: where candidates ``c``
    use it (bool array); ``key(training, c)``: the coverage key (a run checks a layout when the
    run's key is at most the layout's: CP's tokens per CP rank, fewer being harder), None: any
    run that uses the term checks it. ``time``: the step's term it is timed in; ``link``: the
    link group whose time bounds it (None: the exposed time); ``label``: in words."""

    name: str
    label: str
    uses: Callable
    time: str
    link: str | None = None
    key: Callable | None = None


def _domain_span(kind: str):
    def spans(model, hw, training, c):
        return span(c, kind, nvlink_domain(hw))[1] > 1
    return spans


def _cp(inside: bool):
    def uses(model, hw, training, c):
        out = _domain_span("cp")(model, hw, training, c)
        return (np.asarray(c.cp) > 1) & (~out if inside else out)
    return uses


def _tokens_per_cp_rank(training, c):
    return training.seq_length / np.asarray(c.cp, dtype=np.float64)


def _code(choices, value):
    index = list(choices).index(value)
    return lambda model, hw, training, c: np.asarray(getattr(c, _CODE_FIELD[choices])) == index


_CODE_FIELD = {MOE_DISPATCHERS: "moe_dispatcher", CUDA_GRAPHS: "cuda_graphs"}

TERMS: tuple[Term, ...] = (
    Term("cp_ring_nvlink", "CP ring exposure inside the NVLink domain (formulas.md 5.7)",
         _cp(True), "cp_comm", "cp", _tokens_per_cp_rank),
    Term("cp_ring_network", "CP ring exposure across NVLink domains (formulas.md 5.7)",
         _cp(False), "cp_comm", "cp", _tokens_per_cp_rank),
    Term("offload", "activation offload to host memory (formulas.md 3.3.2)",
         lambda model, hw, training, c: uses_host_memory(c), "offload"),
    Term("tp_network", "TP communication across NVLink domains",
         lambda model, hw, training, c: (np.asarray(c.tp) > 1) & _domain_span("tp")(model, hw, training, c),
         "tp_comm", "tp"),
    Term("ep_network", "expert dispatch across NVLink domains",
         lambda model, hw, training, c: (np.asarray(c.ep) > 1) & _domain_span("ep_etp")(model, hw, training, c),
         "ep_comm", "ep"),
    Term("zero3", "ZeRO-3 parameter gathers",
         lambda model, hw, training, c: np.asarray(c.zero_stage) == 3, "dp_comm", "dp"),
    Term("moe_a2a_overlap", "EP communication overlap",
         lambda model, hw, training, c: np.asarray(c.moe_a2a_overlap, dtype=bool), "ep_comm", "ep"),
    Term("tp_comm_overlap", "TP communication overlap",
         lambda model, hw, training, c: np.asarray(c.tp_comm_overlap, dtype=bool) & (np.asarray(c.tp) > 1),
         "tp_comm", "tp"),
    *(Term(f"dispatcher_{d}", f"the {d} token dispatcher", _code(MOE_DISPATCHERS, d), "ep_comm", "ep")
      for d in MOE_DISPATCHERS if d != "alltoall"),
    *(Term(f"cuda_graphs_{g}", f"CUDA graphs ({g})", _code(CUDA_GRAPHS, g), "host")
      for g in CUDA_GRAPHS if g != "none"),
)
BY_TERM = {t.name: t for t in TERMS}


def term_uses(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c) -> dict[str, np.ndarray]:
    """{term: where candidates ``c`` use it} for every TERMS entry (a dense model's expert terms
    are False). Bool arrays of c's broadcast shape."""
    out = {}
    for t in TERMS:
        if t.name.startswith(("dispatcher_", "moe_a2a", "ep_network")) and model.moe is None:
            out[t.name] = np.zeros(np.shape(c.tp), dtype=bool)
            continue
        out[t.name] = np.asarray(t.uses(model, hw, training, c), dtype=bool)
    return out


def unchecked(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, c,
              bands: Bands) -> dict[str, np.ndarray]:
    """{term: where ``c`` uses a term no measured run checked} (a term with a coverage key is
    checked where some run's key is at most the layout's). Only the terms some layout of c
    leaves unchecked; bool arrays."""
    out = {}
    for name, used in term_uses(model, hw, training, c).items():
        if not np.any(used):
            continue
        seen = bands.checked.get(name, {})
        if not seen.get("runs"):
            out[name] = used
            continue
        key = BY_TERM[name].key
        least = seen.get("key")
        if key is None or least is None:
            continue
        open_ = used & (key(training, c) < float(least))
        if np.any(open_):
            out[name] = open_
    return out


def unchecked_count(masks: dict[str, np.ndarray], shape) -> np.ndarray:
    """How many unchecked terms each layout uses (int array of ``shape``)."""
    total = np.zeros(shape, dtype=np.int64)
    for m in masks.values():
        total = total + np.broadcast_to(m, shape)
    return total


def widening(est, masks: dict[str, np.ndarray], model: ModelSpec, hw: HardwareProfile,
             training: TrainingSpec) -> tuple[np.ndarray, np.ndarray]:
    """(below, above): the shares of each layout's step by which its band widens, per unchecked
    term it uses (``masks``, unchecked): below by the term's exposed time (it may be fully
    hidden), above by its link time less that (it may be fully exposed); activation offload
    above by its copies to and from the host (2 x the offloaded bytes over the host link per
    micro-batch) less its exposed stall; a term without a link time (CUDA graphs' host time)
    by its exposed time both ways. (N,) arrays."""
    step = np.maximum(np.asarray(est.time["step"], dtype=np.float64), 1e-30)
    below, above = np.zeros_like(step), np.zeros_like(step)
    for name, used in masks.items():
        t = BY_TERM[name]
        exposed = np.asarray(est.time[t.time], dtype=np.float64)
        if name == "offload":
            whole = np.maximum(_offload_copy_seconds(est, model, hw, training), exposed)
        elif t.link is not None and t.link in est.link:
            whole = np.maximum(est.link[t.link], exposed)
        else:
            whole = 2.0 * exposed
        on = np.broadcast_to(used, step.shape)
        below = below + np.where(on, exposed, 0.0) / step
        above = above + np.where(on, whole - exposed, 0.0) / step
    return below, above


def _offload_copy_seconds(est, model, hw, training) -> np.ndarray:
    c = est.candidates
    bw = np.maximum(offload_bandwidth(hw, c), 1e-300)
    m = c.num_microbatches(training.global_batch_size)
    return 2.0 * host_bytes(model, training, c) / bw * m
