r"""Convergence diagnostics of draws from several chains: bulk and tail ESS, split :math:`\hat R`, MCSE.

They are ArviZ's (rank-normalised, folded split :math:`\hat R` and bulk/tail ESS of Vehtari et al. 2021), computed
per parameter over draws of shape ``(C, S, D)`` (chains, draws per chain, parameters).
:meth:`gpvi.posteriors.samples.SamplePosterior.diagnostics` and the NUTS/HMC engines' end-of-run checks
(:mod:`gpvi.inference.mcmc.diagnostics`) both use :func:`diagnostics`.

References
----------
A. Vehtari, A. Gelman, D. Simpson, B. Carpenter, P.-C. Bürkner (2021). Rank-normalization, folding, and
localization: an improved R-hat for assessing convergence of MCMC. Bayesian Analysis 16(2).
"""

from __future__ import annotations

import math
import warnings

from typing import Any

import numpy as np
import torch

__all__ = ["diagnostics", "DIAGNOSTICS"]

DIAGNOSTICS = ("ess_bulk", "ess_tail", "r_hat", "mcse_mean", "mcse_sd")
"""What :func:`diagnostics` returns, named as ArviZ's ``summary`` names its columns."""


def diagnostics(draws: torch.Tensor) -> dict[str, torch.Tensor]:
    """ArviZ's convergence diagnostics per parameter of ``draws`` ``(C, S, D)``; NaN for fewer than 4 draws per
    chain.

    Returns
    -------
    dict of str to torch.Tensor of shape (D,)
        ``ess_bulk``, ``ess_tail`` (``arviz.ess``, methods "bulk" and "tail"), ``r_hat`` (``arviz.rhat``, rank
        normalised split R-hat), ``mcse_mean``, ``mcse_sd`` (``arviz.mcse``).
    """
    D = draws.shape[-1]
    out = {k: torch.full((D,), math.nan, dtype=torch.float64, device="cpu") for k in DIAGNOSTICS}
    if draws.shape[1] >= 4:
        import arviz as az                                       # imported on use: importing ArviZ takes seconds

        x = draws.detach().cpu().double().numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")                      # constant chains: ArviZ warns and returns NaN
            for j in range(D):
                a = x[:, :, j]
                vals = (az.ess(a, method="bulk"), az.ess(a, method="tail"), az.rhat(a), az.mcse(a),
                        mcse_sd(az, a))
                for k, v in zip(DIAGNOSTICS, vals):
                    out[k][j] = np.asarray(v, dtype=np.float64).item()    # with Numba, ArviZ returns (1,) arrays
    return {k: v.to(device=draws.device) for k, v in out.items()}


def mcse_sd(az: Any, a: np.ndarray) -> float:
    r"""``arviz.mcse(a, method="sd")`` for draws ``a`` ``(C, S)``; where ArviZ fails, its own formula.

    ArviZ 0.23 with Numba installed calls ``float`` on a one-element array, a ``TypeError`` in recent NumPy; the
    same estimate is then computed here with ArviZ's mean ESS of the squared deviations
    :math:`d = (x - \bar x)^2`:

    .. math::

        \mathrm{MCSE}(\mathrm{sd}) = \sqrt{\frac{\overline{d^2} - \bar d^{\,2}}{4\,\mathrm{ESS}(d)\,\bar d}}.
    """
    try:
        return np.asarray(az.mcse(a, method="sd"), dtype=np.float64).item()
    except TypeError:
        d = (a - a.mean()) ** 2
        evar = float(d.mean())
        varvar = (float((d * d).mean()) - evar ** 2) / np.asarray(az.ess(d, method="mean"), dtype=np.float64).item()
        return math.sqrt(varvar / evar / 4) if evar > 0 and varvar >= 0 else math.nan
