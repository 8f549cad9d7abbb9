"""Host memory measures of `cuscikit.backends.memory`."""

import numpy as np
import pytest


def test_host_peak_sees_a_spike_and_not_what_was_freed_before():
    import time

    from cuscikit.backends.memory import HostPeak, resident_bytes

    if resident_bytes() is None:
        pytest.skip("the resident size cannot be read here")
    big = np.ones(200_000_000 // 8)  # 200 MB, freed before the measured stretch
    del big
    with HostPeak(interval=0.002) as hp:
        a = np.ones(80_000_000 // 8)  # 80 MB held for 50 ms, then freed inside
        time.sleep(0.05)
        del a
        time.sleep(0.01)
    assert hp.peak - hp.start > 70_000_000
    assert hp.peak - hp.start < 150_000_000  # the earlier 200 MB do not count
