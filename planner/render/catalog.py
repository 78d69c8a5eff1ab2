"""``plan3d models`` and ``plan3d hardware``: the catalogs as tables that fit 80 columns."""

from __future__ import annotations

from rich.markup import escape

from . import fmt, tables
from .console import out


def models_table(models) -> None:
    """One row per model (smallest first): name with its aliases below, parameters, layers,
    hidden size, attention heads / KV heads, MLP activation."""
    from ..cost.flops import total_params
    t = tables.new("Models")
    tables.text_column(t, "name\n[dim]aliases[/]")
    for col in ("params", "layers", "hidden", "heads/kv"):
        tables.number_column(t, col)
    tables.code_column(t, "mlp")
    for m in sorted(models, key=total_params):
        name = escape(m.name) + (f"\n[dim]{escape(', '.join(m.aliases))}[/]" if m.aliases else "")
        t.add_row(name, fmt.params(total_params(m)), str(m.num_layers), str(m.hidden_size),
                  f"{m.num_attention_heads}/{m.kv_heads}", m.activation)
    tables.show(t, out)


def hardware_table(profiles) -> None:
    """One row per profile: name over GPU, HBM, dense bf16 peak, GPUs per node, NVLink per GPU
    (one direction), network per node."""
    from ..units import format_quantity
    t = tables.new("Hardware profiles")
    tables.code_column(t, "profile\nGPU")
    for col in ("HBM", "bf16\nTFLOP/s", "GPUs/\nnode", "NVLink/GPU\n(one way)", "network\nper node"):
        tables.number_column(t, col)
    for h in profiles:
        nic = fmt.bandwidth(h.inter_node.bandwidth_per_nic, bits=True)
        t.add_row(tables.stacked([escape(h.name), escape(h.gpu.name)]),
                  format_quantity(float(h.gpu.hbm_capacity), "bytes"),
                  f"{h.gpu.peak_tflops['bf16']:g}", str(h.gpus_per_node),
                  fmt.bandwidth(h.intra_node.bandwidth_per_gpu),
                  f"{h.inter_node.nics_per_node} x {nic}")
    tables.show(t, out)
