"""The DRT: CSF counts against the Weyl-Paldus formula, the lexical index both ways, the compiled
step vectors, the determinant expansion, and the refusal of impossible spaces."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuscikit.guga import DRT

# (norb, nelec, 2S, n_csf) from the closed formula of the dimension of the U(n) irrep
# (2S+1)/(n+1) C(n+1, N/2-S) C(n+1, n-N/2-S), written out independently here.
TABLE = [
    (6, 6, 0, 175),
    (10, 10, 0, 19404),
    (10, 10, 2, 29700),
    (10, 10, 4, 12375),
    (12, 12, 0, 226512),
    (14, 14, 0, 2760615),
    (1, 1, 1, 1),
    (1, 2, 0, 1),
    (3, 3, 3, 1),
    (4, 2, 0, 10),
    (8, 5, 1, 1008),
]


def _weyl(n, N, twos):
    s2 = twos
    return (
        (s2 + 1) * math.comb(n + 1, (N - s2) // 2) * math.comb(n + 1, n - (N + s2) // 2) // (n + 1)
    )


@pytest.mark.parametrize("norb,nelec,twos,expected", TABLE)
def test_csf_count_table(norb, nelec, twos, expected):
    assert DRT(norb, nelec, twos).n_csf == expected


def test_csf_count_matches_weyl_everywhere():
    for n in range(1, 9):
        for N in range(0, 2 * n + 1):
            for twos in range(N % 2, min(N, 2 * n - N) + 1, 2):
                assert DRT(n, N, twos).n_csf == _weyl(n, N, twos) == DRT.weyl(n, N, twos)


@pytest.mark.parametrize("norb,nelec,twos", [(6, 6, 0), (6, 5, 3), (7, 4, 2)])
def test_rank_unrank_and_compiled_steps(norb, nelec, twos):
    drt = DRT(norb, nelec, twos)
    steps = drt.steps()
    assert steps.shape == (drt.n_csf, norb)
    seen = set()
    for r in range(drt.n_csf):
        s = drt.unrank(r)
        assert drt.rank(s) == r
        np.testing.assert_array_equal(steps[r], s)
        occ = np.array([0, 1, 1, 2])[s]
        assert occ.sum() == nelec
        b = np.cumsum(np.array([0, 1, -1, 0])[s])
        assert b.min() >= 0 and b[-1] == twos  # a genealogical coupling of spin S
        seen.add(tuple(s))
    assert len(seen) == drt.n_csf


def test_csf_to_dets_is_orthonormal_and_spin_pure():
    from pyscf.fci import spin_op

    drt = DRT(5, 5, 3)
    for twom in (3, 1, -1):
        X, nelec = drt.csf_to_dets(twom)
        S = X.reshape(len(X), -1)
        np.testing.assert_allclose(S @ S.T, np.eye(len(X)), atol=1e-12)
        for x in X:
            assert spin_op.spin_square0(x, 5, nelec)[0] == pytest.approx(3.75, abs=1e-12)


@pytest.mark.parametrize(
    "args,match",
    [
        ((4, 4, 1), "impossible"),
        ((4, 4, 6), "impossible"),
        ((3, 5, 3), "impossible"),
        ((4, 9, 1), "do not fit"),
        ((65, 2, 0), "norb"),
    ],
)
def test_bad_spaces_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        DRT(*args)


def test_rank_rejects_foreign_walks():
    drt = DRT(4, 4, 0)
    with pytest.raises(ValueError):
        drt.rank("2222")
    assert drt.rank("2200") == drt.rank([3, 3, 0, 0])
