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
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            value = tokens[i + 1]
            i += 1
        dest = flag[2:].replace("-", "_")
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


def validate(args: dict, world: int) -> None:
    """Raise MegatronRejects if Megatron-LM (d98e8a64) refuses ``args`` on ``world`` GPUs."""
    _tp, pp, _cp, _ep, etp = _parallel_rules(args, world)
    layers = _int(args, "num_layers", 0)
    if "decoder_first_pipeline_num_layers" not in args and not args.get(
            "account_for_embedding_in_pipeline_split") and layers % pp:
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
