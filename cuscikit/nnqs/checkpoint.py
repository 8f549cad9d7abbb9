"""HDF5 checkpoints of a Runner: model, optimiser state, S, RNG states and history.

Layout: attributes on the root (format, version, iteration, settings, molecule fingerprint);
groups `model/` (one dataset per parameter or buffer), `optimizer/state` (torch's serialised
AdamW state), `space/configs`, `rng/`, `history/` (one dataset per column).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile

import numpy as np
import torch

FORMAT = "cuscikit-nnqs-checkpoint"
VERSION = 1


class CheckpointError(ValueError):
    """The checkpoint is unreadable, corrupted, or belongs to another molecule or ansatz."""


def molecule_fingerprint(molecule) -> str:
    """sha256 over norb, nelec, e_core and the integrals (to recognise the molecule)."""
    h = hashlib.sha256()
    h.update(np.asarray([molecule.norb, *molecule.nelec], dtype=np.int64).tobytes())
    h.update(np.float64(molecule.e_core).tobytes())
    h.update(np.ascontiguousarray(molecule.h1e, dtype=np.float64).tobytes())
    h.update(np.ascontiguousarray(molecule.eri, dtype=np.float64).tobytes())
    return h.hexdigest()


# Settings added after the first files were written, with the value those files ran with.
_SETTINGS_BEFORE_THEY_WERE_SAVED = {"inner_steps": 0}


def saved_settings(path: str | os.PathLike) -> dict:
    """The Runner settings a checkpoint was written with (topk, estimator, max_space, eps, seed,
    batch_size, inner_steps), as Runner keyword arguments: a Runner built with them can load it.

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


def _settings(runner) -> dict:
    return {
        "topk": runner.topk,
        "estimator": runner.estimator,
        "max_space": runner.max_space,
        "eps": runner.eps,
        "seed": runner.seed,
        "batch_size": runner.batch_size,
        "inner_steps": runner.inner_steps,
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


def save_checkpoint(runner, path: str | os.PathLike) -> None:
    """Write the runner's state atomically (a temporary file renamed over `path`)."""
    import h5py

    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(suffix=".h5.tmp", dir=d)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["version"] = VERSION
            f.attrs["iteration"] = runner.iteration
            f.attrs["settings"] = json.dumps(_settings(runner))
            f.attrs["molecule"] = molecule_fingerprint(runner.molecule)
            f.attrs["ansatz_class"] = type(runner.ansatz).__name__
            cfg = getattr(runner.ansatz, "config", None)
            if cfg is not None:
                f.attrs["ansatz_config"] = json.dumps(cfg, default=str)
            g = f.create_group("model")
            for name, tensor in runner.ansatz.state_dict().items():
                g.create_dataset(name, data=tensor.detach().cpu().numpy())
            buf = io.BytesIO()
            torch.save(runner.optimizer.state_dict(), buf)
            f.create_dataset("optimizer/state", data=np.void(buf.getvalue()))
            f.create_dataset("space/configs", data=runner.space.configs)
            f.create_dataset("rng/torch_cpu", data=torch.get_rng_state().numpy())
            if torch.cuda.is_available():
                f.create_dataset("rng/torch_cuda", data=torch.cuda.get_rng_state().numpy())
            f["rng"].attrs["numpy"] = json.dumps(runner.rng.bit_generator.state)
            h = f.create_group("history")
            for col in runner.history.columns:
                h.create_dataset(col, data=runner.history[col].to_numpy())
            h.attrs["columns"] = json.dumps(list(runner.history.columns))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(runner, path: str | os.PathLike) -> None:
    """Restore a checkpoint into `runner`, after checking that it fits: same molecule, same
    ansatz parameters. Nothing is changed if any check fails."""
    import h5py

    from cuscikit.sci.space import SCISpace

    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not a cuscikit NNQS checkpoint")
            if int(f.attrs["version"]) != VERSION:
                raise CheckpointError(f"{path}: checkpoint version {f.attrs['version']}")
            if f.attrs["molecule"] != molecule_fingerprint(runner.molecule):
                raise CheckpointError(
                    f"{path}: the checkpoint belongs to another molecule (the integrals differ)"
                )
            state = {k: torch.from_numpy(np.array(v)) for k, v in f["model"].items()}
            opt_bytes = f["optimizer/state"][()].tobytes()
            configs = np.array(f["space/configs"])
            rng_cpu = torch.from_numpy(np.array(f["rng/torch_cpu"]))
            rng_cuda = (
                torch.from_numpy(np.array(f["rng/torch_cuda"])) if "rng/torch_cuda" in f else None
            )
            np_state = json.loads(f["rng"].attrs["numpy"])
            cols = json.loads(f["history"].attrs["columns"])
            history = {c: np.array(f["history"][c]) for c in cols}
            iteration = int(f.attrs["iteration"])
            settings = json.loads(f.attrs["settings"])
    except CheckpointError:
        raise
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path}: unreadable or corrupted checkpoint ({exc})") from exc

    own = runner.ansatz.state_dict()
    if own.keys() != state.keys() or any(own[k].shape != state[k].shape for k in own):
        raise CheckpointError(f"{path}: the checkpoint's ansatz has other parameters or shapes")
    settings = _SETTINGS_BEFORE_THEY_WERE_SAVED | settings
    for key in ("estimator", "topk", "max_space", "eps", "inner_steps"):
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

    runner.ansatz.load_state_dict(state)
    runner.optimizer.load_state_dict(opt_state)
    runner.space = SCISpace(runner.molecule, configs, eps=runner.eps)
    torch.set_rng_state(rng_cpu)
    if rng_cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng_cuda)
    runner.rng.bit_generator.state = np_state
    n_rows = len(next(iter(history.values()))) if history else 0
    runner._rows = [{c: history[c][k].item() for c in cols} for k in range(n_rows)]
    runner.iteration = iteration
