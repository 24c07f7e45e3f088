r"""Data subsampling: the second "stochastic" of doubly stochastic variational inference.

For a factorised likelihood :math:`g(\theta) = p(\theta) \prod_{n=1}^N p(x_n \mid \theta)` the DSVI paper
(section 2, last paragraph; section 3.3; slides "Data subsampling") replaces :math:`\log g` in each step by

.. math::

    \log g_t(\theta) = \frac{N}{M} \sum_{n \in B_t} \log p(x_n \mid \theta) + \log p(\theta),

where :math:`B_t` is a fresh minibatch of :math:`M` data indices drawn at step :math:`t`. Because
:math:`\mathbb E_{B_t}[\log g_t(\theta)] = \log g(\theta)` (and likewise for its gradient), the doubly
stochastic gradients stay unbiased, and no step ever touches the whole data set.

:class:`MinibatchTarget` implements the *minibatch target protocol* used by :class:`gpvi.inference.dsvi.engine.DSVI`:

* ``sample_minibatch(generator) -> batch`` draws :math:`B_t` from the engine's generator (so the engine's
  generator state alone makes runs reproducible and resumable);
* ``log_joint(theta, batch=batch)`` evaluates :math:`\log g_t` on ``(S, D)`` draws;
* ``log_joint(theta)`` without a batch evaluates the exact full-data :math:`\log g`, streaming over the data
  in chunks of ``chunk_size`` rows (memory :math:`O(S \cdot \text{chunk\_size})`), for final bound estimates.

Names: ``num_data`` = :math:`N`, ``batch_size`` = :math:`M`, ``batch`` = :math:`B_t` (a LongTensor of indices).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..validation import check_bool, check_positive_int, check_theta

__all__ = ["MinibatchTarget"]


class MinibatchTarget:
    r"""A target whose log joint is estimated from a random minibatch of a factorised likelihood.

    Parameters
    ----------
    log_lik : callable
        ``log_lik(theta, idx) -> (S, M)``: per-datum log likelihoods :math:`\log p(x_n \mid \theta_s)` for the
        ``(S, D)`` draws ``theta`` and the data indices ``idx`` (a ``(M,)`` int64 tensor). Differentiable in
        ``theta``. The function owns the data (in memory or fetched by index), so data never has to be loaded
        whole.
    num_data : int
        N, the total number of data points.
    names : sequence of str or int
        Names of theta's components (or their number D).
    log_prior : callable, optional
        ``log_prior(theta) -> (S,)``; ``None`` means no prior term (e.g. DSVI-ARD, which handles the prior
        analytically).
    batch_size : int
        M, the minibatch size (the paper uses 500). Must be <= N.
    replace : bool
        ``True`` (default): indices drawn uniformly with replacement (``torch.randint``, O(M) per step).
        ``False``: a uniformly random subset without replacement (``torch.randperm``, O(N) per step).
        Both give unbiased :math:`\log g_t`.
    chunk_size : int
        Rows per chunk when evaluating the full-data log joint (``batch=None``).
    initial_theta : array-like of shape (D,), optional
        Returned by :meth:`initial_theta` (engines start there when no ``init`` is given).

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.minibatch import MinibatchTarget
    >>> x = torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 3.0
    >>> lik = lambda th, idx: -0.5 * (x[idx][None, :] - th[:, :1]) ** 2       # N(x_n | theta, 1)
    >>> t = MinibatchTarget(lik, 1000, ["m"], batch_size=100)
    >>> b = t.sample_minibatch(torch.Generator().manual_seed(1))
    >>> t.log_joint(torch.zeros(2, 1, dtype=torch.float64), batch=b).shape
    torch.Size([2])
    """

    def __init__(self, log_lik: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], num_data: int,
                 names: Sequence[str] | int, *, log_prior: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 batch_size: int = 500, replace: bool = True, chunk_size: int = 10_000,
                 initial_theta: Any = None) -> None:
        if not callable(log_lik):
            raise TypeError(f"log_lik must be callable as log_lik(theta, idx); got {type(log_lik).__name__}")
        if log_prior is not None and not callable(log_prior):
            raise TypeError(f"log_prior must be callable or None; got {type(log_prior).__name__}")
        self.num_data = check_positive_int(num_data, "num_data")
        if isinstance(names, int) and not isinstance(names, bool):
            names = [f"theta[{i}]" for i in range(check_positive_int(names, "names"))]
        elif isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError("names must be a sequence of str or an int")
        self.names = [str(n) for n in names]
        if not self.names:
            raise ValueError("names is empty: a target needs at least one parameter")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        if self.batch_size > self.num_data:
            raise ValueError(f"batch_size ({self.batch_size}) must be <= num_data ({self.num_data})")
        self.replace = check_bool(replace, "replace")
        self.chunk_size = check_positive_int(chunk_size, "chunk_size")
        self.log_lik = log_lik
        self.log_prior = log_prior
        self._initial = None if initial_theta is None else check_theta(initial_theta, self.dim, "initial_theta")

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return len(self.names)

    @property
    def scale(self) -> float:
        """The factor N / M applied to the minibatch sum."""
        return self.num_data / self.batch_size

    def initial_theta(self) -> torch.Tensor:
        """The ``initial_theta`` given at construction, else zeros."""
        if self._initial is not None:
            return self._initial.clone()
        return torch.zeros(self.dim, dtype=torch.float64)

    def sample_minibatch(self, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw the indices :math:`B_t` of one minibatch, shape ``(M,)``, from ``generator``."""
        if self.replace:
            return torch.randint(self.num_data, (self.batch_size,), generator=generator)
        return torch.randperm(self.num_data, generator=generator)[: self.batch_size]

    def _lik(self, theta: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        out = self.log_lik(theta, idx)
        if out.shape != (theta.shape[0], idx.shape[0]):
            raise ValueError(f"log_lik returned shape {tuple(out.shape)} for theta {tuple(theta.shape)} and "
                             f"{idx.shape[0]} indices; expected {(theta.shape[0], idx.shape[0])}")
        return out

    def log_joint(self, theta: Any, batch: torch.Tensor | None = None) -> torch.Tensor:
        r"""``log g_t(theta)`` for a minibatch, or the exact ``log g(theta)`` when ``batch`` is None.

        Parameters
        ----------
        theta : tensor of shape (D,) or (S, D)
        batch : LongTensor of shape (M,), optional
            Indices from :meth:`sample_minibatch`. ``None``: full data, streamed in chunks.

        Returns
        -------
        torch.Tensor of shape () or (S,)
        """
        theta = check_theta(theta, self.dim)
        single = theta.dim() == 1
        th = theta.unsqueeze(0) if single else theta
        if batch is not None:
            idx = torch.as_tensor(batch, dtype=torch.long)
            val = self._lik(th, idx).sum(-1) * (self.num_data / idx.shape[0])
        else:
            val = th.new_zeros(th.shape[0])
            for start in range(0, self.num_data, self.chunk_size):
                idx = torch.arange(start, min(start + self.chunk_size, self.num_data))
                val = val + self._lik(th, idx).sum(-1)
        if self.log_prior is not None:
            val = val + self.log_prior(th)
        return val[0] if single else val

    def __repr__(self) -> str:
        return (f"MinibatchTarget(N={self.num_data}, M={self.batch_size}, D={self.dim}, "
                f"replace={self.replace})")
