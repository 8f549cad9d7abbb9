"""The optimiser stage as a CUDA graph against the eager stage, on the GPU (float64)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs.runner import LearningRateDecay, NonFiniteLossError  # noqa: E402
from tests.conftest import count_calls, next_recorded_stage  # noqa: E402

pytestmark = pytest.mark.gpu
COLUMNS = ["e_tot", "e_coupled", "e_variational", "e_pt2", "loss"]


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _runner(name, **kw):
    mol = Molecule.load(name)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64, device="cuda")
    kw.setdefault("topk", 256)
    kw.setdefault("teacher", 0)  # the plain stage; the teacher's below
    return Runner(mol, ansatz, seed=0, **kw)


def _assert_same_runs(a, b, atol):
    """Same |S| every iteration; energies, losses and weights to ``atol``."""
    np.testing.assert_array_equal(a.history["n_space"], b.history["n_space"])
    for c in COLUMNS:
        np.testing.assert_allclose(a.history[c], b.history[c], rtol=0, atol=atol)
    for p, q in zip(a.ansatz.parameters(), b.ansatz.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=atol)


@pytest.mark.parametrize("name", ["LiH", "N2", "H2O"])
def test_graphed_stage_matches_eager_stage(name):
    """Same energies, losses and weights to 1e-10 over 30 iterations (|S| grows through
    several buckets, the rate decays), and the graph path really ran."""
    decay = LearningRateDecay(start=10, end=30, final_lr=1e-4)
    eager = _runner(name, graphs=False).run(30, [decay], progress=False)
    graphed = _runner(name, graphs=True).run(30, [decay], progress=False)
    assert graphed.graphs_active and not eager.graphs_active
    stage = graphed._graph_stage
    assert stage.replays == 30 and 1 <= stage.captures <= 30
    _assert_same_runs(graphed, eager, 1e-10)


@pytest.mark.parametrize("name", ["LiH", "Hubbard-6-ring-U4"])
def test_graphed_stage_over_shared_prefixes_matches_eager_stage(name):
    """`shared_prefix_training=True` in the recorded stage (the tree in static buffers, padded to
    its bucket): the plain eager stage's energies, losses and weights to 1e-10 over 30
    iterations, every one replayed with a tree of fewer prefixes than positions."""
    decay = LearningRateDecay(start=10, end=30, final_lr=1e-4)
    eager = _runner(name, graphs=False).run(30, [decay], progress=False)
    graphed = _runner(name, graphs=True, shared_prefix_training=True)
    graphed.run(30, [decay], progress=False)
    stage = graphed._graph_stage
    assert stage.shared_prefixes and stage.replays == 30
    norb = graphed.ansatz.norb
    assert 0 < stage._key.prefixes < stage._key.rows * norb  # prefix bucket below the positions
    _assert_same_runs(graphed, eager, 1e-10)


@pytest.mark.parametrize("hold", [1.0, 0.0])
@pytest.mark.parametrize("name", ["LiH", "H2O"])
def test_graphed_stage_with_the_teacher_matches_eager_stage(name, hold):
    """The teacher's pull and its inner steps (16 while it is on, then the hold's one-way end or,
    without the hold, the gap rule) inside the recorded stage: every iteration replays a graph,
    and energies, losses and weights agree with the eager stage to 1e-9 (4x the AdamW steps of
    the plain stage). With the hold the pull stays at full weight with 16 inner steps through
    all 20 iterations (320 AdamW steps, whose m / sqrt(v) lifts the rounding differences of
    the two stages, which sum in other orders, once the network sits near the teacher's
    vector): on an H200 the energies then differed by up to 5.4e-9 and LiH's losses by 6.5e-8
    from iteration 11 on; on a CPU the graph body against the eager stage (H2O, same schedule)
    3.2e-7 in the loss and 3.6e-7 in the weights, against 6e-11 and 7e-11 without the hold. So
    with the hold the energies are compared to 1e-7 and the losses and weights to 1e-5 (a wrong
    weight or mask moves the loss by the teacher's loss, ~0.1, at its first iteration)."""
    kw = dict(teacher=1.0, teacher_until=12, teacher_hold=hold)
    tol_e, tol_w = (1e-9, 1e-9) if hold == 0 else (1e-7, 1e-5)
    decay = LearningRateDecay(start=10, end=20, final_lr=1e-4)
    eager = _runner(name, graphs=False, **kw).run(20, [decay], progress=False)
    graphed = _runner(name, graphs=True, **kw).run(20, [decay], progress=False)
    assert graphed.graphs_active and graphed._graph_stage.replays == 20
    assert (graphed.history["inner_steps"].iloc[:11] == 16).all()
    np.testing.assert_array_equal(graphed.history["inner_steps"], eager.history["inner_steps"])
    for c in ["e_teacher", "teacher_weight"]:  # the same S, the same weight
        np.testing.assert_allclose(graphed.history[c], eager.history[c], rtol=0, atol=1e-9)
    for c in COLUMNS:
        tol = tol_w if c == "loss" else tol_e
        np.testing.assert_allclose(graphed.history[c], eager.history[c], rtol=0, atol=tol)
    for a, b in zip(eager.ansatz.parameters(), graphed.ansatz.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol_w)


@pytest.mark.parametrize("name", ["N2", "Hubbard-6-ring-U4"])
def test_side_streams_leave_a_recorded_stage_unchanged(name, monkeypatch):
    """A run with the defaults uses the side streams (`aside.ENABLED` over
    `aside.GRADIENT_STREAMS` streams, `aside.PHASE`) and releases every read at its joins.
    Then one recorded stage of that run (the teacher's 16 inner steps, 17 passes), from the
    same weights and AdamW state, with the parameter gradients (on one side stream or in turn
    on four) and/or the phase MLP on their side streams, with the local energies by
    `local_energy`'s kernels or torch's operations, and recorded on a stream of the highest
    priority (`graphs.CHAIN_PRIORITY`) or not: the weights after it equal those of
    the stage on one stream to 1e-10, and so do the loss and flags (a missing fork or join
    reads gradients before they are written). Whole runs are not compared: with the teacher's
    inner steps two runs of the same path part from iteration 10 at 1e-8 (N2) and from
    iteration 6 at 1e-9 (the ring), growing, on an H100."""
    import copy

    from cuscikit.nnqs import aside, graphs, local_energy
    from cuscikit.nnqs.graphs import OptimizerGraph

    kw = dict(graphs=True, teacher=1.0, teacher_until=20, teacher_hold=0.0)
    aside._streams.clear()
    runner = _runner(name, teacher_inner_steps=16, **kw)
    runner.run(4, progress=False)
    assert aside.ENABLED and aside.PHASE and aside.GRADIENT_STREAMS == 4  # the defaults
    roles = {role for _, role in aside._streams}
    assert roles == {"phase"} | {f"gradients {i}" for i in range(4)}
    assert not aside._held and not aside._pending
    seen = next_recorded_stage(runner)
    assert seen["args"][5] == 16
    results = {}
    for switches in [
        (False, False, 1, False, False),
        (False, False, 1, True, False),
        (True, False, 1, False, False),
        (True, False, 4, False, False),
        (False, True, 1, False, False),
        (True, True, 1, False, False),
        (True, True, 4, True, False),
        (True, True, 4, True, True),
    ]:
        monkeypatch.setattr(aside, "ENABLED", switches[0])
        monkeypatch.setattr(aside, "PHASE", switches[1])
        monkeypatch.setattr(aside, "GRADIENT_STREAMS", switches[2])
        monkeypatch.setattr(local_energy, "ENABLED", switches[3])
        monkeypatch.setattr(graphs, "CHAIN_PRIORITY", switches[4])
        ansatz = copy.deepcopy(runner.ansatz)
        ansatz.load_state_dict(seen["weights"])
        opt = torch.optim.AdamW(ansatz.parameters())
        opt.load_state_dict(copy.deepcopy(seen["adamw"]))  # it keeps the tensors given
        stage = OptimizerGraph(ansatz, opt)
        out = stage.run(*seen["args"], **seen["kw"])
        assert stage.captures == 1 and stage.replays == 1 and stage._key.csr == switches[3]
        assert not aside._held and not aside._pending
        results[switches] = out, {k: p.detach().clone() for k, p in ansatz.named_parameters()}
    (loss, *flags), want = results.pop((False, False, 1, False, False))
    assert flags == [True, True]
    moved = max(float((p - seen["weights"][k]).abs().max()) for k, p in want.items())
    assert moved > 1e-6  # the stage moved the weights
    for (got_loss, *got_flags), got in results.values():
        assert got_flags == flags and abs(got_loss - loss) <= 1e-10 * max(1.0, abs(loss))
        for k, p in got.items():
            torch.testing.assert_close(p, want[k], rtol=0, atol=1e-10, msg=k)


def test_a_recording_has_room_for_more_pairs():
    """A recording whose pairs lie in rows (`local_energy`'s kernels) allocates room for a
    quarter more pairs: S grown by a few configurations, with more H_SS pairs than its first
    allocation's bucket held (N2 grows from 1,806 to 1,824 configurations, 162,196 to 165,592
    pairs, between two iterations), replays the same recording."""
    import copy

    from cuscikit.nnqs.graphs import OptimizerGraph, bucket

    runner = _runner("N2", graphs=True, topk=1024)
    runner.run(5, progress=False)
    seen = next_recorded_stage(runner)
    configs, w, de, hdiag, (src, dst, val), inner = seen["args"][:6]
    assert seen["kw"].get("teacher") is None
    n, m = len(configs), len(src)
    last = torch.maximum(torch.as_tensor(src), torch.as_tensor(dst)).cpu()
    # the largest first part of S in the same row bucket whose pairs fall in a smaller bucket
    part = next(
        k
        for k in range(n - 1, 0, -1)
        if bucket(k) < bucket(n) or bucket(int((last < k).sum())) < bucket(m)
    )
    keep = last < part
    m_part = int(keep.sum())
    assert bucket(part) == bucket(n), "no smaller pair bucket within S's row bucket"
    assert bucket(m_part) < bucket(m) and m <= m_part + m_part // 4
    ansatz = copy.deepcopy(runner.ansatz)
    opt = torch.optim.AdamW(ansatz.parameters())
    opt.load_state_dict(copy.deepcopy(seen["adamw"]))
    stage = OptimizerGraph(ansatz, opt)
    pairs_part = tuple(
        torch.as_tensor(a)[keep.to(torch.as_tensor(a).device)] for a in (src, dst, val)
    )
    stage.run(configs[:part], w[:part], de[:part], hdiag[:part], pairs_part, inner)
    assert stage._key.csr and stage._key.pairs == bucket(m_part + m_part // 4)
    stage.run(configs, w, de, hdiag, (src, dst, val), inner)
    assert stage.captures == 1 and stage.replays == 2


def test_aside_functions_in_a_recorded_graph(monkeypatch):
    """`aside.linear` and `aside.embed` with the second stream inside a recorded CUDA graph:
    every gradient equals torch's one-stream pass (float64, 1e-12), replay after replay with
    new inputs (a missing fork or join would read or return stale values)."""
    from cuscikit.nnqs import aside
    from cuscikit.nnqs.graphs import record

    monkeypatch.setattr(aside, "ENABLED", True)
    g = torch.Generator(device="cuda").manual_seed(0)
    dev, f64 = "cuda", torch.float64
    tok = torch.randn(5, 32, dtype=f64, device=dev, requires_grad=True)
    pos = torch.randn(10, 32, dtype=f64, device=dev, requires_grad=True)
    w1 = torch.randn(128, 32, dtype=f64, device=dev, requires_grad=True)
    b1 = torch.randn(128, dtype=f64, device=dev, requires_grad=True)
    w2 = torch.randn(4, 128, dtype=f64, device=dev, requires_grad=True)
    b2 = torch.randn(4, dtype=f64, device=dev, requires_grad=True)
    params = [tok, pos, w1, b1, w2, b2]
    inputs = torch.zeros((1920, 10), dtype=torch.long, device=dev)
    up = torch.zeros((1920, 10, 4), dtype=f64, device=dev)

    def reference():
        h = torch.nn.functional.embedding(inputs, tok) + pos
        y = torch.nn.functional.linear(torch.tanh(torch.nn.functional.linear(h, w1, b1)), w2, b2)
        return torch.autograd.grad((y * up).sum(), params)

    def pass_aside():
        with aside.gradients_aside():
            h = aside.embed(inputs, tok, pos)
            y = aside.linear(torch.tanh(aside.linear(h, w1, b1)), w2, b2)
            grads = torch.autograd.grad((y * up).sum(), params)
            aside.join(dev)
        return grads

    graph, out = record(pass_aside)
    assert aside._streams and not aside._pending
    for _ in range(4):
        inputs.copy_(torch.randint(0, 5, inputs.shape, device=dev, generator=g))
        up.normal_(generator=g)
        graph.replay()
        for a, e in zip(out, reference(), strict=True):
            torch.testing.assert_close(a, e, rtol=1e-13, atol=1e-12)


def test_graphed_stage_takes_spaces_above_one_batch():
    """With graph_space="auto" an S larger than `batch_size` (H2O, batch 64, |S| up to 256 +
    growth) still runs the recorded stage as one pass, and it gives the eager batch-by-batch
    stage's energies and weights (graph_space=batch_size: the rule of one batch) to 1e-10 over
    15 iterations with the teacher's 16 inner steps."""
    kw = dict(batch_size=64, teacher=1.0, teacher_until=12, teacher_hold=0.0)
    decay = LearningRateDecay(start=10, end=15, final_lr=1e-4)
    graphed = _runner("H2O", graphs=True, **kw).run(15, [decay], progress=False)
    batched = _runner("H2O", graphs=True, graph_space=64, **kw).run(15, [decay], progress=False)
    big = graphed.history["n_space"] > 64
    assert big.sum() >= 10  # most iterations above one batch
    assert graphed._graph_stage.replays == 15  # every one of them recorded
    assert batched._graph_stage.replays == int((~big).sum())  # the others' eager
    assert graphed._graph_row_bytes > 0
    _assert_same_runs(graphed, batched, 1e-9)


def test_graphed_stage_undoes_a_bad_step_and_resumes_from_checkpoint(tmp_path):
    r = _runner("LiH", graphs=True)
    ck = tmp_path / "ck.h5"
    r.run(3, progress=False, checkpoint=str(ck), checkpoint_every=1)
    good = {k: v.clone() for k, v in r.ansatz.state_dict().items()}
    r.optimizer.param_groups[0]["lr"] = float("inf")
    with pytest.raises(NonFiniteLossError):
        r.step()
    assert all(torch.equal(r.ansatz.state_dict()[k], good[k]) for k in good)
    # a resumed run (new optimiser state tensors: a new capture) continues like the eager one
    resumed = _runner("LiH", graphs=True)
    resumed.load(ck)
    eager = _runner("LiH", graphs=False)
    eager.load(ck)
    a = resumed.run(3, progress=False).history
    b = eager.run(3, progress=False).history
    np.testing.assert_allclose(a["e_tot"], b["e_tot"], rtol=0, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_recorded_inference_equals_the_module(dtype):
    """Random weights, sizes across buckets (padding, reuse, eviction): the recorded pass
    gives the module's ln psi (1e-12 in float64, 1e-5 in float32)."""
    from cuscikit.nnqs.graphs import InferenceGraph
    from cuscikit.sci.configs import all_determinants

    psi = Ansatz(10, (4, 4), seed=3, dtype=dtype, device="cuda")
    x = all_determinants(10, (4, 4))
    graph = InferenceGraph(psi)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for n in (1, 63, 64, 65, 1000, 1000, 5000, 64, len(x)):
        got = graph(x[:n])
        with torch.no_grad():
            ref = psi.log_psi(x[:n])
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert float((got - ref).abs().max()) <= tol
    assert graph.captures >= 5 and len(graph._graphs) <= graph.max_graphs


def test_recorded_inference_writes_an_unchanged_input_once(monkeypatch):
    """The same input tensor again (the iteration's S while it stays) is not turned into
    tokens again, yet follows the weights; the tensor changed in place, another tensor of its
    size, or a call in between are written anew. Every value equals the module's (float64,
    1e-12)."""
    from cuscikit.nnqs.graphs import InferenceGraph
    from cuscikit.sci.configs import all_determinants

    psi = Ansatz(10, (4, 4), seed=3, dtype=torch.float64, device="cuda")
    x = torch.as_tensor(all_determinants(10, (4, 4))[:500].view(np.int64), device="cuda")
    tokens = Ansatz.tokens
    calls = count_calls(monkeypatch, Ansatz, "tokens")
    graph = InferenceGraph(psi)

    def check(configs, written):
        before = len(calls)
        got = graph(configs)
        with torch.no_grad():
            ref = psi._log_psi_tokens(tokens(psi, configs))
        assert float((got - ref).abs().max()) <= 1e-12
        assert len(calls) - before == written

    check(x, 1)
    check(x, 0)
    with torch.no_grad():  # new weights: read by the replay itself
        for p in psi.parameters():
            p.mul_(1.01)
    check(x, 0)
    y = x.flip(0).clone()
    check(y, 1)  # another tensor
    check(x, 1)
    x[:2] = x[2:4].clone()  # changed in place
    check(x, 1)
    check(x[:300], 1)  # a call in between, another bucket
    check(x, 1)


def test_a_prefetch_serves_the_next_call_while_the_weights_stay():
    """`InferenceGraph.prefetch` replays the last input's recording; the next call with that
    input returns it without replaying while the weights are the same, and computes anew
    after an in-place change of a weight or for another input. Every value equals the
    module's (float64, 1e-12)."""
    from cuscikit.nnqs.graphs import InferenceGraph
    from cuscikit.sci.configs import all_determinants

    psi = Ansatz(10, (4, 4), seed=3, dtype=torch.float64, device="cuda")
    x = torch.as_tensor(all_determinants(10, (4, 4))[:500].view(np.int64), device="cuda")
    graph = InferenceGraph(psi)
    assert not graph.prefetch()  # nothing held yet

    def check(configs, prefetched):
        got = graph(configs)
        with torch.no_grad():
            ref = psi.log_psi(configs)
        assert float((got - ref).abs().max()) <= 1e-12
        assert graph.prefetched == prefetched
        return got

    before = check(x, 0)
    assert graph.prefetch()
    with torch.no_grad():  # a step after the prefetch: its value is stale
        for p in psi.parameters():
            p.mul_(1.01)
    after = check(x, 0)
    assert float((after - before).abs().max()) > 1e-6
    assert graph.prefetch()
    with torch.no_grad():  # a step before it: the prefetch computed with it
        for p in psi.parameters():
            p.mul_(1.01)
    assert graph.prefetch()
    check(x, 1)
    check(x, 1)  # a prefetch serves one call
    assert graph.prefetch()
    check(x[:300], 1)  # another input
    check(x, 1)


def test_prefetch_leaves_a_run_unchanged(monkeypatch):
    """A recorded run with the teacher: with the next iteration's ln psi over S queued after
    each stage (`graphs.PREFETCH`, the default) and used, and without, the same history to
    1e-10 over the iterations the path reproduces itself (float64), teacher_loss included."""
    from cuscikit.nnqs import graphs

    runs = {}
    for on in (True, False):
        monkeypatch.setattr(graphs, "PREFETCH", on)
        # top-K 1,024: S is the whole sector, unchanged, from iteration 6 on
        r = _runner("N2", graphs=True, teacher=1.0, teacher_until=20, topk=1024)
        r.run(8, progress=False)
        runs[on] = r
    assert runs[True]._pipeline.inference_graph.prefetched >= 2
    assert runs[False]._pipeline.inference_graph.prefetched == 0
    for c in [*COLUMNS, "teacher_loss"]:
        np.testing.assert_allclose(
            runs[True].history[c], runs[False].history[c], rtol=0, atol=1e-10, err_msg=c
        )


def test_recordings_leave_no_memory_behind():
    """A graphed run records several graphs; once the runner is gone, the device memory it
    held is free again (one warm-up stream per device: no workspace kept per recording)."""
    import gc

    def held():
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    _runner("LiH", graphs=True).run(3, progress=False)  # the process's one-off workspaces
    before = held()
    r = _runner("N2", graphs=True).run(30, progress=False)
    assert r._graph_stage.captures >= 2
    del r
    assert held() - before <= 8 << 20


def test_fused_inference_sees_the_weights_a_replay_wrote():
    """A float32 run takes the fused kernel for its inference and the recorded stage for its
    steps. A replay writes the weights without autograd seeing it; the fused kernel's packed
    weights (keyed on the parameters' version counters) must follow them: after every
    iteration the pipeline's values over S equal the module's ln psi (float32; 1e-4, where
    weights left behind by whole iterations differ by ~1e-2). LiH's S is complete from the
    third iteration, so most iterations replay a recording without recording again (a
    recording itself moves the counters), with S within one batch and above it."""
    for batch in (16384, 64):
        mol = Molecule.load("LiH")
        ansatz = Ansatz.for_molecule(mol, seed=0, device="cuda")
        runner = Runner(mol, ansatz, seed=0, topk=256, batch_size=batch)
        assert runner.graphs_active
        for _ in range(8):
            runner.run(1, progress=False)
            S = runner.space.configs
            assert runner._pipeline.fused_inference is not None
            with torch.no_grad():
                got = torch.as_tensor(runner._pipeline.values(S)).to(torch.complex128)
                ref = ansatz.log_psi(S).to(torch.complex128).to(got.device)
            assert float((got - ref).abs().max()) <= 1e-4, (batch, runner.iteration)
        stage = runner._graph_stage
        assert stage is not None and stage.replays == 8 and stage.captures <= 4, stage.captures
