"""Write a torch.distributed.checkpoint (DCP) of a validator rank's model and optimizer state and
measure the tensor bytes each rank wrote (validator only; imports torch).

The layout of the checkpoint follows Megatron-Core's fully parallel save (formulas.md 12.2): the
state of each rank's model-parallel shard (its pipeline rank's parameters, TP-split or not) is
first made whole over the dp*cp group (ZeRO-1's optimizer shards and FSDP2's parameter and
moment shards are all-gathered; this happens after the last step, outside every measurement of
the run), flattened per parameter group and written as one 1-D DTensor per group and tensor
kind, sharded evenly over the dp*cp ranks (padded to a multiple of dp*cp). Groups: TP-sharded
parameters (every TP rank writes its own), TP replicas (parameters not sharded over tp: norms,
row-parallel biases, positions), written only by TP rank 0, and never the tied output-layer copy
of the last pipeline rank (a replica of the first rank's embedding). Kinds: ``weights`` and, as
the run's optimizer keeps them, ``master`` (ZeRO-0/1's flat master copy), ``exp_avg`` and
``exp_avg_sq``. The bytes each rank wrote are read back from the checkpoint's metadata (the
chunks stored in that rank's ``__<rank>_*.distcp`` files, numel x element size); the files'
sizes, which add torch.save framing, are recorded beside them.
"""

from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard

from .parallel import local


def _unsharded_over_grad(t: torch.Tensor) -> torch.Tensor:
    """The rank's TP shard of ``t`` whole over the data-parallel dims of its mesh (FSDP2's
    Shard(0) over dp or dp_cp gathered; the tp placement kept); plain tensors as they are."""
    if not isinstance(t, DTensor):
        return t
    names = t.device_mesh.mesh_dim_names or ()
    want = [pl if name == "tp" else Replicate() for name, pl in zip(names, t.placements)]
    if tuple(want) != tuple(t.placements):
        t = t.redistribute(t.device_mesh, want)
    return t.to_local()


def tp_replicated(p: torch.Tensor, tp: int) -> bool:
    """True when ``p`` is the same on every tp rank: tp > 1 and it is not Shard-ed over "tp"."""
    if tp == 1:
        return False
    if not isinstance(p, DTensor):
        return True
    names = p.device_mesh.mesh_dim_names or ()
    return not any(name == "tp" and isinstance(pl, Shard) for name, pl in zip(names, p.placements))


def _flat_states(flat, group) -> dict[str, list[torch.Tensor]]:
    """ZeRO-0/1 (parallel.FlatOptimizer): master, exp_avg, exp_avg_sq per parameter, the
    ZeRO-1 shards all-gathered over the dp*cp ``group`` first."""
    st = flat.adam.state.get(flat.master, {})
    out = {}
    for kind, t in (("master", flat.master), ("exp_avg", st["exp_avg"]),
                    ("exp_avg_sq", st["exp_avg_sq"])):
        t = t.detach()
        if flat.zero >= 1 and flat.n > 1:
            full = torch.empty(flat.padded, dtype=t.dtype, device=t.device)
            dist.all_gather_into_tensor(full, t.contiguous(), group=group)
            t = full
        parts, offset = [], 0
        for n in flat.numels:
            parts.append(t[offset:offset + n])
            offset += n
        out[kind] = parts
    return out


def _states(params, flat, opt) -> dict[str, list[torch.Tensor]]:
    """{kind: [per parameter, whole over dp*cp]}: weights, then the optimizer's tensors."""
    out = {"weights": [_unsharded_over_grad(p.detach()) for p in params]}
    if flat is not None:
        out.update(_flat_states(flat, flat.group))
    else:
        for kind in ("exp_avg", "exp_avg_sq"):
            out[kind] = [_unsharded_over_grad(opt.state[p][kind].detach()) for p in params]
    return out


def _shard(flat: torch.Tensor, grad_mesh) -> DTensor:
    """This rank's 1/n of ``flat`` (padded to a multiple of n = dp*cp) as a Shard(0) DTensor."""
    n, r = grad_mesh.size(), grad_mesh.get_local_rank()
    size = -(-flat.numel() // n)
    padded = torch.nn.functional.pad(flat, (0, n * size - flat.numel()))
    piece = padded[r * size:(r + 1) * size].contiguous()
    return DTensor.from_local(piece, grad_mesh, [Shard(0)], run_check=False,
                              shape=torch.Size([n * size]), stride=(1,))


def written_bytes(metadata, rank: int) -> int:
    """Tensor bytes stored in rank ``rank``'s files: the chunks of the checkpoint's metadata
    whose storage file is ``__<rank>_*.distcp``, numel x element size."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    total = 0
    for index, info in metadata.storage_data.items():
        if not os.path.basename(str(info.relative_path)).startswith(f"__{rank}_"):
            continue
        meta = metadata.state_dict_metadata[index.fqn]
        if not isinstance(meta, TensorStorageMetadata):
            continue
        chunk = next(c for c in meta.chunks if tuple(c.offsets) == tuple(index.offset))
        item = torch.empty((), dtype=meta.properties.dtype).element_size()
        total += math.prod(chunk.sizes) * item
    return total


def save_and_measure(path: str, params, flat, opt, mesh, grad_mesh, pp_rank: int,
                     exclude=None) -> dict:
    """DCP-save this rank's share (module docstring) to ``path``; returns {checkpoint_bytes:
    tensor bytes this rank wrote, checkpoint_file_bytes: its files' sizes}. Collective: every
    rank must call it. ``exclude``: a parameter not to write (the tied output-layer copy)."""
    import torch.distributed.checkpoint as dcp
    tp, tp_rank = mesh["tp"].size(), mesh["tp"].get_local_rank()
    states = _states(params, flat, opt)
    groups: dict[str, list[int]] = {"sharded": [], "replicated": []}
    for i, p in enumerate(params):
        if p is not exclude:
            groups["replicated" if tp_replicated(p, tp) else "sharded"].append(i)
    state = {}
    for group, idx in groups.items():
        if not idx or (group == "replicated" and tp_rank != 0):
            continue
        where = f"pp{pp_rank}.tp{tp_rank}" if group == "sharded" else f"pp{pp_rank}"
        for kind, tensors in states.items():
            flat_group = torch.cat([local(tensors[i]).reshape(-1) for i in idx])
            state[f"{kind}.{where}.{group}"] = _shard(flat_group, grad_mesh)
    metadata = dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    rank = dist.get_rank()
    files = [f for f in os.listdir(path) if f.startswith(f"__{rank}_") and f.endswith(".distcp")]
    return {"checkpoint_bytes": written_bytes(metadata, rank),
            "checkpoint_file_bytes": sum(os.path.getsize(os.path.join(path, f)) for f in files)}
