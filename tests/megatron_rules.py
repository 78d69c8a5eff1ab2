"""Megatron-LM's own argument validation for MoE, expert parallelism, MLA, MTP and windows,
ported as a test helper that runs on exported arguments (facts only: each rule cites where
Megatron-LM enforces it, NVIDIA/Megatron-LM commit d98e8a64ddf3 2026-08-22).

``parse(text)`` reads an exported argument list the way a shell and Megatron's parser would
(shlex, then the parser's type functions for the pattern and tuple options); ``validate(args,
world)`` applies the rules and raises MegatronRejects naming the rule and its source line.
"""

from __future__ import annotations

import re
import shlex


class MegatronRejects(AssertionError):
    """Megatron-LM would refuse these arguments (message: the rule and where it is)."""


def eval_pattern(text: str):
    """megatron/training/arguments.py L245-253 ``_eval_pattern``: only , digits [ ] ( ) + * are
    allowed, then the string is evaluated as a Python expression."""
    if re.search(r"[^,\d\[\]\(\)\+\*]", text):
        raise MegatronRejects(f"arguments.py L250: invalid pattern {text!r}")
    return eval(text)  # noqa: S307 - the same restricted evaluation Megatron does


def freq_type(text: str):
    """arguments.py L327-347 ``moe_freq_type``: a list expression if it has '[', else an int."""
    return eval_pattern(text) if "[" in text else int(text)


def tuple_type(text: str) -> tuple[int, ...]:
    """arguments.py L377-387 ``tuple_type``: "a,b" or "(a,b)" -> (a, b)."""
    return tuple(int(i) for i in text.strip("()").split(","))


# options that take several values (nargs='+'): --offload-modules (transformer_config.py
# offload_modules: list[str]), --recompute-modules, --cuda-graph-modules (arguments.py L2050)
NARGS = {"offload_modules", "recompute_modules", "cuda_graph_modules"}


def parse(text: str) -> dict[str, object]:
    """{dest: value} of an exported argument list; store_true flags are True."""
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    tokens = shlex.split(body.replace("\\\n", " "))  # a shell joins continued lines
    out: dict[str, object] = {}
    i = 0
    while i < len(tokens):
        flag = tokens[i]
        assert flag.startswith("--"), flag
        value: object = True
        dest = flag[2:].replace("-", "_")
        if dest in NARGS:  # nargs='+': every value up to the next flag
            values = []
            while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                values.append(tokens[i + 1])
                i += 1
            out[dest] = values
            i += 1
            continue
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
            i += 1
        if dest in ("moe_layer_freq", "window_attn_skip_freq"):
            value = freq_type(value)
        elif dest == "window_size":
            value = tuple_type(value)
        out[dest] = value
        i += 1
    return out


def _int(args, key, default):
    return int(args.get(key, default))


def _fail(where: str, what: str) -> None:
    raise MegatronRejects(f"{where}: {what}")


def _parallel_rules(a: dict, world: int) -> tuple[int, int, int, int, int]:
    tp, pp = _int(a, "tensor_model_parallel_size", 1), _int(a, "pipeline_model_parallel_size", 1)
    cp, ep = _int(a, "context_parallel_size", 1), _int(a, "expert_model_parallel_size", 1)
    # arguments.py L587-588: ETP defaults to TP
    etp = _int(a, "expert_tensor_parallel_size", tp)
    if world % (tp * pp * cp):
        _fail("parallel_state.py L822-823", f"world {world} not divisible by tp*pp*cp")
    if world % (etp * ep * pp):
        _fail("parallel_state.py L881-885", f"world {world} not divisible by etp*ep*pp")
    sp = bool(a.get("sequence_parallel")) and tp > 1  # arguments.py L1433-1439: off at tp 1
    experts = a.get("num_experts")
    if ep > 1:  # arguments.py L1655-1658; transformer_config.py L1595-1596
        if experts is None:
            _fail("arguments.py L1656", "num_experts must be non None to use expert parallelism")
        if int(experts) % ep:
            _fail("arguments.py L1657", "Number of experts should be a multiple of ep")
    if experts is not None and tp > 1 and not sp:
        _fail("moe/moe_layer.py L636-640", "MoE training with TP > 1 needs sequence parallelism")
    return tp, pp, cp, ep, etp


def _moe_rules(a: dict, etp: int, layers: int) -> None:
    if a.get("num_experts") is None:
        for k in ("moe_layer_freq", "moe_router_topk", "moe_ffn_hidden_size"):
            if k in a and k != "moe_layer_freq":
                _fail("transformer_config.py", f"--{k} without --num-experts")
        return
    if int(a["num_experts"]) <= 0:
        _fail("transformer_config.py L1682-1683", "num_moe_experts must be positive")
    if not a.get("disable_bias_linear") and etp != 1:  # add_bias_linear defaults to True
        _fail("transformer_config.py L2612-2615", "Bias in MoE is only supported when ETP==1")
    topk = _int(a, "moe_router_topk", 2)
    score = a.get("moe_router_score_function", "softmax")
    if topk == 1 and score == "softmax" and not a.get("moe_router_pre_softmax"):
        _fail("transformer_config.py L2661-2669", "Please use --moe-router-pre-softmax when topk is 1")
    if topk > int(a["num_experts"]):
        _fail("router", "moe_router_topk larger than num_experts")
    freq = a.get("moe_layer_freq", 1)
    if isinstance(freq, list):  # gpt_layer_specs.py L650-656
        if len(freq) != layers or set(freq) - {0, 1}:
            _fail("gpt_layer_specs.py L652", f"moe_layer_freq pattern of {len(freq)} != {layers} layers")
    shared = a.get("moe_shared_expert_intermediate_size")
    if shared is not None and int(shared) <= 0:
        _fail("transformer_config.py L1813-1819", "shared expert size must be positive")


def _attention_rules(a: dict, layers: int) -> None:
    mla = bool(a.get("multi_latent_attention"))
    if mla and a.get("group_query_attention"):  # arguments.py L1973-1974
        _fail("arguments.py L1974", "Group query attention is mutually exclusive with MLA")
    rope_type = a.get("rope_type")
    if rope_type is not None and not mla and rope_type != "rope":  # argument_utils.py L339-341
        _fail("argument_utils.py L339", "common attention only supports rope_type rope")
    fusion = not a.get("no_rope_fusion")  # arguments.py L2902-2905: --no-rope-fusion stores False
    if a.get("position_embedding_type", "learned_absolute") != "rope":
        fusion = False  # arguments.py L1628-1629
    if mla and fusion and (rope_type or "yarn") != "yarn":  # MLATransformerConfig default yarn
        _fail("transformer_config.py L3345-3346", "apply_rope_fusion for MLA only works with YARN RoPE")
    if a.get("mtp_num_layers") and a.get("position_embedding_type", "learned_absolute") not in (
            "learned_absolute", "rope", "mrope", "none"):  # arguments.py L1942-1948
        _fail("arguments.py L1944", "MTP needs a position embedding that uses position ids")
    skip = a.get("window_attn_skip_freq")
    if skip is not None and a.get("window_size") is None:
        _fail("transformer/utils.py L536", "--window-attn-skip-freq without --window-size")
    if isinstance(skip, list) and len(skip) != layers:  # utils.py L541: indexed by layer number
        _fail("transformer/utils.py L541-542", f"window pattern of {len(skip)} != {layers} layers")


def _job_rules(a: dict, pp: int, ep: int) -> None:
    """Dispatcher, EP overlap, offloading and cross-entropy fusion."""
    dispatcher = a.get("moe_token_dispatcher_type", "allgather")  # transformer_config.py L891
    if dispatcher not in ("allgather", "alltoall", "flex"):
        _fail("arguments.py", f"--moe-token-dispatcher-type {dispatcher} is not a choice")
    backend = a.get("moe_flex_dispatcher_backend", "deepep")
    if backend not in ("deepep", "hybridep", "ncclep"):  # transformer_config.py L898
        _fail("transformer_config.py L898", f"unknown flex backend {backend}")
    if a.get("moe_enable_deepep") and dispatcher != "flex":
        _fail("transformer_config.py L1744-1745", "DeepEP needs the flex dispatcher")
    if a.get("overlap_moe_expert_parallel_comm"):  # transformer_config.py L3002-3046
        layout = a.get("pipeline_model_parallel_layout")  # its stages / pp = vpp (arguments.py L950)
        if pp > 1 and "num_layers_per_virtual_pipeline_stage" not in a and \
                "num_virtual_stages_per_pipeline_rank" not in a and \
                (layout is None or len(layout_stages(str(layout))) <= pp):
            _fail("transformer_config.py L3007-3011", "EP overlap with pp > 1 needs interleaving")
        if ep <= 1:
            _fail("transformer_config.py L3013-3015", "EP overlap needs expert parallelism")
        if dispatcher not in ("alltoall", "flex"):
            _fail("transformer_config.py L3016-3019", "EP overlap needs alltoall/flex")
        if a.get("recompute_granularity") == "full" or a.get("recompute_method") or \
                a.get("recompute_num_layers"):
            _fail("transformer_config.py L3021-3029", "EP overlap without full recomputation")
        if "moe" in (a.get("recompute_modules") or []):
            _fail("transformer_config.py L3030-3032", "EP overlap with moe in recompute_modules")
        if not (a.get("bf16") or a.get("fp16")):
            _fail("transformer_config.py L3035-3037", "EP overlap needs bf16 or fp16")
        if a.get("moe_shared_expert_overlap"):
            _fail("transformer_config.py L3039-3041", "EP overlap with moe_shared_expert_overlap")
        if int(a.get("mtp_num_layers", 0) or 0) > 1:
            _fail("transformer_config.py L3042-3046", "EP overlap with more than one MTP layer")
    if a.get("delay_wgrad_compute") and not a.get("overlap_moe_expert_parallel_comm"):
        _fail("transformer_config.py L3074-3077", "--delay-wgrad-compute needs the EP overlap")
    if a.get("optimizer_cpu_offload"):  # arguments.py L1884-1891
        if not a.get("use_precision_aware_optimizer"):
            _fail("arguments.py L1885", "optimizer CPU offload needs --use-precision-aware-optimizer")
        if a.get("fp8_param_gather") and a.get("fp8_recipe") != "delayed":
            _fail("arguments.py L1888-1891", "optimizer CPU offload with --fp8-param-gather")
        fraction = float(a.get("optimizer_offload_fraction", 0.0))
        if not 0.0 <= fraction <= 1.0:
            _fail("optimizer_config.py L350", "offload fraction out of [0, 1]")
    for name in ("exp_avg_dtype", "exp_avg_sq_dtype"):  # optimizer_config.py L470-480
        if a.get(name, "fp32") != "fp32" and not a.get("use_precision_aware_optimizer"):
            _fail("optimizer_config.py L476-477", f"{name} not fp32 without the precision-aware optimizer")
    if a.get("fine_grained_activation_offloading"):  # transformer_config.py L2127-2147
        modules = a.get("offload_modules") or []
        allowed = {"core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act",
                   "attn_norm", "mlp_norm", "qkv_linear", "gdp_qkv"}
        if a.get("cpu_offloading_num_layers"):
            _fail("transformer_config.py L2128-2130", "fine-grained offloading with cpu_offloading")
        if not modules or set(modules) - allowed:
            _fail("transformer_config.py L2131-2147", f"offload_modules {modules}")
    if a.get("cross_entropy_loss_fusion") and a.get("cross_entropy_fusion_impl") == "te":
        _fail("arguments.py L1697-1702", "TE cross entropy loss fusion is disabled")


# the parser's choices (arguments.py: --cuda-graph-impl from transformer_config.py L1075;
# --cuda-graph-modules through _parse_cuda_graph_modules_arg, L256-260: CudaGraphModule names,
# core/transformer/enums.py)
GRAPH_IMPLS = {"none", "local", "transformer_engine", "full_iteration"}
GRAPH_MODULES = {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"}


def _all_moe(a: dict) -> bool:
    """Every layer MoE: --moe-layer-freq 1 (the default) or a list without a 0."""
    freq = a.get("moe_layer_freq", 1)
    return freq == 1 or (isinstance(freq, list) and 0 not in freq)


def _software_rules(a: dict) -> None:
    """TP communication overlap, token dropping, the flex backend and CUDA graphs."""
    tp = _int(a, "tensor_model_parallel_size", 1)
    if a.get("tp_comm_overlap") and not (a.get("sequence_parallel") and tp > 1):
        _fail("arguments.py L1441-1442", "--tp-comm-overlap needs sequence parallelism (off at tp 1)")
    cf = a.get("moe_expert_capacity_factor")
    pad = bool(a.get("moe_pad_expert_input_to_capacity"))
    if pad and cf is None:
        _fail("transformer_config.py L1862-1866", "padding to capacity needs a capacity factor")
    if cf is not None and a.get("moe_router_load_balancing_type", "aux_loss") not in (
            "aux_loss", "seq_aux_loss", "global_aux_loss", "none"):
        _fail("transformer_config.py L1836-1860", "capacity factor with this load balancing")
    if a.get("moe_token_drop_policy", "probs") not in ("probs", "position"):
        _fail("arguments.py", "--moe-token-drop-policy is not a choice")
    flex = a.get("moe_token_dispatcher_type") == "flex"
    if flex and pad and a.get("moe_flex_dispatcher_backend", "deepep") == "deepep":
        _fail("transformer_config.py L1754-1761", "DeepEP does not pad to capacity")
    impl = a.get("cuda_graph_impl", "none")
    modules = a.get("cuda_graph_modules") or []
    if impl not in GRAPH_IMPLS:
        _fail("arguments.py", f"--cuda-graph-impl {impl} is not a choice")
    if set(modules) - GRAPH_MODULES:
        _fail("arguments.py L256-260", f"--cuda-graph-modules {modules}")
    if impl == "none":
        return
    if impl == "full_iteration":
        if modules:
            _fail("arguments.py L1969-1971", "full_iteration graphs take no modules")
        if not a.get("no_check_for_nan_in_loss_and_grad"):
            _fail("arguments.py L1235-1237", "full_iteration needs --no-check-for-nan-in-loss-and-grad")
    if a.get("cpu_offloading_num_layers") and impl != "full_iteration":
        _fail("transformer_config.py L2800-2801", "CUDA graphs with CPU offloading")
    per_layer = impl in ("local", "transformer_engine")
    experts = a.get("num_experts")
    if per_layer:
        if "moe" in modules and "moe_router" in modules:
            _fail("transformer_config.py L2817-2820", "moe and moe_router graphs together")
        if "moe_preprocess" in modules and "moe_router" not in modules:
            _fail("transformer_config.py L2821-2824", "moe_preprocess without moe_router")
        if experts is None and {"moe", "moe_router"} & set(modules):
            _fail("transformer_config.py L2825-2829", "moe graphs without experts")
        if experts is not None and _all_moe(a) and "mlp" in modules:
            _fail("transformer_config.py L2831-2836", "mlp graphs without a dense layer")
        if experts is not None and (cf is None or not pad):
            if "moe" in modules:
                _fail("transformer_config.py L2838-2844", "moe graphs need drop-and-pad")
            if a.get("moe_token_dispatcher_type", "allgather") == "alltoall" and cf is not None \
                    and "moe_preprocess" in modules:
                _fail("transformer_config.py L2845-2851", "moe_preprocess graphs with a host sync")
    granularity = a.get("recompute_granularity")
    if granularity == "full" and impl != "full_iteration":
        _fail("transformer_config.py L2855-2858", "full recompute needs full_iteration graphs")
    if granularity == "selective" and float(a.get("attention_dropout", 0.1)) != 0.0:
        whole = impl == "full_iteration" or not modules
        if (whole or "attn" in modules) and "core_attn" in (a.get("recompute_modules") or ["core_attn"]):
            _fail("transformer_config.py L2878-2885", "attention dropout with graphed attention recompute")
    if a.get("overlap_moe_expert_parallel_comm") and impl == "transformer_engine" and \
            {"moe", "mlp"} & set(modules):
        _fail("transformer_config.py L3063-3071", "EP overlap with moe or mlp graphs")
    if a.get("overlap_moe_expert_parallel_comm") and a.get("use_megatron_fsdp") and per_layer:
        _fail("core/distributed/fsdp/mcore_fsdp_adapter.py L182-187", "EP overlap, FSDP, layer graphs")
    if a.get("delay_wgrad_compute") and "attn" in modules:
        if a.get("no_gradient_accumulation_fusion"):
            _fail("arguments.py L1919-1923", "graphed delayed wgrad needs gradient accumulation fusion")
        if not a.get("disable_bias_linear") or a.get("add_qkv_bias"):
            _fail("arguments.py L1924-1927", "graphed delayed wgrad with attention bias")
    if a.get("fine_grained_activation_offloading") and "moe" in modules:
        _fail("transformer_config.py L2960-2962", "token-drop MoE graphs with activation offloading")


def layout_stages(text: str) -> list[list[str]]:
    """megatron/core/transformer/pipeline_parallel_layer_layout.py ``parse_str_to_list``: stages
    split at "|", each a run of E / t / m / L letters, "x*n" repeating x n times, "(..)*n" a
    group; letters lower-cased to LayerType names (E embedding, t decoder, m mtp, L loss)."""
    while "(" in text:  # (tt|)*30 -> tt|tt|...
        text = re.sub(r"\(([^()]*)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    text = re.sub(r"([EtmL])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    if re.search(r"[^EtmL|]", text):
        _fail("pipeline_parallel_layer_layout.py", f"not a layer type in {text!r}")
    return [list(stage) for stage in text.split("|")]


def _layout_rules(a: dict, pp: int, layers: int) -> None:
    """arguments.py L927-951: at most one of the vpp arguments and the layout, the layout's
    stage count divisible by pp; transformer_config.py L2242-2259: no other split argument
    beside it; pipeline_parallel_layer_layout.py L86-151: the embedding first and once, the
    loss last and once, num_layers decoder layers, mtp_num_layers MTP layers after them."""
    given = [k for k in ("num_layers_per_virtual_pipeline_stage", "num_virtual_stages_per_pipeline_rank",
                         "pipeline_model_parallel_layout") if k in a]
    if len(given) > 1:
        _fail("arguments.py L927-939", f"more than one of {given}")
    text = a.get("pipeline_model_parallel_layout")
    if text is None:
        return
    if any(k in a for k in ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                            "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")):
        _fail("transformer_config.py L2251-2259", "the layout with other pipeline layout arguments")
    stages = layout_stages(str(text))
    if len(stages) % pp:
        _fail("arguments.py L945-949", f"{len(stages)} stages not divisible by pp={pp}")
    flat = [x for s in stages for x in s]
    mtp = _int(a, "mtp_num_layers", 0)
    if flat[:1] != ["E"] or flat[-1:] != ["L"] or flat.count("E") != 1 or flat.count("L") != 1:
        _fail("pipeline_parallel_layer_layout.py L96-113", "embedding first and loss last, once each")
    if flat.count("t") != layers or flat.count("m") != mtp:
        _fail("pipeline_parallel_layer_layout.py L107-118", f"{flat.count('t')} decoder and "
              f"{flat.count('m')} MTP layers for {layers} and {mtp}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        _fail("pipeline_parallel_layer_layout.py L119-124", "decoder layers after an MTP layer")


def validate(args: dict, world: int) -> None:
    """Raise MegatronRejects if Megatron-LM (d98e8a64) refuses ``args`` on ``world`` GPUs."""
    _tp, pp, _cp, ep, etp = _parallel_rules(args, world)
    _job_rules(args, pp, ep)
    _software_rules(args)
    layers = _int(args, "num_layers", 0)
    _layout_rules(args, pp, layers)
    if "decoder_first_pipeline_num_layers" not in args and not args.get(
            "account_for_embedding_in_pipeline_split") and \
            "pipeline_model_parallel_layout" not in args and layers % pp:
        _fail("transformer_config.py", f"{layers} layers not divisible by pp={pp}")
    _moe_rules(args, etp, layers)
    _attention_rules(args, layers)


def window_layers(args: dict, layers: int) -> list[bool]:
    """Per 0-based layer: windowed? (megatron/core/transformer/utils.py L532-546, 1-based numbers)."""
    skip = args.get("window_attn_skip_freq")
    if args.get("window_size") is None:
        return [False] * layers
    if skip is None:
        return [True] * layers
    if isinstance(skip, int):
        return [(i + 1) % skip != 0 for i in range(layers)]
    return [bool(skip[i]) for i in range(layers)]


def moe_layers(args: dict, layers: int) -> list[bool]:
    """Per 0-based layer: MoE? (gpt_layer_specs.py L647-656: int N -> i % N == 0)."""
    freq = args.get("moe_layer_freq", 1)
    if args.get("num_experts") is None:
        return [False] * layers
    if isinstance(freq, int):
        return [i % freq == 0 for i in range(layers)]
    return [bool(b) for b in freq]
