"""Shared fixtures: models built by hand (independent of the catalog), catalog lookups, and the
benchmarks/ scripts as modules."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

from planner import catalog
from planner.specs import ModelSpec, TrainingSpec


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str, module_name: str | None = None):
    """The script benchmarks/``name``.py, executed afresh as a module registered in sys.modules
    under ``module_name`` (default ``name``: its dataclasses look their module up there), with
    benchmarks/ on sys.path for the scripts it imports."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    module_name = module_name or name
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def gpt(name: str, layers: int, hidden: int, heads: int, batch: int = 1, **kw) -> ModelSpec:
    """A Korthikanti/Narayanan-style GPT: MHA, GeLU 4h, biases, LayerNorm, dropout 0.1, V=51200."""
    return ModelSpec(name=name, source="test", num_layers=layers, hidden_size=hidden,
                     num_attention_heads=heads, vocab_size=51200, activation="gelu",
                     tie_embeddings=True, norm="layernorm", bias=True,
                     position_embedding="learned", max_position_embeddings=2048, dropout=0.1,
                     training={"seq_length": 2048, "global_batch_size": batch}, **kw)


@pytest.fixture(scope="session")
def gpt3_h100():
    """(GPT-3 175B, dgx-h100, its published batch 1536 x 2048 and 300B training tokens)."""
    return (catalog.resolve_model("175b"), catalog.resolve_hardware("dgx-h100"),
            TrainingSpec(seq_length=2048, global_batch_size=1536, tokens=3.0e11))


@pytest.fixture(scope="session")
def h100():
    return catalog.resolve_hardware("dgx-h100")


@pytest.fixture(scope="session")
def gpt3():
    return catalog.resolve_model("gpt3-175b")


@pytest.fixture(scope="session")
def gpt3_training():
    return TrainingSpec(seq_length=2048, global_batch_size=1536)


@contextlib.contextmanager
def wide_console(width: int = 200):
    """plan3d's stdout console laid out for ``width`` columns inside the block (a wide
    terminal); tests otherwise run at 80 columns, the width piped output has."""
    from planner.render.console import out
    before = out.width
    out.width = width
    try:
        yield out
    finally:
        out.width = before


@pytest.fixture(autouse=True, scope="session")
def _eighty_columns():
    """Every test sees what a pipe gets: 80 columns, whatever $COLUMNS the shell exported
    (subprocesses too)."""
    import os

    from planner.render.console import out
    saved, os.environ["COLUMNS"] = os.environ.get("COLUMNS"), "80"
    out.width = 80
    yield
    if saved is None:
        del os.environ["COLUMNS"]
    else:
        os.environ["COLUMNS"] = saved
