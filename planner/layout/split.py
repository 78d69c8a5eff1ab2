"""The pipeline split's geometry: which uneven splits exist, how they interleave, and why one
does not (Megatron-Core's --decoder-first/last-pipeline-num-layers and its embedding-and-loss
form), and the divisors the layout's axes draw their values from. Plain numbers and numpy
arrays; nothing here knows the search.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from .degrees import LayoutDegrees

# How many layers an edge stage may hold fewer than a middle one in the uneven splits the search
# tries: the output layer of a large-vocabulary model weighs about 1.5 layers (2*h*V against
# ~24*h^2 FLOPs per token at h = 7168, V = 129280), the embedding's in-flight activations
# about as much; 4 covers both with room (Llama 3 405B ran 7 + 14x8 + 7, one fewer each).
MAX_EDGE_SHORTFALL = 4


def divisors(n: int) -> np.ndarray:
    """All positive divisors of n, ascending (int64)."""
    small = np.arange(1, int(np.sqrt(n)) + 1)
    small = small[n % small == 0]
    return np.unique(np.concatenate([small, n // small]))


def uneven_shape_ok(num_layers: int, c) -> np.ndarray:
    """True for an even split, or an uneven one of the shape plan3d models (any framework): first
    and last stage at least one layer, the rest L - first - last divided equally among the
    pp - 2 middle stages, at least as many layers as either edge stage (pp = 2: first + last = L).
    ``c``: Candidates (or any object with pp, first/last_stage_layers arrays). Bool array."""
    f, la, pp = c.first_stage_layers, c.last_stage_layers, c.pp
    if not np.any((f > 0) | (la > 0)):
        return np.ones(np.shape(f), dtype=bool)
    rest = num_layers - f - la
    mid = np.where(pp > 2, rest // np.maximum(pp - 2, 1), 0)
    shape_ok = (f >= 1) & (la >= 1) & (pp >= 2) & \
        np.where(pp > 2, (rest > 0) & (rest % np.maximum(pp - 2, 1) == 0) & (mid >= f) & (mid >= la),
                 rest == 0)
    return ((f == 0) & (la == 0)) | shape_ok


def uneven_interleave_ok(num_layers: int, c) -> np.ndarray:
    """True unless an uneven split is interleaved (vpp > 1) in neither of Megatron-Core's two ways:
    (a) ``--decoder-first/last-pipeline-num-layers``: each stage's layers divisible by vpp, pp > 2
        (get_transformer_layer_offset's interleaved branch divides by the middle stages' count);
    (b) ``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``: the
        embedding and the loss count as one layer each (LayoutDegrees.embedding_loss_split).
    Bool array (of a split of the shape uneven_shape_ok checks)."""
    f, la, pp, v = c.first_stage_layers, c.last_stage_layers, c.pp, c.vpp
    if not np.any((f > 0) | (la > 0)):
        return np.ones(np.broadcast_shapes(np.shape(f), np.shape(v)), dtype=bool)
    mid = np.where(pp > 2, (num_layers - f - la) // np.maximum(pp - 2, 1), 0)
    # (a) needs middle stages: Megatron-Core's interleaved layer offset divides by their count
    per_stage = (f % v == 0) & (la % v == 0) & (pp > 2) & (mid % v == 0)
    return ((f == 0) & (la == 0)) | (v == 1) | per_stage | LayoutDegrees.embedding_loss_split(c, num_layers)


def uneven_layout_ok(num_layers: int, c) -> np.ndarray:
    """True unless an uneven interleaved split leaves a model chunk without a layer: Megatron-
    Core's --pipeline-model-parallel-layout places any count of layers in each of the pp x vpp
    chunks (pipeline_layout), and an empty one is reported to deadlock (NVIDIA/Megatron-LM
    #1852); the embedding-and-loss form, whose first and last chunks hold the embedding and the
    loss in a layer's place, is given by its two flags instead (LayoutDegrees.embedding_loss_split).
    Bool array."""
    f, la, pp, v = c.first_stage_layers, c.last_stage_layers, c.pp, c.vpp
    mid = np.where(pp > 2, (num_layers - f - la) // np.maximum(pp - 2, 1), v)
    return ((f == 0) & (la == 0)) | (v == 1) | ((f >= v) & (la >= v) & (mid >= v)) | \
        LayoutDegrees.embedding_loss_split(c, num_layers)


def pipeline_layout(num_layers: int, pp: int, vpp: int, first: int, last: int,
                    mtp_layers: int = 0) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout of the split first+..+last (0, 0: even)
    of ``num_layers`` decoder layers on ``pp`` ranks of ``vpp`` chunks each: the pp x vpp
    stages in layer order (stage s = chunk s // pp of rank s mod pp), "|" between them, each
    its decoder layers "t" (a rank's layers spread over its chunks; where they do not divide
    the first rank's later chunks and the other ranks' earlier chunks take one more, so the
    embedding's and the loss's chunks hold fewer), "E" (the embedding) before the first and the MTP
    layers "m" and the loss "L" after the last (megatron/core/transformer/
    pipeline_parallel_layer_layout.py @d98e8a64: E first, L last, decoder layers before the
    MTP layers). A run of n > 1 equal letters is written "t*n", as Megatron's parser reads it.
    DeepSeek-V3's 61 layers on pp 8, vpp 4, 7+..+6: "Et|t*2|...|t*2|tmL"."""
    if first == 0 and last == 0:
        first = last = num_layers // pp
    middle = (num_layers - first - last) // max(pp - 2, 1) if pp > 2 else 0
    ranks = [first] + [middle] * max(pp - 2, 0) + ([last] if pp > 1 else [])
    if pp == 1:
        ranks = [num_layers]
    stages = []
    for s in range(pp * vpp):
        chunk, rank = divmod(s, pp)
        rem = ranks[rank] % vpp  # the embedding's chunk (rank 0's first) takes one fewer
        n = ranks[rank] // vpp + (chunk >= vpp - rem if rank == 0 else chunk < rem)
        text = ("E" if s == 0 else "") + _run("t", n)
        if s == pp * vpp - 1:
            text += _run("m", mtp_layers) + "L"
        stages.append(text)
    return "|".join(stages)


def _run(letter: str, n: int) -> str:
    return "" if n == 0 else letter if n == 1 else f"{letter}*{n}"


def uneven_ok(num_layers: int, c) -> np.ndarray:
    """True for an even split, or an uneven one Megatron-Core accepts and plan3d models: the
    shape (uneven_shape_ok) and, interleaved, one of Megatron-Core's two forms
    (uneven_interleave_ok). For messages and the vpp values the search tries. Bool array."""
    return uneven_shape_ok(num_layers, c) & uneven_interleave_ok(num_layers, c)


def split_of(num_layers: int, pp, first, last, vpp) -> SimpleNamespace:
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


# How a framework interleaves an uneven split (framework_spec.Rules.uneven_split): "megatron"
# (Megatron-Core's two flag forms, uneven_interleave_ok), "layout" (its pipeline layout string,
# uneven_layout_ok), "edge_stages" (the embedding-and-loss form only), "none" (no uneven split).
UNEVEN_FORMS = ("megatron", "layout", "edge_stages", "none")


def uneven_form_ok(num_layers: int, c, form: str) -> np.ndarray:
    """uneven_shape_ok and, interleaved, what ``form`` (UNEVEN_FORMS) accepts. Bool array."""
    shape = uneven_shape_ok(num_layers, c)
    if form == "layout":
        return shape & uneven_layout_ok(num_layers, c)
    if form == "edge_stages":
        return shape & ((c.vpp == 1) | LayoutDegrees.embedding_loss_split(c, num_layers))
    if form == "none":
        return shape & (c.first_stage_layers == 0)
    return shape & uneven_interleave_ok(num_layers, c)


def uneven_vpp_options(num_layers: int, pp: int, first: int, last: int, upto: int = 16,
                       form: str = "megatron", even_middle: bool = False) -> list[int]:
    """The vpp values in 1..``upto`` with which the uneven split first+..+last of ``num_layers``
    layers on ``pp`` stages passes in ``form`` (uneven_form_ok; for messages); with
    ``even_middle`` only those that also divide the middle stages' layers (the larger edge's
    on pp 2) into equal chunks, the values the search tries (a layout string places any
    count, but an uneven middle chunk only lengthens the slowest stage). [] if none does."""
    vpp = np.arange(1, upto + 1)
    ok = uneven_form_ok(num_layers, split_of(num_layers, np.full_like(vpp, pp), np.full_like(vpp, first),
                                             np.full_like(vpp, last), vpp), form)
    if even_middle and form == "layout":
        middle = (num_layers - first - last) // (pp - 2) if pp > 2 else max(first, last)
        ok &= middle % vpp == 0
    return [int(v) for v in vpp[ok]]


def uneven_problem(num_layers: int, pp: int, first: int, last: int, vpp: int,
                   form: str = "megatron") -> str:
    """Why the uneven split first+..+last of ``num_layers`` on ``pp`` stages fails in ``form``
    (uneven_form_ok), in words (for error messages); "" if it passes."""
    rest, middle = num_layers - first - last, max(pp - 2, 0)
    if pp < 2:
        return "an uneven split needs pp >= 2"
    if middle == 0:
        if rest != 0:
            return f"on pp=2 first + last must be the {num_layers} layers"
        if vpp > 1 and vpp not in uneven_vpp_options(num_layers, pp, first, last, vpp, form):
            if form == "layout":
                return (f"with vpp {vpp} a stage of {min(first, last)} layers leaves a model "
                        "chunk without a layer")
            return ("interleaving an uneven split on pp=2 needs the embedding-and-loss form "
                    "(first = last, their layers + 1 divisible by vpp, at least 2 per chunk)")
    elif rest <= 0:
        return (f"first + last stage layers {first} + {last} leave {max(rest, 0)} of the "
                f"{num_layers} layers for the {middle} middle stages")
    elif rest % middle:
        return f"the {rest} layers left do not divide over the {middle} middle stages"
    elif rest // middle < max(first, last):
        return f"an edge stage holds more than a middle stage's {rest // middle} layers"
    works = uneven_vpp_options(num_layers, pp, first, last, max(vpp, 16), form)
    if vpp not in works:
        other = [v for v in works if v > 1]
        would = (f"; vpp {', '.join(map(str, other))} would do" if other else "; only vpp 1 works")
        if form == "layout":
            return (f"with vpp {vpp} a stage of {min(first, last, rest // middle)} layers leaves a "
                    f"model chunk without a layer" + would)
        return (f"with vpp {vpp} neither is every stage's layer count divisible by vpp nor is it the "
                "embedding-and-loss split (first = last = middle - 1, whole layers per chunk)"
                + (f"; vpp {', '.join(map(str, other))} would do" if other else "; only vpp 1 works"))
    return ""
