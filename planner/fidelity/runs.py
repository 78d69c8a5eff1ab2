"""Load published, measured training runs (benchmarks/published_runs.yaml schema) as planner inputs.

Each row becomes a :class:`RunCase`: (ModelSpec, HardwareProfile, TrainingSpec, Layout, measured
figures in SI units), plus the list of defaults it had to assume, or the reason it is skipped.
The rules below are the ONLY defaults; each is applied to every row that leaves the field unknown
and the row then lists it in ``assumptions`` (``plan3d accuracy`` prints them):

- micro_batch unknown -> 1; vpp unknown -> 1 (plain 1F1B); recompute unknown -> full where the
  source counts FLOPs with Narayanan's formula (which assumes full recomputation), else none;
  sequence_parallel unknown -> off; zero_stage unknown -> 0 (Megatron DDP: the distributed
  optimizer arrived in Megatron-LM in 2022); ffn_hidden unknown -> 4*hidden.
- tp and pp unknown, dp known (Narayanan 2021 Table 2 gives only t*p): tp = 8 (one DGX node,
  as every PTD-P layout of the paper's Table 1 from 18B up), pp = (gpus/dp)/8.
- seq_len / vocab unknown (2020 Megatron README): 1024 / 51200, the GPT-2 context and Megatron's
  padded GPT-2 vocabulary; with them the row's own iteration time and TFLOP/s agree under
  Narayanan's formula to 0.1 % (tests/test_fidelity.py checks this).
- framework: every fact of how the run was trained -- flash attention, gradient dtype, overlap
  of the DP reduce and of the interleaved p2p, Narayanan's p2p scatter/gather, synchronous TP in
  backward, what and how fast ZeRO-3 gathers, memory accounting and reserve -- comes from the
  framework profile the run names (planner.fidelity.run_framework: the row's ``framework``
  field, else published_runs_frameworks.yaml beside the runs file: megatron-lm-2021 for
  Narayanan 2021 and the 2020 README, deepspeed-2021 for Narayanan's ZeRO-3 rows,
  megatron-lm-2022 for Korthikanti 2022, llm-foundry for MosaicML, megatron-core for the rest),
  with the single facts it overrides (the PURE bf16 MosaicML rows: --grad-dtype bf16) and its
  training dtype; megatron-core in bf16 when nothing names one (stated as an assumption).
- architecture: GeLU MLP, LayerNorm; the framework entry's ``architecture`` gives the rest:
  megatron-gpt (biases, learned positions, dropout 0.1 and tied embeddings unless the row says
  "untied") or mpt (llm-foundry defaults: no biases, ALiBi, dropout 0, tied embeddings).
- FLOP convention of the source's TFLOP/s / MFU: by id prefix for the shipped sources (GROUPS);
  a user row may tag its notes ``[flops=narayanan|korthikanti|mosaic]``, otherwise only its
  iteration time and tokens/s are compared.
- peak memory: the "GB" of a source whose code builds on Megatron-LM (the vocabulary-parallelism
  rows) is read as GiB: Megatron-LM's ``report_memory`` logs torch.cuda.max_memory_allocated()
  divided by 1024*1024 under the label "MB" (megatron/training/utils.py). A user row may tag its
  notes ``[memory=GiB]`` or ``[memory=GB]``; otherwise GB is 10^9 bytes.
- hardware: A100-SXM4-80GB -> dgx-a100-80g, A100 40GB -> dgx-a100-40g, A100 of unstated size
  (2020) -> dgx-a100-40g, H100 -> dgx-h100; TPUs and anything else are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from ..catalog import describe_validation_error, read_yaml, resolve_hardware, validate
from ..degrees import split_problem
from ..errors import UsageError
from ..inputs import check_integers, field_of, training_spec
from ..specs import NAME_PATTERN, HardwareProfile, Layout, ModelSpec, TrainingDefaults, TrainingSpec
from ..frameworks.profile import resolve_training
from .run_framework import run_framework
from .schema import check_fields, notes_tags

REPO_DATASET = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs.yaml"
WHEEL_DATASET = Path(__file__).resolve().parents[1] / "_catalog" / "published_runs.yaml"

# (id prefix, group shown in the report, FLOP convention of the source's TFLOP/s / MFU / HFU)
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("megatron21-t1-", "Narayanan 2021 Table 1", "narayanan"),
    ("megatron21-t2-zero3-", "Narayanan 2021 Table 2 ZeRO-3", "narayanan"),
    ("megatron21-t2-ptd-", "Narayanan 2021 Table 2 PTD-P", "narayanan"),
    ("korthikanti22-530b-2240gpu", "Korthikanti 2022 dp=8 (2240 GPUs)", "korthikanti"),
    ("korthikanti22-", "Korthikanti 2022 Table 5", "korthikanti"),
    ("megatron-readme2020-", "Megatron-LM README 2020", "narayanan"),
    ("megatron-readme-h100-", "Megatron-LM README H100", "megatron"),
    ("mosaic-", "MosaicML llm-foundry FSDP", "mosaic"),
    ("vocabpar-", "Vocabulary Parallelism 1F1B baseline", "korthikanti"),
    ("palm-", "PaLM", "palm"),
    ("gopher-", "Gopher", "palm"),
)
# Sources whose peak-memory "GB" is Megatron-LM's binary unit (see the module docstring).
MEMORY_GIB_PREFIXES = ("vocabpar-",)


@dataclass
class RunCase:
    """One published run as planner inputs. ``measured`` is in SI units (s, FLOP/s, fractions, bytes)."""

    id: str
    group: str
    convention: str
    source: str
    gpus: int
    measured: dict[str, float]
    model: ModelSpec | None = None
    hardware: HardwareProfile | None = None
    training: TrainingSpec | None = None
    layout: Layout | None = None
    peak_key: str = "a100"
    trust: str = "unknown"
    assumptions: list[str] = field(default_factory=list)
    skipped: str | None = None


def default_dataset() -> Path:
    """The shipped dataset: the repository's benchmarks/ copy, else the wheel's."""
    for path in (REPO_DATASET, WHEEL_DATASET):
        if path.is_file():
            return path
    raise UsageError("the shipped published_runs.yaml is missing from this installation")


def load_runs(path: Path | None = None) -> list[RunCase]:
    """All rows of a runs file, each a RunCase (skipped rows carry ``skipped``). UsageError if malformed."""
    path = path or default_dataset()
    rows = read_yaml(path)
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"{path}: expected a non-empty list of runs")
    cases = []
    seen: dict[str, int] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise UsageError(f"{path}: entry {i + 1} has no 'id'")
        if not RUN_ID.fullmatch(row["id"]):
            raise UsageError(f"{path}: run id {row['id']!r}: use letters, digits and . _ + - "
                             "(starting with a letter or digit): the id also names the run's model")
        if row["id"] in seen:
            raise UsageError(f"{path}: duplicate run id {row['id']!r} (entries {seen[row['id']]} "
                             f"and {i + 1}); ids must be unique")
        seen[row["id"]] = i + 1
        try:
            cases.append(_case(row, path))
        except KeyError as exc:
            raise UsageError(f"{path}: run {row['id']}: missing field {exc}") from None
        except ValidationError as exc:  # one line naming the field, as catalog.validate words it
            raise UsageError(f"{path}: run {row['id']}: {describe_validation_error(exc)}") from None
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{path}: run {row['id']}: malformed ({exc})") from None
        except UsageError as exc:
            raise UsageError(f"{path}: run {row['id']}: {exc}") from None
    return cases


TRUST_LEVELS = ("low", "medium", "high")
RUN_ID = re.compile(NAME_PATTERN)  # ModelSpec.name's pattern: the id names the run's model


def select_runs(cases: list[RunCase], exclude: list[str] | None = None,
                min_trust: str | None = None) -> list[RunCase]:
    """Cases whose id matches none of the ``exclude`` globs and whose trust tag is >= ``min_trust``."""
    from fnmatch import fnmatch
    if min_trust is not None and min_trust not in TRUST_LEVELS:
        raise UsageError(f"--min-trust must be one of {', '.join(TRUST_LEVELS)}, got {min_trust!r}")
    floor = TRUST_LEVELS.index(min_trust) if min_trust else -1
    return [c for c in cases if not any(fnmatch(c.id, pat) for pat in exclude or ())
            and (floor < 0 or (c.trust in TRUST_LEVELS and TRUST_LEVELS.index(c.trust) >= floor))]


def _group(row: dict, tags: dict[str, str]) -> tuple[str, str]:
    """(group shown in the report, FLOP convention): a shipped source's by id prefix, else the
    source's first comma-separated part; a ``[flops=...]`` tag overrides the convention."""
    for prefix, group, convention in GROUPS:
        if row["id"].startswith(prefix):
            return group, tags.get("flops", convention)
    return str(row.get("source") or "user runs").split(",")[0][:60], tags.get("flops", "none")


MEASURED_SCALE = {"tflops_per_gpu": 1e12, "mfu_percent": 1e-2, "hfu_percent": 1e-2,
                  "tokens_per_s": 1.0, "iteration_s": 1.0, "peak_memory_gb": 1e9}
MEASURED_NAMES = {"tflops_per_gpu": "flops_per_gpu", "mfu_percent": "mfu", "hfu_percent": "hfu",
                  "tokens_per_s": "tokens_per_s", "iteration_s": "iteration_s",
                  "peak_memory_gb": "peak_memory"}


def _measured(m: object) -> dict[str, float]:
    """The row's ``measured`` mapping in SI units (keys of MEASURED_NAMES' values). UsageError
    naming the field for a value that is not a positive number, or a percentage above 100."""
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise UsageError(f"measured must be a mapping of figures, got {m!r}")
    out = {}
    for k, v in m.items():
        if k not in MEASURED_SCALE or v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise UsageError(f"measured.{k} must be a positive number, got {v!r}")
        if k.endswith("_percent") and v > 100:
            raise UsageError(f"measured.{k} must be at most 100, got {v!r}")
        out[MEASURED_NAMES[k]] = float(v) * MEASURED_SCALE[k]
    return out


def _hardware(gpu: str, notes: list[str]) -> tuple[str | None, str]:
    """(profile name or None, peak key) for a row's GPU string."""
    g = gpu.upper()
    if "H100" in g:
        return "dgx-h100", "h100"
    if "A100" in g:
        if "NOT STATED" in g:
            notes.append("A100 40GB (size unstated)")
            return "dgx-a100-40g", "a100"
        return ("dgx-a100-40g" if "40" in g else "dgx-a100-80g"), "a100"
    return None, "a100"


def _case(row: dict, path: Path | None = None) -> RunCase:
    check_fields(row)
    tags = notes_tags(str(row.get("notes") or ""))
    group, convention = _group(row, tags)
    for key in ("hardware", "model", "layout"):
        if not isinstance(row.get(key), dict):
            raise UsageError(f"missing field '{key}'" if row.get(key) is None else
                             f"{key} must be a mapping of fields, got {row[key]!r}")
    hw_row, model_row, lay = row["hardware"], row["model"], row["layout"]
    source = str(row.get("source") or "")
    case = RunCase(id=row["id"], group=group, convention=convention, source=source,
                   gpus=int(hw_row.get("gpus") or 0), measured=_measured(row.get("measured")))
    if "peak_memory" in case.measured:
        tag = tags.get("memory")
        binary = tag == "GiB" if tag else row["id"].startswith(MEMORY_GIB_PREFIXES)
        if binary:
            case.measured["peak_memory"] *= 2**30 / 1e9
            if not tag:
                case.assumptions.append("memory GB = GiB (Megatron report_memory)")
    case.trust = tags.get("trust", "unknown")
    profile, case.peak_key = _hardware(str(hw_row.get("gpu") or ""), case.assumptions)
    if profile is None:
        case.skipped = f"hardware not modelled by plan3d ({hw_row.get('gpu')})"
        return case
    if any(model_row.get(k) is None for k in ("layers", "hidden", "heads")):
        case.skipped = "architecture not given (layers/hidden/heads only in the source's images)"
        return case
    if lay.get("dp") is None and (lay.get("tp") is None or lay.get("pp") is None):
        case.skipped = "parallel layout not given"
        return case
    if (lay.get("cp") or 1) > 1 or (lay.get("ep") or 1) > 1:
        case.skipped = "context/expert parallelism not modelled by this comparison"
        return case
    if lay.get("global_batch") is None:
        raise UsageError("missing field 'layout.global_batch'")
    # the batch and sequence as every command checks them (planner.inputs)
    check_integers({"global_batch_size": lay["global_batch"]}, label=lambda _: "layout.global_batch")
    check_integers({"seq_length": model_row.get("seq_len")}, label=lambda _: "model.seq_len")
    case.hardware = resolve_hardware(profile)
    assume = case.assumptions.append
    software, assumed = run_framework(row, path)
    if assumed:
        assume(f"framework={software.framework} {software.dtype}")

    seq, vocab = model_row.get("seq_len"), model_row.get("vocab")
    if seq is None:
        seq = 1024
        assume("seq_len=1024")
    if vocab is None:
        vocab = 51200
        assume("vocab=51200")
    h = int(model_row["hidden"])
    ffn = model_row.get("ffn_hidden")
    if ffn is None:
        ffn = 4 * h
        assume("ffn=4h")
    megatron = software.architecture == "megatron-gpt"
    case.model = validate(ModelSpec, dict(
        name=case.id, source=source or "user run", num_layers=int(model_row["layers"]), hidden_size=h,
        num_attention_heads=int(model_row["heads"]),
        num_kv_heads=int(model_row.get("kv_heads") or model_row["heads"]), ffn_hidden_size=int(ffn),
        vocab_size=int(vocab), activation="gelu",
        # Megatron GPT ties input/output embeddings by default; the vocab-parallel paper unties them.
        tie_embeddings="untied" not in str(model_row.get("arch_notes") or "").lower(),
        norm="layernorm", bias=megatron, position_embedding="learned" if megatron else "alibi",
        max_position_embeddings=int(seq), dropout=0.1 if megatron else 0.0,
        training=TrainingDefaults(seq_length=int(seq), global_batch_size=int(lay["global_batch"]))),
        f"run {case.id} model")

    _run_layout(case, lay, convention)
    _run_training(case, int(seq), int(lay["global_batch"]), software)
    problem = split_problem(case.gpus, {k: getattr(case.layout, k) for k in ("tp", "pp", "dp")},
                            exact=True)
    if problem:
        raise UsageError(problem)
    return case


def _run_layout(case: RunCase, lay: dict, convention: str) -> None:
    """``case.layout`` from the row's layout, each unstated value a stated default (listed in
    ``case.assumptions`` unless it cannot change the prediction)."""
    tp, pp, dp = lay.get("tp"), lay.get("pp"), lay.get("dp")
    if tp is None or pp is None:
        mp = case.gpus // int(dp)
        tp, pp = 8, mp // 8
        case.assumptions.append(f"tp=8,pp={pp} (tp*pp={mp})")
    dp = int(dp) if dp is not None else case.gpus // (int(tp) * int(pp))
    # Narayanan's FLOP formula assumes full recomputation, so a source counting with it ran it.
    defaults = {"micro_batch": 1, "vpp": 1,
                "recompute": "full" if convention == "narayanan" else "none",
                "sequence_parallel": False, "zero_stage": 0}
    value = {}
    for key, default in defaults.items():
        raw = lay.get(key)
        if raw is None or (key == "zero_stage" and not isinstance(raw, int)):
            value[key] = default
            moot = (key == "vpp" and int(pp) == 1) or (key == "zero_stage" and dp == 1)
            if not moot:  # a default that cannot change the prediction is not an assumption
                case.assumptions.append(f"{key}={default}")
        else:
            value[key] = raw
    case.layout = validate(Layout, dict(
        tp=int(tp), pp=int(pp), dp=dp, zero_stage=int(value["zero_stage"]),
        micro_batch_size=int(value["micro_batch"]), recompute=value["recompute"],
        sequence_parallel=bool(value["sequence_parallel"]), vpp=int(value["vpp"])), f"run {case.id} layout")


def _run_training(case: RunCase, seq: int, batch: int, software) -> None:
    """``case.training`` of the run: the job (sequence, batch, the framework entry's dtype)
    checked as every command checks one (planner.inputs.training_spec), run by the framework
    profile the run names with its single-fact overrides (frameworks.profile.resolve_training)."""
    job = training_spec(case.model, {"seq_length": seq, "global_batch_size": batch,
                                     "dtype": software.dtype}, field_of("training"),
                        f"run {case.id} training")
    case.training = resolve_training(job, software.profile(), software.overrides())
