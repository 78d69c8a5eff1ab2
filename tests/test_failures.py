"""Failures, the checkpoint interval and goodput (planner.cost.failures, formulas.md 12.3-12.5):
Daly's published optima, the Llama 3 rate, and save times and intervals derived by hand."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from planner import catalog
from planner.checkpoint_spec import LLAMA3_FAILURES_PER_GPU_HOUR, CheckpointSpec
from planner.cost import failures
from planner.cost.checkpoint import evaluate_checkpoint, save_load_times
from planner.cost.step import estimate_layout
from planner.layout import Layout
from planner.specs import TrainingSpec


def wall(tau, delta, restart, mtbf):
    """Daly's wall-clock per unit of solve time, 1/efficiency, for the numerical minimiser."""
    return 1.0 / failures.daly_efficiency(tau, delta, restart, mtbf)


@pytest.mark.parametrize("mtbf, paper, want, argmin", [
    # Daly 2006, Figs. 3-5 (delta = 5 min, R = 10 min): M = 24 h -> 117 min, 6 h -> 57 min,
    # 15 min -> 9.1 min; his formula gives 116.69, 56.71, 9.14 (frameworks_checkpoints.md 4.7)
    (1440.0, 117, 116.69, 116.69), (360.0, 57, 56.71, 56.71), (15.0, 9.1, 9.14, 9.17)])
def test_daly_published_optima(mtbf, paper, want, argmin):
    tau = float(failures.daly_interval(5.0, mtbf))
    assert tau == pytest.approx(want, abs=0.01)
    assert round(tau, 0 if paper > 10 else 1) == paper
    best = minimize_scalar(lambda t: wall(t, 5.0, 10.0, mtbf), bounds=(0.5, 5 * mtbf),
                           method="bounded", options={"xatol": 1e-6})
    assert best.x == pytest.approx(argmin, abs=0.01)  # the complete model's minimiser
    if mtbf == 1440.0:  # Young: sqrt(2 x 5 x 1440) = 120.00
        assert float(failures.young_interval(5.0, mtbf)) == pytest.approx(120.0)


def test_daly_beyond_twice_the_mtbf():
    # delta >= 2M: the optimum is M itself
    assert float(failures.daly_interval(30.0, 10.0)) == 10.0


def test_llama3_rate_and_worked_example():
    """419 / (54 d x 24 h x 16,384) = 419 / 21,233,664 = 1.9733e-5 per GPU-hour; on 16,384 GPUs
    M = 1,296 h / 419 = 3.093 h = 11,135 s. delta = 30 s: Young sqrt(2 x 30 x 11,135) = 817.4 s,
    Daly 817.4 x (1 + 0.0367/3 + 0.00135/9) - 30 = 797.5 s; R = 600 s: efficiency
    1/[(M/tau) e^(R/M) (e^((tau+delta)/M) - 1)] = 0.8797 (frameworks_checkpoints.md 4.6)."""
    assert LLAMA3_FAILURES_PER_GPU_HOUR == pytest.approx(1.9733e-5, rel=1e-4)
    assert CheckpointSpec().failures_per_gpu_hour == LLAMA3_FAILURES_PER_GPU_HOUR
    mtbf = float(failures.job_mtbf(16_384, LLAMA3_FAILURES_PER_GPU_HOUR / 3600))
    assert mtbf / 3600 == pytest.approx(3.093, abs=1e-3)
    assert float(failures.young_interval(30.0, mtbf)) == pytest.approx(817.4, abs=0.1)
    tau = float(failures.daly_interval(30.0, mtbf))
    assert tau == pytest.approx(797.5, abs=0.1)
    assert float(failures.daly_efficiency(tau, 30.0, 600.0, mtbf)) == pytest.approx(0.8797, abs=1e-4)


def test_interval_steps_and_async_goodput():
    # 100 s optimum at 30 s per step: 3 steps; a 200 s background write needs ceil(6.67) = 7;
    # a 10 s optimum is still one step
    assert failures.interval_steps(100.0, 30.0).tolist() == 3.0
    assert failures.interval_steps(100.0, 30.0, 200.0).tolist() == 7.0
    assert failures.interval_steps(10.0, 30.0).tolist() == 1.0
    # an async save whose write W can be lost costs W/M more: eff x (1 - W/M)
    eff = float(failures.daly_efficiency(600.0, 1.0, 600.0, 1e5))
    assert float(failures.goodput(600.0, 1.0, 600.0, 1e5, 100.0)) == pytest.approx(eff * (1 - 1e-3))
    # more GPUs fail more often: goodput falls with N at fixed save and restart times
    mtbf = failures.job_mtbf(np.array([1024, 16_384, 131_072]), LLAMA3_FAILURES_PER_GPU_HOUR / 3600)
    g = failures.goodput(failures.daly_interval(5.0, mtbf), 5.0, 600.0, mtbf)
    assert np.all(np.diff(g) < 0)


def test_save_and_load_times_by_hand(h100):
    """dgx-h100: host link 64 GB/s per GPU, storage 800 Gb/s = 100 GB/s per host / 8 GPUs =
    12.5 GB/s per GPU, file system 2 TB/s. A 5e9 B rank of a 2.5e12 B checkpoint: copy to host
    5e9/64e9 = 78.125 ms; write max(5e9/12.5e9 = 0.4 s, 2.5e12/2e12 = 1.25 s) = 1.25 s."""
    t = save_load_times(h100, 5e9, 2.5e12, async_save=True)
    assert float(t["stage_s"]) == pytest.approx(0.078125)
    assert float(t["write_s"]) == pytest.approx(1.25) and float(t["load_s"]) == pytest.approx(1.25)
    assert bool(t["async"]) and float(t["blocking_s"]) == pytest.approx(0.078125)
    assert float(t["save_s"]) == pytest.approx(1.328125)
    sync = save_load_times(h100, 5e9, 2.5e12, async_save=False)
    assert float(sync["blocking_s"]) == pytest.approx(1.25)
    # a few GPUs: the host link, not the file system, bounds the write (1e10/12.5e9 = 0.8 s)
    assert float(save_load_times(h100, 1e10, 8e10, True)["write_s"]) == pytest.approx(0.8)
    # staging needs host memory: 2 TB per host / 8 = 250 GB per GPU; 300 GB does not fit
    big = save_load_times(h100, 3e11, 3e12, async_save=True)
    assert not bool(big["async"]) and float(big["blocking_s"]) == float(big["write_s"])


def test_evaluate_checkpoint_composes_the_terms(gpt3, h100):
    """GPT-3 175B, tp=8 pp=8 dp=8 on 512 H100: the largest rank writes 4,939,780,608 B
    (test_checkpoint), the whole 2,444,621,856,768 B. delta = 4.9398e9/64e9 = 77.18 ms;
    W = 2.4446e12/2e12 = 1.2223 s; M = 1/(512 x 1.9733e-5) h = 356,323 s; R = 600 + 1.2223 s;
    Daly tau = sqrt(2 x 0.07718 x 356,323) x (1 + ...) - 0.077 = 234.5 s."""
    tr = TrainingSpec(seq_length=2048, global_batch_size=1536)
    lay = Layout(tp=8, pp=8, dp=8, zero_stage=1, micro_batch_size=1, sequence_parallel=True)
    est = estimate_layout(gpt3, h100, tr, lay)
    d = evaluate_checkpoint(gpt3, h100, tr, est.candidates, est.time["step"]).to_dict(0)
    assert d["blocking_s"] == pytest.approx(4_939_780_608 / 64e9)
    assert d["write_s"] == pytest.approx(2_444_621_856_768 / 2e12)
    assert d["mtbf_s"] == pytest.approx(3600 / (512 * 419 / (54 * 24 * 16_384)))
    assert d["restart_s"] == pytest.approx(600 + d["load_s"])
    # Daly (FGCS 2006): sqrt(2*delta*M)*(1 + x/3 + x^2/9) - delta, x = sqrt(delta/(2M)), with
    # delta = 0.077184072 s and M = 3600*54*24*16384/(512*419) = 356,322.67 s:
    # sqrt(2 x 0.077184072 x 356,322.67) = sqrt(55,004.87) = 234.5312; x = sqrt(0.077184072 /
    # 712,645.35) = 3.2910e-4, 1 + x/3 + x^2/9 = 1.00010971; 234.5312 x 1.00010971 - 0.0772
    # = 234.4797 s
    delta, mtbf = 4_939_780_608 / 64e9, 3600 * 54 * 24 * 16_384 / (512 * 419)
    x = (delta / (2 * mtbf)) ** 0.5
    assert d["optimal_interval_s"] == pytest.approx((2 * delta * mtbf) ** 0.5 * (1 + x / 3 + x * x / 9)
                                                    - delta, rel=1e-12)
    assert d["optimal_interval_s"] == pytest.approx(234.4797, abs=1e-4)
    step = float(est.time["step"][0])
    assert d["interval_steps"] == max(1, round(d["optimal_interval_s"] / step))
    assert d["interval_s"] == pytest.approx(d["interval_steps"] * step)
    g = float(failures.goodput(d["interval_s"], d["blocking_s"], d["restart_s"], d["mtbf_s"],
                               d["write_s"]))
    assert d["goodput"] == pytest.approx(g) and 0.99 < g < 1 - 600 / d["mtbf_s"]
    assert d["placeholders"] == ["storage.aggregate"]  # Meta's Tectonic stands in for yours


def test_missing_storage_block_is_one_line(gpt3):
    hw = catalog.resolve_hardware("dgx-h100").model_copy(update={"storage": None})
    from planner.cost.checkpoint import unavailable
    from planner.errors import UsageError
    assert unavailable(hw) == "storage"
    tr = TrainingSpec(seq_length=2048, global_batch_size=1536)
    lay = Layout(tp=8, pp=8, dp=8, zero_stage=1, micro_batch_size=1)
    est = estimate_layout(gpt3, hw, tr, lay)
    with pytest.raises(UsageError, match="no storage block"):
        evaluate_checkpoint(gpt3, hw, tr, est.candidates, est.time["step"])
