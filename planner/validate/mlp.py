"""The miniature's dense MLP: fc1 (for SwiGLU a fused gate and up), the activation, fc2; also
each routed expert's shape (validate.moe)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """fc1 (for SwiGLU: fused gate+up in ``mlp_groups`` [gate, up] blocks), activation, fc2."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        width = 2 * cfg.ffn if cfg.activation == "swiglu" else cfg.ffn
        self.fc1 = nn.Linear(cfg.hidden, width, bias=cfg.bias)
        self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc1(x)
        if self.cfg.activation == "swiglu":
            local_groups = max(1, y.shape[-1] * self.cfg.mlp_groups // (2 * self.cfg.ffn))
            y = y.view(*y.shape[:-1], local_groups, 2, -1)
            y = (F.silu(y[..., 0, :]) * y[..., 1, :]).flatten(-2)
        else:
            y = F.gelu(y)
        return self.fc2(y)
