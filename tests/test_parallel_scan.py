"""The step pass dealt over processes (planner.search.parallel) keeps what one process keeps."""

import sys

import numpy as np
import pytest

from planner import catalog
from planner.errors import UsageError
from planner.inputs import training_spec
from planner.search import parallel
from planner.search.options import SearchOptions
from planner.search.run import search


def test_deal_gives_the_largest_part_to_the_least_loaded_group():
    # sizes 5, 4, 3, 3, 1 on 2 groups: 5 -> A (5), 4 -> B (4), 3 -> B (7), 3 -> A (8), 1 -> B (8)
    assert parallel.deal([5, 4, 3, 3, 1], 2) == [[0, 3], [1, 2, 4]]
    # more groups than parts: the empty ones are dropped
    assert parallel.deal([2, 1], 4) == [[0], [1]]


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", "", "\u00b2"])
def test_a_bad_job_count_is_refused(monkeypatch, text):
    monkeypatch.setenv("PLAN3D_JOBS", text)
    with pytest.raises(UsageError, match="PLAN3D_JOBS"):
        parallel.jobs()


def _ranked(monkeypatch, jobs: int, name: str, gpus: int):
    monkeypatch.setenv("PLAN3D_JOBS", str(jobs))
    monkeypatch.setattr(parallel, "MIN_PARALLEL", 0)   # split even a small pass
    merged = []
    merge = parallel._merge
    monkeypatch.setattr(parallel, "_merge", lambda out, part: merged.append(1) or merge(out, part))
    m = catalog.resolve_model(name)
    hw = catalog.resolve_hardware("dgx-h100")
    result = search(m, hw, training_spec(m, {}), gpus, SearchOptions(keep=8))
    c = result.ranked.candidates
    return ([c.layout(i).short() for i in range(len(c))], result.ranked.time["step"].tolist(),
            dict(result.pruned), len(merged))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the step pass forks on Linux only")
@pytest.mark.parametrize("name,gpus", [("llama3-8b", 64), ("qwen3-30b-a3b", 32)])
def test_three_processes_keep_what_one_keeps(monkeypatch, name, gpus):
    # dense and MoE (software axes chosen per layout): the same layouts in the same order, the
    # same step times and the same counts per rule
    one = _ranked(monkeypatch, 1, name, gpus)
    three = _ranked(monkeypatch, 3, name, gpus)
    assert one[0] == three[0] and np.array_equal(one[1], three[1]) and one[2] == three[2]
    assert len(one[0]) >= 8
    assert one[3] == 0 and three[3] == 4   # two forked workers merged by the memory and step passes


def test_a_workers_sparse_record_reads_as_the_grid_array_does():
    # GridLayers keeps one value per layout; a worker keeps the pairs it adds. Indices 7 and 2
    # get 3 and 5, zeros are not recorded, index 7 is written again with 4 (the last wins).
    from planner.search.state import GridLayers
    dense, sparse = GridLayers(10, np.uint8), parallel.SparseLayers()
    for index, layers in ((np.array([7, 2, 9]), np.array([3, 5, 0])), (np.array([7]), np.array([4]))):
        dense.add(index, layers)
        sparse.add(index, layers)
    ask = np.array([0, 2, 7, 9, 2])
    assert sparse.find(ask).tolist() == dense.find(ask).tolist() == [0, 5, 4, 0, 5]
    at, values = sparse.pairs()
    assert at.tolist() == [2, 7] and values.tolist() == [5, 4]


def test_where_no_worker_can_be_forked_one_process_does_it_all(monkeypatch):
    # a fork refused at the first submit (OSError), and a daemonic process (which may not have
    # children): both run every sub-grid here, keeping what one process keeps
    one = _ranked(monkeypatch, 1, "llama3-8b", 64)

    class Refused:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, *args):
            raise OSError("fork refused")

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", Refused)
    assert _ranked(monkeypatch, 3, "llama3-8b", 64)[:3] == one[:3]
    monkeypatch.undo()

    class Daemon:
        daemon = True

    monkeypatch.setattr(parallel.multiprocessing, "current_process", lambda: Daemon())
    daemon = _ranked(monkeypatch, 3, "llama3-8b", 64)
    assert daemon[:3] == one[:3] and daemon[3] == 0
