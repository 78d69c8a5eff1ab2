"""The layout and the training job of a measured run: what the row and its facts state, and the
one default for each setting neither states (listed in the run's assumptions and ``unknown``).

Defaults (the ONLY ones; ``plan3d accuracy --resolve search`` replaces them by the planner's best
layout consistent with what is stated, planner.fidelity.resolve):
- micro_batch 1; vpp 1 (plain 1F1B); recompute full where the source counts FLOPs with
  Narayanan's formula (which assumes full recomputation), else none; sequence_parallel off
  (on for an MoE model with tp > 1: Megatron-Core requires it); zero_stage 0 without the
  distributed optimizer; etp 1 (Megatron's guidance for MoE; moe.md 6);
  tp = 8 and pp = (gpus/dp)/8 where only dp is given (Narayanan 2021 Table 2 gives only t*p:
  one DGX node of TP, as every PTD-P layout of its Table 1 from 18B up);
- a pipeline that pp does not divide: space.default_uneven_split (the middle stages one layer
  more than the edges, as Llama 3's);
- the training software's switches (layout.axes role "software": tp_comm_overlap,
  moe_dispatcher, moe_a2a_overlap, cuda_graphs): the one value the framework profile runs
  where it runs one (not unknown), else the axis's default (off, alltoall, off, none:
  Megatron-Core's defaults);
- training: the framework profile's facts (planner.frameworks.profile) with the facts'
  overrides; precision bf16.
A default that cannot change the prediction (vpp with pp = 1, ZeRO with one data-parallel
rank, etp without experts, a dispatcher or EP overlap without expert parallelism, TP overlap
without TP) is not listed. A degree the facts state (tp, pp, cp, dp) replaces the row's
(listed as overriding it).
"""

from __future__ import annotations

from typing import Any

from ..catalog import resolve_framework
from ..files import validate
from ..errors import UsageError
from ..framework_spec import FrameworkProfile
from ..frameworks.profile import gradient_dtype_name, resolve_training
from ..inputs import check_integers, field_of, training_spec
from ..layout import Layout
from ..layout.axes import BY_NAME, SOFTWARE_FIELDS
from ..specs import ModelSpec, TrainingSpec
from .facts import RunFacts
from ..layout.split import default_uneven_split
from ..search.rules import moe_needs_sp

# Layout settings a row may leave unknown, with their defaults (recompute: see layout_of).
LAYOUT_DEFAULTS: dict[str, Any] = {"micro_batch": 1, "vpp": 1, "recompute": "none",
                                   "sequence_parallel": False, "zero_stage": 0,
                                   "distributed_optimizer": False, "etp": 1}
# The training software's switches (layout axes), each unknown one at the axis's default.
SOFTWARE_DEFAULTS: dict[str, Any] = {name: BY_NAME[name].default for name in SOFTWARE_FIELDS}
DEGREES = ("tp", "pp", "cp", "dp")


def _stated(lay: dict, facts: RunFacts, key: str, assume=None) -> Any:
    """The facts' value of a layout setting, else the row's, else None. The facts win: they are
    the sourced reading of what the row's field means (torchtitan's rows put the local batch in
    ``micro_batch``; its pipeline micro-batch is 1), and a value that differs from the row's is
    listed through ``assume``. A row's ZeRO stage given as text (torchtitan's "FSDP over 8") is
    not a stage number: the facts must give it."""
    raw = lay.get(key)
    if key == "zero_stage" and not isinstance(raw, int):
        raw = None
    stated = getattr(facts.layout, key, None) if facts.layout is not None else None
    if stated is None:
        return raw
    if raw is not None and raw != stated and assume is not None:
        assume(f"{key}={stated} (facts) for the row's {raw}")
    return stated


def split_degrees(gpus: int, lay: dict, assume) -> tuple[int, int, int, int]:
    """(tp, pp, cp, dp) of a row: as given, dp = gpus/(tp*pp*cp) where dp is not given, and
    where dp is given but not tp and pp, tp = 8, pp = (gpus/dp)/(8*cp) (listed as assumed); one of
    tp and pp missing is what the others leave (listed). UsageError for a stated degree that is
    not a positive integer, or a model-parallel size that does not split so."""
    check_integers({k: lay.get(k) for k in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "micro_batch")},
                   label=lambda k: f"layout.{k}")
    tp, pp, dp, cp = lay.get("tp"), lay.get("pp"), lay.get("dp"), lay.get("cp") or 1
    if tp is None or pp is None:
        if gpus % (dp * cp):
            raise UsageError(f"layout.dp x cp = {dp * cp} does not divide the {gpus:,} GPUs")
        mp = gpus // (dp * cp)
        if tp is None and pp is None:
            if mp < 8 or mp % 8:
                raise UsageError(f"layout.tp and layout.pp are not given and tp*pp = {mp} (gpus / "
                                 "(dp*cp)) is not 8 GPUs of tensor parallelism times a pipeline: "
                                 "state them")
            tp, pp = 8, mp // 8
            assume(f"tp=8,pp={pp} (tp*pp={mp})")
        else:
            given, name = (tp, "pp") if pp is None else (pp, "tp")
            if mp % given:
                raise UsageError(f"layout.{name} is not given and {given} does not divide the "
                                 f"tp*pp = {mp} GPUs that gpus / (dp*cp) leaves: state it")
            tp, pp = (tp, mp // tp) if pp is None else (mp // pp, pp)
            assume(f"{name}={tp if name == 'tp' else pp} (tp*pp={mp})")
    dp = dp if dp is not None else gpus // (tp * pp * cp)
    return tp, pp, cp, dp


def layout_of(gpus: int, lay: dict, facts: RunFacts, model: ModelSpec,
              convention: str, assume) -> tuple[Layout, list[str]]:
    """(Layout of the run, the settings it leaves unknown). Each unknown setting takes its
    LAYOUT_DEFAULTS value, listed through ``assume`` unless it cannot change the prediction."""
    lay = {**lay, **{k: _stated(lay, facts, k, assume) for k in DEGREES
                     if facts.layout is not None and getattr(facts.layout, k) is not None}}
    tp, pp, cp, dp = split_degrees(gpus, lay, assume)
    ep = _stated(lay, facts, "ep", assume)
    if ep is None and model.moe is not None:
        assume("ep=1 (no expert parallelism)")
    ep = int(ep or 1)
    defaults = dict(LAYOUT_DEFAULTS, recompute="full" if convention == "narayanan" else "none")
    if model.moe is None:
        defaults.pop("etp")
    elif moe_needs_sp(model, tp):
        defaults["sequence_parallel"] = True
    distopt = _stated(lay, facts, "distributed_optimizer") is True
    value, unknown = {"etp": 1}, []
    for key, default in defaults.items():
        raw = _stated(lay, facts, key, assume)
        if raw is None and key == "zero_stage" and distopt:
            raw = 0  # Megatron's distributed optimizer is stated: the ZeRO-1 alternative, stage 0
        if raw is None:
            value[key] = default
            unknown.append(key)
            # the distributed optimizer is the zero_stage setting's other half: listed with it
            moot = (key == "vpp" and pp == 1) or (key == "zero_stage" and dp * cp == 1) \
                or key == "distributed_optimizer" or (key == "etp" and ep == 1) \
                or (key == "sequence_parallel" and tp == 1)
            if not moot:
                assume(f"{key}={default}")
        else:
            value[key] = raw
    first, last = (_stated(lay, facts, k) for k in ("first_stage_layers", "last_stage_layers"))
    if first is None and model.num_layers % pp:
        first, last = default_uneven_split(model.num_layers, pp)
        assume(f"pipeline split {first}{'+' if pp == 2 else '+..+'}{last} (pp={pp} does not "
               f"divide {model.num_layers} layers)")
        unknown.append("split")
    mesh = 0 if "etp" in unknown else ep * int(value["etp"])  # 0: a search may widen it
    software = _software(model, tp, mesh, ep, facts, unknown, assume)
    layout = validate(Layout, dict(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=int(value["etp"]), zero_stage=int(value["zero_stage"]),
        distributed_optimizer=bool(value["distributed_optimizer"]),
        micro_batch_size=int(value["micro_batch"]), recompute=value["recompute"],
        sequence_parallel=bool(value["sequence_parallel"]) and tp > 1, vpp=int(value["vpp"]),
        first_stage_layers=int(first or 0), last_stage_layers=int(last or 0), **software), "layout")
    return layout, unknown


def moot_software(model: ModelSpec, layout: Layout, key: str) -> bool:
    """Whether software switch ``key`` cannot change a prediction of ``layout``: the dispatcher
    without an expert mesh (ep*etp = 1), the EP overlap with ep = 1, either without experts,
    TP overlap with tp = 1. False for any other key."""
    return _moot(key, model, layout.tp, layout.ep * layout.etp, layout.ep)


def offered(profile: FrameworkProfile, key: str) -> tuple:
    """The values of software switch ``key`` the framework runs (framework_spec.Rules:
    tp_comm_overlap, moe_a2a_overlap on/off; its moe_dispatchers, its cuda_graphs)."""
    rule = {"moe_dispatcher": "moe_dispatchers"}.get(key, key)
    value = getattr(profile.rules, rule)
    return tuple(value) if isinstance(value, list) else ((False, True) if value else (False,))


def _moot(key: str, model: ModelSpec, tp: int, experts_mesh: int, ep: int) -> bool:
    return (key == "moe_dispatcher" and (model.moe is None or experts_mesh == 1)) \
        or (key == "moe_a2a_overlap" and (model.moe is None or ep == 1)) \
        or (key == "tp_comm_overlap" and tp == 1)


def _software(model: ModelSpec, tp: int, experts_mesh: int, ep: int, facts: RunFacts,
              unknown: list[str], assume) -> dict[str, Any]:
    """The software switches of a run: as its facts state them; else the one value its
    framework runs (a framework without TP overlap runs none: nothing unknown); else, where
    the switch is moot (the dispatcher without an expert mesh, ep*etp = 1 with etp stated; the
    EP overlap with ep = 1; both without experts; TP overlap with tp = 1: the degrees a search
    keeps as the run states them), its SOFTWARE_DEFAULTS value; else that value added to
    ``unknown`` and listed through ``assume``."""
    profile = resolve_framework(facts.framework or "megatron-core")
    out = {}
    for key, default in SOFTWARE_DEFAULTS.items():
        stated = getattr(facts.layout, key, None) if facts.layout is not None else None
        if stated is not None:
            out[key] = stated
            continue
        runs = offered(profile, key)
        if len(runs) == 1:
            out[key] = runs[0]
            continue
        out[key] = default
        if not _moot(key, model, tp, experts_mesh, ep):
            unknown.append(key)
            assume(f"{key}={default}")
    return out


def training_of(model: ModelSpec, seq: int, batch: int, facts: RunFacts,
                precision: str, assume) -> tuple[TrainingSpec, list[str]]:
    """(TrainingSpec of the run, the training settings it leaves unknown): the job (sequence,
    batch, dtype) checked as every command checks one (planner.inputs.training_spec), run by the
    framework profile the facts name with their overrides (frameworks.profile.resolve_training),
    in ``precision``, with the facts' training settings; megatron-core in bf16 when no framework
    is named (assumed)."""
    framework = facts.framework or "megatron-core"
    dtype = facts.dtype or "bf16"
    if facts.framework is None:
        assume(f"framework={framework} {dtype}")
    job = training_spec(model, {"seq_length": seq, "global_batch_size": batch, "dtype": dtype},
                        field_of("training"), "training")
    training = resolve_training(job, resolve_framework(framework), facts.overrides())
    given = facts.training.model_dump(exclude_none=True) if facts.training is not None else {}
    unknown = []
    if facts.grad_dtype is None:  # the profile's default, not a statement of the source
        unknown.append("grad_dtype")
        assume(f"grad_dtype={gradient_dtype_name(training)} ({framework} default)")
    data = {**training.model_dump(mode="json"), **given, "precision": precision}
    return validate(TrainingSpec, data, "training"), unknown
