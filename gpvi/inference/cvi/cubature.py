r"""The Gaussian :math:`q(\theta)` of a low-dimensional target by a deterministic cubature fixed point, checked by Monte
Carlo: :class:`CubatureGaussian`, the first engine the fully Bayesian classifier tries for a binary model with at most
:data:`MAX_DIM` log-hyperparameters (:class:`~gpvi.inference.cvi.bayes.FullyBayesianCVI`).

**Fixed point.** The Gaussian :math:`q = \mathcal N(m, V)` that maximises :math:`\mathbb E_q[\log g] + \mathcal H[q]`
satisfies :math:`\mathbb E_q[\nabla\log g] = 0` and :math:`\mathbb E_q[\nabla^2\log g] = -V^{-1}`. With
:math:`x = m + Cz`, :math:`CC^\top = V`, Stein's lemma gives :math:`\mathbb E_q[\nabla^2\log g] =
\mathbb E_q[\nabla\log g(x)\,z^\top]\,C^{-1}`, so both need gradients only -- the statistics of Salimans & Knowles'
Hessian-free regression (:mod:`gpvi.inference.salimans_knowles.estimates`), here taken by Stroud's degree-5 fully
symmetric rule for :math:`\mathcal N(0, I_D)` (:func:`rule5`: :math:`2D^2 + 1` points for :math:`D \le 3`,
:math:`2D^2 - 2D + 1` for :math:`D = 4`, positive weights) instead of stochastic draws. Each iteration is the
natural-gradient step :math:`P \leftarrow (1 - r)P + rP_{new}`, :math:`m \leftarrow m + rP^{-1}\mathbb E[\nabla\log g]`
(:math:`P_{new} = -\mathrm{sym}(\mathbb E[\nabla\log g\,z^\top]C^{-1})`; exact in one step for a Gaussian target):
:math:`r = 1`, halved while :math:`P` is not positive definite and, for later steps, each time the mean's step
reverses (at least 1/8); it stops when the mean moves by less than ``tol`` sds and every sd by less than a factor
:math:`e^{tol}`.

**Check.** The rule integrates polynomials of degree 5; where :math:`\log g` is far from that over
:math:`\pm\sqrt{D + 2}` sds, the fixed point is another Gaussian than the optimum. So the converged q is checked:
the same regression on ``check_pairs`` antithetic pairs of scrambled Sobol' draws of q (Monte Carlo, the estimator of
S&K's window) proposes a new mean and sds; q is accepted only where they move by less than ``check_tol`` (mean in
sds, sds as :math:`|\log|` ratios), else :meth:`CubatureGaussian.run` raises :class:`CubatureRejected` (the caller
then runs S&K). Antithetic pairs cancel the linear part of the gradient, so the check's noise is the target's
non-Gaussianity, like the error it looks for. The check's draws also give the bound estimate (``elbo``, ``elbo_se``).

Measured on the tuning families of issue 59 (``benchmarks/studies/results/bayes_cubature_h59d*.md``; against an
800-step S&K run from the same start): see :data:`CHECK_TOL`.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ...exceptions import NumericalFaultError
from ...posteriors.gaussian import GaussianPosterior
from ...posteriors.info import RunInfo
from ..derivatives import log_joint_and_grad
from ..init import Start

__all__ = ["CubatureGaussian", "CubatureRejected", "rule5", "try_cubature", "MAX_DIM", "CHECK_TOL"]

MAX_DIM = 4
"""The largest D with a degree-5 fully symmetric rule of positive weights (:func:`rule5`)."""

CHECK_TOL = 0.15
"""The largest mean move (in q's sds) and |log sd| change that :class:`CubatureGaussian`'s
Monte Carlo check accepts (16 antithetic Sobol' pairs). On the tuning families
(``benchmarks/studies/results/bayes_cubature_h59d.md``, against an 800-step S&K run from the same start) the fixed
point took 76 / 76 / 95 / 114 EP evaluations (4-6 iterations) against S&K's 401, with q's means 0.010 / 0.012 /
0.053 / 0.018 sd from that run (S&K's default: 0.009 / 0.014 / 0.014 / 0.017 root mean square over seeds 0-2) on xor
N = 100, spirals N = 200, checkerboard N = 200 / 400, where the check moved it by at most 0.097 sd (three scrambles;
checkerboard N = 200's bound equal to the long run's within 0.002 nats, 0.009 se), and 0.58 sd on spirals N = 100 (a
posterior wide in the log signal variance: its bound 0.18 nats below the long run's), where the check's 0.53-0.86 sd
rejects it. Not the classifier's default (:data:`gpvi.inference.cvi.bayes.CUBATURE`): against the long NUTS reference
of the Ripley subsample (D = 3, ``benchmarks/results/classification_bayes_speed_h59d_cubature.md``, seeds 0-2) the
accepted fixed point moved q by 0.10-0.12 of its sds from S&K's, its largest distance from NUTS's means 0.03-0.04 ->
0.13 NUTS sd (test probabilities 0.0065-0.0070 -> 0.0069-0.0086 from NUTS's), with 118 EP evaluations against 511."""



class CubatureRejected(NumericalFaultError):
    """The cubature fixed point did not converge, met a non-finite log joint, or failed its Monte Carlo check;
    ``err.details`` says which (with the fixed point's record)."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


def rule5(D: int, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Stroud's degree-5 fully symmetric rule for :math:`\mathcal N(0, I_D)`, :math:`1 \le D \le 4`: ``(points (n,
    D), weights (n,))``: the origin (weight :math:`2/(D+2)`), :math:`\pm\sqrt{D+2}\,e_i` (weight
    :math:`(4 - D)/(2(D+2)^2)`, absent at D = 4) and :math:`\sqrt{(D+2)/2}(\pm e_i \pm e_j)`, :math:`i < j` (weight
    :math:`1/(D+2)^2`). Exact for every polynomial of degree at most 5.

    Examples
    --------
    >>> Z, W = rule5(3)
    >>> Z.shape, round(float(W.sum()), 12), round(float((W * Z[:, 0] ** 4).sum()), 12)
    (torch.Size([19, 3]), 1.0, 3.0)
    """
    if not 1 <= int(D) <= MAX_DIM:
        raise ValueError(f"rule5 needs 1 <= D <= {MAX_DIM}; got {D}")
    pts, w = [torch.zeros(D, dtype=dtype)], [2.0 / (D + 2)]
    wa = (4.0 - D) / (2.0 * (D + 2) ** 2)
    for i in range(D if wa else 0):
        for s in (1.0, -1.0):
            e = torch.zeros(D, dtype=dtype)
            e[i] = s * math.sqrt(D + 2)
            pts.append(e)
            w.append(wa)
    r = math.sqrt((D + 2) / 2.0)
    for i in range(D):
        for j in range(i + 1, D):
            for si in (1.0, -1.0):
                for sj in (1.0, -1.0):
                    e = torch.zeros(D, dtype=dtype)
                    e[i], e[j] = si * r, sj * r
                    pts.append(e)
                    w.append(1.0 / (D + 2) ** 2)
    return torch.stack(pts), torch.tensor(w, dtype=dtype)


class CubatureGaussian:
    """The cubature fixed point and its check (module docstring).

    Parameters
    ----------
    tol : float
        Stop when the mean moves by less than ``tol`` sds and every sd by less than a factor ``exp(tol)``.
    max_iter : int
        Iterations before :class:`CubatureRejected`.
    check_pairs : int
        Antithetic Sobol' pairs of the check (and of the bound estimate).
    check_tol : float
        The check's largest accepted mean move (sds) and |log sd| change.
    seed : int
        Scramble seed of the check's Sobol' points.
    """

    name = "CubatureGaussian"

    def __init__(self, *, tol: float = 0.01, max_iter: int = 30, check_pairs: int = 16, check_tol: float = 0.15,
                 seed: int = 0) -> None:
        self.tol, self.max_iter = float(tol), int(max_iter)
        self.check_pairs, self.check_tol, self.seed = int(check_pairs), float(check_tol), int(seed)

    def settings(self) -> dict[str, Any]:
        return {"tol": self.tol, "max_iter": self.max_iter, "check_pairs": self.check_pairs,
                "check_tol": self.check_tol, "seed": self.seed}

    def run(self, target: Any, init: Any) -> GaussianPosterior:
        """q from the start ``init`` (a :class:`~gpvi.inference.init.Start` or a strategy giving one, with a scale):
        the accepted fixed point, or :class:`CubatureRejected`."""
        t0 = time.perf_counter()
        start = init if isinstance(init, Start) else init(target)
        m = start.theta.detach().to(torch.float64).clone()
        C = start.scale_tril.detach().to(torch.float64)
        C = torch.diag(C) if C.dim() == 1 else C.clone()
        m, C, record, stop = self.fixed_point(target, m, C)
        evals = record["evaluations"]
        if stop == "non-finite":
            raise CubatureRejected("CubatureGaussian: a non-finite log joint at the rule's points", record)
        if not record["converged"]:
            raise CubatureRejected(f"CubatureGaussian: no fixed point in {self.max_iter} iterations", record)
        shift, log_sd, elbo, se, n = self.check(target, m, C)
        record.update(check_mean_sd=shift, check_log_sd=log_sd, check_evaluations=n)
        evals += n
        if not (shift <= self.check_tol and log_sd <= self.check_tol):
            raise CubatureRejected(f"CubatureGaussian: the Monte Carlo check moves the mean by {shift:.3g} sd and the "
                                   f"sds by up to exp({log_sd:.3g}) (accepted: {self.check_tol:g})", record)
        wall = time.perf_counter() - t0
        info = RunInfo(engine=self.name, converged=True, interrupted=False, steps=record["iterations"], time_s=wall,
                       total_time_s=wall, settings=self.settings(), counters={"log_joint_evals": evals},
                       details={**record, "elbo_method": f"Monte Carlo, the check's {n} draws"})
        return GaussianPosterior(m, C, list(target.names), target, elbo=elbo, elbo_se=se, info=info)

    def fixed_point(self, target: Any, m: torch.Tensor, C: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], str]:
        """The damped fixed-point iteration from ``(m, C)`` (module docstring): ``(m, C, record, stop)``, the last
        iterate, ``{"iterations", "evaluations", "converged"}`` and why it stopped (``"converged"``,
        ``"non-finite"``: a log joint or gradient at the rule's points that is not finite, the iterate before it
        returned; ``"max_iter"``)."""
        Z, W = rule5(m.shape[0])
        rho, prev, evals, record = 1.0, None, 0, {"iterations": 0, "converged": False, "evaluations": 0}
        for it in range(self.max_iter):
            record["iterations"] = it + 1
            lj, g = log_joint_and_grad(target, m + Z @ C.T, None)
            evals += Z.shape[0]
            record["evaluations"] = evals
            if not bool(torch.isfinite(lj).all() and torch.isfinite(g).all()):
                return m, C, record, "non-finite"
            Eg = (W[:, None] * g).sum(0)
            Hbar = torch.linalg.solve_triangular(C, (W[:, None] * g).T @ Z, upper=False, left=False)
            P_new, P_old = -0.5 * (Hbar + Hbar.T), torch.cholesky_inverse(C)
            r = rho
            for _ in range(40):
                L, info = torch.linalg.cholesky_ex((1.0 - r) * P_old + r * P_new)
                if int(info) == 0:
                    break
                r *= 0.5
            step = r * torch.cholesky_solve(Eg.unsqueeze(-1), L).squeeze(-1)
            C_new = torch.linalg.cholesky(torch.cholesky_inverse(L))
            sd_old, sd_new = C.square().sum(-1).sqrt(), C_new.square().sum(-1).sqrt()
            if prev is not None and float(step @ prev) < 0:
                rho = max(0.125, 0.5 * rho)
            prev = step
            m, C = m + step, C_new
            if float((step.abs() / sd_new).max()) < self.tol and float((sd_new / sd_old).log().abs().max()) < self.tol:
                record["converged"] = True
                return m, C, record, "converged"
        return m, C, record, "max_iter"

    def check(self, target: Any, m: torch.Tensor, C: torch.Tensor) -> tuple[float, float, float, float, int]:
        """``(mean move in sds, largest |log sd| change, bound, its se, evaluations)``: S&K's Hessian-free
        regression on ``check_pairs`` antithetic pairs of scrambled Sobol' draws of :math:`\\mathcal N(m, CC^\\top)`
        (module docstring); ``inf`` where a draw's log joint is not finite or the proposed precision is not
        positive definite."""
        D, k = m.shape[0], self.check_pairs
        u = torch.quasirandom.SobolEngine(D, scramble=True, seed=self.seed).draw(k, dtype=torch.float64)
        eps = torch.special.ndtri(u.clamp(1e-16, 1.0 - 1e-16))
        E = torch.cat([eps, -eps])
        lj, g = log_joint_and_grad(target, m + E @ C.T, None)
        if not bool(torch.isfinite(lj).all() and torch.isfinite(g).all()):
            return math.inf, math.inf, math.nan, math.nan, 2 * k
        log_q = -0.5 * (E * E).sum(-1) - 0.5 * D * math.log(2 * math.pi) - torch.log(torch.diagonal(C)).sum()
        v = (lj - log_q).detach()
        B = (0.5 * (g[:k] - g[k:])).T @ eps / k
        M = torch.linalg.solve((C @ (eps.T @ eps / k)).T, B.T).T          # B A^-1, A = E[(x - m) eps^T]
        L, info = torch.linalg.cholesky_ex(-0.5 * (M + M.T))
        if int(info):
            return math.inf, math.inf, float(v.mean()), float(v.std() / math.sqrt(2 * k)), 2 * k
        sd = C.square().sum(-1).sqrt()
        shift = torch.cholesky_solve(g.mean(0).unsqueeze(-1), L).squeeze(-1)
        log_sd = (torch.cholesky_inverse(L).diagonal().sqrt() / sd).log()
        return (float((shift.abs() / sd).max()), float(log_sd.abs().max()), float(v.mean()),
                float(v.std() / math.sqrt(2 * k)), 2 * k)


def try_cubature(target: Any, start: Any, seed: int = 0) -> tuple[GaussianPosterior | None, dict[str, Any] | None]:
    """``(q, record)``: q by :class:`CubatureGaussian` (``q.engine`` the engine; record its details, ``accepted``
    True), ``(None, record)`` where it was rejected (``accepted`` False, ``reason``), ``(None, None)`` where D >
    :data:`MAX_DIM`."""
    if target.dim > MAX_DIM:
        return None, None
    cub = CubatureGaussian(check_tol=CHECK_TOL, seed=seed)
    try:
        q = cub.run(target, start)
    except CubatureRejected as err:
        return None, {"accepted": False, "reason": str(err), **err.details}
    q.engine = cub
    return q, {"accepted": True, **q.info.details}
