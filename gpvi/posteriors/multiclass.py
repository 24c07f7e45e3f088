r"""The posterior of multi-class CVI: K class-factorised Gaussian processes in site form, and class probabilities.

:class:`MulticlassPosterior` holds :math:`q(F) = \prod_k \mathcal N(\mathbf f_k \mid \mathbf m_k, V_k)` over the latent
values at the N training inputs (the class-factorised family of
:mod:`gpvi.inference.cvi.multiclass_sites`): sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` (N, K), the
Cholesky factors of :math:`K + S_k` and :math:`\boldsymbol\alpha_k = (K + S_k)^{-1}\tilde{\mathbf y}_k` at the kernel
log-hyperparameters :math:`\theta` shared by the classes. The common surface (:mod:`gpvi.posteriors.base`) is over
the NK latent values, named ``f[n,k]`` in row-major order (``mean``, ``std``, ``sample``, ``quantile``,
``marginals``); :meth:`MulticlassPosterior.predict_latent` gives the K latent marginals at new inputs (GP regression on
each class's pseudo-data) and :meth:`MulticlassPosterior.predict_proba` the class probabilities
:math:`p(y_* = k \mid \mathcal D) = \mathbb E_{q(\mathbf f_*)}[p(y_* = k \mid \mathbf f_*)]`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..evaluation.table import Table
from ..validation import check_fraction, check_positive_int
from .base import Posterior

__all__ = ["MulticlassPosterior"]


class MulticlassPosterior(Posterior):
    r"""The multi-class CVI posterior (see the module docstring).

    Parameters
    ----------
    model : GPMulticlass
    lam1, lam2 : torch.Tensor of shape (N, K)
    theta : torch.Tensor of shape (D,)
    m, var : torch.Tensor of shape (N, K)
        Marginal means and variances at the training inputs.
    L : torch.Tensor of shape (K, N, N)
        Lower Cholesky factors of :math:`K + S_k`.
    alpha : torch.Tensor of shape (K, N)
    elbo : float
        The bound (without the prior on :math:`\theta`; ``info["log_prior"]`` holds it after MAP-II).
    converged : bool
    trace, info, engine_state : optional
    quadrature : Quadrature, optional
        The softmax rule for predictions (default: :func:`gpvi.models.multiclass.default_quadrature`).

    Examples
    --------
    >>> import torch
    >>> from gpvi.models.multiclass import GPMulticlass
    >>> from gpvi.inference.cvi.multiclass import MulticlassCVI
    >>> X = torch.linspace(-2, 2, 30, dtype=torch.float64).unsqueeze(-1)
    >>> y = (X[:, 0] > -0.7).long() + (X[:, 0] > 0.7).long()
    >>> post = MulticlassCVI(progress_bar=False).run(GPMulticlass(X, y))
    >>> p = post.predict_proba(X[:2]); p.shape, bool(torch.allclose(p.sum(-1), torch.ones(2, dtype=torch.float64)))
    (torch.Size([2, 3]), True)
    """

    kind = "multiclass_latent"

    def __init__(self, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor, m: torch.Tensor,
                 var: torch.Tensor, *, L: torch.Tensor, alpha: torch.Tensor, elbo: float, converged: bool = False,
                 trace: dict[str, list] | None = None, info: dict[str, Any] | None = None, engine_state: Any = None,
                 quadrature: Any = None) -> None:
        N, C = lam1.shape
        super().__init__([f"f[{n},{k}]" for n in range(N) for k in range(C)], model, info, engine_state=engine_state)
        self.lam1, self.lam2 = lam1.detach().clone(), lam2.detach().clone()
        self.theta = theta.detach().clone()
        self.m, self.var = m.detach().clone(), var.detach().clone()
        self._L, self._alpha = L.detach(), alpha.detach()
        self.elbo = float(elbo)
        self.converged = bool(converged)
        self.trace = {k: list(v) for k, v in (trace or {}).items()}
        self.quadrature = quadrature

    # ------------------------------------------------------------------ basics
    @property
    def model(self) -> Any:
        return self.target

    @property
    def num_classes(self) -> int:
        return int(self.lam1.shape[1])

    @property
    def classes(self) -> Any:
        """The model's original labels (``classes[k]`` is column k of :meth:`predict_proba`)."""
        return self.model.classes

    @property
    def theta_names(self) -> list[str]:
        return list(self.model.names)

    @property
    def link(self) -> str:
        return self.model.link

    @property
    def sites(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lam1, self.lam2

    def hyperparameters(self) -> dict[str, float]:
        """``{natural name: value}`` of the shared kernel hyperparameters."""
        return self.model.describe(self.theta)

    # ------------------------------------------------------------------ the common surface (flattened, row-major)
    @property
    def mean(self) -> torch.Tensor:
        """Marginal means of ``f[n,k]``, shape (N K,) (``m`` is the (N, K) array)."""
        return self.m.reshape(-1)

    @property
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var.clamp_min(0.0)).reshape(-1)

    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        r"""``(n, N K)`` draws of the latent values (row-major ``f[n,k]``), by Matheron's rule per class."""
        from ..linalg import cholesky_with_jitter
        from ..rng import resolve_generator

        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator, device=self.m.device)
        K = self.model.kernel_matrix(self.theta)
        Lk = cholesky_with_jitter(K, theta=self.theta, what="kernel matrix").L
        N, C = self.m.shape
        s = -0.5 / self.lam2
        ytilde = s * self.lam1
        z = torch.randn((C, N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        eps = torch.randn((C, N, n), generator=gen, dtype=self.m.dtype, device=self.m.device)
        f0 = Lk @ z
        resid = ytilde.T.unsqueeze(-1) - f0 - torch.sqrt(s.T).unsqueeze(-1) * eps
        f = f0 + K @ torch.cholesky_solve(resid, self._L)                        # (C, N, n)
        return f.permute(2, 1, 0).reshape(n, N * C).contiguous()

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        z = torch.special.ndtri(probs.to(self.m)).unsqueeze(-1)
        return self.mean.unsqueeze(0) + z * self.std.unsqueeze(0)

    def _marginal(self, mean: torch.Tensor, sd: torch.Tensor) -> list[dict[str, Any]]:
        return [{"family": "normal", "loc": a, "scale": b} for a, b in zip(mean.tolist(), sd.tolist())]

    def summary(self, prob: float = 0.9, *, natural: bool = True) -> Table:
        """Latent marginals and sites, one row per ``f[n,k]``: ``mean``, ``sd``, the central ``prob`` interval,
        ``lam1``, ``lam2``. ``natural`` is accepted for the common signature."""
        prob = check_fraction(prob, "prob", high_closed=False)
        lo = 100 * (1 - prob) / 2
        probs = torch.tensor([(1 - prob) / 2, 0.5, 1 - (1 - prob) / 2], dtype=torch.float64)
        q = self._quantiles(probs)
        cols: dict[str, list[Any]] = {"mean": self.mean.tolist(), "sd": self.std.tolist()}
        for j, name in enumerate((f"q{lo:g}", "q50", f"q{100 - lo:g}")):
            cols[name] = q[j].tolist()
        cols.update(lam1=self.lam1.reshape(-1).tolist(), lam2=self.lam2.reshape(-1).tolist())
        return Table(self.names, cols, title=f"MulticlassPosterior (CVI): latent marginals and sites, likelihood "
                                             f"{self.link}, K = {self.num_classes}, ELBO {self.elbo:.6g}")

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Means and variances of :math:`q(f_{*k})` for every class, each ``(M, K)``.

        .. math::

            m_{*k} = K_{*X}(K + S_k)^{-1}\tilde{\mathbf y}_k,\qquad v_{*k} = k_{**} - \|L_k^{-1}K_{X*}\|^2
        """
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha.T
        W = torch.linalg.solve_triangular(self._L, Ksx.T.expand(self.num_classes, -1, -1), upper=False)
        var = (kss.unsqueeze(-1) - (W * W).sum(-2).T).clamp_min(0.0)
        return mean, var

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r""":math:`p(y_* = k \mid \mathcal D) = \mathbb E_{q(\mathbf f_*)}[p(y_* = k \mid \mathbf f_*)]`, ``(M, K)``; rows sum to 1.

        Softmax: the quadrature of :mod:`gpvi.models.multiclass` for :math:`K \le 3`, else 4096 fixed quasi-Monte
        Carlo points (:func:`gpvi.models.multiclass.fixed_draws`). Robust-max: the 1-D Gauss-Hermite formula.
        """
        mean, var = self.predict_latent(X_new)
        return self.model.likelihood.predict_proba(mean, var, quadrature=self.quadrature)

    def predict(self, X_new: Any) -> Any:  # type: ignore[override]
        """The labels of highest predictive probability, as the model's original labels (numpy array)."""
        p = self.predict_proba(X_new)
        return self.model.classes[p.argmax(-1).cpu().numpy()]

    def __repr__(self) -> str:
        return (f"MulticlassPosterior(likelihood={self.link!r}, N={self.lam1.shape[0]}, K={self.num_classes}, "
                f"elbo={self.elbo:.6g}, converged={self.converged})")

    # ------------------------------------------------------------------ serialisation
    def _state(self) -> dict[str, Any]:
        q = self.quadrature.spec() if self.quadrature is not None else None
        return {"link": self.link, "lam1": self.lam1, "lam2": self.lam2, "theta": self.theta, "m": self.m,
                "var": self.var, "elbo": self.elbo, "converged": self.converged,
                "trace": {k: list(v) for k, v in self.trace.items()}, "quadrature": q}

    @classmethod
    def _from_state(cls, state: dict[str, Any], target: Any, common: dict[str, Any]) -> MulticlassPosterior:
        from ..inference.cvi.multiclass_sites import MulticlassCVIState, factors, pseudo_data
        from ..models.likelihoods import Quadrature

        model = target
        if model is None:
            raise TypeError("MulticlassPosterior.from_state_dict needs the model (target=...) it was computed for")
        if state.get("link") != model.link:
            raise ValueError(f"state was made with likelihood {state.get('link')!r} but model uses {model.link!r}")
        dev = model.device
        theta = torch.as_tensor(state["theta"], dtype=torch.float64).to(dev)
        lam1 = torch.as_tensor(state["lam1"], dtype=torch.float64).to(dev)
        lam2 = torch.as_tensor(state["lam2"], dtype=torch.float64).to(dev)
        if tuple(lam1.shape) != (model.num_data, model.num_classes):
            raise ValueError(f"state has sites of shape {tuple(lam1.shape)} but the model has (N, K) = "
                             f"({model.num_data}, {model.num_classes})")
        K = model.kernel_matrix(theta)
        ytilde, s = pseudo_data(lam1, lam2)
        L, _ = factors(K, s, theta)
        alpha = torch.cholesky_solve(ytilde.T.unsqueeze(-1), L).squeeze(-1)
        q = state.get("quadrature")
        quad = Quadrature(int(q["num_points"]), str(q["rule"]), scale=float(q["scale"]), width=float(q["width"])) \
            if isinstance(q, dict) else None
        es = common.get("engine_state")
        return cls(model, lam1, lam2, theta, torch.as_tensor(state["m"]).to(dev), torch.as_tensor(state["var"]).to(dev),
                   L=L, alpha=alpha, elbo=state.get("elbo", math.nan), converged=state.get("converged", False),
                   trace=state.get("trace"), info=common.get("info"),
                   engine_state=MulticlassCVIState.from_state_dict(es) if isinstance(es, dict) else es,
                   quadrature=quad)

    def _with_info(self, extra: dict[str, Any], *, converged: bool | None = None) -> MulticlassPosterior:
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.info = {**self.info, **extra}
        if converged is not None:
            new.converged = bool(converged)
        return new
