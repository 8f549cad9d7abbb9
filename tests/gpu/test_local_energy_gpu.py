"""The local-energy and teacher kernels (`cuscikit.nnqs.local_energy`) on the GPU against the
torch operations they replace, float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from cuscikit.nnqs import local_energy as le  # noqa: E402
from cuscikit.nnqs import teacher as T  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _need_cuda():
    if not torch.cuda.is_available() or le.triton is None:
        pytest.skip("no CUDA device or no Triton")
    # kernels turned off earlier in the process (a failed build) fail here, not skip
    assert le.ENABLED and le.failed is None, le.failed


def _space(n, n_pad, m, g):
    dev = "cuda"
    lp = torch.complex(torch.rand(n, dtype=torch.float64, generator=g) * 4 - 3,
                       torch.rand(n, dtype=torch.float64, generator=g) * 6 - 3)  # fmt: skip
    lp[n - n_pad :] = lp[0]
    lp[min(3, n - 1)] = complex(-700.0, 2.5)  # |psi| below 1e-300
    mask = torch.ones(n, dtype=torch.float64)
    mask[n - n_pad :] = 0
    hd = torch.randn(n, dtype=torch.float64, generator=g)
    src = torch.randint(0, n - n_pad, (m,), generator=g)
    dst = torch.randint(0, n - n_pad, (m,), generator=g)
    val = torch.randn(m, dtype=torch.complex128, generator=g) * 0.1
    c = torch.randn(n, dtype=torch.float64, generator=g) * mask
    c[torch.rand(n, generator=g) < 0.2] = 0.0
    c[0] = 1.0
    return [t.to(dev) for t in (lp, mask, hd, src, dst, val, c)]


@pytest.mark.parametrize("n", [1, 1920, 5000])
def test_kernels_with_the_teacher_match_the_torch_operations(n):
    """`terms` with a teacher (psi, T, E to 1e-13, the same flag) and `teacher_pull` (the
    iteration's pull and loss) against torch's operations on the GPU."""
    g = torch.Generator().manual_seed(n)
    lp, mask, hd, src, dst, val, c = _space(n, min(n // 16, 100), 6 * n, g)
    teach = (torch.tensor(0.7, dtype=torch.float64, device="cuda"), c)
    ref = le.terms(lp, mask, hd, (src, dst, val), teacher=teach)
    rowptr, s2, d2, v2 = le.csr(src, dst, val, n)
    got = le.terms(lp, mask, hd, (s2, d2, v2), rowptr=rowptr, teacher=teach)
    assert le.failed is None
    for a, b in zip(ref[:3], got[:3], strict=True):
        assert float((a - b).abs().max()) <= 1e-13 * max(1.0, float(a.abs().max()))
    assert bool(ref[3]) == bool(got[3])
    psi = torch.exp(lp - lp.real.max())
    parts = T._parts(psi, c)
    pull, loss = le.teacher_pull(psi, c)
    assert float((pull - T._coefficients(*parts)).abs().max()) <= 1e-13
    assert abs(float(loss) - float(T._loss(*parts))) <= 1e-12 * max(1.0, float(loss))
