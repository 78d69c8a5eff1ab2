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
from types import SimpleNamespace

import torch
import torch.distributed as dist

from ..framework_spec import V_SHAPED_SCHEDULES
from ..layout import groups
from .instrument import Instrument, SavedBytes
from .model import GPT, GPTConfig, cp_positions, loss_fn, set_context_parallel
from .parallel import (FlatOptimizer, apply_fsdp, apply_full_recompute, apply_tp, build_chunks,
                       embedding_groups, local, reduce_partial_grads)
from .checkpoint import save_and_measure
from .moe import expert_groups

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}
# plan3d's pipeline schedules by their torch.distributed.pipelining classes (pytorch@00722e648b74
# schedules.py; torch 2.13); DualPipe (bidirectional) has none (validate.miniature runs 1F1B)
SCHEDULE_CLASSES = {"1f1b": "Schedule1F1B", "interleaved-1f1b": "ScheduleInterleaved1F1B",
                    "gpipe": "ScheduleGPipe", "looped-bfs": "ScheduleLoopedBFS",
                    "interleaved-zero-bubble": "ScheduleInterleavedZeroBubble",
                    "zbv": "ScheduleZBVZeroBubble", "dualpipev": "ScheduleDualPipeV"}


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
    r = _process_groups(cfg)
    _build(cfg, r)
    _pipeline(cfg, r)
    record = {"rank": r.rank, "coord": {"pp": r.pp_rank, "dp": r.dp_rank, "cp": r.cp_rank,
                                        "tp": r.mesh["tp"].get_local_rank()},
              "losses": [], "step_s": [], "comm": [], "live_baseline": [], "live_peak": [],
              "saved_peak": [], "moe_counts": []}
    if r.comm is not None:
        record["coord"].update(etp=r.comm.etp_rank, ep=r.comm.ep_rank, edp=r.comm.edp_rank)
    inst = Instrument(r.dims)
    grads_held = 0
    for step in range(cfg["steps"]):
        grads_held = _step(cfg, r, step, inst, record)
    record["params_bytes"] = _nbytes(r.params)
    record["grads_bytes"] = grads_held
    record["optimizer_bytes"] = (r.flat.state_bytes() if r.flat is not None else sum(
        _nbytes(v for k, v in st.items() if k != "step") for st in r.opt.state.values())) + \
        (r.flat_e.state_bytes() if r.flat_e is not None else 0)
    if r.device.type == "cuda":
        record["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    record.update(_checkpoint(cfg, r.params, r.flat, r.opt, r.mesh, r.grad_mesh, r.pp_rank, r.out_w))
    if cfg.get("gather"):  # torchrun: rank 0 collects every record (ranks may be on other nodes)
        records = [None] * dist.get_world_size() if r.rank == 0 else None
        dist.gather_object(record, records, dst=0)
        record["all"] = records
    else:
        Path(cfg["out_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(cfg["out_dir"]) / f"rank{r.rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()
    return record


def _process_groups(cfg: dict) -> SimpleNamespace:
    """Start torch.distributed and build the (pp, dp, cp, tp) device mesh (layout.groups' rank
    order, tp fastest): this rank's
    coordinates, the dense-gradient group over dp*cp (Megatron's intra_dp_cp group), the tied
    embedding group, and ``dims`` (process-group name -> the dimension the Instrument names)."""
    from torch.distributed.device_mesh import init_device_mesh
    pp, dp, tp = cfg["pp"], cfg["dp"], cfg["tp"]
    cp = cfg.get("cp", 1)
    device = torch.device(cfg["device"])
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=cfg.get("timeout_s", 120)))
    names = tuple(reversed(groups.ORDERS["megatron"][0]))  # slow -> fast: pp, dp, cp, tp
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    mesh = init_device_mesh(device.type, tuple(sizes[d] for d in names), mesh_dim_names=names)
    r = SimpleNamespace(device=device, mesh=mesh, rank=dist.get_rank(), cp=cp,
                        pp_rank=mesh["pp"].get_local_rank(), dp_rank=mesh["dp"].get_local_rank(),
                        cp_rank=mesh["cp"].get_local_rank(), embd=None,
                        tied=cfg["model"]["tie_embeddings"] and pp > 1)
    r.dims = {mesh.get_group(d).group_name: d for d in ("pp", "dp", "cp", "tp")}
    r.grad_mesh = mesh["dp"] if cp == 1 else mesh["dp", "cp"]._flatten("dp_cp")
    r.grad_group = r.grad_mesh.get_group() if dp * cp > 1 else None
    if r.grad_group is not None:
        if cp > 1 and r.grad_group.group_name in r.dims:
            raise RuntimeError("the flattened dp*cp group aliases another mesh group")
        r.dims[r.grad_group.group_name] = "dp"
    if r.tied:
        r.embd = embedding_groups(sizes)
        r.dims[r.embd.group_name] = "embd"
    return r


def _build(cfg: dict, r: SimpleNamespace) -> None:
    """This rank's model chunks with TP, full recompute and FSDP applied, its experts and the
    optimizers (into ``r``: chunks, moes, comm, params, opt, flat, flat_e)."""
    pp, dp, tp = cfg["pp"], cfg["dp"], cfg["tp"]
    model = build_model(cfg).to(r.device)
    if r.cp > 1:
        set_context_parallel(model, r.mesh.get_group("cp"), r.cp_rank, r.cp)
    if r.tied:  # the last stage keeps its own copy of the word embedding (Megatron, formulas.md 1.3)
        model.head.out.weight = torch.nn.Parameter(model.embed.tok.weight.detach().clone())
    r.chunks = build_chunks(model, r.pp_rank, pp, cfg["vpp"], cfg.get("stage_layers"),
                            v_shape=cfg.get("schedule") in V_SHAPED_SCHEDULES)
    del model
    r.moes, r.comm = _experts(cfg, r.chunks, r.pp_rank, r.dims)
    for _, chunk in r.chunks:
        if tp > 1:
            apply_tp(chunk, r.mesh["tp"], cfg["sp"])
            if cfg["model"]["tie_embeddings"] and pp == 1:  # TP made two parameters: tie again
                chunk.head.out.weight = chunk.embed.tok.weight
        if cfg["recompute"] == "full":
            apply_full_recompute(chunk)
        if dp * r.cp > 1 and cfg["zero"] >= 2:
            apply_fsdp(chunk, r.grad_mesh, cfg["zero"])
    r.params = [p for _, c in r.chunks for p in c.parameters()]
    r.opt, r.flat, r.flat_e = _optimizers(cfg, r.params, r.moes, r.comm, r.grad_group)


def _pipeline(cfg: dict, r: SimpleNamespace) -> None:
    """The pipeline schedule over this rank's chunks (the plan's, by its torch.distributed.
    pipelining class: SCHEDULE_CLASSES; without one, 1F1B or interleaved as vpp implies) and
    the micro-batch count, whether the rank holds the first / last stage, the tied weights; each
    stage records the ops it runs, in order, into ``r.ops`` (_record_ops)."""
    from torch.distributed.pipelining import PipelineStage, schedules
    n_stages = cfg["pp"] * cfg["vpp"]
    r.m = cfg["gbs"] // (cfg["dp"] * cfg["mbs"])
    stages = [PipelineStage(c, sid, n_stages, r.device, group=r.mesh.get_group("pp"))
              for sid, c in r.chunks]
    r.ops = []
    for stage in stages:
        _record_ops(stage, r.ops)
    r.has_first = any(sid == 0 for sid, _ in r.chunks)
    r.has_last = any(sid == n_stages - 1 for sid, _ in r.chunks)
    implied = "ScheduleInterleaved1F1B" if cfg["vpp"] > 1 else "Schedule1F1B"
    cls = getattr(schedules, SCHEDULE_CLASSES.get(cfg.get("schedule"), implied))
    single = cls in (schedules.Schedule1F1B, schedules.ScheduleGPipe)
    r.schedule = cls(stages[0] if single else stages, n_microbatches=r.m, loss_fn=loss_fn)
    r.tok_w = r.chunks[0][1].embed.tok.weight if r.has_first and r.tied else None
    r.out_w = r.chunks[-1][1].head.out.weight if r.has_last and r.tied else None


def _record_ops(stage, ops: list) -> None:
    """Wrap ``stage``'s forward, backward and weight-gradient calls so that each appends
    [kind, stage index, micro-batch] to ``ops`` as it runs: F (forward_one_chunk), B
    (backward_one_chunk, full backward) or I (input gradient only), W
    (backward_weight_one_chunk): the op order that ran, compared with the simulator's
    (validate.schedule_check)."""
    forward, backward, weight = (stage.forward_one_chunk, stage.backward_one_chunk,
                                 stage.backward_weight_one_chunk)

    def fwd(chunk, *args, **kwargs):
        ops.append(["F", stage.stage_index, int(chunk)])
        return forward(chunk, *args, **kwargs)

    def bwd(chunk, loss=None, full_backward=True, last_backward=False):
        ops.append(["B" if full_backward else "I", stage.stage_index, int(chunk)])
        return backward(chunk, loss=loss, full_backward=full_backward, last_backward=last_backward)

    def wgt(chunk, *args, **kwargs):
        ops.append(["W", stage.stage_index, int(chunk)])
        return weight(chunk, *args, **kwargs)
    stage.forward_one_chunk, stage.backward_one_chunk = fwd, bwd
    stage.backward_weight_one_chunk = wgt


def _step(cfg: dict, r: SimpleNamespace, step: int, inst: Instrument, record: dict) -> int:
    """One training step: this rank's rows (and CP columns) of the batch, the schedule, the
    gradient reductions plan3d's Megatron model makes, the optimizer; appends the step's
    measurements to ``record``. Returns the gradient bytes held before the update."""
    cols = cp_positions(r.cp_rank, r.cp, cfg["model"]["seq"]) if r.cp > 1 else slice(None)
    ids, targets = batches(cfg, step)
    rows = slice(r.dp_rank * r.m * cfg["mbs"], (r.dp_rank + 1) * r.m * cfg["mbs"])
    ids, targets = ids[rows][:, cols].to(r.device), targets[rows][:, cols].to(r.device)
    dist.barrier()
    if r.device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    losses: list = []
    with inst:
        inst.reset()
        inst.track_existing(r.params + [p.grad for p in r.params] + _opt_tensors(r.opt, r.flat)
                            + (_opt_tensors(None, r.flat_e) if r.flat_e else []))
        baseline = inst.live
        r.ops.clear()
        with SavedBytes() as saved:
            r.schedule.step(*((ids,) if r.has_first else ()),
                            target=targets if r.has_last else None, losses=losses)
        record["ops"] = list(r.ops)  # the last step's
        grads_held = _reduce_and_update(cfg, r)
    if r.device.type == "cuda":
        torch.cuda.synchronize()
    record["step_s"].append(time.perf_counter() - t0)
    record["comm"].append(inst.snapshot())
    record["live_baseline"].append(baseline)
    record["live_peak"].append(inst.peak)
    record["saved_peak"].append(saved.peak)
    record["recompute_tracked"] = saved.recompute_tracked
    record["moe_counts"].append([mod.records[:] for mod in r.moes])
    for mod in r.moes:
        mod.records.clear()
    if r.has_last:
        record["losses"].append(sum(float(x.detach()) for x in losses) / len(losses))
    return grads_held


def _reduce_and_update(cfg: dict, r: SimpleNamespace) -> int:
    """The gradient reductions outside the schedule (partial TP gradients, the tied embedding
    between first and last stage, replicated routers over TP) and the optimizer step; returns
    the gradient bytes held before it."""
    reduce_partial_grads(r.params)
    if r.tied:  # all-reduce the two copies' gradients between first and last stage
        w = r.tok_w if r.tok_w is not None else r.out_w
        dist.all_reduce(local(w.grad), group=r.embd)
    if cfg["tp"] > 1:  # replicated router weights see only this rank's sequence shard
        for mod in r.moes:
            for p in mod.router.parameters():
                dist.all_reduce(p.grad, group=r.mesh.get_group("tp"))
    grads_held = _nbytes(p.grad for p in r.params)
    if r.flat_e is not None:
        r.flat_e.step()
    if r.flat is not None:
        r.flat.step()
    else:
        r.opt.step()
    for p in r.params:
        p.grad = None
    return grads_held


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
