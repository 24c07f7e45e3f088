r"""Salimans & Knowles (2013), Algorithm 1: stochastic linear regression for a low-dimensional exponential family.

For :math:`q_\eta(x) \propto \exp(\tilde T(x)\tilde\eta)` with statistics :math:`\tilde T(x) = [1, T(x)]`, the
KL-optimal natural parameters satisfy the fixed point (paper eq. 9)

.. math::

    \tilde\eta = \mathbb E_q[\tilde T(x)^\top\tilde T(x)]^{-1}\,\mathbb E_q[\tilde T(x)^\top\log p(x, y)],

a linear regression of :math:`\log p` on the sufficient statistics, solved by stochastic approximation
(:class:`SKExpFamily`) with the paper's section-5 quantities: the bound :math:`\hat\eta_0 + U(\hat\eta)`, the
evidence estimate of eq. (19) and :math:`R^2`. When the posterior is in the family the regression is noise free and
recovers it exactly after :math:`2(k+1)` steps (eq. 13, section 4.0.1). Families: :class:`Exponential`,
:class:`Gamma`, :class:`Normal`, or any object with the same methods.

Names follow the paper: ``w`` = :math:`w`; ``num_steps`` = :math:`N`; ``eta`` = :math:`\eta`, ``eta0`` = the
intercept :math:`\eta_0`; ``C``, ``g`` the running averages of :math:`\tilde T^\top\tilde T` and
:math:`\tilde T^\top\log p`.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Any

import scipy.special
import torch

from ...exceptions import NumericalFaultError
from ...posteriors.info import RunInfo
from ...rng import resolve_generator
from ...validation import as_float_tensor, check_choice, check_fraction, check_positive, check_positive_int
from .estimates import strict_cholesky

__all__ = ["SKExpFamily", "SKExpFamilyResult", "Exponential", "Gamma", "Normal"]


class Exponential:
    r"""Exponential family member :math:`q(x) = \lambda e^{-\lambda x}`, :math:`x > 0`.

    :math:`T(x) = x`, :math:`\eta = -\lambda` (valid for :math:`\eta < 0`), log normaliser
    :math:`U(\eta) = -\log(-\eta)`. Draws by inverse CDF. The paper's section 4.0.1 example.

    Examples
    --------
    >>> fam = Exponential()
    >>> eta = fam.natural(rate=2.0)
    >>> eta.tolist(), fam.params(eta), fam.is_valid(eta)
    ([-2.0], {'rate': 2.0}, True)
    """

    num_stats = 1
    stat_names = ("x",)

    def natural(self, rate: float) -> torch.Tensor:
        """:math:`\\eta` from the rate :math:`\\lambda > 0`."""
        return torch.tensor([-check_positive(rate, "rate")], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        return {"rate": -float(eta[0])}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[0]) < 0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`T(x)`, ``(n,) -> (n, 1)``."""
        return x.unsqueeze(-1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        return -torch.log1p(-u) / (-eta[0])

    def log_normalizer(self, eta: torch.Tensor) -> float:
        return -math.log(-float(eta[0]))

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, x]` (paper eq. 16, in x)."""
        lam = -float(eta[0])
        return torch.tensor([[1.0, 1 / lam], [1 / lam, 2 / lam ** 2]], dtype=torch.float64)


class Gamma:
    r"""Gamma family :math:`q(x) \propto x^{\alpha-1}e^{-\beta x}` (shape :math:`\alpha`, rate :math:`\beta`).

    :math:`T(x) = (\log x, x)`, :math:`\eta = (\alpha - 1, -\beta)` (valid for :math:`\eta_1 > -1`,
    :math:`\eta_2 < 0`), :math:`U(\eta) = \log\Gamma(\eta_1 + 1) - (\eta_1 + 1)\log(-\eta_2)`. Draws by inverse CDF
    (``scipy.special.gammaincinv`` of generator uniforms; no global RNG).

    Examples
    --------
    >>> fam = Gamma()
    >>> eta = fam.natural(shape=3.0, rate=2.0)
    >>> eta.tolist(), fam.params(eta)
    ([2.0, -2.0], {'shape': 3.0, 'rate': 2.0})
    """

    num_stats = 2
    stat_names = ("log x", "x")

    def natural(self, shape: float, rate: float) -> torch.Tensor:
        """:math:`\\eta` from shape :math:`\\alpha > 0` and rate :math:`\\beta > 0`."""
        a = check_positive(shape, "shape")
        b = check_positive(rate, "rate")
        return torch.tensor([a - 1.0, -b], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        return {"shape": float(eta[0]) + 1.0, "rate": -float(eta[1])}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[0]) > -1.0 and float(eta[1]) < 0.0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.log(x), x], -1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        p = self.params(eta)
        u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_(2.0 ** -60, 1.0 - 2.0 ** -53)
        return torch.from_numpy(scipy.special.gammaincinv(p["shape"], u.numpy())) / p["rate"]

    def log_normalizer(self, eta: torch.Tensor) -> float:
        a, b = float(eta[0]) + 1.0, -float(eta[1])
        return math.lgamma(a) - a * math.log(b)

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, \log x, x]` (digamma/trigamma)."""
        p = self.params(eta)
        a, b = p["shape"], p["rate"]
        El = float(scipy.special.digamma(a)) - math.log(b)
        Ex = a / b
        Ell = float(scipy.special.polygamma(1, a)) + El ** 2
        Exl = a / b * (float(scipy.special.digamma(a + 1.0)) - math.log(b))
        Exx = a * (a + 1.0) / b ** 2
        return torch.tensor([[1.0, El, Ex], [El, Ell, Exl], [Ex, Exl, Exx]], dtype=torch.float64)


class Normal:
    r"""Univariate normal family :math:`q(x) = \mathcal N(\mu, \sigma^2)`.

    :math:`T(x) = (x, x^2)`, :math:`\eta = (\mu/\sigma^2, -1/(2\sigma^2))` (valid for :math:`\eta_2 < 0`),
    :math:`U(\eta) = \tfrac12\log(\pi / -\eta_2) - \eta_1^2/(4\eta_2)`.

    Examples
    --------
    >>> fam = Normal()
    >>> fam.params(fam.natural(mean=1.0, var=4.0))
    {'mean': 1.0, 'var': 4.0}
    """

    num_stats = 2
    stat_names = ("x", "x^2")

    def natural(self, mean: float, var: float) -> torch.Tensor:
        """:math:`\\eta` from the mean and the variance :math:`\\sigma^2 > 0`."""
        v = check_positive(var, "var")
        if not isinstance(mean, numbers.Real) or not math.isfinite(float(mean)):
            raise ValueError(f"mean must be a finite number; got {mean!r}")
        return torch.tensor([float(mean) / v, -0.5 / v], dtype=torch.float64)

    def params(self, eta: torch.Tensor) -> dict[str, float]:
        var = -0.5 / float(eta[1])
        return {"mean": float(eta[0]) * var, "var": var}

    def is_valid(self, eta: torch.Tensor) -> bool:
        return bool(torch.isfinite(eta).all()) and float(eta[1]) < 0.0

    def stats(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([x, x * x], -1)

    def sample(self, eta: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
        p = self.params(eta)
        return p["mean"] + math.sqrt(p["var"]) * torch.randn(n, generator=generator, dtype=torch.float64,
                                                             device=generator.device if generator else "cpu")

    def log_normalizer(self, eta: torch.Tensor) -> float:
        e1, e2 = float(eta[0]), float(eta[1])
        return 0.5 * math.log(math.pi / -e2) - e1 * e1 / (4.0 * e2)

    def second_moment(self, eta: torch.Tensor) -> torch.Tensor:
        r""":math:`\mathbb E_q[\tilde T^\top\tilde T]` for :math:`\tilde T = [1, x, x^2]` (moments up to 4)."""
        p = self.params(eta)
        mu, s2 = p["mean"], p["var"]
        m1, m2 = mu, mu * mu + s2
        m3 = mu ** 3 + 3 * mu * s2
        m4 = mu ** 4 + 6 * mu * mu * s2 + 3 * s2 * s2
        return torch.tensor([[1.0, m1, m2], [m1, m2, m3], [m2, m3, m4]], dtype=torch.float64)


@dataclass
class SKExpFamilyResult:
    r"""Result of :class:`SKExpFamily` (Algorithm 1) with the section-5 quantities.

    Attributes
    ----------
    eta : torch.Tensor of shape (k,)
        :math:`\hat\eta = (\bar C^{-1}\bar g)_{1:k}`, natural parameters of q.
    eta0 : float
        The intercept :math:`\hat\eta_0` of the regression.
    family : object
        The exponential family (``family.params(eta)`` gives the usual parameters).
    log_bound : float
        :math:`\hat\eta_0 + U(\hat\eta)`, the variational lower bound on :math:`\log p(y)` at convergence
        (section 5).
    log_evidence : float
        :math:`\hat\eta_0 + U(\hat\eta) + \tfrac12 s^2` (eq. 19), :math:`s^2` the mean squared residual of the
        regression over the averaging window.
    kl : float
        :math:`\tfrac12 s^2`, the approximate KL divergence of q from the posterior.
    r_squared : float
        :math:`R^2 = 1 - s^2/\mathrm{Var}[\log p]` over the averaging window (1 for an exact fit).
    trace : dict
        ``eta`` of shape (N, k): the natural parameters used for drawing at each step; ``valid`` (N,): whether
        the regression's :math:`\tilde\eta_{t+1}` was a proper distribution.
    info : RunInfo
        ``steps``, ``time_s``; counters ``improper_steps``, ``log_p_evals``; details ``step_size``,
        ``num_averaged``.
    """

    eta: torch.Tensor
    eta0: float
    family: Any
    log_bound: float
    log_evidence: float
    kl: float
    r_squared: float
    trace: dict[str, torch.Tensor]
    info: RunInfo

    @property
    def params(self) -> dict[str, float]:
        """The usual parameters of q (e.g. ``{"shape": ..., "rate": ...}`` for :class:`Gamma`)."""
        return self.family.params(self.eta)


class SKExpFamily:
    r"""Algorithm 1 of Salimans & Knowles (2013): stochastic linear regression for an exponential-family q.

    For :math:`\tilde T(x) = [1, T(x)]` and a single draw :math:`x_t^* \sim q_{\eta_t}` per step,

    .. math::

        \hat g_t = \tilde T(x_t^*)^\top\log p(x_t^*, y),\quad \hat C_t = \tilde T(x_t^*)^\top\tilde T(x_t^*),\quad
        g_{t+1} = (1-w)g_t + w\hat g_t,\quad C_{t+1} = (1-w)C_t + w\hat C_t,\quad
        \tilde\eta_{t+1} = C_{t+1}^{-1}g_{t+1}

    (eq. 11), :math:`w = 1/\sqrt N`, and the output :math:`\hat\eta = \bar C^{-1}\bar g` from the sums over the
    second half (:math:`t > N/2`). When :math:`\log p(x, y) = \tilde T(x)\xi` (the posterior is in the family)
    every regression is exact, so :math:`\hat\eta = \xi` as soon as the averaging window holds :math:`k + 1`
    distinct draws: after :math:`N = 2(k+1)` steps (eq. 13).

    Parameters
    ----------
    family : Exponential, Gamma, Normal or compatible object
        Provides ``num_stats`` (k), ``stats(x) -> (n, k)``, ``sample(eta, n, generator)``, ``is_valid(eta)``,
        ``log_normalizer(eta)``, ``params(eta)`` and optionally ``second_moment(eta)``.
    num_steps : int
        N (>= 2).
    num_draws : int
        Draws per step (the paper uses 1); :math:`\hat g`, :math:`\hat C` are averaged over them.
    step_size : float, optional
        :math:`w` in (0, 1]; default :math:`1/\sqrt N`.
    init_C : {"moments", "identity"} or array-like of shape (k+1, k+1)
        :math:`C_1`: ``"moments"`` = :math:`\mathbb E_{q_1}[\tilde T^\top\tilde T]` (the paper's default; analytic
        via ``family.second_moment``, else a Monte Carlo estimate with 1000 draws), ``"identity"`` = :math:`I`
        (the paper's section 4.0.1 example), or a given symmetric positive-definite matrix.
    init_intercept : float
        :math:`\eta_{0,1}`; :math:`g_1 = C_1\tilde\eta_1`. Only the first half of the run depends on it.
    seed : int, optional

    Notes
    -----
    An update :math:`\tilde\eta_{t+1}` that is not a proper distribution (e.g. a negative rate; paper section 4)
    is kept in the statistics but not used for drawing: the next draws come from the last proper
    :math:`q_t` (counted in ``info["improper_steps"]``). The final :math:`\hat\eta` must be proper, else
    :class:`~gpvi.exceptions.NumericalFaultError` (more steps are the paper's remedy).

    Examples
    --------
    Exponential posterior, approximated in its own family: exact after :math:`2(k+1) = 4` steps (section 4.0.1).

    >>> import math, torch
    >>> from gpvi.inference.salimans_knowles import SKExpFamily, Exponential
    >>> fam = Exponential()
    >>> res = SKExpFamily(fam, num_steps=4, init_C="identity").run(lambda x: math.log(2.0) - 2.0 * x,
    ...                                                               fam.natural(rate=1.0))
    >>> abs(res.params["rate"] - 2.0) < 1e-12, abs(res.log_evidence) < 1e-12, res.r_squared
    (True, True, 1.0)
    """

    def __init__(self, family: Any, num_steps: int = 1000, *, num_draws: int = 1, step_size: float | None = None,
                 init_C: Any = "moments", init_intercept: float = 0.0, seed: int | None = 0) -> None:
        for attr in ("num_stats", "stats", "sample", "is_valid", "log_normalizer", "params"):
            if not hasattr(family, attr):
                raise TypeError(f"family must provide {attr} (like gpvi.inference.salimans_knowles.Gamma); got "
                                f"{type(family).__name__}")
        self.family = family
        self.num_steps = check_positive_int(num_steps, "num_steps", minimum=2)
        self.num_draws = check_positive_int(num_draws, "num_draws")
        self.step_size = None if step_size is None else check_fraction(step_size, "step_size")
        k1 = int(family.num_stats) + 1
        if isinstance(init_C, str):
            check_choice(init_C, "init_C", ("moments", "identity"))
        else:
            C = as_float_tensor(init_C, "init_C", ndim=2)
            if C.shape != (k1, k1) or not torch.allclose(C, C.T) or strict_cholesky(C) is None:
                raise ValueError(f"init_C must be a symmetric positive-definite ({k1}, {k1}) matrix")
            init_C = C
        self.init_C = init_C
        if not isinstance(init_intercept, numbers.Real) or isinstance(init_intercept, bool) \
                or not math.isfinite(float(init_intercept)):
            raise ValueError(f"init_intercept must be a finite number; got {init_intercept!r}")
        self.init_intercept = float(init_intercept)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0):
            raise ValueError(f"seed must be a non-negative int or None; got {seed!r}")
        self.seed = seed

    def _log_p(self, log_p: Any, x: torch.Tensor) -> torch.Tensor:
        if callable(getattr(log_p, "log_joint", None)):
            out = log_p.log_joint(x.reshape(x.shape[0], -1))
        else:
            out = log_p(x)
        out = torch.as_tensor(out, dtype=torch.float64)
        if out.shape != x.shape[:1]:
            raise ValueError(f"log_p returned shape {tuple(out.shape)} for {x.shape[0]} draws; expected "
                             f"({x.shape[0]},)")
        return out

    def run(self, log_p: Any, init: Any, *, generator: torch.Generator | None = None) -> SKExpFamilyResult:
        r"""Run Algorithm 1.

        Parameters
        ----------
        log_p : callable or target
            Unnormalised log posterior :math:`\log p(x, y)` of a batch of draws, ``(n,) -> (n,)`` (or a target
            whose ``log_joint`` takes ``(n, 1)``).
        init : array-like of shape (k,)
            :math:`\eta_1`, a proper member of the family (e.g. ``family.natural(...)`` of the prior).
        generator : torch.Generator, optional
            Overrides ``seed``.

        Returns
        -------
        SKExpFamilyResult

        Raises
        ------
        ValueError
            ``init`` is not a proper member of the family.
        NumericalFaultError
            The final :math:`\hat\eta` is not a proper distribution, or a log density is NaN/inf.
        """
        fam = self.family
        k = int(fam.num_stats)
        eta1 = as_float_tensor(init, "init", ndim=1)
        if eta1.shape != (k,):
            raise ValueError(f"init must have length k = {k} (natural parameters of the family); got "
                             f"{tuple(eta1.shape)}")
        if not fam.is_valid(eta1):
            raise ValueError(f"init {eta1.tolist()} is not a proper member of {type(fam).__name__}")
        gen = resolve_generator(self.seed, generator)
        N = self.num_steps
        w = self.step_size if self.step_size is not None else 1.0 / math.sqrt(N)
        t0 = time.perf_counter()
        n_evals = 0
        if isinstance(self.init_C, torch.Tensor):
            C = self.init_C.clone()
        elif self.init_C == "identity":
            C = torch.eye(k + 1, dtype=torch.float64)
        elif callable(getattr(fam, "second_moment", None)):
            C = fam.second_moment(eta1).to(torch.float64)
        else:
            Tt = self._tilde(fam.sample(eta1, 1000, gen))
            C = Tt.T @ Tt / Tt.shape[0]
        eta_t = torch.cat([torch.tensor([self.init_intercept], dtype=torch.float64), eta1])
        g = C @ eta_t
        C_bar = torch.zeros_like(C)
        g_bar = torch.zeros_like(g)
        window: list[tuple[torch.Tensor, torch.Tensor]] = []
        eta_draw = eta1.clone()
        improper = 0
        tr_eta, tr_valid = [], []
        for t in range(1, N + 1):
            x = fam.sample(eta_draw, self.num_draws, gen)
            y = self._log_p(log_p, x)
            n_evals += x.shape[0]
            if not bool(torch.isfinite(y).all()):
                raise NumericalFaultError(f"SKExpFamily: log_p returned a non-finite value at step {t} (draws "
                                          f"{x.tolist()})", state={"t": t, "eta": eta_draw})
            Tt = self._tilde(x)                                           # (S, k+1)
            g_hat = Tt.T @ y / Tt.shape[0]
            C_hat = Tt.T @ Tt / Tt.shape[0]
            g = (1.0 - w) * g + w * g_hat
            C = (1.0 - w) * C + w * C_hat
            tr_eta.append(eta_draw.clone())
            try:
                eta_new = torch.linalg.solve(C, g)
                ok = bool(torch.isfinite(eta_new).all()) and fam.is_valid(eta_new[1:])
            except RuntimeError:
                ok = False
            tr_valid.append(ok)
            if ok:
                eta_draw = eta_new[1:].clone()
            else:
                improper += 1
            if t > N // 2:
                g_bar = g_bar + g_hat
                C_bar = C_bar + C_hat
                window.append((Tt, y))
        try:
            eta_hat = torch.linalg.solve(C_bar, g_bar)
        except RuntimeError:
            eta_hat = torch.full_like(g_bar, math.nan)
        wall = time.perf_counter() - t0
        settings = {"family": type(fam).__name__, "num_steps": N, "num_draws": self.num_draws, "seed": self.seed}
        info = RunInfo(engine="SKExpFamily", steps=N, time_s=wall, total_time_s=wall, settings=settings,
                       counters={"improper_steps": improper, "log_p_evals": n_evals},
                       details={"step_size": w, "num_averaged": N - N // 2})
        if not bool(torch.isfinite(eta_hat).all()) or not fam.is_valid(eta_hat[1:]):
            raise NumericalFaultError(
                f"SKExpFamily: the averaged regression gives eta = {eta_hat[1:].tolist()}, not a proper "
                f"{type(fam).__name__}; increase num_steps (paper section 4)", state={"eta": eta_hat, "info": info})
        Tw = torch.cat([a for a, _ in window])
        yw = torch.cat([b for _, b in window])
        resid = yw - Tw @ eta_hat
        s2 = float((resid * resid).mean())
        var_y = float(yw.var(unbiased=False))
        r2 = 1.0 - s2 / var_y if var_y > 0 else 1.0
        eta = eta_hat[1:].clone()
        eta0 = float(eta_hat[0])
        bound = eta0 + float(fam.log_normalizer(eta))
        trace = {"eta": torch.stack(tr_eta), "valid": torch.tensor(tr_valid)}
        return SKExpFamilyResult(eta=eta, eta0=eta0, family=fam, log_bound=bound, log_evidence=bound + 0.5 * s2,
                                 kl=0.5 * s2, r_squared=r2, trace=trace, info=info)

    def _tilde(self, x: torch.Tensor) -> torch.Tensor:
        T = self.family.stats(x).to(torch.float64).reshape(x.shape[0], -1)
        return torch.cat([torch.ones(T.shape[0], 1, dtype=T.dtype, device=T.device), T], 1)

    def __repr__(self) -> str:
        return f"SKExpFamily({type(self.family).__name__}(), num_steps={self.num_steps})"
