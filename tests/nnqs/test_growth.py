"""How S keeps its configurations: the cap by count (`max_space`) and pruning by weight
(`prune_weight`), against a direct numpy statement of each rule, and in a run."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs.runner import _kept  # noqa: E402


def _direct(scores, max_space, prune_weight):
    """The rules as stated: sort by |psi| (ties: row), then drop the longest tail whose share
    of sum |psi|^2 is <= prune_weight, then keep at most max_space."""
    n = len(scores)
    order = sorted(range(n), key=lambda i: (-scores[i], i))
    w = np.exp(2.0 * np.asarray(scores, dtype=np.float64))
    share = w / w.sum()
    k = n
    if prune_weight is not None:
        while k > 1 and share[order[k - 1 :]].sum() <= prune_weight:
            k -= 1  # order[k - 1:] carries no more than the bound: drop it too
    if max_space is not None:
        k = min(k, max_space)
    return order[:k]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("max_space, prune_weight", [(None, 1e-3), (40, None), (40, 1e-2)])
def test_kept_follows_the_rules(seed, max_space, prune_weight):
    rng = np.random.default_rng(seed)
    scores = rng.normal(scale=2.0, size=200).round(2)  # ties included
    rows = np.arange(200)
    keep, dropped = _kept(rows, scores, max_space, prune_weight)
    expect = _direct(scores, max_space, prune_weight)
    got = list(range(200)) if keep is None else keep.tolist()
    assert sorted(got) == sorted(expect)
    w = np.exp(2.0 * scores)
    share = w / w.sum()
    assert dropped == pytest.approx(share.sum() - share[got].sum(), abs=1e-12)
    if prune_weight is not None and max_space is None:
        assert dropped <= prune_weight
        smallest_kept = min(got, key=lambda i: (share[i], -i))
        assert dropped + share[smallest_kept] > prune_weight  # the longest such tail


def test_no_rule_keeps_everything():
    keep, dropped = _kept(np.arange(5), np.zeros(5), None, None)
    assert keep is None and dropped == 0.0


def _run(**kw):
    mol = Molecule.load("H2O")
    r = Runner(mol, Ansatz.for_molecule(mol, seed=0, dtype=torch.float64), seed=0, topk=64, **kw)
    return r.run(5, progress=False).history


def test_pruning_by_weight_in_a_run():
    grown = _run(max_space=None)
    pruned = _run(max_space=None, prune_weight=1e-4)
    capped = _run(max_space=120)
    assert (grown["weight_dropped"] == 0).all()
    assert (pruned["weight_dropped"] <= 1e-4).all() and (pruned["weight_dropped"] > 0).any()
    assert (pruned["n_space_next"] <= pruned["n_space"] + 64).all()
    assert pruned["n_space_next"].iloc[-1] < grown["n_space_next"].iloc[-1]
    assert (capped["n_space_next"] <= 120).all() and (capped["weight_dropped"] > 0).any()
    assert np.isfinite(pruned["e_tot"]).all()


def test_prune_weight_is_checked_before_work():
    mol = Molecule.load("LiH")
    for bad in (float("nan"), -0.1, 1.0, "0.1", True):
        with pytest.raises(ValueError, match="prune_weight"):
            Runner(mol, Ansatz.for_molecule(mol, seed=0), prune_weight=bad)
