"""Shared setup of the GUGA tests."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _pyscf_one_thread():
    """PySCF's OpenMP team on a small problem spends its time waiting on busy cores."""
    try:
        from pyscf import lib
    except ImportError:  # the modules that need PySCF skip themselves
        yield
        return
    old = lib.num_threads()
    lib.num_threads(1)
    yield
    lib.num_threads(old)
