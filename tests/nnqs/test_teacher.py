"""The selected-CI teacher (`cuscikit.nnqs.teacher`, `Runner(teacher=...)`): its vector is the
ground state of H within S, its loss vanishes exactly for that state, its coefficients give the
loss's gradient, and with the teacher off a run is the plain method."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sp = pytest.importorskip("scipy.sparse")

from cuscikit import Ansatz, Molecule, Runner  # noqa: E402
from cuscikit.nnqs import teacher as T  # noqa: E402
from cuscikit.sci.space import SCISpace  # noqa: E402


def _pairs(space):
    """(diagonal, off-diagonal pairs) of H restricted to a space, from its sparse matrix."""
    dense = space.hamiltonian.restricted(space.configs).toarray()
    rows, cols = np.nonzero(dense - np.diag(np.diag(dense)))
    return np.diag(dense).copy(), (rows, cols, dense[rows, cols]), dense


def _on(device, diag, pairs):
    """The diagonal and pairs as numpy arrays (device None) or as torch tensors on `device`."""
    if device is None:
        return diag, pairs
    return torch.as_tensor(diag, device=device), tuple(
        torch.as_tensor(a, device=device) for a in pairs
    )


_DEVICES = [
    None,
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


@pytest.mark.parametrize("device", _DEVICES)  # numpy (SciPy's products), torch's CSR
@pytest.mark.parametrize("dense_limit", [T.DENSE_LIMIT, 10])  # dense, then the Davidson path
@pytest.mark.parametrize("start", ["psi", "none"])
def test_space_ground_state_is_the_dense_one(monkeypatch, dense_limit, device, start):
    monkeypatch.setattr(T, "DENSE_LIMIT", dense_limit)
    mol = Molecule.load("H2O")
    space = SCISpace.singles_doubles(mol)
    diag, pairs, dense = _pairs(space)
    w, v = np.linalg.eigh(dense)
    guess = np.ones(len(diag)) + 0.1j if start == "psi" else None
    e, c = T.space_ground_state(*_on(device, diag, pairs), guess=guess)
    assert isinstance(c, np.ndarray)
    assert e == pytest.approx(w[0], abs=1e-9)
    assert abs(abs(float(c @ v[:, 0])) - 1.0) < 1e-8
    assert c[np.argmax(np.abs(c))] > 0
    assert e == pytest.approx(space.exact_energy(method="dense"), abs=1e-9)


@pytest.mark.parametrize("device", _DEVICES)  # numpy (SciPy's products), torch's CSR
@pytest.mark.parametrize("dense_limit", [T.DENSE_LIMIT, 10])  # gathered dense, shared Davidson
@pytest.mark.parametrize("P", [2, 3, 7])
def test_space_ground_state_on_ranks_is_the_one_rank_one(monkeypatch, dense_limit, device, P):
    """Each of P thread ranks passes its contiguous share of H_SS's rows (and the guess over all
    of S); every rank returns the same vector, the one-rank solution to rounding."""
    from cuscikit.nnqs.distributed import source_share
    from cuscikit.parallel import run_ranks

    monkeypatch.setattr(T, "DENSE_LIMIT", dense_limit)
    mol = Molecule.load("H2O")
    space = SCISpace.singles_doubles(mol)
    diag, (rows, cols, vals), dense = _pairs(space)
    guess = np.ones(len(diag)) + 0.1j
    e1, c1 = T.space_ground_state(*_on(device, diag, (rows, cols, vals)), guess=guess)

    def rank(comm):
        lo, hi = source_share(len(diag), comm.size, comm.rank)
        mine = (rows >= lo) & (rows < hi)
        share = (diag[lo:hi], (rows[mine], cols[mine], vals[mine]))
        return T.space_ground_state(*_on(device, *share), guess=guess, comm=comm)

    got = run_ranks(P, rank)
    for e, c in got[1:]:  # the same iteration on the same vectors: identical on every rank
        assert e == got[0][0] and np.array_equal(c, got[0][1])
    e, c = got[0]
    assert e == pytest.approx(e1, abs=1e-10)
    np.testing.assert_allclose(c, c1, atol=1e-7)
    assert e == pytest.approx(np.linalg.eigvalsh(dense)[0], abs=1e-9)


@pytest.mark.parametrize("device", _DEVICES)
def test_space_ground_state_on_more_ranks_than_rows(monkeypatch, device):
    """Davidson's path with ranks that hold no rows (20 ranks, 15 configurations)."""
    from cuscikit.nnqs.distributed import source_share
    from cuscikit.parallel import run_ranks

    monkeypatch.setattr(T, "DENSE_LIMIT", 10)
    rng = np.random.default_rng(3)
    a = rng.normal(size=(15, 15)) * (rng.random((15, 15)) < 0.4)
    h = a + a.T + np.diag(np.arange(15.0))
    rows, cols = np.nonzero(h - np.diag(np.diag(h)))
    diag, vals = np.diag(h).copy(), h[rows, cols]

    def rank(comm):
        lo, hi = source_share(15, comm.size, comm.rank)
        mine = (rows >= lo) & (rows < hi)
        share = (diag[lo:hi], (rows[mine], cols[mine], vals[mine]))
        return T.space_ground_state(*_on(device, *share), comm=comm)

    got = run_ranks(20, rank)
    w, v = np.linalg.eigh(h)
    for e, c in got:
        assert e == pytest.approx(w[0], abs=1e-9)
        assert abs(abs(float(c @ v[:, 0])) - 1.0) < 1e-8


def test_bad_pairs_are_refused():
    with pytest.raises(ValueError, match="empty"):
        T.space_ground_state(np.zeros(0), (np.zeros(0), np.zeros(0), np.zeros(0)))
    with pytest.raises(ValueError, match="one length"):
        T.space_ground_state(np.zeros(2), (np.zeros(1), np.zeros(2), np.zeros(2)))


def _state(n=12, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=n)
    return torch.as_tensor(c / np.linalg.norm(c))


def test_fidelity_loss_is_zero_exactly_for_the_teacher_state():
    c = _state()
    for scale, phase in [(1.0, 0.0), (3.7, 0.4), (0.01, -2.5)]:
        psi = (scale * c).to(torch.complex128) * np.exp(1j * phase)
        assert abs(T.fidelity_loss(psi, c)) < 1e-12
        assert T.teacher_coefficients(psi, c).abs().max() < 1e-12
    wrong_sign = c.clone().to(torch.complex128)
    wrong_sign[3] *= -1
    assert T.fidelity_loss(wrong_sign, c) > 1e-3
    wrong_size = c.clone().to(torch.complex128)
    wrong_size[5] *= 1e-3  # a collapsed amplitude
    assert T.fidelity_loss(wrong_size, c) > 1e-3


def test_coefficients_are_the_gradient_of_the_loss():
    """d L_T / d ln|psi| = 2 Re T and d L_T / d phi = 2 Im T (autograd through the loss,
    global phase included)."""
    c = _state(seed=1)
    rng = np.random.default_rng(2)
    a = torch.tensor(rng.normal(scale=0.5, size=len(c)), requires_grad=True)
    phi = torch.tensor(rng.normal(scale=1.0, size=len(c)), requires_grad=True)
    psi = torch.exp(torch.complex(a, phi))
    p, q, delta = T._parts(psi, c)
    loss = (q * (q.log() - p.log())).sum() + 2.0 * (q * (1 - torch.cos(delta))).sum()
    assert float(loss.detach()) == pytest.approx(T.fidelity_loss(psi.detach(), c), abs=1e-12)
    loss.backward()
    coef = T.teacher_coefficients(psi.detach(), c)
    np.testing.assert_allclose(a.grad.numpy(), 2 * coef.real.numpy(), atol=1e-10)
    np.testing.assert_allclose(phi.grad.numpy(), 2 * coef.imag.numpy(), atol=1e-10)


def _runner(**kw):
    mol = Molecule.load("LiH")
    ansatz = Ansatz.for_molecule(mol, seed=0, dtype=torch.float64)
    return Runner(mol, ansatz, seed=0, **{"topk": 16, **kw})


def test_runner_teacher_is_the_ci_vector_of_its_space():
    r = _runner(teacher=0.5, teacher_until=4, teacher_hold=0)
    for t in range(1, 6):
        space = SCISpace(r.molecule, r.space.configs.copy())
        row = r.step()
        assert row["teacher_weight"] == pytest.approx(0.5 * max(0, 4 - t) / 3)
        solved = r._teacher_last is not None and np.array_equal(r._teacher_last[0], space.configs)
        if t < 4 or solved:  # its energy is the CI energy of the iteration's S while it is on,
            # and after it while S is the last one solved (no new eigensolve)
            assert row["e_teacher"] == pytest.approx(space.exact_energy(method="dense"), abs=1e-9)
            assert row["e_teacher"] <= row["e_variational"] + 1e-9
        else:
            assert np.isnan(row["e_teacher"])


def test_teacher_solves_again_only_when_the_space_changes(monkeypatch):
    """An iteration whose S equals the last solved one reuses that solution: one solve per
    distinct S, and each iteration's energy is still the CI energy of its S."""
    calls = []
    solve = T.space_ground_state

    def counted(*a, **kw):
        calls.append(1)
        return solve(*a, **kw)

    monkeypatch.setattr(T, "space_ground_state", counted)
    r = _runner(teacher=0.5, teacher_until=100, topk=64)
    spaces = []
    for _ in range(8):
        spaces.append(r.space.configs.copy())
        row = r.step()
        exact = SCISpace(r.molecule, spaces[-1]).exact_energy(method="dense")
        assert row["e_teacher"] == pytest.approx(exact, abs=1e-9)
    distinct = 1 + sum(
        not np.array_equal(a, b) for a, b in zip(spaces[:-1], spaces[1:], strict=True)
    )
    assert len(calls) == distinct < len(spaces)  # LiH's space stops growing within 8


def test_teacher_pulls_the_network_towards_the_ci_vector():
    plain = _runner(inner_steps=2, teacher=0).run(6, progress=False)
    taught = _runner(inner_steps=2, teacher=5.0, teacher_until=100).run(6, progress=False)
    h = taught.history
    assert h["teacher_loss"].iloc[-1] < 0.5 * h["teacher_loss"].iloc[1]
    # the network's own energy is reported, not the teacher's
    assert (h["e_variational"] > h["e_teacher"] - 1e-9).all()
    assert not h["e_variational"].equals(plain.history["e_variational"])


def test_teacher_off_is_the_plain_method():
    a = _runner(inner_steps=2, teacher=0).run(4, progress=False).history
    b = _runner(inner_steps=2, teacher=0.7, teacher_until=1, teacher_gap=None, teacher_hold=0)
    b = b.run(4, progress=False).history
    cols = [k for k in a.columns if not k.startswith("t_") and k != "peak_memory_bytes"]
    for k in cols:
        np.testing.assert_array_equal(a[k].to_numpy(), b[k].to_numpy(), err_msg=k)
    assert "teacher_weight" not in a.columns and (b["teacher_weight"] == 0).all()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"teacher": -1.0}, "teacher must be"),
        ({"teacher": float("nan")}, "teacher must be"),
        ({"teacher": True}, "teacher must be"),
        ({"teacher_until": 0}, "teacher_until"),
        ({"teacher": "on"}, "teacher must be"),
        ({"teacher_inner_steps": -1}, "teacher_inner_steps"),
        ({"teacher_inner_steps": "many"}, "teacher_inner_steps"),
        ({"teacher_gap": -1e-4}, "teacher_gap"),
        ({"teacher_gap": float("inf")}, "teacher_gap"),
        ({"teacher_hold": -0.1}, "teacher_hold"),
        ({"teacher_hold": 1.5}, "teacher_hold"),
        ({"teacher_hold": float("nan")}, "teacher_hold"),
        ({"teacher_hold": True}, "teacher_hold"),
        ({"teacher_hold": "on"}, "teacher_hold"),
        ({"teacher_hold": 0.5, "teacher_gap": None}, "teacher_gap"),
        ({"teacher_resolve": 1}, "teacher_resolve"),
    ],
)
def test_bad_teacher_options(kw, match):
    with pytest.raises(ValueError, match=match):
        _runner(**kw)


def test_default_schedule_of_the_teacher_and_its_inner_steps():
    """The defaults: the teacher on at weight 1 falling to 0 at iteration 200 (held, below),
    its inner steps (16 on a GPU, `inner_steps` on a CPU) while it is on; without the hold after
    it 16 while S is the last solved space and the network trails its CI energy by more than
    the gap, else 4 (teacher_gap=None: 4 at once)."""
    from cuscikit.nnqs import defaults as D

    r = _runner()
    assert r.teacher == "auto" and r.teacher_on == D.DEFAULT_TEACHER == 1.0
    assert r.teacher_hold == D.DEFAULT_TEACHER_HOLD == 1.0
    assert r.teacher_weight(1) == 1.0 and r.teacher_weight(D.DEFAULT_TEACHER_UNTIL) == 0.0
    assert r.teacher_weight(101) == pytest.approx((200 - 101) / 199)
    assert (D.DEFAULT_TEACHER_INNER_STEPS, D.DEFAULT_INNER_STEPS) == (16, 4)
    assert r.teacher_inner_steps == "auto" and r.teacher_inner_count == 4  # on a CPU: inner_steps
    # a small ring: S stops growing at iteration 3, so after the teacher's weight reaches 0
    # the trailing test needs no new eigensolve
    mol = Molecule.hubbard(4, U=4.0, pbc=True)
    for gap in (1e-4, 1e-2, None):
        ansatz = Ansatz.for_molecule(mol, seed=1, dtype=torch.float64)
        run = Runner(
            mol,
            ansatz,
            seed=1,
            teacher_until=4,
            teacher_gap=gap,
            teacher_inner_steps=16,
            teacher_hold=0,
        )
        run = run.run(8, progress=False)
        h = run.history
        assert (h["inner_steps"].iloc[:3] == 16).all() and (h["teacher_weight"].iloc[3:] == 0).all()
        assert (h["n_space"].iloc[2:] == h["n_space"].iloc[2]).all()  # S reached: 10 of 36
        after = h.iloc[3:]
        assert np.isfinite(after["e_teacher"]).all()  # S unchanged: the last solution holds
        trailing = after["e_variational"] - after["e_teacher"] > (
            gap if gap is not None else np.inf
        )
        np.testing.assert_array_equal(after["inner_steps"], np.where(trailing, 16, 4))
    assert (h["inner_steps"].iloc[3:] == 4).all()  # gap None
    assert "teacher_released" not in h.columns  # no hold: the columns of the schedule alone


def _ring(**kw):
    """The 4-site Hubbard ring (U = 4): S stops growing at iteration 3 (10 of 36)."""
    mol = Molecule.hubbard(4, U=4.0, pbc=True)
    ansatz = Ansatz.for_molecule(mol, seed=1, dtype=torch.float64)
    return Runner(mol, ansatz, seed=1, **{"teacher_inner_steps": 16, **kw})


def test_hold_zero_is_the_linear_schedule():
    """teacher_hold=0: the weight is the linear fall of `teacher_weight` at every iteration and
    the history has no hold column (the run of the schedule before the hold existed)."""
    r = _ring(teacher_until=4, teacher_hold=0).run(6, progress=False)
    h = r.history
    want = [r.teacher_weight(t) for t in range(1, 7)]
    np.testing.assert_array_equal(h["teacher_weight"], want)
    assert want[:4] == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3), 0.0]
    assert "teacher_released" not in h.columns and not r.teacher_released


@pytest.mark.parametrize("until", [4, 40])
def test_hold_keeps_the_weight_while_the_gap_is_open_and_releases_for_good(until):
    """With the hold the weight stays at teacher_hold * teacher from iteration 2 (where the
    linear fall would be below it) while the network trails the CI energy of S by more than
    teacher_gap; the first iteration within the gap releases it for good, and from then on the
    weight is the linear schedule's (0 after teacher_until, where the inner steps go back to
    `inner_steps` once: the count changes once a run). With teacher_until = 40 the release comes
    first and the teacher goes on at the scheduled weight.

    The gap is taken from a run whose hold never releases (gap 0): the trail of the first
    iteration where the hold binds and the trail is below all earlier ones, so that the release
    falls there whatever the machine's rounding makes of the trajectory (the two runs agree up
    to the release; a fixed gap of 1e-2 was never closed in 14 iterations on one machine)."""
    kw = dict(teacher_until=until, teacher_hold=0.75, teacher=2.0)
    probe = _ring(teacher_gap=0.0, **kw)
    probe.run(14, progress=False)
    trail0 = (probe.history["e_variational"] - probe.history["e_teacher"]).to_numpy()
    assert not probe.history["teacher_released"].any()  # a positive trail never closes gap 0
    sched = np.array([probe.teacher_weight(t) for t in range(1, 15)])
    binds = [i for i in range(2, 14) if sched[i] < 1.5]  # where the hold is above the schedule
    # the first of them whose trail is below every earlier one: a gap there is first closed there
    lows = [i for i in binds if trail0[i] < trail0[1:i].min()]
    assert lows, f"no iteration to release at: trail {trail0}"
    k0 = lows[0]
    gap = float(trail0[k0])
    r = _ring(teacher_gap=gap, **kw)
    r.run(14, progress=False)
    h = r.history
    released = h["teacher_released"].to_numpy()
    assert released.dtype == bool and not released[0] and released[-1] and r.teacher_released
    k = int(np.argmax(released))  # the releasing iteration (0-based row)
    assert (released[k:]).all()  # one way
    trail = (h["e_variational"] - h["e_teacher"]).to_numpy()
    np.testing.assert_array_equal(trail[: k + 1], trail0[: k + 1])  # the same run up to k
    assert k > 1 and sched[k] < 1.5  # the test is made only where the hold binds
    np.testing.assert_array_equal(h["teacher_weight"].iloc[:k], np.maximum(sched[:k], 1.5))
    assert (trail[1:k] > gap).all() and trail[k] <= gap
    np.testing.assert_array_equal(h["teacher_weight"].iloc[k:], sched[k:])
    assert (sched[k:] > 0).all() == (until > 14)
    steps = h["inner_steps"].to_numpy()
    assert int(np.count_nonzero(np.diff(steps))) == (1 if until < 14 else 0)
    assert (steps[: max(k, until - 1)] == 16).all() and (steps[max(k, until - 1) :] == 4).all()


def test_hold_solves_each_new_space_after_the_schedule():
    """teacher_resolve (the default): after teacher_until the hold solves each new S. LiH's S
    still grows at iterations 3 and 4, and the hold stays at its weight with the CI energy of
    each S (the dense one) while the gap is open."""
    r = _runner(teacher_until=3, teacher_hold=1.0, teacher_inner_steps=3, teacher_gap=1e-6)
    assert r.teacher_resolve is True
    sizes, exact = [], []
    for _ in range(4):
        sizes.append(len(r.space))
        exact.append(r.space.exact_energy(method="dense"))
        r.run(1, progress=False)
    h = r.history
    assert sizes[2] != sizes[1] and sizes[3] != sizes[2]  # S changes after teacher_until
    assert h["teacher_weight"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert h["teacher_released"].tolist() == [False] * 4
    assert h["inner_steps"].tolist() == [3, 3, 3, 3]
    np.testing.assert_allclose(h["e_teacher"].to_numpy(), exact, atol=1e-9)
    assert (h["e_variational"] - h["e_teacher"]).iloc[1:].min() > 1e-6


def test_teacher_guess_carries_the_last_solution_over():
    """The eigensolve's start on a changed S: the last solution on the shared rows (by
    configuration, whatever their order), the network's psi scaled to the same norm on the new
    ones; and a Davidson solve from it gives the dense ground state of the new S."""
    from types import SimpleNamespace

    mol = Molecule.load("H2O")
    big = SCISpace.singles_doubles(mol)
    diag, pairs, dense = _pairs(big)
    old = big.configs[::-1][: len(big) - 7]  # another order, seven configurations fewer
    r = _runner()
    c_old = np.random.default_rng(3).normal(size=len(old))
    r._teacher_last = (old, -1.0, c_old)
    psi = np.exp(1j * 0.3) * np.linspace(1.0, 2.0, len(big))
    g = r._teacher_guess(big.configs, SimpleNamespace(psi_s=psi))
    rows = {bytes(x): i for i, x in enumerate(old)}
    shared = np.array([bytes(x) in rows for x in big.configs])
    assert int((~shared).sum()) == 7
    np.testing.assert_array_equal(g[shared], [c_old[rows[bytes(x)]] for x in big.configs[shared]])
    scale = np.linalg.norm(c_old) / np.linalg.norm(np.abs(psi[shared]))
    np.testing.assert_allclose(g[~shared], np.abs(psi[~shared]) * scale, rtol=1e-12)
    e, c = T.space_ground_state(diag, pairs, guess=g)
    w, v = np.linalg.eigh(dense)
    assert e == pytest.approx(w[0], abs=1e-9) and abs(abs(float(c @ v[:, 0])) - 1) < 1e-8
    r._teacher_last = None  # before the first solve: the network's psi
    assert r._teacher_guess(big.configs, SimpleNamespace(psi_s=psi)) is psi


def test_hold_ends_when_the_space_changes_after_the_schedule(tmp_path):
    """teacher_resolve=False: after teacher_until the hold needs the last solution (no new
    eigensolve): LiH's S still grows at iteration 3, so the hold ends there although the gap is
    open. Its checkpoint, whose history holds that NaN e_teacher, loads (and so does one of a
    run with pt2=False, whose e_pt2 is NaN); infinities are refused."""
    import h5py

    from cuscikit.nnqs.checkpoint import CheckpointError, _digest

    r = _runner(teacher_until=3, teacher_hold=1.0, teacher_inner_steps=3, teacher_resolve=False)
    h = r.run(4, progress=False).history
    assert h["teacher_weight"].tolist()[:2] == [1.0, 1.0]
    assert h["teacher_released"].tolist() == [False, False, True, True]
    assert h["n_space"].iloc[2] != h["n_space"].iloc[1] and np.isnan(h["e_teacher"].iloc[2])
    assert h["teacher_weight"].iloc[2] == 0 and h["inner_steps"].tolist() == [3, 3, 4, 4]
    r.save(tmp_path / "a.h5")
    assert _runner(teacher_until=3).load(tmp_path / "a.h5").teacher_released
    plain = _runner(teacher=0, pt2=False).run(1, progress=False)
    plain.save(tmp_path / "b.h5")
    assert np.isnan(_runner(teacher=0, pt2=False).load(tmp_path / "b.h5").history["e_pt2"]).all()
    with h5py.File(tmp_path / "b.h5", "r+") as f:
        del f["history/e_pt2"]
        ds = f.create_dataset("history/e_pt2", data=np.array([np.inf]))
        ds.attrs["sha256"] = _digest(ds[()])
    with pytest.raises(CheckpointError, match="non-finite"):
        _runner(teacher=0, pt2=False).load(tmp_path / "b.h5")


def test_checkpoint_keeps_the_hold_and_the_teacher_solution(tmp_path):
    """A run resumed from a checkpoint (before the release, after teacher_until, and after the
    release) continues exactly as the uninterrupted one: the released flag and the last
    solution travel with the file. A file without the teacher's group takes the flag from
    the history's last row."""
    import h5py

    kw = dict(teacher_until=4, teacher_hold=1.0, teacher_gap=1e-2)
    whole = _ring(**kw)
    for k, n in ((6, 6), (12, 6)):
        whole.run(n, progress=False)
        whole.save(tmp_path / f"at{k}.h5")
    whole.run(2, progress=False)
    h = whole.history
    assert not h["teacher_released"].iloc[5] and h["teacher_released"].iloc[11]
    # timings and the machine's free memory (the weight rule's budget: a lattice) aside
    machine = ("peak_memory_bytes", "bytes_budget")
    cols = [c for c in h.columns if not c.startswith("t_") and c not in machine]
    for k in (6, 12):
        again = _ring(**kw).load(tmp_path / f"at{k}.h5")
        assert again.teacher_released == bool(h["teacher_released"].iloc[k - 1])
        rest = again.run(14 - k, progress=False).history
        for c in cols:
            np.testing.assert_array_equal(rest[c].to_numpy(), h[c].to_numpy(), err_msg=c)
    with h5py.File(tmp_path / "at12.h5", "r+") as f:
        del f["teacher"]
    older = _ring(**kw).load(tmp_path / "at12.h5")
    assert older.teacher_released and older._teacher_last is None


def test_resume_names_the_teacher_settings_that_differ(tmp_path):
    """The teacher's settings (resolved: "auto" counts differ between CPU and GPU) travel in the
    checkpoint's run conditions: resuming with the same ones is silent, with others it warns and
    names each one that differs with its saved and present value."""
    import warnings

    _ring(teacher_until=4).run(2, progress=False).save(tmp_path / "ck.h5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ring(teacher_until=4).load(tmp_path / "ck.h5")
    with pytest.warns(UserWarning, match="other run conditions") as got:
        _ring(teacher_until=5, teacher_inner_steps=3, teacher=0.5).load(tmp_path / "ck.h5")
    text = str(got[0].message)
    for part in (
        "teacher_inner_steps: saved 16, now 3",
        "teacher_until: saved 4, now 5",
        "teacher: saved 1.0, now 0.5",
    ):
        assert part in text, text
    assert "teacher_gap" not in text and "teacher_hold" not in text, text


def test_the_teacher_loss_column_is_the_fidelity_loss_of_the_iterations_psi(monkeypatch):
    """The iteration's pull and loss come from one evaluation (`pull_and_loss`, read after the
    optimiser stage): the column is `fidelity_loss` of the psi and c it was given, and the
    pull is `teacher_coefficients` of them."""
    seen = []
    pull_and_loss = T.pull_and_loss

    def spy(psi, c):
        out = pull_and_loss(psi, c)
        seen.append((psi.clone(), c.clone(), out[0].clone()))
        return out

    monkeypatch.setattr(T, "pull_and_loss", spy)
    r = _runner(inner_steps=1, teacher=0.5)
    rows = [r.step() for _ in range(3)]
    assert len(seen) == 3
    for row, (psi, c, pull) in zip(rows, seen, strict=True):
        assert row["teacher_loss"] == T.fidelity_loss(psi, c)
        assert torch.equal(pull, T.teacher_coefficients(psi, c))
    assert rows[-1]["n_space"] > 1 and rows[-1]["teacher_loss"] > 0
