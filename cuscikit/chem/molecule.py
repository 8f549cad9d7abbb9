"""``Molecule``: the integrals a CI solver needs, from atoms (PySCF), an FCIDUMP or a dataset.

PySCF is imported only inside the code paths that start from atoms or run the reference FCI;
a Molecule loaded from an FCIDUMP or a bundled dataset works without it. Every way in checks its
input before any work: geometries are parsed as plain numbers (:mod:`cuscikit.chem.geometry`),
integrals pass the FCIDUMP reader's checks (:func:`cuscikit.chem.integrals.validate_integrals`).
"""

from __future__ import annotations

import math
import os
import warnings
from math import comb
from pathlib import Path
from typing import Any

import numpy as np

from cuscikit.chem.fcidump import check_symmetry_labels, read_fcidump, write_fcidump
from cuscikit.chem.geometry import check_geometry, normalize_unit, nuclear_charge, parse_geometry
from cuscikit.chem.integrals import MAX_ORBITALS, restore_eri, validate_integrals

__all__ = ["Molecule", "MAX_ORBITALS", "SymmetryWarning", "aufbau_energy", "check_state_symmetry"]


class SymmetryWarning(UserWarning):
    """The integrals ask for a state symmetry (ISYM) that cuscikit's solvers do not impose
    (they refuse such a system: `check_state_symmetry`)."""


def check_state_symmetry(system: Any) -> None:
    """Refuse a system whose integrals ask for a state irrep (``isym`` other than 1).

    cuscikit's solvers do not restrict configurations to an irrep: they return the lowest state
    of any symmetry. ISYM=1 is what writers put when nothing was asked for (PySCF writes it for
    every file, the triplet O2 of the bundled set included, whose ground state is B1g), so 1
    means "no request"; any other value is a request the solvers cannot honour, and they say
    so before any work instead of returning a state of another symmetry.

    Raises:
        ValueError: one line, naming the irrep and the way to accept any symmetry.
    """
    isym = int(getattr(system, "isym", 1) or 1)
    if isym != 1:
        name = getattr(system, "name", "the integrals")
        raise ValueError(
            f"{name}: ISYM={isym} asks for the lowest state of irrep {isym}, and cuscikit's "
            "solvers do not restrict configurations to an irrep (they find the lowest state of "
            "any symmetry); set ISYM=1 in the file (or molecule.isym = 1) to accept that"
        )


# PySCF irrep id -> Molpro irrep number (as pyscf.tools.fcidump.ORBSYM_MAP)
_MOLPRO_ORBSYM = {
    "D2h": (1, 4, 6, 7, 8, 5, 3, 2),
    "C2v": (1, 4, 2, 3),
    "C2h": (1, 4, 2, 3),
    "D2": (1, 4, 3, 2),
    "Cs": (1, 2),
    "C2": (1, 2),
    "Ci": (1, 2),
    "C1": (1,),
}


def _pair_diag(norb: int) -> np.ndarray:
    i = np.arange(norb)
    return i * (i + 1) // 2 + i


def _jk_diagonals(eri8: np.ndarray, norb: int) -> tuple[np.ndarray, np.ndarray]:
    """J[i, j] = (ii|jj) and K[i, j] = (ij|ji) read straight from 8-fold packed integrals."""
    i = np.arange(norb)
    hi, lo = np.maximum(i[:, None], i[None, :]), np.minimum(i[:, None], i[None, :])
    pij = hi * (hi + 1) // 2 + lo  # pair index of (i, j)
    pii = _pair_diag(norb)
    a, b = np.maximum(pii[:, None], pii[None, :]), np.minimum(pii[:, None], pii[None, :])
    jmat = eri8[a * (a + 1) // 2 + b]
    kmat = eri8[pij * (pij + 1) // 2 + pij]
    return jmat, kmat


def aufbau_energy(
    h1e: np.ndarray, eri8: np.ndarray, nelec: tuple[int, int], e_core: float = 0.0
) -> float:
    """Energy of the determinant that occupies the lowest ``n_alpha`` / ``n_beta`` orbitals.

    Args:
        h1e: ``(norb, norb)`` one-electron integrals.
        eri8: 8-fold packed two-electron integrals.
        nelec: ``(n_alpha, n_beta)``.
        e_core: constant energy added to the result.

    Returns:
        ``E = e_core + sum_i h_ii + 1/2 sum_ij [J_ij - delta_s K_ij]`` over occupied spin orbitals.

    Example:
        >>> import numpy as np
        >>> h = np.diag([-1.0, 0.0]); g = np.zeros(6); g[0] = 0.5  # (00|00) = 0.5
        >>> aufbau_energy(h, g, (1, 1))
        -1.5
    """
    norb = h1e.shape[0]
    na, nb = nelec
    jmat, kmat = _jk_diagonals(np.asarray(eri8), norb)
    d = np.diag(h1e)
    e = d[:na].sum() + d[:nb].sum()
    e += 0.5 * (jmat[:na, :na].sum() - kmat[:na, :na].sum())
    e += 0.5 * (jmat[:nb, :nb].sum() - kmat[:nb, :nb].sum())
    e += jmat[:na, :nb].sum()
    return float(e + e_core)


def _validate_integrals(
    h1e: Any, eri: Any, nelec: Any, e_core: Any = 0.0
) -> tuple[np.ndarray, np.ndarray, tuple, float]:
    """Electron count and orbital limit first (cheap), then the FCIDUMP reader's checks."""
    h1e = np.asarray(h1e, dtype=np.float64)
    if h1e.ndim != 2 or h1e.shape[0] != h1e.shape[1]:
        raise ValueError(f"h1e must be a square (norb, norb) matrix, got shape {h1e.shape}")
    nelec = _validate_nelec(nelec, h1e.shape[0])
    try:
        e_core = float(e_core)
    except (TypeError, ValueError):
        raise ValueError(f"e_core must be a number, not {e_core!r}") from None
    h1e, eri8, e_core = validate_integrals(h1e, eri, e_core)
    return h1e, eri8, nelec, e_core


def _validate_nelec(nelec: Any, norb: int) -> tuple[int, int]:
    if norb < 1:
        raise ValueError("need at least one orbital")
    if norb > MAX_ORBITALS:
        raise ValueError(
            f"{norb} spatial orbitals exceed the limit of {MAX_ORBITALS} "
            f"({2 * MAX_ORBITALS} spin orbitals = 4 uint64 words); use a frozen core or an "
            "active space"
        )
    if isinstance(nelec, (int, np.integer)):
        n = int(nelec)
        if n < 0:
            raise ValueError(f"negative electron count {n}")
        nelec = ((n + 1) // 2, n // 2)
    try:
        na, nb = (int(x) for x in nelec)
    except (TypeError, ValueError):
        raise ValueError(f"nelec must be an int or (n_alpha, n_beta), got {nelec!r}") from None
    if na < 0 or nb < 0:
        raise ValueError(f"negative electron count in nelec={(na, nb)}")
    if na > norb or nb > norb:
        raise ValueError(f"nelec={(na, nb)} does not fit in {norb} spatial orbitals")
    return na, nb


class Molecule:
    """Integrals of a molecule in an orthonormal orbital basis, ready for a CI solver.

    Built from atoms, the constructor runs a tightly converged RHF (closed shell) or ROHF (open
    shell) through PySCF and transforms to canonical orbitals, optionally freezing the core and
    restricting to an active space (CASCI-style effective integrals).

    Args:
        atom: geometry in PySCF's formats (``"H 0 0 0; H 0 0 0.74"``, newlines, commas, a
            numeric Z-matrix, a list of ``(symbol, (x, y, z))``, an ``.xyz`` file name), parsed
            as plain numbers before PySCF sees it (:func:`cuscikit.chem.geometry.parse_geometry`);
            or a PySCF ``gto.Mole`` or RHF/ROHF object (as `from_pyscf`, the other arguments
            but ``frozen_core``, ``cas`` and ``name`` then come from it).
        basis: basis name or PySCF basis dict; names PySCF lacks come from basis_set_exchange.
        charge: total charge (an integer).
        spin: ``n_alpha - n_beta`` (2S, an integer).
        unit: ``"Angstrom"`` or ``"Bohr"`` (also ``Ang``, ``A``, ``AU``, ``B``); others refused.
        frozen_core: False, True (PySCF's ``chemcore``), or the number of frozen orbitals.
        cas: ``(n_electrons, n_orbitals)`` active space above the inactive core, or None.
        symmetry: use point-group symmetry in the SCF (orbital irreps go to ``orbsym``).
        name: label shown in ``repr``; default: the formula.
        verbose: PySCF verbosity.
        thorough_scf: try every SCF strategy and keep the lowest stable solution (slower;
            used for the bundled datasets). Otherwise stop at the first stable solution.

    Attributes:
        norb, nelec, h1e, eri, e_core, e_hf, e_scf, name, orbsym, isym, metadata, mol, scf,
        mo_coeff, ncore, e_fci (after :meth:`fci`). ``isym`` is the state irrep an FCIDUMP asked
        for (``ISYM``, 1 otherwise); the solvers refuse any other than 1 (see
        `check_state_symmetry`).

    Raises:
        ValueError: one line, before any SCF: a geometry field that is not a plain number, an
            unknown element, no atoms, two atoms at one point, a unit other than Angstrom or
            Bohr, a charge or spin that no electron count fits, a bad frozen core or active
            space, too many orbitals.

    Example:
        >>> mol = Molecule("Li 0 0 0; H 0 0 1.6")  # doctest: +SKIP
        >>> round(mol.fci(), 6)  # doctest: +SKIP
        -7.882362
    """

    def __init__(
        self,
        atom: Any,
        basis: Any = "sto-3g",
        charge: int = 0,
        spin: int = 0,
        unit: str = "Angstrom",
        frozen_core: bool | int = False,
        cas: tuple[int, int] | None = None,
        symmetry: bool | str = False,
        name: str | None = None,
        verbose: int = 0,
        thorough_scf: bool = False,
    ) -> None:
        if hasattr(atom, "nao_nr") or (hasattr(atom, "mo_coeff") and hasattr(atom, "mol")):
            other = Molecule.from_pyscf(atom, frozen_core, cas, name, thorough_scf)
            self.__dict__.update(other.__dict__)
            return
        unit = normalize_unit(unit)
        atoms = parse_geometry(atom)
        check_geometry(atoms, unit)
        charge, spin = _check_charge_spin(atoms, charge, spin)
        if isinstance(frozen_core, bool) or frozen_core is None:
            pass
        elif not isinstance(frozen_core, (int, np.integer)) or frozen_core < 0:
            raise ValueError(
                f"frozen_core must be a bool or a non-negative int, not {frozen_core!r}"
            )
        if cas is not None:
            if len(cas) != 2 or any(int(x) != x or x < 0 for x in cas):
                raise ValueError(f"cas must be (n_electrons, n_orbitals), got {cas!r}")
        from pyscf import gto

        mol = gto.Mole()
        mol.atom = atoms  # plain floats: PySCF has nothing left to evaluate
        mol.unit = unit
        mol.charge = charge
        mol.spin = spin
        mol.symmetry = symmetry
        mol.verbose = verbose
        if isinstance(basis, str) and not _pyscf_knows_basis(basis, atoms, unit):
            basis = _bse_basis(basis, atoms, unit)
        mol.basis = basis
        try:
            mol.build(parse_arg=False)
        except (RuntimeError, AssertionError) as exc:  # PySCF asserts on some electron counts
            if (
                isinstance(exc, AssertionError)
                or "spin" in str(exc).lower()
                or ("electron" in str(exc).lower())
            ):
                raise ValueError(
                    f"charge={charge}, spin={spin}: no electron count fits ({exc or 'PySCF'})"
                ) from None
            raise ValueError(f"cannot build the molecule: {exc}") from exc
        except (KeyError, ValueError, OSError) as exc:
            raise ValueError(f"cannot build the molecule: {exc}") from exc

        nmo_guess = mol.nao_nr()
        ncore, ncas, nelecas = _active_space(mol, frozen_core, cas, nmo_guess)
        _validate_nelec(nelecas, ncas)  # electron count and orbital limit, before any SCF

        mf = _converge_scf(mol, thorough=thorough_scf)
        self._from_scf(mf, ncore, ncas, nelecas, name)
        self.basis, self.charge, self.spin, self.unit = basis, charge, spin, unit
        self.frozen_core, self.cas = frozen_core, cas

    def _from_scf(self, mf: Any, ncore: int, ncas: int, nelecas: tuple[int, int], name) -> None:
        """The active-space integrals of a converged SCF in its molecular orbitals."""
        mol = mf.mol
        nmo = mf.mo_coeff.shape[1]
        if ncore + ncas > nmo:  # linear dependencies removed orbitals
            raise ValueError(f"active space {ncore}+{ncas} exceeds the {nmo} molecular orbitals")

        from pyscf import mcscf

        mc = mcscf.CASCI(mf, ncas, nelecas, ncore=ncore)
        h1eff, e_core = mc.get_h1eff()
        h2eff = mc.get_h2eff()
        orbsym = None
        if mol.symmetry:
            irreps = getattr(mf.mo_coeff, "orbsym", None)
            if irreps is not None:
                orbsym = _molpro_orbsym(mol, np.asarray(irreps)[ncore : ncore + ncas])

        self._set_integrals(h1eff, h2eff, nelecas, float(e_core), None, name or _formula(mol))
        self.orbsym = orbsym
        self.mol, self.scf, self.mo_coeff = mol, mf, mf.mo_coeff
        self.ncore = ncore
        self.e_scf = float(mf.e_tot)

    @classmethod
    def from_pyscf(
        cls,
        obj: Any,
        frozen_core: bool | int = False,
        cas: tuple[int, int] | None = None,
        name: str | None = None,
        thorough_scf: bool = False,
    ) -> Molecule:
        """A Molecule from a PySCF ``gto.Mole`` (cuscikit runs the SCF) or from a restricted
        SCF object (RHF/ROHF; its orbitals are used as they are).

        Args:
            obj: a built ``pyscf.gto.Mole`` or an SCF object with ``mol`` and ``mo_coeff``.
            frozen_core, cas, name, thorough_scf: as for `Molecule`.

        Raises:
            ValueError: one line: not a Mole or SCF object, an unrestricted SCF (two sets of
                orbitals), an SCF that has not run, or what `Molecule` refuses.

        Example:
            >>> from pyscf import gto, scf
            >>> mol = gto.M(atom="H 0 0 0; H 0 0 0.74", basis="sto-3g", verbose=0)
            >>> mf = scf.RHF(mol).run()
            >>> m = Molecule.from_pyscf(mf)
            >>> bool(abs(m.e_hf - mf.e_tot) < 1e-10), m.norb, m.nelec
            (True, 2, (1, 1))
            >>> bool(abs(Molecule.from_pyscf(mol).e_hf - mf.e_tot) < 1e-8)
            True
        """
        if hasattr(obj, "mo_coeff") and hasattr(obj, "mol"):
            mf = obj
            if mf.mo_coeff is None:
                raise ValueError("the SCF object has not run (mo_coeff is None): call .run() first")
            mo = np.asarray(mf.mo_coeff)
            if mo.ndim != 2:
                raise ValueError(
                    "an unrestricted SCF has two sets of orbitals: give an RHF or ROHF object"
                )
            if not getattr(mf, "converged", True):
                warnings.warn("the SCF object did not converge", stacklevel=2)
            mol = mf.mol
            ncore, ncas, nelecas = _active_space(mol, frozen_core, cas, mo.shape[1])
            _validate_nelec(nelecas, ncas)
            self = cls.__new__(cls)
            self._from_scf(mf, ncore, ncas, nelecas, name)
        elif hasattr(obj, "atom_coords") and hasattr(obj, "nao_nr"):
            mol = obj
            if not getattr(mol, "_built", True):
                mol.build()
            atoms = [(mol.atom_symbol(i), tuple(mol.atom_coord(i))) for i in range(mol.natm)]
            self = cls(
                atoms,
                basis=mol.basis,
                charge=mol.charge,
                spin=mol.spin,
                unit="Bohr",
                frozen_core=frozen_core,
                cas=cas,
                symmetry=mol.symmetry,
                name=name,
                thorough_scf=thorough_scf,
            )
            return self
        else:
            raise ValueError(
                f"expected a pyscf.gto.Mole or an SCF object, not {type(obj).__name__}"
            )
        self.basis, self.charge, self.spin, self.unit = mol.basis, mol.charge, mol.spin, "Bohr"
        self.frozen_core, self.cas = frozen_core, cas
        return self

    # ------------------------------------------------------------------ other constructors
    def _set_integrals(
        self,
        h1e: Any,
        eri: Any,
        nelec: Any,
        e_core: float,
        e_hf: float | None,
        name: str | None,
    ) -> None:
        h1e, eri8, nelec, e_core = _validate_integrals(h1e, eri, nelec, e_core)
        if e_hf is None:
            e_hf = aufbau_energy(h1e, eri8, nelec, e_core)
        elif isinstance(e_hf, bool) or not isinstance(e_hf, (int, float, np.integer, np.floating)):
            raise ValueError(f"e_hf must be a number, not {e_hf!r}")
        if not math.isfinite(e_hf):  # cannot overflow within the integral bound: a guard
            raise ValueError(f"the reference energy e_hf={e_hf!r} is not finite")
        self.norb: int = h1e.shape[0]
        self.nelec: tuple[int, int] = nelec
        self.h1e: np.ndarray = h1e
        self.eri: np.ndarray = eri8
        self.e_core: float = e_core
        self.e_hf: float = float(e_hf)
        self.name: str = name or f"norb={self.norb}"
        self.orbsym: tuple[int, ...] | None = None
        self.isym: int = 1
        self.metadata: dict = {}
        self.e_fci: float | None = None
        self.mol = self.scf = self.mo_coeff = None
        self.ncore = 0
        self.e_scf: float | None = None
        self._eri_full: np.ndarray | None = None

    @classmethod
    def from_integrals(
        cls,
        h1e: Any,
        eri: Any,
        nelec: int | tuple[int, int],
        e_core: float = 0.0,
        e_hf: float | None = None,
        name: str | None = None,
        orbsym: Any = None,
        isym: int = 1,
    ) -> Molecule:
        """Build from integrals in an orthonormal basis.

        The integrals pass the checks the FCIDUMP reader applies to a file, with the same
        tolerance and message: a full or 4-fold ``eri`` whose mirrored elements disagree (a
        broken permutation symmetry) is refused, not symmetrised; every value must be finite
        and at most :data:`~cuscikit.chem.integrals.MAX_ABS_INTEGRAL` in magnitude.

        Args:
            h1e: ``(norb, norb)`` symmetric one-electron integrals.
            eri: two-electron integrals (chemists'), full, 4-fold or 8-fold packed.
            nelec: electron count (an odd count puts the extra electron in alpha) or
                ``(n_alpha, n_beta)``.
            e_core: constant energy.
            e_hf: reference energy; default: the aufbau determinant's energy.
            name: label.
            orbsym: orbital irreps (Molpro numbering, as ORBSYM), or None.
            isym: the state irrep asked for (as ISYM); kept and written back by
                :meth:`to_fcidump`. cuscikit's solvers do not restrict configurations to an
                irrep: they return the lowest state of any symmetry, so ``isym != 1`` gives a
                :class:`SymmetryWarning`.

        Returns:
            A Molecule without PySCF objects (``mol``, ``scf`` are None).

        Raises:
            ValueError: shapes, symmetry, finiteness, magnitude, electron count, orbital limit,
                ``orbsym`` or ``isym`` are wrong.

        Example:
            >>> import numpy as np
            >>> m = Molecule.from_integrals(np.diag([-1.0, 0.0]), np.zeros(6), 2)
            >>> m.nelec, m.e_hf
            ((1, 1), -2.0)
        """
        self = cls.__new__(cls)
        self._set_integrals(h1e, eri, nelec, e_core, e_hf, name)
        self.orbsym = check_symmetry_labels(orbsym, isym, self.norb)
        self.isym = int(isym)
        if self.isym != 1:
            has = "with ORBSYM" if self.orbsym is not None else "without ORBSYM"
            warnings.warn(
                f"{self.name}: ISYM={self.isym} ({has}) asks for the lowest state of irrep "
                f"{self.isym}; cuscikit's solvers do not restrict configurations to an irrep (they "
                "would find the lowest state of any symmetry) and refuse it; ISYM is kept and "
                "written back",
                SymmetryWarning,
                stacklevel=2,
            )
        return self

    @classmethod
    def hubbard(
        cls,
        shape: int | tuple[int, int],
        U: float,
        t: float = 1.0,
        pbc: bool | tuple[bool, ...] = False,
        nelec: int | tuple[int, int] | None = None,
        basis: str = "rhf",
    ) -> Molecule:
        """The Hubbard model of a chain or a rectangular lattice as a Molecule.

        Args:
            shape: L (a chain of L sites) or (Lx, Ly).
            U: on-site repulsion; t: nearest-neighbour hopping (h_ij = -t).
            pbc: periodic boundaries (one flag, or one per axis).
            nelec: electrons, a count (the extra one in alpha) or (n_alpha, n_beta); default:
                half filling, Ms = 0.
            basis: "rhf" (default: the orbitals of a restricted mean field of the model, on
                which selected-CI methods stand much better than on the sites) or "site".
                Energies of exact methods do not depend on it. The choice and the orbitals
                are kept in ``metadata["basis"]`` and ``metadata["orbitals"]``.

        In the "rhf" basis ``metadata["start"]`` holds the occupied alpha and beta orbitals of
        the determinant a selected-CI run starts from (`cuscikit.sci.configs.start_configuration`):
        the aufbau one, unless a degenerate shell at the Fermi level is only partly filled (a
        ring of 4n sites at half filling), where the aufbau filling can carry no weight at all
        by symmetry; then the filling of that shell with the lowest diagonal energy (the first
        of equal ones).

        Example:
            >>> m = Molecule.hubbard(6, U=4.0, pbc=True)
            >>> m.norb, m.nelec, m.metadata["basis"]
            (6, (3, 3), 'rhf')
            >>> from cuscikit import FCI
            >>> e_rhf = FCI(m).run().e_tot
            >>> e_site = FCI(Molecule.hubbard(6, U=4.0, pbc=True, basis="site")).run().e_tot
            >>> abs(e_rhf - e_site) < 1e-10
            True
        """
        from cuscikit.chem.lattice import (
            _scale,
            hubbard_integrals,
            rhf_levels,
            rotate_integrals,
            shell_fillings,
        )

        if basis not in ("rhf", "site"):
            raise ValueError(f"basis must be 'rhf' or 'site', got {basis!r}")
        h1, eri = hubbard_integrals(shape, U, t, pbc)
        n = h1.shape[0]
        if nelec is None:
            nelec = (n // 2 + n % 2, n // 2)
        C = np.eye(n)
        fillings = []
        if basis == "rhf":
            scale = _scale(h1, eri)
            levels, C = rhf_levels(h1, eri, nelec)
            h1, eri = rotate_integrals(h1, eri, C)
            h1 = 0.5 * (h1 + h1.T)
            fillings = shell_fillings(levels, nelec, scale)
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        name = f"Hubbard {'x'.join(map(str, dims))}{' pbc' if pbc else ''} U={U:g}"
        self = cls.from_integrals(h1, eri, nelec, name=name)
        self.metadata = {
            "name": name,
            "model": {
                "kind": "hubbard",
                "shape": list(dims),
                "U": float(U),
                "t": float(t),
                "pbc": pbc if isinstance(pbc, bool) else list(pbc),
            },
            "basis": basis,
            "orbitals": C.tolist(),
        }
        if len(fillings) > 1:  # a partly filled shell: its filling of lowest diagonal energy
            from cuscikit.sci.configs import from_occupations
            from cuscikit.sci.hamiltonian import Hamiltonian

            configs = from_occupations([a for a, _ in fillings], [b for _, b in fillings], n)
            diagonal = Hamiltonian.from_molecule(self).diagonal(configs)
            # the first of the lowest: fillings that tie (a spin flip of another) differ only
            # by rounding, and which of them came out lower differed between machines
            low = diagonal.min()
            first = np.flatnonzero(diagonal <= low + 1e-10 * max(1.0, abs(low)))[0]
            fillings = [fillings[int(first)]]
        if fillings:  # the aufbau filling when the shell is full
            self.metadata["start"] = {"alpha": fillings[0][0], "beta": fillings[0][1]}
        return self

    @classmethod
    def from_fcidump(cls, path: str | os.PathLike, name: str | None = None) -> Molecule:
        """Build from an FCIDUMP file (plain or gzipped); no PySCF needed.

        Args:
            path: the file.
            name: label; default: the file name.

        Returns:
            A Molecule with ``e_hf`` computed from the integrals.

        Raises:
            FCIDumpError: malformed file.

        Warns:
            FCIDumpWarning: no core energy or no one-electron integrals (a file cut short?).
            SymmetryWarning: the file asks for a state irrep other than 1 (``ISYM``).

        Example:
            >>> m = Molecule.from_fcidump("datasets/lih_sto3g.fcidump.gz")  # doctest: +SKIP
        """
        d = read_fcidump(path)
        return cls.from_integrals(
            d.h1e,
            d.eri,
            d.nelec_ab,
            d.e_core,
            name=name or Path(path).name,
            orbsym=d.orbsym,
            isym=d.isym,
        )

    @classmethod
    def load(cls, name: str) -> Molecule:
        """Load a bundled dataset, or build a Hubbard lattice from its name.

        Args:
            name: dataset name, e.g. ``"N2"``, ``"n2/cc-pvdz"``, ``"Cr2"``; or a lattice name,
                e.g. ``"Hubbard-8-chain-U4"``, ``"Hubbard-4x3-open-U8"`` (half filling; the
                grammar is `cuscikit.chem.lattice.LATTICE_NAMES`), which is
                `Molecule.hubbard` with those arguments.

        Returns:
            The Molecule. A dataset's JSON metadata is in ``mol.metadata``, its reference energy
            in ``metadata["reference"]["energy"]``; a lattice has no reference (its FCI energy is
            ``FCI(mol).run().e_tot`` where the space is small enough).

        Raises:
            UnknownDatasetError: no such dataset.
            ValueError: a name that begins with "Hubbard" but is not a lattice name.

        Example:
            >>> m = Molecule.load("LiH")  # doctest: +SKIP
            >>> m.norb, m.nelec  # doctest: +SKIP
            (6, (2, 2))
            >>> m = Molecule.load("Hubbard-6-ring-U4")
            >>> m.norb, m.nelec, m.metadata["basis"]
            (6, (3, 3), 'rhf')
        """
        from cuscikit.chem.datasets import dataset_fcidump_path, dataset_metadata
        from cuscikit.chem.lattice import lattice_from_name

        lattice = lattice_from_name(name)
        if lattice is not None:
            aufbau = lattice.pop("aufbau")
            self = cls.hubbard(**lattice)
            if aufbau:
                self.metadata.pop("start", None)
            return self
        meta = dataset_metadata(name)
        self = cls.from_fcidump(dataset_fcidump_path(name), name=meta.get("name", name))
        self.metadata = meta
        return self

    # ------------------------------------------------------------------ properties and methods
    @property
    def n_determinants(self) -> int:
        """Size of the FCI space, ``C(norb, n_alpha) * C(norb, n_beta)``."""
        return comb(self.norb, self.nelec[0]) * comb(self.norb, self.nelec[1])

    @property
    def is_lattice(self) -> bool:
        """Whether this is a lattice model (`Molecule.hubbard`, or `Molecule.load` of a lattice
        name): solvers choose some defaults by it (`cuscikit.nnqs.Runner`'s "auto" growth and
        teacher inner steps). An FCIDUMP carries no such mark.

        Example:
            >>> Molecule.hubbard(4, U=4.0).is_lattice, Molecule.load("LiH").is_lattice
            (True, False)
        """
        return self._model_kind is not None

    @property
    def energy_unit(self) -> str:
        """The unit of this system's energies: "t" (the hopping) for a Hubbard model, "Ha"
        otherwise.

        Example:
            >>> Molecule.hubbard(4, U=4.0).energy_unit, Molecule.load("LiH").energy_unit
            ('t', 'Ha')
        """
        return "t" if self._model_kind == "hubbard" else "Ha"

    @property
    def _model_kind(self) -> str | None:
        """The kind of model this is (``metadata["model"]["kind"]``: "hubbard"), None for a
        molecule."""
        return ((self.metadata or {}).get("model") or {}).get("kind")

    @property
    def n_electrons(self) -> int:
        """Total number of (active) electrons."""
        return self.nelec[0] + self.nelec[1]

    def eri_full(self) -> np.ndarray:
        """The two-electron integrals as a full ``(norb,)*4`` array (computed once, cached).

        Returns:
            ``g[p, q, r, s] = (pq|rs)``.
        """
        if self._eri_full is None:
            self._eri_full = restore_eri(self.eri, self.norb, 1)
        return self._eri_full

    def to_fcidump(self, path: str | os.PathLike, tol: float = 1e-15) -> None:
        """Write the integrals as an FCIDUMP (gzip if ``path`` ends in ``.gz``), with the
        molecule's ORBSYM and ISYM.

        Args:
            path: output file.
            tol: integrals with ``|value| <= tol`` are omitted.
        """
        write_fcidump(
            path,
            self.h1e,
            self.eri,
            self.nelec,
            e_core=self.e_core,
            orbsym=self.orbsym,
            tol=tol,
            isym=self.isym,
        )

    def fci(self, nroots: int = 3, conv_tol: float = 1e-12, max_cycle: int = 200) -> float:
        """Exact (FCI) ground-state energy through PySCF's ``fci.direct_spin1``.

        Several roots are always solved (at least 3) and the lowest taken: a single-root
        Davidson from the HF guess can land on an excited state (C2/STO-3G; docs/conventions.md).

        Args:
            nroots: number of roots to solve (raised to 3 if lower).
            conv_tol: Davidson energy convergence.
            max_cycle: Davidson iterations.

        Returns:
            The lowest eigenvalue, also stored as ``self.e_fci`` (all roots in
            ``self.e_fci_roots``).

        Example:
            >>> Molecule.load("LiH").fci()  # doctest: +SKIP
            -7.784460280...
        """
        from pyscf import fci

        check_state_symmetry(self)
        solver = fci.direct_spin1.FCI()
        solver.conv_tol = conv_tol
        solver.max_cycle = max_cycle
        solver.max_space = 24  # a larger subspace converges degenerate roots faster
        solver.verbose = 0
        nroots = max(3, int(nroots))
        nroots = min(nroots, self.n_determinants)
        e, _ = solver.kernel(
            self.h1e, self.eri, self.norb, self.nelec, ecore=self.e_core, nroots=nroots
        )
        roots = np.sort(np.atleast_1d(np.asarray(e, dtype=np.float64)))
        self.e_fci_roots = roots
        self.e_fci = float(roots[0])
        return self.e_fci

    def __repr__(self) -> str:
        e = f", e_fci={self.e_fci:.8f}" if self.e_fci is not None else ""
        return (
            f"Molecule({self.name!r}, norb={self.norb}, nelec={self.nelec}, "
            f"e_hf={self.e_hf:.8f}{e}, n_det={self.n_determinants:,})"
        )


# ---------------------------------------------------------------------- PySCF helpers
def _formula(mol: Any) -> str:
    from collections import Counter

    counts = Counter(mol.atom_pure_symbol(i) for i in range(mol.natm))
    return "".join(f"{s}{n if n > 1 else ''}" for s, n in counts.items())


def _check_charge_spin(atoms: list, charge: Any, spin: Any) -> tuple[int, int]:
    """Integer charge and spin that some electron count fits (all-electron count; an ECP
    removes electrons in pairs, which PySCF's own check then covers)."""
    for name, val in (("charge", charge), ("spin", spin)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, not {val!r}")
    charge, spin = int(charge), int(spin)
    nel = sum(nuclear_charge(label) for label, _ in atoms) - charge
    if nel < 0:
        raise ValueError(f"charge={charge} removes more electrons than the atoms have")
    if abs(spin) > nel or (nel - spin) % 2:
        raise ValueError(
            f"charge={charge}, spin={spin}: {nel} electrons cannot have 2S = n_alpha - n_beta = "
            f"{spin} (2S must have the parity of the electron count and not exceed it)"
        )
    return charge, spin


def _elements(atom: Any, unit: str) -> list[str]:
    from pyscf import gto

    return sorted({gto.mole._std_symbol(label) for label, _ in parse_geometry(atom)})


def _pyscf_knows_basis(name: str, atom: Any, unit: str) -> bool:
    from pyscf import gto

    try:
        return all(gto.basis.load(name, s) for s in _elements(atom, unit))
    except Exception:  # noqa: BLE001 - PySCF raises several types for an unknown basis
        return False


def _bse_basis(name: str, atom: Any, unit: str) -> dict:
    """Fetch a basis PySCF does not know from the local basis_set_exchange package."""
    try:
        import basis_set_exchange as bse
    except ImportError:
        raise ValueError(
            f"basis {name!r} is unknown to PySCF and basis_set_exchange is not installed"
        ) from None
    from pyscf import gto

    out = {}
    for s in _elements(atom, unit):
        try:
            text = bse.get_basis(name, elements=[s], fmt="nwchem", header=False)
        except (KeyError, RuntimeError) as exc:
            raise ValueError(
                f"basis {name!r} is unknown to PySCF and to basis_set_exchange for {s}: {exc}"
            ) from None
        out[s] = gto.basis.parse(text, s)
    return out


def _active_space(
    mol: Any, frozen_core: bool | int, cas: tuple[int, int] | None, nmo: int
) -> tuple[int, int, tuple[int, int]]:
    """(ncore, ncas, (na, nb)) for the requested frozen core and active space."""
    if frozen_core is True:
        from pyscf.data.elements import chemcore

        nfrozen = int(chemcore(mol))
    else:
        nfrozen = int(frozen_core or 0)
    nel = mol.nelectron
    if 2 * nfrozen > nel:
        raise ValueError(f"frozen_core={nfrozen} orbitals hold more than the {nel} electrons")
    if cas is None:
        ncore = nfrozen
        ncas = nmo - ncore
        nelcas = nel - 2 * ncore
    else:
        nelcas, ncas = int(cas[0]), int(cas[1])
        if nelcas > nel or (nel - nelcas) % 2:
            raise ValueError(
                f"cas={cas}: {nelcas} active electrons cannot be taken from {nel} electrons "
                "with a doubly occupied core"
            )
        ncore = (nel - nelcas) // 2
        if ncore < nfrozen:
            raise ValueError(
                f"cas={cas} leaves {ncore} core orbitals, fewer than frozen_core={nfrozen}"
            )
        if ncore + ncas > nmo:
            raise ValueError(f"cas={cas} needs {ncore + ncas} orbitals, the basis has {nmo}")
    if (nelcas - mol.spin) % 2 or abs(mol.spin) > nelcas:
        raise ValueError(f"spin={mol.spin} is inconsistent with {nelcas} active electrons")
    na, nb = (nelcas + mol.spin) // 2, (nelcas - mol.spin) // 2
    return ncore, ncas, (na, nb)


def _molpro_orbsym(mol: Any, irreps: np.ndarray) -> tuple[int, ...]:
    group = mol.groupname
    if group not in _MOLPRO_ORBSYM:
        group = {"Dooh": "D2h", "Coov": "C2v"}.get(group, group)
        irreps = irreps % 10
    if group not in _MOLPRO_ORBSYM:
        return tuple(int(x) + 1 for x in irreps)
    table = _MOLPRO_ORBSYM[group]
    return tuple(table[int(x)] for x in irreps)


def _converge_scf(mol: Any, thorough: bool = False, conv_tol: float = 1e-12) -> Any:
    """RHF/ROHF converged tightly; several strategies, stability-checked, lowest kept.

    Strategies, in order: DIIS from the MINAO guess; DIIS from ATOM, HUCKEL and 1E guesses;
    a level shift of 0.5 Ha followed by DIIS; second-order (Newton) SCF. Each converged
    solution is followed along internal instabilities until stable and polished with Newton.
    Without ``thorough`` the first stable solution is returned.
    """
    from pyscf import scf

    cls = scf.RHF if mol.spin == 0 else scf.ROHF

    def new(**kw: Any) -> Any:
        mf = cls(mol)
        mf.conv_tol = conv_tol
        mf.conv_tol_grad = max(np.sqrt(conv_tol), 1e-7)
        mf.max_cycle = 200
        mf.verbose = mol.verbose
        for k, v in kw.items():
            setattr(mf, k, v)
        return mf

    def stabilise(mf: Any) -> tuple[Any, bool]:
        for _ in range(5):
            res = mf.stability(internal=True, external=False, return_status=True)
            mo, stable = res[0], bool(res[2])  # (mo_i, mo_e, stable_i, stable_e)
            if stable:
                return mf, True
            dm = mf.make_rdm1(mo, mf.mo_occ)
            mf2 = new().newton()
            mf2.kernel(dm)
            if not mf2.converged or mf2.e_tot > mf.e_tot + 1e-10:
                return mf, False
            mf = mf2
        return mf, False

    def attempts() -> Any:
        for guess in ("minao", "atom", "huckel", "1e"):
            yield "diis/" + guess, new(init_guess=guess), None
        yield "level_shift", new(level_shift=0.5), "polish"
        yield "newton", new().newton(), None

    best = None
    errors = []
    for label, mf, post in attempts():
        try:
            mf.kernel()
            if post == "polish":
                dm = mf.make_rdm1()
                mf = new()
                mf.kernel(dm)
            if not mf.converged:
                mfn = new().newton()
                mfn.kernel(mf.make_rdm1())
                mf = mfn
        except Exception as exc:  # noqa: BLE001 - one failing strategy must not stop the rest
            errors.append(f"{label}: {exc}")
            continue
        if not mf.converged:
            errors.append(f"{label}: not converged")
            continue
        mf, stable = stabilise(mf)
        mf.scf_strategy = label
        mf.scf_stable = stable
        if best is None or mf.e_tot < best.e_tot - 1e-9:
            best = mf
        if stable and not thorough:
            break
    if best is None:
        raise RuntimeError("SCF did not converge with any strategy: " + "; ".join(errors))
    # Newton-based steps leave a wrapped object: polish with plain SCF from the best density,
    # which also diagonalises the Fock matrix (canonical orbitals, orbsym labels).
    mf = new()
    mf.kernel(best.make_rdm1(best.mo_coeff, best.mo_occ))
    if not (mf.converged and abs(mf.e_tot - best.e_tot) < 1e-8):
        raise RuntimeError(
            f"SCF polish moved away from the best solution ({best.e_tot} -> {mf.e_tot})"
        )
    mf.scf_strategy, mf.scf_stable = best.scf_strategy, best.scf_stable
    return mf
