"""The pipeline schedules in the cost model: activation peaks from the op order (closed forms
against the simulated order), the step from the simulator (the extension of long steps against
the full simulation), the per-stage F / I / W split, the deferred-W share gamma, which ranks
hold the embedding, the head and DualPipe's two copies, Megatron-Core's combined 1F1B, and the
search per framework. Expected values are hand-derived (arithmetic in the comments), the
reference's closed forms or test vectors (reference/pipeline_schedules.md), or the full
simulation of the same order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import catalog
from planner.cost import pipeline
from planner.cost.estimate import TIME_TERMS
from planner.cost.memory import deferred_w_fraction, rank_params
from planner.cost.schedule_sim import (closed_peak_chunks, combined_1f1b_makespan,
                                       simulated_steps)
from planner.cost.schedules import _chain, _stage_layers, stage_times, zero_bubble_ratio
from planner.cost.step import evaluate
from planner.cost.traffic import Elements
from planner.cost.volumes import edge_collectives
from planner.framework_spec import PIPELINE_SCHEDULES
from planner.layout import Candidates, Layout
from planner.schedule import build_schedule, simulate_batch
from planner.schedule.graph import graph, peak_memory
from planner.specs import TrainingSpec
from tests.conftest import gpt

CODE = {name: code for code, name in enumerate(PIPELINE_SCHEDULES)}


def _order_peak(name, p, m, v, rank, gamma):
    """The simulated order's peak in chunks at gamma (schedule.graph)."""
    return float(peak_memory([graph(build_schedule(name, p, m, v)).memory[2][rank]], gamma)[0])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpipe", "looped-bfs", "interleaved-zero-bubble", "zbv", "dualpipev",
                             "dualpipe"]),
       p=st.integers(2, 6), extra=st.integers(0, 12), v=st.integers(2, 3), rank=st.integers(0, 5),
       gamma=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_closed_peaks_equal_the_simulated_order(name, p, extra, v, rank, gamma):
    # the memory model's peaks (schedule_sim.closed_peak_chunks) are the op order's own
    v = {"gpipe": 1, "dualpipe": 1, "zbv": 2, "dualpipev": 2}.get(name, v)
    p = p + p % 2 if name == "dualpipe" else p
    m = 2 * p + extra + (extra % 2 if name == "dualpipe" else 0)
    if name == "interleaved-zero-bubble":
        m = p * (1 + extra % 4)              # PyTorch's rounds: a multiple of max(1, m // p)
    rank = rank % p
    closed = closed_peak_chunks(CODE[name], p, m, v, rank, gamma)
    assert float(closed) == pytest.approx(_order_peak(name, p, m, v, rank, gamma), abs=1e-12)


def _cost_shaped(p, v, k, seed):
    """(F, I, W) (k, p*v) of the cost model's shape: equal stages, the embedding's stage 0 a
    little heavier, the loss's stage S-1 up to 3.5x."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(0.5, 1.5, (k, 1))
    F, I, W = (np.repeat(f * a, p * v, axis=1) for a in (1.0, rng.uniform(1.0, 1.5, (k, 1)),
                                                           rng.uniform(0.5, 1.0, (k, 1))))
    loss, embedding = rng.uniform(0, 2.5, (k, 1)) * f, rng.uniform(0, 0.3, (k, 1)) * f
    F[:, -1:] += 0.4 * loss
    I[:, -1:] += 0.4 * loss
    W[:, -1:] += 0.2 * loss
    F[:, :1] += 0.5 * embedding
    I[:, :1] += 0.5 * embedding
    return F, I, W


@pytest.mark.parametrize("name,v", [("zbv", 2), ("dualpipev", 2), ("dualpipe", 1), ("gpipe", 1),
                                    ("interleaved-zero-bubble", 2), ("interleaved-zero-bubble", 4)])
@pytest.mark.parametrize("p", [2, 4])
def test_extension_equals_the_full_simulation(name, v, p):
    # T(m) = T(m_a) + (m - m_a) x period, against simulating all m micro-batches
    F, I, W = _cost_shaped(p, v, 40, seed=p)
    for m in (10 * p, 40 * p):
        extended, _ = simulated_steps(name, p, v, np.full(40, m), F, I, W, np.zeros(40))
        full = simulate_batch(build_schedule(name, p, m, v), F, I=I, W=W).t_sync
        np.testing.assert_allclose(extended, full, rtol=1e-9)


def test_extension_of_equal_stages_is_the_closed_form():
    # DualPipeV TV8: p = 4, unit chunk F = I = W, FB = F + B = 3 per pair: T = 2m*3 + 3*2;
    # m = 16 is simulated, m = 64 (beyond m_a + d = 12 + 2) extended: 2*64*3 + 6 = 390
    steps, work = simulated_steps("dualpipev", 4, 2, np.array([16, 64]), np.ones((2, 8)),
                                  np.ones((2, 8)), np.ones((2, 8)), np.zeros(2))
    assert steps.tolist() == [102.0, 390.0] and work.tolist() == [96.0, 384.0]


def _terms(**kinds):
    keys = ("blocks", "fwd", "bwd", "wgrad", "recompute", "edge", "overhead")
    return {k: {n: np.array([float(x)]) for n, x in zip(keys, values)} for k, values in kinds.items()}


def test_stage_times_split_forward_input_and_weight_gradients():
    # p = 2, v = 2, 8 layers: every chunk 2 of a rank's 4 layers (share 1/2). Rank 0 (first):
    # blocks 4 s, forward kernels 1, backward 2, wgrad 1, no recompute, edge 0.5 (embedding's
    # TP), overhead 0.2 (p2p, ZeRO: 0.1 a chunk). Stage 0 = rank 0 chunk 0:
    #   total = 4/2 + 0.1 + 0.5 = 2.6; other = (4 - 1 - 2)/2 + 0.1 + 0.5 = 1.1;
    #   F = 1/2 + 1.1/2 = 1.05; W = 1/2 = 0.5; I = 2.6 - 1.05 - 0.5 = 1.05.
    # Stage 3 = rank 1 (last) chunk 1 with the loss's edge 1.0: total = 2 + 0.1 + 1 = 3.1,
    #   F = 0.5 + (0.5 + 0.1 + 1)/2 = 1.3, W = 0.5, I = 1.3.
    terms = _terms(first=(4, 1, 2, 1, 0, 0.5, 0.2), middle=(4, 1, 2, 1, 0, 0, 0.2),
                   last=(4, 1, 2, 1, 0, 1.0, 0.2))
    cg = Candidates(tp=np.array([1]), pp=np.array([2]), dp=np.array([1]), zero_stage=np.array([1]),
                    micro_batch_size=np.array([1]), vpp=np.array([2]))
    F, I, W = stage_times(terms, cg, 8, 2, 2)
    np.testing.assert_allclose(F[0], [1.05, 0.8, 0.8, 1.3])     # stages 1, 2: (0.5+0.1)/2 + 0.5
    np.testing.assert_allclose(W[0], [0.5, 0.5, 0.5, 0.5])
    np.testing.assert_allclose(I[0], [1.05, 0.8, 0.8, 1.3])
    # each rank's stages sum to its per-micro-batch total: 4 + 0.2 + edge
    np.testing.assert_allclose((F + I + W)[0, [0, 2]].sum(), 4 + 0.2 + 0.5)
    np.testing.assert_allclose((F + I + W)[0, [1, 3]].sum(), 4 + 0.2 + 1.0)


def test_zero_bubble_ratio_of_equal_times():
    # F = I = W = 1: interleaved zero bubble keeps max(1+1-1, 1, 1) / 3 = 1/3 of interleaved
    # 1F1B's bubble (TV7: (p-1) x 1 of (p-1) x 3)
    terms = _terms(first=(3, 1, 2, 1, 0, 0, 0), middle=(3, 1, 2, 1, 0, 0, 0), last=(3, 1, 2, 1, 0, 0, 0))
    assert float(zero_bubble_ratio(terms)[0]) == pytest.approx(1 / 3)


def test_gamma_of_a_gpt_layer():
    # flash attention, tp = 1: saved per token 34h + 4a (Korthikanti's 34h, the fp32
    # log-sum-exp 4a instead of the scores); the weight-gradient GEMMs need each linear layer's
    # input and output gradient, 2 B each: QKV 2h + 6h, out-proj 2h + 2h, fc1 2h + 8h, fc2 8h +
    # 2h = 32h (the ZB authors' 32h): gamma = 32h / (34h + 4a) = 131072 / 139392 for h 4096, a 32
    model = gpt("g", 8, 4096, 32)
    training = TrainingSpec(seq_length=2048, global_batch_size=8)
    c = Candidates.from_layouts([Layout(tp=1, pp=2, dp=1, zero_stage=1, micro_batch_size=1)])
    assert float(deferred_w_fraction(model, training, c)[0]) == pytest.approx(131072 / 139392)
    full = c.replace(recompute=np.array([2]))  # W needs more than full recompute saved: 1
    assert float(deferred_w_fraction(model, training, full)[0]) == 1.0


def _layout(schedule: str, vpp: int, **kw) -> Layout:
    return Layout(**{**dict(tp=8, pp=4, dp=2, zero_stage=3, micro_batch_size=1, vpp=vpp,
                            pipeline_schedule=schedule), **kw})


def test_dualpipe_holds_two_copies_and_both_edges():
    model = catalog.resolve_model("llama3-70b")
    one = Candidates.from_layouts([_layout("1f1b", 1)])
    dual = Candidates.from_layouts([_layout("dualpipe", 1)])
    for rank in range(4):
        a, b = rank_params(model, one, rank), rank_params(model, dual, rank)
        assert float(b["dense"][0]) == 2 * float(a["dense"][0])
    # ranks 0 and 3 hold stage 0 of one direction and stage 3 of the other: embedding and head
    for rank, edges in ((0, True), (1, False), (2, False), (3, True)):
        p = rank_params(model, dual, rank)
        assert (float(p["embedding"][0]) > 0, float(p["head"][0]) > 0) == (edges, edges)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_shapes_put_the_head_on_rank_zero(schedule):
    # rank r holds stages r and 2p-1-r: the loss's stage 2p-1 is rank 0's
    model = catalog.resolve_model("llama3-70b")
    c = Candidates.from_layouts([_layout(schedule, 2)])
    assert float(rank_params(model, c, 0)["head"][0]) > 0
    assert float(rank_params(model, c, 3)["head"][0]) == 0
    assert bool(np.all(pipeline.holds_embedding(c, 0))) and not np.any(pipeline.holds_embedding(c, 3))


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved-1f1b", 2), ("gpipe", 1),
                                          ("looped-bfs", 2), ("interleaved-zero-bubble", 2),
                                          ("zbv", 2), ("dualpipev", 2), ("dualpipe", 1)])
def test_every_schedule_step_is_its_terms(schedule, vpp):
    # the step's terms sum to the step, the bubble is not negative, the exact path (every
    # schedule simulated, each m as it is) agrees with the fast one where that simulates
    model, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    training = TrainingSpec(seq_length=8192, global_batch_size=128, framework="torchtitan")
    c = Candidates.from_layouts([_layout(schedule, vpp)])
    for exact in (False, True):
        est = evaluate(model, hw, training, c, exact=exact)
        assert sum(est.time[t][0] for t in TIME_TERMS) == pytest.approx(est.time["step"][0], rel=1e-12)
        assert est.time["bubble"][0] >= 0
    if schedule in ("zbv", "dualpipev", "dualpipe"):
        assert evaluate(model, hw, training, c).time["step"][0] == pytest.approx(
            evaluate(model, hw, training, c, exact=True).time["step"][0], rel=1e-9)


def test_combined_1f1b_reproduces_tv10():
    # PP = 1, m = 8, F = 1, B = 2, FB = 2.5: T = F + 7 FB + B = 1 + 17.5 + 2 = 20.5
    t, peaks = combined_1f1b_makespan(1, 8, 1, F=1.0, B=2.0, FB=2.5)
    assert t.tolist() == [20.5] and peaks.tolist() == [2]
    # PP = 4, v = 2, m = 8, chunk F = 1, B = 2: FB = 3 -> 48 + 3 x 3 = 57; FB = 2 -> 46;
    # peaks one chunk above interleaved's 11, 9, 7, 5
    t, peaks = combined_1f1b_makespan(4, 8, 2, F=1.0, B=2.0, FB=np.array([[3.0], [2.0]]))
    assert t.tolist() == [57.0, 46.0] and peaks.tolist() == [12, 10, 8, 6]


def test_grid_equals_flat_with_simulated_schedules():
    # the simulated schedules run per group of flat candidates: a broadcast grid of torchtitan's
    # space (its schedule axis: IMPLIED, GPipe, looped BFS, interleaved zero bubble, ZB-V,
    # DualPipeV) gives every layout the value the flat evaluation gives it
    from planner.search.grid import build_grid, full
    from planner.search.options import SearchOptions
    m, hw = catalog.resolve_model("llama3-8b"), catalog.resolve_hardware("dgx-h100")
    tr = TrainingSpec(seq_length=2048, global_batch_size=32, framework="torchtitan")
    opts = SearchOptions(max_micro_batch_size=2, max_vpp=4, tp=1, max_cp=1,
                         framework=catalog.resolve_framework("torchtitan"))
    grid = build_grid(m, hw, tr, 16, opts)
    assert len(grid.knobs["pipeline_schedule"]) == 6
    flat_c = grid.flat(np.arange(grid.size))
    keep = pipeline.schedule_runs(flat_c, flat_c.num_microbatches(32))
    est_grid = evaluate(m, hw, tr, grid.candidates(), summary=True)
    est_flat = evaluate(m, hw, tr, flat_c, summary=True)
    grid_step = full(est_grid.time["step"], grid.shape).ravel()
    assert np.any(keep & pipeline.simulated(flat_c))
    np.testing.assert_array_equal(grid_step[keep], est_flat.time["step"][keep])


def _search(framework: str, model: str = "llama3-70b", gpus: int = 64, **pins):
    from planner.search.options import SearchOptions
    from planner.search.run import search
    from planner.frameworks.profile import resolve_training
    profile = catalog.resolve_framework(framework)
    m, hw = catalog.resolve_model(model), catalog.resolve_hardware("dgx-h100")
    training = resolve_training(TrainingSpec(seq_length=m.training.seq_length,
                                             global_batch_size=m.training.global_batch_size),
                                profile)
    return search(m, hw, training, gpus, SearchOptions(framework=profile, **pins))


ZERO_BUBBLE = ("interleaved-zero-bubble", "zbv", "dualpipev")


def test_torchtitan_search_picks_a_zero_bubble_schedule():
    # Llama 3 70B on 64 H100 with torchtitan: interleaved zero bubble keeps ~half of interleaved
    # 1F1B's bubble (zero_bubble_ratio) at no more memory (rank 0: p micro-batches instead of
    # p + (p-1)/v), so it wins where its layout fits; async TP (TP overlap) compiles the model,
    # which those schedules refuse, so it is off here (with it free, the search pairs them never)
    free = _search("torchtitan")
    assert not any(free.ranked.candidates.layout(i).tp_comm_overlap and
                   free.ranked.candidates.layout(i).pipeline_schedule in ZERO_BUBBLE
                   for i in range(len(free.ranked)))
    res = _search("torchtitan", tp_comm_overlap=False)
    best = res.ranked.candidates.layout(0)
    assert best.pipeline_schedule in ZERO_BUBBLE
    twin = evaluate(*_inputs("torchtitan"), Candidates.from_layouts(
        [best.model_copy(update={"pipeline_schedule": "interleaved-1f1b" if best.vpp > 1 else "1f1b"})]))
    assert res.ranked.time["step"][0] < twin.time["step"][0]


def _inputs(framework: str):
    from planner.frameworks.profile import resolve_training
    m, hw = catalog.resolve_model("llama3-70b"), catalog.resolve_hardware("dgx-h100")
    return m, hw, resolve_training(TrainingSpec(seq_length=8192, global_batch_size=2048),
                                   catalog.resolve_framework(framework))


@pytest.mark.parametrize("framework,allowed", [("megatron-core", {"1f1b", "interleaved-1f1b"}),
                                               ("deepspeed", {"1f1b"})])
def test_megatron_and_deepspeed_searches_keep_their_schedules(framework, allowed):
    res = _search(framework)
    kept = {res.ranked.candidates.layout(i).pipeline_schedule for i in range(len(res.ranked))}
    assert kept <= allowed


def test_stage_times_of_a_v_shape_follow_its_chain():
    # ZB-V, p = 2, v = 2, 8 layers: the chain's stages 0, 1, 2, 3 sit on ranks 0, 1, 1, 0
    # (rank r holds stages r and 2p-1-r). Rank 0 holds the loss (its edge 1.0) on stage 3, not
    # stage 0. Stage 0: total = 4/2 + 0.1 = 2.1, other = 0.5 + 0.1 = 0.6, F = 0.5 + 0.3 = 0.8,
    # W = 0.5, I = 0.8; stage 3: total = 2 + 0.1 + 1 = 3.1, F = 0.5 + (0.5 + 0.1 + 1)/2 = 1.3,
    # I = 1.3; rank 1's stages 1, 2 as stage 0.
    terms = _terms(first=(4, 1, 2, 1, 0, 1.0, 0.2), middle=(4, 1, 2, 1, 0, 0, 0.2),
                   last=(4, 1, 2, 1, 0, 0, 0.2))
    cg = Candidates(tp=np.array([1]), pp=np.array([2]), dp=np.array([1]), zero_stage=np.array([1]),
                    micro_batch_size=np.array([1]), vpp=np.array([2]),
                    pipeline_schedule=np.array([PIPELINE_SCHEDULES.index("zbv")]))
    F, I, W = stage_times(terms, cg, 8, 2, 2)
    np.testing.assert_allclose(F[0], [0.8, 0.8, 0.8, 1.3])
    np.testing.assert_allclose(I[0], [0.8, 0.8, 0.8, 1.3])
    sched = build_schedule("zbv", 2, 4, 2)
    assert [sched.rank_of(s) for s in range(4)] == [0, 1, 1, 0]
    np.testing.assert_allclose((F + I + W)[0, [0, 3]].sum(), 4 + 0.2 + 1.0)  # rank 0
    np.testing.assert_allclose((F + I + W)[0, [1, 2]].sum(), 4 + 0.2)        # rank 1


def test_embedding_and_loss_split_under_a_v_shape():
    # Llama 3 405B, 126 layers + embedding + loss = 128 layers' worth on pp 8, vpp 2: chunks of
    # 8, first = last = 15. Looped (interleaved 1F1B): rank 0 holds chunks [7, 8] = 15, rank 7
    # [8, 7] = 15. ZB-V / DualPipeV (stages r and 15-r on rank r): the embedding's stage 0 and
    # the loss's stage 15 are rank 0's, [7, 7] = 14; rank 7 holds stages 7 and 8, [8, 8] = 16.
    for name, ranks, chain in (("interleaved-1f1b", (15, 16, 15), None),
                               ("zbv", (14, 16, 16), [7] + [8] * 14 + [7]),
                               ("dualpipev", (14, 16, 16), [7] + [8] * 14 + [7])):
        lay = Layout(tp=8, pp=8, dp=4, zero_stage=1, micro_batch_size=1, vpp=2,
                     first_stage_layers=15, last_stage_layers=15, pipeline_schedule=name)
        c = Candidates.from_layouts([lay])
        assert tuple(float(c.rank_layers(126, r)[0]) for r in (0, 1, 7)) == ranks, name
        assert lay.rank_layers(126, 0) == ranks[0]  # one Layout names its schedule
        assert sum(float(c.rank_layers(126, r)[0]) for r in range(8)) == 126
        if chain is not None:
            assert _stage_layers(c, 126, _chain(8, 2, True))[0].tolist() == chain


def test_the_v_shapes_run_the_loss_on_rank_zero():
    # ZB-V and DualPipeV put stage 2p-1 (output layer, loss) on rank 0: its TP collectives (SP:
    # the output's all-gather forward, reduce-scatter backward, 3 cross-entropy all-reduces) and
    # its compute are rank 0's per micro-batch, none of rank p-1's; interleaved 1F1B the reverse.
    m = catalog.resolve_model("llama3-8b")
    tr = TrainingSpec(seq_length=8192, global_batch_size=64)
    for name, loss_rank in (("zbv", 0), ("dualpipev", 0), ("interleaved-1f1b", 3)):
        lay = Layout(tp=2, pp=4, dp=2, zero_stage=1, micro_batch_size=1, vpp=2,
                     sequence_parallel=True, pipeline_schedule=name)
        c = Candidates.from_layouts([lay])
        assert [bool(pipeline.runs_loss(c, r)[0]) for r in range(4)] == [r == loss_rank for r in range(4)]
        for rank in range(4):
            calls = {x.kind: float(np.ravel(x.calls)[0]) for x in
                     edge_collectives(m, tr, c, np.array(rank), Elements.of(tr))
                     if x.kind == "all_gather"}  # the output layer's SP all-gather
            assert calls == {"all_gather": 1.0 if rank == loss_rank else 0.0}, (name, rank)
