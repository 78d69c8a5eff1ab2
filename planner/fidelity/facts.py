"""What a measured run's source states beyond the row: its software, model, hardware and settings.

A runs file (benchmarks/published_runs.yaml, benchmarks/modern_runs.yaml) is a copy of measured
ground truth and is kept byte-identical, so every fact the loader needs that the row does not
carry comes from a facts file beside it (``<runs file stem>_facts.yaml``; else the shipped ones),
entry by entry, each with its source:

- ``framework`` (a framework profile: planner/frameworks/profile.py resolves the run's
  TrainingSpec from it), ``dtype``, ``precision`` (bf16 | fp8 | fp8-blockwise | mxfp8) and the
  single-fact overrides ``grad_dtype``, ``flash_attention``, ``allocator_reserve``;
- ``model``: a catalog model (name, or a mapping ``{catalog: NAME, <ModelSpec field>: value}``
  for what the run changed, e.g. ``mtp_layers: 0``), or ModelSpec fields completing the row's
  (activation, norm, position_embedding, tie_embeddings, moe, ...); ``architecture``
  (megatron-gpt | mpt) names the defaults of a source's model code for the old dense rows;
- ``hardware``: the hardware profile the run ran on;
- ``group`` (the name of its source in the tables), ``flops`` (the FLOP convention of its
  TFLOP/s and MFU), ``peak`` (the dense 16-bit peak its MFU divides by), ``memory_unit``;
- ``layout``: settings of the layout the row leaves out (micro_batch, vpp, recompute,
  zero_stage, distributed_optimizer, sequence_parallel, first/last_stage_layers, ep, etp, and
  the training software's switches, layout axes: tp_comm_overlap, moe_dispatcher alltoall |
  allgather | deepep | hybridep, moe_a2a_overlap, cuda_graphs none | layers | full_iteration),
  or the sourced value of one it misprints, a degree (tp, pp, cp, dp) included (listed in the
  run's assumptions as overriding the row);
- ``training``: settings of the job (moe_imbalance, moe_capacity_factor, overlap_grad_reduce,
  tp_backward_overlap, optimizer_moment_bytes, optimizer_offload_fraction,
  moe_activation_offload, cross_entropy_in_place);
- ``approximations``: how plan3d costs a stated setting it cannot express exactly (listed in
  the run's assumptions).

``runs`` is a glob over run ids; every entry that matches a run contributes, the first entry
to set a field wins (field by field inside ``layout``, ``training`` and a model mapping), so a
per-run entry placed before its source's entry refines it. A row may carry its own ``framework``
field (a profile name, or a mapping with these keys), which wins over every entry. Nothing here
is inferred from an id's year or a note's wording.
"""

from __future__ import annotations

from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from ..files import read_yaml, validate
from ..errors import UsageError
from ..frameworks.profile import Overrides
from ..quantities import _Strict
from ..framework_spec import CUDA_GRAPHS, MOE_DISPATCHERS, Recompute
from ..catalog import is_bare_name, resolve_framework, resolve_hardware, resolve_model

REPO_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
WHEEL_CATALOG = Path(__file__).resolve().parents[1] / "_catalog"
SHIPPED_FACTS = ("published_runs_facts.yaml", "modern_runs_facts.yaml")
Precision = Literal["bf16", "fp8", "fp8-blockwise", "mxfp8"]
Convention = Literal["narayanan", "korthikanti", "mosaic", "megatron", "palm", "none"]


class LayoutFacts(_Strict):
    """Layout settings a source states (or its published configuration sets) beyond the row,
    the training software's switches (layout.axes role "software") among them."""

    tp: int | None = Field(default=None, gt=0)
    pp: int | None = Field(default=None, gt=0)
    cp: int | None = Field(default=None, gt=0)
    dp: int | None = Field(default=None, gt=0)
    micro_batch: int | None = Field(default=None, gt=0)
    vpp: int | None = Field(default=None, gt=0)
    recompute: Recompute | None = None
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    distributed_optimizer: bool | None = None
    sequence_parallel: bool | None = None
    first_stage_layers: int | None = Field(default=None, ge=0)
    last_stage_layers: int | None = Field(default=None, ge=0)
    ep: int | None = Field(default=None, gt=0)
    etp: int | None = Field(default=None, gt=0)
    global_batch: int | None = Field(default=None, gt=0)
    tp_comm_overlap: bool | None = None
    moe_dispatcher: Literal[MOE_DISPATCHERS] | None = None
    moe_a2a_overlap: bool | None = None
    cuda_graphs: Literal[CUDA_GRAPHS] | None = None

    @field_validator("moe_dispatcher", mode="before")
    @classmethod
    def _no_flex(cls, value):
        """Megatron-Core's flex dispatcher is named by its backend (--moe-flex-dispatcher-backend)."""
        if value == "flex":
            raise ValueError("flex is Megatron-Core's fused dispatcher: name its backend, deepep or "
                             "hybridep (--moe-flex-dispatcher-backend)")
        return value


class TrainingFacts(_Strict):
    """Settings of the job a source states: TrainingSpec fields (planner.specs)."""

    moe_imbalance: float | None = Field(default=None, ge=1.0, le=64.0)
    moe_capacity_factor: float | None = Field(default=None, gt=0, le=64)
    overlap_grad_reduce: bool | None = None
    tp_backward_overlap: bool | None = None
    optimizer_moment_bytes: Literal[2, 4] | None = None
    optimizer_offload_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    moe_activation_offload: bool | None = None
    cross_entropy_in_place: bool | None = None


class RunFacts(_Strict):
    """The facts of one run (or of every run an entry's glob matches); None = not stated."""

    framework: str | None = Field(default=None, min_length=1)
    dtype: Literal["bf16", "fp16"] | None = None
    precision: Precision | None = None
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    flash_attention: bool | None = None
    allocator_reserve: float | None = Field(default=None, ge=0.0, le=2.0)
    architecture: Literal["megatron-gpt", "mpt"] | None = None
    model: str | dict[str, Any] | None = None
    hardware: str | None = Field(default=None, min_length=1)
    group: str | None = Field(default=None, min_length=1)
    flops: Convention | None = None
    peak: Literal["a100", "h100"] | None = None
    memory_unit: Literal["GiB", "GB"] | None = None
    layout: LayoutFacts | None = None
    training: TrainingFacts | None = None
    approximations: list[str] = []

    def overrides(self) -> Overrides:
        """The single-fact overrides of the framework profile (frameworks.profile.Overrides)."""
        return Overrides(flash_attention=self.flash_attention, grad_dtype=self.grad_dtype,
                         allocator_reserve=self.allocator_reserve)


class FactsEntry(RunFacts):
    """One entry of a facts file: a glob over run ids, the facts, and their source."""

    runs: str = Field(min_length=1)
    source: str = Field(min_length=1)


MERGED = ("layout", "training")  # mappings merged field by field


def facts_file(path: Path) -> tuple[FactsEntry, ...]:
    """The entries of a facts file (UsageError naming the entry if malformed, or if it names a
    hardware profile, catalog model or framework profile that does not exist, whether or not a
    run uses it). Read once per file and modification time (a relative path is resolved first,
    so another folder's file of the same name is not mistaken for it)."""
    resolved = Path(path).resolve()
    return _facts_file(resolved, resolved.stat().st_mtime_ns if resolved.exists() else 0, str(path))


@lru_cache(maxsize=None)
def _facts_file(resolved: Path, mtime_ns: int, path: str) -> tuple[FactsEntry, ...]:
    data = read_yaml(Path(path))  # resolved, mtime_ns: the cache key
    if not isinstance(data, list):
        raise UsageError(f"{path}: expected a list of entries (runs, source, facts)")
    entries = tuple(validate(FactsEntry, entry, f"{path}: entry {i + 1}") for i, entry in enumerate(data))
    for i, entry in enumerate(entries):
        _check_names(entry, f"{path}: entry {i + 1}")
    return entries


def _check_names(entry: FactsEntry, where: str) -> None:
    """UsageError for an entry's hardware profile, catalog model or framework profile name that
    resolves to nothing (a path, which resolves relative to the working directory, is checked
    when a run uses it)."""
    model = entry.model.get("catalog") if isinstance(entry.model, dict) else entry.model
    for field, name, resolve in (("hardware", entry.hardware, resolve_hardware),
                                 ("model", model, resolve_model),
                                 ("framework", entry.framework, resolve_framework)):
        if isinstance(name, str) and is_bare_name(name):
            try:
                resolve(name)
            except UsageError as exc:
                raise UsageError(f"{where}: {field}: {exc}") from None


def facts_files(runs_file: Path | None) -> list[Path]:
    """The facts files of a runs file: ``<stem>_facts.yaml`` beside it if there is one, else the
    shipped ones (the repository's benchmarks/, else the wheel's copies)."""
    if runs_file is not None:
        own = own_facts_file(runs_file)
        if own is not None:
            return [own]
    for folder in (REPO_BENCHMARKS, WHEEL_CATALOG):
        found = [folder / name for name in SHIPPED_FACTS if (folder / name).is_file()]
        if found:
            return found
    return []


def matches(glob: str, run_ids: list[str]) -> bool:
    """Whether an entry's ``runs`` glob (fnmatch) matches one of ``run_ids``."""
    return any(fnmatch(run_id, glob) for run_id in run_ids)


def own_facts_file(runs_file: Path) -> Path | None:
    """The runs file's own facts file, ``<stem>_facts.yaml`` beside it, or None."""
    own = runs_file.parent / f"{runs_file.stem}_facts.yaml"
    return own if own.is_file() else None


def check_entries_match(runs_file: Path, run_ids: list[str]) -> None:
    """UsageError naming the first entry of the runs file's own facts file whose ``runs`` glob
    matches none of ``run_ids`` (a mistyped glob would otherwise apply its facts to nothing,
    silently). The shipped facts a runs file without its own falls back on are not checked:
    they describe the shipped runs."""
    own = own_facts_file(runs_file)
    if own is None:
        return
    for i, entry in enumerate(facts_file(own)):
        if not matches(entry.runs, run_ids):
            raise UsageError(f"{own}: entry {i + 1}: runs {entry.runs!r} matches no run id of "
                             f"{runs_file.name}; correct the glob or remove the entry")


def matching_entries(path: Path, run_ids: list[str]) -> list[dict]:
    """The entries of the facts file at ``path`` (as written, YAML mappings) whose ``runs`` glob
    matches one of ``run_ids``, in file order: the facts another runs file of some of the same
    runs may take over (check_entries_match refuses the rest). UsageError if the file is
    malformed."""
    facts_file(path)  # checked
    return [entry for entry in read_yaml(Path(path))
            if matches(str(entry["runs"]), run_ids)]


def _merge(entries: list[RunFacts]) -> dict[str, Any]:
    """Field by field, the first entry that sets a field wins; layout, training and a model
    mapping are merged key by key; approximations are concatenated."""
    out: dict[str, Any] = {}
    notes: list[str] = []
    for entry in entries:
        data = entry.model_dump(exclude_none=True, exclude={"runs", "source", "approximations"})
        notes += [a for a in entry.approximations if a not in notes]
        for key, value in data.items():
            if key == "model" and isinstance(value, str):
                value = {"catalog": value}
            if key in MERGED or key == "model":
                previous = out.get(key)
                if previous is None or isinstance(previous, dict):
                    out[key] = {**value, **(previous or {})}
            elif key not in out:
                out[key] = value
    out["approximations"] = notes
    return out


def run_facts(row: dict, runs_file: Path | None) -> tuple[RunFacts, list[str]]:
    """(merged facts of ``row``, sources of the entries that contributed): the row's own
    ``framework`` field first (a profile name or a mapping of RunFacts keys), then every facts
    entry whose glob matches the row's id, in file order. UsageError if malformed."""
    given = row.get("framework")
    entries: list[RunFacts] = []
    sources: list[str] = []
    if given is not None:
        data = {"framework": given} if isinstance(given, str) else given
        entries.append(validate(RunFacts, data, "framework"))
        sources.append("the row's framework field")
    for path in facts_files(runs_file):
        for entry in facts_file(path):
            if matches(entry.runs, [str(row["id"])]):
                entries.append(entry)
                sources.append(entry.source)
    return validate(RunFacts, _merge(entries), "facts"), sources
