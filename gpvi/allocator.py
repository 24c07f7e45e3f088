r"""glibc malloc's thresholds for large temporaries: set on request, never by ``import gpvi``.

gpvi's engines allocate and free many arrays of 0.1-30 MB at every step: the :math:`N\times N` and
:math:`NK\times NK` temporaries of the Cholesky bookkeeping, EP's sweeps, the :math:`(N, K, S)` arrays of the
quasi-Monte Carlo tilted moments. glibc's ``malloc`` serves a block above ``M_MMAP_THRESHOLD`` (128 KiB at start)
with a fresh ``mmap``, and gives the top of its heap back to the system once more than ``M_TRIM_THRESHOLD``
(128 KiB at start) is free there. Both rise as large blocks are freed, to at most 32 MiB and 64 MiB (its "dynamic
mmap threshold", see ``mallopt(3)``). Until they have risen, and whenever the heap's top is trimmed, each new
temporary is memory the kernel maps and zeroes page by page. On a multi-class fully Bayesian fit the first fit in
a process was markedly slower than the same fit run again in that process, all of the difference in element-wise
operations that allocate their result (the in-place ones took the same time in both).

:func:`set_malloc_thresholds` sets the two thresholds to the values that rule tends to, 32 MiB and 64 MiB, so the
first fit runs like a warm one, with identical results. Measured on a fresh process
(``benchmarks/studies/results/malloc_thresholds.md``, 2 cores, 3 runs each, medians): the default multi-class fully
Bayesian fit on ``synth4`` took 0.75x the time without them, ``gpvi.infer`` on Bodyfat 0.94x; single runs of
type-II ``GPClassifier`` fits differed by -10 % to +4 %, within their noise.

**Why not on import.** The thresholds belong to the whole process, not to gpvi: with them, up to 64 MiB of freed
memory may stay with the process instead of going back to the system, and every other library's blocks of up to
32 MiB come from the heap too. A library should not change that for the program that imports it, so gpvi sets them
only when asked:

* ``gpvi.allocator.set_malloc_thresholds()`` in a script, before its first fit;
* ``GPVI_MALLOC_THRESHOLDS=1`` in the environment when gpvi is imported (``benchmarks/studies/malloc_thresholds.py``
  compares ``=1`` with ``=0``);
* the ``gpvi`` command sets them in its own process (the console script, ``python -m gpvi``), unless
  ``GPVI_MALLOC_THRESHOLDS=0``; :func:`gpvi.cli.main` called with an ``argv`` list from Python leaves its caller's
  process alone.

glibc's own environment variables ``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=67108864`` do the same
for any program. glibc only (a no-op on other C libraries and platforms).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping

__all__ = ["set_malloc_thresholds", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "applied"]

MMAP_THRESHOLD = 32 * 2**20
"""Bytes: blocks up to this size come from the heap (glibc's ``DEFAULT_MMAP_THRESHOLD_MAX`` on 64-bit systems)."""
TRIM_THRESHOLD = 64 * 2**20
"""Bytes of free memory at the heap's top kept before it is given back (twice the mmap threshold, as glibc's rule)."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3        # mallopt's parameter numbers (malloc.h)

applied = False
"""Whether :func:`set_malloc_thresholds` set both thresholds in this process."""


def set_malloc_thresholds(environ: Mapping[str, str] | None = None) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` of this process to :data:`MMAP_THRESHOLD` and
    :data:`TRIM_THRESHOLD` (module docstring: what it changes for the whole process, and what it gains). Returns
    whether both were set: False on a platform without glibc's ``mallopt`` or when ``environ`` (default
    ``os.environ``) has ``GPVI_MALLOC_THRESHOLDS=0`` (an opt-out that also holds for the ``gpvi`` command)."""
    env = os.environ if environ is None else environ
    if env.get("GPVI_MALLOC_THRESHOLDS", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt              # the C library this Python runs on (no library search)
    except (OSError, AttributeError):                    # no mallopt: nothing to tune (musl's returns 0)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    global applied
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return applied
