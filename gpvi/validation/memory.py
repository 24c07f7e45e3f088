"""Free memory, and the refusal of work that would not fit in it before anything is allocated.

:func:`available_memory_bytes` is the one measurement of free memory (the CUDA allocator's free bytes, or the
host's available physical pages); :class:`gpvi.numerics.budget.MemoryBudget` sizes batched evaluations from it,
:func:`check_memory` and :func:`check_dense_memory` refuse work whose dense matrices exceed it.
"""

from __future__ import annotations

import math
import os

import torch

__all__ = ["available_memory_bytes", "check_memory", "check_dense_memory"]


def available_memory_bytes(device: torch.device) -> int | None:
    """Free bytes on ``device`` (None where the host does not say)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _shortfall(n: int, batch: int, copies: int, dtype: torch.dtype, device: torch.device | str | None
               ) -> tuple[int, int, torch.device, int] | None:
    """``(need, avail, device, itemsize)`` when ``copies`` dense ``batch x n x n`` matrices exceed free memory."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    itemsize = torch.empty((), dtype=dtype).element_size()
    need = copies * batch * n * n * itemsize
    avail = available_memory_bytes(dev)
    return (need, avail, dev, itemsize) if avail is not None and need > avail else None


def check_memory(n: int, *, batch: int = 1, copies: int = 4, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None, what: str = "exact GP inference") -> None:
    """Refuse, before allocating, work whose ``copies`` dense ``batch x n x n`` matrices exceed free memory.

    Exact inference keeps a few N x N matrices alive at once (kernel matrix, its Cholesky factor, the
    inverse needed by the gradient); ``copies`` counts them.

    Raises
    ------
    MemoryError
        With the requested and the available sizes, and what to reduce.
    """
    short = _shortfall(n, batch, copies, dtype, device)
    if short is not None:
        need, avail, dev, itemsize = short
        raise MemoryError(
            f"{what} with N = {n} (batch {batch}) needs about {need / 2**30:.1f} GiB for {copies} dense "
            f"N x N float64 matrices, but only {avail / 2**30:.1f} GiB is free on {dev}; the largest N that "
            f"fits is about {math.isqrt(avail // (copies * batch * itemsize))}: reduce N (subsample the data) or "
            f"the batch size"
        )


def check_dense_memory(D: int, *, what: str, copies: int = 1, dtype: torch.dtype = torch.float64,
                       device: torch.device | str | None = None, storage: str = "") -> None:
    """Refuse, before allocating, a dense ``(D, D)`` matrix (``copies`` of them) of a posterior that exceeds free
    memory.

    Raises
    ------
    MemoryError
        Naming D, the bytes needed and the bytes free, and what to use instead.
    """
    short = _shortfall(D, 1, copies, dtype, device)
    if short is not None:
        need, avail, dev, _ = short
        via = f" from its {storage} storage" if storage else ""
        raise MemoryError(
            f"{what} is a dense ({D}, {D}) matrix: with D = {D} it needs about {need / 2**30:.2f} GiB but only "
            f"{avail / 2**30:.2f} GiB is free on {dev}; mean, std, quantile, sample, log_prob and summary work"
            f"{via} without it")
