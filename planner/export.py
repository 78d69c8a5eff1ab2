"""plan.yaml: write a chosen plan for review, and read it back (framework configs come later)."""

from __future__ import annotations

from pathlib import Path

import yaml

from . import __version__
from .catalog import read_yaml, validate
from .errors import UsageError
from .framework_spec import FrameworkProfile
from .specs import HardwareProfile, Layout, ModelSpec, Plan, TrainingSpec


def make_plan(model: ModelSpec, hw: HardwareProfile, training: TrainingSpec, layout: Layout,
              estimate: dict, framework: FrameworkProfile | None = None) -> Plan:
    """A Plan with the estimate's memory/time/throughput (SI units) attached and the framework
    profile embedded (None: the catalog profile ``training.framework`` names)."""
    from .frameworks.rules import profile_for
    return Plan(plan3d_version=__version__, model=model, hardware=hw, gpus=layout.gpus,
                training=training, layout=layout,
                estimate={k: estimate[k] for k in ("memory", "time", "throughput")},
                framework=profile_for(training, framework))


def plan_to_yaml(plan: Plan) -> str:
    """The plan as YAML text: model, hardware, gpus, training, layout, estimate, framework (stable
    key order)."""
    header = ("# plan3d plan: re-evaluate with `plan3d estimate --plan FILE`.\n"
              "# estimate: bytes, seconds, FLOP/s as TFLOP/s per GPU; mfu/hfu are fractions of peak.\n")
    data = plan.model_dump(mode="json", exclude_none=True)
    return header + yaml.safe_dump(data, sort_keys=False, width=100, allow_unicode=True)


def check_destination(path: Path, force: bool, flag: str = "--export",
                      example: str = "plan.yaml") -> None:
    """UsageError unless ``path`` can be written: a file name (not '', '.', '-' or a directory)
    in an existing directory, and not an existing file unless ``force``. ``flag`` and
    ``example`` only word the message."""
    if str(path) in ("", ".", "-"):
        raise UsageError(f"{flag} needs a file name, got {str(path)!r}")
    if path.is_dir():
        raise UsageError(f"{path} is a directory; give a file name such as {path / example}")
    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it")
    if not path.parent.is_dir():
        raise UsageError(f"cannot write {path}: directory {path.parent} does not exist")


def write_plan(plan: Plan, path: Path, force: bool = False) -> None:
    """Write plan.yaml; an existing file is kept unless ``force`` (UsageError)."""
    check_destination(path, force)
    try:
        path.write_text(plan_to_yaml(plan), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def read_plan(path: Path) -> Plan:
    """Load and validate a plan file (UsageError with the field on any problem)."""
    return validate(Plan, read_yaml(path), str(path))


def read_checked_plan(path: Path) -> Plan:
    """read_plan, then the layout rules every consumer relies on (search.check_layout): a plan
    edited by hand into an invalid layout is a UsageError here, before anything is exported or
    run. TP across nodes is allowed (it is slow, not invalid)."""
    from .cost.support import refuse_unmodelled
    from .search import check_layout
    plan = read_plan(path)
    try:
        refuse_unmodelled(plan.model)
        check_layout(plan.model, plan.hardware, plan.training, plan.gpus, plan.layout.model_dump(),
                     allow_cross_node_tp=True, framework=plan.framework)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None
    return plan
