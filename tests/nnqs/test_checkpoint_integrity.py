"""Checkpoints a database engineer would sign: checksums, invariants, atomic and never-worse
writes, loads that change nothing until they succeed, one writer per file."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch

from cuscikit import Molecule
from cuscikit.nnqs import Ansatz, Runner
from cuscikit.nnqs.checkpoint import (
    CheckpointError,
    CheckpointLock,
    NonFiniteStateError,
    remove_stale_temporaries,
)
from cuscikit.nnqs.runner import NonFiniteLossError


def _runner(seed=0):
    mol = Molecule.load("LiH")
    return Runner(
        mol,
        Ansatz.for_molecule(mol, seed=seed, dtype=torch.float64),
        topk=8,
        seed=seed,
        inner_steps=1,
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("ck") / "good.h5"
    r = _runner()
    r.run(3, progress=False)
    r.save(path)
    return path


def _copy(saved, tmp_path):
    dst = tmp_path / "c.h5"
    dst.write_bytes(saved.read_bytes())
    return dst


def _state(r):
    return {k: v.clone() for k, v in r.ansatz.state_dict().items()}


def _unchanged(r, before):
    after = r.ansatz.state_dict()
    return all(torch.equal(before[k], after[k]) for k in before) and r.iteration == 0


@pytest.mark.parametrize("dataset", ["model/phase.0.weight", "history/e_tot", "space/configs"])
def test_one_flipped_bit_is_refused_and_nothing_changes(saved, tmp_path, dataset):
    path = _copy(saved, tmp_path)
    with h5py.File(path, "r+") as f:
        names = []
        f.visit(lambda n: names.append(n) if isinstance(f[n], h5py.Dataset) else None)
        name = dataset if dataset in f else next(n for n in names if n.startswith("model/"))
        data = f[name][()]
        raw = np.ascontiguousarray(data).view(np.uint8).copy()
        raw[len(raw) // 2] ^= 1
        f[name][...] = raw.view(data.dtype).reshape(data.shape)
    r = _runner(seed=1)
    before = _state(r)
    with pytest.raises(CheckpointError, match="checksum"):
        r.load(path)
    assert _unchanged(r, before)


def test_iteration_must_match_the_history(saved, tmp_path):
    path = _copy(saved, tmp_path)
    with h5py.File(path, "r+") as f:
        f.attrs["iteration"] = -5
    r = _runner(seed=1)
    before = _state(r)
    with pytest.raises(CheckpointError, match="does not match"):
        r.load(path)
    assert _unchanged(r, before)


def test_configurations_of_another_sector_are_refused(saved, tmp_path):
    from cuscikit.nnqs.checkpoint import _digest

    path = _copy(saved, tmp_path)
    with h5py.File(path, "r+") as f:
        cfg = f["space/configs"][()]
        cfg[0, 0] |= np.uint64(1 << 63)  # one electron more (outside LiH's 12 spin orbitals)
        del f["space/configs"]
        ds = f.create_dataset("space/configs", data=cfg)
        ds.attrs["sha256"] = _digest(cfg)  # a consistent file that is still wrong
    r = _runner(seed=1)
    before = _state(r)
    with pytest.raises(CheckpointError, match="do not fit the molecule"):
        r.load(path)
    assert _unchanged(r, before)


def test_a_non_finite_state_never_replaces_a_good_checkpoint(saved, tmp_path):
    path = _copy(saved, tmp_path)
    good = path.read_bytes()
    r = _runner()
    r.load(path)
    with torch.no_grad():
        next(r.ansatz.parameters()).fill_(float("nan"))
    with pytest.raises(NonFiniteStateError, match="last good state"):
        r.save(path)
    assert path.read_bytes() == good
    assert (tmp_path / "c.nonfinite.h5").exists()


def test_a_step_that_breaks_the_weights_is_undone_and_the_run_stops(tmp_path):
    r = _runner()
    r.run(2, progress=False)
    good = _state(r)
    real_step = r.optimizer.step

    def poisoned_step(*a, **k):
        real_step(*a, **k)
        with torch.no_grad():
            next(r.ansatz.parameters()).mul_(float("inf"))

    r.optimizer.step = poisoned_step
    ck = tmp_path / "run.h5"
    r.run(3, progress=False, checkpoint=str(ck), checkpoint_every=1)
    assert r.status.status == "stopped" and "non-finite" in r.status.reason
    assert r.iteration == 2 and all(
        torch.equal(good[k], v) for k, v in r.ansatz.state_dict().items()
    )
    with h5py.File(ck) as f:  # the end-of-run checkpoint holds the last good iteration
        assert f.attrs["iteration"] == 2
    with pytest.raises(NonFiniteLossError):
        r.step()


def test_stale_temporaries_go_and_one_writer_per_file(tmp_path):
    ck = tmp_path / "run.h5"
    stale = tmp_path / ".run.h5.abc123.tmp"
    stale.write_bytes(b"half a file")
    other = tmp_path / "unrelated.tmp"
    other.write_bytes(b"x")
    assert remove_stale_temporaries(ck) == [stale.name]
    assert other.exists()
    (tmp_path / "run.h5.lock").write_text(str(os.getppid()))  # a live process holds it
    r = _runner()
    with pytest.raises(CheckpointError, match="another run"):
        r.run(1, progress=False, checkpoint=str(ck))
    assert r.iteration == 0
    (tmp_path / "run.h5.lock").write_text("999999999")  # a dead one: taken over
    r.run(1, progress=False, checkpoint=str(ck))
    assert r.iteration == 1 and ck.exists() and not (tmp_path / "run.h5.lock").exists()
    with CheckpointLock(ck), pytest.raises(CheckpointError, match="another run"):
        CheckpointLock(ck).acquire()  # a second runner of this process


def test_an_unwritable_checkpoint_fails_before_iteration_one(tmp_path):
    r = _runner()
    with pytest.raises(OSError, match="no folder"):
        r.run(3, progress=False, checkpoint=str(tmp_path / "missing" / "x.h5"))
    assert r.iteration == 0
