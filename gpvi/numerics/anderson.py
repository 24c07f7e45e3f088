r"""Anderson acceleration of a fixed-point map on flat vectors (type II, Walker & Ni 2011).

For the iterates :math:`x_k` and their images :math:`g_k = G(x_k)`, with residuals :math:`r_k = g_k - x_k` and the
last :math:`m + 1` of them kept, the next iterate is

.. math::

    x_{k+1} = g_k - \Delta G\,\gamma, \qquad \gamma = \arg\min_\gamma \lVert r_k - \Delta R\,\gamma\rVert^2,

where the columns of :math:`\Delta R` and :math:`\Delta G` are the differences of consecutive residuals and
images. With an empty history (one pair) it is the plain step :math:`g_k`. The least-squares problem is solved by
its normal equations with a relative ridge of 1e-12 (the columns are nearly dependent near a fixed point).

Used by multi-class EP (:mod:`gpvi.numerics.ep_multiclass`, on the damped site map) and by the inner CVI runs of
type-II learning (:func:`gpvi.inference.cvi.typeii.monotone_run`); both guard every extrapolation (a rejected one
is replaced by the plain step and the history is cleared).
"""

from __future__ import annotations

import torch

from ..validation import check_nonnegative_int

__all__ = ["Anderson"]


class Anderson:
    """Anderson acceleration (type II, memory ``memory``) of a fixed-point map on flat vectors (module docstring).

    Examples
    --------
    >>> import torch
    >>> A = torch.tensor([[0.9, 0.05], [0.0, 0.8]], dtype=torch.float64)
    >>> b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    >>> acc, x = Anderson(2), torch.zeros(2, dtype=torch.float64)
    >>> for _ in range(4):                      # a linear map: exact after memory + 1 steps
    ...     x = acc.step(x, A @ x + b)
    >>> bool(torch.allclose(x, torch.linalg.solve(torch.eye(2, dtype=torch.float64) - A, b)))
    True
    """

    def __init__(self, memory: int) -> None:
        self.memory = check_nonnegative_int(memory, "memory")
        self.g: list[torch.Tensor] = []
        self.r: list[torch.Tensor] = []

    def clear(self) -> None:
        """Forget the history (the next step is the plain one)."""
        self.g.clear()
        self.r.clear()

    def step(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """The next iterate from the current one ``x`` and its map ``g = G(x)``."""
        self.g.append(g)
        self.r.append(g - x)
        if len(self.r) > self.memory + 1:
            self.g.pop(0)
            self.r.pop(0)
        if len(self.r) < 2:
            return g
        dR = torch.stack([b - a for a, b in zip(self.r[:-1], self.r[1:])], 1)
        dG = torch.stack([b - a for a, b in zip(self.g[:-1], self.g[1:])], 1)
        A = dR.mT @ dR                                                     # normal equations, a relative ridge
        A.diagonal().add_(1e-12 * float(A.diagonal().max()) + 1e-300)
        gamma = torch.linalg.solve(A, dR.mT @ self.r[-1])
        return g - dG @ gamma
