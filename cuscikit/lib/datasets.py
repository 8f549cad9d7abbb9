"""The bundled datasets: one index of named files with a kind, a checksum and provenance.

``datasets/index.json`` lists every dataset: its canonical name, its ``kind`` ("molecule": a
gzipped FCIDUMP with JSON metadata; "ising": a gzipped graph or coupling file with JSON
metadata), the file slug, and the sha256 of each file. Every system reads its kind through
`entries`, `find` and `data_path`; a file whose checksum differs from the index is refused.

The folder is found, in order, from the ``CUSCIKIT_DATASETS`` environment variable, the
``datasets`` folder inside the package (wheels), or the ``datasets`` folder of the source tree.

Example:
    >>> "molecule" in kinds()
    True
    >>> find("lih").name
    'LiH'
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "Dataset",
    "UnknownDatasetError",
    "data_path",
    "datasets_dir",
    "entries",
    "find",
    "kinds",
    "sha256_of",
]

INDEX = "index.json"


class UnknownDatasetError(KeyError):
    """No bundled dataset of that name; the message lists the available ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class Dataset:
    """One entry of the index.

    Attributes:
        name: canonical name (e.g. "N2/cc-pVDZ").
        kind: "molecule", "ising", ...
        slug: file stem (e.g. "n2_ccpvdz").
        files: role -> file name ("data", "meta").
        sha256: file name -> hex digest.
        description: one line.
    """

    name: str
    kind: str
    slug: str
    files: dict
    sha256: dict
    description: str = ""


def datasets_dir() -> Path:
    """The folder that holds the bundled datasets.

    Example:
        >>> datasets_dir().name
        'datasets'
    """
    env = os.environ.get("CUSCIKIT_DATASETS")
    if env:
        return Path(env)
    pkg = Path(__file__).resolve().parent.parent  # .../cuscikit
    inside = pkg / "datasets"
    if inside.is_dir():
        return inside
    return pkg.parent / "datasets"


@lru_cache(maxsize=4)
def _load_index(folder: str) -> tuple[Dataset, ...]:
    path = Path(folder) / INDEX
    if not path.is_file():
        raise FileNotFoundError(f"the dataset index {path} is missing")
    raw = json.loads(path.read_text())
    return tuple(
        Dataset(**{k: e[k] for k in Dataset.__dataclass_fields__ if k in e})
        for e in raw["datasets"]
    )


def entries(kind: str | None = None) -> list[Dataset]:
    """The datasets of one kind (all kinds with None), in index order."""
    all_ = _load_index(str(datasets_dir()))
    return [d for d in all_ if kind is None or d.kind == kind]


def kinds() -> list[str]:
    """The kinds present in the index."""
    return sorted({d.kind for d in entries()})


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find(name: str, kind: str | None = None) -> Dataset:
    """Resolve a name tolerantly (case, separators; a bare formula gives its first entry,
    e.g. the STO-3G molecule) to its entry.

    Raises:
        UnknownDatasetError: no entry matches; the message lists the available names.
    """
    table: dict[str, Dataset] = {}
    candidates = entries(kind)
    for d in candidates:
        table[_norm(d.name)] = d
        table[_norm(d.slug)] = d
    for d in candidates:  # the bare formula -> the first entry of that formula
        table.setdefault(_norm(d.name.split("/")[0]), d)
    key = _norm(str(name))
    if key in table:
        return table[key]
    names = ", ".join(d.name for d in candidates)
    what = f"{kind} dataset" if kind else "dataset"
    raise UnknownDatasetError(f"unknown {what} {name!r}; available: {names}")


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def data_path(name: str, role: str = "data", kind: str | None = None, verify: bool = True) -> Path:
    """Path of a dataset's file (role "data" or "meta"), its checksum verified against the
    index.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: its checksum differs from the index (a damaged or edited file).
    """
    d = find(name, kind)
    fname = d.files[role]
    path = datasets_dir() / fname
    if not path.is_file():
        raise FileNotFoundError(f"dataset {d.name!r}: file {path} is missing")
    if verify:
        want = d.sha256.get(fname)
        got = sha256_of(path)
        if want != got:
            raise ValueError(
                f"dataset {d.name!r}: {path} has sha256 {got[:16]}..., the index records "
                f"{str(want)[:16]}...: the file is damaged or was changed"
            )
    return path


def record(name: str, kind: str, slug: str, files: dict, description: str = "") -> Dataset:
    """Add or update an entry of the index, with the sha256 of its files as they are now (for
    the scripts that generate datasets).

    Args:
        name, kind, slug, files, description: as in `Dataset`; `files` name files of the
            datasets folder.
    """
    folder = datasets_dir()
    path = folder / INDEX
    raw = (
        json.loads(path.read_text())
        if path.is_file()
        else {"format": "cuscikit-datasets", "version": 1, "datasets": []}
    )
    entry = {
        "name": name,
        "kind": kind,
        "slug": slug,
        "files": dict(files),
        "sha256": {f: sha256_of(folder / f) for f in files.values()},
        "description": description,
    }
    rows = [e for e in raw["datasets"] if e["name"] != name]
    at = next((i for i, e in enumerate(raw["datasets"]) if e["name"] == name), len(rows))
    rows.insert(at, entry)
    raw["datasets"] = rows
    path.write_text(json.dumps(raw, indent=1) + "\n")
    _load_index.cache_clear()
    return Dataset(**entry)
