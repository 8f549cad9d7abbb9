"""The graphed optimiser stage: option handling, and its arithmetic against the eager stage.

CUDA graphs need a GPU (tests/gpu/test_optimizer_graph.py); here the same body runs without
capturing (``use_graph=False``) on the CPU and must reproduce the eager stage to rounding."""

import numpy as np
import pandas as pd
import pytest
import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, graphs
from cuscikit.nnqs.graphs import (
    OptimizerGraph,
    bucket,
    saved_bytes_per_row,
    unsupported_reason,
)
from cuscikit.nnqs.runner import LearningRateDecay, NonFiniteLossError, Runner
from cuscikit.sci.configs import all_determinants
from tests.conftest import count_calls

COLUMNS = ["e_tot", "e_coupled", "e_variational", "loss", "n_space", "n_unique", "n_new"]


def make_runner(name="LiH", **kw):
    mol = Molecule.load(name)
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    kw.setdefault("topk", 16)
    return Runner(mol, ansatz, seed=0, **kw)


def stage_inputs(inner_steps):
    """A LiH runner after one iteration, its S, weights |psi|^2 / sum |psi|^2, zero local-energy
    offsets and the pipeline's result over S: the inputs of one optimiser stage."""
    runner = make_runner(inner_steps=inner_steps, teacher=0)
    runner.run(1, progress=False)
    S = runner.space.configs
    res = runner._pipeline.run(S, runner.topk)
    psi = torch.as_tensor(res.psi_s)
    w = psi.abs() ** 2 / (psi.abs() ** 2).sum()
    return runner, S, w, torch.zeros(len(S), dtype=torch.complex128), res


def with_body(runner):
    """Route the runner's optimiser stage through the graph body, run without capturing."""
    runner._graphs_reason = lambda fresh=True: None
    shared = runner.shared_prefix_training
    runner._graph_stage = OptimizerGraph(
        runner.ansatz, runner.optimizer, use_graph=False, shared_prefixes=shared
    )
    return runner


def counting_stage(inner_steps):
    """A LiH runner whose optimiser stage is the graph body, run without capturing, over an
    ln psi that notes the rows of every pass: (runner, stage, rows of each pass so far)."""
    runner = with_body(make_runner(inner_steps=inner_steps))
    calls = []

    def log_psi(tokens):
        calls.append(len(tokens))
        return runner.ansatz._log_psi_tokens(tokens)

    stage = OptimizerGraph(runner.ansatz, runner.optimizer, use_graph=False, log_psi=log_psi)
    runner._graph_stage = stage
    return runner, stage, calls


def test_graphs_option_on_the_cpu():
    runner = make_runner()
    assert runner.graphs == "auto" and not runner.graphs_active
    assert runner._pipeline.keep_graph  # the eager stage uses the pipeline's graph
    assert not make_runner(graphs=False).graphs_active
    with pytest.raises(ValueError, match="CUDA"):
        make_runner(graphs=True)
    with pytest.raises(ValueError, match="graphs must be"):
        make_runner(graphs="yes")
    with pytest.raises(ValueError, match="graphs must be"):
        make_runner(graphs=1)


def test_graph_space_option():
    """ "auto" or a positive count; the rule: one batch always, above it while twice the
    measured autograd bytes fit half the free memory (the device's figures replaced here)."""
    for bad in (0, -3, 2.5, "all", True):
        with pytest.raises(ValueError, match="graph_space"):
            make_runner(graph_space=bad)
    r = make_runner("H2O", topk=64, batch_size=32)
    r.step()
    S = r.space.configs
    res = r._pipeline.run(S, r.topk)
    assert len(S) > 32
    r.graph_space = 40
    assert r._graph_space_limit(S, res) == 40
    r.graph_space = "auto"
    assert r._graph_space_limit(S[:20], res) == 32
    free = {}
    mem = {
        "mem_get_info": lambda dev: (free["bytes"], 1 << 40),
        "memory_reserved": lambda dev: 0,
        "memory_allocated": lambda dev: 0,
    }
    with pytest.MonkeyPatch.context() as mp:
        for name, fn in mem.items():
            mp.setattr(torch.cuda, name, fn)
        per_row = saved_bytes_per_row(r.ansatz._log_psi_tokens, r.ansatz.tokens(S[:256]))
        need = 2 * per_row * bucket(len(S)) + 32 * bucket(len(res.space_pairs[0]))
        free["bytes"] = 2 * need
        assert r._graph_space_limit(S, res) == len(S)
        assert r._graph_row_bytes == per_row
        free["bytes"] = 2 * need - 64
        assert r._graph_space_limit(S, res) == 32
        stage = OptimizerGraph(r.ansatz, r.optimizer, use_graph=False)
        stage._key = (bucket(len(S)),)  # a recording this size holds its memory already
        r._graph_stage = stage
        assert r._graph_space_limit(S, res) == len(S)
        r._graph_stage = None
        free["bytes"] = 4 * need
        r._graph_oom = bucket(len(S))  # a recording of this size ran out of memory before
        assert r._graph_space_limit(S, res) == 32


def test_saved_bytes_per_row():
    """The autograd bytes per configuration hardly depend on the two counts measured, grow
    with the model, and count at least the phase network's saved hidden layers."""
    psi = Ansatz(8, (3, 3), seed=0, dtype=torch.float64)
    tok = psi.tokens(all_determinants(8, (3, 3))[:50])
    a = saved_bytes_per_row(psi._log_psi_tokens, tok)
    b = saved_bytes_per_row(psi._log_psi_tokens, tok, rows=(100, 300))
    assert b == pytest.approx(a, rel=1e-3)
    assert a >= 8 * sum(psi.phase_hidden)
    wide = Ansatz(8, (3, 3), seed=0, dtype=torch.float64, d_model=64, n_heads=8)
    assert saved_bytes_per_row(wide._log_psi_tokens, tok) > a
    with pytest.raises(ValueError, match="rows"):
        saved_bytes_per_row(psi._log_psi_tokens, tok, rows=(10, 10))
    with pytest.raises(ValueError, match="non-empty"):
        saved_bytes_per_row(psi._log_psi_tokens, tok[:0])


def test_unsupported_pairs_are_named():
    psi = Ansatz(4, (2, 1), seed=0)
    assert unsupported_reason(psi, torch.optim.AdamW(psi.parameters())) is None
    assert "Adam" in unsupported_reason(psi, torch.optim.Adam(psi.parameters()))
    assert "amsgrad" in unsupported_reason(psi, torch.optim.AdamW(psi.parameters(), amsgrad=True))
    lin = torch.nn.Linear(2, 2)
    assert "Ansatz" in unsupported_reason(lin, torch.optim.AdamW(lin.parameters()))
    with pytest.raises(ValueError, match="cannot run"):
        OptimizerGraph(lin, torch.optim.AdamW(lin.parameters()))
    mixed = Ansatz(4, (2, 1), seed=0)
    mixed.head.double()
    assert "dtype" in unsupported_reason(mixed, torch.optim.AdamW(mixed.parameters()))
    with pytest.raises(ValueError, match="callable"):
        OptimizerGraph(psi, torch.optim.AdamW(psi.parameters()), log_psi=1.0)


def test_buckets_hold_their_size_with_at_most_an_eighth_padding():
    for n in [*range(0, 3000), 16383, 16384, 16385, 10**6 + 7]:
        cap = bucket(n)
        assert cap >= max(n, 64) and (n <= 64 or cap <= n * 9 / 8 + 1)


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("LiH", {"inner_steps": 3, "weight_decay": 0.01, "teacher": 0}),
        ("LiH", {"inner_steps": 1, "estimator": "variational", "teacher": 0}),
        ("LiH", {"inner_steps": 0, "topk": 32, "teacher": 0}),
        # the teacher's pull in the iteration's step and in its own inner steps, then off
        ("LiH", {"inner_steps": 1, "teacher": 1.0, "teacher_until": 3, "teacher_inner_steps": 2}),
        ("H2O", {"inner_steps": 2, "teacher": 0.5, "teacher_until": 5, "topk": 32}),
    ],
)
def test_graph_body_matches_the_eager_stage(name, kw):
    """float64: energies, losses and weights agree to 1e-10 over iterations whose |S| changes
    (new buckets) and under a decaying rate (the rate is a device scalar of the graph); with a
    teacher (up to 16 inner steps an iteration: 4x the AdamW steps, whose m / sqrt(v) lifts the
    rounding of small gradients) the weights to 1e-9."""
    decay = LearningRateDecay(start=1, end=4, final_lr=1e-4)
    eager = make_runner(name, graphs=False, **kw).run(4, [decay], progress=False)
    body = with_body(make_runner(name, **kw)).run(4, [decay], progress=False)
    assert body._graph_stage.replays == 4
    assert not body._pipeline.keep_graph  # the values come without an autograd graph
    np.testing.assert_array_equal(body.history["n_space"], eager.history["n_space"])
    for c in COLUMNS:
        np.testing.assert_allclose(body.history[c], eager.history[c], rtol=0, atol=1e-10)
    for a, b in zip(eager.ansatz.parameters(), body.ansatz.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9 if kw.get("teacher") else 1e-10)
    for p, q in zip(eager.ansatz.parameters(), body.ansatz.parameters(), strict=True):
        s, t = eager.optimizer.state[p], body.optimizer.state[q]
        inner = eager.history.get("inner_steps", pd.Series([kw["inner_steps"]] * 4))
        assert float(s["step"]) == float(t["step"]) == int((1 + inner).sum())
        torch.testing.assert_close(s["exp_avg_sq"], t["exp_avg_sq"], rtol=1e-8, atol=1e-14)


def test_saved_bytes_measurement_keeps_no_graph():
    """A function that saves its own output (as the Triton attention does) must not outlive
    the measurement through a reference cycle: an autograd graph alive on another stream
    breaks the next CUDA graph recording (its parameters' gradient nodes)."""
    import gc
    import weakref

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = 2 * x
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            return 2 * g

    refs = []
    w = torch.ones(4, dtype=torch.float64, requires_grad=True)

    def fn(tok):
        y = Twice.apply(tok.double() * w)
        refs.append(weakref.ref(y))
        return y.sum(-1)

    gc.disable()
    try:
        assert saved_bytes_per_row(fn, torch.ones((3, 4), dtype=torch.long)) >= 2 * 4 * 8
        assert len(refs) == 2 and all(r() is None for r in refs)
    finally:
        gc.enable()


@pytest.mark.parametrize("shared", [False, True])
def test_a_recording_takes_a_smaller_space(shared):
    """A stage recorded for a larger space (buckets up to twice the space's) runs the smaller
    one padded, with the same result as a stage of its own bucket; a space below half the
    recording's buckets, or another inner-step count, is recorded anew. With shared prefixes
    the tree is padded too (prefixes no row reads)."""
    import copy

    from cuscikit.nnqs.ansatz import prefix_tree

    runner = make_runner("H2O", topk=32, inner_steps=2, teacher=0)
    runner.run(2, progress=False)
    S = runner.space.configs
    res = runner._pipeline.run(S, runner.topk)
    psi = torch.as_tensor(res.psi_s)
    w = psi.abs() ** 2 / (psi.abs() ** 2).sum()
    eloc = torch.as_tensor(res.eloc_variational)
    de = (eloc - (w * eloc).real.sum()).to(torch.complex128)
    n, m = len(S), len(res.space_pairs[0])
    k = len(prefix_tree(runner.ansatz.tokens(S)).first) if shared else 0
    assert not shared or k < n * runner.ansatz.norb  # S shares prefixes
    weights = []
    for padded in (False, True):
        ansatz = copy.deepcopy(runner.ansatz)
        opt = torch.optim.AdamW(ansatz.parameters())
        stage = OptimizerGraph(ansatz, opt, use_graph=False, shared_prefixes=shared)
        moments = stage._state()[:2]  # the AdamW state tensors exist from here (in the key)
        key = stage.key_for(n, m, 2, prefixes=k)
        assert (key[2] > 0) == shared
        if padded:
            big = stage.key_for(int(1.6 * n), int(1.6 * m), 2, prefixes=int(1.6 * k))
            assert big[:2] > key[:2] and stage._fits(key) is False
            stage._allocate(big, ansatz.norb, *moments)
            assert stage._fits(key) and not stage._fits(stage.key_for(n, m, 3, prefixes=k))
            assert not stage._fits(stage.key_for(n, m // 2, 2, prefixes=k))
        stage.run(S, w, de, res.hdiag, res.space_pairs, 2)
        assert stage._key[:3] == (big if padded else key)[:3]
        weights.append([p.detach().clone() for p in ansatz.parameters()])
    for a, b in zip(*weights, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_a_replay_counts_as_a_write_of_the_weights():
    """A CUDA graph's replay writes the weights behind autograd's back (their version counters
    do not move); the stage counts the write itself, so a cache keyed on the counters (the
    fused inference's packed weights) refreshes. Here the replay is a stand-in that changes
    the weights through ``.data`` (which, like a replay, leaves the counters alone)."""
    runner, S, w, de, res = stage_inputs(inner_steps=1)
    params = list(runner.ansatz.parameters())
    stage = OptimizerGraph(runner.ansatz, runner.optimizer, use_graph=False)
    stage.use_graph = True

    class Replay:
        def replay(self):
            for p in params:
                p.data.add_(0.25)
            stage._buf["flags"].copy_(torch.tensor([0.0, 0.0, 1.0]))  # a good stage

    stage._capture = lambda: setattr(stage, "_graph", Replay())
    before = [p._version for p in params]
    stage.run(S, w, de, res.hdiag, res.space_pairs, 1)
    assert all(p._version > v for p, v in zip(params, before, strict=True))


def test_a_bad_stage_is_undone():
    """An infinite rate makes the weights non-finite inside the stage: it is undone (weights,
    moments, step count) and the run stops as the eager stage would."""
    runner = with_body(make_runner())
    runner.run(2, progress=False)
    good = {k: v.clone() for k, v in runner.ansatz.state_dict().items()}
    p0 = next(runner.ansatz.parameters())
    moment = runner.optimizer.state[p0]["exp_avg"].clone()
    runner.optimizer.param_groups[0]["lr"] = float("inf")
    with pytest.raises(NonFiniteLossError, match="non-finite"):
        runner.step()
    assert all(torch.equal(runner.ansatz.state_dict()[k], good[k]) for k in good)
    assert torch.equal(runner.optimizer.state[p0]["exp_avg"], moment)
    assert float(runner.optimizer.state[p0]["step"]) == 2 * 5


def test_stage_uses_the_given_log_psi_and_keeps_per_parameter_state():
    """``log_psi`` is what the stage evaluates (once per pass); the AdamW moments are written
    back into the optimiser's own per-parameter tensors, not views of the flat buffers, so a
    checkpoint keeps its layout."""
    runner, stage, calls = counting_stage(inner_steps=2)
    runner.run(2, progress=False)
    assert len(calls) == 2 * 3 and all(n == bucket(n) for n in calls)
    for p in runner.ansatz.parameters():
        st = runner.optimizer.state[p]
        for name in ("exp_avg", "exp_avg_sq"):
            t = st[name]
            assert t.shape == p.shape and t.untyped_storage().nbytes() == t.numel() * 8
        assert float(st["step"]) == 2 * 3


def test_a_recording_warms_up_with_one_inner_step(monkeypatch):
    """The warm-ups before a recording run the iteration's step and one inner step, whatever
    the stage's inner steps, and apply nothing; the recording itself runs them all."""
    runner, stage, calls = counting_stage(inner_steps=3)
    runner.run(1, progress=False)  # the stage's buffers and key, with 3 inner steps
    assert stage._key.inner == 3 and len(calls) == 4
    seen = {}

    def fake_record(fn, device=None, *, warm_up=None, warm_ups=2):
        before = [p.detach().clone() for p in stage.params]
        for _ in range(warm_ups):
            warm_up()
        seen["warm-up passes"] = len(calls) - 4
        seen["unchanged"] = all(
            torch.equal(p, q) for p, q in zip(stage.params, before, strict=True)
        )
        fn()
        seen["recorded passes"] = len(calls) - 4 - seen["warm-up passes"]
        return None, None

    monkeypatch.setattr(graphs, "record", fake_record)
    stage._capture()
    assert seen == {"warm-up passes": 2 * 2, "unchanged": True, "recorded passes": 4}
    with pytest.raises(ValueError, match="inner steps"):
        stage._body(apply=True, inner=1)


@pytest.mark.parametrize("name", ["LiH", "Hubbard-6-ring-U4"])
def test_shared_prefixes_change_only_the_rounding(name, monkeypatch):
    """`shared_prefix_training=True`, in the eager stage and in the graph body (teacher on, then
    off): the same histories as the plain eager stage to 1e-10 in float64 (the weights to
    1e-9), and the tree was used (every pass with gradient of the stage over a tree of S)."""
    import cuscikit.nnqs.ansatz as ansatz_module

    built, passes = [], []
    tree_of, log_psi_parts = ansatz_module.prefix_tree, Ansatz._log_psi_parts

    def spy(tokens):
        built.append(tokens.shape[0])
        return tree_of(tokens)

    def spy_pass(self, tokens, tree=None):  # the passes given a tree (both stages' passes)
        if tree is not None:
            passes.append(tokens.shape[0])
        return log_psi_parts(self, tokens, tree)

    monkeypatch.setattr(ansatz_module, "prefix_tree", spy)
    monkeypatch.setattr(Ansatz, "_log_psi_parts", spy_pass)
    kw = {"inner_steps": 2, "teacher": 1.0, "teacher_until": 3, "teacher_inner_steps": 3}
    decay = LearningRateDecay(start=1, end=4, final_lr=1e-4)
    plain = make_runner(name, graphs=False, **kw).run(4, [decay], progress=False)
    assert not built and not passes
    eager = make_runner(name, graphs=False, shared_prefix_training=True, **kw)
    eager.run(4, [decay], progress=False)
    inner = int(eager.history["inner_steps"].sum())
    assert len(built) == len(passes) == inner  # a tree per inner step, and its pass
    built.clear()
    passes.clear()
    body = with_body(make_runner(name, shared_prefix_training=True, **kw))
    body.run(4, [decay], progress=False)
    assert len(built) == 4 and body._graph_stage._key.prefixes > 0  # one tree per stage
    assert len(passes) == 4 + int(body.history["inner_steps"].sum())  # every pass over it
    for run in (eager, body):
        np.testing.assert_array_equal(run.history["n_space"], plain.history["n_space"])
        for c in COLUMNS:
            np.testing.assert_allclose(run.history[c], plain.history[c], rtol=0, atol=1e-10)
        for a, b in zip(plain.ansatz.parameters(), run.ansatz.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-9)


def test_shared_prefix_training_option():
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="shared_prefix_training"):
            make_runner(shared_prefix_training=bad)
    mol = Molecule.load("LiH")

    class Plain(torch.nn.Module):  # a module with ln psi but no prefix-tree pass
        def __init__(self):
            super().__init__()
            self.inner = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)

        def log_psi(self, configs):
            return self.inner.log_psi(configs)

    with pytest.raises(ValueError, match="shared_prefix_training=True needs a cuscikit Ansatz"):
        Runner(mol, Plain(), shared_prefix_training=True)
    r = make_runner()
    with pytest.raises(ValueError, match="shared_prefixes must be True or False"):
        OptimizerGraph(r.ansatz, r.optimizer, shared_prefixes=1)


def test_the_stage_computes_what_depends_on_the_tokens_once(monkeypatch):
    """The stage's 1 + inner passes over S compute the masks and the phase input of S's
    tokens once (`reuse_token_work`), not once a pass."""
    runner, S, w, de, res = stage_inputs(inner_steps=3)
    calls, passes = [], []
    allowed, log_psi_parts = Ansatz._allowed, Ansatz._log_psi_parts

    def spy(self, *args):
        calls.append(1)
        return allowed(self, *args)

    def spy_pass(self, tokens, tree=None):
        passes.append(1)
        return log_psi_parts(self, tokens, tree)

    monkeypatch.setattr(Ansatz, "_allowed", spy)
    monkeypatch.setattr(Ansatz, "_log_psi_parts", spy_pass)
    stage = OptimizerGraph(runner.ansatz, runner.optimizer, use_graph=False)
    stage.run(S, w, de, res.hdiag, res.space_pairs, 3)
    assert len(passes) == 4 and len(calls) == 1
    stage.run(S, w, de, res.hdiag, res.space_pairs, 3)
    assert len(passes) == 8 and len(calls) == 2  # once per stage


def test_the_stage_writes_what_depends_on_s_alone_once(monkeypatch):
    """While S, its pairs and its diagonal are the ones the buffers were written from (equal
    host configurations, the same tensors unchanged), a stage writes only the weights, the
    energy offsets and the constants: S's tokens and the pairs' order are made once. The
    weights come out bitwise as from a stage that writes everything every time
    (``reuse_inputs=False``), also when the pairs change in place, S changes, or the inner
    steps do (new buffers), each of which writes S again."""
    import copy

    runner, S, w, de, res = stage_inputs(inner_steps=2)
    pairs = tuple(torch.as_tensor(a).clone() for a in res.space_pairs)
    hdiag = torch.as_tensor(res.hdiag).clone()
    writes = count_calls(monkeypatch, graphs, "spread_rows")
    stages = []
    for reuse in (True, False):
        ansatz = copy.deepcopy(runner.ansatz)
        stage = OptimizerGraph(ansatz, torch.optim.AdamW(ansatz.parameters()), use_graph=False)
        stage.reuse_inputs = reuse
        stages.append(stage)
    gen = torch.Generator().manual_seed(0)
    n = len(S)

    def both(configs, inner=2):
        w1 = torch.rand(n, dtype=torch.float64, generator=gen)
        de1 = torch.randn(n, dtype=torch.complex128, generator=gen) * 1e-2
        counts = []
        for stage in stages:
            before = len(writes)
            stage.run(configs, w1 / w1.sum(), de1, hdiag, pairs, inner)
            counts.append(len(writes) - before)
        held, fresh = (list(st.ansatz.parameters()) for st in stages)
        for a, b in zip(held, fresh, strict=True):
            assert torch.equal(a, b)
        return counts

    assert both(S) == [1, 1]
    assert both(S) == [0, 1]  # the same S: only the per-stage values
    assert both(S.copy()) == [0, 1]  # equal host configurations
    pairs[2].mul_(1.5)  # a pair tensor changed in place: written again
    assert both(S) == [1, 1]
    assert both(S) == [0, 1]
    assert both(S[::-1].copy()) == [1, 1]  # another S (the rows' order)
    assert both(S, inner=3) == [1, 1]  # new buffers
    assert both(S, inner=3) == [0, 1]
    assert stages[0]._held is not None and stages[1]._held is None


def test_spread_rows_takes_one_pair_of_each_row_per_round():
    """`spread_rows` is a permutation that lists round r = the r-th pair (in the given order)
    of every row with more than r pairs, rows ascending: within a round no row repeats, so
    consecutive additions go to different rows."""
    from cuscikit.nnqs.graphs import spread_rows

    gen = np.random.default_rng(3)
    for n, m in ((1, 7), (6, 40), (50, 1000), (9, 0)):
        src = torch.as_tensor(np.sort(gen.integers(0, n, m)))
        order = spread_rows(src, n)
        assert sorted(order.tolist()) == list(range(m))
        expected, rank = [], {}
        for i, r in enumerate(src.tolist()):
            expected.append((rank.get(r, 0), r, i))
            rank[r] = rank.get(r, 0) + 1
        assert order.tolist() == [i for _, _, i in sorted(expected)]
        rows = src[order].tolist()
        steps = [b <= a for a, b in zip(rows[:-1], rows[1:], strict=True)]
        rounds = np.cumsum([0, *steps])[:m].tolist()
        assert len(set(zip(rounds, rows, strict=True))) == m  # no row twice a round
        shuffled = torch.as_tensor(gen.permutation(m))
        assert spread_rows(src[shuffled], n).numel() == m


def test_the_step_counts_follow_the_optimisers_own_tensors():
    """The stage reads and advances the AdamW step counts through views of the optimiser's
    tensors, kept between stages: an eager step of the optimiser in between, and a
    `load_state_dict` (new tensors), are seen, and every parameter ends at the same count."""
    runner, S, w, de, res = stage_inputs(inner_steps=1)
    opt = runner.optimizer
    stage = OptimizerGraph(runner.ansatz, opt, use_graph=False)

    def counts():
        return {float(opt.state[p]["step"]) for p in runner.ansatz.parameters()}

    start = counts().pop()
    stage.run(S, w, de, res.hdiag, res.space_pairs, 1)
    assert counts() == {start + 2}
    loss = runner.ansatz.log_psi(S).real.sum()  # an eager AdamW step: + 1 on every tensor
    loss.backward()
    opt.step()
    opt.zero_grad()
    stage.run(S, w, de, res.hdiag, res.space_pairs, 1)
    assert counts() == {start + 5}
    kept = stage._kept
    opt.load_state_dict(opt.state_dict())  # the same values in new tensors
    assert not kept.holds(opt.state)
    stage.run(S, w, de, res.hdiag, res.space_pairs, 1)
    assert counts() == {start + 7} and stage._kept is not kept
    p0 = next(runner.ansatz.parameters())
    opt.state[p0]["step"] += 1  # in place: the kept views see it, and refuse the mismatch
    with pytest.raises(ValueError, match="different AdamW step counts"):
        stage.run(S, w, de, res.hdiag, res.space_pairs, 1)


def test_the_graphs_verdict_is_checked_again_when_the_pair_changes(monkeypatch):
    """The ansatz/optimiser check walks every parameter, so the Runner keeps its verdict
    while `pair_signature` stays the same, and checks again when it changes: a frozen
    parameter, another optimiser (the device is set to CUDA by hand: no CUDA call is made)."""
    runner = make_runner()
    runner.device = torch.device("cuda")
    calls = count_calls(monkeypatch, graphs, "unsupported_reason")
    assert runner._graphs_reason() is None and len(calls) == 1
    assert runner._graphs_reason() is None and len(calls) == 1
    p0 = next(runner.ansatz.parameters())
    p0.requires_grad_(False)
    assert "frozen" in runner._graphs_reason() and len(calls) == 2
    assert "frozen" in runner._graphs_reason(fresh=False) and len(calls) == 2
    p0.requires_grad_(True)
    assert runner._graphs_reason() is None and len(calls) == 3
    runner.optimizer = torch.optim.SGD(runner.ansatz.parameters())
    assert "SGD" in runner._graphs_reason() and len(calls) == 4


def test_the_loss_gradient_of_the_two_parts_is_autograds_of_the_complex_loss():
    """By default each pass hands autograd ln|psi| and phi with the loss's gradient (2 Re T,
    2 Im T) instead of the complex loss 2 Re sum conj(ln psi) T: one pass's parameter
    gradients are those of the complex loss (float32: to rounding, the phase MLP's last bias
    gradient sums its column in another order than from the complex gradient's strided
    imaginary part; float64: bitwise here), and the weights after three stages (with a
    teacher) those of the stage that takes the complex loss (a caller's ``log_psi``)."""
    x = all_determinants(6, (3, 2))[:50]
    n = len(x)
    g = torch.Generator().manual_seed(1)
    coef = torch.randn(n, generator=g, dtype=torch.complex128)
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 0.0)):
        psi = Ansatz(6, (3, 2), seed=3, dtype=dtype, phase_hidden=(16,))
        params, tok = list(psi.parameters()), psi.tokens(x)
        lp = psi._log_psi_tokens(tok).to(torch.complex128)
        want = torch.autograd.grad(2.0 * (lp.conj() * coef).real.sum(), params)
        amp, phase = psi._log_psi_parts(tok)
        grad = torch.empty((2, n), dtype=dtype).copy_(2.0 * torch.view_as_real(coef).t())
        got = torch.autograd.grad((amp, phase), params, (grad[0], grad[1]))
        for a, b in zip(got, want, strict=True):
            assert float((a - b).abs().max()) <= tol * float(b.abs().max())
    w = torch.rand(n, generator=g, dtype=torch.float64)
    w /= w.sum()
    de = torch.randn(n, generator=g, dtype=torch.complex128)
    hd = torch.randn(n, generator=g, dtype=torch.float64)
    src, dst = torch.randint(0, n, (300,), generator=g), torch.randint(0, n, (300,), generator=g)
    val = 0.1 * torch.randn(300, generator=g, dtype=torch.float64).to(torch.complex128)
    teacher = (0.5, torch.randn(n, generator=g, dtype=torch.float64).numpy())
    weights = []
    for complex_loss in (False, True):
        psi = Ansatz(6, (3, 2), seed=3, dtype=torch.float64, phase_hidden=(16,))
        opt = torch.optim.AdamW(psi.parameters(), lr=1e-2)
        stage = OptimizerGraph(
            psi, opt, use_graph=False, log_psi=psi._log_psi_tokens if complex_loss else None
        )
        assert (stage._parts is None) == complex_loss
        for _ in range(3):
            loss, ok, finite = stage.run(x, w, de, hd, (src, dst, val), 3, teacher=teacher)
            assert ok and finite
        weights.append([p.detach().clone() for p in psi.parameters()])
    assert max(float((a - b).abs().max()) for a, b in zip(*weights, strict=True)) <= 1e-12
    start = Ansatz(6, (3, 2), seed=3, dtype=torch.float64, phase_hidden=(16,)).parameters()
    assert (
        max(float((a - b.detach()).abs().max()) for a, b in zip(weights[0], start, strict=True))
        > 1e-3
    )


_ADAMW_INTERPRETED = """
import torch
from cuscikit import Ansatz
from cuscikit.nnqs import fused_ops, graphs, local_energy
from cuscikit.nnqs.graphs import OptimizerGraph
from cuscikit.sci.configs import all_determinants

graphs.ADAMW_KERNEL = True  # off by default
g = torch.Generator().manual_seed(0)
for dt, tol in ((torch.float64, 1e-15), (torch.float32, 3e-7)):
    n = 5000  # several programs, the last one partial
    grad = torch.randn(n, generator=g, dtype=torch.float64).to(dt) * 1e-2
    m0 = torch.randn(n, generator=g, dtype=torch.float64).to(dt) * 1e-2
    v0 = torch.rand(n, generator=g, dtype=torch.float64).to(dt) * 1e-4
    consts = torch.tensor((0.1, 0.999, 1 - 0.999, 1e-8), dtype=torch.float64).to(dt)
    sc = {"consts": consts, "bias2_sqrt": torch.tensor([0.3, 0.05], dtype=dt),
          "rate": torch.tensor([1e-3, 2e-3], dtype=dt)}
    m1, v1, u1 = m0.clone(), v0.clone(), torch.full((n,), float("nan"), dtype=dt)
    assert graphs._adamw_moments(m1, v1, grad, u1, sc, 1)
    m2, v2 = m0.clone(), v0.clone()
    m2.lerp_(grad, 0.1)
    v2.mul_(0.999)
    v2.addcmul_(grad, grad, value=1 - 0.999)
    u2 = m2 / (torch.sqrt(v2) / sc["bias2_sqrt"][1] + 1e-8) * sc["rate"][1]
    for a, b in ((m1, m2), (v1, v2), (u1, u2)):
        assert float((a - b).abs().max()) <= tol * float(b.abs().max()), (dt, a, b)
# a stage (float64, weight decay) with the kernel and with torch's operations
fused_ops.ENABLED = local_energy.ENABLED = False  # the interpreter's time for AdamW alone
x = all_determinants(6, (3, 2))[:50]
w = torch.full((50,), 1 / 50, dtype=torch.float64)
de = torch.randn(50, generator=g, dtype=torch.complex128)
pairs = (torch.arange(49), torch.arange(1, 50), torch.full((49,), -0.1 + 0j))
out = []
for on in (True, False):
    graphs.ADAMW_KERNEL = on
    psi = Ansatz(6, (3, 2), seed=3, dtype=torch.float64, d_model=16, n_layers=1,
                 phase_hidden=(16,))
    opt = torch.optim.AdamW(psi.parameters(), lr=1e-2, weight_decay=0.01)
    stage = OptimizerGraph(psi, opt, use_graph=False)
    for _ in range(2):
        assert stage.run(x, w, de, torch.zeros(50, dtype=torch.float64), pairs, 2)[1]
    out.append([p.detach().clone() for p in psi.parameters()])
assert graphs._adamw_failed is None
worst = max(float((a - b).abs().max()) for a, b in zip(*out))
assert worst < 1e-11, worst
print("ok", worst)
"""


def test_adamw_kernel_in_triton_interpreter():
    """The flat AdamW step's moments and update in one Triton kernel: against torch's eight
    operations to rounding (float64 1e-15, float32 3e-7 of the largest entry) over several
    programs, and two stages with it and without it to 1e-11 in the weights (float64, AdamW's
    first steps enlarge last-bit differences), on the CPU."""
    from tests.conftest import run_interpreted

    out = run_interpreted(_ADAMW_INTERPRETED, timeout=300)
    assert "ok" in out


def test_adamw_kernel_stays_off_on_the_cpu(monkeypatch):
    """Without the interpreter a CPU stage keeps torch's AdamW operations, switch on or off."""
    from cuscikit.nnqs._triton import interpreting

    if interpreting():
        pytest.skip("the Triton interpreter runs the kernel on the CPU")
    assert not graphs.ADAMW_KERNEL  # off by default
    monkeypatch.setattr(graphs, "ADAMW_KERNEL", True)
    t = torch.zeros(4)
    assert not graphs._adamw_moments(t, t.clone(), t.clone(), t.clone(), {}, 0)
