"""The fused inference path on the CPU: which sizes it takes, the Runner option, and (where
Triton is installed) the kernel through Triton's interpreter against the module."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs.fast_infer import FusedInference, token_key, unsupported_reason  # noqa: E402
from cuscikit.sci.configs import all_determinants  # noqa: E402
from tests.conftest import run_interpreted  # noqa: E402


def test_unsupported_sizes_have_reasons():
    assert "d_model=96" in unsupported_reason(Ansatz(6, (3, 2), d_model=96, seed=0))
    assert "float64" in unsupported_reason(Ansatz(6, (3, 2), seed=0, dtype=torch.float64))
    assert "head width 12" in unsupported_reason(Ansatz(6, (3, 2), d_model=48, n_heads=4))
    assert "norb=70" in unsupported_reason(Ansatz(70, (3, 2), d_model=16, n_heads=2))
    assert "is not a cuscikit Ansatz" in unsupported_reason(torch.nn.Linear(2, 2))


def test_cpu_ansatz_is_refused():
    with pytest.raises(ValueError, match="fused inference unavailable"):
        FusedInference(Ansatz(6, (3, 2), seed=0))


def test_runner_option():
    mol = Molecule.load("LiH")
    with pytest.raises(ValueError, match="fused_inference must be"):
        Runner(mol, Ansatz.for_molecule(mol, seed=0), fused_inference="yes")
    with pytest.raises(ValueError, match="fused_inference=True, but"):
        Runner(mol, Ansatz.for_molecule(mol, seed=0), fused_inference=True)
    r = Runner(mol, Ansatz.for_molecule(mol, seed=0))  # "auto" on a CPU: the module
    assert r._pipeline.fused_inference is None


def _random_configs(norb, nelec, n, seed=0):
    x = all_determinants(norb, nelec)
    g = torch.Generator().manual_seed(seed)
    return x[torch.randperm(len(x), generator=g)[:n].numpy()]


@pytest.mark.parametrize("norb", [20, 36])
def test_token_key_is_the_orbitals_lexicographic_order(norb):
    a = Ansatz(norb, (3, 3), d_model=16, n_heads=2, seed=0)
    x = a.config_words(_random_configs(norb, (3, 3), 3000))
    t = a.tokens(x)[:, : min(norb, 32)].tolist()  # the first word's orbitals
    got = [t[i] for i in torch.argsort(token_key(x)).tolist()]
    assert got == sorted(t)


def test_plan_counts_the_distinct_prefixes():
    norb = 28
    a = Ansatz(norb, (2, 3), d_model=48, seed=0)
    x = a.config_words(_random_configs(norb, (2, 3), 20000))
    x = torch.cat([x, x[:500]])  # repeated configurations, as in a batch with duplicates
    ends, counts = FusedInference.plan_for(a, x)
    tok = a.tokens(x)
    for e, c in zip(ends, counts, strict=True):
        assert c == (len(x) if e == norb else len(torch.unique(tok[:, :e], dim=0)))
    # the padded rows it chose are no more than one stage's, and it did split here
    assert len(ends) == 2 and ends[-1] == norb and 16 * sum(counts) < 32 * len(x)
    assert FusedInference.plan_for(a, x, share_prefixes=False) == ([norb], [len(x)])
    short = Ansatz(10, (3, 3), seed=0)  # 16 padded positions: nothing to share
    assert FusedInference.plan_for(short, short.config_words(x[:10] & 0xFFFFF)) == ([10], [10])


def test_cuda_plan_minimises_its_lanes():
    """The CUDA kernel's costs (32 // p configurations of p positions per warp, one prefix
    stage at most): the plan is the cheapest of all such plans, by brute force."""
    import itertools

    norb = 28
    a = Ansatz(norb, (2, 3), d_model=48, seed=0)
    x = a.config_words(_random_configs(norb, (2, 3), 20000))
    x = x[torch.argsort(token_key(x))]
    tok = a.tokens(x)
    distinct = {e: len(torch.unique(tok[:, :e], dim=0)) for e in range(1, norb)}
    distinct[norb] = len(x)
    stage = len(x) * 32 / 32  # the planner's cost of one more stage (32 padded positions)

    def cost(ends):
        pairs = zip([0, *ends[:-1]], ends, strict=True)
        lanes = [distinct[b] * 32 / (32 // (b - a0)) for a0, b in pairs]
        return sum(lanes) + stage * (len(ends) - 1)

    plans = [[*c, norb] for m in range(2) for c in itertools.combinations(range(1, norb), m)]
    best = min(cost(p) for p in plans)
    ends, counts = FusedInference.plan_for(a, x, kernel="cuda")
    assert counts == [distinct[e] for e in ends]
    assert len(ends) <= 2 and abs(cost(ends) - best) <= 1e-9 * best
    assert len(ends) == 2  # it did split here
    print(ends, counts, cost(ends), "single stage", cost([norb]))


_INTERPRETED = textwrap.dedent(
    """
    import copy, torch
    import numpy as np
    from cuscikit import Ansatz
    from cuscikit.nnqs.fast_infer import FusedInference
    from cuscikit.sci.configs import all_determinants
    for norb, nelec, d, h in [(6, (3, 2), 16, 2), (5, (2, 2), 32, 4)]:
        a = Ansatz(norb, nelec, d_model=d, n_heads=h, n_layers=2, phase_hidden=(8,), seed=0)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in a.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        x = all_determinants(norb, nelec)[:24]
        ref = copy.deepcopy(a).double().log_psi(x)
        for prec in ("tf32x3", "fp64"):  # the last one stays for the out-of-sector check
            fast = FusedInference(a, block=2, precision=prec)
            err = float((fast(x).to(torch.complex128) - ref).abs().max())
            print(norb, d, prec, err)
            assert err < 1e-5, (prec, err)
        # the pipeline's check: this path's error and the float32 module's own, both against
        # the float64 module
        kernel, module = fast.errors(x)
        assert kernel == fast.verify(x) and abs(kernel - err) <= 1e-12, (kernel, err)
        with torch.no_grad():  # as the pipeline's inference evaluates the module
            own = float((a.log_psi(x).to(torch.complex128) - ref).abs().max())
        assert abs(module - own) <= 1e-12 and 0 < module < 1e-5, (module, own)
        bad = all_determinants(norb, (nelec[0] - 1, nelec[1]))[:3]
        assert torch.isneginf(fast(bad).real).all()
    assert FusedInference(a).kernel == "triton"  # the CUDA kernel needs a GPU
    for wrong, why in [
        ({"kernel": "cuda"}, "CUDA amplitude kernel is unavailable"),
        ({"kernel": "cuda", "precision": "ieee"}, "precision configure the Triton kernel"),
        ({"kernel": "numba"}, "kernel must be one of"),
        ({"rows": 1}, "CUDA amplitude kernel is unavailable"),
        ({"rows": 3}, "rows must be None, 1, or 2"),
        ({"kernel": "triton", "rows": 1}, "rows configures the CUDA kernel"),
        ({"rows": 1, "block": 2}, "block configure the Triton kernel"),
    ]:
        try:
            FusedInference(a, **wrong)
        except ValueError as exc:
            assert why in str(exc), (wrong, exc)
        else:
            raise AssertionError(f"{wrong} was accepted")
    for wrong in ({"num_stages": 0}, {"maxnreg": 300}, {"maxnreg": 16}):
        try:
            FusedInference(a, **wrong)
        except ValueError as exc:
            print("refused", wrong, exc)
        else:
            raise AssertionError(f"{wrong} was accepted")
    # stages over shared first orbitals (keys/values cached one and two levels deep), two
    # words, repeated and out-of-sector configurations, in no particular order
    for norb, nelec, d, h, plans in [
        (18, (2, 2), 48, 6, [[18], [5, 18], [3, 9, 18]]),
        (36, (2, 1), 16, 2, [[7, 36], [4, 20, 36]]),
    ]:
        a = Ansatz(norb, nelec, d_model=d, n_heads=h, n_layers=2, phase_hidden=(8,), seed=0)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in a.parameters():
                p.add_(0.2 * torch.randn(p.shape, generator=g))
        every = all_determinants(norb, nelec)
        pick = torch.randperm(len(every), generator=g)[:8].tolist() + [0, 1, 2, len(every) - 1]
        bad = all_determinants(norb, (nelec[0] + 1, nelec[1]))[:2]
        x = np.concatenate([every[pick], bad, every[pick[:2]]])
        ref = copy.deepcopy(a).double().log_psi(x).real
        fin = torch.isfinite(ref)
        fast = FusedInference(a)
        for ends in plans:
            amp = fast.amplitude(a.config_words(x), ends=ends).double()
            assert torch.equal(torch.isfinite(amp), fin), (ends, amp)
            err = float((amp[fin] - ref[fin]).abs().max())
            print(norb, d, ends, err)
            assert err < 1e-5, err
        amp = fast.amplitude(a.config_words(x)).double()  # the plan's own stages and sort
        assert torch.equal(torch.isfinite(amp), fin), (fast.last_plan, amp)
        err = float((amp[fin] - ref[fin]).abs().max())
        print(norb, d, fast.last_plan, err)
        assert err < 1e-5, err
    """
)


class _Checked:
    """Stands in for a FusedInference in the pipeline: the module's values, chosen errors."""

    tolerance = FusedInference.tolerance
    module_factor = FusedInference.module_factor

    def __init__(self, ansatz, kernel_error, module_error):
        self.ansatz, self.errs, self.calls = ansatz, (kernel_error, module_error), 0

    def errors(self, configs, *, module=True):
        return self.errs

    def __call__(self, configs):
        self.calls += 1
        return self.ansatz.log_psi(configs)


@pytest.mark.parametrize(
    "kernel_error, module_error, kept",
    [
        (9e-6, 1e-7, True),  # within the tolerance
        (1.5e-5, 1e-5, True),  # past it, within 4x the float32 module's own error
        (3.9e-5, 1e-5, True),
        (4.1e-5, 1e-5, False),
        (1.5e-5, 1e-6, False),  # past both
        (1e-3, 2e-5, False),  # far past float32 rounding: a wrong kernel
        (float("inf"), 1e-6, False),  # -inf where the module is finite, or the reverse
        (float("nan"), 1e-6, False),
    ],
)
def test_pipeline_drops_the_kernel_past_tolerance_and_module_rounding(
    kernel_error, module_error, kept
):
    """The first batch's check: the kernel stays while it is within the tolerance or within
    `module_factor` times the float32 module's own error; else the module runs, with a
    warning that names both errors."""
    import warnings

    from cuscikit.nnqs.pipeline import Pipeline
    from cuscikit.sci.engines import engine

    mol = Molecule.load("LiH")
    a = Ansatz.for_molecule(mol, seed=0)
    stub = _Checked(a, kernel_error, module_error)
    p = Pipeline(engine("cpu", mol), a, fused_inference=stub)
    x = all_determinants(mol.norb, mol.nelec)[:40]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = p.values(x), p.values(x[:7])
    assert (p.fused_inference is stub) == kept
    assert stub.calls == (2 if kept else 0)
    said = [str(w.message) for w in caught if "fused inference" in str(w.message)]
    if kept:
        assert said == []
    else:
        assert len(said) == 1 and f"{module_error:.1e}" in said[0], said
    with torch.no_grad():
        np.testing.assert_array_equal(first, a.log_psi(x).to(torch.complex128).numpy())
        np.testing.assert_array_equal(second, a.log_psi(x[:7]).to(torch.complex128).numpy())


def test_kernel_in_triton_interpreter():
    """The kernel's arithmetic (layout, masks, attention groups, log-softmax, the prefix
    stages' cached keys and values) on the CPU."""
    run_interpreted(_INTERPRETED, timeout=300)


_SPLIT = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl
    from cuscikit.nnqs._triton import tf32 as _tf32
    from cuscikit.nnqs.fast_infer import _dot

    @triton.jit
    def kernel(a_ptr, b_ptr, r_ptr, o_ptr, M: tl.constexpr):
        i = tl.arange(0, M)
        a = tl.load(a_ptr + i[:, None] * M + i[None, :])
        b = tl.load(b_ptr + i[:, None] * M + i[None, :])
        tl.store(r_ptr + i[:, None] * M + i[None, :], _tf32(a))
        tl.store(o_ptr + i[:, None] * M + i[None, :], _dot(a, b, "tf32x3"))

    def tf32_ref(t):
        return ((t.view(torch.int32) + 0x1000) & -0x2000).view(torch.float32).double()

    m = 32
    g = torch.Generator().manual_seed(0)
    a = torch.randn((m, m), generator=g) * torch.exp(4 * torch.randn((m, m), generator=g))
    e = 2.0**-11  # half a TF32 ulp at 1: the ties, both signs, and the same just below
    a[0, :8] = torch.tensor([1 + e, -(1 + e), 1 + 3 * e, 1 + e - 2**-23, 2 - e, 0.0, -0.0, 1.0])
    b = torch.randn((m, m), generator=g)
    r, o = torch.empty_like(a), torch.empty_like(a)
    kernel[(1,)](a, b, r, o, M=m)
    bits = r.view(torch.int32)
    assert int((bits & 0x1FFF).abs().max()) == 0  # TF32: the low 13 mantissa bits are zero
    assert r[0, :8].tolist() == [1 + 2 * e, -(1 + 2 * e), 1 + 4 * e, 1.0, 2.0, 0.0, 0.0, 1.0]
    # nearest: within half a TF32 ulp of the input
    assert bool(((r - a).abs() <= e * a.abs()).all())
    # three products of exact TF32 parts: float32 accuracy (the dropped low*low term and the
    # remainder's rounding are each below 2^-22 of a product)
    ref = a.double() @ b.double()
    scale = a.double().abs() @ b.double().abs()
    err = float(((o.double() - ref).abs() / scale).max())
    one = float(((tf32_ref(a) @ tf32_ref(b) - ref).abs() / scale).max())
    print("tf32x3 relative", err, "one TF32 product", one)
    assert err < 2.0**-20 and one > 2.0**-12
    """
)


_CHUNKS = textwrap.dedent(
    """
    import torch
    import triton
    import triton.language as tl
    from cuscikit.nnqs.fast_infer import _mm

    @triton.jit
    def kernel(x_ptr, w_ptr, o_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
               LD: tl.constexpr, KC: tl.constexpr):
        i = tl.arange(0, M)
        k = tl.arange(0, K)
        n = tl.arange(0, N)
        x = tl.load(x_ptr + i[:, None] * K + k[None, :])
        # rows 0..K-1 of W, columns 8..8+N-1 of a (K, LD) matrix
        tl.store(o_ptr + i[:, None] * N + n[None, :], _mm(x, w_ptr + 8, LD, n, 0, 1, "tf32x3", KC))

    g = torch.Generator().manual_seed(1)
    m, k, n, ld = 32, 64, 16, 40
    x = torch.randn((m, k), generator=g)
    w = torch.randn((k, ld), generator=g)
    ref = x.double() @ w[:, 8 : 8 + n].double()
    scale = x.double().abs() @ w[:, 8 : 8 + n].double().abs()
    for kc in (0, 16, 32, 64):
        o = torch.empty((m, n))
        kernel[(1,)](x, w, o, M=m, K=k, N=n, LD=ld, KC=kc)
        err = float(((o.double() - ref).abs() / scale).max())
        print("k_chunk", kc, "relative", err)
        assert err < 2.0**-20, (kc, err)
    """
)


def test_chunked_products_in_triton_interpreter():
    """The weight products summed per chunk of K (the columns halved into even and odd ones,
    the matching rows of W): the float64 product to float32 accuracy for every chunk size."""
    out = run_interpreted(_CHUNKS, timeout=120)
    assert out.count("relative") == 4, out


def test_tf32_split_in_triton_interpreter():
    """The kernel's TF32 split: operands rounded to nearest TF32 (exact for the tensor cores),
    and its three products within float32 rounding of the float64 product."""
    run_interpreted(_SPLIT, timeout=120)


_ORDERED = textwrap.dedent(
    """
    import torch
    from cuscikit import Ansatz
    from cuscikit.nnqs.fast_infer import FusedInference, token_key
    from cuscikit.sci.configs import all_determinants

    # configurations handed over in the prefix order skip the sort, with the same values
    g = torch.Generator().manual_seed(0)
    a = Ansatz(18, (2, 2), d_model=16, n_heads=2, n_layers=1, phase_hidden=(8,), seed=0)
    every = all_determinants(18, (2, 2))
    x = a.config_words(every[torch.randperm(len(every), generator=g)[:40].numpy()])
    fast = FusedInference(a)
    perm = torch.argsort(token_key(x))
    assert not torch.equal(perm, torch.arange(len(x)))  # shuffled: the sort runs
    mixed = fast.amplitude(x, ends=[5, 18])
    ordered = fast.amplitude(x[perm], ends=[5, 18])
    assert torch.equal(ordered, mixed[perm]), (ordered - mixed[perm]).abs().max()
    assert torch.equal(fast.amplitude(x[perm]), fast.amplitude(x)[perm]), fast.last_plan
    # the shuffled batch is sorted before its prefixes are counted: the same plan
    assert fast.plan(x) == fast.plan(x[perm]), (fast.plan(x), fast.plan(x[perm]))
    print("ok", fast.last_plan, fast.plan(x))
    """
)


def test_ordered_batches_in_triton_interpreter():
    """The prefix plan on configurations already in the prefix order (the sort skipped)
    gives the values of the same configurations shuffled, bit for bit, and the shuffled
    ones are sorted before their shared prefixes are counted (the same plan)."""
    out = run_interpreted(_ORDERED, timeout=300)
    assert "ok" in out


@pytest.mark.parametrize("d", [16, 32, 48])
def test_tensor_core_layer_blocks_follow_the_fragment_rule(d):
    """The weights the tensor-core products stage, against the fragment rule written out in
    loops: weight ((kt N/8 + nt) 32 + 4g + t) 2 + c of each matrix is W[8kt + 2t + c, 8nt + g];
    float64 copies for "fp64", TF32 (hi, hi, lo, lo) pairs rounded to nearest for "tf32x3";
    the vectors unchanged after the matrices."""
    from cuscikit.nnqs.fast_infer import (
        _tc_matrices,
        layer_block_floats,
        tc_fragment_order,
        tc_layer_blocks,
    )

    rng = np.random.default_rng(d)
    blocks = torch.from_numpy(rng.standard_normal((2, layer_block_floats(d))).astype(np.float32))
    frags = tc_fragment_order(blocks, d).numpy()
    want = blocks.numpy().copy()
    for off, k, n in _tc_matrices(d):
        for layer in range(2):
            w = blocks[layer, off : off + k * n].numpy().reshape(k, n)
            for kt in range(k // 8):
                for nt in range(n // 8):
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        for c in range(2):
                            i = off + ((kt * (n // 8) + nt) * 32 + lane) * 2 + c
                            want[layer, i] = w[8 * kt + 2 * t + c, 8 * nt + g]
    np.testing.assert_array_equal(frags, want)
    m = 12 * d * d
    f64 = tc_layer_blocks(blocks, d, "fp64").numpy()
    np.testing.assert_array_equal(f64[:, 2 * m :], want[:, m:])
    np.testing.assert_array_equal(f64[:, : 2 * m].copy().view(np.float64), want[:, :m])
    tf = tc_layer_blocks(blocks, d, "tf32x3").numpy()[:, : 2 * m].reshape(2, -1, 4)
    hi, lo = tf[:, :, :2].reshape(2, m), tf[:, :, 2:].reshape(2, m)
    for part in (hi, lo):  # TF32 values: 13 low mantissa bits zero
        assert not (part.view(np.uint32) & 0x1FFF).any()
    w = want[:, :m].astype(np.float64)
    # round to nearest: each part within half a TF32 ulp (2^-11 relative), the sum within 2^-21
    assert (np.abs(hi - w) <= np.abs(w) * 2.0**-11).all()
    assert (np.abs(hi.astype(np.float64) + lo - w) <= np.abs(w) * 2.0**-21).all()
    with pytest.raises(ValueError, match="products must be"):
        tc_layer_blocks(blocks, d, "fma")
