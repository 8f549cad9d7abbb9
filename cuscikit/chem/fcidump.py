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
import itertools
import math
import os
import re
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cuscikit.chem.integrals import (
    MAX_ABS_INTEGRAL,
    MAX_ORBITALS,
    IntegralError,
    check_integral_value,
    conflict_message,
    eri_pair_index,
    n_pairs,
    restore_eri,
    validate_integrals,
    values_agree,
)

__all__ = [
    "FCIDump",
    "FCIDumpError",
    "FCIDumpWarning",
    "check_symmetry_labels",
    "read_fcidump",
    "write_fcidump",
    "restore_eri",
    "eri_pair_index",
]

_GZIP_MAGIC = b"\x1f\x8b"


class FCIDumpError(ValueError):
    """A malformed or inconsistent FCIDUMP file; the message names the file and the problem."""


class FCIDumpWarning(UserWarning):
    """A readable FCIDUMP that looks incomplete (no core energy, no one-electron integrals)."""


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

MAX_HEADER_BYTES = 64 << 10
"""The &FCI namelist (with any blank lines before it) must end within this many bytes; a
128-orbital header with ORBSYM takes well under 2 KiB."""

MAX_LINE_BYTES = 4096
"""The longest line accepted; an integral line takes under 100 characters in every dialect."""

_BLOCK_BYTES = 1 << 18  # the reader holds one block of text (plus one partial line) at a time
_MAX_INT_DIGITS = 18  # header integers and repeat counts: more digits is no count we can use

# Numbers: one grammar, each character consumed by exactly one part, so a failing match costs
# time linear in the line (the line is also bounded by MAX_LINE_BYTES).
_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eEdD][+-]?\d+)?"
_INT = r"[+-]?\d+"
_SEP = r"[ \t,]+"
_LINE_RE = re.compile(
    rf"[ \t]*({_NUM}){_SEP}({_INT}){_SEP}({_INT}){_SEP}({_INT}){_SEP}({_INT})[ \t,]*\r?".encode()
)
_NUM_RE = re.compile(_NUM)
_HEADER_START_RE = re.compile(r"^\s*[&$]FCI\b", re.IGNORECASE)
_HEADER_END_RE = re.compile(r"[&$]END\b|/", re.IGNORECASE)
_KEY_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=")
_INT_RE = re.compile(_INT)
_NONFINITE_RE = re.compile(r"[+-]?(nan|inf|infinity)", re.IGNORECASE)
_INT_KEYS = ("NORB", "NELEC", "MS2", "ISYM", "IUHF", "IPUHF")
_D_TO_E = bytes.maketrans(b"Dd", b"Ee")


class _Source:
    """An FCIDUMP opened for streaming: plain text or gzip (from the magic bytes)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            raw = open(path, "rb")  # noqa: SIM115 - closed in close()
        except OSError as exc:
            raise FCIDumpError(f"{path}: cannot read FCIDUMP file ({exc})") from exc
        try:
            magic = raw.peek(2)[:2]
        except OSError as exc:
            raw.close()
            raise FCIDumpError(f"{path}: cannot read FCIDUMP file ({exc})") from exc
        self._raw = raw
        self.gzip = magic == _GZIP_MAGIC
        self._stream = gzip.GzipFile(fileobj=raw, mode="rb") if self.gzip else raw
        # A .gz name on plain text is refused once the text turns out not to be blank.
        self.misnamed = not self.gzip and path.suffix == ".gz"

    def read(self, n: int) -> bytes:
        try:
            return self._stream.read(n)
        except (EOFError, OSError, zlib.error) as exc:
            if self.gzip:
                raise FCIDumpError(
                    f"{self.path}: corrupt or truncated gzip stream ({type(exc).__name__}: {exc})"
                ) from exc
            raise FCIDumpError(f"{self.path}: cannot read FCIDUMP file ({exc})") from exc

    def close(self) -> None:
        self._stream.close()
        self._raw.close()

    def lines(self) -> Iterator[tuple[int, list[bytes]]]:
        """Blocks of lines ``(number of the first, [line without its newline, ...])``.

        Memory stays at one block: a NUL byte or a line longer than MAX_LINE_BYTES ends the
        reading at once, so neither /dev/zero nor a file without newlines is read to its end.
        """
        where, carry, lineno = self.path, b"", 1
        while True:
            chunk = self.read(_BLOCK_BYTES)
            if not chunk:
                break
            nul = chunk.find(b"\x00")
            if nul >= 0:
                n = lineno + chunk.count(b"\n", 0, nul)
                raise FCIDumpError(f"{where}:{n}: binary data (NUL bytes) in FCIDUMP text")
            parts = (carry + chunk).split(b"\n")
            carry = parts.pop()
            longest = max((len(x) for x in parts), default=0)
            if longest > MAX_LINE_BYTES or len(carry) > MAX_LINE_BYTES:
                k = next((n for n, x in enumerate(parts) if len(x) > MAX_LINE_BYTES), len(parts))
                raise FCIDumpError(
                    f"{where}:{lineno + k}: line longer than {MAX_LINE_BYTES} characters "
                    "(an FCIDUMP line holds one integral or one part of the namelist)"
                )
            if parts:
                yield lineno, parts
                lineno += len(parts)
        if carry:
            yield lineno, [carry]


def _parse_int(tok: str, key: str, where: str) -> int:
    if not _INT_RE.fullmatch(tok):
        raise FCIDumpError(f"{where}: non-integer value {tok[:40]!r} for {key}")
    if len(tok.lstrip("+-")) > _MAX_INT_DIGITS:
        raise FCIDumpError(f"{where}: value {tok[:40]!r}... for {key} is too large")
    return int(tok)


def _parse_int_list(key: str, text: str, where: str) -> list[int]:
    """Integers separated by commas or blanks, with Fortran repeats ``n*v``; the expanded list
    may hold at most MAX_ORBITALS values (ORBSYM has NORB entries), checked before expanding."""
    out: list[int] = []
    for tok in re.split(r"[\s,]+", text.strip().strip(",")):
        if not tok:
            continue
        count = 1
        if "*" in tok:  # Fortran repeat count, e.g. ORBSYM=4*1
            rep, _, tok = tok.partition("*")
            if not rep.isdigit() or len(rep) > _MAX_INT_DIGITS:
                raise FCIDumpError(f"{where}: bad repeat count in {key}={text.strip()[:60]!r}")
            count = int(rep)
        value = _parse_int(tok, key, where)
        if len(out) + count > MAX_ORBITALS:
            raise FCIDumpError(
                f"{where}: {key} lists more than {MAX_ORBITALS} values (the orbital limit)"
                + (f": repeat count {count}" if count > 1 else "")
            )
        out.extend([value] * count)
    return out


def _parse_header_text(body: str, where: str) -> dict:
    """The keys of the namelist text between ``&FCI`` and its terminator."""
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
                raise FCIDumpError(f"{where}: {key} needs one integer, got {val.strip()[:40]!r}")
            header[key] = vals[0]
        elif key == "ORBSYM":
            header[key] = _parse_int_list(key, val, where)
        else:
            header[key] = val.strip().strip(",").strip()
    return header


def _read_header(
    blocks: Iterator[tuple[int, list[bytes]]], src: _Source
) -> tuple[dict, int, list[bytes]]:
    """Consume the namelist; return (keys, number of the first body line, the rest of its block).

    At most MAX_HEADER_BYTES are read looking for the terminator."""
    where = str(src.path)
    parts: list[str] = []
    started, nbytes = False, 0
    for lineno, lines in blocks:
        for k, raw in enumerate(lines):
            nbytes += len(raw) + 1
            if nbytes > MAX_HEADER_BYTES:
                what = "is not terminated by &END or /" if started else "header is missing"
                raise FCIDumpError(
                    f"{where}: &FCI namelist {what} in the first {MAX_HEADER_BYTES} bytes"
                )
            line = raw.decode("latin-1")
            pos = 0
            if not started:
                if not line.strip():
                    continue
                if src.misnamed:
                    raise FCIDumpError(
                        f"{where}: name ends in .gz but the content is not gzip data"
                    )
                m = _HEADER_START_RE.match(line)
                if not m:
                    raise FCIDumpError(
                        f"{where}: missing &FCI namelist header (file starts with "
                        f"{line.strip()[:40]!r})"
                    )
                started, pos = True, m.end()
            end = _HEADER_END_RE.search(line, pos)
            if end is None:
                parts.append(line[pos:])
                continue
            parts.append(line[pos : end.start()])
            tail = line[end.end() :]
            if tail.strip():
                raise FCIDumpError(
                    f"{where}: unexpected text {tail.strip()[:40]!r} after the namelist terminator"
                )
            header = _parse_header_text("\n".join(parts), where)
            return header, lineno + k + 1, lines[k + 1 :]
    if not started:
        raise FCIDumpError(f"{where}: empty FCIDUMP file")
    raise FCIDumpError(f"{where}: &FCI namelist is not terminated by &END or /")


def _validate_header(h: dict, where: str) -> tuple[int, int, int, tuple[int, ...] | None, int]:
    for key in ("NORB", "NELEC"):
        if key not in h:
            raise FCIDumpError(f"{where}: {key} missing from the &FCI namelist")
    norb, nelec = h["NORB"], h["NELEC"]
    if norb < 1:
        raise FCIDumpError(f"{where}: NORB={norb} must be a positive integer")
    if norb > MAX_ORBITALS:
        raise FCIDumpError(
            f"{where}: NORB={norb} exceeds the limit of {MAX_ORBITALS} orbitals "
            f"({2 * MAX_ORBITALS} spin orbitals); use a frozen core or an active space"
        )
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


def check_symmetry_labels(orbsym: Any, isym: Any, norb: int) -> tuple[int, ...] | None:
    """ORBSYM and ISYM as the reader accepts them: ``norb`` non-negative integer irreps (or
    None) and a non-negative integer ISYM; raises ValueError otherwise.

    Example:
        >>> check_symmetry_labels([1, 2], 1, 2)
        (1, 2)
    """
    if isinstance(isym, bool) or not isinstance(isym, (int, np.integer)) or isym < 0:
        raise ValueError(f"isym must be a non-negative integer irrep label, not {isym!r}")
    if orbsym is None:
        return None
    try:
        labels = [int(x) for x in orbsym]
        exact = all(int(x) == x and not isinstance(x, bool) for x in orbsym)
    except (TypeError, ValueError):
        raise ValueError(f"orbsym must be a sequence of integer irreps, not {orbsym!r}") from None
    if not exact:
        raise ValueError(f"orbsym must hold integer irreps, got {list(orbsym)!r}")
    if len(labels) != norb:
        raise ValueError(f"orbsym has {len(labels)} entries, norb={norb}")
    if labels and min(labels) < 0:
        raise ValueError("negative irrep in orbsym")
    return tuple(labels)


def _diagnose_line(line: str, where: str) -> FCIDumpError:
    toks = line.replace(",", " ").split()
    if len(toks) != 5:
        return FCIDumpError(f"{where}: expected 'value i j k l' (5 fields), got {len(toks)}")
    v = toks[0]
    if _NONFINITE_RE.fullmatch(v):
        return FCIDumpError(f"{where}: NaN/inf value {v!r}")
    if not _NUM_RE.fullmatch(v):
        return FCIDumpError(f"{where}: non-numeric value {v[:40]!r}")
    for t in toks[1:]:
        if not _INT_RE.fullmatch(t):
            if _NONFINITE_RE.fullmatch(t) or _NUM_RE.fullmatch(t):
                return FCIDumpError(f"{where}: orbital index {t[:40]!r} is not an integer")
            return FCIDumpError(f"{where}: non-numeric orbital index {t[:40]!r}")
    return FCIDumpError(f"{where}: cannot parse integral line {line.strip()[:60]!r}")


def _pair(i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Packed pair index of 1-based orbital indices."""
    hi, lo = np.maximum(i, j) - 1, np.minimum(i, j) - 1
    return hi * (hi + 1) // 2 + lo


class _Body:
    """Integral lines, parsed one block at a time into the packed arrays.

    Entries not yet seen are NaN (no integral can be NaN), so a value met again in a later block
    is compared with the stored one without keeping the lines.
    """

    def __init__(self, norb: int, where: str) -> None:
        self.norb, self.where = norb, where
        npair = n_pairs(norb)
        self.eri = np.full(n_pairs(npair), np.nan)
        self.h1 = np.full(npair, np.nan)
        self.core: tuple[float, int] | None = None  # (value, line)
        self.n_h1 = self.n_eri = self.n_other = 0
        # Every distinct index tuple once, plus room for blank lines: more lines than that
        # repeat an entry over and over, and a stream that never ends is cut off here.
        self.max_lines = (norb + 1) ** 4 + 4096
        self.n_lines = 0

    def parse(self, lineno: int, lines: list[bytes]) -> None:
        if self.n_lines + len(lines) > self.max_lines:
            raise FCIDumpError(
                f"{self.where}:{lineno + self.max_lines - self.n_lines}: more than "
                f"{self.max_lines} lines after the namelist, more than NORB={self.norb} allows "
                "(each index tuple once, plus 4096 blank lines)"
            )
        self.n_lines += len(lines)
        norb, where = self.norb, self.where
        ev: list[float] = []
        eidx: list[tuple[int, int, int, int]] = []
        eln: list[int] = []
        hv: list[float] = []
        hidx: list[tuple[int, int]] = []
        hln: list[int] = []
        match = _LINE_RE.fullmatch
        for n, raw in enumerate(lines, lineno):
            m = match(raw)
            if m is None:
                if raw.strip():
                    raise _diagnose_line(raw.decode("latin-1"), f"{where}:{n}")
                continue
            v, a, b, c, d = m.groups()
            i, j, k, ll = int(a), int(b), int(c), int(d)
            if not (0 <= i <= norb and 0 <= j <= norb and 0 <= k <= norb and 0 <= ll <= norb):
                raise FCIDumpError(
                    f"{where}:{n}: integral index {(i, j, k, ll)} out of range 0..NORB={norb}"
                )
            val = float(v.translate(_D_TO_E))
            if not -MAX_ABS_INTEGRAL <= val <= MAX_ABS_INTEGRAL:
                if math.isinf(val):
                    raise FCIDumpError(f"{where}:{n}: value {v.decode()!r} overflows to inf")
                try:
                    check_integral_value(val, f"{where}:{n}")
                except IntegralError as exc:
                    raise FCIDumpError(str(exc)) from None
            if i and j and k and ll:
                ev.append(val)
                eidx.append((i, j, k, ll))
                eln.append(n)
            elif k or ll:
                raise self._pattern(n, (i, j, k, ll))
            elif i and j:
                hv.append(val)
                hidx.append((i, j))
                hln.append(n)
            elif i:  # i 0 0 0: an orbital energy (Molpro), read and ignored
                self.n_other += 1
            elif j:
                raise self._pattern(n, (i, j, k, ll))
            elif self.core is None:
                self.core = (val, n)
            elif not values_agree(self.core[0], val):
                raise FCIDumpError(
                    conflict_message(
                        f"{where}:{n}",
                        "core energy (0 0 0 0)",
                        f"on line {self.core[1]}",
                        self.core[0],
                        val,
                    )
                )
        if ev:
            g = np.array(eidx, dtype=np.int64)
            ij, kl = _pair(g[:, 0], g[:, 1]), _pair(g[:, 2], g[:, 3])
            hi, lo = np.maximum(ij, kl), np.minimum(ij, kl)
            self.n_eri += len(ev)
            self._scatter(self.eri, hi * (hi + 1) // 2 + lo, ev, eln, "(ij|kl)")
        if hv:
            g = np.array(hidx, dtype=np.int64)
            self.n_h1 += len(hv)
            self._scatter(self.h1, _pair(g[:, 0], g[:, 1]), hv, hln, "h_ij")

    def _pattern(self, n: int, idx: tuple[int, int, int, int]) -> FCIDumpError:
        return FCIDumpError(
            f"{self.where}:{n}: invalid index pattern {idx} (expected i j k l, i j 0 0, "
            "i 0 0 0 or 0 0 0 0)"
        )

    def _scatter(self, out: np.ndarray, pos: np.ndarray, val: list, lines: list, what: str) -> None:
        """out[pos] = val, raising when one position receives values that disagree."""
        vals, lns = np.array(val, dtype=np.float64), np.array(lines, dtype=np.int64)
        order = np.argsort(pos, kind="stable")
        ps, vs, ls = pos[order], vals[order], lns[order]
        same = ps[1:] == ps[:-1]
        if same.any():
            clash = np.nonzero(same & ~values_agree(vs[1:], vs[:-1]))[0]
            if clash.size:
                c = clash[0]
                raise FCIDumpError(
                    conflict_message(
                        f"{self.where}:{ls[c + 1]}", what, f"on line {ls[c]}", vs[c], vs[c + 1]
                    )
                )
        old = out[ps]
        clash = np.nonzero(~np.isnan(old) & ~values_agree(old, vs))[0]
        if clash.size:
            c = clash[np.argmin(ls[clash])]
            self.clash = (what, int(ps[c]), int(ls[c]), float(old[c]), float(vs[c]))
            raise _EarlierConflict
        out[ps] = vs  # of equal positions, the last listed is stored


class _EarlierConflict(Exception):
    """A value conflicts with one stored from an earlier block (its line is found afterwards)."""


def _pair1(i: int, j: int) -> int:
    hi, lo = max(i, j) - 1, min(i, j) - 1
    return hi * (hi + 1) // 2 + lo


def _earlier_line(path: Path, what: str, pos: int, before: int) -> int | None:
    """The first line before ``before`` that lists the integral at packed position ``pos``
    (read again from the start: only an error needs it)."""
    if not path.is_file():
        return None  # a pipe cannot be read again
    src = _Source(path)
    try:
        blocks = src.lines()
        _, first, rest = _read_header(blocks, src)
        for lineno, lines in itertools.chain([(first, rest)], blocks):
            for n, raw in enumerate(lines, lineno):
                if n >= before:
                    return None
                m = _LINE_RE.fullmatch(raw)
                if m is None:
                    continue
                i, j, k, ll = (int(x) for x in m.groups()[1:])
                if what == "h_ij" and i and j and not k and not ll:
                    p = _pair1(i, j)
                elif what == "(ij|kl)" and i and j and k and ll:
                    ij, kl = _pair1(i, j), _pair1(k, ll)
                    p = max(ij, kl) * (max(ij, kl) + 1) // 2 + min(ij, kl)
                else:
                    continue
                if p == pos:
                    return n
    finally:
        src.close()
    return None


def read_fcidump(path: str | os.PathLike, max_bytes: int = 4 << 30) -> FCIDump:
    """Read an FCIDUMP file, plain text or gzip (detected from the magic bytes).

    Accepts the PySCF, Molpro and Psi4 dialects: ``&END``, ``$END`` or ``/`` terminators, keys
    in any case and spread over several lines, Fortran ``D`` exponents, ``n*v`` repeats in
    ORBSYM. Any one of the 8 equivalent index orders of an integral may be listed; listing
    several is allowed if their values agree to :data:`~cuscikit.chem.integrals.SYMMETRY_TOL`.

    The file is read as a stream, one block at a time, and the header's limits (NORB at most
    :data:`~cuscikit.chem.integrals.MAX_ORBITALS`, repeat counts, NELEC and MS2) are checked
    before any integral is read, so memory is that of the integral arrays whatever the file
    holds. Every value must be finite and at most
    :data:`~cuscikit.chem.integrals.MAX_ABS_INTEGRAL` in magnitude. ``docs/fcidump.md`` lists
    the limits and their reasons.

    Args:
        path: file to read.
        max_bytes: refuse files whose packed ERI array would exceed this size; the default
            (4 GiB) is above the 128-orbital limit's 272 MB.

    Returns:
        An :class:`FCIDump` with 8-fold packed ERIs and a symmetric ``h1e``.

    Raises:
        FCIDumpError: the file is missing, empty, not valid gzip, or malformed; the message
            names the file, the line (where relevant) and the problem.

    Warns:
        FCIDumpWarning: no core-energy line (``0 0 0 0``) or no one-electron integrals: the
            signs of a file cut short (writers put these last).

    Example:
        >>> d = read_fcidump("datasets/lih_sto3g.fcidump.gz")  # doctest: +SKIP
        >>> d.norb, d.nelec  # doctest: +SKIP
        (6, 4)
    """
    path = Path(path)
    where = str(path)
    src = _Source(path)
    try:
        blocks = src.lines()
        header, first, rest = _read_header(blocks, src)
        norb, nelec, ms2, orbsym, isym = _validate_header(header, where)
        need = 8 * n_pairs(n_pairs(norb))
        if need > max_bytes:
            raise FCIDumpError(
                f"{path}: NORB={norb} needs {need / 2**30:.1f} GiB for the packed two-electron "
                f"integrals, more than max_bytes={max_bytes / 2**30:.1f} GiB"
            )
        body = _Body(norb, where)
        try:
            for lineno, lines in itertools.chain([(first, rest)], blocks):
                body.parse(lineno, lines)
        except _EarlierConflict:
            what, pos, line, a, b = body.clash
            earlier = _earlier_line(path, what, pos, line)
            other = f"on line {earlier}" if earlier else "on an earlier line"
            raise FCIDumpError(conflict_message(f"{where}:{line}", what, other, a, b)) from None
    finally:
        src.close()

    if body.n_eri + body.n_h1 + body.n_other == 0 and body.core is None:
        raise FCIDumpError(f"{path}: no integrals after the &FCI namelist (truncated file?)")
    if body.core is None:
        warnings.warn(
            f"{path}: no core-energy line (0 0 0 0), E_core = 0 assumed; writers put it last, "
            "so a file cut short loses it first",
            FCIDumpWarning,
            stacklevel=2,
        )
    if body.n_h1 == 0:
        warnings.warn(
            f"{path}: no one-electron integrals (i j 0 0 lines), h = 0 assumed; a file cut "
            "short loses them after the core energy",
            FCIDumpWarning,
            stacklevel=2,
        )
    eri, h1 = body.eri, body.h1
    eri[np.isnan(eri)] = 0.0
    h1[np.isnan(h1)] = 0.0
    h1e = h1[eri_pair_index(norb)]
    e_core = body.core[0] if body.core is not None else 0.0
    return FCIDump(norb, nelec, ms2, h1e, eri, e_core, orbsym, isym)


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

    Raises:
        ValueError: the integrals fail the reader's checks (shape, symmetry within
            :data:`~cuscikit.chem.integrals.SYMMETRY_TOL`, finiteness, magnitude), or the
            electron count, ``orbsym`` or ``isym`` are inconsistent.

    Returns:
        None.

    Example:
        >>> import numpy as np, tempfile, os
        >>> h = np.diag([-1.0, -0.5]); g = np.zeros((2, 2, 2, 2)); g[0, 0, 0, 0] = 0.6
        >>> p = os.path.join(tempfile.mkdtemp(), "FCIDUMP")
        >>> write_fcidump(p, h, g, 2)
        >>> float(read_fcidump(p).h1e[0, 0])
        -1.0
    """
    # The reader's checks, so that what is written can be read back.
    h1e, eri8, e_core = validate_integrals(h1e, eri, e_core)
    norb = h1e.shape[0]
    if isinstance(nelec, (tuple, list)):
        na, nb = (int(x) for x in nelec)
        nelec, ms2 = na + nb, na - nb
    nelec = int(nelec)
    if nelec < 0 or nelec > 2 * norb or abs(ms2) > nelec or (nelec - ms2) % 2:
        raise ValueError(f"inconsistent nelec={nelec}, ms2={ms2} for norb={norb}")
    orbsym = check_symmetry_labels(orbsym, isym, norb)

    npair = n_pairs(norb)
    ti, tj = np.tril_indices(norb)  # pair p -> (i, j), i >= j, in packed order
    pi, pj = np.tril_indices(npair)  # 8-fold entry -> (ij, kl), ij >= kl
    keep = np.abs(eri8) > tol
    pi, pj, ev = pi[keep], pj[keep], eri8[keep]

    buf = io.StringIO()
    sym = ",".join(str(int(s)) for s in orbsym) if orbsym is not None else "1," * norb
    buf.write(f" &FCI NORB={norb:4d},NELEC={nelec:2d},MS2={int(ms2)},\n")
    buf.write(f"  ORBSYM={sym.rstrip(',')},\n  ISYM={isym},\n &END\n")
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
