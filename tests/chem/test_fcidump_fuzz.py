"""Fuzz the FCIDUMP reader: any input gives the right integrals or an FCIDumpError, never
another exception, within a time and memory bound per example.

Three generators: byte-level edits of a valid file (text and gzip), files written from known
integrals in every dialect the reader accepts (the result must equal the integrals), and
hostile headers and lines built from a grammar of awkward tokens. The profile is
deterministic (derandomized, no example database) so CI runs the same examples every time.
"""

from __future__ import annotations

import gzip
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuscikit.chem import FCIDump, FCIDumpError, read_fcidump, restore_eri, write_fcidump

_DIR = Path(tempfile.mkdtemp(prefix="cuscikit_fuzz_"))
_MAX_BYTES = 1 << 22  # ERI arrays up to 4 MiB (NORB <= 44) in these tests
_TIME_LIMIT_S = 2.0  # per example; a clean file of this size reads in milliseconds
_MEMORY_LIMIT = _MAX_BYTES + (12 << 20)  # the arrays, plus a block of text and its parse

PROFILE = dict(
    deadline=None,  # wall time is asserted per example instead (CI machines vary)
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _valid_text() -> bytes:
    rng = np.random.default_rng(5)
    n = 3
    g = rng.standard_normal((n,) * 4)
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    h = rng.standard_normal((n, n))
    write_fcidump(_DIR / "base", h + h.T, g, 4, e_core=1.5, orbsym=[1, 2, 1])
    return (_DIR / "base").read_bytes()


BASE = _valid_text()
BASE_GZ = gzip.compress(BASE, mtime=0)


def _read_bounded(path: Path) -> FCIDump | None:
    """read_fcidump, asserting: FCIDumpError or an FCIDump, in bounded time and memory."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = read_fcidump(path, max_bytes=_MAX_BYTES)
    except FCIDumpError as exc:
        d = None
        assert str(exc) and "\n" not in str(exc)
    finally:
        wall = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert wall < _TIME_LIMIT_S, wall
    assert peak < _MEMORY_LIMIT, peak
    return d


def _check(path: Path) -> FCIDump | None:
    d = _read_bounded(path)
    if d is None:
        return None
    assert isinstance(d, FCIDump)
    n = d.norb
    assert 1 <= n <= 128 and 0 <= d.nelec <= 2 * n and (d.nelec - d.ms2) % 2 == 0
    assert d.h1e.shape == (n, n) and np.array_equal(d.h1e, d.h1e.T)
    npair = n * (n + 1) // 2
    assert d.eri.shape == (npair * (npair + 1) // 2,)
    for arr in (d.h1e, d.eri, np.array([d.e_core])):
        assert np.isfinite(arr).all() and (np.abs(arr) <= 1e8).all()
    assert d.orbsym is None or len(d.orbsym) == n
    return d


# ------------------------------------------------------------------ edits of a valid file

_edit = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(BASE)), st.binary(max_size=0)),
    st.tuples(st.just("replace"), st.integers(0, len(BASE) - 1), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("insert"), st.integers(0, len(BASE)), st.binary(min_size=1, max_size=8)),
    st.tuples(
        st.just("insert"),
        st.integers(0, len(BASE)),
        st.sampled_from(
            [b"-", b"9", b"0", b"D", b"E+99", b"nan", b",", b"/", b"&END", b"\n", b"*", b"e308"]
            + [b"9" * 30, b"1" * 5000, b" " * 5000, b"1000000000*", b"\x00", b"\r"]
        ),
    ),
    st.tuples(st.just("delete"), st.integers(0, len(BASE)), st.integers(1, 20)),
)


def _apply(data: bytes, edit: tuple) -> bytes:
    kind, pos, arg = edit
    pos = min(pos, len(data))
    if kind == "truncate":
        return data[:pos]
    if kind == "replace":
        return data[:pos] + arg + data[pos + len(arg) :]
    if kind == "insert":
        return data[:pos] + arg + data[pos:]
    return data[:pos] + data[pos + arg :]


@settings(max_examples=300, **PROFILE)
@given(st.lists(_edit, min_size=1, max_size=4))
def test_fuzz_text(edits: list) -> None:
    data = BASE
    for e in edits:
        data = _apply(data, e)
    path = _DIR / "fuzz_text"
    path.write_bytes(data)
    _check(path)


@settings(max_examples=150, **PROFILE)
@given(
    st.integers(0, len(BASE_GZ)),
    st.lists(st.tuples(st.integers(0, len(BASE_GZ) - 1), st.integers(0, 255)), max_size=3),
    st.sampled_from(["fuzz.gz", "fuzz_plain"]),
)
def test_fuzz_gzip(cut: int, flips: list, name: str) -> None:
    data = bytearray(BASE_GZ)
    for pos, byte in flips:
        data[pos] = byte
    path = _DIR / name
    path.write_bytes(bytes(data[:cut]))
    _check(path)


# ------------------------------------------------------------------ known integrals, any dialect


@st.composite
def _dialect_file(draw) -> tuple[bytes, dict]:
    """A file in a random accepted dialect, and the integrals it must read back as."""
    norb = draw(st.integers(1, 4))
    na = draw(st.integers(0, norb))
    nb = draw(st.integers(0, norb))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    g = rng.standard_normal((norb,) * 4) * draw(st.sampled_from([1e-3, 1.0, 1e6]))
    g = g + g.transpose(1, 0, 2, 3)
    g = g + g.transpose(0, 1, 3, 2)
    g = g + g.transpose(2, 3, 0, 1)
    g[np.abs(g) < 0.1 * np.abs(g).max()] = 0.0  # sparse, like symmetry-blocked integrals
    h = rng.standard_normal((norb, norb))
    h = h + h.T
    e_core = float(rng.standard_normal())
    orbsym = [int(x) for x in rng.integers(1, 9, norb)] if draw(st.booleans()) else None
    isym = draw(st.integers(1, 8))

    sep = draw(st.sampled_from([" ", "  ", "\t", ", ", ","]))
    nl = draw(st.sampled_from(["\n", "\r\n"]))
    fortran_d = draw(st.booleans())
    dup = draw(st.booleans())  # list some integrals in a second index order too
    blank = draw(st.booleans())

    def num(v: float) -> str:
        s = repr(float(v))
        return s.replace("e", "D") if fortran_d and "e" in s else s

    keys = [f"NORB={norb}", f"NELEC={na + nb}", f"MS2={na - nb}"]
    if orbsym is not None:
        keys.append("ORBSYM=" + ",".join(map(str, orbsym)))
    keys.append(f"ISYM={isym}")
    if draw(st.booleans()):
        keys = [k.lower() for k in keys]
    start = draw(st.sampled_from(["&FCI", "$FCI", " &fci"]))
    end = draw(st.sampled_from(["&END", "$END", "/", " &end"]))
    joint = draw(st.sampled_from([",", f",{nl} ", " "]))
    lines = [f"{start} {joint.join(keys)}{nl}{end}"]
    perms = [(0, 1, 2, 3), (1, 0, 2, 3), (0, 1, 3, 2), (1, 0, 3, 2)]
    perms += [(2, 3, 0, 1), (3, 2, 0, 1), (2, 3, 1, 0), (3, 2, 1, 0)]
    body = []
    for i in range(norb):
        for j in range(i + 1):
            for k in range(norb):
                for ll in range(k + 1):
                    if i * (i + 1) // 2 + j < k * (k + 1) // 2 + ll or g[i, j, k, ll] == 0:
                        continue
                    idx = (i, j, k, ll)
                    orders = [perms[rng.integers(8)]] + ([perms[rng.integers(8)]] if dup else [])
                    for p in orders:
                        q = [idx[x] + 1 for x in p]
                        body.append(sep.join([num(g[i, j, k, ll])] + [str(x) for x in q]))
    for i in range(norb):
        for j in range(i + 1):
            if h[i, j] != 0:
                a, b = (i, j) if rng.integers(2) else (j, i)
                body.append(sep.join([num(h[i, j]), str(a + 1), str(b + 1), "0", "0"]))
    if draw(st.booleans()):  # Molpro orbital energies: read and ignored
        body.append(sep.join([num(0.5), "1", "0", "0", "0"]))
    body.append(sep.join([num(e_core), "0", "0", "0", "0"]))
    if blank:
        body.insert(len(body) // 2, "")
    text = nl.join(lines + body) + nl
    data = text.encode()
    if draw(st.booleans()):
        data = gzip.compress(data, mtime=0)
    want = dict(norb=norb, nelec=(na, nb), h=h, g=g, e_core=e_core, orbsym=orbsym, isym=isym)
    return data, want


@settings(max_examples=100, **PROFILE)
@given(_dialect_file())
def test_dialects_read_back_exactly(case: tuple) -> None:
    data, want = case
    path = _DIR / "dialect"
    path.write_bytes(data)
    d = _check(path)
    assert d is not None
    assert d.norb == want["norb"] and d.nelec_ab == want["nelec"]
    np.testing.assert_array_equal(d.h1e, want["h"])
    np.testing.assert_array_equal(d.eri, restore_eri(want["g"], d.norb, 8))
    assert d.e_core == want["e_core"] and d.isym == want["isym"]
    assert d.orbsym == (tuple(want["orbsym"]) if want["orbsym"] else None)


# ------------------------------------------------------------------ hostile headers and lines

_token = st.one_of(
    st.sampled_from(
        ["0", "1", "2", "-1", "+3", "1.5", ".5", "5.", "1e3", "1D3", "-2.5d-2", "1e308", "1e309"]
        + ["nan", "inf", "-Infinity", "1_0", "0x1f", "1e", "e1", "--1", "1.2.3", "*", "&END"]
        + ["/", "&FCI", "=", ",", "9" * 25, "1" * 4097, "10000000000000000000000", "\x00"]
    ),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.eEdD+-", min_size=1, max_size=30),
)
_value = st.one_of(
    _token,
    st.builds(lambda n, v: f"{n}*{v}", st.integers(0, 10**12), st.integers(-2, 9)),
    st.lists(_token, min_size=1, max_size=5).map(",".join),
)
_key = st.sampled_from(["NORB", "NELEC", "MS2", "ORBSYM", "ISYM", "UHF", "IUHF", "X", "norb"])


@st.composite
def _hostile_file(draw) -> bytes:
    norb = draw(st.one_of(st.integers(1, 4), _value))
    keys = [f"NORB={norb}", f"NELEC={draw(st.one_of(st.integers(0, 4), _value))}"]
    keys += [f"{draw(_key)}={draw(_value)}" for _ in range(draw(st.integers(0, 3)))]
    head = " &FCI " + ",".join(draw(st.permutations(keys))) + draw(st.sampled_from(["\n&END", ""]))
    lines = []
    for _ in range(draw(st.integers(0, 12))):
        fields = draw(st.lists(st.one_of(_token, st.integers(0, 5).map(str)), max_size=7))
        lines.append(draw(st.sampled_from([" ", ",", "\t", ""])).join(fields))
    if draw(st.booleans()):
        lines.append("0.25 0 0 0 0")
    return (head + "\n" + "\n".join(lines) + draw(st.sampled_from(["\n", ""]))).encode("latin-1")


@settings(max_examples=100, **PROFILE)  # the time goes into generating the examples
@given(_hostile_file())
def test_fuzz_hostile_grammar(data: bytes) -> None:
    path = _DIR / "hostile"
    path.write_bytes(data)
    _check(path)


def test_base_is_valid() -> None:
    (_DIR / "ok").write_bytes(BASE)
    assert read_fcidump(_DIR / "ok").norb == 3
