r"""The best Gaussian by a deterministic bound: :func:`fit_gaussian_quadrature`, the reference DSVI is checked against.

For a model whose Gaussian variational bound can be computed without Monte Carlo -- :class:`gpvi.models.logistic.
BayesianLogisticRegression`, whose :meth:`~gpvi.models.logistic.BayesianLogisticRegression.gaussian_bound` takes
each one-dimensional :math:`\mathbb E_q[\log s(y_n x_n^\top\theta)]` by Gauss–Hermite quadrature -- the bound
(DSVI paper eq. 10, :math:`\Sigma = CC^\top`)

.. math::

    \mathcal F(\mu, C) = \sum_n \mathbb E_q[\log s(y_n x_n^\top\theta)]
    - \frac{\lVert\mu\rVert^2 + \lVert C\rVert_F^2}{2v} - \frac D2\log(2\pi v)
    + \sum_d \log C_{dd} + \frac D2(1 + \log 2\pi)

is maximised over :math:`(\mu, C)` by L-BFGS-B with its exact autograd gradient. It is concave in
:math:`(\mu, C)` for a concave log joint (Challis & Barber 2013; DSVI paper section 2), so the optimum is the unique
answer stochastic DSVI must converge to (the paper's Figure 2 uses Challis & Barber's code for the same purpose).

Names: ``mu`` = :math:`\mu`, ``C`` = :math:`C` (lower triangular, parametrised by its strictly lower part and the
log of its diagonal).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..numerics.lbfgs import lbfgs_maximise
from ..posteriors.gaussian import GaussianPosterior
from ..validation import check_positive, check_positive_int

__all__ = ["fit_gaussian_quadrature"]


def fit_gaussian_quadrature(model: Any, *, num_points: int = 64, max_iter: int = 10_000,
                            gtol: float = 1e-10) -> GaussianPosterior:
    r"""Maximise ``model.gaussian_bound(mu, C, num_points=...)`` over :math:`(\mu, C)` with L-BFGS-B.

    C is parametrised by its strictly lower part and the log of its diagonal (started at :math:`\mu = 0`,
    :math:`C = 0.1 I`); SciPy's L-BFGS-B (:func:`gpvi.numerics.lbfgs.lbfgs_maximise`) uses the exact autograd
    gradient.

    Parameters
    ----------
    model : BayesianLogisticRegression or any model with ``dim``, ``names`` and ``gaussian_bound(mu, C, *,
        num_points)``
    num_points : int
        Gauss–Hermite points per data point.
    max_iter : int
        Cap on the L-BFGS-B iterations.
    gtol : float
        SciPy's projected-gradient tolerance.

    Returns
    -------
    GaussianPosterior
        ``mean``, ``scale_tril``, ``elbo`` (the maximised bound, exact up to quadrature error) and ``info`` with
        the optimiser's result (``iterations``, ``evaluations``, ``converged``, ``message``).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.inference.quadrature_fit import fit_gaussian_quadrature
    >>> ds = gpvi.datasets.load_pima()
    >>> ref = fit_gaussian_quadrature(gpvi.BayesianLogisticRegression(ds.X_train, ds.y_train))
    >>> ref.info["converged"]
    True
    """
    num_points = check_positive_int(num_points, "num_points")
    max_iter = check_positive_int(max_iter, "max_iter")
    gtol = check_positive(gtol, "gtol")
    D = model.dim
    il = torch.tril_indices(D, D, offset=-1)

    def unpack(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu = x[:D]
        C = torch.zeros(D, D, dtype=x.dtype)
        C = C.index_put((il[0], il[1]), x[D:D + il.shape[1]])
        C = C + torch.diag(torch.exp(x[D + il.shape[1]:]))
        return mu, C

    def bound(x: torch.Tensor) -> torch.Tensor:
        mu, C = unpack(x)
        return model.gaussian_bound(mu, C, num_points=num_points)

    x0 = torch.zeros(D + il.shape[1] + D, dtype=torch.float64)
    x0[D + il.shape[1]:] = math.log(0.1)
    res = lbfgs_maximise(bound, x0, max_iter=max_iter, gtol=gtol, ftol=1e-15, history=30, catch=())
    mu, C = unpack(res.x)
    info = {"iterations": res.iterations, "evaluations": res.evaluations, "converged": res.converged,
            "message": res.message, "num_points": num_points,
            "method": "L-BFGS-B on the Gauss-Hermite Gaussian bound"}
    return GaussianPosterior(mu, C, list(model.names), model, elbo=res.value, elbo_se=0.0, info=info)
