"""The model of a measured run: a catalog model the facts or the row name, or one built from the row.

With ``model: {catalog: NAME, ...}`` in the run's facts (planner.fidelity.facts), or
``model.catalog: NAME`` in the row (the facts' name wins), the run trains
that catalog model (a name, a model YAML or a Hugging Face config.json), with the listed
ModelSpec fields changed (DeepSeek-V3 without its MTP module: ``mtp_layers: 0``); every shape the
row states is checked against it, and a shape the row leaves out (``vocab: null``) is taken from
the catalog and listed in the run's assumptions. Otherwise the row's own shape is completed by
the facts' ModelSpec fields, then by the named ``architecture``'s defaults (the model code of a
source: Megatron-LM's GPT, llm-foundry's MPT), then by plain defaults each listed as an
assumption (seq_len 1024 and vocab 51200, the 2020 Megatron README's GPT-2 settings; ffn 4h).
"""

from __future__ import annotations

from typing import Any, Callable

from ..catalog import catalog_model_name, resolve_model
from ..files import validate
from ..errors import UsageError
from ..specs import ModelSpec, TrainingDefaults

# The defaults of a source's model code for what a dense row leaves out.
ARCHITECTURES: dict[str, dict[str, Any]] = {
    # Megatron-LM GPT (megatron/model/gpt_model.py of 2020-22): GeLU, LayerNorm, biases, learned
    # absolute positions, dropout 0.1, input and output embeddings tied
    "megatron-gpt": dict(activation="gelu", norm="layernorm", bias=True, position_embedding="learned",
                         dropout=0.1, tie_embeddings=True),
    # llm-foundry MPT (scripts/train/yamls/pretrain/mpt-*.yaml @061f2c7): no biases, ALiBi,
    # dropout 0, tied embeddings
    "mpt": dict(activation="gelu", norm="layernorm", bias=False, position_embedding="alibi",
                dropout=0.0, tie_embeddings=True),
}
# Row field -> ModelSpec field, for the dense shape and the MoE block.
SHAPE = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
         "kv_heads": "num_kv_heads", "vocab": "vocab_size"}


def run_model(run_id: str, row: dict, facts_model: dict[str, Any] | None, architecture: str | None,
              seq: int, batch: int, assume: Callable[[str], None]) -> ModelSpec:
    """The ModelSpec of run ``run_id`` (named after it). ``row``: the row's ``model`` mapping
    (its ``catalog`` names the model when the facts do not, catalog_of); ``facts_model``: the
    facts' model mapping (None = none); ``seq``/``batch``: its sequence length and global batch.
    UsageError if a stated shape contradicts the catalog model."""
    catalog = catalog_of(row, facts_model)
    given = dict(facts_model or {})
    given.pop("catalog", None)
    defaults = TrainingDefaults(seq_length=seq, global_batch_size=batch)
    if catalog is not None:
        base = resolve_model(str(catalog))
        data = {**base.model_dump(mode="json", exclude_none=True), **given,
                "name": run_id, "aliases": [], "training": defaults.model_dump()}
        model = validate(ModelSpec, data, f"model ({catalog} with {sorted(given)})")
        _check_against(row, model, str(catalog), assume)
        return model
    return _from_row(run_id, row, given, architecture, defaults, assume)


def _row_moe(row: dict, given: dict[str, Any]) -> dict[str, Any] | None:
    """The MoE block a row states (num_experts, top_k, moe_ffn_hidden, shared_experts), as
    MoESpec fields completed by the facts' ``moe`` fields ``given``; None for a dense row.
    UsageError for an MoE row whose top-k or expert width neither states."""
    if row.get("num_experts") is None:
        return None
    moe = {k: int(row[r]) for r, k in (("num_experts", "num_experts"), ("top_k", "router_topk"),
                                       ("moe_ffn_hidden", "ffn_hidden_size")) if row.get(r) is not None}
    moe.update(given)
    if "router_topk" not in moe or "ffn_hidden_size" not in moe:
        raise UsageError("an MoE row needs model.top_k and model.moe_ffn_hidden (or its facts' "
                         "model.moe, or a catalog model)")
    shared = row.get("shared_experts") or {}
    if shared.get("count"):
        moe["shared_experts"] = int(shared["count"])
        if shared.get("ffn_hidden"):
            moe["shared_ffn_hidden_size"] = int(shared["ffn_hidden"]) // int(shared["count"])
    return moe


def _from_row(run_id: str, row: dict, given: dict[str, Any], architecture: str | None,
              defaults: TrainingDefaults, assume: Callable[[str], None]) -> ModelSpec:
    """A ModelSpec from the row's shape, the facts' fields and the architecture's defaults."""
    data: dict[str, Any] = {k: int(row[r]) for r, k in SHAPE.items() if row.get(r) is not None}
    if row.get("vocab") is None and "vocab_size" not in given:
        data["vocab_size"] = 51200
        assume("vocab=51200")
    moe = _row_moe(row, given.pop("moe", {}))
    if moe is not None:
        data["moe"] = moe
    if row.get("ffn_hidden") is not None:
        data["ffn_hidden_size"] = int(row["ffn_hidden"])
    elif moe is None and "ffn_hidden_size" not in given:
        data["ffn_hidden_size"] = 4 * data["hidden_size"]
        assume("ffn=4h")
    arch = dict(ARCHITECTURES[architecture or "megatron-gpt"])
    missing = [k for k in arch if k not in given]
    if architecture is None and missing:  # the row's source names no model code
        hint = _catalog_hint(row.get("name"))
        assume(f"architecture=megatron-gpt ({', '.join(missing)}){hint}")
    data = {**arch, **data, **given}
    if data.get("position_embedding") == "learned":
        data.setdefault("max_position_embeddings", defaults.seq_length)
    data.update(name=run_id, source=f"run {run_id}", training=defaults.model_dump())
    return validate(ModelSpec, data, "model")


def _catalog_hint(name: object) -> str:
    """A note for an assumed architecture when the row's model.name is a catalog model's name
    or alias ("" otherwise): model.catalog would cost the run as that model."""
    found = catalog_model_name(name) if isinstance(name, str) else None
    return f"; model.name {name!r} is catalog model {found}: model.catalog: {found} costs it as that" \
        if found else ""


def catalog_of(row: dict, facts_model: object) -> str | None:
    """The catalog model a run trains (a name, a model YAML or a config.json): its facts'
    ``model.catalog``, else the row's ``model.catalog``; None when neither names one. UsageError
    for a row's model.catalog that is not a non-empty string, or one that the facts contradict."""
    given = facts_model.get("catalog") if isinstance(facts_model, dict) else None
    own = row.get("catalog")
    if own is not None and (not isinstance(own, str) or not own.strip()):
        raise UsageError(f"model.catalog must name a catalog model, a model YAML or a config.json, "
                         f"got {own!r}")
    if given is not None and own is not None and str(given).strip().lower() != own.strip().lower():
        raise UsageError(f"model.catalog is {own} but the run's facts name {given}: name one model")
    return str(given) if given is not None else own


def _check_against(row: dict, model: ModelSpec, catalog: str, assume: Callable[[str], None]) -> None:
    """UsageError where the row's stated shape differs from the catalog model; each shape the
    row leaves out is listed as taken from the catalog."""
    stated = {r: row.get(r) for r in SHAPE}
    moe = model.moe
    stated.update(num_experts=row.get("num_experts"), top_k=row.get("top_k"),
                  moe_ffn_hidden=row.get("moe_ffn_hidden"))
    actual = {"layers": model.num_layers, "hidden": model.hidden_size,
              "heads": model.num_attention_heads, "kv_heads": model.kv_heads,
              "vocab": model.vocab_size,
              "num_experts": moe.num_experts if moe else None,
              "top_k": moe.router_topk if moe else None,
              "moe_ffn_hidden": moe.ffn_hidden_size if moe else None}
    if model.attention_kind == "mla":
        stated.pop("kv_heads")  # MLA has no KV groups; the rows leave it null
    for key, value in stated.items():
        if value is None:
            if actual.get(key) is not None and key == "vocab":
                assume(f"vocab={actual[key]} (catalog {catalog})")
            continue
        if int(value) != actual.get(key):
            raise UsageError(f"model.{key} is {value} but catalog model {catalog} has "
                             f"{actual.get(key)}: name the right model (model.catalog or the run's facts)")
