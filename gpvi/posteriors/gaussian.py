r"""Location-scale posteriors :math:`\theta = \mu + C z`, :math:`z \sim \phi` (DSVI paper eq. 1), stored without
a dense ``(D, D)`` matrix when the scale has structure.

:math:`q(\theta) = \phi(C^{-1}(\theta - \mu)) / |C|`, Gaussian for the default standard-normal :math:`\phi`.
Three storages (``storage`` attribute):

* ``"full"``: a lower-triangular ``(D, D)`` :math:`C` with positive diagonal (DSVI ``scale="full"``,
  Salimans-Knowles);
* ``"diag"``: a ``(D,)`` vector :math:`c`, :math:`C = \mathrm{diag}(c)` (DSVI ``scale="diag"``, DSVI-ARD);
  ``O(D)`` memory;
* ``"lowrank"``: :math:`\mathrm{Cov} = W W^\top + \mathrm{diag}(d^2)`, :math:`W` of shape ``(D, K)``, standard-normal
  :math:`\phi` only, drawn as :math:`\theta = \mu + W \epsilon_1 + d \odot \epsilon_2` with
  :math:`\epsilon_1 \sim \mathcal N(0, I_K)`, :math:`\epsilon_2 \sim \mathcal N(0, I_D)`; ``O(D K)`` memory.

Marginal variances are :math:`\sum_k C_{jk}^2 \mathrm{Var}\,z_k` (``full``), :math:`c_j^2 \mathrm{Var}\,z_j` (``diag``)
and :math:`\sum_k W_{jk}^2 + d_j^2` (``lowrank``). ``mean``, ``std``, ``quantile``, ``sample``, ``log_prob``,
``summary``, ``predict``, ``to_arviz``, ``linear_marginals`` and ``state_dict`` never build a ``(D, D)`` matrix
for the ``diag`` and ``lowrank`` storages; ``scale_tril`` and ``covariance`` build it on demand, after checking
that it fits in free memory (:class:`MemoryError` naming D otherwise).

Names: ``mean`` = :math:`\mu`, ``scale_tril`` = :math:`C`, ``scale_diag`` = :math:`\mathrm{diag}(C)` (:math:`c`),
``factor`` = :math:`W`, ``diag`` = :math:`d`, ``base`` = :math:`\phi`.
"""

from __future__ import annotations

import math
from typing import Any

import scipy.special
import torch

from ..numerics.families import (Factorised, StandardMultivariateT, StandardNormal, StandardStudentT, _param_dtype,
                                 make_standard)
from ..linalg import cholesky_with_jitter
from ..rng import resolve_generator
from ..validation import as_float_tensor, check_positive_int, check_theta
from ..validation.memory import check_dense_memory
from .base import _SUMMARY_SEED, Posterior, _plain
from .weighted import psis

__all__ = ["GaussianPosterior"]

_LOG_2PI = math.log(2.0 * math.pi)
_STORAGES = ("full", "diag", "lowrank")


def _as_tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x, dtype=torch.float64)


def _weighted_sq_sum(coef: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
    r""":math:`\sum_k a_{ik}^2 v_k` over the last axis; ``v=None`` means ones; :math:`0 \cdot \infty = 0`."""
    sq = coef ** 2
    if v is None:
        return sq.sum(-1)
    v = v.to(coef)
    if bool(torch.isinf(v).any()):
        return torch.where(coef != 0, sq * v, torch.zeros_like(sq)).sum(-1)
    return (sq * v).sum(-1)


class GaussianPosterior(Posterior):
    r"""Location-scale posterior :math:`\theta = \mu + C z`, :math:`z \sim \phi` (Gaussian for normal phi).

    Parameters
    ----------
    mean : torch.Tensor of shape (D,)
        :math:`\mu`.
    scale_tril : torch.Tensor of shape (D, D) or (D,)
        Lower-triangular :math:`C` with positive diagonal (``storage="full"``), or the positive diagonal
        :math:`c` of a diagonal :math:`C` (``storage="diag"``, no ``(D, D)`` matrix is ever stored).
    names : list of str
    target : optional
        The model it approximates (needed for ``predict`` and natural-scale summaries).
    base : standard distribution, optional
        :math:`\phi` (default :class:`~gpvi.numerics.families.StandardNormal`).
    elbo, elbo_se : float, optional
        Final bound estimate and its Monte Carlo standard error.
    trace : dict, optional
        Per-step records of the run (bound, rolling average, ...).
    info : dict, optional
        Counters and settings of the run.
    engine_state : optional
        The engine's final state (for resuming); a private copy is kept and ``state_dict()`` includes its
        ``state_dict()``.

    Attributes
    ----------
    storage : {"full", "diag", "lowrank"}
    mean, std, variance : torch.Tensor of shape (D,)
        Marginal moments (never through a ``(D, D)`` matrix).
    scale_tril : torch.Tensor of shape (D, D)
        :math:`C`; built on demand for ``diag`` (:math:`\mathrm{diag}(c)`) and ``lowrank`` (the Cholesky factor
        of the covariance).
    covariance : torch.Tensor of shape (D, D)
        :math:`C\,\mathrm{diag}(\mathrm{Var}\,z)\,C^\top` (:math:`CC^\top` for normal phi; infinite entries
        when phi has no variance), built on demand.
    scale_diag : torch.Tensor of shape (D,)
        The diagonal of :math:`C` (stored for ``diag``).
    factor, diag : torch.Tensor of shape (D, K) and (D,), or None
        :math:`W` and :math:`d` of the ``lowrank`` storage.

    Raises
    ------
    ValueError
        Shapes that do not match ``names``, or a scale that is not strictly positive on the diagonal.

    Examples
    --------
    >>> import torch
    >>> from gpvi.posteriors import GaussianPosterior
    >>> q = GaussianPosterior(torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0],
    ...                       dtype=torch.float64), ["a", "b", "c"])
    >>> q.storage, q.std.tolist(), q.sample(5, seed=0).shape
    ('diag', [1.0, 2.0, 3.0], torch.Size([5, 3]))
    """

    kind = "gaussian"

    def __init__(self, mean: torch.Tensor, scale_tril: torch.Tensor, names: list[str], target: Any = None, *,
                 base: Any = None, elbo: float = math.nan, elbo_se: float = math.nan,
                 trace: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                 engine_state: Any = None) -> None:
        super().__init__(names, target, info, engine_state=engine_state)
        D = self.dim
        mean, scale_tril = _as_tensor(mean), _as_tensor(scale_tril)
        if mean.shape != (D,) or scale_tril.shape not in ((D, D), (D,)):
            raise ValueError(f"mean must be ({D},) and scale_tril ({D}, {D}) or ({D},) for {D} names; got "
                             f"{tuple(mean.shape)} and {tuple(scale_tril.shape)}")
        diagonal = torch.diagonal(scale_tril) if scale_tril.dim() == 2 else scale_tril
        if not bool((diagonal > 0).all()):
            raise ValueError("scale_tril must have a strictly positive diagonal")
        self._mean = mean.detach().clone()
        if scale_tril.dim() == 2:
            self.storage = "full"
            self._scale_tril: torch.Tensor | None = torch.tril(scale_tril.detach()).clone()
            self._scale_diag: torch.Tensor | None = None
        else:
            self.storage = "diag"
            self._scale_tril, self._scale_diag = None, scale_tril.detach().clone()
        self.factor: torch.Tensor | None = None
        self.diag: torch.Tensor | None = None
        self._finish(base, elbo, elbo_se, trace)

    def _finish(self, base: Any, elbo: float, elbo_se: float, trace: dict[str, Any] | None) -> None:
        self.base = base if base is not None else StandardNormal(self.dim)
        if getattr(self.base, "dim", self.dim) != self.dim:
            raise ValueError(f"base has dim {self.base.dim} but the posterior has D = {self.dim}")
        self.elbo = float(elbo)
        self.elbo_se = float(elbo_se)
        self.trace = trace or {}

    @classmethod
    def lowrank(cls, mean: torch.Tensor, factor: torch.Tensor, diag: torch.Tensor, names: list[str],
                target: Any = None, *, base: Any = None, elbo: float = math.nan, elbo_se: float = math.nan,
                trace: dict[str, Any] | None = None, info: dict[str, Any] | None = None,
                engine_state: Any = None) -> GaussianPosterior:
        r"""A Gaussian with covariance :math:`W W^\top + \mathrm{diag}(d^2)`, stored in ``O(D K)`` memory.

        Parameters
        ----------
        mean : torch.Tensor of shape (D,)
        factor : torch.Tensor of shape (D, K)
            :math:`W` (``K >= 1``).
        diag : torch.Tensor of shape (D,)
            :math:`d`, strictly positive.
        names : list of str
        target, elbo, elbo_se, trace, info, engine_state
            As for :class:`GaussianPosterior`.
        base : optional
            Must be standard normal (the default): the low-rank form is Gaussian only.

        Returns
        -------
        GaussianPosterior
            With ``storage == "lowrank"``.

        Raises
        ------
        ValueError
            Shapes that do not match ``names``, a non-positive ``diag``, or a non-normal ``base``.
        """
        self = cls.__new__(cls)
        Posterior.__init__(self, names, target, info, engine_state=engine_state)
        D = self.dim
        mean, factor, diag = _as_tensor(mean), _as_tensor(factor), _as_tensor(diag)
        if mean.shape != (D,) or diag.shape != (D,) or factor.dim() != 2 or factor.shape[0] != D \
                or factor.shape[1] < 1:
            raise ValueError(f"mean and diag must be ({D},) and factor ({D}, K) with K >= 1 for {D} names; got "
                             f"{tuple(mean.shape)}, {tuple(diag.shape)} and {tuple(factor.shape)}")
        if not bool((diag > 0).all()):
            raise ValueError(f"diag must be strictly positive; got minimum {float(diag.min()):g}")
        if base is not None and getattr(base, "kind", None) != "normal":
            raise ValueError(f"a low-rank GaussianPosterior needs a standard-normal base; got {base!r}")
        self._mean = mean.detach().clone()
        self.storage = "lowrank"
        self._scale_tril = self._scale_diag = None
        self.factor, self.diag = factor.detach().clone(), diag.detach().clone()
        self._finish(base, elbo, elbo_se, trace)
        return self

    # ------------------------------------------------------------------ moments
    @property
    def mean(self) -> torch.Tensor:
        r""":math:`\mu`, shape (D,)."""
        return self._mean

    def _base_variance(self) -> torch.Tensor | None:
        """Var z per dimension, or None for a standard-normal base (unit variances, skipped exactly)."""
        return None if isinstance(self.base, StandardNormal) else self.base.variance()

    @property
    def variance(self) -> torch.Tensor:
        """Marginal variances, shape (D,) (``inf`` where phi has no variance)."""
        v = self._base_variance()
        if self.storage == "full":
            return _weighted_sq_sum(self._scale_tril, v)
        if self.storage == "diag":
            c2 = self._scale_diag ** 2
            return c2 if v is None else c2 * v.to(c2)          # c > 0: an infinite Var z gives inf
        return (self.factor ** 2).sum(-1) + self.diag ** 2

    @property
    def std(self) -> torch.Tensor:
        """Marginal standard deviations, shape (D,) (``inf`` where phi has no variance)."""
        if self.storage == "diag" and self._base_variance() is None:
            return self._scale_diag.clone()
        return torch.sqrt(self.variance)

    @property
    def scale_diag(self) -> torch.Tensor:
        """The diagonal of :math:`C`, shape (D,) (for ``lowrank``: of the Cholesky factor, built densely)."""
        if self.storage == "diag":
            return self._scale_diag
        return torch.diagonal(self.scale_tril)

    @property
    def scale_tril(self) -> torch.Tensor:
        """:math:`C`, shape (D, D); built on demand for the ``diag`` and ``lowrank`` storages."""
        if self.storage == "full":
            return self._scale_tril
        D = self.dim
        if self.storage == "diag":
            check_dense_memory(D, what="scale_tril of this GaussianPosterior", dtype=self._mean.dtype,
                               device=self._mean.device, storage="diag")
            return torch.diag(self._scale_diag)
        check_dense_memory(D, copies=2, what="scale_tril of this GaussianPosterior", dtype=self._mean.dtype,
                           device=self._mean.device, storage="lowrank")
        return cholesky_with_jitter(self._dense_lowrank(), what="low-rank covariance W W^T + diag(d^2)",
                                    raise_on_failure=True).L

    def _dense_lowrank(self) -> torch.Tensor:
        cov = self.factor @ self.factor.T
        cov.diagonal().add_(self.diag ** 2)
        return cov

    @property
    def covariance(self) -> torch.Tensor:
        r""":math:`\mathrm{Cov}\,\theta`, shape (D, D), built on demand (after a free-memory check)."""
        D = self.dim
        check_dense_memory(D, what="covariance of this GaussianPosterior", dtype=self._mean.dtype,
                           device=self._mean.device, storage=self.storage)
        if self.storage == "lowrank":
            return self._dense_lowrank()
        if self.storage == "diag":
            return torch.diag(self.variance)
        v = self.base.variance().to(self._scale_tril)
        C = self._scale_tril
        if bool(torch.isinf(v).any()):
            inf = torch.isinf(v)
            cov = (C * torch.where(inf, torch.zeros_like(v), v)) @ C.T
            hit = (C * inf.to(C)) @ C.T
            return torch.where(hit != 0, torch.copysign(torch.full_like(cov, math.inf), hit), cov)
        return (C * v) @ C.T

    # ------------------------------------------------------------------ draws and densities
    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        r"""Draw ``(n, D)`` values :math:`\mu + C z` (``lowrank``: :math:`\mu + W\epsilon_1 + d\odot\epsilon_2`).

        ``generator`` is used (and advanced) when given, else a fresh one seeded by ``seed``. A ``diag`` posterior
        draws the same values as its ``full`` twin with ``scale_tril = torch.diag(c)`` for the same seed.
        """
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator)
        dtype, dev = self._mean.dtype, self._mean.device
        if self.storage == "lowrank":
            e1 = torch.randn((n, self.factor.shape[1]), generator=gen, dtype=dtype, device=gen.device).to(dev)
            e2 = torch.randn((n, self.dim), generator=gen, dtype=dtype, device=gen.device).to(dev)
            return self._mean + e1 @ self.factor.T + e2 * self.diag
        z = self.base.sample(n, gen, dtype=dtype).to(dev)
        if self.storage == "diag":
            return self._mean + z * self._scale_diag
        return self._mean + z @ self._scale_tril.T

    def log_prob(self, theta: Any) -> torch.Tensor:
        r""":math:`\log q(\theta) = \log\phi(C^{-1}(\theta-\mu)) - \sum_d \log C_{dd}`.

        Shapes: ``(D,) -> ()`` and ``(S, D) -> (S,)``.

        ``lowrank`` uses the Woodbury identity and the determinant lemma with the ``(K, K)`` capacitance
        :math:`I + W^\top \mathrm{diag}(d^{-2}) W`.
        """
        t = check_theta(theta, self.dim, device=self._mean.device)
        r = t - self._mean
        if self.storage == "diag":
            return self.base.log_prob(r / self._scale_diag) - torch.log(self._scale_diag).sum()
        if self.storage == "lowrank":
            Wd = self.factor / self.diag[:, None]                                   # (D, K)
            cap = Wd.T @ Wd
            cap.diagonal().add_(1.0)
            L = cholesky_with_jitter(cap, what="low-rank capacitance I + W^T D^-2 W", raise_on_failure=True).L
            rd = r / self.diag
            u = torch.linalg.solve_triangular(L, Wd.T @ rd.reshape(-1, self.dim).T, upper=False)                 # (K, S)
            maha = (rd * rd).sum(-1) - (u * u).sum(0).reshape(rd.shape[:-1])
            logdet = 2.0 * torch.log(self.diag).sum() + 2.0 * torch.log(torch.diagonal(L)).sum()
            return -0.5 * (self.dim * _LOG_2PI + logdet + maha)
        z = torch.linalg.solve_triangular(self._scale_tril, r.unsqueeze(-1) if t.dim() == 1 else r.T, upper=False)
        z = z.squeeze(-1) if t.dim() == 1 else z.T
        return self.base.log_prob(z) - torch.log(torch.diagonal(self._scale_tril)).sum()

    def psis(self, target: Any = None, num_draws: int = 1000, *, seed: int | None = 0,
             generator: torch.Generator | None = None) -> Any:
        r"""Pareto-smoothed importance sampling of this q against the exact log joint of ``target`` (default the
        model it was fitted to): :math:`\hat k` diagnoses q, the weights correct it.

        See :func:`gpvi.posteriors.weighted.psis`; returns a
        :class:`~gpvi.posteriors.weighted.WeightedPosterior` (``khat``, ``ess``, weighted ``mean``, ``std``,
        ``covariance``, ``quantile``, ``predict``, ``log_evidence`` with its standard error).
        """
        return psis(self, target, num_draws, seed=seed, generator=generator)

    def linear_marginals(self, A: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and standard deviation of each :math:`a_i^\top\theta` (rows :math:`a_i` of ``A``), without a
        ``(D, D)`` matrix.

        .. math:: \mathrm{E} = A\mu, \qquad \mathrm{sd}_i^2 = \sum_k (A C)_{ik}^2 \,\mathrm{Var}\,z_k

        (``lowrank``: :math:`\lVert W^\top a_i\rVert^2 + \lVert d \odot a_i\rVert^2`).

        Parameters
        ----------
        A : array-like of shape (n, D)

        Returns
        -------
        mean, sd : torch.Tensor of shape (n,)
        """
        A = as_float_tensor(A, "A", ndim=2, device=self._mean.device, dtype=self._mean.dtype)
        if A.shape[1] != self.dim:
            raise ValueError(f"A must have D = {self.dim} columns; got {A.shape[1]}")
        m = A @ self._mean
        if self.storage == "lowrank":
            return m, torch.sqrt(((A @ self.factor) ** 2).sum(-1) + ((A * self.diag) ** 2).sum(-1))
        v = self._base_variance()
        B = A @ self._scale_tril if self.storage == "full" else A * self._scale_diag
        return m, torch.sqrt(_weighted_sq_sum(B, v))

    # ------------------------------------------------------------------ marginals
    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        p = probs.to(self._mean)
        if isinstance(self.base, StandardNormal) or self.storage == "lowrank":
            zq = torch.special.ndtri(p)
            return self._mean + zq[:, None] * self.std[None, :]
        if isinstance(self.base, StandardMultivariateT):                 # exact: each theta_d is a t
            zq = torch.from_numpy(scipy.special.stdtrit(self.base.df, p.detach().cpu().numpy())).to(p)
            return self._mean + zq[:, None] * self._t_scales()[None, :]
        if self.storage == "diag":
            zq = self._base_quantiles(p)
            if zq is not None:
                return self._mean + zq * self._scale_diag
        draws = self.sample(20000, seed=_SUMMARY_SEED)
        return torch.quantile(draws, probs.to(draws), dim=0)

    def _base_quantiles(self, p: torch.Tensor) -> torch.Tensor | None:
        """(len(p), D) or (len(p), 1) quantiles of z's components, or None for a base without inverse CDFs."""
        if isinstance(self.base, StandardStudentT):
            zq = scipy.special.stdtrit(self.base.df, p.detach().cpu().numpy())
            return torch.from_numpy(zq).to(p)[:, None]
        if isinstance(self.base, Factorised):
            cols = [c.icdf(p.detach().cpu().to(_param_dtype(c))).to(torch.float64) for c in self.base.components]
            return torch.stack(cols, dim=-1).to(p)
        return None

    def _t_scales(self) -> torch.Tensor:
        """Scales of the Student-t marginals under a multivariate-t base: the row norms of C."""
        if self.storage == "diag":
            return self._scale_diag
        return torch.sqrt((self._scale_tril ** 2).sum(-1))

    def _marginal(self, mean, sd):
        loc = mean.tolist()
        if isinstance(self.base, StandardMultivariateT):
            return [{"family": "student_t", "df": self.base.df, "loc": m, "scale": s}
                    for m, s in zip(loc, self._t_scales().tolist())]
        if isinstance(self.base, StandardNormal) or self.storage == "lowrank":
            return [{"family": "normal", "loc": m, "scale": s} for m, s in zip(loc, sd.tolist())]
        if self.storage == "diag":
            scale = self._scale_diag.tolist()
            if isinstance(self.base, StandardStudentT):
                return [{"family": "student_t", "df": self.base.df, "loc": m, "scale": s} for m, s in zip(loc, scale)]
            comps = [repr(c) for c in self.base.components] if isinstance(self.base, Factorised) \
                else [repr(self.base)] * self.dim
            return [{"family": "location_scale", "loc": m, "scale": s, "component": c}
                    for m, s, c in zip(loc, scale, comps)]
        return [{"family": "linear_combination", "loc": m} for m in loc]

    # ------------------------------------------------------------------ serialisation
    def _state(self) -> dict[str, Any]:
        """``storage``, ``mean`` and the scale (``scale_tril``, ``scale_diag`` or ``factor`` and ``diag``), ``base``
        (its description), ``elbo`` and ``elbo_se``; the per-step ``trace`` is left out (it is in the engine
        state)."""
        out: dict[str, Any] = {"storage": self.storage, "mean": self._mean}
        if self.storage == "full":
            out["scale_tril"] = self._scale_tril
        elif self.storage == "diag":
            out["scale_diag"] = self._scale_diag
        else:
            out["factor"], out["diag"] = self.factor, self.diag
        out.update(base=_plain(self.base.spec()), elbo=self.elbo, elbo_se=self.elbo_se)
        return out

    @classmethod
    def from_state_dict(cls, state: dict[str, Any], target: Any = None) -> GaussianPosterior:
        """Rebuild from :meth:`state_dict` (normal and Student-t bases; factorised bases need ``base=`` in the
        constructor).

        ``state_dict()`` holds only tensors, numbers, strings, lists and dicts, so it can be saved with
        ``torch.save`` and read back with ``torch.load(path, weights_only=True)``.
        """
        return super().from_state_dict(state, target)

    @classmethod
    def _from_state(cls, state, target, common):
        spec = state["base"]
        if spec["kind"] == "factorised":
            raise ValueError("a factorised base cannot be rebuilt from its description; construct "
                             "GaussianPosterior(mean, scale_tril, names, base=...) directly")
        if spec["kind"] == "t":                          # the product of univariate t's (make_standard's "t" is mvt)
            base = StandardStudentT(int(spec["dim"]), float(spec["df"]))
        else:
            base = make_standard(spec["kind"], spec["dim"], df=spec.get("df"))
        storage = state["storage"]
        kw = dict(base=base, elbo=state["elbo"], elbo_se=state["elbo_se"], **common)
        names = list(state["names"])
        if storage == "lowrank":
            return cls.lowrank(state["mean"], state["factor"], state["diag"], names, target, **kw)
        if storage not in _STORAGES:
            raise ValueError(f"state has storage {storage!r}; expected one of {list(_STORAGES)}")
        scale = state["scale_diag"] if storage == "diag" else state["scale_tril"]
        return cls(state["mean"], scale, names, target, **kw)

