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


# ---------------------------------------------------------------------------- growth="weight"
from cuscikit import SCISpace  # noqa: E402
from cuscikit.nnqs.pipeline import space_bytes  # noqa: E402

_TIMING = ("t_", "peak_")


def _values(history):
    return history[[c for c in history.columns if not c.startswith(_TIMING)]]


class _RuleAsStated(Runner):
    """Count growth written out from its statement: S + top-K by |psi|, then keep the
    `max_space` best of them (ties by row)."""

    def _grow_by_count(self, r):
        scores, rows = r.keep_scores, r.keep_rows
        order = sorted(range(len(scores)), key=lambda i: (-scores[i], rows[i]))
        kept = order[: self.space_cap] if self.space_cap is not None else order
        configs = r.keep_configs[sorted(kept)]
        self.space = SCISpace(self.molecule, configs, eps=self.eps)
        w = np.exp(2.0 * (scores - scores.max()))
        dropped = float(w[order[len(kept) :]].sum() / w.sum()) if len(kept) < len(scores) else 0.0
        return len(r.new_configs), dropped, {}


def test_count_growth_reproduces_the_rule_as_stated_bit_for_bit():
    mol = Molecule.load("H2O")

    def run(cls, **kw):
        ansatz = Ansatz.for_molecule(mol, seed=0)
        return _values(cls(mol, ansatz, seed=0, topk=64, **kw).run(6, progress=False).history)

    capped = run(Runner, max_space=120)
    assert capped.equals(run(Runner, growth="count", max_space=120))
    stated = run(_RuleAsStated, max_space=120)
    assert (capped["n_space_next"] <= 120).all() and (capped["weight_dropped"] > 0).any()
    cols = [c for c in capped.columns if c not in ("n_new", "weight_dropped")]  # bookkeeping
    assert capped[cols].equals(stated[cols])  # every energy and count, to the bit
    np.testing.assert_allclose(capped["weight_dropped"], stated["weight_dropped"], rtol=1e-12)


def _dense_first_order(mol, ansatz, S):
    """(E_var, configurations outside S, |c_a|^2) of ansatz's psi on S, from the dense H."""
    full = SCISpace.full(mol)
    H = full.hamiltonian.restricted(full.configs, complete_sector=True).toarray()
    pos = full.index(S)
    with torch.no_grad():
        psi = torch.exp(ansatz.log_psi(S).to(torch.complex128)).numpy()
    psi = psi / np.linalg.norm(psi)
    e_var = float(np.real(psi.conj() @ H[np.ix_(pos, pos)] @ psi))
    out = np.setdiff1d(np.arange(len(full.configs)), pos)
    q = np.abs(H[np.ix_(out, pos)] @ psi) ** 2 / (e_var - np.diag(H)[out]) ** 2
    return e_var, full.configs[out], q


def test_weight_growth_adds_the_first_order_top_k():
    mol = Molecule.load("H2O")
    ansatz = Ansatz.for_molecule(mol, seed=1, dtype=torch.float64)
    r = Runner(mol, ansatz, growth="weight", topk=12, seed=1, inner_steps=0, add_weight=1e-9)
    for _ in range(2):
        r.step()
    S = r.space.configs.copy()
    _, outside, q = _dense_first_order(mol, ansatz, S)
    row = r.step()
    assert row["weight_outside"] == pytest.approx(q.sum(), rel=1e-9)
    new = {c.tobytes() for c in r.space.configs} - {c.tobytes() for c in S}
    assert len(new) == row["n_new"] == 12 and row["n_space_next"] == len(S) + 12
    q_new = np.array([q[i] for i, c in enumerate(outside) if c.tobytes() in new])
    q_left = np.array([q[i] for i, c in enumerate(outside) if c.tobytes() not in new])
    assert q_new.min() >= 1e-9
    assert q_new.min() >= q_left.max() * (1 - 1e-9)  # the 12 largest (ties either way)


def test_weight_growth_stops_below_the_threshold():
    mol = Molecule.load("LiH")
    r = Runner(mol, Ansatz.for_molecule(mol, seed=0), growth="weight", topk=8, add_weight=0.5)
    row = r.step()
    assert row["n_new"] == 0 and row["n_space_next"] == 1 and row["weight_outside"] > 0


def test_weight_growth_never_exceeds_the_memory_budget():
    mol = Molecule.load("H2O")
    budget = 600_000

    def run(**kw):
        ansatz = Ansatz.for_molecule(mol, seed=0)
        r = Runner(mol, ansatz, seed=0, topk=64, growth="weight", inner_steps=0, **kw)
        return r.run(6, progress=False).history

    free, held = run(), run(space_memory=budget)
    assert free["n_space_next"].max() > held["n_space_next"].max()  # the budget binds
    used = space_bytes(held["n_space"], held["n_coupled"], 1)
    assert (used <= budget).all() and (held["bytes_planned"] <= budget).all()
    # the plan is exact: what an iteration holds is what the one before planned for it
    assert (used[1:] == held["bytes_planned"].to_numpy()[:-1]).all()
    assert (held["bytes_budget"] == budget).all()


def test_growth_options_are_checked_before_work():
    mol = Molecule.load("LiH")
    bad = [
        dict(growth="both"),
        dict(add_weight=1e-6),  # count growth takes no threshold
        dict(space_memory=10**6),
        dict(growth="weight", add_weight=1.5),
        dict(growth="weight", space_memory=0),
        dict(growth="weight", pt2=False),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            Runner(mol, Ansatz.for_molecule(mol, seed=0), **kw)
    assert Runner(mol, Ansatz.for_molecule(mol, seed=0)).space_cap == 16384
    assert Runner(mol, Ansatz.for_molecule(mol, seed=0), growth="weight").space_cap is None


def test_auto_growth_and_teacher_steps_follow_the_kind_of_system(tmp_path):
    """growth="auto": the weight rule (no count cap) for a lattice model, the count rule for a
    molecule; teacher_inner_steps="auto": 32 for a lattice on any device, `inner_steps` for a
    molecule on a CPU. The checkpoint keeps the rule in force, so a lattice run resumes under
    an explicit "weight" and refuses "count"."""
    from cuscikit.nnqs.checkpoint import CheckpointError
    from cuscikit.nnqs.defaults import DEFAULT_LATTICE_TEACHER_INNER_STEPS as LATTICE_STEPS

    ring, lih = Molecule.hubbard(4, U=4.0, pbc=True), Molecule.load("LiH")
    assert ring.is_lattice and not lih.is_lattice

    def make(mol, **kw):
        return Runner(mol, Ansatz.for_molecule(mol, seed=0), seed=0, topk=8, **kw)

    lattice, molecule = make(ring), make(lih)
    assert (lattice.growth, lattice.growth_rule, lattice.space_cap) == ("auto", "weight", None)
    assert (molecule.growth_rule, molecule.space_cap) == ("count", 16384)
    assert lattice.teacher_inner_count == LATTICE_STEPS == 32
    assert molecule.teacher_inner_count == molecule.inner_steps == 4  # a CPU
    assert make(ring, growth="count").growth_rule == "count"
    assert make(ring, teacher_inner_steps=5).teacher_inner_count == 5
    # a lattice that came through an FCIDUMP carries no mark: the molecular defaults
    ring.to_fcidump(tmp_path / "ring.fcidump")
    assert make(Molecule.from_fcidump(tmp_path / "ring.fcidump")).growth_rule == "count"
    # the weight rule's options are refused where "auto" is the count rule, and say why
    with pytest.raises(ValueError, match='"auto" is "count"'):
        make(lih, add_weight=1e-6)
    assert make(ring, add_weight=1e-6).add_weight == 1e-6
    with pytest.raises(ValueError, match='"auto" is "weight".*growth="count"'):
        make(ring, pt2=False)
    assert make(ring, pt2=False, growth="count").growth_rule == "count"
    # the history: the weight rule's columns on the lattice only
    row = lattice.step()
    assert "weight_outside" in row and "weight_outside" not in molecule.step()
    lattice.save(tmp_path / "ring.h5")
    assert make(ring, growth="weight").load(tmp_path / "ring.h5").iteration == 1
    with pytest.raises(CheckpointError, match="growth"):
        make(ring, growth="count").load(tmp_path / "ring.h5")


def test_weight_growth_on_thread_ranks_matches_one_rank():
    from cuscikit.parallel.comm import run_ranks

    mol = Molecule.load("H2O")

    def make(comm=None):
        ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
        kw = dict(seed=0, topk=24, growth="weight", inner_steps=0, space_memory=500_000, teacher=0)
        return Runner(mol, ansatz, comm=comm, **kw)

    one = make().run(5, progress=False)
    assert (one.history["bytes_planned"] > 0.8 * 500_000).any()  # the budget takes part

    def rank(comm):
        r = make(comm).run(5, progress=False)
        return r.space.configs, r.history

    for configs, h in run_ranks(3, rank):  # the same S (budget and ties included) on every rank
        assert np.array_equal(configs, one.space.configs)
        assert h["n_space_next"].tolist() == one.history["n_space_next"].tolist()
        np.testing.assert_allclose(h["e_variational"], one.history["e_variational"], atol=1e-8)
        np.testing.assert_allclose(h["weight_outside"], one.history["weight_outside"], rtol=1e-8)


def test_command_line_weight_growth_resumes_and_refuses_bad_combinations(capsys, tmp_path):
    import json

    from cuscikit.cli import main

    def run(*args):
        assert main(["nnqs", "LiH", "--topk", "8", "--seed", "1", "--json", *args]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    full = run("--growth", "weight", "--iters", "4")
    assert full["growth"] == "weight" and full["iterations"] == 4
    ck = tmp_path / "ck.h5"
    run("--growth", "weight", "--iters", "2", "--checkpoint", str(ck))
    assert run("--growth", "weight", "--iters", "4", "--resume", str(ck))["e_tot"] == full["e_tot"]
    saved_weight = ["nnqs", "LiH", "--topk", "8", "--iters", "4", "--resume", str(ck)]
    assert main(saved_weight) == 2  # saved with growth "weight", resumed under "count"
    assert "growth" in capsys.readouterr().err
    assert main(["nnqs", "LiH", "--add-weight", "1e-6"]) == 2
    assert "growth" in capsys.readouterr().err
