"""Chemistry front end: Molecule (PySCF, lazily), FCIDUMP read/write, bundled datasets."""

from cuscikit.chem.datasets import (
    UnknownDatasetError,
    dataset_fcidump_path,
    dataset_metadata,
    list_datasets,
)
from cuscikit.chem.fcidump import (
    FCIDump,
    FCIDumpError,
    FCIDumpWarning,
    read_fcidump,
    restore_eri,
    write_fcidump,
)
from cuscikit.chem.geometry import parse_geometry
from cuscikit.chem.molecule import Molecule, SymmetryWarning, check_state_symmetry

__all__ = [
    "Molecule",
    "read_fcidump",
    "write_fcidump",
    "FCIDump",
    "FCIDumpError",
    "FCIDumpWarning",
    "SymmetryWarning",
    "check_state_symmetry",
    "parse_geometry",
    "restore_eri",
    "list_datasets",
    "dataset_metadata",
    "dataset_fcidump_path",
    "UnknownDatasetError",
]
