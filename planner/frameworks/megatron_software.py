"""Megatron-Core's software switches for a plan: the layout's software axes (layout.axes, role
"software") and the TrainingSpec's token dropping, as one description both Megatron-Core
exports render (Megatron-LM flags in megatron_model, Megatron-Bridge fields in nemo_model).

Sources: NVIDIA/Megatron-LM @ d98e8a64ddf3 (2026-08-22) megatron/training/arguments.py = ARGS,
megatron/core/transformer/transformer_config.py = TC, megatron/core/transformer/moe/
token_dispatcher.py = TD; NVIDIA-NeMo/Megatron-Bridge @ 067f987df03b = MB. Every flag below is
also in Megatron-LM's latest release, core_v0.19.0 (2026-08-19): its parser's option strings and
choices were read by building the parser of that tag (add_megatron_arguments); before
core_v0.18 there is no --cuda-graph-modules (the per-layer modules were --cuda-graph-scope) and
no --cuda-graph-impl full_iteration (it was --cuda-graph-impl local --cuda-graph-scope
full_iteration), which a comment says.

Mapping (plan -> Megatron-LM flag -> Megatron-Bridge field):
  layout tp_comm_overlap      --tp-comm-overlap (Transformer Engine userbuffers with TE's default
                              per-GEMM settings, which the estimate costs; ARGS L1441-1442: it
                              needs --sequence-parallel)      comm_overlap.tp_comm_overlap (always
                              written: a recipe may turn it on; MB training/comm_overlap.py L384)
  layout moe_dispatcher       alltoall | allgather: --moe-token-dispatcher-type alltoall |
                              allgather; deepep | hybridep: --moe-token-dispatcher-type flex
                              --moe-flex-dispatcher-backend deepep | hybridep (TC L891-902)
                                                    model.moe_token_dispatcher_type (+
                                                    model.moe_flex_dispatcher_backend for flex)
  layout moe_a2a_overlap      --overlap-moe-expert-parallel-comm --delay-wgrad-compute
                              (TC L3002-3082)       comm_overlap.overlap_moe_expert_parallel_comm,
                                                    comm_overlap.delay_wgrad_compute and
                                                    model.moe_shared_expert_overlap false, as
                                                    MB scripts/performance/utils/overrides.py
                                                    L189-197 sets them (providers such as
                                                    DeepSeek-V3's turn shared-expert overlap on,
                                                    which TC L3039-3041 refuses beside it)
  layout cuda_graphs layers   --cuda-graph-impl transformer_engine --cuda-graph-modules M...
                              with M = attn; + mlp where some layer is dense; + moe for a
                              drop-and-pad MoE, else moe_router moe_preprocess (a dropless MoE
                              graphs its static part only: docs/user-guide/features/
                              cuda_graph.md L159-168; TC L2815-2851: moe only with
                              drop-and-pad, mlp only with a dense layer, moe_preprocess only
                              with moe_router); with the EP overlap neither mlp nor moe
                              (TC L3063-3071), with fine-grained activation offload no moe
                              (TC L2960-2962): a comment says they run eagerly (and, for the
                              offload, that the estimate graphed them)
                                                    model.cuda_graph_impl, model.cuda_graph_modules
                                                    and model.cuda_graph_scope null (what MB
                                                    utils/cuda_graph.py set_cuda_graph_modules
                                                    does: the two cannot be set together, TC
                                                    L2716-2721)
  layout cuda_graphs          --cuda-graph-impl full_iteration --no-check-for-nan-in-loss-and-grad
    full_iteration            (ARGS L1235-1237)     model.cuda_graph_impl full_iteration,
                                                    model.cuda_graph_modules [], scope null
                                                    (set_full_iteration_cuda_graph) and
                                                    rerun_state_machine.check_for_nan_in_loss
                                                    false (MB training/config.py L1508-1513)
  graphs (either)             --te-rng-tracker (ARGS L1954-1960 turns it on with a warning)
                                                    rng.te_rng_tracker true (MB config.py
                                                    L1415-1416 sets model.use_te_rng_tracker too)
  training moe_capacity_factor F
                              --moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity
                              --moe-token-drop-policy probs (TC L917-938; probs is the default)
                                                    model.moe_expert_capacity_factor,
                                                    model.moe_pad_expert_input_to_capacity,
                                                    model.moe_token_drop_policy (written for
                                                    every MoE model: null / false when dropless)

Refused (UsageError) where Megatron-Core refuses what the plan's rules let through: DeepEP over
one expert rank (TD L1836); DeepEP with padding to capacity (TC L1754-1761); graphs beside
selective recomputation of core attention with attention dropout (TC L2878-2885); the EP
overlap with per-layer graphs under Megatron-FSDP (core/distributed/fsdp/mcore_fsdp_adapter.py
L182-187); the EP overlap with graphed attention that has biases (ARGS L1924-1927).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost.checkpoint import MEGATRON_FSDP_STRATEGY
from ..cost.comm import TP_OVERLAP_SMS, a2a_overlap_applies
from ..cost.model_counts import has_dense_mlp
from ..errors import UsageError
from ..plan import Plan

# plan3d's dispatcher -> (--moe-token-dispatcher-type, --moe-flex-dispatcher-backend)
DISPATCHER = {"alltoall": ("alltoall", None), "allgather": ("allgather", None),
              "deepep": ("flex", "deepep"), "hybridep": ("flex", "hybridep")}
# plan3d's CUDA-graph scope -> --cuda-graph-impl
GRAPH_IMPL = {"none": "none", "layers": "transformer_engine", "full_iteration": "full_iteration"}


@dataclass(frozen=True)
class Software:
    """Megatron-Core's switches for one plan (megatron_software): ``tp_comm_overlap``;
    ``dispatcher_type`` / ``flex_backend`` (None for a dense model / a dispatcher other than
    flex); ``a2a_overlap``; ``graph_impl`` and ``graph_modules`` (the per-layer modules of
    transformer_engine graphs); ``capacity_factor`` (None: dropless; else padded to capacity);
    ``comments``: what the export says about them."""

    tp_comm_overlap: bool
    dispatcher_type: str | None
    flex_backend: str | None
    a2a_overlap: bool
    graph_impl: str
    graph_modules: tuple[str, ...]
    capacity_factor: float | None
    comments: list[str] = field(default_factory=list)


def ep_overlap(plan: Plan) -> bool:
    """Whether the plan runs Megatron-Core's EP communication overlap: the layout's
    moe_a2a_overlap on an MoE model where it applies (ep > 1, no full recompute, pp = 1 or
    interleaving: cost.comm.a2a_overlap_applies, the cost model's condition; the software rules
    refuse it elsewhere, search.software_rules)."""
    lay = plan.layout
    return bool(lay.moe_a2a_overlap and plan.model.moe is not None and a2a_overlap_applies(lay))


def check_deepep(plan: Plan) -> None:
    """UsageError where Megatron-Core refuses the flex dispatcher's DeepEP backend: over a single
    rank, MoEFlexTokenDispatcher asserts "DeepEP dispatcher requires TPxEP > 1" (TD L1836, TP
    being the expert tensor-parallel group, L86-89: etp x ep must exceed 1; HybridEP has no such
    assertion, L1845-1851); with padding to capacity TransformerConfig raises (TC L1754-1761)."""
    lay, cf = plan.layout, plan.training.moe_capacity_factor
    if lay.etp * lay.ep == 1:
        raise UsageError("Megatron-Core refuses the flex dispatcher's DeepEP backend here: "
                         "\"DeepEP dispatcher requires TPxEP > 1\" (token_dispatcher.py L1836, TP "
                         f"being the expert TP); the plan has etp={lay.etp} ep={lay.ep}: plan "
                         "with --moe-dispatcher alltoall or hybridep, or a layout with ep > 1")
    if cf is not None:
        raise UsageError("Megatron-Core refuses the DeepEP dispatcher with token dropping padded to "
                         "capacity (\"Flex token dispatcher with deepep backend does not support "
                         "moe_pad_expert_input_to_capacity\", transformer_config.py L1754-1761); the "
                         f"plan has --moe-capacity-factor {cf:g}: plan with --moe-dispatcher "
                         "alltoall or hybridep")


def graph_modules(plan: Plan) -> tuple[tuple[str, ...], list[str]]:
    """(--cuda-graph-modules of the plan's per-layer graphs, comments) for layout cuda_graphs
    "layers" (module docstring); ((), []) otherwise."""
    model, lay, tr = plan.model, plan.layout, plan.training
    if lay.cuda_graphs != "layers":
        return (), []
    overlap = ep_overlap(plan)
    offload = model.moe is not None and tr.moe_activation_offload
    drop_pad = model.moe is not None and tr.moe_capacity_factor is not None
    modules = ["attn"]
    left: list[str] = []
    if has_dense_mlp(model):
        (left if overlap else modules).append("mlp")
    if model.moe is not None:
        if drop_pad and not (overlap or offload):
            modules.append("moe")
        else:
            modules += ["moe_router", "moe_preprocess"]
            if drop_pad:
                left.append("moe")
    comments = [f"CUDA graphs: Transformer Engine graphs of each layer's {' '.join(modules)} "
                "(transformer_config.py L1075-1106)"
                + ("; a dropless MoE graphs its router and preprocessing only, its experts run "
                   "eagerly after the host sync (cuda_graph.md L159-168)"
                   if model.moe is not None and not drop_pad else "")]
    if left:
        why = ("the EP overlap refuses mlp and moe graphs (transformer_config.py L3063-3071)"
               if overlap else "fine-grained activation offload refuses the moe graph "
               "(transformer_config.py L2960-2962)")
        comments.append(f"CUDA graphs: {why}, so the {' and '.join(left)} blocks run eagerly; "
                        + ("the estimate timed them so (cost/host.py block_ops)" if overlap else
                           "the estimate graphed them, so host time may be higher than estimated"))
    return tuple(modules), comments


def _check_graphs(plan: Plan) -> None:
    """UsageError for graph combinations Megatron-Core refuses that the plan's rules do not."""
    model, lay = plan.model, plan.layout
    if lay.cuda_graphs == "none":
        return
    if lay.recompute == "selective" and model.dropout > 0:
        raise UsageError(
            "Megatron-Core refuses CUDA graphs beside selective recomputation of core attention "
            f"when attention dropout is set (\"attention dropout is not supported with graphed "
            f"attention recomputation\", transformer_config.py L2878-2885); {model.name} has "
            f"dropout {model.dropout:g}: plan with --cuda-graphs none or another --recompute")
    if lay.cuda_graphs != "layers" or not ep_overlap(plan):
        return
    if lay.zero_stage in MEGATRON_FSDP_STRATEGY:
        raise UsageError(
            "Megatron-Core refuses the EP overlap with per-layer CUDA graphs under Megatron-FSDP "
            "(\"1F1B overlap with FSDP does not support per-layer CUDA graphs\", "
            "core/distributed/fsdp/mcore_fsdp_adapter.py L182-187); the plan has ZeRO-"
            f"{lay.zero_stage}: plan with --cuda-graphs none or full_iteration, or "
            "--no-moe-a2a-overlap")
    if model.bias or model.qkv_bias:
        raise UsageError(
            "Megatron-LM refuses the EP overlap (--delay-wgrad-compute) with graphed attention "
            f"that has biases (arguments.py L1924-1927); {model.name} has attention biases: plan "
            "with --cuda-graphs none or --no-moe-a2a-overlap")


def megatron_software(plan: Plan, target: str = "megatron") -> Software:
    """The plan's Megatron-Core software (Software), its comments in the words of ``target``
    (megatron: Megatron-LM's flags; nemo: Megatron-Bridge's fields), or UsageError where
    Megatron-Core refuses it (module docstring). The rules every consumer applies (search.software_rules: TP overlap
    needs SP and one host, no MLA; the EP overlap's layout; graphs with full recompute or
    offload; the dispatchers the framework runs) are checked before (framework_rules.check_plan)."""
    model, lay, tr = plan.model, plan.layout, plan.training
    moe = model.moe is not None
    dispatcher_type, backend = DISPATCHER[lay.moe_dispatcher] if moe else (None, None)
    if moe and lay.moe_dispatcher == "deepep":
        check_deepep(plan)
    _check_graphs(plan)
    modules, comments = graph_modules(plan)
    software = Software(bool(lay.tp_comm_overlap),
                        dispatcher_type, backend, ep_overlap(plan),
                        GRAPH_IMPL[lay.cuda_graphs], modules,
                        tr.moe_capacity_factor if moe else None, comments)
    comments += _comments(plan, software, target)
    return software


def _comments(plan: Plan, sw: Software, target: str) -> list[str]:
    """What the export for ``target`` says about the switches beside the graph modules."""
    lay, hw, bridge = plan.layout, plan.hardware, target == "nemo"
    out: list[str] = []
    if sw.tp_comm_overlap:
        tuned = ("a recipe's comm_overlap.tp_comm_overlap_cfg preset (training/comm_overlap.py "
                 "L97-350), kept where the recipe sets one," if bridge else
                 "a tuned --tp-comm-overlap-cfg YAML (Megatron-Bridge's presets)")
        out.append("TP communication overlap: Transformer Engine userbuffers with TE's default "
                   "per-GEMM settings, as the estimate assumed (the reduce-scatter after each "
                   f"row-parallel GEMM pipelined on {TP_OVERLAP_SMS} SMs, the all-gathers by ring exchange); "
                   f"{tuned} changes them")
    if sw.flex_backend is not None:
        offered = getattr(hw.moe_dispatch, "backends", None) or []
        if sw.flex_backend not in offered:
            out.append(f"dispatcher: the hardware profile {hw.name} does not list {sw.flex_backend} "
                       f"(moe_dispatch.backends: {', '.join(offered) or 'none'}); check that the "
                       "cluster and container have it (Megatron-Bridge falls back to alltoall or "
                       "refuses on GPUs its gate rejects, flex_dispatcher_backend.py)")
    if sw.graph_impl == "full_iteration":
        out.append("CUDA graphs: one graph of each step's forward and backward ("
                   + ("cuda_graph_impl full_iteration, which needs rerun_state_machine."
                      "check_for_nan_in_loss false: training/config.py L1508-1513; Bridge before "
                      "v0.5 takes cuda_graph_impl local with cuda_graph_scope [full_iteration])"
                      if bridge else
                      "--cuda-graph-impl full_iteration, which needs --no-check-for-nan-in-loss-"
                      "and-grad: arguments.py L1235-1237; Megatron-LM before core_v0.18 spells it "
                      "--cuda-graph-impl local --cuda-graph-scope full_iteration)"))
    elif sw.graph_impl == "transformer_engine":
        out.append(("CUDA graphs: Megatron-Bridge before v0.5 (its Megatron-Core before the "
                    "rename) takes model.cuda_graph_scope for cuda_graph_modules" if bridge else
                    "CUDA graphs: Megatron-LM before core_v0.18 spells --cuda-graph-modules as "
                    "--cuda-graph-scope")
                   + "; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True set "
                   "NCCL_GRAPH_REGISTER=0 (arguments.py L1961-1967)")
    if sw.capacity_factor is not None:
        out.append(f"token dropping: each expert takes capacity factor {sw.capacity_factor:g} x "
                   "its balanced share of each rank's tokens, padded to that capacity "
                   "(drop-and-pad, as the estimate assumed); the router's load balancing must be "
                   "aux_loss, seq_aux_loss, global_aux_loss or none (transformer_config.py "
                   "L1836-1860)")
    if sw.a2a_overlap and bridge:
        out.append("EP overlap: comm_overlap.delay_wgrad_compute needs Transformer Engine >= 2.7 "
                   "with overlap_grad_reduce or gradient accumulation fusion (training/"
                   "comm_overlap.py L520-531); model.moe_shared_expert_overlap false, as "
                   "Megatron-Core refuses it beside the overlap (transformer_config.py L3039-3041)")
    elif sw.a2a_overlap:
        out.append("EP overlap: --delay-wgrad-compute needs Transformer Engine (>= 2.8 with "
                   "--overlap-grad-reduce; arguments.py L1903-1908)")
    if sw.a2a_overlap and lay.cuda_graphs == "layers":
        out.append("EP overlap with graphed attention: delayed weight gradients need Transformer "
                   "Engine >= 2.12 and gradient accumulation fusion (arguments.py L1915-1923)")
    return out
