"""Per-rank instruments: collective calls/bytes per (mesh dim, kind), and live tensor bytes.

``Instrument`` is one TorchDispatchMode. It sees every op at the dispatcher, including the
collectives that DTensor (``_c10d_functional``), FSDP2, pipelining and ``torch.distributed``
(``c10d``) issue. Two rules from validator_notes.md section 6: it returns NotImplemented when a
DTensor is among the types (so DTensor unwraps and the collectives it issues come back through
the mode), and it unboxes the c10d ProcessGroup ScriptObject to learn the group.

Payload convention (validator_notes.md section 6): all-reduce input, all-gather OUTPUT
(unsharded), reduce-scatter INPUT (unsharded), the p2p tensor, the all-to-all OUTPUT (what the
rank receives, its own slot included). This is the S of formulas.md 5.1. An all-to-all is also
counted as ``all_to_all_offrank``: the bytes it sends to other ranks (input less its own slot).

Live bytes: a weakref-finalized count per untyped storage created while the mode is on, plus
the storages that exist when it starts (``baseline``), and FSDP2's ``resize_`` of storages.
"""

from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

try:  # DTensor is public since torch 2.5
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover
    from torch.distributed._tensor import DTensor

# op name (without overload) -> collective kind, for each of the two op namespaces
_FUNCOL = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_out": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "broadcast": "broadcast",
    "broadcast_": "broadcast", "all_to_all_single": "all_to_all",
}
_C10D = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "_allgather_base_": "all_gather",
    "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast", "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all", "reduce_": "reduce",
    "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(t) for t in x)
    return 0


def _group_name(obj) -> str | None:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dist.ProcessGroup):
        return obj.group_name
    try:
        return dist.ProcessGroup.unbox(obj).group_name
    except Exception:  # noqa: BLE001 - not a process group
        return None


def _payload(pkg: str, name: str, kind: str, args, kwargs, out) -> int:
    """Payload bytes S of one collective call (see the module docstring)."""
    if pkg == "_c10d_functional":
        if kind == "all_gather":  # output is the gathered tensor
            return _nbytes(kwargs.get("out", out))
        return _nbytes(args[0])
    # c10d: positional layouts from the op schemas
    if kind == "all_gather":
        return _nbytes(args[0])  # output tensor(s)
    if kind == "reduce_scatter":
        return _nbytes(args[1])  # input tensor(s), unsharded
    return _nbytes(args[0])


def _offrank(args) -> int:
    """Bytes an all_to_all_single sends to OTHER ranks: its input less this rank's own slot
    (c10d alltoall_base_(output, input, process_group, output_split_sizes, input_split_sizes))."""
    inp, splits = args[1], list(args[4])
    me = dist.ProcessGroup.unbox(args[2]).rank()
    n = dist.ProcessGroup.unbox(args[2]).size()
    rows = inp.shape[0] if inp.dim() else 0
    row_bytes = _nbytes(inp) // max(rows, 1)
    own = splits[me] if splits else rows // max(n, 1)
    return _nbytes(inp) - own * row_bytes


class Instrument(TorchDispatchMode):
    """Counts collectives as {(dim, kind): [calls, bytes]} and tracks live tensor bytes.

    ``dims`` maps process-group names to labels ("tp", "cp", "dp", "pp", "embd");
    groups not in the map are labelled by their name. Use ``reset()`` between steps.
    """

    def __init__(self, dims: dict[str, str]):
        super().__init__()
        self.dims = dims
        self.counts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        self.count_enabled = True
        self._live: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    # ---------------------------------------------------------------- memory
    def track_existing(self, tensors) -> None:
        """Count the storages of ``tensors`` (params, grads, optimizer states) as live now."""
        for t in tensors:
            if isinstance(t, DTensor):
                t = t.to_local()
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        self.peak = self.live

    def _track(self, st) -> None:
        key = id(st) if st.data_ptr() == 0 else st.data_ptr()
        if key in self._live:
            return
        size = st.nbytes()
        self._live[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key)

    def _free(self, key) -> None:
        self.live -= self._live.pop(key, 0)

    def __enter__(self):
        self._orig_resize = torch.UntypedStorage.resize_
        mode = self

        def resize_(st, size):  # FSDP2 frees/re-allocates unsharded parameters this way
            old = st.data_ptr()
            result = mode._orig_resize(st, size)
            if old in mode._live:
                mode.live -= mode._live.pop(old)
            if size > 0:
                mode._track(st)
            return result

        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._orig_resize
        return super().__exit__(*exc)

    # ---------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if DTensor in types:
            return NotImplemented
        out = func(*args, **kwargs)
        pkg = func.namespace
        name = func._schema.name.split("::")[-1]
        if self.count_enabled and pkg in ("_c10d_functional", "c10d"):
            kind = (_FUNCOL if pkg == "_c10d_functional" else _C10D).get(name)
            if kind is not None and kind != "barrier":
                group = None
                for arg, value in zip(func._schema.arguments, args):
                    if arg.name in ("group_name", "process_group"):
                        group = _group_name(value)
                if group is None:
                    for key in ("group_name", "process_group"):
                        if key in kwargs:
                            group = _group_name(kwargs[key])
                dim = self.dims.get(group or "", group or "?")
                entry = self.counts[(dim, kind)]
                entry[0] += 1
                entry[1] += _payload(pkg, name, kind, args, kwargs, out)
                if name == "alltoall_base_":
                    off = self.counts[(dim, "all_to_all_offrank")]
                    off[0] += 1
                    off[1] += _offrank(args)
        self._track_outputs(out)
        return out

    def _track_outputs(self, out) -> None:
        if isinstance(out, torch.Tensor):
            if not isinstance(out, (DTensor, FakeTensor)) and out.device.type != "meta":
                try:
                    self._track(out.untyped_storage())
                except Exception:  # noqa: BLE001 - e.g. sparse or opaque tensors
                    pass
        elif isinstance(out, (list, tuple)):
            for o in out:
                self._track_outputs(o)

    def snapshot(self) -> dict[str, list[int]]:
        """{"dim:kind": [calls, bytes]} of what was counted since the last reset."""
        return {f"{d}:{k}": list(v) for (d, k), v in sorted(self.counts.items())}

    def reset(self) -> None:
        self.counts.clear()


# ------------------------------------------------------------------ saved activations
ACTIVE: "SavedBytes | None" = None  # the tracker of the step in progress (recompute_context)


class _Saved:
    """What the pack hook hands autograd: a detached alias of the saved tensor; a finalizer
    un-counts it when autograd lets go of this object."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte interval [start, end) of the storage that view ``t`` can reach."""
    e = t.element_size()
    start = t.storage_offset() * e
    if t.numel() == 0:
        return start, start
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return start, start + span * e


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """``t`` and, through wrapper subclasses (DTensor, funcol's AsyncCollectiveTensor), the
    plain tensor that holds its local data, last."""
    chain = [t]
    while hasattr(type(chain[-1]), "__tensor_flatten__"):
        chain.append(getattr(chain[-1], chain[-1].__tensor_flatten__()[0][0]))
    return chain


def _is_param(chain: list[torch.Tensor]) -> bool:
    return any(isinstance(x, torch.nn.Parameter) for t in chain for x in (t, t._base))


class SavedBytes:
    """Bytes of the tensors autograd saves for backward, live over a step, and their peak.

    A ``torch.autograd.graph.saved_tensors_hooks`` pair: every saved tensor that is not a
    parameter (nor a view of one; FSDP2's unsharded parameters included) counts the bytes of
    its storage that it can reach, deduplicated by storage (q, k and v views of one buffer
    count once; a micro-batch view counts its rows, not the whole batch), from the moment it
    is saved until autograd frees it. DTensors count their local tensor. Recomputation (full
    or selective, ``torch.utils.checkpoint`` non-reentrant): the checkpoint saves only its
    inputs, which count here; the tensors its recomputation saves in backward are counted
    while they are held, through ``recompute_context`` (``checkpoint(context_fn=...)``).
    ``live`` and ``peak`` are bytes; ``recompute_tracked`` is False where this torch lacks
    the (private) hook stack accessor, so recomputed tensors are not counted.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self.recompute_tracked = hasattr(torch._C._autograd, "_top_saved_tensors_default_hooks")
        self._spans: dict[int, dict[tuple[int, int], int]] = {}
        self._bytes: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self):
        global ACTIVE
        ACTIVE = self
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        global ACTIVE
        ACTIVE = None
        return self._hooks.__exit__(*exc)

    def _track(self, t: torch.Tensor) -> _Saved | None:
        chain = _plain(t)
        local = chain[-1]
        if _is_param(chain) or isinstance(local, FakeTensor) or local.device.type == "meta":
            return None
        st = local.untyped_storage()
        if st.nbytes() == 0:
            return None
        key, span = st.data_ptr() or id(st), _extent(local)
        if span[1] <= span[0]:  # an empty view (an expert that got no tokens) holds no bytes
            return None
        spans = self._spans.setdefault(key, {})
        spans[span] = spans.get(span, 0) + 1
        self._recount(key)
        holder = _Saved(t.detach())  # no grad_fn: an output's node would hold itself
        weakref.finalize(holder, self._drop, key, span)
        return holder

    def _pack(self, t):
        holder = self._track(t)
        return t if holder is None else holder

    def _drop(self, key: int, span: tuple[int, int]) -> None:
        spans = self._spans[key]
        spans[span] -= 1
        if not spans[span]:
            del spans[span]
        self._recount(key)

    def _recount(self, key: int) -> None:
        total, end = 0, -1
        for lo, hi in sorted(self._spans.get(key, ())):
            total += max(0, hi - max(lo, end))
            end = max(end, hi)
        self.live += total - self._bytes.get(key, 0)
        if total:
            self._bytes[key] = total
        else:
            self._bytes.pop(key, None)
            self._spans.pop(key, None)
        self.peak = max(self.peak, self.live)

    def recompute_hooks(self) -> "_RecomputeHooks":
        """A context to enter inside a checkpoint's recomputation: each tensor the
        recomputation saves is counted until the checkpoint lets go of it."""
        return _RecomputeHooks(self)


class _RecomputeHooks:
    """Pushes, on top of the checkpoint's own recomputation hook (read when entered), a hook
    that counts each saved tensor and hands an alias of it on; the count lasts as long as the
    alias, which the checkpoint keeps until the backward that needs it has used it."""

    def __init__(self, saved: SavedBytes):
        self.saved = saved
        self.inner = contextlib.nullcontext()

    def __enter__(self):
        top = torch._C._autograd._top_saved_tensors_default_hooks(False) \
            if self.saved.recompute_tracked else None
        if top is not None:
            outer_pack, outer_unpack = top

            def pack(x):
                if _is_param(_plain(x)):  # FSDP2's unsharded parameters, views of weights
                    return outer_pack(x)
                alias = x.detach()
                holder = self.saved._track(alias)
                if holder is not None:
                    holder.tensor = None  # no cycle: the alias owns the holder
                    alias._plan3d_saved = holder
                return outer_pack(alias)

            self.inner = torch.autograd.graph.saved_tensors_hooks(pack, outer_unpack)
        return self.inner.__enter__()

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)


def _unpack(packed):
    return packed.tensor if isinstance(packed, _Saved) else packed


def recompute_context():
    """``context_fn`` for torch.utils.checkpoint: (forward context, recomputation context);
    the second counts what the recomputation saves in the step's SavedBytes, if any."""
    if ACTIVE is None:
        return contextlib.nullcontext(), contextlib.nullcontext()
    return contextlib.nullcontext(), ACTIVE.recompute_hooks()
