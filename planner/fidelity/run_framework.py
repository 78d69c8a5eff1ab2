"""Which framework ran a published run: its profile, overrides, dtype and architecture defaults.

A run's TrainingSpec is resolved from a framework profile (planner.frameworks.profile), never
inferred from the year or the wording of its source. The mapping comes, first match wins, from
the run's own ``framework`` field (a mapping with the keys of RunFramework, or just a profile
name), else from the entries of ``published_runs_frameworks.yaml`` beside the runs file (or the
shipped one), whose ``runs`` glob matches the run's id, else megatron-core with bf16, stated as
an assumption of the run.
"""

from __future__ import annotations

from fnmatch import fnmatch
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..catalog import read_yaml, resolve_framework, validate
from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..frameworks.profile import Overrides
from ..quantities import _Strict

SIDECAR = "published_runs_frameworks.yaml"
REPO_SIDECAR = Path(__file__).resolve().parents[2] / "benchmarks" / SIDECAR
WHEEL_SIDECAR = Path(__file__).resolve().parents[1] / "_catalog" / SIDECAR


class RunFramework(_Strict):
    """The software of a run: ``framework`` (a profile name or file), ``dtype`` (the training
    dtype), single-fact overrides (``grad_dtype``, ``flash_attention``, ``allocator_reserve``)
    and ``architecture``: the defaults of the source's model code for what the row leaves out
    (megatron-gpt: biases, learned positions, dropout 0.1; mpt: llm-foundry's MPT, no biases,
    ALiBi, dropout 0)."""

    framework: str = Field(min_length=1)
    dtype: Literal["bf16", "fp16"] = "bf16"
    grad_dtype: Literal["fp32", "bf16", "fp16"] | None = None
    flash_attention: bool | None = None
    allocator_reserve: float | None = Field(default=None, ge=0.0, le=2.0)
    architecture: Literal["megatron-gpt", "mpt"] = "megatron-gpt"

    def overrides(self) -> Overrides:
        """The single-fact overrides of this run."""
        return Overrides(flash_attention=self.flash_attention, grad_dtype=self.grad_dtype,
                         allocator_reserve=self.allocator_reserve)

    def profile(self) -> FrameworkProfile:
        """The framework profile (UsageError for an unknown name)."""
        return resolve_framework(self.framework)


class SidecarEntry(RunFramework):
    """One entry of published_runs_frameworks.yaml: a glob over run ids and its source."""

    runs: str = Field(min_length=1)
    source: str = Field(min_length=1)


DEFAULT = RunFramework(framework="megatron-core")


@lru_cache(maxsize=None)
def sidecar(path: Path) -> tuple[SidecarEntry, ...]:
    """The entries of a published_runs_frameworks.yaml (UsageError if malformed)."""
    data = read_yaml(path)
    if not isinstance(data, list):
        raise UsageError(f"{path}: expected a list of entries (runs, framework, source, ...)")
    return tuple(validate(SidecarEntry, entry, f"{path}: entry {i + 1}") for i, entry in enumerate(data))


def sidecar_for(runs_file: Path) -> Path | None:
    """The framework file of a runs file: the one beside it, else the shipped one."""
    for path in (runs_file.parent / SIDECAR, REPO_SIDECAR, WHEEL_SIDECAR):
        if path.is_file():
            return path
    return None


def run_framework(row: dict, runs_file: Path | None) -> tuple[RunFramework, bool]:
    """(RunFramework of ``row``, whether it was assumed): the row's ``framework`` field, else
    the first sidecar entry matching its id, else DEFAULT (assumed). UsageError if malformed."""
    given = row.get("framework")
    if given is not None:
        data = {"framework": given} if isinstance(given, str) else given
        return validate(RunFramework, data, "framework"), False
    path = sidecar_for(runs_file) if runs_file is not None else None
    for entry in sidecar(path) if path is not None else ():
        if fnmatch(str(row["id"]), entry.runs):
            return RunFramework(**entry.model_dump(exclude={"runs", "source"})), False
    return DEFAULT, True
