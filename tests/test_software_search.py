"""The software axes in the search (layout.axes role "software"; search.scan): the step pass
times each layout with its preferred allowed software, then refines the best with every allowed
combination. The winner must be what timing every combination of every fitting layout finds,
its software must be allowed, and a pinned switch must stay pinned."""

from __future__ import annotations

import numpy as np
import pytest

from planner import catalog
from planner.framework_spec import MOE_DISPATCHERS
from planner.search import software_scan as software_scan
from planner.search.options import SearchOptions
from planner.search.run import search
from planner.search.rules import constraint_masks
from planner.layout import Candidates
from planner.specs import TrainingSpec

CASES = [  # (model, hardware, GPUs, sequence, batch): small grids, dense and MoE
    ("llama3-8b", "dgx-h100", 16, 8192, 128),
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 256),
    ("mixtral-8x7b", "dgx-b200", 16, 4096, 128),
]


def _run(name, hardware, gpus, seq, batch, **opts):
    m, hw = catalog.resolve_model(name), catalog.resolve_hardware(hardware)
    tr = TrainingSpec(seq_length=seq, global_batch_size=batch)
    return m, hw, tr, search(m, hw, tr, gpus, SearchOptions(keep=3, max_vpp=4, **opts))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refined_winner_is_the_exhaustive_winner(case, monkeypatch):
    """Timing every allowed software combination of every fitting layout (the pool made large
    enough to hold them all, every one refined) finds the same best throughput as the two
    passes."""
    *_, fast = _run(*case)
    monkeypatch.setattr(software_scan, "REFINE", 10**9)
    *_, full = _run(*case)
    best = lambda r: float(r.ranked.throughput["tokens_per_s"][0])  # noqa: E731
    assert best(fast) == pytest.approx(best(full), rel=1e-9)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_winners_software_passes_every_rule(case):
    """Every ranked layout, its chosen software included, passes every rule (the software
    rules among them) on its hardware."""
    m, hw, tr, r = _run(*case)
    c = Candidates.from_layouts([r.ranked.candidates.layout(i) for i in range(len(r.ranked.candidates))])
    for rule, ok in constraint_masks(m, tr, hw, c).items():
        assert np.all(ok), rule


def test_pinned_software_stays_pinned():
    """A pinned dispatcher and a switch pinned off are what every ranked layout runs."""
    _, _, _, r = _run("qwen3-30b-a3b", "dgx-h100", 16, 4096, 256,
                      moe_dispatcher="alltoall", moe_a2a_overlap=False)
    c = r.ranked.candidates
    assert np.all(np.asarray(c.moe_dispatcher) == MOE_DISPATCHERS.index("alltoall"))
    assert not np.any(np.asarray(c.moe_a2a_overlap))


def test_a_dense_model_runs_no_dispatcher_and_no_ep_overlap():
    """A dense model has no MoE switch to choose: the defaults (all-to-all, no EP overlap)."""
    _, _, _, r = _run("llama3-8b", "dgx-h100", 16, 8192, 128)
    c = r.ranked.candidates
    assert np.all(np.asarray(c.moe_dispatcher) == 0) and not np.any(np.asarray(c.moe_a2a_overlap))


def test_unravel_of_a_grid_shaped_array():
    """The step pass unravels a chosen combination per layout of a sub-grid shape with unit
    dimensions, where numpy 2.4.6's own unravel_index errs: every index round-trips."""
    from planner.search.software_scan import _unravel
    index = np.random.default_rng(0).integers(0, 16, size=(152, 4, 7, 4, 1, 3, 1))
    a, b, c, d = _unravel(index, (2, 2, 2, 2))
    assert np.array_equal(8 * a + 4 * b + 2 * c + d, index)
