"""Molecular geometries read as plain numbers, before PySCF sees them.

PySCF evaluates coordinate fields it cannot read as numbers (``eval`` in ``gto.format_atom`` and
``gto.from_zmatrix``), so a geometry string can run code. Here every geometry is parsed into
``(label, (x, y, z))`` tuples of Python floats first; PySCF only ever receives that list. The
accepted formats are those PySCF users write:

* ``"H 0 0 0; H 0 0 0.74"``: atoms separated by ``;`` or newlines, fields by blanks or commas,
  blank lines and lines starting with ``#`` skipped;
* a Z-matrix (the first atom alone on its line), with numbers only (no variables), converted to
  Cartesian coordinates exactly as ``pyscf.gto.from_zmatrix`` does;
* a list of ``(symbol, (x, y, z))``, ``(symbol, x, y, z)`` or ``"symbol x y z"`` entries;
* the name of an ``.xyz`` file (count line, comment line, atoms) or of a plain atom-list file.

A label is an element symbol or an atomic number, optionally decorated as PySCF allows (``H1``,
``H@2``, ``X-H`` or ``ghost-H`` for a ghost atom). A coordinate is a plain decimal literal
(``-1.5``, ``2e-3``), finite and at most ``MAX_COORDINATE`` in magnitude. Nothing here imports
PySCF; see ``docs/fcidump.md`` for the reasons behind each limit.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np

__all__ = [
    "BOHR_IN_ANGSTROM",
    "MAX_COORDINATE",
    "MIN_DISTANCE_BOHR",
    "check_geometry",
    "nuclear_charge",
    "normalize_unit",
    "parse_geometry",
]

ELEMENTS = (
    "X H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As "
    "Se Br Kr Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd "
    "Tb Dy Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am "
    "Cm Bk Cf Es Fm Md No Lr Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og"
).split()
"""Element symbols indexed by nuclear charge (``X``, index 0, is PySCF's dummy atom)."""

_Z = {s.upper(): z for z, s in enumerate(ELEMENTS)}

BOHR_IN_ANGSTROM = 0.52917721092
"""The Bohr radius in Angstrom, the value PySCF converts with."""

MAX_COORDINATE = 1e6
"""The largest coordinate magnitude accepted (in the input unit): a molecule spans nanometres,
and beyond this the nuclear repulsion and the integral screening lose all precision."""

MIN_DISTANCE_BOHR = 0.1
"""Two atoms closer than this (0.053 Angstrom) are refused as "at one point": no chemical bond
is shorter than ~1.4 Bohr (H2), and such a geometry is a typo (a lost digit or sign) whose
nuclear repulsion and near-duplicate basis functions would give a meaningless SCF."""

_UNITS = {
    "angstrom": "Angstrom",
    "angstroms": "Angstrom",
    "ang": "Angstrom",
    "a": "Angstrom",
    "\u00e5": "Angstrom",
    "bohr": "Bohr",
    "bohrs": "Bohr",
    "b": "Bohr",
    "au": "Bohr",
    "a.u.": "Bohr",
}

_FLOAT_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9@^_:\-]{0,31}")
_MAX_FILE_BYTES = 1 << 20
_Atom = tuple[str, tuple[float, float, float]]


def normalize_unit(unit: Any) -> str:
    """``"Angstrom"`` or ``"Bohr"`` for the spellings PySCF users write; ValueError otherwise.

    PySCF itself takes any string not starting with B or AU as Angstrom (``"furlong"`` too) and
    a number as the size of a Bohr in Angstrom; both are refused here.

    Example:
        >>> normalize_unit("ang"), normalize_unit("AU")
        ('Angstrom', 'Bohr')
    """
    key = unit.strip().lower() if isinstance(unit, str) else None
    if key not in _UNITS:
        raise ValueError(f"unit must be 'Angstrom' or 'Bohr' (or Ang, A, AU, B), not {unit!r}")
    return _UNITS[key]


def _label(tok: Any, where: str) -> str:
    """A validated atom label; atomic numbers become element symbols."""
    if isinstance(tok, (int, np.integer)) and not isinstance(tok, bool):
        tok = str(int(tok))
    if not isinstance(tok, str):
        raise ValueError(f"{where}: the atom label must be a symbol or atomic number, not {tok!r}")
    tok = tok.strip()
    if tok.isdigit() and len(tok) <= 3:
        z = int(tok)
        if not 1 <= z < len(ELEMENTS):
            raise ValueError(f"{where}: no element has atomic number {z}")
        return ELEMENTS[z]
    if not _LABEL_RE.fullmatch(tok):
        raise ValueError(f"{where}: {tok[:40]!r} is not an atom label (e.g. H, Li, H1, X-H)")
    nuclear_charge(tok, where)
    return tok


def nuclear_charge(label: str, where: str = "atom") -> int:
    """Nuclear charge of an atom label (0 for ghost and dummy atoms), by PySCF's reading of
    labels: the letters name the element, ``X`` or ``GHOST`` in front makes a ghost.

    Example:
        >>> nuclear_charge("Li"), nuclear_charge("H@2"), nuclear_charge("X-H")
        (3, 1, 0)
    """
    letters = "".join(c for c in label.upper() if c.isalpha())
    if letters in _Z:
        return _Z[letters]
    if letters[:1] == "X" and letters[:2] != "XE" and letters[1:] in _Z:
        return 0
    if letters.startswith("GHOST") and letters[5:] in _Z:
        return 0
    raise ValueError(f"{where}: unknown element in atom label {label[:40]!r}")


def _number(tok: Any, where: str) -> float:
    """A coordinate: a plain decimal literal or a real number, finite and bounded."""
    if isinstance(tok, str):
        t = tok.strip()
        if len(t) > 64 or not _FLOAT_RE.fullmatch(t):
            raise ValueError(f"{where}: coordinate {t[:40]!r} is not a plain number")
        val = float(t)
    elif isinstance(tok, (int, float, np.integer, np.floating)) and not isinstance(
        tok, (bool, np.bool_)
    ):
        val = float(tok)
    else:
        raise ValueError(f"{where}: coordinate {tok!r} is not a number")
    if not math.isfinite(val):
        raise ValueError(f"{where}: coordinate {tok!r} is not finite")
    if abs(val) > MAX_COORDINATE:
        raise ValueError(f"{where}: coordinate {val:g} exceeds {MAX_COORDINATE:g} in magnitude")
    return val


def _cartesian(fields: list[str], where: str) -> _Atom:
    if len(fields) != 4:
        raise ValueError(f"{where}: expected 'symbol x y z', got {len(fields)} fields")
    label = _label(fields[0], where)
    x, y, z = (_number(f, where) for f in fields[1:])
    return label, (x, y, z)


def _rotation(vec: np.ndarray, theta: float) -> np.ndarray:
    """Rotation by ``theta`` about ``vec`` (as ``pyscf.symm.rotation_mat``)."""
    v = vec / np.linalg.norm(vec)
    ux = np.array(((0.0, -v[2], v[1]), (v[2], 0.0, -v[0]), (-v[1], v[0], 0.0)))
    c, s = np.cos(theta), np.sin(theta)
    return c * np.eye(3) + s * ux + (1 - c) * np.outer(v, v)


def _zmatrix(records: list[tuple[str, list[str]]]) -> list[_Atom]:
    """Cartesian coordinates from a numeric Z-matrix, by the construction of
    ``pyscf.gto.from_zmatrix`` (first atom at the origin, second on x, third in the xz plane)."""
    labels: list[str] = []
    coord: list[np.ndarray] = []
    for k, (where, f) in enumerate(records):
        need = min(1 + 2 * k, 7)
        if len(f) != need:
            raise ValueError(
                f"{where}: Z-matrix line {k + 1} needs {need} field{'s' * (need > 1)} "
                "(symbol, then atom/bond, atom/angle, atom/dihedral pairs), "
                f"got {len(f)}"
            )
        labels.append(_label(f[0], where))

        def ref(tok: str, where: str = where, k: int = k) -> int:
            if not tok.isdigit() or not 1 <= int(tok) <= k:
                raise ValueError(f"{where}: Z-matrix reference {tok[:20]!r} is not an earlier atom")
            return int(tok) - 1

        if k == 0:
            coord.append(np.zeros(3))
            continue
        bonda, bond = ref(f[1]), _number(f[2], where)
        if bond <= 0:
            raise ValueError(f"{where}: bond length {bond:g} must be positive")
        if k == 1:
            coord.append(np.array((bond, 0.0, 0.0)))
            continue
        anga, ang_deg = ref(f[3]), _number(f[4], where)
        if anga == bonda:
            raise ValueError(f"{where}: the angle needs a second, different atom")
        if not 0 <= ang_deg <= 180:
            raise ValueError(f"{where}: angle {ang_deg:g} must lie in 0..180 degrees")
        ang = ang_deg / 180 * np.pi
        v1 = coord[anga] - coord[bonda]
        if np.linalg.norm(v1) == 0:
            raise ValueError(f"{where}: reference atoms {bonda + 1} and {anga + 1} coincide")
        if k == 2:
            vecn = (
                np.cross(v1, (0.0, 0.0, 1.0))
                if not np.allclose(v1[:2], 0)
                else np.array((0.0, 0.0, 1.0))
            )
            c = _rotation(vecn, ang) @ v1 * (bond / np.linalg.norm(v1))
            coord.append(coord[bonda] + c)
            continue
        diha, dih = ref(f[5]), _number(f[6], where) / 180 * np.pi
        if diha in (bonda, anga):
            raise ValueError(f"{where}: the dihedral needs a third, different atom")
        v1 = v1 / np.linalg.norm(v1)
        if ang < 1e-7:
            c = v1 * bond
        elif np.pi - ang < 1e-7:
            c = -v1 * bond
        else:
            v2 = coord[diha] - coord[anga]
            vecn = np.cross(v2, -v1)
            norm = np.linalg.norm(vecn)
            if norm < 1e-7:
                vecn = (
                    np.cross(v1, (0.0, 0.0, 1.0))
                    if not np.allclose(v1[:2], 0)
                    else np.array((0.0, 0.0, 1.0))
                )
                c = _rotation(vecn, ang) @ v1 * bond
            else:
                vecn = _rotation(v1, -dih) @ vecn / norm
                c = _rotation(vecn, ang) @ v1 * bond
        coord.append(coord[bonda] + c)
    return [(s, (float(x), float(y), float(z))) for s, (x, y, z) in zip(labels, coord, strict=True)]


def _records(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for rec in text.replace(";", "\n").split("\n"):
        rec = rec.strip()
        if rec and not rec.startswith("#"):
            out.append((f"atom {len(out) + 1} ({rec[:60]!r})", rec.replace(",", " ").split()))
    return out


def _from_text(text: str) -> list[_Atom]:
    records = _records(text)
    if not records:
        return []
    if len(records[0][1]) == 1:  # a Z-matrix starts with an atom alone on its line
        return _zmatrix(records)
    return [_cartesian(f, where) for where, f in records]


def _from_file(path: str) -> list[_Atom]:
    with open(path, "rb") as fh:
        raw = fh.read(_MAX_FILE_BYTES + 1)
    if len(raw) > _MAX_FILE_BYTES:
        raise ValueError(f"{path}: geometry file larger than {_MAX_FILE_BYTES} bytes")
    text = raw.decode("latin-1")
    if path.lower().endswith(".xyz"):
        lines = text.splitlines()
        head = lines[0].strip() if lines else ""
        if not head.isdigit():
            raise ValueError(f"{path}: an .xyz file starts with the number of atoms")
        natm = int(head)
        body = lines[2 : 2 + natm]
        if len(body) != natm:
            raise ValueError(f"{path}: {natm} atoms announced, {len(body)} found")
        text = "\n".join(body)
    return _from_text(text)


def parse_geometry(atom: Any) -> list[_Atom]:
    """Parse a geometry into ``[(label, (x, y, z)), ...]`` with float coordinates (input unit).

    Args:
        atom: a string (atoms separated by ``;`` or newlines, or a Z-matrix), the name of an
            ``.xyz`` or atom-list file, or a list of ``(label, (x, y, z))``,
            ``(label, x, y, z)`` or ``"label x y z"`` entries.

    Returns:
        The atoms, in order; labels as given (atomic numbers turned into symbols).

    Raises:
        ValueError: one line naming the atom and what is wrong (a field that is not a plain
            number, an unknown element, a wrong field count, an empty geometry).

    Example:
        >>> parse_geometry("H 0 0 0; H, 0, 0, 0.74")
        [('H', (0.0, 0.0, 0.0)), ('H', (0.0, 0.0, 0.74))]
        >>> parse_geometry("H 0 0 0; H 0 0 0.74+__import__('os').getpid()")
        Traceback (most recent call last):
        ...
        ValueError: atom 2 ("H 0 0 0.74+__import__('os').getpid()"): coordinate \
"0.74+__import__('os').getpid()" is not a plain number
    """
    if isinstance(atom, str):
        one_line = "\n" not in atom and ";" not in atom
        if one_line and atom.strip() and os.path.isfile(atom.strip()):
            atoms = _from_file(atom.strip())
        else:
            atoms = _from_text(atom)
    elif isinstance(atom, (list, tuple)):
        atoms = []
        for n, entry in enumerate(atom, 1):
            where = f"atom {n} ({str(entry)[:60]!r})"
            if isinstance(entry, str):
                atoms.append(_cartesian(entry.replace(",", " ").split(), where))
                continue
            if not isinstance(entry, (list, tuple)):
                raise ValueError(f"{where}: expected (symbol, (x, y, z)) or 'symbol x y z'")
            if len(entry) == 2 and isinstance(entry[1], (list, tuple, np.ndarray)):
                label, xyz = entry
            elif len(entry) == 4:
                label, xyz = entry[0], entry[1:]
            else:
                raise ValueError(f"{where}: expected (symbol, (x, y, z)) or (symbol, x, y, z)")
            xyz = list(np.asarray(xyz, dtype=object).ravel())
            if len(xyz) != 3:
                raise ValueError(f"{where}: expected 3 coordinates, got {len(xyz)}")
            x, y, z = (_number(v, where) for v in xyz)
            atoms.append((_label(label, where), (x, y, z)))
    else:
        raise ValueError(
            f"atom must be a geometry string or a list of (symbol, (x, y, z)), not "
            f"{type(atom).__name__}"
        )
    if not atoms:
        raise ValueError("the geometry has no atoms")
    return atoms


def check_geometry(atoms: list[_Atom], unit: str) -> None:
    """Refuse two atoms closer than :data:`MIN_DISTANCE_BOHR` (ValueError naming both).

    Args:
        atoms: as returned by :func:`parse_geometry`.
        unit: ``"Angstrom"`` or ``"Bohr"`` (see :func:`normalize_unit`).

    Example:
        >>> check_geometry([("H", (0.0, 0.0, 0.0)), ("H", (0.0, 0.0, 0.0))], "Angstrom")
        Traceback (most recent call last):
        ...
        ValueError: atoms 1 (H) and 2 (H) are 0 Angstrom apart, closer than 0.1 Bohr
    """
    unit = normalize_unit(unit)
    scale = 1.0 / BOHR_IN_ANGSTROM if unit == "Angstrom" else 1.0
    xyz = np.array([c for _, c in atoms], dtype=np.float64).reshape(-1, 3) * scale
    n = len(xyz)
    step = max(1, (4 << 20) // (8 * n))  # rows per block: a few MB of squared distances
    for r0 in range(0, n, step):
        blk = xyz[r0 : r0 + step]
        d2 = np.zeros((len(blk), n))
        for k in range(3):
            d2 += np.subtract.outer(blk[:, k], xyz[:, k]) ** 2
        rows, cols = np.nonzero(d2 < MIN_DISTANCE_BOHR**2)
        keep = cols > rows + r0
        if keep.any():
            i, j = int(rows[keep][0]) + r0, int(cols[keep][0])
            dist = math.sqrt(d2[i - r0, j]) / scale
            raise ValueError(
                f"atoms {i + 1} ({atoms[i][0]}) and {j + 1} ({atoms[j][0]}) are {dist:.3g} "
                f"{unit} apart, closer than {MIN_DISTANCE_BOHR:g} Bohr"
            )
