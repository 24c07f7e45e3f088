r"""Per-site expectations :math:`\mathbb E_{q(f_n)}[\log p(y_n \mid f_n)]` and their gradients, for CVI.

For one site with Gaussian marginal :math:`q(f_n) = \mathcal N(m_n, v_n)` and log-likelihood
:math:`h(f) = \log p(y_n \mid f)`, CVI (Khan & Lin 2017, eq. 13) needs

.. math::

    E_n = \mathbb E_q[h(f_n)],\qquad
    \frac{\partial E_n}{\partial m_n} = \mathbb E_q[h'(f_n)],\qquad
    \frac{\partial E_n}{\partial v_n} = \tfrac12\,\mathbb E_q[h''(f_n)]

(Bonnet's and Price's theorems; Opper & Archambeau 2009), and the gradients with respect to the mean
parameters :math:`\mu^{(1)}_n = m_n`, :math:`\mu^{(2)}_n = v_n + m_n^2` of the marginal:

.. math::

    \hat g^{(1)}_n = \frac{\partial E_n}{\partial m_n} - 2 m_n \frac{\partial E_n}{\partial v_n},\qquad
    \hat g^{(2)}_n = \frac{\partial E_n}{\partial v_n}.

Names in the code: ``m`` (:math:`m_n`), ``v`` (:math:`v_n = V_{nn}`), ``dm``, ``dv`` (the two partial
derivatives), ``g1``, ``g2`` (:math:`\hat g^{(1)}, \hat g^{(2)}`), ``y`` the site's target (binary labels as
0/1 floats, sign :math:`s = 2y - 1`).

Estimators
----------
* **Quadrature** (:class:`Quadrature`), deterministic. The default rule, ``"gl-asinh"``, is Gauss–Legendre
  on the window :math:`[m - T\sqrt v,\, m + T\sqrt v]` (``T = 8.5``: the Gaussian mass outside is 2e-17)
  after the change of variables :math:`f = c \sinh u` (``c = 1``). The map puts nodes densely where the
  logit/probit log-likelihoods bend (near :math:`f = 0`, on a scale of 1) and sparsely in their nearly
  polynomial tails, and is locally affine when the window is far from 0, so a fixed number of nodes works for
  every :math:`(m, v)`. With 96 nodes the relative error of :math:`E, \partial_m E, \partial_v E` is below
  1e-13 (logit) and 1e-9 (probit; its log-likelihood is quadratic in the left tail) for
  :math:`|m| \le 30`, :math:`10^{-4} \le v \le 2000` against adaptive quadrature (``tests/test_expectations.py``).
  ``"gauss-hermite"`` is the classical rule (GPyTorch's default with 20 points): exact for polynomials, but
  the logit/probit log-likelihoods have complex singularities at distance about :math:`\pi` (logit) and 2.8
  (probit) from the real axis, i.e. at :math:`O(1/\sqrt v)` in the standardised variable, so its error grows
  with the marginal variance: with 20 points it errs by up to 5e-2 at :math:`v \approx 50\text{--}400`, and
  even 100 points leave 2e-2 there.
* **Monte Carlo** (:func:`expected_log_lik` with ``method="mc"``): reparameterised draws
  :math:`f = m + \sqrt v\,\varepsilon`, :math:`\varepsilon \sim \mathcal N(0, 1)` from a ``torch.Generator``
  (the paper's default). ``mc_variance_grad="hessian"`` averages :math:`\tfrac12 h''(f)` (Price); for a
  log-concave likelihood every draw gives :math:`\hat g^{(2)} < 0`, so sites stay valid.
  ``"reparam"`` uses only first derivatives, :math:`\partial_v E = \mathbb E[h'(f)\,\varepsilon] / (2\sqrt v)`
  (Bonnet + reparameterisation); unbiased but it can return :math:`\hat g^{(2)} \ge 0`, which CVI must then
  reject or shrink.

The Gaussian likelihood (used by the conjugacy check of CVI) has closed forms and never uses a rule.

Likelihoods
-----------
:class:`BernoulliLogit` (:math:`p(y=1\mid f) = \sigma(f)`; the CVI paper's and scikit-learn's link),
:class:`BernoulliProbit` (:math:`\Phi(f)`; GPyTorch's ``BernoulliLikelihood``) and :class:`Gaussian`
(:math:`\mathcal N(y \mid f, \sigma^2)`); counts, outliers and proportions (Poisson, negative binomial, Student-t,
Laplace, Beta) are in :mod:`gpvi.models.latent_likelihoods`. A likelihood is any object with ``name``, ``binary``,
``derivatives(y, f) -> (h, h', h'')`` and ``closed_form(y, m, v) -> None | (E, dm, dv)``
(:class:`~gpvi.models.likelihood_base.Likelihood`); :func:`make_likelihood` builds them from names and specs.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ..rng import randn, resolve_generator
from ..validation import as_float_tensor, check_choice, check_positive, check_positive_int
from ..numerics.quadrature import Quadrature, gaussian_expectation
from .latent_likelihoods import LATENT_LIKELIHOODS
from .likelihood_base import Likelihood

__all__ = [
    "BernoulliLogit",
    "BernoulliProbit",
    "Gaussian",
    "Likelihood",
    "make_likelihood",
    "Quadrature",
    "SiteExpectations",
    "expected_log_lik",
    "mean_parameter_gradients",
    "gaussian_expectation",
    "expected_log_lik_sum",
]

_LOG_2PI = math.log(2.0 * math.pi)
_HALF_LOG_2PI = 0.5 * _LOG_2PI
_SQRT_HALF = math.sqrt(0.5)


# --------------------------------------------------------------------------- likelihoods
class BernoulliLogit(Likelihood):
    r"""Bernoulli likelihood with the logistic link, :math:`p(y = 1 \mid f) = \sigma(f) = 1/(1 + e^{-f})`.

    With :math:`s = 2y - 1 \in \{-1, +1\}`:

    .. math::

        h = \log\sigma(s f),\qquad h' = s\,\sigma(-s f),\qquad h'' = -\sigma(f)\,\sigma(-f) \in [-\tfrac14, 0).

    Examples
    --------
    >>> import torch
    >>> lik = BernoulliLogit()
    >>> h, h1, h2 = lik.derivatives(torch.tensor([1.0]), torch.tensor([0.0], dtype=torch.float64))
    >>> round(float(h), 6), float(h1), float(h2)
    (-0.693147, 0.5, -0.25)
    """

    name = "logit"
    binary = True

    def derivatives(self, y, f):
        s = 2.0 * y - 1.0
        z = s * f
        h = torch.nn.functional.logsigmoid(z)
        h1 = s * torch.sigmoid(-z)
        h2 = -torch.sigmoid(f) * torch.sigmoid(-f)
        return h, h1, h2

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\sigma(s f)` alone (EP's tilted moments need no derivatives)."""
        return torch.nn.functional.logsigmoid((2.0 * y - 1.0) * f)

    def response(self, f: torch.Tensor) -> torch.Tensor:
        r""":math:`p(y = 1 \mid f) = \sigma(f)`."""
        return torch.sigmoid(f)


class BernoulliProbit(Likelihood):
    r"""Bernoulli likelihood with the probit link, :math:`p(y = 1 \mid f) = \Phi(f)` (GPyTorch's ``BernoulliLikelihood``).

    With :math:`s = 2y - 1`, :math:`z = s f` and the inverse Mills ratio :math:`r = \phi(z)/\Phi(z)`:

    .. math::

        h = \log\Phi(z),\qquad h' = s\,r,\qquad h'' = -r\,(z + r) \in [-1, 0).

    Examples
    --------
    >>> import torch
    >>> lik = BernoulliProbit()
    >>> h, h1, h2 = lik.derivatives(torch.tensor([0.0]), torch.tensor([0.0], dtype=torch.float64))
    >>> round(float(h), 6), round(float(h1), 6)
    (-0.693147, -0.797885)
    """

    name = "probit"
    binary = True

    def derivatives(self, y, f):
        s = 2.0 * y - 1.0
        z = s * f
        h = torch.special.log_ndtr(z)
        r = torch.exp(-0.5 * z * z - _HALF_LOG_2PI - h)
        h1 = s * r
        h2 = -r * (z + r)
        return h, h1, h2

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        r""":math:`\log\Phi(s f)` alone."""
        return torch.special.log_ndtr((2.0 * y - 1.0) * f)

    def response(self, f: torch.Tensor) -> torch.Tensor:
        r""":math:`p(y = 1 \mid f) = \Phi(f) = \tfrac12\operatorname{erfc}(-f/\sqrt2)`, accurate to the relative
        rounding level in the lower tail (:func:`torch.special.ndtr` loses it there: 0 at f = -10 in float64, where
        :math:`\Phi = 7.6\times 10^{-24}`; EP's tilted moments sum it over quadrature nodes)."""
        return torch.special.erfc(f * -_SQRT_HALF).mul_(0.5)


class Gaussian(Likelihood):
    r"""Gaussian likelihood :math:`\mathcal N(y \mid f, \sigma^2)` (the conjugate case; used to check CVI).

    Closed forms: :math:`E = -\tfrac12\log(2\pi\sigma^2) - ((y - m)^2 + v)/(2\sigma^2)`,
    :math:`\partial_m E = (y - m)/\sigma^2`, :math:`\partial_v E = -1/(2\sigma^2)`, hence
    :math:`\hat g^{(1)} = y/\sigma^2` and :math:`\hat g^{(2)} = -1/(2\sigma^2)` whatever :math:`q` is: one CVI step
    with :math:`\beta = 1` lands on the exact GP regression posterior.

    Parameters
    ----------
    noise_var : float or array-like of shape (N,)
        :math:`\sigma^2 > 0` (scalar or one per site).

    Examples
    --------
    >>> import torch
    >>> lik = Gaussian(0.5)
    >>> E, dm, dv = lik.closed_form(torch.tensor([1.0], dtype=torch.float64),
    ...                             torch.tensor([0.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64))
    >>> float(dm), float(dv)
    (2.0, -1.0)
    """

    name = "gaussian"
    binary = False

    def __init__(self, noise_var: float | Any = 1.0) -> None:
        if isinstance(noise_var, (int, float)) and not isinstance(noise_var, bool):
            check_positive(noise_var, "noise_var")
            self.noise_var = torch.tensor(float(noise_var), dtype=torch.float64)
        else:
            t = as_float_tensor(noise_var, "noise_var", ndim=(0, 1))
            if bool((t <= 0).any()):
                raise ValueError("noise_var must be > 0 everywhere")
            self.noise_var = t

    def _nv(self, like: torch.Tensor) -> torch.Tensor:
        return self.noise_var.to(like)

    def derivatives(self, y, f):
        nv = self._nv(f)
        r = y - f
        h = -0.5 * (_LOG_2PI + torch.log(nv)) - 0.5 * r * r / nv
        return h, r / nv, (-1.0 / nv).expand_as(f)

    def closed_form(self, y, m, v):
        nv = self._nv(m)
        r = y - m
        E = -0.5 * (_LOG_2PI + torch.log(nv)) - 0.5 * (r * r + v) / nv
        return E, r / nv, (-0.5 / nv).expand_as(m)

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "noise_var": self.noise_var.tolist()}

    def __repr__(self) -> str:
        nv = self.noise_var
        return f"Gaussian(noise_var={float(nv):g})" if nv.dim() == 0 else f"Gaussian(noise_var=<{nv.numel()} values>)"


_LIKELIHOODS: dict[str, Any] = {"logit": BernoulliLogit, "probit": BernoulliProbit, **LATENT_LIKELIHOODS}


def make_likelihood(likelihood: Any, name: str = "likelihood") -> Likelihood:
    """Return a likelihood object from a name, a spec dict (``spec()`` of a likelihood) or a likelihood object.

    Names: ``"logit"``, ``"probit"`` and those of :mod:`gpvi.models.latent_likelihoods` (``"poisson"``,
    ``"negative_binomial"``, ``"student_t"``, ``"laplace"``, ``"beta"``; by name, with their default parameters).

    Raises
    ------
    ValueError
        Unknown name, or a spec with unknown or bad parameters.
    TypeError
        Neither a string, a spec nor an object with ``derivatives``.
    """
    if isinstance(likelihood, dict):
        spec = dict(likelihood)
        kind = spec.pop("name", None)
        if kind == "gaussian":
            return Gaussian(torch.tensor(spec["noise_var"], dtype=torch.float64))
        check_choice(kind, f"{name}['name']", list(_LIKELIHOODS))
        try:
            return _LIKELIHOODS[kind](**spec)
        except TypeError as exc:
            raise ValueError(f"{name} spec {likelihood!r} does not fit {_LIKELIHOODS[kind].__name__}: {exc}") from None
    if isinstance(likelihood, str):
        check_choice(likelihood, name, list(_LIKELIHOODS))
        return _LIKELIHOODS[likelihood]()
    if callable(getattr(likelihood, "derivatives", None)) and hasattr(likelihood, "name"):
        return likelihood
    raise TypeError(f"{name} must be one of {list(_LIKELIHOODS)}, a spec dict or a likelihood object with "
                    f"derivatives(y, f); got {type(likelihood).__name__}")


# --------------------------------------------------------------------------- site expectations
class SiteExpectations(NamedTuple):
    r"""Per-site :math:`E_n`, :math:`\partial E_n/\partial m_n`, :math:`\partial E_n/\partial v_n`, each of shape (B,)."""

    value: torch.Tensor
    dm: torch.Tensor
    dv: torch.Tensor


def _check_site_tensors(y: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    if m.dim() != 1 or v.shape != m.shape or y.shape != m.shape:
        raise ValueError(f"y, m and v must be 1-D of equal length; got shapes {tuple(y.shape)}, {tuple(m.shape)}, "
                         f"{tuple(v.shape)}")


def expected_log_lik(
    likelihood: Likelihood,
    y: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    *,
    method: str = "quadrature",
    quadrature: Quadrature | None = None,
    num_draws: int = 10,
    mc_variance_grad: str = "hessian",
    generator: torch.Generator | None = None,
) -> SiteExpectations:
    r"""Per-site :math:`E_n = \mathbb E_{\mathcal N(m_n, v_n)}[\log p(y_n \mid f)]` with its derivatives in :math:`m_n, v_n`.

    .. math::

        \partial_m E = \mathbb E[h'(f)],\qquad \partial_v E = \tfrac12\mathbb E[h''(f)]

    (Opper & Archambeau 2009; these feed Khan & Lin 2017, eq. 13 through :func:`mean_parameter_gradients`).

    Parameters
    ----------
    likelihood : Likelihood
    y, m, v : torch.Tensor of shape (B,)
        Targets (binary labels as 0/1), marginal means and variances.
    method : {"quadrature", "mc"}
        Deterministic rule, or reparameterised Monte Carlo with ``num_draws`` draws per site. A likelihood with a
        closed form (Gaussian) ignores this.
    quadrature : Quadrature, optional
        Rule for ``method="quadrature"`` (default ``Quadrature()``).
    num_draws : int
        Draws per site for ``method="mc"``.
    mc_variance_grad : {"hessian", "reparam"}
        Monte Carlo estimator of :math:`\partial_v E`: :math:`\tfrac12\overline{h''(f)}` or
        :math:`\overline{h'(f)\varepsilon}/(2\sqrt v)`.
    generator : torch.Generator, optional
        Randomness for ``method="mc"`` (a fresh non-deterministic generator if omitted).

    Returns
    -------
    SiteExpectations
        ``(value, dm, dv)``, each of shape (B,). For Monte Carlo, ``value`` is the Monte Carlo average too.

    Examples
    --------
    >>> import torch
    >>> y = torch.tensor([1.0, 0.0], dtype=torch.float64)
    >>> m = torch.tensor([0.5, -1.0], dtype=torch.float64); v = torch.tensor([2.0, 30.0], dtype=torch.float64)
    >>> ex = expected_log_lik(BernoulliLogit(), y, m, v)
    >>> ex.dv.lt(0).all().item()
    True
    """
    _check_site_tensors(y, m, v)
    method = check_choice(method, "estimator", ["quadrature", "mc"])
    closed = likelihood.closed_form(y, m, v)
    if closed is not None:
        return SiteExpectations(*closed)
    if method == "quadrature":
        quad = quadrature if quadrature is not None else Quadrature()
        f, w = quad.nodes(m, v)
        h, h1, h2 = likelihood.derivatives(y.unsqueeze(-1), f)
        return SiteExpectations((w * h).sum(-1), (w * h1).sum(-1), 0.5 * (w * h2).sum(-1))
    num_draws = check_positive_int(num_draws, "num_draws")
    mc_variance_grad = check_choice(mc_variance_grad, "mc_variance_grad", ["hessian", "reparam"])
    gen = resolve_generator(None, generator)
    eps = randn((m.shape[0], num_draws), gen, dtype=m.dtype, device=m.device)
    sd = torch.sqrt(v.clamp_min(0.0)).unsqueeze(-1)
    f = m.unsqueeze(-1) + sd * eps
    h, h1, h2 = likelihood.derivatives(y.unsqueeze(-1), f)
    if mc_variance_grad == "hessian":
        dv = 0.5 * h2.mean(-1)
    else:
        dv = (h1 * eps).mean(-1) / (2.0 * sd.squeeze(-1))
    return SiteExpectations(h.mean(-1), h1.mean(-1), dv)


def mean_parameter_gradients(dm: torch.Tensor, dv: torch.Tensor, m: torch.Tensor
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Gradients with respect to the mean parameters :math:`\mu^{(1)} = m`, :math:`\mu^{(2)} = v + m^2`.

    Since :math:`m = \mu^{(1)}` and :math:`v = \mu^{(2)} - (\mu^{(1)})^2`,

    .. math::

        \hat g^{(1)} = \partial_m E - 2 m\,\partial_v E,\qquad \hat g^{(2)} = \partial_v E

    (Khan & Lin 2017, eq. 13; Opper & Archambeau 2009).

    Parameters
    ----------
    dm, dv, m : torch.Tensor of shape (B,)

    Returns
    -------
    g1, g2 : torch.Tensor of shape (B,)

    Examples
    --------
    >>> import torch
    >>> g1, g2 = mean_parameter_gradients(torch.tensor([1.0]), torch.tensor([-0.5]), torch.tensor([2.0]))
    >>> float(g1), float(g2)
    (3.0, -0.5)
    """
    return dm - 2.0 * m * dv, dv


class _ExpectedLogLikFn(torch.autograd.Function):
    """Sum of per-site expectations with the backward from the quadrature derivatives (dm, dv)."""

    @staticmethod
    def forward(ctx, m, v, value, dm, dv):  # type: ignore[override]
        ctx.save_for_backward(dm, dv)
        return value.sum()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        dm, dv = ctx.saved_tensors
        return grad * dm, grad * dv, None, None, None


def expected_log_lik_sum(likelihood: Likelihood, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                   quadrature: Quadrature | None = None) -> torch.Tensor:
    r""":math:`\sum_n \mathbb E_{\mathcal N(m_n, v_n)}[\log p(y_n \mid f)]`, differentiable in ``m`` and ``v``.

    The backward pass uses the deterministic derivatives :math:`\partial_m E = \mathbb E[h']`,
    :math:`\partial_v E = \tfrac12\mathbb E[h'']` rather than autograd through the quadrature nodes.
    Used for the hyperparameter gradient of the ELBO (Khan & Lin 2017, eq. 5).

    Parameters
    ----------
    likelihood, y, m, v, quadrature
        As in :func:`expected_log_lik` (``m``, ``v`` may require grad).

    Returns
    -------
    torch.Tensor of shape ()

    Examples
    --------
    >>> import torch
    >>> m = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    >>> v = torch.ones(3, dtype=torch.float64)
    >>> val = expected_log_lik_sum(BernoulliLogit(), torch.ones(3, dtype=torch.float64), m, v)
    >>> val.backward(); m.grad.shape
    torch.Size([3])
    """
    ex = expected_log_lik(likelihood, y, m.detach(), v.detach(), quadrature=quadrature)
    return _ExpectedLogLikFn.apply(m, v, ex.value, ex.dm, ex.dv)
