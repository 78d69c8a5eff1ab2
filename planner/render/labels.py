"""Names printed for the cost model's terms and the layout's fields."""

from __future__ import annotations

TIME_LABELS = {
    "compute": "compute (GEMMs, attention, elementwise)",
    "recompute": "activation recomputation",
    "tp_comm": "TP/SP communication (exposed)",
    "cp_comm": "CP ring communication (exposed)",
    "ep_comm": "expert dispatch/combine (exposed)",
    "pp_comm": "pipeline p2p (exposed)",
    "dp_comm": "DP/ZeRO communication (exposed)",
    "offload": "activation offload (exposed)",
    "host": "host (CPU) time (exposed)",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step + fixed per-step overhead",
}

MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "other": "buffers (SP, ZeRO-3, CP)",
                 "reserve": "reserve (runtime + allocator)"}
