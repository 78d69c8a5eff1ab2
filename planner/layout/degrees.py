"""What follows from a layout's degrees, derived in one place for one layout and for N.

``LayoutDegrees`` is mixed into ``specs.Layout`` (one layout, Python ints) and
``space.Candidates`` (N layouts, numpy arrays that may be broadcast-shaped); every derived
quantity is written once, with numpy operations that work on both. Nobody else multiplies
degrees: cost, placement, exports, why-not and the validator read these.

Megatron-Core's rank order is tp-cp-ep-dp-pp (formulas.md 5.3): a pipeline stage holds
tp*cp*dp GPUs; the dense-gradient and optimizer-sharding group is the dp*cp ranks of one
(tp rank, pp rank) (``intra_dp_cp`` group, formulas.md 5.7); the expert layers fold the same
tp*cp*dp GPUs as etp x ep x edp (Megatron-Core parallel folding, MoE Parallel Folding,
arXiv:2504.14960): experts over ep ranks, each expert's weights over etp ranks, and edp
replicas.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ..framework_spec import PIPELINE_SCHEDULES, V_SHAPED_SCHEDULES

# rank_chunk_layers' index of the short chunk where every chunk of the rank is one short
EVERY_CHUNK = -2
_V_CODES = tuple(PIPELINE_SCHEDULES.index(name) for name in V_SHAPED_SCHEDULES)

def cached_per_candidates(position: int):
    """Decorator: cache a function's result on the candidates it is given (argument
    ``position``) when they keep a memo (space.Candidates: the search evaluates each block
    through many terms that ask for the same per-rank block counts and parameters); a Layout
    computes each time. Keyed by the other arguments: arrays by value, numbers as they are,
    other objects (the model) by identity, kept alive with the entry. The cached arrays are
    shared: callers never write into them."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            memo = getattr(args[position], "memo", None)
            if memo is None:
                return fn(*args)
            others = [a for i, a in enumerate(args) if i != position]
            key = (fn.__qualname__, *(_key(a) for a in others))
            if key not in memo:
                memo[key] = (fn(*args), others)
            return memo[key][0]
        return wrapper
    return decorate


def _key(value):
    """A hashable key of one argument: arrays by shape, dtype and bytes; numbers by value;
    anything else by identity."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.shape, value.dtype.str, value.tobytes()
    return value if isinstance(value, (int, float, str)) else id(value)


class LayoutDegrees:
    """Derived quantities of a layout. Needs the attributes tp, cp, pp, dp, ep, etp, vpp,
    micro_batch_size, sequence_parallel, zero_stage, distributed_optimizer, first_stage_layers,
    last_stage_layers (ints for one layout, arrays for N)."""

    @property
    def gpus(self):
        """GPUs of the layout: tp*cp*pp*dp."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def stage_gpus(self):
        """GPUs of one pipeline stage: tp*cp*dp (the GPUs experts fold over)."""
        return self.tp * self.cp * self.dp

    @property
    def grad_group(self):
        """Ranks that reduce dense gradients and shard the optimizer (ZeRO, the distributed
        optimizer): dp*cp, ranks tp apart (Megatron-Core ``intra_dp_cp`` group)."""
        return self.dp * self.cp

    @property
    def edp(self):
        """Expert data parallel size: tp*cp*dp / (etp*ep) (parallel folding)."""
        return self.stage_gpus // (self.etp * self.ep)

    @property
    def sharding_stage(self):
        """The ZeRO stage whose memory and traffic apply: the distributed optimizer is costed as
        stage 1 (formulas.md 2.1, 5.6: 2 + g + 12/n bytes per parameter, gradient reduce-scatter
        and parameter all-gather once per step)."""
        return np.where(self.distributed_optimizer, 1, self.zero_stage)

    @property
    def sp_divisor(self):
        """What splits replicated activations and SP-region tensors: tp with sequence
        parallelism, else 1."""
        return np.where(self.sequence_parallel, self.tp, 1)

    @property
    def communicators(self):
        """NCCL communicators one rank uses (formulas.md 3.10): TP (tp > 1), CP (cp > 1), PP
        (pp > 1: the p2p of batched send/recv), the gradient group dp*cp (> 1), and the
        model-parallel group tp*pp (> 1) that reduces the gradient norm and the loss; with an
        expert mesh (ep*etp > 1, an MoE layout) also the EP group of the token all-to-all
        (ep > 1), the expert-data-parallel group that reduces the experts' gradients (edp > 1)
        and the expert-TP group where it is not the TP group (etp > 1, etp != tp; Megatron-Core
        parallel_state.py builds them beside the dense groups, moe.md 3.2). Int array."""
        tp, cp, pp = np.asarray(self.tp), np.asarray(self.cp), np.asarray(self.pp)
        ep, etp = np.asarray(self.ep), np.asarray(self.etp)
        experts = (ep * etp) > 1
        return ((tp > 1).astype(np.int64) + (cp > 1) + (pp > 1) + (np.asarray(self.grad_group) > 1)
                + ((tp * pp) > 1) + (ep > 1)
                + (experts & (np.asarray(self.edp) > 1)) + (experts & (etp > 1) & (etp != tp)))

    def num_microbatches(self, global_batch_size: int):
        """m = B / (dp * micro_batch_size): micro-batches per step on each pipeline (CP ranks
        share a micro-batch's sequences, so cp does not enter). Float; a whole number where the
        layout is valid (space rule: the batch divisible by dp*micro_batch_size)."""
        return global_batch_size / (self.dp * self.micro_batch_size)

    def tokens_per_microbatch(self, seq_length: int):
        """Tokens of one micro-batch on one GPU of a stage, before SP: s*b/cp (CP splits every
        sequence over cp ranks, formulas.md 3.4). Float."""
        return seq_length * np.asarray(self.micro_batch_size, dtype=np.float64) / self.cp

    # ------------------------------------------------------------------ pipeline split

    def uneven(self):
        """True where the pipeline split is uneven (first/last stage layer counts given)."""
        return np.asarray(self.first_stage_layers) > 0

    @cached_per_candidates(0)
    def stage_layers(self, num_layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Transformer layers on the first, a middle and the last pipeline rank, as float arrays
        (first, middle, last): L/pp each for an even split; for an uneven one (Megatron's
        --decoder-first/last-pipeline-num-layers) first and last as given and the middle ranks
        (L - first - last)/(pp - 2) (0 on pp = 2, which has no middle rank)."""
        f = np.asarray(self.first_stage_layers, dtype=np.float64)
        la = np.asarray(self.last_stage_layers, dtype=np.float64)
        pp = np.asarray(self.pp, dtype=np.float64)
        even = num_layers / pp
        uneven = f > 0
        middle = np.where(pp > 2, (num_layers - f - la) / np.maximum(pp - 2, 1), 0.0)
        return (np.where(uneven, f, even), np.where(uneven, middle, even), np.where(uneven, la, even))

    def rank_layers(self, num_layers: int, rank):
        """Transformer layers on pipeline rank ``rank`` (0-based), float array: the first, a
        middle or the last rank's of stage_layers, except in the embedding-and-loss split under
        a V-shaped schedule (folded_edges), where rank 0 holds both short chunks (one layer
        less) and the last rank two full ones (one more)."""
        first, middle, last = self.stage_layers(num_layers)
        rank = np.asarray(rank)
        fold = self.folded_edges(num_layers)
        if np.any(fold):
            first, last = first - fold, last + fold
        return np.where(rank == 0, first, np.where(rank == np.asarray(self.pp) - 1, last, middle))

    def folded_edges(self, num_layers: int) -> np.ndarray:
        """True where the embedding-and-loss split (embedding_loss_split) runs under a V-shaped
        schedule (ZB-V, DualPipeV): rank r holds stages r and 2p-1-r (torchtitan
        pipeline_parallel.py L558-567), so the embedding's stage 0 and the loss's stage 2p-1,
        each one layer short, are both rank 0's, and rank p-1 holds two full stages. Llama 3
        405B (126 layers) on pp 8 with ZB-V: stages of 8 layers' worth, rank 0 holds 7 + 7
        layers, rank 7 8 + 8. Bool array."""
        code = np.asarray(self.pipeline_schedule)
        if code.dtype.kind in "US":  # a Layout names its schedule
            v_shaped = np.isin(code, V_SHAPED_SCHEDULES)
        else:
            v_shaped = np.isin(code, _V_CODES)
        if not np.any(v_shaped):  # the common case keeps the small shape
            return np.zeros((), dtype=bool)
        return v_shaped & (np.asarray(self.pp) > 1) & self.embedding_loss_split(num_layers)

    def embedding_loss_split(self, num_layers: int) -> np.ndarray:
        """True where an uneven split is Megatron-Core's embedding-and-loss-as-layers form
        (``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``):
        first = last = (L + 2)/pp - 1 with (L + 2) divisible by pp*vpp. With one layer's worth
        per chunk the embedding's chunk holds the embedding alone and the loss's chunk the output
        layer and loss alone, which Megatron-Core builds (get_num_layers_to_build asserts only
        ``>= 0`` layers there, transformer_block.py @d98e8a64) and the Llama 3 405B run trained
        with (Llama Team 2024, arXiv 2407.21783 §3.3.2: "the first model chunk on the first stage
        has only the embedding"). Bool array."""
        f = np.asarray(self.first_stage_layers)
        la = np.asarray(self.last_stage_layers)
        pp, vpp = np.asarray(self.pp), np.asarray(self.vpp)
        return (f > 0) & (f == la) & ((num_layers + 2) == pp * (f + 1)) & \
            ((f + 1) % vpp == 0)

    def rank_chunk_layers(self, num_layers: int, rank):
        """(layers of a full model chunk, index of the chunk one layer short: -1 none,
        EVERY_CHUNK all) on pipeline rank ``rank``, per candidate. Every chunk (virtual stage)
        of a rank holds the rank's layers / vpp, except in the embedding-and-loss form, where
        every chunk holds (L + 2)/(pp*vpp) layers' worth and the embedding takes the place of a
        layer in rank 0's chunk 0 and the loss in the last rank's chunk vpp-1 (Megatron-Core
        ``get_transformer_layer_offset``); under a V-shaped schedule both short chunks are rank
        0's (folded_edges). 14 layers on pp 4, vpp 2, 3 + 4 + 4 + 3: rank 0 holds [1, 2]
        layers, the last rank [2, 1]; with ZB-V rank 0 [1, 1] and the last rank [2, 2]. Float
        and int arrays."""
        rank = np.asarray(rank)
        layers = self.rank_layers(num_layers, rank)
        pp, vpp = np.asarray(self.pp), np.asarray(self.vpp)
        split = self.embedding_loss_split(num_layers)
        fold = self.folded_edges(num_layers)
        first, last = rank == 0, rank == pp - 1
        form_b = split & (first | last)
        short = np.where(form_b, np.where(first, 0, vpp - 1), -1)
        missing = form_b  # layers' worth the short chunks lack: one each
        if np.any(fold):  # rank 0: both chunks short; the last rank: none
            short = np.where(fold, np.where(first, EVERY_CHUNK, -1), short)
            missing = np.where(fold, vpp * first, form_b)
        return (layers + missing) / vpp.astype(np.float64), short


    # ------------------------------------------------------------------ recomputation

    def recompute_share(self, num_layers: int, rank):
        """Share of pipeline rank ``rank``'s layers that run the layout's recompute mode: 1,
        except for full recompute of the first N = ``recompute_num_layers`` layers of each
        model chunk (Megatron's block method, N >= 1): min(N, c)/c for the rank's chunk of c
        layers (rank_chunk_layers; in the embedding-and-loss form the short chunk is counted
        as a full one). Llama 3 70B on pp 4, N = 5: 5/20 = 0.25. Float array."""
        n = np.asarray(getattr(self, "recompute_num_layers", 0), dtype=np.float64)
        chunk, _ = self.rank_chunk_layers(num_layers, rank)
        chunk = np.maximum(chunk, 1.0)
        block = (np.asarray(self.recompute) == 2) & (n > 0)
        return np.where(block, np.minimum(n, chunk) / chunk, 1.0)

    def recomputed_layers(self, num_layers: int):
        """Layers recomputed in full per micro-batch, summed over the pipeline ranks (all
        ``num_layers`` for recompute full of every layer; vpp x min(N, chunk) per rank with
        the block method; 0 for the other modes). Float array."""
        full = np.asarray(self.recompute) == 2
        pp = np.asarray(self.pp, dtype=np.float64)
        total = 0.0
        for rank, count in ((0, 1.0), (np.minimum(1, self.pp - 1), np.maximum(pp - 2, 0.0)),
                            (np.asarray(self.pp) - 1, np.where(pp > 1, 1.0, 0.0))):
            total = total + count * self.rank_layers(num_layers, rank) * self.recompute_share(num_layers, rank)
        return np.where(full, total, 0.0)


SPLIT_DEGREES = ("tp", "cp", "pp", "dp")


def product_expr(degrees: dict[str, int]) -> str:
    """Degrees and their product as errors name them: 'tp=8' for one, 'tp*pp*dp = 8*8*16 =
    1,024' for several (in the order given)."""
    product = math.prod(degrees.values())
    names = "*".join(degrees)
    if len(degrees) == 1:
        return f"{names}={product:,}"
    return f"{names} = {'*'.join(str(v) for v in degrees.values())} = {product:,}"


def split_problem(gpus: int, degrees: dict, exact: bool, count: str | None = None) -> str | None:
    """Why the given split degrees cannot use ``gpus`` GPUs, naming their product; None if they can.

    ``degrees``: the degrees the user gave (tp, cp, pp, dp; None or absent = not given).
    ``exact``: the product must equal ``gpus`` (every degree given, or the others fixed at 1),
    else it must divide it (the degrees not given make up the rest). ``count`` words the GPU
    count (default "N GPUs"). E.g. tp=2, dp=8 on 8 GPUs: 'tp*dp = 2*8 = 16 > 8 GPUs'; tp=5 on
    512: 'tp=5 does not divide 512 GPUs'.
    """
    given = [(k, int(degrees[k])) for k in SPLIT_DEGREES if degrees.get(k) is not None]
    if not given:
        return None
    product = math.prod(v for _, v in given)
    expr = product_expr(dict(given))
    where = count or f"{gpus:,} GPUs"
    if exact:
        return None if product == gpus else f"{expr} != {where}"
    if product > gpus:
        return f"{expr} > {where}"
    return f"{expr} does not divide {where}" if gpus % product else None
