"""Host memory measures of `cuscikit.backends.memory`."""

import mmap

import pytest


def test_host_peak_sees_a_spike_and_not_what_was_freed_before():
    import time

    from cuscikit.backends.memory import HostPeak, resident_bytes

    if resident_bytes() is None:
        pytest.skip("the resident size cannot be read here")

    def touched(nbytes):  # fresh pages from the system, whatever the allocator keeps
        block = mmap.mmap(-1, nbytes)
        for page in range(0, nbytes, 4096):
            block[page] = 1
        return block

    touched(200_000_000).close()  # 200 MB, returned before the measured stretch
    with HostPeak(interval=0.002) as hp:
        block = touched(80_000_000)  # 80 MB held for 50 ms, then returned inside
        time.sleep(0.05)
        block.close()
        time.sleep(0.01)
    assert hp.peak - hp.start > 70_000_000
    assert hp.peak - hp.start < 150_000_000  # the earlier 200 MB do not count
