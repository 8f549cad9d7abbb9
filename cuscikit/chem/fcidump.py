"""FCIDUMP reading and writing, and 1/4/8-fold ERI packing, in pure numpy.

The FCIDUMP format (Knowles & Handy) holds a Fortran namelist header followed by one integral
per line ``value i j k l`` (1-based orbital indices, chemists' notation):

* ``i j k l`` all non-zero: two-electron integral ``(ij|kl)``
* ``i j 0 0``: one-electron integral ``h_ij``
* ``0 0 0 0``: core energy (nuclear repulsion plus frozen core)
* ``i 0 0 0``: orbital energy (Molpro writes these; read and ignored)

Only one of the eight symmetry-equivalent index orders needs to appear in the file; the reader
fills in the others. PySCF's ``tools.fcidump`` and the Molpro/Psi4 writers are the models.
Nothing here imports PySCF.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cuscikit.chem.integrals import eri_pair_index, n_pairs, restore_eri

__all__ = [
    "FCIDump",
    "FCIDumpError",
    "read_fcidump",
    "write_fcidump",
    "restore_eri",
    "eri_pair_index",
]

_GZIP_MAGIC = b"\x1f\x8b"
# Integral tolerance for two listings of the same (symmetry-equivalent) integral to agree.
_DUPLICATE_TOL = 1e-8


class FCIDumpError(ValueError):
    """A malformed or inconsistent FCIDUMP file; the message names the file and the problem."""


# --------------------------------------------------------------------------------------------
# ERI packing
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# Data object
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FCIDump:
    """The contents of an FCIDUMP file.

    Attributes:
        norb: number of spatial orbitals.
        nelec: total number of electrons.
        ms2: 2*S_z (n_alpha - n_beta).
        h1e: ``(norb, norb)`` symmetric one-electron integrals.
        eri: two-electron integrals, 8-fold packed (``pyscf.ao2mo.restore(8, ...)`` layout).
        e_core: constant energy (nuclear repulsion plus frozen-core energy).
        orbsym: orbital irreps as written in the file, or None when the file has no ORBSYM.
        isym: target state irrep (``ISYM``; 1 when absent).
    """

    norb: int
    nelec: int
    ms2: int
    h1e: np.ndarray
    eri: np.ndarray
    e_core: float
    orbsym: tuple[int, ...] | None = None
    isym: int = 1

    @property
    def nelec_ab(self) -> tuple[int, int]:
        """``(n_alpha, n_beta)`` from NELEC and MS2."""
        return (self.nelec + self.ms2) // 2, (self.nelec - self.ms2) // 2

    def eri_full(self) -> np.ndarray:
        """The two-electron integrals as a full ``(norb,)*4`` array."""
        return restore_eri(self.eri, self.norb, 1)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------

_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eEdD][+-]?\d+)?"
_INT = r"[+-]?\d+"
_LINE_RE = re.compile(
    rf"^[ \t]*({_NUM})[ \t,]+({_INT})[ \t,]+({_INT})[ \t,]+({_INT})[ \t,]+({_INT})[ \t,]*$"
)
_HEADER_START_RE = re.compile(r"^\s*[&$]FCI\b", re.IGNORECASE)
_HEADER_END_RE = re.compile(r"[&$]END\b|/", re.IGNORECASE)
_KEY_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=")
_INT_RE = re.compile(rf"^{_INT}$")
_NONFINITE_RE = re.compile(r"^[+-]?(nan|inf|infinity)$", re.IGNORECASE)
_INT_KEYS = ("NORB", "NELEC", "MS2", "ISYM", "IUHF", "IPUHF")


def _load_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise FCIDumpError(f"{path}: cannot read FCIDUMP file ({exc})") from exc
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise FCIDumpError(
                f"{path}: corrupt or truncated gzip stream ({type(exc).__name__}: {exc})"
            ) from exc
    elif path.suffix == ".gz" and raw.strip():
        raise FCIDumpError(f"{path}: name ends in .gz but the content is not gzip data")
    if not raw.strip():
        raise FCIDumpError(f"{path}: empty FCIDUMP file")
    if b"\x00" in raw:
        raise FCIDumpError(f"{path}: binary data (NUL bytes) in FCIDUMP text")
    # latin-1 never fails to decode; stray bytes then fail the strict number grammar below.
    return raw.decode("latin-1")


def _parse_float(tok: str, where: str) -> float:
    if _NONFINITE_RE.match(tok):
        raise FCIDumpError(f"{where}: NaN/inf value {tok!r}")
    if not re.fullmatch(_NUM, tok):
        raise FCIDumpError(f"{where}: non-numeric value {tok!r}")
    val = float(tok.replace("D", "E").replace("d", "e"))
    if not math.isfinite(val):
        raise FCIDumpError(f"{where}: value {tok!r} overflows to inf")
    return val


def _parse_int_list(key: str, text: str, where: str) -> list[int]:
    out: list[int] = []
    for tok in re.split(r"[\s,]+", text.strip().strip(",")):
        if not tok:
            continue
        count = 1
        if "*" in tok:  # Fortran repeat count, e.g. ORBSYM=4*1
            rep, _, tok = tok.partition("*")
            if not rep.isdigit():
                raise FCIDumpError(f"{where}: bad repeat count in {key}={text.strip()!r}")
            count = int(rep)
        if not _INT_RE.match(tok):
            raise FCIDumpError(f"{where}: non-integer value {tok!r} for {key}")
        out.extend([int(tok)] * count)
    return out


def _parse_header(text: str, where: str) -> tuple[dict, int]:
    """Parse the namelist; return (keys, offset of the first character after the terminator)."""
    m = _HEADER_START_RE.match(text)
    if not m:
        first = text.strip().splitlines()[0][:40] if text.strip() else ""
        raise FCIDumpError(f"{where}: missing &FCI namelist header (file starts with {first!r})")
    end = _HEADER_END_RE.search(text, m.end())
    if not end:
        raise FCIDumpError(f"{where}: &FCI namelist is not terminated by &END or /")
    body = text[m.end() : end.start()]
    keys = list(_KEY_RE.finditer(body))
    lead = body[: keys[0].start()] if keys else body
    if lead.strip(" \t\r\n,"):
        raise FCIDumpError(f"{where}: garbled &FCI namelist near {lead.strip()[:40]!r}")
    header: dict = {}
    for n, km in enumerate(keys):
        key = km.group(1).upper()
        stop = keys[n + 1].start() if n + 1 < len(keys) else len(body)
        val = body[km.end() : stop]
        if key in header:
            raise FCIDumpError(f"{where}: key {key} given twice in the &FCI namelist")
        if key in _INT_KEYS:
            vals = _parse_int_list(key, val, where)
            if len(vals) != 1:
                raise FCIDumpError(f"{where}: {key} needs one integer, got {val.strip()!r}")
            header[key] = vals[0]
        elif key == "ORBSYM":
            header[key] = _parse_int_list(key, val, where)
        else:
            header[key] = val.strip().strip(",").strip()
    return header, end.end()


def _validate_header(h: dict, where: str) -> tuple[int, int, int, tuple[int, ...] | None, int]:
    for key in ("NORB", "NELEC"):
        if key not in h:
            raise FCIDumpError(f"{where}: {key} missing from the &FCI namelist")
    norb, nelec = h["NORB"], h["NELEC"]
    if norb < 1:
        raise FCIDumpError(f"{where}: NORB={norb} must be a positive integer")
    if nelec < 0:
        raise FCIDumpError(f"{where}: NELEC={nelec} is negative")
    if nelec > 2 * norb:
        raise FCIDumpError(f"{where}: NELEC={nelec} exceeds 2*NORB={2 * norb}")
    ms2 = h.get("MS2", nelec % 2)
    if abs(ms2) > nelec:
        raise FCIDumpError(f"{where}: |MS2|={abs(ms2)} exceeds NELEC={nelec}")
    if (nelec - ms2) % 2:
        raise FCIDumpError(f"{where}: MS2={ms2} inconsistent with NELEC={nelec} parity")
    if (nelec + abs(ms2)) // 2 > norb:
        raise FCIDumpError(
            f"{where}: NELEC={nelec}, MS2={ms2} puts {(nelec + abs(ms2)) // 2} electrons of one "
            f"spin in NORB={norb} orbitals"
        )
    uhf = str(h.get("UHF", ".FALSE.")).upper().strip(".")
    if uhf in ("TRUE", "T") or h.get("IUHF", 0):
        raise FCIDumpError(f"{where}: unrestricted (UHF) FCIDUMP files are not supported")
    orbsym = h.get("ORBSYM")
    if orbsym is not None:
        if len(orbsym) != norb:
            raise FCIDumpError(f"{where}: ORBSYM has {len(orbsym)} entries, NORB={norb}")
        if min(orbsym) < 0:
            raise FCIDumpError(f"{where}: negative irrep in ORBSYM")
        orbsym = tuple(orbsym)
    isym = h.get("ISYM", 1)
    if isym < 0:
        raise FCIDumpError(f"{where}: ISYM={isym} is negative")
    return norb, nelec, ms2, orbsym, isym


def _diagnose_line(line: str, where: str, norb: int) -> FCIDumpError:
    toks = line.replace(",", " ").split()
    if len(toks) != 5:
        return FCIDumpError(f"{where}: expected 'value i j k l' (5 fields), got {len(toks)}")
    _parse_float(toks[0], where)
    for t in toks[1:]:
        if not _INT_RE.match(t):
            if _NONFINITE_RE.match(t) or re.fullmatch(_NUM, t):
                return FCIDumpError(f"{where}: orbital index {t!r} is not an integer")
            return FCIDumpError(f"{where}: non-numeric orbital index {t!r}")
    return FCIDumpError(f"{where}: cannot parse integral line {line.strip()[:60]!r}")


def read_fcidump(path: str | os.PathLike, max_bytes: int = 4 << 30) -> FCIDump:
    """Read an FCIDUMP file, plain text or gzip (detected from the magic bytes).

    Accepts the PySCF, Molpro and Psi4 dialects: ``&END``, ``$END`` or ``/`` terminators, keys
    in any case and spread over several lines, Fortran ``D`` exponents, ``n*v`` repeats in
    ORBSYM. Any one of the 8 equivalent index orders of an integral may be listed; listing
    several is allowed if their values agree.

    Args:
        path: file to read.
        max_bytes: refuse files whose packed ERI array would exceed this size (guards against
            a corrupt NORB allocating all memory); default 4 GiB (NORB up to about 230).

    Returns:
        An :class:`FCIDump` with 8-fold packed ERIs and a symmetric ``h1e``.

    Raises:
        FCIDumpError: the file is missing, empty, not valid gzip, or malformed; the message
            names the file, the line (where relevant) and the problem.

    Example:
        >>> d = read_fcidump("datasets/lih_sto3g.fcidump.gz")  # doctest: +SKIP
        >>> d.norb, d.nelec
        (6, 4)
    """
    path = Path(path)
    text = _load_text(path)
    header, body_start = _parse_header(text, str(path))
    norb, nelec, ms2, orbsym, isym = _validate_header(header, str(path))
    need = 8 * n_pairs(n_pairs(norb))
    if need > max_bytes:
        raise FCIDumpError(
            f"{path}: NORB={norb} needs {need / 2**30:.1f} GiB for the packed two-electron "
            f"integrals, more than max_bytes={max_bytes / 2**30:.1f} GiB"
        )

    rest = text[body_start:]
    first_nl = rest.find("\n")
    tail = rest if first_nl < 0 else rest[:first_nl]
    if tail.strip():
        raise FCIDumpError(
            f"{path}: unexpected text {tail.strip()[:40]!r} after the namelist terminator"
        )
    line0 = text.count("\n", 0, body_start) + 2  # 1-based number of the first body line
    lines = [] if first_nl < 0 else rest[first_nl + 1 :].split("\n")

    vals: list[float] = []
    idx: list[tuple[int, int, int, int]] = []
    linenos: list[int] = []
    for n, line in enumerate(lines):
        m = _LINE_RE.match(line.rstrip("\r"))
        if m is None:
            if not line.strip():
                continue
            raise _diagnose_line(line, f"{path}:{line0 + n}", norb)
        where = f"{path}:{line0 + n}"
        v, i, j, k, ll = m.groups()
        vals.append(_parse_float(v, where))
        idx.append((int(i), int(j), int(k), int(ll)))
        linenos.append(line0 + n)

    if not vals:
        raise FCIDumpError(f"{path}: no integrals after the &FCI namelist (truncated file?)")
    v_arr = np.array(vals, dtype=np.float64)
    ijkl = np.array(idx, dtype=np.int64).reshape(-1, 4)
    ln_arr = np.array(linenos, dtype=np.int64)

    bad = np.nonzero(((ijkl < 0) | (ijkl > norb)).any(axis=1))[0]
    if bad.size:
        b = bad[0]
        raise FCIDumpError(
            f"{path}:{ln_arr[b]}: integral index {tuple(ijkl[b].tolist())} out of range "
            f"0..NORB={norb}"
        )
    nz = ijkl != 0
    is_eri = nz.all(axis=1)
    is_h1 = nz[:, 0] & nz[:, 1] & ~nz[:, 2] & ~nz[:, 3]
    is_core = ~nz.any(axis=1)
    is_orbe = nz[:, 0] & ~nz[:, 1:].any(axis=1)  # Molpro orbital energies, ignored
    bad = np.nonzero(~(is_eri | is_h1 | is_core | is_orbe))[0]
    if bad.size:
        b = bad[0]
        raise FCIDumpError(
            f"{path}:{ln_arr[b]}: invalid index pattern {tuple(ijkl[b].tolist())} (expected "
            "i j k l, i j 0 0, i 0 0 0 or 0 0 0 0)"
        )

    npair = n_pairs(norb)
    g = ijkl - 1
    ij = np.maximum(g[:, 0], g[:, 1]) * (np.maximum(g[:, 0], g[:, 1]) + 1) // 2 + np.minimum(
        g[:, 0], g[:, 1]
    )
    kl = np.maximum(g[:, 2], g[:, 3]) * (np.maximum(g[:, 2], g[:, 3]) + 1) // 2 + np.minimum(
        g[:, 2], g[:, 3]
    )
    hi, lo = np.maximum(ij, kl), np.minimum(ij, kl)
    eri_pos = hi * (hi + 1) // 2 + lo
    eri = np.zeros(n_pairs(npair), dtype=np.float64)
    _scatter_checked(eri, eri_pos[is_eri], v_arr[is_eri], ln_arr[is_eri], path, "(ij|kl)")

    h1 = np.zeros(npair, dtype=np.float64)
    _scatter_checked(h1, ij[is_h1], v_arr[is_h1], ln_arr[is_h1], path, "h_ij")
    h1e = h1[eri_pair_index(norb)]

    core = v_arr[is_core]
    if core.size > 1 and np.ptp(core) > _DUPLICATE_TOL:
        raise FCIDumpError(f"{path}: conflicting core energies (0 0 0 0 lines) {core[:2]}")
    e_core = float(core[0]) if core.size else 0.0
    return FCIDump(norb, nelec, ms2, h1e, eri, e_core, orbsym, isym)


def _scatter_checked(
    out: np.ndarray, pos: np.ndarray, val: np.ndarray, lines: np.ndarray, path: Path, what: str
) -> None:
    """out[pos] = val, raising when one position receives values that disagree."""
    if pos.size == 0:
        return
    order = np.argsort(pos, kind="stable")
    ps, vs = pos[order], val[order]
    same = ps[1:] == ps[:-1]
    if same.any():
        diff = np.abs(vs[1:] - vs[:-1]) > _DUPLICATE_TOL * np.maximum(1.0, np.abs(vs[1:]))
        clash = np.nonzero(same & diff)[0]
        if clash.size:
            c = clash[0]
            raise FCIDumpError(
                f"{path}:{lines[order][c + 1]}: {what} conflicts with the symmetry-equivalent "
                f"entry on line {lines[order][c]} ({float(vs[c])!r} vs {float(vs[c + 1])!r})"
            )
    out[ps] = vs


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def write_fcidump(
    path: str | os.PathLike,
    h1e: np.ndarray,
    eri: np.ndarray,
    nelec: int | tuple[int, int],
    ms2: int = 0,
    e_core: float = 0.0,
    orbsym: tuple[int, ...] | list[int] | None = None,
    tol: float = 1e-15,
    isym: int = 1,
) -> None:
    """Write integrals as a PySCF-compatible FCIDUMP (gzip when ``path`` ends in ``.gz``).

    Values are written with Python's shortest round-trip representation, so reading the file
    back gives the same doubles bit for bit. Each unique integral is written once (``i >= j``,
    ``k >= l``, ``ij >= kl``), two-electron integrals first, then ``h1e``, then the core energy,
    as PySCF does.

    Args:
        path: output file; ``.gz`` suffix -> gzip (deterministic: no timestamp).
        h1e: ``(norb, norb)`` symmetric one-electron integrals.
        eri: two-electron integrals, full ``(n,n,n,n)``, 4-fold or 8-fold packed.
        nelec: number of electrons, or ``(n_alpha, n_beta)`` (then ``ms2`` is taken from it).
        ms2: 2*S_z.
        e_core: constant energy.
        orbsym: orbital irreps to write as ORBSYM (default: all 1).
        tol: integrals with ``|value| <= tol`` are omitted.
        isym: state irrep written as ISYM.

    Returns:
        None.

    Example:
        >>> import numpy as np, tempfile, os
        >>> h = np.diag([-1.0, -0.5]); g = np.zeros((2, 2, 2, 2)); g[0, 0, 0, 0] = 0.6
        >>> p = os.path.join(tempfile.mkdtemp(), "FCIDUMP")
        >>> write_fcidump(p, h, g, 2)
        >>> read_fcidump(p).h1e[0, 0]
        -1.0
    """
    h1e = np.asarray(h1e, dtype=np.float64)
    if h1e.ndim != 2 or h1e.shape[0] != h1e.shape[1]:
        raise ValueError(f"h1e must be square, got shape {h1e.shape}")
    norb = h1e.shape[0]
    if isinstance(nelec, (tuple, list)):
        na, nb = (int(x) for x in nelec)
        nelec, ms2 = na + nb, na - nb
    nelec = int(nelec)
    if nelec < 0 or nelec > 2 * norb or abs(ms2) > nelec or (nelec - ms2) % 2:
        raise ValueError(f"inconsistent nelec={nelec}, ms2={ms2} for norb={norb}")
    if not np.allclose(h1e, h1e.T, atol=1e-10):
        raise ValueError("h1e is not symmetric")
    if orbsym is not None and len(orbsym) != norb:
        raise ValueError(f"orbsym has {len(orbsym)} entries, norb={norb}")
    if not math.isfinite(e_core) or not np.isfinite(h1e).all():
        raise ValueError("non-finite value in h1e or e_core")
    eri8 = restore_eri(eri, norb, 8)
    if not np.isfinite(eri8).all():
        raise ValueError("non-finite value in eri")

    npair = n_pairs(norb)
    ti, tj = np.tril_indices(norb)  # pair p -> (i, j), i >= j, in packed order
    pi, pj = np.tril_indices(npair)  # 8-fold entry -> (ij, kl), ij >= kl
    keep = np.abs(eri8) > tol
    pi, pj, ev = pi[keep], pj[keep], eri8[keep]

    buf = io.StringIO()
    sym = ",".join(str(int(s)) for s in orbsym) if orbsym is not None else "1," * norb
    buf.write(f" &FCI NORB={norb:4d},NELEC={nelec:2d},MS2={int(ms2)},\n")
    buf.write(f"  ORBSYM={sym.rstrip(',')},\n  ISYM={int(isym)},\n &END\n")
    rows = zip(
        ev.tolist(),
        (ti[pi] + 1).tolist(),
        (tj[pi] + 1).tolist(),
        (ti[pj] + 1).tolist(),
        (tj[pj] + 1).tolist(),
        strict=True,
    )
    buf.write("".join(f" {v!r} {i:4d} {j:4d} {k:4d} {ll:4d}\n" for v, i, j, k, ll in rows))
    hv = h1e[ti, tj]
    keep = np.abs(hv) > tol
    rows1 = zip(hv[keep].tolist(), (ti[keep] + 1).tolist(), (tj[keep] + 1).tolist(), strict=True)
    buf.write("".join(f" {v!r} {i:4d} {j:4d}    0    0\n" for v, i, j in rows1))
    buf.write(f" {float(e_core)!r}    0    0    0    0\n")

    data = buf.getvalue().encode("ascii")
    path = Path(path)
    if path.suffix == ".gz":
        with (
            open(path, "wb") as raw,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as gz,
        ):
            gz.write(data)
    else:
        path.write_bytes(data)
