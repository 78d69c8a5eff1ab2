"""The table of layout axes: one row per dimension of a parallel layout.

Every dimension plan3d plans (tp, cp, pp, dp, ep, etp, the pipeline split, ZeRO stage, the
distributed optimizer, micro-batch size, recomputation and its layer count, sequence
parallelism, virtual pipeline stages, activation offload) is one ``Axis`` row of ``AXES``, in
the order a Layout lists its fields. From this table are built: ``Layout`` (one layout, pydantic)
and ``Candidates`` (N layouts as numpy arrays), the search's pins and bounds
(search.options.SearchOptions) and its grid's split and knob fields, the short form a layout
prints (``Layout.short``), the wide table's columns, --why-not's parser (search.whynot) and the
typer options of search and estimate (cli.axes). Adding an axis is one row here, its cost term
(cost/), its rule (search/rules) and its export mapping (frameworks/).

A row's ``role`` says how the search covers it: ``split`` (the parallel split rows: tp, cp, pp,
dp, the expert mesh and the pipeline split, built together by search.grid), ``knob`` (an axis of
the grid of its own, values from ``values``, or from the framework's rules with ``offered``),
``solved`` (not a grid axis: the scan solves the least value that fits, cost.recompute /
cost.offload, unless pinned), ``implied`` (not a grid axis: the value the other axes imply,
``implied``, unless pinned) or ``software`` (a switch of the training software: not a grid axis
of the rules and memory passes, which take its default; the step pass times the allowed values
and keeps the fastest, search.scan). A knob with ``implied`` may take IMPLIED (-1) as a grid
value: each layout then holds the value its other axes imply (Candidates resolves it), so a grid
axis of that one value does not grow the grid (the pipeline schedule: vpp implies 1F1B or
interleaved 1F1B, and only what a framework runs beyond those adds values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..framework_spec import CUDA_GRAPHS, MOE_DISPATCHERS, PIPELINE_SCHEDULES, RECOMPUTE_MODES
from .split import divisors, uneven_splits, uneven_vpp_options

RECOMPUTE_CODES: dict[str, int] = {name: code for code, name in enumerate(RECOMPUTE_MODES)}
RECOMPUTE_NAMES: dict[int, str] = dict(enumerate(RECOMPUTE_MODES))
RECOMPUTE_WORDS = "none, selective, selective+ or full"


class _Required:
    """The default of an axis a layout must state (tp, pp, dp, ZeRO stage, micro-batch size)."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()


@dataclass(frozen=True)
class Axis:
    """One dimension of a parallel layout.

    ``name``: the Layout / Candidates field and the search pin; ``kind``: int, bool or str (a
    choice among ``choices``, stored in Candidates as its index, the code); ``default``: the
    Layout's default (REQUIRED: none); ``minimum``: an int's least value (1: a degree or size;
    0: a count, 0 = none); ``maximum``: an int's largest (None: any); ``role``: split | knob |
    solved (module docstring); ``bound`` / ``bound_default``: the search's upper bound field on
    the values (max_tp) and its default (None: no bound); ``flag``: the CLI option (a bool's
    ``--x/--no-x``); ``help``: what the value is, in words; ``keys``: the --why-not keys
    (keys[0] as the short form prints it); ``label``: the short form's piece of a layout ("" =
    not printed); ``printed``: its position in the short form; ``always``: printed whatever
    its value; ``column``: the wide table's
    header (None: no column); ``values``: the values a free search tries, from a context with
    the model, training, hardware, framework profile, the pp values and the axis bound -> array. ``stated`` / ``stated_text``: what a layout given by hand (estimate, a
    runs file) takes where the axis is not stated, for an axis without a Layout default (None:
    derived), and those words for its help (default: the Layout default's). ``title``: the
    axis named in sentences (``title_text``, else its first key: zero, mbs, sp, ...).
    ``implied``: the value (a choice's code; arrays broadcast) a layout takes where the axis is
    not stated, from its other fields (an object with their attributes); None: ``default``.
    ``offered``: a knob's search values from the framework's rules (framework_spec.Rules ->
    codes; IMPLIED stands for the implied value), used instead of ``values``.
    """

    name: str
    kind: type
    default: Any = REQUIRED
    minimum: int = 1
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    words: str = ""
    role: str = "knob"
    bound: str | None = None
    bound_default: int | None = None
    flag: str | None = None
    help: str = ""
    keys: tuple[str, ...] = ()
    label: Callable[[Any], str] | None = None
    printed: float = 0
    always: bool = False
    column: str | None = None
    values: Callable[..., np.ndarray] | None = None
    stated: Any = None
    stated_text: str = ""
    title_text: str = ""
    implied: Callable[[Any], Any] | None = None
    offered: Callable[[Any], np.ndarray] | None = None

    @property
    def array_default(self) -> Any:
        """The value a Candidates field takes when not given (a choice's code)."""
        if self.kind is str and self.default is not REQUIRED:
            return self.choices.index(self.default)
        return self.default

    @property
    def title(self) -> str:
        """The axis named in sentences and tie notes: zero, mbs, first stage layers, ..."""
        return self.title_text or (self.keys[0] if self.keys else self.name)

    @property
    def stated_words(self) -> str:
        """The default of a layout given by hand, in words (estimate's help)."""
        if self.stated_text:
            return self.stated_text
        value = self.stated if self.default is REQUIRED else self.default
        return ("on" if value else "off") if self.kind is bool else str(value)

    def code(self, value: Any) -> Any:
        """``value`` as Candidates store it: a choice's code, a bool, an int."""
        if self.kind is str:
            return self.choices.index(value)
        return bool(value) if self.kind is bool else int(value)

    def value(self, code: Any) -> Any:
        """A Candidates entry as Layout holds it: a choice's name, a bool, an int."""
        if self.kind is str:
            return self.choices[int(code)]
        return bool(code) if self.kind is bool else int(code)


def _shown(key: str, above: int = 0) -> Callable[[Any], str]:
    """Label 'key=v', printed only where v > ``above`` (None: always)."""
    return lambda lay: f"{key}={getattr(lay, _KEY_FIELD[key])}" \
        if getattr(lay, _KEY_FIELD[key]) > above else ""


_KEY_FIELD = {"tp": "tp", "cp": "cp", "pp": "pp", "dp": "dp", "ep": "ep", "etp": "etp",
              "zero": "zero_stage", "mbs": "micro_batch_size", "vpp": "vpp",
              "offload": "offload_layers"}


def _split(lay) -> str:
    return f"({lay.split_label} layers)" if lay.first_stage_layers or lay.last_stage_layers else ""


def _micro_batch_sizes(ctx) -> np.ndarray:
    """Divisors of the global batch (each a micro-batch size some dp can take)."""
    return divisors(ctx.training.global_batch_size)


def _vpp_values(ctx) -> np.ndarray:
    """The divisors of the layer count (even splits), and every vpp with which an uneven split
    of a pp in ``ctx.pps`` interleaves in the framework's form (layout.split.uneven_vpp_options;
    e.g. Llama-3 405B, 126 layers, pp=16 as 7+..+7: vpp 2 and 4 in Megatron-Core's flag forms,
    (126 + 2)/16 = 8 per rank; in its layout form those that divide the middle stages' 8 and
    fit the edges' 7: 1, 2, 4). Ascending int64."""
    num_layers = ctx.model.num_layers
    values = set(divisors(num_layers).tolist())
    form = ctx.framework.rules.uneven_split
    for pp in np.asarray(ctx.pps).tolist():
        for f, la in uneven_splits(num_layers, pp):
            values.update(uneven_vpp_options(num_layers, pp, f, la, ctx.bound or 16, form, True))
    return np.array(sorted(values), dtype=np.int64)


def _switch(rule: str) -> Callable[..., np.ndarray]:
    """A software switch: off, and on where the framework runs it (its Rules field ``rule``);
    the EP overlap only on an MoE model."""
    def values(ctx) -> np.ndarray:
        moe_only = rule == "moe_a2a_overlap" and ctx.model.moe is None
        return np.array([False, True] if getattr(ctx.framework.rules, rule) and not moe_only else [False])
    return values


def _dispatchers(ctx) -> np.ndarray:
    """The token dispatchers a free search tries (codes): all-to-all for a dense model (it has
    none to choose); for an MoE model NCCL's all-to-all and the fused dispatcher the framework and
    the cluster both run (HybridEP before DeepEP: the same rows, no etp*ep > 1 assertion). The
    all-gather dispatcher is only tried when pinned: it moves every token to every rank of the
    etp*ep group (moe.md 4.3)."""
    out = ["alltoall"]
    if ctx.model.moe is not None:
        offered = set(ctx.framework.rules.moe_dispatchers) & \
            set(getattr(ctx.hardware.moe_dispatch, "backends", None) or [])
        out += [b for b in ("hybridep", "deepep") if b in offered][:1]
    return np.array([MOE_DISPATCHERS.index(d) for d in out])


def _graph_scopes(ctx) -> np.ndarray:
    """The CUDA-graph scopes a free search tries (codes): none, and layers where the framework
    captures them (full_iteration only when pinned: its constraints, a static step, rarely hold;
    Megatron-Core transformer_config.py L2795-2975)."""
    return np.array([CUDA_GRAPHS.index(g) for g in ("none", "layers")
                     if g in ctx.framework.rules.cuda_graphs])



# The pipeline schedules (framework_spec.PIPELINE_SCHEDULES; reference/pipeline_schedules.md
# §1-§11; planner.schedule builds each op order). Codes 0 and 1 are the two that vpp implies; the
# rest some frameworks run (Rules.pipeline_schedules), and the search offers them there.
IMPLIED = -1  # a knob's grid value: the value the layout's other axes imply (module docstring)


def _offered_schedules(rules) -> np.ndarray:
    """The schedule axis's search values for a framework's rules: IMPLIED (1F1B or interleaved
    1F1B, as vpp implies) and the codes of the other schedules it runs. Int64 array."""
    extra = [PIPELINE_SCHEDULES.index(name) for name in rules.pipeline_schedules
             if PIPELINE_SCHEDULES.index(name) > 1]
    return np.array([IMPLIED] + extra, dtype=np.int64)


def _interleaved(c) -> Any:
    """The schedule a layout's vpp implies: interleaved 1F1B with virtual stages, else 1F1B."""
    return np.where(np.asarray(c.vpp) > 1, 1, 0)


def _schedule(lay) -> str:
    """The schedule in the short form, only where vpp does not imply it."""
    implied = PIPELINE_SCHEDULES[int(_interleaved(lay))]
    return "" if lay.pipeline_schedule == implied else f"schedule={lay.pipeline_schedule}"


def _fixed(*values) -> Callable[..., np.ndarray]:
    return lambda ctx: np.array(values)


AXES: tuple[Axis, ...] = (
    Axis("tp", int, stated=1, role="split", bound="max_tp", flag="--tp", help="tensor-parallel size",
         keys=("tp",), label=_shown("tp", -1), printed=0, always=True, column="tp"),
    Axis("pp", int, stated=1, role="split", bound="max_pp", flag="--pp", help="pipeline-parallel size",
         keys=("pp",), label=_shown("pp", -1), printed=2, always=True, column="pp"),
    Axis("dp", int, stated_text="gpus/(tp*cp*pp)", role="split", flag="--dp", help="data-parallel size", keys=("dp",),
         label=_shown("dp", -1), printed=4, always=True, column="dp"),
    Axis("zero_stage", int, stated_text="1, else the framework's highest (torchtitan: 3); 0 with "
         "--distributed-optimizer", minimum=0, maximum=3, flag="--zero-stage", help="ZeRO stage 0-3",
         keys=("zero", "zero_stage"), label=_shown("zero", -1), printed=7, always=True, column="zero",
         values=_fixed(0, 1, 2, 3)),
    Axis("micro_batch_size", int, stated=1, bound="max_micro_batch_size", bound_default=64,
         flag="--micro-batch-size", help="micro-batch size", keys=("mbs", "micro_batch_size"),
         label=_shown("mbs", -1), printed=9, always=True, column="mbs", values=_micro_batch_sizes),
    Axis("recompute", str, default="none", choices=RECOMPUTE_MODES, words=RECOMPUTE_WORDS,
         flag="--recompute", help="recomputation", keys=("recompute",),
         label=lambda lay: f"recompute={lay.recompute_label}", printed=11, always=True, column="recompute",
         values=_fixed(*range(len(RECOMPUTE_MODES)))),
    Axis("sequence_parallel", bool, default=False,
         stated_text="off; on for an MoE model with tp > 1, which needs it",
         flag="--sequence-parallel/--no-sequence-parallel", help="sequence parallelism",
         keys=("sp", "sequence_parallel"), label=lambda lay: "sp" if lay.sequence_parallel else "",
         printed=13, column="SP", values=_fixed(False, True)),
    Axis("vpp", int, default=1, bound="max_vpp", bound_default=16, flag="--vpp",
         help="virtual pipeline stages per rank", keys=("vpp",), label=_shown("vpp", -1),
         printed=10, always=True, column="vpp", values=_vpp_values),
    Axis("cp", int, default=1, role="split", bound="max_cp", bound_default=16, flag="--cp",
         help="context-parallel size", keys=("cp",), label=_shown("cp", 1), printed=1,
         column="cp"),
    Axis("ep", int, default=1, role="split", bound="max_ep", flag="--ep",
         help="expert-parallel size (MoE models)", keys=("ep",), label=_shown("ep", 1), printed=5,
         column="ep"),
    Axis("etp", int, default=1, role="split", flag="--etp",
         help="expert-tensor-parallel size (MoE)", keys=("etp",), label=_shown("etp", 1),
         printed=6, column="etp"),
    Axis("distributed_optimizer", bool, default=False,
         flag="--distributed-optimizer/--no-distributed-optimizer",
         help="Megatron's distributed optimizer (costed as ZeRO-1)",
         keys=("distopt", "distributed_optimizer"),
         label=lambda lay: "distopt" if lay.distributed_optimizer else "", printed=8,
         column="distopt", values=_fixed(False)),
    Axis("first_stage_layers", int, default=0, minimum=0, role="split", stated_text="even",
         flag="--first-stage-layers", help="uneven pipeline split: layers on the first stage",
         title_text="first stage layers",
         keys=("split",), label=_split, printed=3, column="pp split"),
    Axis("last_stage_layers", int, default=0, minimum=0, role="split", stated_text="even",
         flag="--last-stage-layers", help="uneven pipeline split: layers on the last stage",
         title_text="last stage layers"),
    Axis("recompute_num_layers", int, default=0, minimum=0, role="solved",
         flag="--recompute-num-layers",
         help="full recompute of only the first N layers of each model chunk (Megatron's block "
              "method; 0 = every layer)", keys=("recompute_num_layers",),
         title_text="recompute layers"),
    Axis("pipeline_schedule", str, default="1f1b", choices=PIPELINE_SCHEDULES,
         words=", ".join(PIPELINE_SCHEDULES[:-1]) + " or " + PIPELINE_SCHEDULES[-1],
         flag="--pipeline-schedule",
         help="pipeline schedule",
         keys=("schedule", "pipeline_schedule"), label=_schedule, printed=10.5,
         stated_text="1f1b, interleaved-1f1b with --vpp > 1", implied=_interleaved,
         offered=_offered_schedules, title_text="pipeline schedule", column="schedule"),
    Axis("tp_comm_overlap", bool, default=False, role="software", flag="--tp-comm-overlap/--no-tp-comm-overlap",
         help="TP communication overlapped with the GEMMs (Megatron-Core --tp-comm-overlap, "
              "Transformer Engine userbuffers; torchtitan async TP)",
         keys=("tpoverlap", "tp_comm_overlap"), label=lambda lay: "tpoverlap" if lay.tp_comm_overlap else "",
         printed=14, column="TP overlap", values=_switch("tp_comm_overlap")),
    Axis("moe_dispatcher", str, default="alltoall", choices=MOE_DISPATCHERS,
         words="alltoall, allgather, deepep or hybridep", role="software", flag="--moe-dispatcher",
         help="MoE token dispatcher: alltoall, allgather, or the fused deepep / hybridep "
              "(Megatron-Core --moe-token-dispatcher-type, flex with --moe-flex-dispatcher-backend)",
         keys=("dispatcher", "moe_dispatcher"),
         label=lambda lay: f"dispatcher={lay.moe_dispatcher}" if lay.ep * lay.etp > 1 else "",
         printed=15, column="dispatcher", values=_dispatchers),
    Axis("moe_a2a_overlap", bool, default=False, role="software",
         flag="--moe-a2a-overlap/--no-moe-a2a-overlap",
         help="MoE EP communication overlapped with another micro-batch's compute (Megatron-Core "
              "--overlap-moe-expert-parallel-comm: the combined 1F1B schedule)",
         keys=("a2aoverlap", "moe_a2a_overlap"), label=lambda lay: "a2aoverlap" if lay.moe_a2a_overlap else "",
         printed=16, column="EP overlap", values=_switch("moe_a2a_overlap")),
    Axis("cuda_graphs", str, default="none", choices=CUDA_GRAPHS,
         words="none, layers or full_iteration", role="software", flag="--cuda-graphs",
         help="CUDA-graph scope: none, layers (each layer's static part: Megatron-Core "
              "--cuda-graph-impl transformer_engine) or full_iteration",
         keys=("graphs", "cuda_graphs"),
         label=lambda lay: f"graphs={lay.cuda_graphs}" if lay.cuda_graphs != "none" else "",
         printed=17, column="graphs", values=_graph_scopes),
    Axis("offload_layers", int, default=0, minimum=0, role="solved", flag="--offload-layers",
         help="layers whose activations go to host memory over the host link (Megatron-Core "
              "--cpu-offloading-num-layers: pp 1, no recomputation)",
         keys=("offload", "offload_layers"), label=_shown("offload", 0), printed=12,
         column="offload"),
)

BY_NAME: dict[str, Axis] = {a.name: a for a in AXES}
SPLIT_FIELDS = tuple(a.name for a in AXES if a.role == "split")
KNOB_FIELDS = tuple(a.name for a in AXES if a.role == "knob")
SOLVED_FIELDS = tuple(a.name for a in AXES if a.role == "solved")
SOFTWARE_FIELDS = tuple(a.name for a in AXES if a.role == "software")
IMPLIED_FIELDS = tuple(a.name for a in AXES if a.role == "implied")
BOOL_FIELDS = tuple(a.name for a in AXES if a.kind is bool)
PRINTED = tuple(sorted((a for a in AXES if a.label is not None), key=lambda a: a.printed))
BOUNDS: dict[str, Axis] = {a.bound: a for a in AXES if a.bound}
# --why-not key -> the axis it pins (the keys of the short form first)
KEYS: dict[str, Axis] = {key: a for a in AXES for key in a.keys}


def short(layout) -> str:
    """One line: the printed axes' labels in their order (PRINTED), e.g. tp=8 cp=2 pp=16
    (7+..+7 layers) dp=8 ep=8 zero=1 mbs=1 vpp=4 recompute=none sp."""
    return " ".join(filter(None, (a.label(layout) for a in PRINTED)))
