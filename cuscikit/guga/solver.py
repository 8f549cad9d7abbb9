"""`GUGASolver`: exact CI in a CSF basis with PySCF's fcisolver interface.

The solver diagonalises H in the configuration state functions of one spin S (a DRT), so every
root is a pure spin state: no spin contamination and no spin penalty. Its signatures are those
of ``pyscf.fci.direct_spin1.FCISolver``, so it drops into ``mcscf.CASCI``, ``mcscf.CASSCF`` and
``mcscf.state_average_``. Conventions (as PySCF's): E = sum_pq h_pq dm1[q, p] + 1/2 sum_pqrs
(pq|rs) dm2[p, q, r, s] + ecore with dm1[p, q] = <E_qp> and dm2[p, q, r, s] = <E_pq E_rs> -
delta_qr <E_ps>. CI vectors are CSF vectors in the DRT's lexical order (`DRT.csf_to_dets` turns
them into PySCF determinant vectors).

Example:
    >>> import numpy as np
    >>> from cuscikit import Molecule
    >>> mol = Molecule.load("LiH")
    >>> e, ci = GUGASolver().kernel(mol.h1e, mol.eri, mol.norb, mol.nelec, ecore=mol.e_core)
    >>> round(e, 8)
    -7.78446028
    >>> GUGASolver().spin_square(ci, mol.norb, mol.nelec)
    (0.0, 1.0)
"""

from __future__ import annotations

import math
import sys

import numpy as np

from cuscikit.guga.df import cholesky_pairs, pair_factor
from cuscikit.guga.drt import DRT, MAX_NORB, split_nelec
from cuscikit.guga.sigma import Engine, pair_index
from cuscikit.lib.logger import new_logger
from cuscikit.lib.solver import Solver

__all__ = ["GUGASolver"]


def _eri4(eri, norb: int) -> np.ndarray:
    from cuscikit.chem.integrals import restore_eri

    return np.ascontiguousarray(restore_eri(np.asarray(eri, dtype=np.float64), norb, 4))


def _restricted(matvec, sub: np.ndarray, n: int):
    """matvec on the CSFs `sub` (vectors zero elsewhere; H keeps them there)."""

    def mv(X):
        X = np.asarray(X, dtype=np.float64)
        full = np.zeros((n,) + X.shape[1:])
        full[sub] = X
        return matvec(full)[sub]

    return mv


def _pack(h: np.ndarray) -> np.ndarray:
    """Lower triangle of a symmetric matrix in pair order (i >= j, ij = i(i+1)/2 + j)."""
    i, j = np.tril_indices(len(h))
    return np.ascontiguousarray(h[i, j])


def _lowest(a: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(a, kind="stable")[:k]`` without sorting all of `a`: the entries up to the
    k-th smallest value (ties included) sorted stably (O(n) instead of O(n log n)). Up to
    65,536 entries all of `a` is sorted (2 ms at 30k; the selection's kernels, 0.17 MB of
    numpy's code, are then not loaded into a small solve)."""
    if k >= len(a) or len(a) <= 65536:
        return np.argsort(a, kind="stable")[:k]
    v = a[np.argpartition(a, k - 1)[k - 1]]
    cand = np.flatnonzero(a <= v)
    return cand[np.argsort(a[cand], kind="stable")[:k]]


def _release_free_heap() -> None:
    """Hand the allocator's free pages back to the system (glibc's ``malloc_trim``; nothing
    where there is none). Called once the P space is built: its temporaries were the largest
    allocations of a small solve, and the pages glibc kept of them (its mmap threshold grows
    after the first large block is freed, so later ones come from the heap) stayed resident
    beside the Davidson's vectors (N2 CAS(10,10) triplet: 0.3-0.7 MB of the solve's peak)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def _noise_scale(norms, pspace: int) -> np.ndarray:
    """Scale of each column of standard-normal start noise with column norms `norms`: 1e-5 per
    CSF, but the column's norm capped at 1e-5 sqrt(pspace). Noise of 1e-5 on every CSF grows as
    1e-5 sqrt(n) (0.022 at N2 CAS(14,14) triplet, 4.8M CSFs), far above the P-space guess's
    own error, and the Davidson residual then stalls near 1e-4 (11 sigma vectors there
    instead of 9); capped, it still reaches every CSF (every symmetry block)."""
    norms = np.asarray(norms, dtype=np.float64)
    cap = math.sqrt(max(int(pspace), 1))
    return 1e-5 * np.minimum(1.0, cap / np.maximum(norms, 1e-300))


def _host_noise(shape) -> np.ndarray:
    """Seeded noise of unit variance on the host: uniform on [-sqrt(3), sqrt(3)), from the raw
    64-bit words of numpy's PCG64 bit generator (seed 1), 53 bits each. (A Generator's normal
    deviates loaded 0.3 MB of numpy.random's code into a first solve; the bit generator's words
    load almost none.)"""
    raw = np.random.PCG64(1).random_raw(math.prod(shape))
    np.right_shift(raw, np.uint64(11), out=raw)
    u = raw.astype(np.float64)
    del raw
    u *= 2.0**-53
    u -= 0.5
    u *= 2.0 * math.sqrt(3.0)
    return u.reshape(shape)


def _start_vectors(hdiag, n: int, nroots: int, pre=None, pspace: int = 0):
    """Davidson start vectors on hdiag's device: one for one root, else max(nroots + 2,
    2 nroots); the P-space vectors of `pre`, or unit vectors on the lowest diagonals, plus
    seeded noise of unit variance (`_host_noise` on the host, the device generator's normal
    deviates on a tensor) times 1e-5 per CSF
    with each column's norm capped at 1e-5 sqrt(pspace) (`_noise_scale`; pspace: the P space's
    size, at least pre's)."""
    k0 = min(n, 1 if nroots == 1 else max(nroots + 2, 2 * nroots))
    if pre is not None:
        pspace = max(int(pspace), len(pre.csfs))
    if isinstance(hdiag, np.ndarray):
        if pre is not None:
            guess = pre.guess(k0)
        else:
            guess = np.zeros((n, k0))
            guess[_lowest(hdiag, k0), np.arange(k0)] = 1.0
        noise = _host_noise(guess.shape)
        noise *= _noise_scale(np.linalg.norm(noise, axis=0), pspace)[None, :]
        return np.add(guess, noise, out=noise)
    import torch

    if pre is not None:
        guess = pre.guess(k0)
    else:
        order = torch.argsort(hdiag, stable=True)[:k0]
        guess = torch.zeros((n, k0), dtype=torch.float64, device=hdiag.device)
        guess[order, torch.arange(k0, device=hdiag.device)] = 1.0
    gen = torch.Generator(device=hdiag.device).manual_seed(1)
    noise = torch.randn((n, k0), generator=gen, dtype=torch.float64, device=hdiag.device)
    scale = _noise_scale(torch.linalg.vector_norm(noise, dim=0).cpu().numpy(), pspace)
    noise.mul_(torch.as_tensor(scale, device=hdiag.device)[None, :])
    return guess.add_(noise)


class GUGASolver(Solver):
    """Exact CI in the CSFs of one spin, a PySCF fcisolver.

    Options (PySCF's names and defaults):
        conv_tol: energy convergence of the Davidson solver (1e-10).
        conv_tol_residual: residual norm per root (None: sqrt(conv_tol)).
        max_cycle, max_space, lindep, level_shift: Davidson controls.
        davidson_only: never diagonalise densely (small spaces are, when no ci0 is given).
        pspace_size: largest space diagonalised densely; in larger spaces, the number of
            CSFs of lowest diagonal whose Hamiltonian gives the Davidson start vectors and
            preconditioner (``precond``).
        pspace_grow: on the CPU, in spaces of n > pspace_grow CSFs, a P space of
            pspace_size * sqrt(n / pspace_grow) CSFs, at most 4 pspace_size (default 350,000;
            N2 CAS(14,14) triplet, 5.0M CSFs: 1,513 CSFs; 1,500 took 12 sigma vectors instead
            of 14 for 3 CPU s more; 0: pspace_size always).
        precond: "pspace" (default: H diagonalised in those pspace_size CSFs for the start
            vectors, and Olsen's correction with H - e inverted there and its diagonal
            elsewhere, as PySCF's FCI does; `cuscikit.guga.pspace`) or "diagonal" (unit
            vectors on the lowest diagonals and (H_mm - e)^-1 alone).
        nroots: roots returned by `kernel`.
        spin: 2S; None takes n_alpha - n_beta of the nelec passed to `kernel`.
        orbsym, wfnsym: irrep ids of the active orbitals and of the wanted state (PySCF's
            abelian ids; a name for wfnsym needs ``mol``). With wfnsym set the roots are those
            of the CSFs of that irrep (linear groups: of its D2h/C2v subgroup irrep, so Sigma+
            and Delta are not told apart); without it, of every irrep. The CSF space and the
            sigma are not reduced by symmetry.
        max_memory: MB the vectors and caches may take (None: the ``max_memory`` that
            ``kernel`` is given, as ``mcscf.CASCI`` passes ``mol.max_memory``, else 80 % of the
            host's available memory); a space that does not fit is refused before any work.
        sigma_method: "loops" (default: the loop-driven sigma, nothing stored per CSF, a loop
            table of a few MB) or "lists" (per-ket coupling lists kept within max_memory,
            14 bytes per coupling; the rest searched again on every sigma). See
            `cuscikit.guga.sigma`.
        threads: OpenMP threads of the kernels (0: the runtime's default).
        device: "cpu" (the reference) or a CUDA device ("cuda", "cuda:1"): sigma, diagonal,
            Davidson vectors and density matrices on the GPU (`cuscikit.guga.gpu`); a clear
            CudaUnavailableError where no GPU or no compiled kernels are present.
        gpu_memory: MB the solve may hold on the GPU (None: what is free); under a tighter
            cap the sigma works in more passes instead of failing.
        gpu_space: columns of the Davidson subspace (and as many of its image) kept on the
            GPU; the rest are spilled to pinned host memory and streamed back for each product
            (`cuscikit.linalg.davidson`, ``resident``). None: all on the GPU when they fit
            beside one tile of the sigma, else as many as half the budget holds.
        df: factor the integrals passed to `kernel` by pivoted Cholesky (to ``df_tol``) and
            run the sigma as g = L (L^T t) (`cuscikit.guga.df`); False: the dense GEMM.
        df_tol: largest error of a diagonal integral (pq|pq) left by the Cholesky factor
            (0: exact to round-off).
        cderi: a 3-index factor of the active-space integrals, (naux, norb, norb) or
            (naux, npair) with (pq|rs) = sum_P cderi[P, pq] cderi[P, rs] (density fitting);
            then `kernel` takes eri=None and the sigma runs factored (on the CPU and the GPU).
            wfnsym runs on the CPU only.

    Results: ``e_tot``, ``ci``, ``converged``, ``eci`` (after `kernel`).
    """

    conv_tol: float = 1e-10
    conv_tol_residual: float | None = None
    lindep: float = 1e-14
    max_cycle: int = 100
    max_space: int = 12
    level_shift: float = 1e-3
    davidson_only: bool = False
    pspace_size: int = 400
    pspace_grow: int = 350_000
    precond: str = "pspace"
    nroots: int = 1
    spin: int | None = None
    orbsym = None
    wfnsym = None
    max_memory: float | None = None
    sigma_method: str = "loops"
    threads: int = 0
    df: bool = False
    df_tol: float = 1e-10
    cderi = None
    device: str = "cpu"
    gpu_memory: float | None = None
    gpu_space: int | None = None
    _keys = {"e_tot", "ci", "converged", "eci", "mol", "stdout", "norb", "nelec"}

    def __init__(self, mol=None, spin: int | None = None, **options):
        super().__init__(**options)
        self.mol = mol
        self.stdout = getattr(mol, "stdout", sys.stdout)
        if mol is not None and hasattr(mol, "verbose") and "verbose" not in options:
            self.verbose = mol.verbose
        if spin is not None:
            self.spin = int(spin)
        self.e_tot = None
        self.eci = None
        self.ci = None
        self.converged = False
        self._engines: dict = {}
        self._call_max_memory = None  # the max_memory given to the running kernel call

    def copy(self) -> GUGASolver:
        """A shallow copy (PySCF's ``StreamObject.copy``; used by ``fci.addons.fix_spin_``)."""
        import copy

        return copy.copy(self)

    # --- spaces ----------------------------------------------------------------------------------
    def _budget(self) -> int:
        mm = self.max_memory if self.max_memory is not None else self._call_max_memory
        if mm is not None:
            return int(float(mm) * 1e6)
        from cuscikit.backends.memory import host_available_bytes

        return int(0.8 * host_available_bytes())

    def _twos(self, nelec) -> tuple[tuple[int, int], int]:
        (na, nb), twos = split_nelec(nelec, self.spin)
        if twos < abs(na - nb):
            raise ValueError(f"spin 2S = {twos} cannot hold n_alpha - n_beta = {na - nb}")
        return (na, nb), twos

    def _on_gpu(self) -> bool:
        dev = str(self.device)
        if dev == "cpu":
            return False
        if dev == "cuda" or dev.startswith("cuda:"):
            return True
        raise ValueError(f"device must be 'cpu' or a CUDA device ('cuda', 'cuda:0'), got {dev!r}")

    def _engine(self, norb: int, nelec):
        norb = int(norb)
        (na, nb), twos = self._twos(nelec)
        if norb > MAX_NORB:
            raise ValueError(f"norb = {norb} is beyond the supported maximum {MAX_NORB}")
        gpu = self._on_gpu()
        key = (norb, na + nb, twos, int(self.threads or 0), str(self.device), self.gpu_memory)
        key += (self.sigma_method, self.gpu_space)
        if key not in self._engines:
            drt = DRT(norb, na + nb, twos)
            n = drt.n_csf
            if gpu:
                from cuscikit.guga.gpu import GpuEngine

                cap = None if self.gpu_memory is None else int(float(self.gpu_memory) * 1e6)
                # the Davidson space (max_space + a few) stays on the device beside the buffers,
                # or its first `resident` columns do and the rest spill to pinned host memory;
                # 10 vectors more for Davidson's and the preconditioner's temporaries
                space = self.max_space + 4 * self.nroots
                resident = space if self.gpu_space is None else min(space, int(self.gpu_space))
                if resident < 0:
                    raise ValueError(f"gpu_space must be >= 0, got {self.gpu_space}")
                self._engines = {}  # the old engine's device buffers go first
                try:
                    eng = GpuEngine(drt, self.device, cap, 8 * n * (2 * resident + 10))
                except ValueError:
                    if self.gpu_space is not None:
                        raise
                    # what the budget holds beside one tile (this raises if not even that)
                    avail = GpuEngine(drt, self.device, cap, 0).budget.available()
                    resident = max(0, min(space, (avail // 2 // (8 * n) - 10) // 2))
                    eng = GpuEngine(drt, self.device, cap, 8 * n * (2 * resident + 10))
                eng.davidson_resident = None if resident >= space else resident
                self._engines = {key: eng}
                return self._engines[key]
            if n >= 2**31:
                raise ValueError(f"{n} CSFs: beyond the 2^31 - 1 supported on the CPU")
            # Davidson space (max_space + a few) and the step vectors, per CSF
            need = n * (8 * (2 * (self.max_space + 4 * self.nroots) + 4) + norb)
            budget = self._budget()
            if need > budget:
                raise ValueError(
                    f"{n:,} CSFs need about {need:,} bytes for the Davidson vectors, more than "
                    f"the {budget:,} bytes allowed (max_memory)"
                )
            eng = Engine(
                drt,
                budget=(budget - need) // 2,
                nthreads=self.threads or 0,
                method=self.sigma_method,
            )
            self._engines = {key: eng}
        return self._engines[key]

    def _check_ci(self, ci, eng: Engine) -> np.ndarray:
        c = np.asarray(ci, dtype=np.float64).reshape(-1)
        if c.size != eng.ncsf:
            raise ValueError(f"the CI vector has {c.size} entries, the CSF space {eng.ncsf}")
        return c

    # --- Hamiltonian -----------------------------------------------------------------------------
    def _operator(self, h1e, eri, norb: int):
        """(h1e, g4, h', L): g4 the 4-fold integrals, L (npair, naux) their factor or None."""
        norb = int(norb)
        if norb > MAX_NORB:
            raise ValueError(f"norb = {norb} is beyond the supported maximum {MAX_NORB}")
        h1e = np.asarray(h1e, dtype=np.float64)
        if h1e.shape != (norb, norb):
            raise ValueError(f"h1e has shape {h1e.shape}, expected ({norb}, {norb})")
        if not np.allclose(h1e, h1e.T, atol=1e-10):
            raise ValueError("h1e is not symmetric")
        L = None
        if self.cderi is not None:
            if eri is not None:
                raise ValueError("cderi is set: pass eri=None (the factor replaces the integrals)")
            L = pair_factor(self.cderi, norb)
            g4 = L @ L.T
        elif eri is None:
            raise ValueError("eri is None and no cderi is set")
        else:
            g4 = _eri4(eri, norb)
            if self.df:
                L = cholesky_pairs(g4, self.df_tol)
                g4 = L @ L.T  # the Hamiltonian solved is the factored one
        sym = pair_index(norb).reshape(norb, norb)
        # h'_pq = h_pq - 1/2 sum_r (pr|rq)
        hp = h1e - 0.5 * np.einsum("prrq->pq", g4[sym][:, :, sym])
        return h1e, g4, hp, L

    def make_hdiag(self, h1e, eri, norb: int, nelec, compress=False) -> np.ndarray:
        """<m|H|m> of every CSF (without a core energy)."""
        eng = self._engine(norb, nelec)
        h1e, g4, _, _ = self._operator(h1e, eri, norb)
        return eng.diagonal(h1e, g4)

    def absorb_h1e(self, h1e, eri, norb: int, nelec, fac: float = 1.0) -> np.ndarray:
        """PySCF's h2eff: the one-body part folded into the two-body integrals (4-fold)."""
        from cuscikit.chem.integrals import restore_eri

        na, nb = split_nelec(nelec, self.spin)[0]
        h2e = restore_eri(np.asarray(eri, dtype=np.float64), norb, 1)
        f1e = np.asarray(h1e, dtype=np.float64) - np.einsum("jiik->jk", h2e) * 0.5
        f1e = f1e * (1.0 / (na + nb + 1e-100))
        for k in range(norb):
            h2e[k, k, :, :] += f1e
            h2e[:, :, k, k] += f1e
        return restore_eri(h2e, norb, 4) * fac

    def contract_2e(self, eri, fcivec, norb: int, nelec, link_index=None, **kwargs) -> np.ndarray:
        """sum_pqrs eri[pq, rs] E_pq E_rs c for PySCF's absorbed h2eff (any packing)."""
        eng = self._engine(norb, nelec)
        c = self._check_ci(fcivec, eng)
        return eng.contract(c, _eri4(eri, norb))

    def contract_1e(self, f1e, fcivec, norb: int, nelec, link_index=None) -> np.ndarray:
        """sum_pq f1e[p, q] E_pq c (f1e symmetric)."""
        eng = self._engine(norb, nelec)
        c = self._check_ci(fcivec, eng)
        return eng.contract(c, np.zeros((eng.npair, eng.npair)), _pack(np.asarray(f1e)))

    def contract_ss(self, fcivec, norb: int, nelec) -> np.ndarray:
        """S^2 c = S(S+1) c: every CSF of the space has the same spin."""
        s = 0.5 * self._twos(nelec)[1]
        return s * (s + 1) * np.asarray(fcivec, dtype=np.float64)

    def _hop(self, h1e, eri, norb: int, nelec):
        _, g4, hp, L = self._operator(h1e, eri, norb)  # validates before any table is built
        eng = self._engine(norb, nelec)
        # dense: g = 1/2 T (pq|rs), one GEMM; factored: g = (T L)(1/2 L^T), two thinner ones
        V = 0.5 * g4 if L is None else (L, np.ascontiguousarray(0.5 * L.T))
        h = _pack(hp)
        if self._on_gpu():
            Vh = eng.operator(V, h)

            def on_device(X):
                if X.ndim == 1:
                    return eng.sigma(X, Vh)
                return eng.torch.stack([eng.sigma(X[:, k], Vh) for k in range(X.shape[1])], 1)

            # not recursive: a closure that refers to itself is a reference cycle, which would
            # keep the engine's device buffers alive until the garbage collector runs
            def matvec_gpu(X):
                if not eng.torch.is_tensor(X):  # host in, host out
                    return on_device(eng._dev(np.asarray(X))).cpu().numpy()
                return on_device(X)

            matvec_gpu.g4, matvec_gpu.V, matvec_gpu.h = g4, V, h
            return eng, matvec_gpu

        def matvec(X):
            X = np.asarray(X, dtype=np.float64)
            if X.ndim == 1:
                return eng.contract(X, V, h)
            if X.shape[1] == 1:  # the Davidson step of one root: no stacked copy
                return eng.contract(X[:, 0], V, h)[:, None]
            return np.stack([eng.contract(X[:, k], V, h) for k in range(X.shape[1])], axis=1)

        def into(X, out):  # one column into a given one (the Davidson's storage)
            eng.contract(np.asarray(X, dtype=np.float64)[:, 0], V, h, out=out[:, 0])

        matvec.g4, matvec.V, matvec.h, matvec.into = g4, V, h, into
        return eng, matvec

    def energy(self, h1e, eri, fcivec, norb: int, nelec) -> float:
        """<c|H|c> / <c|c> without a core energy."""
        eng, matvec = self._hop(h1e, eri, norb, nelec)
        c = self._check_ci(fcivec, eng)
        return float(c @ matvec(c) / (c @ c))

    # --- kernel ----------------------------------------------------------------------------------
    def kernel(
        self,
        h1e,
        eri,
        norb: int,
        nelec,
        ci0=None,
        tol=None,
        lindep=None,
        max_cycle=None,
        max_space=None,
        nroots=None,
        davidson_only=None,
        pspace_size=None,
        orbsym=None,
        wfnsym=None,
        ecore: float = 0.0,
        **kwargs,
    ):
        """Lowest roots of H = h1e + eri + ecore in the CSFs of spin S.

        Args:
            h1e: (norb, norb) symmetric one-electron integrals.
            eri: two-electron integrals (chemists' notation), full or 4/8-fold packed; not
                modified. None when the ``cderi`` option holds a factor of them.
            norb: active orbitals.
            nelec: (n_alpha, n_beta) or a total count; 2S = the ``spin`` option or
                n_alpha - n_beta.
            ci0: a guess vector or a list of them (CSF basis), or None.
            tol, lindep, max_cycle, max_space, nroots, davidson_only, pspace_size: override the
                options for this call.
            orbsym, wfnsym: override the options for this call (see the class).
            ecore: a constant added to every energy.
            **kwargs: PySCF's extra keywords: ``max_memory`` (MB) is the budget when the
                ``max_memory`` option is unset; others (``verbose``) are accepted and ignored.

        Returns:
            (e, ci): a float and a vector for one root; an array and a list for several.
        """
        self.check_sanity()
        log = new_logger(self)
        nroots = int(self.nroots if nroots is None else nroots)
        tol = float(self.conv_tol if tol is None else tol)
        max_cycle = int(self.max_cycle if max_cycle is None else max_cycle)
        max_space = int(self.max_space if max_space is None else max_space)
        davidson_only = self.davidson_only if davidson_only is None else davidson_only
        pspace_size = int(self.pspace_size if pspace_size is None else pspace_size)
        if not math.isfinite(float(ecore)):
            raise ValueError(f"ecore must be finite, got {ecore}")
        twos = self._twos(nelec)[1]
        ss_value = getattr(self, "ss_value", None)  # set by PySCF's fix_spin_
        if ss_value is not None and abs(ss_value - 0.25 * twos * (twos + 2)) > 1e-8:
            raise ValueError(
                f"fix_spin_ asks for <S^2> = {ss_value}, but this CSF space has S(S+1) = "
                f"{0.25 * twos * (twos + 2)}; set GUGASolver(spin=2S) instead"
            )
        gpu = self._on_gpu()
        if gpu and (self.wfnsym if wfnsym is None else wfnsym) is not None:
            raise ValueError("wfnsym restricts the roots on the CPU only: use device='cpu'")
        self._call_max_memory = kwargs.get("max_memory")
        try:
            eng, matvec = self._hop(h1e, eri, norb, nelec)
        finally:
            self._call_max_memory = None
        op_vh = (matvec.V, matvec.h)  # the operator of the sigma, for the P space
        h1 = np.asarray(h1e, dtype=np.float64)
        hdiag = eng.diagonal_device(h1, matvec.g4) if gpu else eng.diagonal(h1, matvec.g4)
        # wfnsym: the CSFs of that irrep only (H does not couple irreps; PySCF's casci_symm
        # sets orbsym and wfnsym on the fcisolver). Without wfnsym every irrep is searched.
        sub = self._irrep_subspace(eng, norb, orbsym, wfnsym)
        ncsf = eng.ncsf
        if sub is not None:
            matvec = _restricted(matvec, sub, ncsf)
            hdiag = hdiag[sub]
        n = len(hdiag)
        if not 1 <= nroots <= n:
            raise ValueError(f"nroots must be in 1..{n}, got {nroots}")
        guess = self._guess(ci0, ncsf, nroots)
        if guess is not None and sub is not None:
            guess = guess[sub]
        if n <= max(pspace_size, nroots) and guess is None and not davidson_only:
            H = matvec(np.eye(n))
            w, v = np.linalg.eigh(0.5 * (H + H.T))
            e, vecs, conv = w[:nroots], v[:, :nroots], [True] * nroots
        else:
            from cuscikit.linalg.davidson import davidson

            resid = self.conv_tol_residual or math.sqrt(tol)
            pre = None
            if self.precond not in ("pspace", "diagonal"):
                raise ValueError(f"precond must be 'pspace' or 'diagonal', got {self.precond!r}")
            psize = max(pspace_size, nroots)
            grow = int(self.pspace_grow or 0)
            if grow > 0 and not gpu and n > grow:  # a bigger P space saves sigma vectors there
                psize = max(psize, min(4 * pspace_size, int(pspace_size * math.sqrt(n / grow))))
            if self.precond == "pspace" and 0 < psize < n:
                pre = self._pspace(eng, op_vh, hdiag, sub, psize)
            if guess is None:
                guess = _start_vectors(hdiag, n, nroots, pre, psize)
            if not gpu:
                _release_free_heap()
            # handed over, not kept here: the Davidson drops the start block once it is in V
            start, guess = [guess], None
            # on the host the Davidson's products (a few vectors against the subspace) run on
            # one BLAS thread: numpy's OpenBLAS threads spin after each call and took the cores
            # from the sigma that follows (N2 CAS(12,12) triplet, 2 threads: solve 3.5 -> 2.6
            # CPU s, the sigma 2.6 -> 2.2 of it)
            from contextlib import nullcontext

            from cuscikit.guga.sigma import _OneThreadBlas

            with nullcontext() if gpu else _OneThreadBlas():
                res = davidson(
                    matvec,
                    hdiag,
                    nroots,
                    tol=tol,
                    residual_tol=resid,
                    max_iter=max_cycle,
                    max_space=max(max_space + 4 * (nroots - 1), 2 * nroots + 2),
                    guess=start.pop(),
                    precond=pre,
                    resident=getattr(eng, "davidson_resident", None) if gpu else None,
                )
            e, vecs = res.energies, res.vectors
            if gpu:
                vecs = vecs.cpu().numpy()
            conv = [bool(res.converged)] * nroots
            if not res.converged:
                log.warn("GUGASolver: Davidson not converged after %d cycles", res.iterations)
        e = np.asarray(e, dtype=np.float64) + float(ecore)
        vecs = vecs / np.linalg.norm(vecs, axis=0)
        if sub is not None:
            full = np.zeros((ncsf, vecs.shape[1]))
            full[sub] = vecs
            vecs = full
        self.norb, self.nelec = int(norb), nelec
        if nroots == 1:
            self.e_tot, self.ci, self.converged = float(e[0]), vecs[:, 0].copy(), conv[0]
        else:
            self.e_tot = e
            self.ci = [vecs[:, k].copy() for k in range(nroots)]
            self.converged = conv
        self.eci = self.e_tot
        log.info("GUGASolver: %d CSFs (2S = %d), E = %s", n, self._twos(nelec)[1], self.e_tot)
        return self.e_tot, self.ci

    def _pspace(self, eng, op_vh, hdiag, sub, size: int):
        """The P-space start vectors and preconditioner over the `size` CSFs of lowest
        diagonal (indices into hdiag, which covers `sub` when that is set)."""
        from cuscikit.guga.pspace import PSpacePreconditioner, pspace_hamiltonian

        if isinstance(hdiag, np.ndarray):
            idx = _lowest(hdiag, size)
            d = hdiag[idx]
        else:
            import torch

            idx_t = torch.argsort(hdiag, stable=True)[:size]
            idx, d = idx_t.cpu().numpy(), hdiag[idx_t].cpu().numpy()
        csfs = idx if sub is None else np.asarray(sub)[idx]
        H = pspace_hamiltonian(eng.drt, csfs, *op_vh, diag=d)
        pre = PSpacePreconditioner(hdiag, idx, H, overwrite_h=True)  # keeps H's eigenpairs only
        del H
        pre.shift = float(self.level_shift)
        pre.overwrite_r = True  # the Davidson does not read its residuals after the correction
        if sub is None and isinstance(hdiag, np.ndarray):  # one vector for both: never at once
            pre.work = eng.scratch()
        return pre

    def _irrep_subspace(self, eng: Engine, norb: int, orbsym, wfnsym):
        """Indices of the CSFs of irrep `wfnsym` (None: no restriction)."""
        orbsym = self.orbsym if orbsym is None else orbsym
        wfnsym = self.wfnsym if wfnsym is None else wfnsym
        if wfnsym is None:
            return None
        if orbsym is None:
            raise ValueError("wfnsym is set but orbsym is not: give the irrep of each orbital")
        orbsym = np.asarray(orbsym)
        if orbsym.shape != (norb,) or not np.issubdtype(orbsym.dtype, np.integer):
            raise ValueError(f"orbsym must hold {norb} integer irrep ids, got {orbsym!r}")
        if isinstance(wfnsym, str):
            group = getattr(self.mol, "groupname", None)
            if group is None:
                raise ValueError(f"wfnsym {wfnsym!r} is a name: give GUGASolver(mol) or an id")
            from pyscf import symm

            wfnsym = symm.irrep_name2id(group, wfnsym)
        # abelian ids (PySCF's D2h convention) multiply by XOR; linear groups' ids reduce to
        # their D2h subgroup (id % 10), as in PySCF's direct_spin1_symm
        orbsym = orbsym.astype(np.int64) % 10
        target = int(wfnsym) % 10
        single = (eng.steps == 1) | (eng.steps == 2)
        irrep = np.bitwise_xor.reduce(np.where(single, orbsym[None, :], 0), axis=1)
        sub = np.flatnonzero(irrep == target)
        if sub.size == 0:
            raise ValueError(f"no CSF of this space has irrep {wfnsym} (orbsym {orbsym.tolist()})")
        return sub

    @staticmethod
    def _guess(ci0, n: int, nroots: int):
        if ci0 is None:
            return None
        if isinstance(ci0, np.ndarray) and ci0.size == n:
            vecs = [ci0.reshape(-1)]
        elif isinstance(ci0, (list, tuple)):
            vecs = [np.asarray(x).reshape(-1) for x in ci0 if np.asarray(x).size == n]
        else:
            return None
        if not vecs:
            return None
        G = np.stack(vecs, axis=1).astype(np.float64)
        if G.shape[1] < nroots:
            rng = np.random.default_rng(7)
            G = np.hstack([G, rng.standard_normal((n, nroots - G.shape[1]))])
        return G

    # --- density matrices ------------------------------------------------------------------------
    def _rdm12(self, bra, ket, norb: int, nelec):
        eng = self._engine(norb, nelec)
        b, k = self._check_ci(bra, eng), self._check_ci(ket, eng)
        d1, M = eng.generator_products(b, k)
        n = norb
        dm1 = d1.T.copy()  # dm1[p, q] = <bra|E_qp|ket>
        dm2 = M.reshape(n, n, n, n).transpose(1, 0, 2, 3).copy()  # <E_pq E_rs>
        for q in range(n):
            dm2[:, q, q, :] -= dm1.T  # - delta_qr <E_ps> = - dm1[s, p]
        return dm1, dm2

    def make_rdm1(self, fcivec, norb: int, nelec, link_index=None) -> np.ndarray:
        """Spin-traced dm1[p, q] = <E_qp>."""
        eng = self._engine(norb, nelec)
        c = self._check_ci(fcivec, eng)
        return eng.generator_products(c, c)[0].T.copy()

    def make_rdm12(self, fcivec, norb: int, nelec, link_index=None, reorder: bool = True):
        """(dm1, dm2) spin-traced, dm2[p, q, r, s] = <E_pq E_rs> - delta_qr <E_ps>."""
        return self._rdm12(fcivec, fcivec, norb, nelec)

    def trans_rdm1(self, cibra, ciket, norb: int, nelec, link_index=None) -> np.ndarray:
        """dm1[p, q] = <bra|E_qp|ket>."""
        eng = self._engine(norb, nelec)
        b, k = self._check_ci(cibra, eng), self._check_ci(ciket, eng)
        return eng.generator_products(b, k)[0].T.copy()

    def trans_rdm12(self, cibra, ciket, norb: int, nelec, link_index=None, reorder=True):
        """(dm1, dm2) between two states, PySCF's conventions."""
        return self._rdm12(cibra, ciket, norb, nelec)

    def make_rdm1s(self, fcivec, norb: int, nelec, link_index=None):
        """(dm1_alpha, dm1_beta) at M = (n_alpha - n_beta) / 2 (Wigner-Eckart from dm1, dm2)."""
        (na, nb), twos = self._twos(nelec)
        dm1, dm2 = self.make_rdm12(fcivec, norb, nelec)
        if twos == 0:
            return 0.5 * dm1, 0.5 * dm1
        s = 0.5 * twos
        m = 0.5 * (na - nb)
        N = na + nb
        Q = m / (2 * s * (s + 1)) * ((4 - N) * dm1 - 2 * np.einsum("rpqr->pq", dm2))
        return 0.5 * (dm1 + Q), 0.5 * (dm1 - Q)

    def spin_square(self, fcivec, norb: int, nelec) -> tuple[float, float]:
        """(<S^2>, 2S + 1): exact in a CSF basis."""
        s = 0.5 * self._twos(nelec)[1]
        return s * (s + 1), 2 * s + 1

    def large_ci(self, fcivec, norb: int, nelec, tol: float = 0.1, return_strs: bool = True):
        """[(coefficient, step string '0ud2', '')] of the CSFs with |c| >= tol."""
        eng = self._engine(norb, nelec)
        c = self._check_ci(fcivec, eng)
        idx = np.flatnonzero(np.abs(c) >= tol)
        idx = idx[np.argsort(-np.abs(c[idx]))]
        return [(float(c[i]), "".join("0ud2"[d] for d in eng.steps[i]), "") for i in idx]
