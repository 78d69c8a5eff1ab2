"""Candidate layouts as one struct of numpy arrays, and the constraints that prune them.

Every field is an int64 (or bool) array of the same length N; the cost model evaluates all N at
once. Nothing here loops over candidates in Python: the space is a Cartesian product built with
numpy, then filtered by boolean masks, each rule named so the search can say what it pruned.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from .degrees import LayoutDegrees
from .specs import RECOMPUTE_CODES, Layout, ModelSpec, TrainingSpec

if TYPE_CHECKING:
    from .framework_spec import FrameworkProfile

RECOMPUTE_NAMES = {code: name for name, code in RECOMPUTE_CODES.items()}


@dataclass(frozen=True)
class Candidates(LayoutDegrees):
    """N layouts: arrays of shape (N,) (or broadcast-shaped, planner.grid). ``recompute`` holds
    codes 0 none, 1 selective, 2 full, 3 selective+. Derived quantities come from degrees.LayoutDegrees.

    ``cp``, ``ep``, ``etp`` (int) default to 1, ``distributed_optimizer`` (bool) to False,
    ``first_stage_layers`` / ``last_stage_layers`` (int) to 0, the even pipeline split;
    ``recompute_num_layers`` (int) to 0: with full recompute (code 2) every layer, N >= 1 the
    first N layers of each model chunk (specs.Layout).
    """

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    zero_stage: np.ndarray
    micro_batch_size: np.ndarray
    recompute: np.ndarray
    sequence_parallel: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray = field(default=None)  # type: ignore[assignment]
    ep: np.ndarray = field(default=None)  # type: ignore[assignment]
    etp: np.ndarray = field(default=None)  # type: ignore[assignment]
    distributed_optimizer: np.ndarray = field(default=None)  # type: ignore[assignment]
    first_stage_layers: np.ndarray = field(default=None)  # type: ignore[assignment]
    last_stage_layers: np.ndarray = field(default=None)  # type: ignore[assignment]
    recompute_num_layers: np.ndarray = field(default=None)  # type: ignore[assignment]
    offload_layers: np.ndarray = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        for name in ("first_stage_layers", "last_stage_layers", "recompute_num_layers", "offload_layers"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.zeros_like(self.tp))
        for name in ("cp", "ep", "etp"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, np.ones_like(self.tp))
        if self.distributed_optimizer is None:
            object.__setattr__(self, "distributed_optimizer", np.zeros(np.shape(self.tp), dtype=bool))
        object.__setattr__(self, "memo", {})  # degrees.cached_per_candidates: terms computed once

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index: np.ndarray) -> "Candidates":
        """The candidates selected by a boolean mask or an index array."""
        return Candidates(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def replace(self, **values: np.ndarray) -> "Candidates":
        """These candidates with some fields replaced (a new memo)."""
        return Candidates(**{f.name: values.get(f.name, getattr(self, f.name)) for f in fields(self)})

    def layout(self, i: int) -> Layout:
        """Candidate i as a Layout."""
        values = {f.name: getattr(self, f.name)[i] for f in fields(self)}
        values = {k: bool(v) if k in BOOL_FIELDS else int(v) for k, v in values.items()}
        values["recompute"] = RECOMPUTE_NAMES[values["recompute"]]
        return Layout(**values)

    @classmethod
    def from_layouts(cls, layouts: list[Layout]) -> "Candidates":
        """Arrays of length len(layouts), one entry per layout."""
        def col(name):
            if name == "recompute":
                return np.array([RECOMPUTE_CODES[x.recompute] for x in layouts], dtype=np.int64)
            dtype = bool if name in BOOL_FIELDS else np.int64
            return np.array([getattr(x, name) for x in layouts], dtype=dtype)
        return cls(**{f.name: col(f.name) for f in fields(cls)})


BOOL_FIELDS = ("sequence_parallel", "distributed_optimizer")


def divisors(n: int) -> np.ndarray:
    """All positive divisors of n, ascending (int64)."""
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def product(**axes: np.ndarray) -> dict[str, np.ndarray]:
    """Cartesian product of named 1-D arrays, as flat arrays of equal length (C order)."""
    grids = np.meshgrid(*axes.values(), indexing="ij")
    return {name: grid.ravel() for name, grid in zip(axes, grids)}


# Every TP implementation splits whole attention heads over the tp ranks; what it does with the
# KV heads (query groups) is the framework's rule (frameworks.rules, kv_heads_tp).
HEADS_RULE = "attention heads divisible by tp"
TP_RULE = "tp within the NVLink domain"
UNEVEN_RULE = "uneven pipeline split: edge stages of 1..middle layers, interleaved as Megatron-Core allows"
LAYERS_RULE = "layers divisible by pp*vpp"
BATCH_RULE = "global batch divisible by dp*micro_batch_size"
# How many layers an edge stage may hold fewer than a middle one in the uneven splits the search
# tries: the output layer of a large-vocabulary model weighs about 1.5 layers (2*h*V against
# ~24*h^2 FLOPs per token at h = 7168, V = 129280), the embedding's in-flight activations
# about as much; 4 covers both with room (Llama 3 405B ran 7 + 14x8 + 7, one fewer each).
MAX_EDGE_SHORTFALL = 4


def constraint_masks(model: ModelSpec, training: TrainingSpec, nvlink_domain: int,
                     c: Candidates, allow_cross_node_tp: bool = False,
                     framework: "FrameworkProfile | None" = None) -> dict[str, np.ndarray]:
    """Named validity rules -> boolean arrays (True = the candidate passes that rule). Masks broadcast.

    The rules of every layout plan3d models: tp within the NVLink domain (GPUs on one NVLink
    fabric, ``nvlink_domain``) unless ``allow_cross_node_tp``; attention heads divisible by tp;
    the FFN width divisible by tp (its column/row-parallel linear layers divide their
    output/input size); layers divisible by pp*vpp (or an uneven split); the global batch
    divisible by dp*micro_batch_size; SP needs tp > 1 and each CP rank's share of the sequence,
    seq_length/cp, divisible by tp; CP needs seq_length divisible by 2*cp (its causal load
    balance cuts every sequence into 2*cp chunks) and flash attention; the distributed optimizer
    goes with zero_stage 0; an uneven split of the shape plan3d models; recompute_num_layers
    only with full recompute and at most a chunk's layers. Then the rules of the
    training framework (``framework``, default: the profile named by ``training.framework``;
    frameworks.rules.framework_masks): KV heads against tp, interleaving and micro-batches,
    uneven split forms, ZeRO stages, recomputation, ...
    """
    from .frameworks.rules import framework_masks, profile_for
    a, L = model.num_attention_heads, model.num_layers
    B, s = training.global_batch_size, training.seq_length
    tp, pp, vpp, cp = c.tp, c.pp, c.vpp, c.cp
    masks = {
        TP_RULE: (tp <= nvlink_domain) | allow_cross_node_tp,
        HEADS_RULE: a % tp == 0,
        "ffn_hidden_size divisible by tp": model.ffn % tp == 0,
        LAYERS_RULE: (L % (pp * vpp) == 0) | (c.first_stage_layers > 0),
        BATCH_RULE: (B % (c.dp * c.micro_batch_size) == 0),
        "seq_length divisible by 2*cp": (cp == 1) | (s % (2 * cp) == 0),
        "sequence parallel needs tp > 1 and seq_length/cp divisible by tp":
            ~c.sequence_parallel | ((tp > 1) & (s % (cp * tp) == 0)),
        "context parallel needs flash attention": (cp == 1) | training.flash_attention,
        "distributed optimizer replaces ZeRO (zero_stage 0 only)":
            ~c.distributed_optimizer | (c.zero_stage == 0),
        UNEVEN_RULE: _uneven_ok(L, c),
        RECOMPUTE_LAYERS_RULE: _recompute_layers_ok(L, c),
        "offload_layers fewer than the layers": np.asarray(c.offload_layers) < L,
        **expert_rules(model, c),
    }
    masks.update(framework_masks(profile_for(training, framework), model, training, c))
    return masks


RECOMPUTE_LAYERS_RULE = "recompute_num_layers only with full recompute, at most a model chunk's layers"


def _recompute_layers_ok(num_layers: int, c) -> np.ndarray:
    """recompute_num_layers N = 0, or N >= 1 with full recompute (code 2) and N at most the
    layers of the largest model chunk (Megatron-Core: "recompute_num_layers must be between 1
    and num_layers_per_pipeline_rank", transformer_config.py __post_init__). Bool array."""
    n = np.asarray(c.recompute_num_layers)
    if not np.any(n > 0):
        return np.ones(np.shape(n), dtype=bool)
    largest = np.maximum.reduce([c.rank_chunk_layers(num_layers, r)[0]
                                 for r in (0, np.minimum(1, c.pp - 1), c.pp - 1)])
    return (n == 0) | ((np.asarray(c.recompute) == 2) & (n <= largest))


def rules_broken(masks: dict[str, np.ndarray]) -> list[str]:
    """The rules of ``masks`` (rule -> bool array, e.g. constraint_masks or expert_rules on one
    layout's Candidates) that some candidate fails, in their order: what one layout breaks."""
    return [rule for rule, ok in masks.items() if not np.all(ok)]


EXPERT_RULE = "experts divisible by ep"
FOLDING_RULE = "etp*ep dividing the tp*cp*dp GPUs of a pipeline stage"


def folds(stage_gpus, etp, ep) -> np.ndarray:
    """FOLDING_RULE (Megatron-Core parallel folding, moe.md 3.2): the expert groups of etp*ep
    GPUs tile the tp*cp*dp GPUs of a pipeline stage (edp = tp*cp*dp/(etp*ep)). Broadcast bool
    array; an etp or ep of 0 (no such mesh) folds nothing."""
    group = np.asarray(etp) * np.asarray(ep)
    return (group > 0) & (np.asarray(stage_gpus) % np.maximum(group, 1) == 0)


MOE_SP_RULE = "MoE with tp > 1 needs sequence parallelism"


def moe_needs_sp(model: ModelSpec, tp) -> bool:
    """Whether the expert mesh rule MOE_SP_RULE asks for sequence parallelism: an MoE model at
    tp > 1 (Megatron-Core's MoELayer raises without it in training). The default a stated
    layout takes where SP is not given (estimate, runs files)."""
    return model.moe is not None and int(tp) > 1


def expert_rules(model: ModelSpec, c) -> dict[str, np.ndarray]:
    """Named rules of the expert mesh (Megatron-Core, moe.md 3.2): a dense model has ep = etp = 1;
    an MoE model needs num_experts divisible by ep and etp*ep dividing the stage's tp*cp*dp GPUs
    (parallel folding: edp = tp*cp*dp/(etp*ep)), the expert FFN width divisible by etp, sequence
    parallelism when tp > 1 (MoELayer raises without it in training), and etp = 1 with biased
    experts (add_bias_linear with MoE, transformer_config.py L2612-2615)."""
    ep, etp = np.asarray(c.ep), np.asarray(c.etp)
    if model.moe is None:
        return {"expert parallelism needs an MoE model (ep = etp = 1)": (ep == 1) & (etp == 1)}
    m = model.moe
    rules = {EXPERT_RULE: m.num_experts % ep == 0, FOLDING_RULE: folds(c.stage_gpus, etp, ep),
             "expert ffn_hidden_size divisible by etp": m.ffn_hidden_size % etp == 0,
             MOE_SP_RULE: (np.asarray(c.tp) == 1) | c.sequence_parallel}
    if model.bias:
        rules["MoE with biases needs etp = 1"] = etp == 1
    return rules


def _uneven_ok(num_layers: int, c) -> np.ndarray:
    """True for an even split, or an uneven one Megatron-Core accepts and plan3d models: first
    and last stage at least one layer, the rest L - first - last divided equally among the
    pp - 2 middle stages, at least as many layers as either edge stage (pp = 2: first + last = L).
    With interleaving (vpp > 1) one of Megatron-Core's two ways must hold:
    (a) ``--decoder-first/last-pipeline-num-layers``: each stage's layers divisible by vpp, pp > 2
        (get_transformer_layer_offset's interleaved branch divides by the middle stages' count);
    (b) ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``: the
        embedding and the loss count as one layer each (LayoutDegrees.embedding_loss_split).
    ``c``: Candidates (or any object with pp, vpp, first/last_stage_layers arrays). Bool array."""
    f, la, pp, v = c.first_stage_layers, c.last_stage_layers, c.pp, c.vpp
    if not np.any((f > 0) | (la > 0)):
        return np.ones(np.shape(f), dtype=bool)
    rest = num_layers - f - la
    mid = np.where(pp > 2, rest // np.maximum(pp - 2, 1), 0)
    shape_ok = (f >= 1) & (la >= 1) & (pp >= 2) & \
        np.where(pp > 2, (rest > 0) & (rest % np.maximum(pp - 2, 1) == 0) & (mid >= f) & (mid >= la),
                 rest == 0)
    # (a) needs middle stages: Megatron-Core's interleaved layer offset divides by their count
    per_stage = (f % v == 0) & (la % v == 0) & (pp > 2) & (mid % v == 0)
    valid = shape_ok & ((v == 1) | per_stage | LayoutDegrees.embedding_loss_split(c, num_layers))
    return ((f == 0) & (la == 0)) | valid


def _split_of(num_layers: int, pp, first, last, vpp) -> SimpleNamespace:
    """An object with the split fields, for the rule functions (arrays broadcast)."""
    return SimpleNamespace(first_stage_layers=np.asarray(first), last_stage_layers=np.asarray(last),
                           pp=np.asarray(pp), vpp=np.asarray(vpp))


def uneven_splits(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """The uneven splits the search tries on ``pp`` stages: every (first, last) that passes the
    uneven rule with vpp 1 and leaves each edge stage at most MAX_EDGE_SHORTFALL layers lighter
    than a middle one (pp = 2: lighter than the larger edge), in both directions (the output
    layer sits on the last stage, the embedding's extra in-flight micro-batches on the first).
    The even split, when pp divides the layers, is not listed. 61 layers on pp 8: (5, 8),
    (6, 7), (7, 6), (8, 5) with 6 middle stages of 8; 80 on pp 8: (7, 7) with 11 per middle.
    [(first, last)], ascending."""
    out = []
    if pp < 2 or num_layers < pp:
        return out
    if pp == 2:
        half = -(-num_layers // 2)
        for first in range(max(1, half - MAX_EDGE_SHORTFALL), min(num_layers, half + MAX_EDGE_SHORTFALL) + 1):
            last = num_layers - first
            if 1 <= last and abs(first - last) <= MAX_EDGE_SHORTFALL and first != last:
                out.append((first, last))
        return out
    for middle in range(-(-num_layers // pp), num_layers // (pp - 2) + 1):
        rest = num_layers - (pp - 2) * middle
        for first in range(max(1, middle - MAX_EDGE_SHORTFALL), middle + 1):
            last = rest - first
            if middle - MAX_EDGE_SHORTFALL <= last <= middle and last >= 1 and \
                    not (first == last == middle):
                out.append((first, last))
    return sorted(out)


def default_uneven_split(num_layers: int, pp: int) -> tuple[int, int]:
    """The uneven split named in hints when pp does not divide the layers: middle stages hold
    k = ceil(L/pp) layers each and the rest r = L - (pp-2)*k is halved between the edge stages
    (first = r//2, last = r - first). Llama-3 405B, 126 layers on pp = 16: 7 + 14*8 + 7 (the
    Llama 3 paper, Sec. 3.3.2, removed one layer from each of the first and last stages).
    (0, 0) when pp divides L; (-1, -1) when no such split leaves each edge 1..k layers."""
    if num_layers % pp == 0:
        return 0, 0
    k = -(-num_layers // pp)
    rest = num_layers - max(pp - 2, 0) * k
    first, last = rest // 2, rest - rest // 2
    return (first, last) if pp >= 2 and first >= 1 and last <= k else (-1, -1)


def uneven_vpp_options(num_layers: int, pp: int, first: int, last: int, upto: int = 16) -> list[int]:
    """The vpp values in 1..``upto`` with which the uneven split first+..+last of ``num_layers``
    layers on ``pp`` stages passes _uneven_ok (for messages and the search's vpp axis). [] if
    none does."""
    vpp = np.arange(1, upto + 1)
    ok = _uneven_ok(num_layers, _split_of(num_layers, np.full_like(vpp, pp), np.full_like(vpp, first),
                                          np.full_like(vpp, last), vpp))
    return [int(v) for v in vpp[ok]]


def uneven_problem(num_layers: int, pp: int, first: int, last: int, vpp: int) -> str:
    """Why the uneven split first+..+last of ``num_layers`` on ``pp`` stages fails _uneven_ok, in
    words (for error messages); "" if it passes."""
    rest, middle = num_layers - first - last, max(pp - 2, 0)
    if pp < 2:
        return "an uneven split needs pp >= 2"
    if middle == 0:
        if rest != 0:
            return f"on pp=2 first + last must be the {num_layers} layers"
        if vpp > 1 and vpp not in uneven_vpp_options(num_layers, pp, first, last, vpp):
            return ("interleaving an uneven split on pp=2 needs the embedding-and-loss form "
                    "(first = last, their layers + 1 divisible by vpp, at least 2 per chunk)")
    elif rest <= 0:
        return (f"first + last stage layers {first} + {last} leave {max(rest, 0)} of the "
                f"{num_layers} layers for the {middle} middle stages")
    elif rest % middle:
        return f"the {rest} layers left do not divide over the {middle} middle stages"
    elif rest // middle < max(first, last):
        return f"an edge stage holds more than a middle stage's {rest // middle} layers"
    works = uneven_vpp_options(num_layers, pp, first, last, max(vpp, 16))
    if vpp not in works:
        other = [v for v in works if v > 1]
        return (f"with vpp {vpp} neither is every stage's layer count divisible by vpp nor is it the "
                "embedding-and-loss split (first = last = middle - 1, at least 2 layers per chunk)"
                + (f"; vpp {', '.join(map(str, other))} would do" if other else "; only vpp 1 works"))
    return ""
