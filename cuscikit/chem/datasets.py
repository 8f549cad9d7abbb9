"""Bundled molecular integrals (gzipped FCIDUMP + JSON metadata with reference energies): the
"molecule" kind of the dataset index (`cuscikit.lib.datasets`), which also verifies each file's
checksum."""

from __future__ import annotations

import json
from pathlib import Path

from cuscikit.lib.datasets import UnknownDatasetError, data_path, datasets_dir, entries, find

__all__ = [
    "UnknownDatasetError",
    "datasets_dir",
    "list_datasets",
    "dataset_slug",
    "dataset_metadata",
    "dataset_fcidump_path",
]

KIND = "molecule"


def list_datasets() -> list[str]:
    """Names of the bundled molecules (STO-3G systems first).

    Example:
        >>> "LiH" in list_datasets()
        True
    """
    return [d.name for d in entries(KIND)]


def dataset_slug(name: str) -> str:
    """Resolve a dataset name tolerantly (case, separators, default basis) to its file slug.

    ``"n2"``, ``"N2"`` and ``"n2_sto3g"`` give the STO-3G N2; ``"N2/cc-pvdz"`` and
    ``"n2_ccpvdz"`` the cc-pVDZ one; ``"Cr2"`` the only Cr2 (SV basis).

    Raises:
        UnknownDatasetError: no dataset matches; the message lists the available names.

    Example:
        >>> dataset_slug("N2/cc-pvdz")
        'n2_ccpvdz'
    """
    return find(name, KIND).slug


def dataset_metadata(name: str) -> dict:
    """The JSON metadata of a bundled molecule (geometry, basis, reference energy, provenance).

    Example:
        >>> round(dataset_metadata("LiH")["reference"]["energy"], 8)
        -7.78446028
    """
    return json.loads(data_path(name, "meta", KIND).read_text())


def dataset_fcidump_path(name: str) -> Path:
    """Path of a bundled molecule's gzipped FCIDUMP (its checksum verified).

    Example:
        >>> dataset_fcidump_path("n2").name
        'n2_sto3g.fcidump.gz'
    """
    return data_path(name, "data", KIND)
