"""HDF5 checkpoints of a Runner: model, optimiser state, S, RNG states and history.

Layout: attributes on the root (format, version, iteration, settings, molecule fingerprint,
run conditions); groups `model/` (one dataset per parameter or buffer), `optimizer/state`
(torch's serialised AdamW state), `space/configs`, `rng/`, `history/` (one dataset per column)
and `teacher/` (the selected-CI teacher's state: attribute ``released``, the hold's one-way end,
and its last solution, ``space`` and ``vector`` with the attribute ``energy``, so that a resumed
run reuses it as the uninterrupted one does; files without the group resume with no solution at
hand and the released flag of the history's last row).

What a reader may rely on:

- **Integrity.** Every dataset carries the sha256 of its bytes (attribute ``sha256``), checked
  on load: one flipped bit is an error, not a different energy. The invariants are checked too:
  the iteration equals the history's length, weights and optimiser moments are finite, the
  configurations belong to the molecule's sector.
- **Atomic, never worse.** A file is written to a temporary next to it and renamed over the
  target, so a crash leaves the previous file; a state with non-finite weights or moments is
  never written over a checkpoint (it goes to ``<name>.nonfinite.h5`` beside it, and
  `NonFiniteStateError` says so). Temporaries left by a killed run are removed at the next
  start.
- **Load changes nothing until everything checked out**: the file is read and validated into
  temporaries, then assigned.
- **One writer.** `CheckpointLock` makes a second run that would write the same path stop with a
  clear error (a stale lock of a dead process is taken over).
- Files of version 1 (before the checksums) still load, with their invariants checked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import warnings

import numpy as np
import torch

FORMAT = "cuscikit-nnqs-checkpoint"
VERSION = 2
_READABLE = (1, 2)
_MAY_BE_NAN = ("e_teacher", "e_pt2", "e_tot_pt2")


class CheckpointError(ValueError):
    """The checkpoint is unreadable, corrupted, or belongs to another molecule or ansatz."""


class NonFiniteStateError(CheckpointError):
    """The runner's weights or optimiser moments are not finite: nothing was written over the
    checkpoint (the state went to a file named ``*.nonfinite.h5`` beside it)."""


def molecule_fingerprint(molecule) -> str:
    """sha256 over norb, nelec, e_core and the integrals (to recognise the molecule)."""
    h = hashlib.sha256()
    h.update(np.asarray([molecule.norb, *molecule.nelec], dtype=np.int64).tobytes())
    h.update(np.float64(molecule.e_core).tobytes())
    h.update(np.ascontiguousarray(molecule.h1e, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(molecule.eri, dtype=np.float64).tobytes())
    return h.hexdigest()


# Settings added after the first files were written, with the value those files ran with.
_SETTINGS_BEFORE_THEY_WERE_SAVED = {"inner_steps": 0, "growth": "count", "inner_batch": None}


def saved_settings(path: str | os.PathLike) -> dict:
    """The Runner settings a checkpoint was written with (topk, estimator, max_space, eps, seed,
    batch_size, inner_steps, inner_batch, growth), as Runner keyword arguments: a Runner built
    with them can load it.

    Example:
        >>> import os, tempfile
        >>> from cuscikit import Ansatz, Molecule, Runner
        >>> from cuscikit.nnqs.checkpoint import saved_settings
        >>> mol = Molecule.load("LiH")
        >>> path = os.path.join(tempfile.mkdtemp(), "lih.h5")
        >>> Runner(mol, Ansatz.for_molecule(mol), topk=8, inner_steps=0).save(path)
        >>> settings = saved_settings(path)
        >>> settings["topk"], settings["inner_steps"]
        (8, 0)
        >>> runner = Runner(mol, Ansatz.for_molecule(mol), **settings).load(path)
    """
    import h5py

    path = os.fspath(path)
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not a cuscikit NNQS checkpoint")
            settings = json.loads(f.attrs["settings"])
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable or corrupted checkpoint ({exc})") from exc
    return _SETTINGS_BEFORE_THEY_WERE_SAVED | settings


def saved_conditions(path: str | os.PathLike) -> dict:
    """The run conditions a checkpoint recorded (seed, threads, learning-rate schedule, base
    rate, the teacher's settings; see `conditions`), so that a resumed run can say what
    differs."""
    import h5py

    try:
        with h5py.File(os.fspath(path), "r") as f:
            return json.loads(f.attrs.get("conditions", "{}"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable or corrupted checkpoint ({exc})") from exc


def _settings(runner) -> dict:
    return {
        "topk": runner.topk,
        "estimator": runner.estimator,
        "max_space": runner.space_cap,
        "eps": runner.eps,
        "seed": runner.seed,
        "batch_size": runner.batch_size,
        "inner_steps": runner.inner_steps,
        "inner_batch": runner.inner_batch,
        "growth": runner.growth_rule,
    }


def conditions(runner) -> dict:
    """What else shapes a run's numbers: the seed, the thread count, the base rate, the rate
    schedule (`runner.schedule`, set by whoever drives the run, e.g. the command line) and the
    teacher's settings as resolved (its weight, its end, its inner steps: "auto" gives another
    count on a CPU than on a GPU; its gap, hold and re-solving)."""
    return {
        "seed": runner.seed,
        "threads": torch.get_num_threads(),
        "lr": runner.optimizer.defaults["lr"],
        "schedule": getattr(runner, "schedule", None),
        "teacher": runner.teacher_on,
        "teacher_until": runner.teacher_until,
        "teacher_inner_steps": runner.teacher_inner_count,
        "teacher_gap": runner.teacher_gap,
        "teacher_hold": runner.teacher_hold,
        "teacher_resolve": runner.teacher_resolve,
    }


def check_writable(path: str | os.PathLike) -> None:
    """Raise OSError now, before any iteration, if a checkpoint cannot be written at `path`
    (a missing or read-only folder, a path that is a folder)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path):
        raise OSError(f"checkpoint path {path} is a folder")
    if not os.path.isdir(folder):
        raise OSError(f"cannot write the checkpoint {path}: no folder {folder}")
    try:
        fd, probe = tempfile.mkstemp(suffix=".probe", dir=folder)
    except OSError as exc:
        raise OSError(f"cannot write the checkpoint {path}: {exc.strerror or exc}") from None
    os.close(fd)
    os.remove(probe)


def _tmp_prefix(path: str) -> str:
    return f".{os.path.basename(path)}."


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove temporaries that a killed writer of `path` left beside it; returns their names."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    prefix = _tmp_prefix(path)
    gone = []
    try:
        names = os.listdir(folder)
    except OSError:
        return gone
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            try:
                os.remove(os.path.join(folder, name))
                gone.append(name)
            except OSError:
                pass
    return gone


class CheckpointLock:
    """An exclusive claim on a checkpoint path for the life of a run (``<path>.lock`` holding
    the writer's pid); a lock whose process is gone is taken over.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
        >>> with CheckpointLock(path):
        ...     CheckpointLock(path).acquire()
        Traceback (most recent call last):
            ...
        cuscikit.nnqs.checkpoint.CheckpointError: ... another run (pid ...) writes ...
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path) + ".lock"
        self.held = False

    def acquire(self) -> CheckpointLock:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = self._owner()
                if pid is not None and _alive(pid):  # this process too: another runner
                    raise CheckpointError(
                        f"{self.path[:-5]}: another run (pid {pid}) writes this checkpoint; "
                        f"wait for it, or remove {self.path} if that process is gone"
                    ) from None
                try:  # stale (its process died): take it over
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            self.held = True
            return self
        raise CheckpointError(f"{self.path}: could not take the checkpoint lock")

    def _owner(self) -> int | None:
        try:
            with open(self.path) as f:
                return int(f.read().strip() or -1)
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.held:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
            self.held = False

    def __enter__(self) -> CheckpointLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _digest(data) -> str:
    arr = np.asarray(data)
    return hashlib.sha256(arr.tobytes() if arr.dtype != object else bytes(arr)).hexdigest()


def _finite_state(runner) -> bool:
    """Weights, buffers and optimiser moments are all finite."""
    for t in runner.ansatz.state_dict().values():
        if t.is_floating_point() or t.is_complex():
            if not bool(torch.isfinite(t).all()):
                return False
    for state in runner.optimizer.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
                if not bool(torch.isfinite(v).all()):
                    return False
    return True


def _write(runner, target: str) -> None:
    """Write the runner's state to `target` (a fresh file), every dataset with its checksum."""
    import h5py

    with h5py.File(target, "w") as f:

        def put(name: str, data) -> None:
            ds = f.create_dataset(name, data=data)
            ds.attrs["sha256"] = _digest(ds[()])

        f.attrs["format"] = FORMAT
        f.attrs["version"] = VERSION
        f.attrs["iteration"] = runner.iteration
        f.attrs["settings"] = json.dumps(_settings(runner))
        f.attrs["conditions"] = json.dumps(conditions(runner), default=str)
        f.attrs["molecule"] = molecule_fingerprint(runner.molecule)
        f.attrs["ansatz_class"] = type(runner.ansatz).__name__
        cfg = getattr(runner.ansatz, "config", None)
        if cfg is not None:
            f.attrs["ansatz_config"] = json.dumps(cfg, default=str)
        f.create_group("model")
        for name, tensor in runner.ansatz.state_dict().items():
            put(f"model/{name}", tensor.detach().cpu().numpy())
        buf = io.BytesIO()
        torch.save(runner.optimizer.state_dict(), buf)
        put("optimizer/state", np.void(buf.getvalue()))
        put("space/configs", runner.space.configs)
        put("rng/torch_cpu", torch.get_rng_state().numpy())
        if torch.cuda.is_available():
            put("rng/torch_cuda", torch.cuda.get_rng_state().numpy())
        f["rng"].attrs["numpy"] = json.dumps(runner.rng.bit_generator.state)
        h = f.create_group("history")
        history = runner.history
        for col in history.columns:
            put(f"history/{col}", history[col].to_numpy())
        h.attrs["columns"] = json.dumps(list(history.columns))
        t = f.create_group("teacher")
        t.attrs["released"] = bool(getattr(runner, "_teacher_released", False))
        last = getattr(runner, "_teacher_last", None)
        if last is not None:
            put("teacher/space", np.asarray(last[0]))
            put("teacher/vector", np.asarray(last[2], dtype=np.float64))
            t.attrs["energy"] = float(last[1])


def save_checkpoint(runner, path: str | os.PathLike) -> None:
    """Write the runner's state atomically (a temporary beside `path`, renamed over it).

    Raises:
        NonFiniteStateError: the weights or optimiser moments are not finite; `path` is left
            as it was and the state is written to ``<path stem>.nonfinite.h5`` for inspection.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not _finite_state(runner):
        stem = path[:-3] if path.endswith(".h5") else path
        aside = stem + ".nonfinite.h5"
        _atomic(runner, aside, folder)
        raise NonFiniteStateError(
            f"{path}: the runner's weights or optimiser moments are not finite; the checkpoint "
            f"keeps its last good state, the bad one was written to {aside}"
        )
    _atomic(runner, path, folder)


def _atomic(runner, path: str, folder: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(path), suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        _write(runner, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _read_verified(f, name: str, version: int):
    ds = f[name]
    data = ds[()]
    if version >= 2:
        want = ds.attrs.get("sha256")
        if want is None or _digest(data) != want:
            raise CheckpointError(f"dataset {name} fails its checksum (the file is damaged)")
    return data


def load_checkpoint(runner, path: str | os.PathLike) -> None:
    """Restore a checkpoint into `runner`, after checking that it fits and is intact: same
    molecule, same ansatz parameters, every checksum and invariant. Nothing is changed if any
    check fails."""
    import h5py

    from cuscikit.sci.configs import check_configurations
    from cuscikit.sci.space import SCISpace

    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not a cuscikit NNQS checkpoint")
            version = int(f.attrs["version"])
            if version not in _READABLE:
                raise CheckpointError(f"{path}: checkpoint version {version}")
            if f.attrs["molecule"] != molecule_fingerprint(runner.molecule):
                raise CheckpointError(
                    f"{path}: the checkpoint belongs to another molecule (the integrals differ)"
                )

            def read(name):
                return _read_verified(f, name, version)

            state = {k: torch.from_numpy(np.array(read(f"model/{k}"))) for k in f["model"]}
            opt_bytes = read("optimizer/state").tobytes()
            configs = np.array(read("space/configs"))
            rng_cpu = torch.from_numpy(np.array(read("rng/torch_cpu")))
            rng_cuda = (
                torch.from_numpy(np.array(read("rng/torch_cuda")))
                if "rng/torch_cuda" in f
                else None
            )
            np_state = json.loads(f["rng"].attrs["numpy"])
            cols = json.loads(f["history"].attrs["columns"])
            history = {c: np.array(read(f"history/{c}")) for c in cols}
            iteration = int(f.attrs["iteration"])
            settings = json.loads(f.attrs["settings"])
            saved_cond = json.loads(f.attrs.get("conditions", "{}"))
            teacher = None
            if "teacher" in f:
                g = f["teacher"]
                teacher = {"released": bool(g.attrs["released"])}
                if "space" in g:
                    teacher["space"] = np.array(read("teacher/space"))
                    teacher["vector"] = np.array(read("teacher/vector"))
                    teacher["energy"] = float(g.attrs["energy"])
    except CheckpointError as exc:
        if str(exc).startswith(path):
            raise
        raise CheckpointError(f"{path}: {exc}") from None
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable or corrupted checkpoint ({exc})") from exc

    # --- invariants, all before anything is assigned
    n_rows = len(next(iter(history.values()))) if history else 0
    if any(len(v) != n_rows for v in history.values()):
        raise CheckpointError(f"{path}: history columns differ in length")
    if iteration < 0 or iteration != n_rows:
        raise CheckpointError(
            f"{path}: iteration {iteration} does not match the {n_rows} rows of its history"
        )
    if (
        "iteration" in history
        and n_rows
        and not np.array_equal(history["iteration"], np.arange(1, n_rows + 1))
    ):
        raise CheckpointError(f"{path}: the history's iteration column is not 1..{n_rows}")
    for k, v in history.items():
        if v.dtype.kind != "f" or not k.startswith(("e_", "loss")):
            continue
        # NaN marks a value not computed in these (the teacher's energy while no solution of
        # that S is at hand, the PT2 terms with pt2=False); infinities are never written
        bad = np.isinf(v) if k in _MAY_BE_NAN else ~np.isfinite(v)
        if bad.any():
            raise CheckpointError(f"{path}: history column {k} holds non-finite values")
    own = runner.ansatz.state_dict()
    if own.keys() != state.keys() or any(own[k].shape != state[k].shape for k in own):
        raise CheckpointError(f"{path}: the checkpoint's ansatz has other parameters or shapes")
    for k, t in state.items():
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{path}: parameter {k} is not finite")
    settings = _SETTINGS_BEFORE_THEY_WERE_SAVED | settings
    for key in ("growth", "estimator", "topk", "max_space", "eps", "inner_steps", "inner_batch"):
        if settings[key] != _settings(runner)[key]:
            raise CheckpointError(
                f"{path}: saved with {key}={settings[key]!r}, this runner has "
                f"{_settings(runner)[key]!r}"
            )
    try:
        # map_location: a checkpoint written on a GPU resumes on a CPU-only machine too (the
        # optimiser moves its state to the parameters' device when it loads it)
        opt_state = torch.load(io.BytesIO(opt_bytes), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure here means a damaged file
        raise CheckpointError(f"{path}: the optimiser state is corrupted ({exc})") from exc
    for st in opt_state.get("state", {}).values():
        for v in st.values():
            if (
                isinstance(v, torch.Tensor)
                and v.is_floating_point()
                and not bool(torch.isfinite(v).all())
            ):
                raise CheckpointError(f"{path}: the optimiser moments are not finite")
    try:
        configs = check_configurations(configs, runner.molecule.norb, runner.molecule.nelec)
        space = SCISpace(runner.molecule, configs, eps=runner.eps)
    except ValueError as exc:
        raise CheckpointError(
            f"{path}: its configurations do not fit the molecule ({exc})"
        ) from None
    if len(space) != len(configs):
        raise CheckpointError(f"{path}: its space holds duplicate configurations")
    teacher_last = None
    if teacher is None:  # an older file: the flag of the history's last row, no solution
        col = history.get("teacher_released")
        released = bool(col[-1]) if col is not None and len(col) else False
    else:
        released = teacher["released"]
        if "space" in teacher:
            try:
                t_space = check_configurations(
                    teacher["space"], runner.molecule.norb, runner.molecule.nelec
                )
            except ValueError as exc:
                raise CheckpointError(
                    f"{path}: the teacher's space does not fit the molecule ({exc})"
                ) from None
            vec, e_t = teacher["vector"], teacher["energy"]
            if vec.shape != (len(t_space),) or not (np.isfinite(vec).all() and np.isfinite(e_t)):
                raise CheckpointError(f"{path}: the teacher's solution is damaged")
            teacher_last = (t_space, e_t, vec)

    # --- everything checked: assign (the model and optimiser through copies first)
    model_backup = {k: v.detach().clone() for k, v in runner.ansatz.state_dict().items()}
    try:
        runner.ansatz.load_state_dict(state)
        runner.optimizer.load_state_dict(opt_state)
    except Exception as exc:  # noqa: BLE001 - restore, then report
        runner.ansatz.load_state_dict(model_backup)
        raise CheckpointError(f"{path}: the state does not load into this runner ({exc})") from exc
    runner.space = space
    torch.set_rng_state(rng_cpu)
    if rng_cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng_cuda)
    runner.rng.bit_generator.state = np_state
    runner._rows = [{c: history[c][k].item() for c in cols} for k in range(n_rows)]
    runner.iteration = iteration
    runner._teacher_last = teacher_last
    runner._teacher_released = released
    if version < 2:
        warnings.warn(
            f"{path}: a checkpoint of version 1 (no checksums); invariants checked", stacklevel=3
        )
    now = conditions(runner)
    differ = {
        k: (saved_cond[k], now[k])
        for k in saved_cond
        if k in now and saved_cond[k] != now[k] and k != "lr"
    }
    if differ:
        what = ", ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in differ.items())
        warnings.warn(
            f"{path}: resumed under other run conditions ({what}); the continued "
            "run may differ from an uninterrupted one",
            stacklevel=3,
        )
