"""gpvi.allocator: glibc malloc's thresholds, set only on request (``import gpvi`` leaves them alone; issue 58);
checked by their effect (mallinfo2's mmapped bytes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import subprocess
import sys

import pytest

from gpvi import allocator

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_opt_out_and_platform():
    assert allocator.set_malloc_thresholds({"GPVI_MALLOC_THRESHOLDS": "0"}) is False
    if GLIBC:
        assert allocator.set_malloc_thresholds({}) is True and allocator.applied is True


_PROBE = """
import ctypes, ctypes.util, sys
class M(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = M
import gpvi
import numpy as np
before = libc.mallinfo2().hblkhd
a = np.ones(4 * 2**20 // 8)          # a 4 MiB block: from the heap with the thresholds set, mmap-ed without
print(libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(not GLIBC, reason="glibc only")
def test_a_4_mib_block_comes_from_the_heap_only_when_asked():
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc without mallinfo2 (< 2.33)")

    def mmapped(extra_env: dict[str, str]) -> int:
        env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", **extra_env}
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert mmapped({}) >= 4 * 2**20                                    # import gpvi: glibc's defaults stay
    assert mmapped({"GPVI_MALLOC_THRESHOLDS": "1"}) == 0               # asked for at import: from the heap
