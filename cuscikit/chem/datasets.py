"""Bundled molecular integrals (gzipped FCIDUMP + JSON metadata with reference energies).

The folder is found, in order, from the ``CUSCIKIT_DATASETS`` environment variable, the
``datasets`` folder inside the package, or the ``datasets`` folder of the source tree (next to
the package directory). Each dataset is ``<slug>.fcidump.gz`` plus ``<slug>.json``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

__all__ = [
    "DATASETS",
    "UnknownDatasetError",
    "datasets_dir",
    "list_datasets",
    "dataset_slug",
    "dataset_metadata",
    "dataset_fcidump_path",
]

#: canonical name -> file slug
DATASETS: dict[str, str] = {
    "LiH": "lih_sto3g",
    "H2O": "h2o_sto3g",
    "N2": "n2_sto3g",
    "C2": "c2_sto3g",
    "LiF": "lif_sto3g",
    "LiCl": "licl_sto3g",
    "Li2O": "li2o_sto3g",
    "C2H4O": "c2h4o_sto3g",
    "H2O/cc-pVDZ": "h2o_ccpvdz",
    "N2/cc-pVDZ": "n2_ccpvdz",
    "C2/cc-pVDZ": "c2_ccpvdz",
    "Cr2/SV": "cr2_sv",
    "N2-stretched": "n2_stretched_sto3g",
    "H8-chain": "h8_chain_sto3g",
    "O2-triplet": "o2_triplet_sto3g",
}


class UnknownDatasetError(KeyError):
    """No bundled dataset of that name; the message lists the available ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def datasets_dir() -> Path:
    """Return the folder that holds the bundled datasets.

    Returns:
        ``$CUSCIKIT_DATASETS`` if set, else ``<package>/datasets`` if it exists, else the
        ``datasets`` folder next to the package directory (the source-tree layout).

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


def list_datasets() -> list[str]:
    """Names of the bundled datasets (STO-3G systems first).

    Returns:
        Canonical names such as ``"N2"`` (STO-3G) and ``"N2/cc-pVDZ"``.

    Example:
        >>> "LiH" in list_datasets()
        True
    """
    return list(DATASETS)


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def dataset_slug(name: str) -> str:
    """Resolve a dataset name tolerantly (case, separators, default basis) to its file slug.

    ``"n2"``, ``"N2"`` and ``"n2_sto3g"`` give the STO-3G N2; ``"N2/cc-pvdz"`` and
    ``"n2_ccpvdz"`` the cc-pVDZ one; ``"Cr2"`` the only Cr2 (SV basis).

    Args:
        name: dataset name.

    Returns:
        The slug, e.g. ``"n2_ccpvdz"``.

    Raises:
        UnknownDatasetError: no dataset matches; the message lists the available names.

    Example:
        >>> dataset_slug("N2/cc-pvdz")
        'n2_ccpvdz'
    """
    key = _norm(str(name))
    table: dict[str, str] = {}
    for canon, slug in DATASETS.items():
        table[_norm(canon)] = slug
        table[_norm(slug)] = slug
    for canon, slug in DATASETS.items():  # the bare formula -> the STO-3G set, or the only one
        formula = _norm(canon.split("/")[0])
        table.setdefault(formula, slug)
    if key in table:
        return table[key]
    raise UnknownDatasetError(f"unknown dataset {name!r}; available: {', '.join(list_datasets())}")


def dataset_metadata(name: str) -> dict:
    """The JSON metadata of a bundled dataset (geometry, basis, reference energy, provenance).

    Args:
        name: dataset name (see :func:`dataset_slug` for the accepted spellings).

    Returns:
        The parsed JSON as a dict.

    Example:
        >>> dataset_metadata("LiH")["reference"]["energy"]  # doctest: +SKIP
        -7.784460280031...
    """
    slug = dataset_slug(name)
    path = datasets_dir() / f"{slug}.json"
    if not path.is_file():
        raise FileNotFoundError(f"dataset {name!r}: metadata file {path} is missing")
    return json.loads(path.read_text())


def dataset_fcidump_path(name: str) -> Path:
    """Path of a bundled dataset's gzipped FCIDUMP.

    Args:
        name: dataset name.

    Returns:
        ``<datasets dir>/<slug>.fcidump.gz``.

    Example:
        >>> dataset_fcidump_path("n2").name
        'n2_sto3g.fcidump.gz'
    """
    slug = dataset_slug(name)
    path = datasets_dir() / f"{slug}.fcidump.gz"
    if not path.is_file():
        raise FileNotFoundError(f"dataset {name!r}: integral file {path} is missing")
    return path
