"""A GPT/Llama-style decoder in plain PyTorch modules, shaped by a ModelSpec (validator only).

Layout choices made so that tensor parallelism cuts it the way Megatron does:
- QKV is ONE linear whose output rows are grouped per KV head as [q_1..q_{a/g}, k, v] x g, so a
  column-parallel shard holds whole groups (an unfused q/k/v would add 2 backward all-reduces per
  layer under DTensor; validator_notes.md section 2).
- SwiGLU's gate and up are ONE linear whose rows are grouped in ``mlp_groups`` blocks of
  [gate, up]; the validator sets mlp_groups = tp so a column shard holds matching halves.
- Dropout is 0 (deterministic comparison); the attention core is PyTorch's SDPA (causal).
- Context parallel (``set_context_parallel``): each rank holds the tokens at ``positions`` (the
  2*cp-chunk causal load balancing); RoPE and learned positions use those global positions, and
  the attention core all-gathers K and V over the cp group (``GatherKV``: backward reduce-
  scatters dK, dV), masking by global position. This is the all-gather form of formulas.md 5.7
  (Llama 3 style), not Megatron's p2p ring.
Imports torch: only ever imported from inside planner.validate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .instrument import recompute_context
from .mlp import MLP
from .moe import MoE


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the decoder (all sizes are element counts)."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    seq: int
    activation: str = "gelu"        # gelu | swiglu
    norm: str = "layernorm"         # layernorm | rmsnorm
    bias: bool = False
    positions: str = "rope"         # learned | rope | alibi (alibi is run as no position term)
    tie_embeddings: bool = False
    mlp_groups: int = 1
    recompute: str = "none"         # none | selective | full (full is applied by the parallelizer)
    max_positions: int = 0          # learned position table size (0: the sequence length)
    qkv_bias: bool = False          # biases on the QKV projection only (Qwen2)
    num_experts: int = 0            # MoE (planner.validate.moe): routed experts, 0 = dense
    topk: int = 0
    expert_ffn: int = 0             # width of one routed expert
    shared_ffn: int = 0             # width of the shared expert(s), 0 = none
    first_dense: int = 0            # leading dense layers; every later layer is MoE


def make_norm(cfg: GPTConfig) -> nn.Module:
    """LayerNorm (weight + bias, 2h parameters) or RMSNorm (h), as planner.cost.model_counts.norm_params counts."""
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden, eps=1e-5)
    return nn.LayerNorm(cfg.hidden, eps=1e-5)


def rope(x: torch.Tensor, base: float = 10000.0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """Rotary embedding on x of shape (b, heads, s, d) (rotate-half form, Su et al. 2021).

    ``positions`` (s,) int64: the tokens' global positions (context parallel); default 0..s-1.
    """
    s, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d))
    pos = torch.arange(s, device=x.device) if positions is None else positions.to(x.device)
    angles = pos.to(x.dtype)[:, None] * inv[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def cp_positions(cp_rank: int, cp: int, seq: int) -> torch.Tensor:
    """Global token positions held by context-parallel rank ``cp_rank``: (seq/cp,) int64.

    Megatron's causal load balancing: the sequence is cut into 2*cp chunks of seq/(2cp) and rank
    i holds chunks i and 2cp-1-i (docs/user-guide/features/context_parallel.md)."""
    c = seq // (2 * cp)
    j = 2 * cp - 1 - cp_rank
    return torch.cat([torch.arange(cp_rank * c, (cp_rank + 1) * c), torch.arange(j * c, (j + 1) * c)])


class GatherKV(torch.autograd.Function):
    """All-gather of the stacked local K and V over the cp group; backward reduce-scatters the
    gradient (sum). Input (2, b, g_l, s/cp, d) -> output (cp, 2, b, g_l, s/cp, d)."""

    @staticmethod
    def forward(ctx, kv, group):
        import torch.distributed as dist
        ctx.group = group
        n = dist.get_world_size(group)
        out = kv.new_empty((n * kv.shape[0],) + tuple(kv.shape[1:]))  # gloo: concatenated on dim 0
        dist.all_gather_into_tensor(out, kv.contiguous(), group=group)
        return out.view((n,) + tuple(kv.shape))

    @staticmethod
    def backward(ctx, grad):
        import torch.distributed as dist
        shard = grad.new_empty(grad.shape[1:])
        flat = grad.contiguous().view((-1,) + tuple(grad.shape[2:]))
        dist.reduce_scatter_tensor(shard, flat, group=ctx.group)
        return shard, None


class Attention(nn.Module):
    """Fused, group-interleaved QKV projection, causal SDPA core, output projection."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.cp_group = None            # context parallel: set by set_context_parallel
        self.q_pos: torch.Tensor | None = None
        self.k_pos: torch.Tensor | None = None
        per_group = cfg.heads // cfg.kv_heads + 2
        self.qkv = nn.Linear(cfg.hidden, cfg.kv_heads * per_group * cfg.head_dim,
                             bias=cfg.bias or cfg.qkv_bias)
        self.o = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=cfg.bias)

    def core(self, qkv: torch.Tensor) -> torch.Tensor:
        """(b, s, local groups * (a/g + 2) * d) -> (b, s, local heads * d); works on any TP shard."""
        cfg = self.cfg
        b, s, width = qkv.shape
        q_per = cfg.heads // cfg.kv_heads
        groups = width // ((q_per + 2) * cfg.head_dim)
        x = qkv.view(b, s, groups, q_per + 2, cfg.head_dim)
        # q, K and V are copies (K, V by repeat_interleave), never views of the fused QKV
        # output: a view would keep that whole buffer alive in the attention's saved tensors
        q = x[:, :, :, :q_per].reshape(b, s, groups * q_per, cfg.head_dim).contiguous()
        q = q.transpose(1, 2)
        k = x[:, :, :, q_per].transpose(1, 2)
        v = x[:, :, :, q_per + 1].transpose(1, 2)
        if cfg.positions == "rope":
            q, k = rope(q, positions=self.q_pos), rope(k, positions=self.q_pos)
        mask = None
        if self.cp_group is not None:  # all-gather K, V of the whole sequence (by cp rank)
            kv = GatherKV.apply(torch.stack([k, v]), self.cp_group)  # (cp, 2, b, g, s/cp, d)
            kv = kv.permute(1, 2, 3, 0, 4, 5).reshape(2, b, groups, -1, cfg.head_dim)
            k, v = kv[0], kv[1]
            mask = self.q_pos.to(q.device)[:, None] >= self.k_pos.to(q.device)[None, :]
        k = k.repeat_interleave(q_per, dim=1)
        v = v.repeat_interleave(q_per, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, groups * q_per * cfg.head_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv(x)
        if self.cfg.recompute == "selective":  # Korthikanti's core-attention recomputation
            out = torch.utils.checkpoint.checkpoint(self.core, qkv, use_reentrant=False,
                                                    context_fn=recompute_context)
        else:
            out = self.core(qkv)
        return self.o(out)


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: GPTConfig, index: int = 0):
        super().__init__()
        self.ln1, self.attn = make_norm(cfg), Attention(cfg)
        if cfg.num_experts and index >= cfg.first_dense:
            self.ln2, self.mlp = make_norm(cfg), MoE(cfg)
        else:
            self.ln2, self.mlp = make_norm(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Word embedding (+ learned positions): ids (b, s) -> (b, s, h)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = (nn.Embedding(cfg.max_positions or cfg.seq, cfg.hidden)
                    if cfg.positions == "learned" else None)
        self.positions: torch.Tensor | None = None  # context parallel: this rank's positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        if self.pos is not None:
            x = x + (self.pos.weight[: ids.shape[1]] if self.positions is None
                     else self.pos.weight[self.positions.to(ids.device)])
        return x


class Head(nn.Module):
    """Final norm and output layer: (b, s, h) -> logits (b, s, V)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm = make_norm(cfg)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class GPT(nn.Module):
    """The whole decoder (the single-process reference); ``chunk`` modules are cut from it."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.num_layers)})
        self.head = Head(cfg)
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.head.out.weight = self.embed.tok.weight

    def reset_parameters(self) -> None:
        """GPT-2 style init: N(0, 0.02) weights, zero biases (init_method_std 0.02), norms at 1/0."""
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif "ln" in name or "norm" in name:
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02)  # biases non-zero so their gradients are checked

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(x)


class Chunk(nn.Module):
    """One pipeline model chunk: [embed] + some layers + [head], sharing the GPT's modules."""

    def __init__(self, embed: nn.Module | None, layers: dict[str, nn.Module], head: nn.Module | None):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleDict(layers)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:
            x = self.head(x)
        return x


def set_context_parallel(model: "GPT", group, cp_rank: int, cp: int) -> None:
    """Make ``model`` one context-parallel rank: its tokens are cp_positions(cp_rank) and every
    attention layer all-gathers K, V over ``group`` (call before cutting chunks / TP)."""
    seq = model.cfg.seq
    mine = cp_positions(cp_rank, cp, seq)
    every = torch.cat([cp_positions(r, cp, seq) for r in range(cp)])
    model.embed.positions = mine
    for layer in model.layers.values():
        layer.attn.cp_group, layer.attn.q_pos, layer.attn.k_pos = group, mine, every


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross entropy of one (micro-)batch: logits (b, s, V), targets (b, s) int64."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float()
                           if logits.dtype in (torch.float16, torch.bfloat16)
                           else logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
