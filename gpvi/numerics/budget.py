"""One memory budget for every batched evaluation of a log joint.

Engines evaluate the log joint on batches of draws: S draws per step, hundreds for a final bound estimate. For an
exact GP each draw holds a few dense N x N matrices at once (kernel matrix, its factor, the inverse the gradient
needs), so a batch of 250 draws at N = 2,000 would need 8 GB. The driver gives every engine a
:class:`MemoryBudget`; whatever is evaluated in batches is cut into chunks of :meth:`MemoryBudget.draws_per_call`
draws, so no call allocates more than the budget, on any device.

A target says what one draw costs through the optional ``memory_per_draw()`` method (bytes for one row of a
batched log joint with its gradient; :class:`gpvi.GPRegression` implements it). Targets without it are taken to
need a negligible amount per draw (their batches are not cut).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..validation.memory import available_memory_bytes

__all__ = ["MemoryBudget", "DEFAULT_BUDGET_BYTES", "memory_per_draw"]

DEFAULT_BUDGET_BYTES = 1 << 30
"""Default budget of one batched evaluation on the CPU: 1 GiB (or a quarter of the free memory, if less). On an
accelerator the default is a quarter of its free memory: there a larger batch keeps paying (many NUTS chains
advancing together, :mod:`gpvi.inference.mcmc.chains`), where on the CPU a call's cost grows with its batch."""


def memory_per_draw(target: Any) -> int:
    """Bytes one draw of a batched log-joint call with gradient needs on ``target`` (0 if it does not say)."""
    fn = getattr(target, "memory_per_draw", None)
    if not callable(fn):
        return 0
    n = int(fn())
    if n < 0:
        raise ValueError(f"target.memory_per_draw() must be >= 0 bytes; got {n}")
    return n


@dataclass(frozen=True)
class MemoryBudget:
    """The most memory one batched evaluation may allocate.

    Parameters
    ----------
    max_bytes : int or None
        Bytes per call. ``None`` (default): a quarter of the free memory of the device, read when
        :meth:`draws_per_call` is called, and on the CPU at most :data:`DEFAULT_BUDGET_BYTES`.

    Examples
    --------
    >>> budget = MemoryBudget(max_bytes=100 * 2**20)          # 100 MiB per call
    >>> class Big:
    ...     def memory_per_draw(self): return 32 * 2**20     # 32 MiB per draw
    >>> budget.draws_per_call(Big(), 250)
    3
    """

    max_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.max_bytes is not None and (isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int)
                                           or self.max_bytes < 1):
            raise ValueError(f"max_bytes must be a positive int (bytes) or None; got {self.max_bytes!r}")

    def limit(self, device: torch.device | str | None = None) -> int:
        """The budget in bytes on ``device``."""
        if self.max_bytes is not None:
            return self.max_bytes
        dev = torch.device(device) if device is not None else torch.device("cpu")
        free = available_memory_bytes(dev)
        if free is None:
            return DEFAULT_BUDGET_BYTES
        return max(1, free // 4 if dev.type != "cpu" else min(DEFAULT_BUDGET_BYTES, free // 4))

    def draws_per_call(self, target: Any, wanted: int, device: torch.device | str | None = None) -> int:
        """How many of ``wanted`` draws one log-joint call on ``target`` may take (at least 1, at most ``wanted``).

        ``device`` defaults to the target's ``device`` attribute, else the CPU.
        """
        per = memory_per_draw(target)
        if per == 0:
            return max(1, int(wanted))
        if device is None:
            device = getattr(target, "device", None)
        return max(1, min(int(wanted), self.limit(device) // per))

    def describe(self, target: Any, wanted: int) -> dict[str, Any]:
        """A record for ``info``: the budget, the bytes per draw and the chunk size chosen for ``wanted`` draws."""
        return {"budget_bytes": self.limit(getattr(target, "device", None)),
                "bytes_per_draw": memory_per_draw(target), "draws_per_call": self.draws_per_call(target, wanted)}
