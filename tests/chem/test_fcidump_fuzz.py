"""Fuzz the FCIDUMP reader: corrupt input gives a valid object or FCIDumpError, nothing else."""

from __future__ import annotations

import gzip
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuscikit.chem import FCIDump, FCIDumpError, read_fcidump, write_fcidump

_DIR = Path(tempfile.mkdtemp(prefix="cuscikit_fuzz_"))


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

_edit = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, len(BASE)), st.binary(max_size=0)),
    st.tuples(st.just("replace"), st.integers(0, len(BASE) - 1), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("insert"), st.integers(0, len(BASE)), st.binary(min_size=1, max_size=8)),
    st.tuples(
        st.just("insert"),
        st.integers(0, len(BASE)),
        st.sampled_from(
            [b"-", b"9", b"0", b"D", b"E+99", b"nan", b",", b"/", b"&END", b"\n", b"*"]
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


def _check(path: Path) -> None:
    try:
        d = read_fcidump(path, max_bytes=1 << 28)
    except FCIDumpError as exc:
        assert str(exc)
        return
    assert isinstance(d, FCIDump)
    n = d.norb
    assert n >= 1 and 0 <= d.nelec <= 2 * n and (d.nelec - d.ms2) % 2 == 0
    assert d.h1e.shape == (n, n) and np.array_equal(d.h1e, d.h1e.T)
    npair = n * (n + 1) // 2
    assert d.eri.shape == (npair * (npair + 1) // 2,)
    assert np.isfinite(d.h1e).all() and np.isfinite(d.e_core)
    if d.eri.size < 10**6:
        assert np.isfinite(d.eri).all()
    assert d.orbsym is None or len(d.orbsym) == n


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_edit, min_size=1, max_size=4))
def test_fuzz_text(edits: list) -> None:
    data = BASE
    for e in edits:
        data = _apply(data, e)
    path = _DIR / "fuzz_text"
    path.write_bytes(data)
    _check(path)


@settings(max_examples=150, deadline=None)
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


def test_base_is_valid() -> None:
    (_DIR / "ok").write_bytes(BASE)
    assert read_fcidump(_DIR / "ok").norb == 3
