"""The helpers of :mod:`benchmarks._common` for the studies: a study writes its own report to
``benchmarks/studies/results/`` (``OWN``; ``$GPVI_BENCH_OUT`` when set), and reads the references it compares with
from ``benchmarks/results/`` (``RESULTS``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks import _common
from benchmarks._common import RESULTS, header, machine_info, median_time

__all__ = ["OWN", "RESULTS", "header", "machine_info", "median_time", "write"]

OWN = Path(os.environ.get("GPVI_BENCH_OUT") or Path(__file__).resolve().parent / "results")
"""Where a study's own reports go: ``benchmarks/studies/results`` or ``$GPVI_BENCH_OUT``."""


def write(name: str, markdown: str, data: Any | None = None) -> Path:
    """:func:`benchmarks._common.write` into :data:`OWN`."""
    return _common.write(name, markdown, data, folder=OWN)
