"""Load measured training runs (benchmarks/published_runs.yaml, benchmarks/modern_runs.yaml schema).

Each row becomes a :class:`RunCase`: (ModelSpec, HardwareProfile, TrainingSpec, Layout, measured
figures in SI units), plus the defaults it had to assume, or the reason it is skipped. What the
row does not carry -- the training framework, the model code, the hardware profile, the
precision, the FLOP convention of its figures, settings its source's configuration states --
comes from the run's facts (planner.fidelity.facts: the row's ``framework`` field, else the
``*_facts.yaml`` entries beside the runs file or shipped), each entry with its source; nothing
is inferred from an id's year, a GPU string's wording or a note. Defaults for what neither
states are in planner.fidelity.run_layout (layout, training) and run_model (model), each listed
in the run's ``assumptions`` (``plan3d accuracy`` prints them).

- hardware: the row's ``hardware.profile``, else the facts' ``hardware``, else the catalog
  profile whose GPU name is the row's ``hardware.gpu`` exactly (assumed); otherwise skipped.
- FLOP convention of TFLOP/s and MFU: the notes tag ``[flops=narayanan|korthikanti|mosaic]``,
  else the facts' ``flops``; without one only iteration time and tokens/s are compared. The
  peak an MFU divides by: the facts' ``peak`` (a100 312, h100 989 TFLOP/s), else the profile's
  dense 16-bit peak.
- peak memory: GB = 10^9 bytes unless the notes tag ``[memory=GiB]`` or the facts'
  ``memory_unit: GiB`` says the source's code prints binary units (Megatron-LM's report_memory
  divides by 1024^2 and labels it "MB").
- skipped: a GPU count, the architecture (layers/hidden/heads, unless the facts or the row's
  model.catalog name a catalog model), the parallel layout or the global batch not given;
  hardware with no profile.
"""

from __future__ import annotations

import re
from fnmatch import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ..files import describe_validation_error, read_yaml
from ..catalog import hardware_profiles, resolve_hardware
from ..cost.precision import check_precision
from ..layout.degrees import split_problem
from ..errors import UsageError
from ..inputs import check_integers
from ..specs import NAME_PATTERN, HardwareProfile, ModelSpec, TrainingSpec
from ..layout import Layout
from .facts import RunFacts, check_entries_match, run_facts
from .run_layout import layout_of, training_of
from .run_model import catalog_of, run_model
from .schema import check_fields, notes_tags
from ..units import GIB
from ..layout import Candidates
from ..search.rules import expert_rules, rules_broken

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
WHEEL = Path(__file__).resolve().parents[1] / "_catalog"
DATASETS = {"published": "published_runs.yaml", "modern": "modern_runs.yaml"}
REPO_DATASET = BENCHMARKS / DATASETS["published"]
PEAKS = {"a100": 312e12, "h100": 989e12}  # the dense 16-bit peaks the sources divide by


@dataclass
class RunCase:
    """One measured run as planner inputs. ``measured`` is in SI units (s, FLOP/s, fractions,
    bytes). ``unknown``: the layout and training settings neither the row nor its facts state
    (each took a default, planner.fidelity.run_layout); ``sources``: the facts' sources;
    ``resolution``: what --resolve search did (planner.fidelity.resolve)."""

    id: str
    group: str
    convention: str
    source: str
    gpus: int
    measured: dict[str, float]
    model: ModelSpec | None = None
    hardware: HardwareProfile | None = None
    training: TrainingSpec | None = None
    layout: Layout | None = None
    peak_flops: float = PEAKS["a100"]
    trust: str = "unknown"
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None
    unknown: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    dataset: str = ""
    resolution: str = ""  # --resolve search: resolved | false-oom | outside-space | stated


def dataset_path(name: str) -> Path:
    """A shipped dataset (published | modern): the repository's benchmarks/ copy, else the
    wheel's. UsageError for another name or a missing file."""
    if name not in DATASETS:
        raise UsageError(f"--dataset must be one of {', '.join(DATASETS)} or all, got {name!r}")
    for folder in (BENCHMARKS, WHEEL):
        if (folder / DATASETS[name]).is_file():
            return folder / DATASETS[name]
    raise UsageError(f"the shipped {DATASETS[name]} is missing from this installation")


def default_dataset() -> Path:
    """The shipped dense dataset (published_runs.yaml)."""
    return dataset_path("published")


def load_datasets(names: list[str]) -> list[RunCase]:
    """The runs of several shipped datasets, in order (ids are unique across them)."""
    return [c for name in names for c in load_runs(dataset_path(name))]


def load_runs(path: Path | None = None) -> list[RunCase]:
    """All rows of a runs file, each a RunCase (skipped rows carry ``skipped``). UsageError if malformed."""
    path = path or default_dataset()
    rows = read_yaml(path)
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"{path}: expected a non-empty list of runs")
    cases = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise UsageError(f"{path}: entry {i + 1} has no 'id'")
        if not RUN_ID.fullmatch(row["id"]):
            raise UsageError(f"{path}: run id {row['id']!r}: use letters, digits and . _ + - "
                             "(starting with a letter or digit): the id also names the run's model")
        if row["id"] in seen:
            raise UsageError(f"{path}: duplicate run id {row['id']!r} (entries {seen[row['id']]} "
                             f"and {i + 1}); ids must be unique")
        seen[row["id"]] = i + 1
        try:
            case = _case(row, path)
        except KeyError as exc:
            raise UsageError(f"{path}: run {row['id']}: missing field {exc}") from None
        except ValidationError as exc:  # one line naming the field, as catalog.validate words it
            raise UsageError(f"{path}: run {row['id']}: {describe_validation_error(exc)}") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path}: run {row['id']}: malformed ({exc})") from None
        except UsageError as exc:
            raise UsageError(f"{path}: run {row['id']}: {exc}") from None
        case.dataset = path.stem
        cases.append(case)
    check_entries_match(path, list(seen))
    return cases


TRUST_LEVELS = ("low", "medium", "high")
RUN_ID = re.compile(NAME_PATTERN)  # ModelSpec.name's pattern: the id names the run's model


def select_runs(cases: list[RunCase], exclude: list[str] | None = None,
                min_trust: str | None = None) -> list[RunCase]:
    """Cases whose id matches none of the ``exclude`` globs and whose trust tag is >= ``min_trust``."""
    if min_trust is not None and min_trust not in TRUST_LEVELS:
        raise UsageError(f"--min-trust must be one of {', '.join(TRUST_LEVELS)}, got {min_trust!r}")
    floor = TRUST_LEVELS.index(min_trust) if min_trust else -1
    return [c for c in cases if not any(fnmatch(c.id, pat) for pat in exclude or ())
            and (floor < 0 or (c.trust in TRUST_LEVELS and TRUST_LEVELS.index(c.trust) >= floor))]


MEASURED_SCALE = {"tflops_per_gpu": 1e12, "mfu_percent": 1e-2, "hfu_percent": 1e-2,
                  "tokens_per_s": 1.0, "iteration_s": 1.0, "peak_memory_gb": 1e9}
MEASURED_NAMES = {"tflops_per_gpu": "flops_per_gpu", "mfu_percent": "mfu", "hfu_percent": "hfu",
                  "tokens_per_s": "tokens_per_s", "iteration_s": "iteration_s",
                  "peak_memory_gb": "peak_memory"}


def _measured(m: object) -> dict[str, float]:
    """The row's ``measured`` mapping in SI units (keys of MEASURED_NAMES' values). UsageError
    naming the field for a value that is not a positive number, or a percentage above 100."""
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise UsageError(f"measured must be a mapping of figures, got {m!r}")
    out = {}
    for k, v in m.items():
        if k not in MEASURED_SCALE or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise UsageError(f"measured.{k} must be a positive number, got {v!r}")
        if k.endswith("_percent") and v > 100:
            raise UsageError(f"measured.{k} must be at most 100, got {v!r}")
        out[MEASURED_NAMES[k]] = float(v) * MEASURED_SCALE[k]
    return out


def _expert_problem(model: ModelSpec, layout: Layout) -> str | None:
    """The expert-mesh rules a run's layout breaks (space.expert_rules, the ones every command
    applies: experts divisible by ep, etp*ep dividing a stage's tp*cp*dp GPUs, SP with tp > 1,
    ...), worded as search.check_layout words them; None if it keeps them."""
    broken = rules_broken(expert_rules(model, Candidates.from_layouts([layout])))
    return f"layout {layout.short()} breaks: {'; '.join(broken)}" if broken else None


THROUGHPUT_AGREEMENT = 0.02  # published tables round tokens/s and step times to 3-4 digits


def _check_throughput_agrees(measured: dict[str, float], batch: int, seq: int, seq_stated: bool) -> None:
    """A row that gives both a step time and a token rate gives one figure twice: tokens per
    step (batch x seq) = tokens/s x step time. UsageError when they disagree by more than
    THROUGHPUT_AGREEMENT (the shipped rows agree within 0.5 %): naming the step time the token
    rate implies, or, where seq_len was assumed, the seq_len the two figures imply."""
    step, rate = measured.get("iteration_s"), measured.get("tokens_per_s")
    if step is None or rate is None:
        return
    implied = batch * seq / rate
    if abs(step / implied - 1.0) <= THROUGHPUT_AGREEMENT:
        return
    if not seq_stated:
        raise UsageError(f"model.seq_len is not given ({seq} assumed) and measured.iteration_s x "
                         f"tokens_per_s / global batch = {step * rate / batch:,.0f} tokens per "
                         "sequence: state model.seq_len")
    raise UsageError(f"measured.iteration_s {step:g} s and measured.tokens_per_s {rate:,.0f} "
                     f"disagree: global batch x seq_len / tokens_per_s = {implied:.4g} s "
                     f"({abs(step / implied - 1.0):.1%} apart); correct one or give only one")


def _hardware(hw_row: dict, facts: RunFacts, assume) -> str | None:
    """The hardware profile of a run: the row's ``hardware.profile``, else the facts', else the
    catalog profile whose GPU is named exactly as the row's ``hardware.gpu`` (assumed); None if
    none is."""
    named = hw_row.get("profile") or facts.hardware
    if named is not None:
        return str(named)
    name = _profile_of_gpu(hw_row)
    if name is not None:
        assume(f"hardware={name} (its GPU is {hw_row['gpu']})")
    return name


def _profile_of_gpu(hw_row: dict) -> str | None:
    """The first catalog profile whose GPU is named exactly (any case) as the row's
    hardware.gpu; None if none is."""
    gpu = str(hw_row.get("gpu") or "").strip().lower()
    return next((name for name, hw in hardware_profiles().items() if gpu and hw.gpu.name.lower() == gpu),
                None)


def _check_hardware_agrees(hw_row: dict, hw: HardwareProfile) -> None:
    """UsageError when the row's hardware.gpu is another profile's GPU name, or its
    gpus_per_node is not the profile's: the run would be costed on hardware it did not run on."""
    other = _profile_of_gpu(hw_row)
    if other is not None and hardware_profiles()[other].gpu.name != hw.gpu.name:
        raise UsageError(f"hardware.gpu {hw_row['gpu']} is not the GPU of profile {hw.name} "
                         f"({hw.gpu.name}): name the profile of the GPU the run used")
    per_node = hw_row.get("gpus_per_node")
    check_integers({"gpus_per_node": per_node}, label=lambda _: "hardware.gpus_per_node")
    if per_node is not None and per_node != hw.gpus_per_node:
        raise UsageError(f"hardware.gpus_per_node {per_node} is not profile {hw.name}'s "
                         f"{hw.gpus_per_node}: name a profile of that node (or write one)")


def _sections(row: dict) -> tuple[dict, dict, dict]:
    """The row's hardware, model and layout mappings (UsageError if one is missing)."""
    for key in ("hardware", "model", "layout"):
        if not isinstance(row.get(key), dict):
            raise UsageError(f"missing field '{key}'" if row.get(key) is None else
                             f"{key} must be a mapping of fields, got {row[key]!r}")
    return row["hardware"], row["model"], row["layout"]


def _skip_reason(hw_row: dict, model_row: dict, lay: dict, facts: RunFacts, profile) -> str | None:
    """Why a row cannot be predicted (None if it can)."""
    catalog = catalog_of(model_row, facts.model) is not None
    if profile is None:
        return (f"hardware not modelled by plan3d ({hw_row.get('gpu')}; name a profile with "
                f"hardware.profile, e.g. dgx-h100, or write a GPU name of `plan3d hardware`)")
    if not hw_row.get("gpus"):
        return "GPU count not given"
    if not catalog and any(model_row.get(k) is None for k in ("layers", "hidden", "heads")):
        return "architecture not given (no model.catalog, and layers/hidden/heads not all stated)"
    if lay.get("dp") is None and (lay.get("tp") is None or lay.get("pp") is None):
        return "parallel layout not given"
    if lay.get("global_batch") is None and (facts.layout is None or facts.layout.global_batch is None):
        return "global batch not given"
    return None


def _case(row: dict, path: Path | None = None) -> RunCase:
    check_fields(row)
    tags = notes_tags(str(row.get("notes") or ""))
    facts, sources = run_facts(row, path)
    hw_row, model_row, lay = _sections(row)
    source = str(row.get("source") or "")
    case = RunCase(id=row["id"], group=facts.group or source.split(",")[0][:60] or "user runs",
                   convention=tags.get("flops") or facts.flops or "none", source=source,
                   gpus=int(hw_row.get("gpus") or 0), measured=_measured(row.get("measured")),
                   trust=tags.get("trust", "unknown"), sources=sources)
    assume = case.assumptions.append
    for note in facts.approximations:
        assume(note)
    if "peak_memory" in case.measured and (tags.get("memory") or facts.memory_unit) == "GiB":
        case.measured["peak_memory"] *= GIB / 1e9  # stated by the tag or the facts' source
    profile = _hardware(hw_row, facts, assume)
    case.skipped = _skip_reason(hw_row, model_row, lay, facts, profile)
    if case.skipped:
        return case
    stated = facts.layout.global_batch if facts.layout is not None else None
    batch = lay["global_batch"] if lay.get("global_batch") is not None else stated
    check_integers({"global_batch_size": batch}, label=lambda _: "layout.global_batch")
    if stated is not None and batch != stated:
        raise UsageError(f"layout.global_batch {batch} but the run's facts give {stated}: correct one")
    seq = model_row.get("seq_len")
    if seq is None:
        seq = 1024
        assume("seq_len=1024")
    check_integers({"seq_length": seq}, label=lambda _: "model.seq_len")
    case.hardware = resolve_hardware(profile)
    _check_hardware_agrees(hw_row, case.hardware)
    case.peak_flops = PEAKS[facts.peak] if facts.peak else case.hardware.gpu.peak_tflops["bf16"] * 1e12
    model_facts = facts.model if isinstance(facts.model, dict) else None
    case.model = run_model(case.id, model_row, model_facts, facts.architecture, int(seq), int(batch), assume)
    case.layout, unknown = layout_of(case.gpus, lay, facts, case.model, case.convention, assume)
    precision = row.get("precision") or facts.precision
    if precision is None:
        precision = "bf16"
        assume("precision=bf16")
    case.training, unknown_training = training_of(case.model, int(seq), int(batch), facts,
                                                  str(precision), assume)
    case.unknown = unknown + unknown_training
    check_precision(case.hardware, case.training)
    problem = split_problem(case.gpus, {k: getattr(case.layout, k) for k in ("tp", "cp", "pp", "dp")},
                            exact=True) or _expert_problem(case.model, case.layout)
    if problem:
        raise UsageError(problem)
    dp, mbs = case.layout.dp, case.layout.micro_batch_size
    stated = "micro_batch" not in unknown
    if int(batch) % (dp * (mbs if stated else 1)):
        what = f"dp x micro_batch = {dp} x {mbs} = {dp * mbs}" if stated else f"dp = {dp}"
        raise UsageError(f"layout.global_batch {int(batch):,} is not a multiple of {what}: every "
                         "data-parallel rank takes whole micro-batches")
    _check_throughput_agrees(case.measured, int(batch), int(seq), model_row.get("seq_len") is not None)
    return case
