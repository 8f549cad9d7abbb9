"""Tests of the NNQS ansatz: exact normalisation, masking, sampling statistics, gradients."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cuscikit.nnqs import Ansatz
from cuscikit.nnqs.ansatz import allowed_tokens, prefix_tree
from cuscikit.sci.configs import (
    all_determinants,
    check_configurations,
    electron_counts,
    from_occupations,
    hf_configuration,
    to_bits,
)

SMALL = dict(d_model=16, n_layers=2, n_heads=2, phase_hidden=(32, 32))
SECTORS = [(6, (3, 2)), (8, (4, 4)), (5, (3, 1)), (4, (0, 2))]


def _norm(psi: Ansatz, norb: int, nelec) -> float:
    with torch.no_grad():
        return torch.exp(2 * psi.log_psi(all_determinants(norb, nelec)).real).sum().item()


def _scramble(psi: Ansatz, steps: int = 3, lr: float = 0.5) -> None:
    """A few large gradient steps on a random loss, so the weights move well away from init."""
    gen = torch.Generator().manual_seed(5)
    opt = torch.optim.SGD(psi.parameters(), lr=lr)
    x = all_determinants(psi.norb, psi.nelec)
    for _ in range(steps):
        w = torch.randn(len(x), generator=gen).to(psi.dtype)
        out = psi.log_psi(x)
        loss = (w * out.real).sum() + (w * out.imag).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("norb,nelec", SECTORS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-10)])
def test_normalised_over_sector(norb, nelec, dtype, tol):
    psi = Ansatz(norb, nelec, dtype=dtype, seed=3, **SMALL)
    assert abs(_norm(psi, norb, nelec) - 1) < tol
    before = psi.head.weight.detach().clone()
    _scramble(psi)
    assert (psi.head.weight.detach() - before).abs().max() > 1e-3  # the weights did change
    assert abs(_norm(psi, norb, nelec) - 1) < tol


def test_normalised_with_default_sizes():
    psi = Ansatz(6, (3, 2), dtype=torch.float64, seed=0)
    assert abs(_norm(psi, 6, (3, 2)) - 1) < 1e-10


def test_allowed_tokens_against_brute_force():
    na, nb, norb = 2, 1, 4
    for ua in range(4):
        for ub in range(3):
            for k in range(norb):
                got = allowed_tokens(torch.tensor(ua), torch.tensor(ub), na, nb, norb - k - 1)
                for t in range(4):
                    a, b = ua + (t & 1), ub + (t >> 1)
                    ok = a <= na and b <= nb and na - a <= norb - k - 1 and nb - b <= norb - k - 1
                    assert bool(got[t]) == ok, (ua, ub, k, t)


@pytest.mark.parametrize("norb,nelec", [(6, (3, 2)), (5, (5, 0)), (7, (1, 6))])
def test_masked_conditionals_give_invalid_tokens_zero_probability(norb, nelec):
    psi = Ansatz(norb, nelec, dtype=torch.float64, seed=1, **SMALL)
    _scramble(psi)
    tokens = psi.tokens(all_determinants(norb, nelec))
    with torch.no_grad():
        p = torch.exp(psi.log_conditionals(tokens))  # (n, norb, 4) along every valid prefix
    na, nb = psi.nelec
    ta, tb = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1])
    used_a = torch.cumsum(tokens & 1, 1) - (tokens & 1)
    used_b = torch.cumsum(tokens >> 1, 1) - (tokens >> 1)
    rem = torch.arange(norb - 1, -1, -1)[None, :, None]
    a, b = used_a[..., None] + ta, used_b[..., None] + tb
    valid = (a <= na) & (b <= nb) & (na - a <= rem) & (nb - b <= rem)
    assert valid.any(-1).all() and not valid.all()
    assert torch.all(p[~valid] == 0)  # exactly zero, not merely small
    torch.testing.assert_close(p.sum(-1), torch.ones(p.shape[:2], dtype=p.dtype))


def test_out_of_sector_configuration_has_zero_amplitude():
    psi = Ansatz(4, (2, 1), seed=0, **SMALL)
    x = from_occupations([[0, 1, 2]], [[0]], 4)  # three alpha electrons
    out = psi.log_psi(x)
    assert torch.isneginf(out.real).all() and torch.isfinite(out.imag).all()


@pytest.mark.parametrize(
    "norb,nelec,n", [(6, (3, 2), 10**6), (12, (5, 4), 200_000), (40, (6, 5), 20_000)]
)
def test_samples_are_valid(norb, nelec, n):
    psi = Ansatz(norb, nelec, seed=2, **SMALL)
    configs, counts = psi.sample(n, generator=11)
    assert configs.dtype == np.uint64 and counts.dtype == np.int64
    assert counts.sum() == n and (counts > 0).all()
    check_configurations(configs, norb, nelec)  # raises on wrong counts or stray bits
    assert len(np.unique(configs, axis=0)) == len(configs)  # unique
    na, nb = electron_counts(configs)
    assert (na == nelec[0]).all() and (nb == nelec[1]).all()


def test_sampling_matches_born_probabilities():
    """200,000 samples of a 24-state sector; chi-square with 23 dof must have p > 1e-4 and
    every state's z-score |f - N p| / sqrt(N p (1-p)) must be below 5. The seeds are fixed, so
    the test is deterministic; a wrong sampler gives chi-square in the thousands."""
    norb, nelec, n = 4, (2, 1), 200_000
    psi = Ansatz(norb, nelec, dtype=torch.float64, seed=4, **SMALL)
    with torch.no_grad():
        psi.head.weight.mul_(100.0)  # a strongly non-uniform distribution
    x = all_determinants(norb, nelec)
    with torch.no_grad():
        prob = torch.exp(2 * psi.log_psi(x).real).numpy()
    assert prob.max() / prob.min() > 5
    configs, counts = psi.sample(n, generator=123)
    index = {tuple(c): i for i, c in enumerate(x)}
    observed = np.zeros(len(x))
    for c, k in zip(configs, counts, strict=True):
        observed[index[tuple(c)]] += k
    expected = n * prob
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    from scipy.stats import chi2 as chi2_dist

    assert chi2_dist.sf(chi2, len(x) - 1) > 1e-4, chi2
    z = np.abs(observed - expected) / np.sqrt(expected * (1 - prob))
    assert z.max() < 5, z


def test_sample_edge_cases():
    psi = Ansatz(3, (3, 3), seed=0, **SMALL)  # a single determinant
    configs, counts = psi.sample(10)
    assert np.array_equal(configs, hf_configuration(3, (3, 3))) and counts.tolist() == [10]
    configs, counts = psi.sample(0)
    assert configs.shape == (0, 1) and counts.shape == (0,)
    big = Ansatz(6, (3, 2), seed=0, **SMALL)
    _, counts = big.sample(10**15, generator=0)  # counts, not individual draws
    assert counts.sum() == 10**15
    # chunked tree search (tiny max_batch) gives valid samples with the same total
    configs, counts = big.sample(5000, generator=1, max_batch=7)
    check_configurations(configs, 6, (3, 2))
    assert counts.sum() == 5000 and len(np.unique(configs, axis=0)) == len(configs)


def test_cached_steps_match_full_forward():
    psi = Ansatz(7, (3, 3), dtype=torch.float64, seed=6, **SMALL)
    tokens = psi.tokens(all_determinants(7, (3, 3)))
    with torch.no_grad():
        full = psi._logits(torch.cat((torch.full((len(tokens), 1), 4), tokens[:, :-1]), 1))
        caches, steps = None, []
        for k in range(7):
            last = tokens[:, k - 1] if k else torch.full((len(tokens),), 4)
            logits, caches = psi._step_logits(last, k, caches)
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=0, atol=1e-12)


def test_gradients_reach_amplitude_and_phase():
    psi = Ansatz(6, (3, 2), seed=0, **SMALL)
    x = all_determinants(6, (3, 2))
    out = psi.log_psi(x, batch_size=64)
    (out.real.square().sum() + out.imag.sum()).backward()
    for name in (
        "token_embedding.weight",
        "position_embedding.weight",
        "blocks.0.attn.qkv.weight",
        "blocks.1.fc.weight",
        "head.weight",
        "phase_net.0.weight",
        "phase_net.4.weight",
    ):
        grad = psi.get_parameter(name).grad
        assert grad is not None and grad.abs().max() > 0, name
    # the amplitude alone does not touch the phase MLP and vice versa
    psi.zero_grad(set_to_none=True)
    psi.log_psi(x).real.sum().backward()
    phase_grad = psi.phase_net[0].weight.grad
    assert phase_grad is None or not phase_grad.any()
    assert psi.blocks[0].attn.qkv.weight.grad.abs().max() > 0


@pytest.mark.parametrize("dtype,ctype", [(torch.float32, torch.complex64), (torch.float64, None)])
def test_batched_equals_unbatched(dtype, ctype):
    psi = Ansatz(8, (4, 3), dtype=dtype, seed=0, **SMALL)
    x = all_determinants(8, (4, 3))
    with torch.no_grad():
        whole = psi.log_psi(x)
        parts = psi.log_psi(x, batch_size=37)
        again = psi(torch.from_numpy(x.view(np.int64)), batch_size=1000)
    assert whole.dtype == (ctype or torch.complex128) and whole.shape == (len(x),)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(parts, whole, rtol=tol, atol=tol)
    torch.testing.assert_close(again, whole, rtol=tol, atol=tol)
    grad_parts = psi.log_psi(x[:100], batch_size=30)
    assert grad_parts.requires_grad


@pytest.mark.parametrize("norb", [5, 32, 40, 70])
def test_tokens_round_trip(norb):
    rng = np.random.default_rng(norb)
    alpha = [sorted(rng.choice(norb, 4, replace=False)) for _ in range(50)]
    beta = [sorted(rng.choice(norb, 3, replace=False)) for _ in range(50)]
    x = from_occupations(alpha, beta, norb)
    psi = Ansatz(norb, (4, 3), seed=0, **SMALL)
    tok = psi.tokens(x)
    assert tok.dtype == torch.long and tok.shape == (50, norb)
    bits = to_bits(x, norb)
    assert np.array_equal(tok.numpy(), bits[:, 0::2] + 2 * bits[:, 1::2])
    assert np.array_equal(psi.tokens(torch.from_numpy(x.view(np.int64))).numpy(), tok.numpy())
    assert np.array_equal(psi.configurations(tok), x)


def test_top_bit_of_a_word():
    # orbital 31 beta is bit 63 of word 0: the int64 sign bit
    x = from_occupations([[0]], [[31]], 32)
    tok = Ansatz(32, (1, 1), seed=0, **SMALL).tokens(x)
    assert tok[0, 0] == 1 and tok[0, 31] == 2 and tok[0, 1:31].sum() == 0


def test_multiword_log_psi_and_sampling():
    norb, nelec = 40, (5, 4)  # 80 spin orbitals: 2 words
    psi = Ansatz(norb, nelec, seed=0)
    assert psi.n_words == 2 and psi.d_model == 48 and psi.n_heads == 6
    configs, counts = psi.sample(3000, generator=0)
    assert configs.shape[1] == 2 and counts.sum() == 3000
    with torch.no_grad():
        lp = psi.log_psi(configs, batch_size=512)
    assert torch.isfinite(lp.real).all() and (lp.real < 0).all()


def test_seed_reproducibility():
    a = Ansatz(6, (3, 2), seed=42, **SMALL)
    b = Ansatz(6, (3, 2), seed=42, **SMALL)
    c = Ansatz(6, (3, 2), seed=43, **SMALL)
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), na
    assert not torch.equal(a.head.weight, c.head.weight)
    # float64 built from the same seed is the same function
    d = Ansatz(6, (3, 2), seed=42, dtype=torch.float64, **SMALL)
    x = all_determinants(6, (3, 2))
    with torch.no_grad():
        torch.testing.assert_close(d.log_psi(x).to(torch.complex64), a.log_psi(x))
    # the global RNG is neither consumed nor needed when a seed is given
    torch.manual_seed(0)
    Ansatz(6, (3, 2), seed=1, **SMALL)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))
    # seed=None follows torch.manual_seed
    torch.manual_seed(7)
    e = Ansatz(6, (3, 2), **SMALL)
    torch.manual_seed(7)
    f = Ansatz(6, (3, 2), **SMALL)
    assert torch.equal(e.head.weight, f.head.weight)
    # sampling with the same generator seed repeats
    s1, s2 = a.sample(1000, generator=3), a.sample(1000, generator=3)
    assert np.array_equal(s1[0], s2[0]) and np.array_equal(s1[1], s2[1])


def test_defaults_and_introspection():
    small, large = Ansatz(10, 14, seed=0), Ansatz(28, 14, seed=0)
    assert (small.d_model, small.n_layers, small.n_heads) == (32, 4, 4)
    assert (large.d_model, large.n_layers, large.n_heads) == (48, 4, 6)
    assert small.nelec == (7, 7) and small.norb == 10
    assert small.n_parameters == sum(p.numel() for p in small.parameters())
    assert "d_model=32" in repr(small) and "nelec=(7, 7)" in repr(small)
    assert Ansatz(28, 14, d_model=64, seed=0).n_heads == 4  # largest divisor of 64 up to 6

    class Mol:
        norb, nelec = 6, (3, 2)

    psi = Ansatz.for_molecule(Mol(), seed=0, **SMALL)
    assert psi.norb == 6 and psi.nelec == (3, 2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(norb=4, nelec=(5, 0)), "do not fit"),
        (dict(norb=0, nelec=0), "norb"),
        (dict(norb=200, nelec=2), "spin orbitals"),
        (dict(norb=6, nelec=4, d_model=30, n_heads=4), "divisible"),
        (dict(norb=6, nelec=4, d_model=0), "d_model"),
        (dict(norb=6, nelec=4, n_layers=0), "n_layers"),
        (dict(norb=6, nelec=4, n_heads=-1), "n_heads"),
        (dict(norb=6, nelec=4, phase_hidden=(64, 0)), "phase_hidden"),
        (dict(norb=6, nelec=4, dtype=torch.int64), "dtype"),
        (dict(norb=6, nelec=4, dtype=torch.complex64), "dtype"),
        (dict(norb=6, nelec=4, device="tpu:7"), "device"),
        (dict(norb=6, nelec=4, device="bogus"), "device"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Ansatz(**kwargs)


def test_bad_inputs():
    psi = Ansatz(40, 6, seed=0, **SMALL)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        psi.tokens(np.zeros((3, 1), np.uint64))
    with pytest.raises(ValueError, match="uint64"):
        psi.tokens(np.zeros((3, 2), np.float64))
    with pytest.raises(ValueError, match="int64"):
        psi.tokens(torch.zeros((3, 2), dtype=torch.int32))
    with pytest.raises(ValueError, match="n_samples"):
        psi.sample(-1)
    with pytest.raises(ValueError, match="batch_size"):
        psi.log_psi(np.zeros((3, 2), np.uint64), batch_size=0)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    cpu = Ansatz(8, (4, 3), dtype=torch.float64, seed=9, **SMALL)
    gpu = Ansatz(8, (4, 3), dtype=torch.float64, seed=9, device="cuda", **SMALL)
    x = all_determinants(8, (4, 3))
    with torch.no_grad():
        ref, out = cpu.log_psi(x), gpu.log_psi(x)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-10, atol=1e-10)
    assert abs(torch.exp(2 * out.real).sum().item() - 1) < 1e-10
    configs, counts = gpu.sample(100_000, generator=0)
    check_configurations(configs, 8, (4, 3))
    assert counts.sum() == 100_000


def test_reference_bias_concentrates_on_hartree_fock_and_stays_normalised():
    from cuscikit.sci.configs import all_determinants, hf_configuration

    norb, nelec = 6, (3, 2)
    hf = hf_configuration(norb, nelec)
    psi = Ansatz(norb, nelec, seed=0, dtype=torch.float64, reference=hf, reference_bias=6.0)
    full = all_determinants(norb, nelec)
    with torch.no_grad():
        prob = torch.exp(2 * psi.log_psi(full).real).numpy()
    assert abs(prob.sum() - 1.0) < 1e-10
    k = int(np.flatnonzero(full[:, 0] == hf[0, 0])[0])
    assert prob[k] > 0.9 and prob[k] == prob.max()
    flat = Ansatz(norb, nelec, seed=0, dtype=torch.float64)
    with torch.no_grad():
        assert torch.exp(2 * flat.log_psi(hf).real).item() < 0.2
    with pytest.raises(ValueError, match="reference"):
        Ansatz(norb, nelec, reference=np.zeros((1, 2), np.uint64), reference_bias=1.0)


def test_short_sequence_attention_matches_fused_kernel():
    """The written-out attention used for short sequences equals PyTorch's fused one."""
    import torch.nn.functional as F

    from cuscikit.nnqs.ansatz import _CausalSelfAttention

    torch.manual_seed(0)
    att = _CausalSelfAttention(24, 4).double()
    x = torch.randn(5, 17, 24, dtype=torch.float64)
    n, length, d = x.shape
    q, k, v = att.qkv(x).split(d, dim=-1)
    q, k, v = (t.reshape(n, length, 4, d // 4).transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = att.proj(ref.transpose(1, 2).reshape(n, length, d))
    torch.testing.assert_close(att(x), ref, rtol=1e-12, atol=1e-12)


def _prefix_twin(tokens: torch.Tensor) -> tuple[list, list]:
    """Brute force: every (position, prefix) pair in order of first appearance per position,
    and for each the flat index of its first occurrence."""
    rows = tokens.tolist()
    n, length = tokens.shape
    first = {}
    for p in range(length):
        for i in range(n):
            first.setdefault((p, tuple(rows[i][:p])), i * length + p)
    return rows, first


def test_prefix_tree_against_brute_force():
    """`prefix_tree`: one row per distinct (position, prefix), shared exactly by the sequences
    with that prefix, numbered position by position, and the flat index of its first
    occurrence; an empty batch has no rows."""
    gen = torch.Generator().manual_seed(3)
    for n, length in ((1, 4), (40, 6), (300, 7)):
        tok = torch.randint(0, 4, (n, length), generator=gen)
        tok[n // 2 :] = tok[: n - n // 2]  # repeated sequences as well
        tree = prefix_tree(tok)
        rows, first = _prefix_twin(tok)
        assert tree.node.shape == (n, length) and len(tree.first) == len(first)
        for (p, prefix), flat in first.items():
            i = flat // length
            v = int(tree.node[i, p])
            assert int(tree.first[v]) == flat
            same = [tuple(r[:p]) == prefix for r in rows]
            assert (tree.node[:, p] == v).tolist() == same
        depth = (tree.first % length).tolist()
        assert depth == sorted(depth) and depth[0] == 0  # position-major, row 0 the empty one
    empty = prefix_tree(torch.zeros((0, 5), dtype=torch.long))
    assert empty.node.shape == (0, 5) and len(empty.first) == 0
    for bad in (
        torch.tensor([[0, 4]]),
        torch.tensor([[-1, 0]]),
        torch.zeros(3, dtype=torch.long),
        torch.zeros((2, 2)),
    ):
        with pytest.raises(ValueError, match="tokens"):
            prefix_tree(bad)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_amplitude_over_shared_prefixes_equals_the_module(dtype, tol):
    """ln|psi| and the gradient of every parameter with ``tree=prefix_tree(tokens)`` equal the
    plain pass: shuffled, repeated and out-of-sector configurations (-inf in both), perturbed
    weights, three blocks, and an empty batch."""
    norb, nelec = 7, (3, 3)
    psi = Ansatz(
        norb, nelec, dtype=dtype, seed=4, d_model=16, n_layers=3, n_heads=2, phase_hidden=(16,)
    )
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():  # weights well away from the initialisation
        for p in psi.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=gen).to(dtype))
    x = all_determinants(norb, nelec)
    x = x[torch.randperm(len(x), generator=gen).numpy()[:300]]
    x = np.concatenate([x, x[:50], hf_configuration(norb, (4, 3))])  # repeats, another sector
    tok = psi.tokens(x)
    tree = prefix_tree(tok)
    assert len(tree.first) < tok.numel()
    w = torch.randn(len(tok), generator=gen).to(dtype)
    params = [p for name, p in psi.named_parameters() if not name.startswith("phase")]
    out = []
    for t in (None, tree):
        amp = psi.log_amplitude(tok, tree=t)
        finite = torch.isfinite(amp)
        out.append((amp.detach(), torch.autograd.grad((amp[finite] * w[finite]).sum(), params)))
    (a0, g0), (a1, g1) = out
    assert torch.isneginf(a0[-1]) and torch.isneginf(a1[-1])
    assert bool((torch.isneginf(a0) == torch.isneginf(a1)).all())
    fin = torch.isfinite(a0)
    assert float((a0[fin] - a1[fin]).abs().max()) < tol * float(a0[fin].abs().max())
    for p, c in zip(g1, g0, strict=True):
        assert float((p - c).abs().max()) < tol * max(1.0, float(c.abs().max()))
    with torch.no_grad():
        a, b = psi._log_psi_tokens(tok[:20], prefix_tree(tok[:20])), psi._log_psi_tokens(tok[:20])
        assert float((a - b).abs().max()) < tol * 10
        with pytest.raises(ValueError, match="prefix_tree"):
            psi.log_amplitude(tok[:5], tree=prefix_tree(tok[:6]))
        none = tok[:0]
        assert psi.log_amplitude(none, tree=prefix_tree(none)).shape == (0,)


def test_reuse_token_work_computes_the_masks_once_and_changes_nothing(monkeypatch):
    """Inside `reuse_token_work`, passes over the same token tensor compute the masks and the
    phase input once; ln psi and every parameter gradient are bitwise those of plain passes;
    a write into the tokens, another tensor, or leaving the context computes them again."""
    from cuscikit.nnqs.ansatz import reuse_token_work

    psi = Ansatz(6, (3, 2), seed=1, dtype=torch.float64, **SMALL)
    _scramble(psi)
    tok = psi.tokens(all_determinants(6, (3, 2)))
    calls = []
    allowed = Ansatz._allowed

    def spy(self, *args):
        calls.append(1)
        return allowed(self, *args)

    monkeypatch.setattr(Ansatz, "_allowed", spy)

    def pass_(t):
        out = psi._log_psi_tokens(t)
        loss = (out.real * torch.linspace(-1, 1, len(t), dtype=out.real.dtype)).sum()
        return out.detach(), torch.autograd.grad(loss + out.imag.sum(), list(psi.parameters()))

    plain = [pass_(tok) for _ in range(3)]
    assert len(calls) == 3
    calls.clear()
    with reuse_token_work():
        reused = [pass_(tok) for _ in range(3)]
        assert len(calls) == 1
        other = tok.clone()
        pass_(other)
        assert len(calls) == 2  # another tensor: its own masks
        tok[[0, 1]] = tok[[1, 0]]  # written in place: computed again, from the new rows
        swapped, _ = pass_(tok)
        assert len(calls) == 3
        tok[[0, 1]] = tok[[1, 0]]
    for (a, ga), (b, gb) in zip(plain, reused, strict=True):
        assert torch.equal(a, b)
        assert all(torch.equal(x, y) for x, y in zip(ga, gb, strict=True))
    first = plain[0][0]
    assert torch.equal(swapped[[1, 0]], first[:2]) and torch.equal(swapped[2:], first[2:])
    calls.clear()
    pass_(tok)
    pass_(tok)
    assert len(calls) == 2  # outside the context nothing is kept
