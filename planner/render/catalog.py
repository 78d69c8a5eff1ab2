"""``plan3d models``, ``hardware`` and ``frameworks``: the catalogs as tables that fit 80 columns."""

from __future__ import annotations

import yaml
from rich.markup import escape

from .. import fmt
from . import tables
from .console import out, write_stdout
from ..cost.model_counts import active_params, total_params


def _mlp_column(m) -> str:
    """The MLP as listed: the activation, and for MoE 'top-k/E (+ shared)'."""
    if m.moe is None:
        return m.activation
    shared = f" +{m.moe.shared_experts}sh" if m.moe.shared_experts else ""
    return f"{m.activation}\ntop-{m.moe.router_topk}/{m.moe.num_experts}{shared}"


def _heads_column(m) -> str:
    """Attention heads / KV heads (MLA: heads and 'MLA'); the window below, if any."""
    heads = f"{m.num_attention_heads} MLA" if m.attention_kind == "mla" else \
        f"{m.num_attention_heads}/{m.kv_heads}"
    return heads + (f"\nwin {m.sliding_window}" if m.sliding_window else "")


def models_table(models) -> None:
    """One row per model (smallest first): name with its aliases below, total and active
    parameters (MoE: router_topk experts, both embedding matrices counted), layers, hidden size,
    attention heads / KV heads (MLA, window), MLP activation (MoE: top-k of the experts)."""
    t = tables.new("Models")
    # wide enough for the longest name or alias (with its comma): folded only between aliases
    words = [m.name for m in models] + [a + ("," if k < len(m.aliases) - 1 else "")
                                        for m in models for k, a in enumerate(m.aliases)]
    tables.text_column(t, "name\n[dim]aliases[/]", min_width=max(map(len, words), default=4))
    for col in ("params\nactive", "layers", "hidden", "heads/kv"):
        tables.number_column(t, col)
    tables.code_column(t, "mlp")
    for m in sorted(models, key=total_params):
        name = escape(m.name) + (f"\n[dim]{escape(', '.join(m.aliases))}[/]" if m.aliases else "")
        params = fmt.params(total_params(m)) + \
            (f"\n{fmt.params(active_params(m))}" if m.moe is not None else "")
        t.add_row(name, params, str(m.num_layers), str(m.hidden_size), _heads_column(m),
                  _mlp_column(m))
    tables.show(t, out)


def _storage_state(h) -> str:
    """Which storage numbers are placeholders the user should set: 'per host, aggregate',
    'aggregate', 'none' (all sourced), or 'no block'."""
    if h.storage is None:
        return "no block"
    return ", ".join(name.replace("_", " ") for name in h.storage.placeholders) or "none"


def hardware_table(profiles) -> None:
    """One row per profile: name over GPU, HBM as nvidia-smi reports it (MiB), dense bf16 peak,
    GPUs per host over the NVLink domain, NVLink per GPU (one direction), network per host,
    which storage numbers are placeholders."""
    t = tables.new("Hardware profiles")
    tables.code_column(t, "profile\nGPU")
    for col in ("HBM\nMiB", "bf16\nTFLOP/s", "GPUs/host\nNVLink", "NVLink/GPU\none way",
                "network\nper host"):
        tables.number_column(t, col)
    for h in profiles:
        nic = fmt.bandwidth(h.inter_node.bandwidth_per_nic, bits=True)
        t.add_row(tables.stacked([escape(h.name), escape(h.gpu.name)]),
                  f"{h.gpu.hbm_capacity / 2**20:,.0f}", f"{h.gpu.peak_tflops['bf16']:g}",
                  f"{h.gpus_per_host}\n{h.nvlink_domain}",
                  fmt.bandwidth(h.intra_node.bandwidth_per_gpu),
                  f"{h.inter_node.nics_per_node} x {nic}")
    tables.show(t, out)
    marked = [f"{h.name} ({_storage_state(h)})" for h in profiles if _storage_state(h) != "none"]
    if marked:
        out.print("Storage bandwidths that are placeholders, to set for your cluster (plan3d "
                  "hardware --json): " + "; ".join(escape(x) for x in marked))


def _recompute_modes(modes) -> str:
    """'none/selective/full', with selective+ (selective plus named modules) folded into
    'selective(+)' where a profile offers both, so the table keeps 80 columns."""
    names = list(modes)
    if "selective" in names and "selective+" in names:
        names = ["selective(+)" if m == "selective" else m for m in names if m != "selective+"]
    return "/".join(names)


def frameworks_table(profiles) -> None:
    """One row per framework profile: name over its exporter, what it runs (CP kind,
    interleaving, ZeRO stages, recompute), flash attention and gradient dtype (bf16 training),
    the allocator reserve; then where each profile's facts come from (--show)."""
    t = tables.new("Framework profiles (plan3d frameworks --show NAME: every fact and its source)")
    tables.code_column(t, "framework\nexport")
    tables.code_column(t, "CP\nvpp")
    tables.code_column(t, "ZeRO\nrecompute")
    tables.code_column(t, "flash\ngrads")
    tables.number_column(t, "allocator\nreserve")
    for f in profiles:
        r = f.rules
        t.add_row(tables.stacked([escape(f.name), f.export or "-"]),
                  tables.stacked([r.context_parallel, "yes" if r.interleaving else "no"]),
                  tables.stacked([",".join(map(str, r.zero_stages)), _recompute_modes(r.recompute)]),
                  tables.stacked(["yes" if f.runtime.flash_attention else "no",
                                  f.memory.gradients["bf16"]]),
                  fmt.percent(f.reserve.allocator, 0))
    tables.show(t, out)


class _WrappingDumper(yaml.SafeDumper):
    """PyYAML's safe dumper with every line within ``width`` columns where the words allow it.

    PyYAML breaks a long string at the first space past its ``width``, so a line runs over by the
    word that crossed it; here each string is written with the width lowered by its longest word
    (and its quotes), so the word that crosses still ends within ``width``. The breaks are
    YAML's own line folding: the document reads back to the same values."""

    def process_scalar(self):
        full = self.best_width
        words = str(self.event.value).split()
        longest = max((len(w) + w.count("'") for w in words), default=0)
        self.best_width = max(full - longest - 3, 2 * self.best_indent + 1)
        try:
            super().process_scalar()
        finally:
            self.best_width = full


def yaml_text(data, width: int) -> str:
    """``data`` as a YAML document in block style, keys in their order, lines within ``width``
    columns where no single word is longer (safe_load reads back ``data``)."""
    return yaml.dump(data, Dumper=_WrappingDumper, sort_keys=False, width=width,
                     allow_unicode=True, default_flow_style=False)


def show_yaml(data) -> None:
    """``data`` (a model or framework profile as its YAML schema writes it) as YAML on stdout,
    wrapped at stdout's width (80 columns in a pipe, or $COLUMNS when set wider)."""
    write_stdout(yaml_text(data, out.width))
