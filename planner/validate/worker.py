"""One rank of the validation run, and the single-process reference. Imports torch.

``run_rank(cfg)`` is what each rank executes (forked by launch.py or started by torchrun). It
writes ``rank{R}.json`` in cfg["out_dir"]: per-step losses (last stage), step times, collective
counts per step {"dim:kind": [calls, bytes]}, live-bytes baseline/peak, the peak of the bytes
saved for backward per step (instrument.SavedBytes), and the bytes of parameters, gradients and
optimizer states it holds.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .instrument import Instrument, SavedBytes
from .model import GPT, GPTConfig, cp_positions, loss_fn, set_context_parallel
from .parallel import (FlatOptimizer, apply_fsdp, apply_full_recompute, apply_tp, build_chunks,
                       embedding_groups, local, reduce_partial_grads)

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def batches(cfg: dict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Synthetic tokens of one step: (ids, targets), each (global batch, seq) int64, seeded by step."""
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + step)
    tokens = torch.randint(0, cfg["model"]["vocab"], (cfg["gbs"], cfg["model"]["seq"] + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build_model(cfg: dict) -> GPT:
    torch.manual_seed(cfg["seed"])
    return GPT(GPTConfig(**cfg["model"])).to(DTYPES[cfg["dtype"]])


def reference_losses(cfg: dict) -> list[float]:
    """Loss per step of the same model and data in one process, full batch, same Adam."""
    device = torch.device(cfg["device"])
    model = build_model(cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], foreach=False)
    losses = []
    for step in range(cfg["steps"]):
        ids, targets = (t.to(device) for t in batches(cfg, step))
        loss = loss_fn(model(ids), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is not None:
            t = local(t)
            total += t.numel() * t.element_size()
    return total


def run_rank(cfg: dict) -> dict:
    """Run cfg["steps"] training steps as this rank (env RANK/WORLD_SIZE/MASTER_*).

    Writes rank{R}.json to cfg["out_dir"], or with cfg["gather"] returns on rank 0 the record with
    "all": every rank's record (torch.distributed.gather_object). Returns this rank's record.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    pp, dp, tp, vpp = cfg["pp"], cfg["dp"], cfg["tp"], cfg["vpp"]
    cp = cfg.get("cp", 1)
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.get("timeout_s", 120)))
    rank = dist.get_rank()
    mesh = init_device_mesh(device.type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    cp_rank = mesh["cp"].get_local_rank()
    dims = {mesh.get_group(d).group_name: d for d in ("pp", "dp", "cp", "tp")}
    # dense gradients are reduced (and ZeRO-sharded) over dp*cp (Megatron's intra_dp_cp group)
    grad_mesh = mesh["dp"] if cp == 1 else mesh["dp", "cp"]._flatten("dp_cp")
    grad_group = grad_mesh.get_group() if dp * cp > 1 else None
    if grad_group is not None:
        if cp > 1 and grad_group.group_name in dims:
            raise RuntimeError("the flattened dp*cp group aliases another mesh group")
        dims[grad_group.group_name] = "dp"
    embd = None
    tied = cfg["model"]["tie_embeddings"] and pp > 1
    if tied:
        embd = embedding_groups(mesh, pp, dp * cp * tp)
        dims[embd.group_name] = "embd"

    model = build_model(cfg).to(device)
    if cp > 1:
        set_context_parallel(model, mesh.get_group("cp"), cp_rank, cp)
    if tied:  # the last stage keeps its own copy of the word embedding (Megatron, formulas.md 1.3)
        model.head.out.weight = torch.nn.Parameter(model.embed.tok.weight.detach().clone())
    chunks = build_chunks(model, pp_rank, pp, vpp, cfg.get("stage_layers"))
    del model
    moes, comm = _experts(cfg, chunks, pp_rank, dims)
    for _, chunk in chunks:
        if tp > 1:
            apply_tp(chunk, mesh["tp"], cfg["sp"])
            if cfg["model"]["tie_embeddings"] and pp == 1:  # TP made two parameters: tie again
                chunk.head.out.weight = chunk.embed.tok.weight
        if cfg["recompute"] == "full":
            apply_full_recompute(chunk)
        if dp * cp > 1 and cfg["zero"] >= 2:
            apply_fsdp(chunk, grad_mesh, cfg["zero"])
    params = [p for _, c in chunks for p in c.parameters()]
    opt, flat, flat_e = _optimizers(cfg, params, moes, comm, grad_group)

    n_stages = pp * vpp
    m = cfg["gbs"] // (dp * cfg["mbs"])
    stages = [PipelineStage(c, sid, n_stages, device, group=mesh.get_group("pp")) for sid, c in chunks]
    has_first = any(sid == 0 for sid, _ in chunks)
    has_last = any(sid == n_stages - 1 for sid, _ in chunks)
    if vpp > 1:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn)
    tok_w = chunks[0][1].embed.tok.weight if has_first and tied else None
    out_w = chunks[-1][1].head.out.weight if has_last and tied else None

    inst = Instrument(dims)
    cols = cp_positions(cp_rank, cp, cfg["model"]["seq"]) if cp > 1 else slice(None)
    record = {"rank": rank, "coord": {"pp": pp_rank, "dp": dp_rank, "cp": cp_rank,
                                      "tp": mesh["tp"].get_local_rank()},
              "losses": [], "step_s": [], "comm": [], "live_baseline": [], "live_peak": [],
              "saved_peak": [], "moe_counts": []}
    if comm is not None:
        record["coord"].update(etp=comm.etp_rank, ep=comm.ep_rank, edp=comm.edp_rank)
    for step in range(cfg["steps"]):
        ids, targets = batches(cfg, step)
        rows = slice(dp_rank * m * cfg["mbs"], (dp_rank + 1) * m * cfg["mbs"])
        ids, targets = ids[rows][:, cols].to(device), targets[rows][:, cols].to(device)
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        losses: list = []
        with inst:
            inst.reset()
            inst.track_existing(params + [p.grad for p in params] + _opt_tensors(opt, flat)
                                + (_opt_tensors(None, flat_e) if flat_e else []))
            baseline = inst.live
            args = (ids,) if has_first else ()
            with SavedBytes() as saved:
                schedule.step(*args, target=targets if has_last else None, losses=losses)
            reduce_partial_grads(params)
            if tied:  # all-reduce the two copies' gradients between first and last stage
                w = tok_w if tok_w is not None else out_w
                dist.all_reduce(local(w.grad), group=embd)
            if tp > 1:  # replicated router weights see only this rank's sequence shard
                for mod in moes:
                    for p in mod.router.parameters():
                        dist.all_reduce(p.grad, group=mesh.get_group("tp"))
            grads_held = _nbytes(p.grad for p in params)
            if flat_e is not None:
                flat_e.step()
            if flat is not None:
                flat.step()
            else:
                opt.step()
            for p in params:
                p.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize()
        record["step_s"].append(time.perf_counter() - t0)
        record["comm"].append(inst.snapshot())
        record["live_baseline"].append(baseline)
        record["live_peak"].append(inst.peak)
        record["saved_peak"].append(saved.peak)
        record["recompute_tracked"] = saved.recompute_tracked
        record["moe_counts"].append([mod.records[:] for mod in moes])
        for mod in moes:
            mod.records.clear()
        if has_last:
            record["losses"].append(sum(float(x.detach()) for x in losses) / len(losses))
    record["params_bytes"] = _nbytes(params)
    record["grads_bytes"] = grads_held
    record["optimizer_bytes"] = (flat.state_bytes() if flat is not None else sum(
        _nbytes(v for k, v in st.items() if k != "step") for st in opt.state.values())) + \
        (flat_e.state_bytes() if flat_e is not None else 0)
    if device.type == "cuda":
        record["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    record.update(_checkpoint(cfg, params, flat, opt, mesh, grad_mesh, pp_rank, out_w))
    if cfg.get("gather"):  # torchrun: rank 0 collects every record (ranks may be on other nodes)
        records = [None] * dist.get_world_size() if rank == 0 else None
        dist.gather_object(record, records, dst=0)
        record["all"] = records
    else:
        Path(cfg["out_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(cfg["out_dir"]) / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()
    return record


def _optimizers(cfg: dict, params: list, moes: list, comm, grad_group) -> tuple:
    """(Adam for FSDP2, dense FlatOptimizer over dp*cp, expert FlatOptimizer over edp): the
    ones this run uses, None for the others. Expert gradients are summed over EDP and divided
    by dp*cp (parallel.FlatOptimizer)."""
    dp, cp = cfg["dp"], cfg.get("cp", 1)
    expert = {id(p) for mod in moes for p in mod.expert_params()}
    opt = flat = flat_e = None
    if cfg["zero"] >= 2 and dp * cp > 1:
        opt = torch.optim.Adam(params, lr=cfg["lr"], foreach=False)
    else:
        flat = FlatOptimizer([p for p in params if id(p) not in expert], grad_group, cfg["zero"],
                             cfg["lr"])
    if moes:
        edp = comm.edp_group if comm.edp_group.size() > 1 else None
        flat_e = FlatOptimizer([p for mod in moes for p in mod.expert_params()], edp,
                               cfg["zero"], cfg["lr"], divisor=dp * cp)
    return opt, flat, flat_e


def _experts(cfg: dict, chunks, pp_rank: int, dims: dict) -> tuple[list, object]:
    """This rank's MoE modules (in layer order), sharded to its experts, and its ExpertComm
    (None for a dense model); the expert groups are added to ``dims`` (ep, etp, tp_ep, edp)."""
    moes = [layer.mlp for _, c in chunks for layer in c.layers.values()
            if hasattr(layer.mlp, "router")]
    if not cfg["model"].get("num_experts"):
        return moes, None
    from .moe import expert_groups
    stage = cfg["tp"] * cfg.get("cp", 1) * cfg["dp"]
    comm = expert_groups(cfg["pp"], stage, cfg["etp"], cfg["ep"], pp_rank,
                         dist.get_rank() - pp_rank * stage)
    for name in ("ep", "etp", "tp_ep", "edp"):
        g = getattr(comm, f"{name}_group")
        dims[g.group_name] = name
    for m in moes:
        m.shard(comm)
    return moes, comm


def _checkpoint(cfg, params, flat, opt, mesh, grad_mesh, pp_rank, exclude) -> dict:
    """A DCP checkpoint of the state and the bytes this rank wrote (checkpoint.save_and_measure)
    into out_dir/checkpoint (a fresh temporary folder under torchrun, removed afterwards); {}
    when cfg["checkpoint"] is False."""
    if not cfg.get("checkpoint", True) or cfg["model"].get("num_experts"):
        return {}  # expert state (FlatOptimizer over edp) is not written yet: no check
    import shutil
    import tempfile

    from .checkpoint import save_and_measure
    temporary = not cfg.get("out_dir")
    path = tempfile.mkdtemp(prefix="plan3d-ckpt-") if temporary else \
        os.path.join(cfg["out_dir"], "checkpoint")
    try:
        return save_and_measure(path, params, flat, opt, mesh, grad_mesh, pp_rank, exclude)
    finally:
        dist.barrier()
        if temporary:
            shutil.rmtree(path, ignore_errors=True)


def _opt_tensors(opt, flat) -> list:
    if flat is not None:
        return [flat.master] + [v for st in flat.adam.state.values() for v in st.values()]
    return [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
