r"""The posterior of CVI: one or K latent Gaussian processes in site form, and the predictive of their labels.

:class:`LatentPosterior` is the Gaussian :math:`q` over the latent values at the N training inputs, held in site form
(Khan & Lin 2017): sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)} < 0` (after eq. 13) of shape (N,) for one
latent function (binary classification, or any factorised likelihood of :class:`~gpvi.models.classification.LatentGP`)
or (N, K) for K class-factorised latent functions (:class:`~gpvi.models.multiclass.GPMulticlass`,
:math:`q(F) = \prod_k \mathcal N(\mathbf f_k \mid \mathbf m_k, V_k)`), the Cholesky factor(s) :math:`L` of
:math:`K + S` ((N, N) or (K, N, N)) and :math:`\boldsymbol\alpha = (K + S)^{-1}\tilde{\mathbf y}` ((N,) or (K, N)) at
the kernel log-hyperparameters :math:`\theta` (shared by the K functions). Each latent GP's :math:`q` is GP regression
on pseudo-targets :math:`\tilde y = -\tilde\lambda^{(1)}/(2\tilde\lambda^{(2)})` with pseudo-noise
:math:`s = -1/(2\tilde\lambda^{(2)})`.

It offers the common posterior surface (:mod:`gpvi.posteriors.base`) over the latent values -- ``names`` (``f[n]``, or
``f[n,k]`` in row-major order), ``mean`` and ``std`` (flattened), ``sample`` (Matheron's rule), ``quantile``,
``marginals``, ``summary`` (latent marginals and site statistics), ``state_dict`` / ``from_state_dict`` (kind
``"latent"``) -- plus ``predict_latent`` and ``predict_proba`` at new inputs and ``predict``
(:class:`BernoulliPredictive` or :class:`CategoricalPredictive`). The run report (settings, counters, times) is
``info``.

Names: ``lam1``, ``lam2`` (:math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}`), ``m``, ``var`` (:math:`m_n`,
:math:`V_{nn}`), ``theta`` (kernel log-hyperparameters), ``L``, ``alpha``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..linalg import cholesky_with_jitter
from ..models.likelihoods import gaussian_expectation
from ..numerics.quadrature import Quadrature
from ..numerics.sites import pseudo_data, site_factor
from ..numerics.softmax_rules import default_quadrature
from ..rng import randn, resolve_generator
from ..table import Table
from ..validation import as_float_tensor, check_binary_labels, check_fraction, check_positive_int
from .base import Posterior
from .info import RunInfo
from .observation import ObservationPredictive

__all__ = ["LatentPosterior", "BernoulliPredictive", "CategoricalPredictive"]


class BernoulliPredictive:
    r"""Predictive distribution of binary labels: :math:`p_i = p(y_i = 1 \mid \mathcal D)` per test point.

    ``mean`` is the probability vector; ``log_prob(y)`` gives :math:`\log p(y_i \mid \mathcal D)` for labels in
    {0, 1} or {-1, +1}, so :func:`gpvi.metrics.nlpd` works on it.

    Examples
    --------
    >>> import torch
    >>> pred = BernoulliPredictive(torch.tensor([0.9, 0.2], dtype=torch.float64))
    >>> [round(v, 4) for v in pred.log_prob([1, 0]).tolist()]
    [-0.1054, -0.2231]
    """

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs = probs

    @property
    def mean(self) -> torch.Tensor:
        return self.probs

    def log_prob(self, y: Any) -> torch.Tensor:
        yt = as_float_tensor(y, "y", ndim=1)
        if yt.shape[0] != self.probs.shape[0]:
            raise ValueError(f"y has {yt.shape[0]} labels but the prediction has {self.probs.shape[0]}")
        values = set(torch.unique(yt).tolist())
        if values <= {0.0, 1.0}:
            y01 = yt
        elif values <= {-1.0, 1.0}:
            y01 = (yt == 1.0).to(torch.float64)
        else:
            y01, _ = check_binary_labels(yt, "y")
        p = self.probs.to(y01)
        return torch.where(y01 == 1.0, torch.log(p), torch.log1p(-p))


class CategoricalPredictive:
    r"""Predictive distribution of K-class labels: ``probs[i, k]`` :math:`= p(y_i = \text{classes}[k] \mid \mathcal D)`.

    ``mean`` is the probability matrix, ``labels`` the most probable class of each point (the original labels), and
    ``log_prob(y)`` gives :math:`\log p(y_i \mid \mathcal D)` for labels among ``classes``.

    Examples
    --------
    >>> import numpy as np, torch
    >>> pred = CategoricalPredictive(torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64), np.array(["a", "b", "c"]))
    >>> pred.labels.tolist(), round(float(pred.log_prob(["b"])[0]), 4)
    (['a'], -1.6094)
    """

    def __init__(self, probs: torch.Tensor, classes: Any) -> None:
        self.probs, self.classes = probs, np.asarray(classes)

    @property
    def mean(self) -> torch.Tensor:
        return self.probs

    @property
    def labels(self) -> np.ndarray:
        """The most probable class of each point, as the original labels."""
        return self.classes[self.probs.argmax(-1).cpu().numpy()]

    def log_prob(self, y: Any) -> torch.Tensor:
        arr = np.asarray(y.detach().cpu().numpy() if isinstance(y, torch.Tensor) else y)
        if arr.shape != (self.probs.shape[0],):
            raise ValueError(f"y must hold {self.probs.shape[0]} labels; got shape {arr.shape}")
        idx = np.searchsorted(self.classes, arr)
        bad = (idx >= len(self.classes)) | (self.classes[np.minimum(idx, len(self.classes) - 1)] != arr)
        if bad.any():
            raise ValueError(f"y holds labels that are not among the classes {self.classes.tolist()}: "
                             f"{sorted(set(arr[bad].tolist()))[:5]}")
        i = torch.as_tensor(idx, dtype=torch.long, device=self.probs.device)
        return torch.log(self.probs.gather(-1, i.unsqueeze(-1)).squeeze(-1))


class LatentPosterior(Posterior):
    r"""The CVI posterior of one or K latent GPs, in site form (see the module docstring).

    Parameters
    ----------
    model : LatentGP or GPMulticlass
    lam1, lam2 : torch.Tensor of shape (N,) or (N, K)
        Sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)}` (``lam2 < 0``).
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters the posterior was computed at.
    m, var : torch.Tensor, the shape of the sites
        Marginal means and variances at the training inputs.
    L : torch.Tensor of shape (N, N) or (K, N, N)
        Lower Cholesky factor(s) of :math:`K + S` (per latent function).
    alpha : torch.Tensor of shape (N,) or (K, N)
        :math:`(K + S)^{-1}\tilde{\mathbf y}` (per latent function).
    elbo : float
        ELBO (eq. 5) of :math:`q` by the deterministic rule (without the prior on :math:`\theta`;
        ``info["log_prior"]`` holds it after MAP-II).
    converged : bool
    trace : dict of str to list, optional
        Per-check records of the run (``step``, ``sweep``, ``elbo``, ``residual``, ``drift``, ``time_s``).
    info : dict, optional
        The run report: settings, counters, ``steps``, ``sweeps``, ``interrupted``, ``time_s``...
    engine_state : CVIState, optional
        The final state; a private copy is kept (resume with ``CVI(...).run(model, state=post.engine_state)``).
    quadrature : Quadrature, optional
        The rule for predictions (default ``Quadrature()`` for one latent function, else
        :func:`gpvi.numerics.softmax_rules.default_quadrature`).

    Attributes
    ----------
    names : list of str
        ``f[0]``, ..., ``f[N-1]`` (or ``f[n,k]``): the latent values at the training inputs (``theta_names`` names
        theta).
    model : LatentGP
        The model (also ``target``).

    Examples
    --------
    >>> import gpvi
    >>> from gpvi.models.classification import GPClassification
    >>> from gpvi.inference.cvi import CVI
    >>> ds = gpvi.datasets.load_pima()
    >>> post = CVI(mode="full", progress_bar=False).run(GPClassification(ds.X_train, ds.y_train))
    >>> post.predict_proba(ds.X_test[:3]).shape, post.mean.shape, post.sample(4, seed=0).shape
    (torch.Size([3]), torch.Size([200]), torch.Size([4, 200]))
    """

    kind = "latent"

    def __init__(self, model: Any, lam1: torch.Tensor, lam2: torch.Tensor, theta: torch.Tensor, m: torch.Tensor,
                 var: torch.Tensor, *, L: torch.Tensor, alpha: torch.Tensor, elbo: float, converged: bool = False,
                 trace: dict[str, list] | None = None, info: dict[str, Any] | None = None, engine_state: Any = None,
                 quadrature: Any = None) -> None:
        super().__init__(self._latent_names(lam1.shape), model, info, engine_state=engine_state)
        self.lam1, self.lam2 = lam1.detach().clone(), lam2.detach().clone()
        self.theta = theta.detach().clone()
        self.m, self.var = m.detach().clone(), var.detach().clone()
        self._L, self._alpha = L.detach(), alpha.detach()
        self.elbo = float(elbo)
        self.converged = bool(converged)
        self.trace = {k: list(v) for k, v in (trace or {}).items()}
        if quadrature is None:
            quadrature = Quadrature() if lam1.dim() == 1 else default_quadrature(lam1.shape[1])
        self.quadrature = quadrature

    # ------------------------------------------------------------------ one or K latent functions
    @staticmethod
    def _latent_names(shape: tuple[int, ...]) -> list[str]:
        if len(shape) == 1:
            return [f"f[{i}]" for i in range(shape[0])]
        N, C = shape
        return [f"f[{n},{k}]" for n in range(N) for k in range(C)]

    @property
    def num_latent(self) -> int:
        """The number of latent functions: 1 (sites of shape (N,)) or K (sites of shape (N, K))."""
        return 1 if self.lam1.dim() == 1 else int(self.lam1.shape[1])

    @property
    def num_classes(self) -> int:
        """The number of classes of a classification model (2 for a binary one)."""
        return len(self.model.classes)

    @property
    def classes(self) -> Any:
        """The model's original labels (``classes[k]`` is column k of a multi-class :meth:`predict_proba`; for a
        binary model ``classes[1]`` is the positive class)."""
        return self.model.classes

    @staticmethod
    def _refactor(model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L, alpha)`` of the sites at ``theta`` (checks the sites' shape against the model first)."""
        shape = tuple(model.site_shape)
        if tuple(lam1.shape) != shape:
            raise ValueError(f"state has sites of shape {tuple(lam1.shape)} but the model has {shape}")
        K = model.kernel_matrix(theta)
        ytilde, s = pseudo_data(lam1, lam2)
        L, _ = site_factor(K, s, theta)
        rhs = ytilde.unsqueeze(-1) if lam1.dim() == 1 else ytilde.T.unsqueeze(-1)
        return L, torch.cholesky_solve(rhs, L).squeeze(-1)

    def _title(self) -> str:
        if self.num_latent == 1:
            return f"LatentPosterior (CVI): latent marginals and sites, link {self.link}"
        return f"LatentPosterior (CVI): latent marginals and sites, likelihood {self.link}, K = {self.num_latent}"

    # ------------------------------------------------------------------ the model and the sites
    @property
    def model(self) -> Any:
        """The model (the same object as ``target``)."""
        return self.target

    @property
    def theta_names(self) -> list[str]:
        """Names of the kernel log-hyperparameters ``theta``."""
        return list(self.model.names)

    @property
    def link(self) -> str:
        return self.model.link

    @property
    def sites(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lam1, lam2)``."""
        return self.lam1, self.lam2

    @property
    def pseudo_noise(self) -> torch.Tensor:
        r""":math:`s = -1/(2\tilde\lambda^{(2)})`, the shape of the sites."""
        return -0.5 / self.lam2

    @property
    def pseudo_targets(self) -> torch.Tensor:
        r""":math:`\tilde y = -\tilde\lambda^{(1)} / (2\tilde\lambda^{(2)})`, the shape of the sites."""
        return self.pseudo_noise * self.lam1

    def hyperparameters(self) -> dict[str, float]:
        """``{natural name: value}`` of the kernel hyperparameters the posterior was computed at."""
        return self.model.describe(self.theta)

    # ------------------------------------------------------------------ the common surface (flattened, row-major)
    @property
    def mean(self) -> torch.Tensor:
        """Marginal means of the latent values at the training inputs, flattened row-major (``m`` keeps the shape
        of the sites)."""
        return self.m.reshape(-1)

    @property
    def std(self) -> torch.Tensor:
        """Marginal standard deviations, flattened as :attr:`mean`."""
        return torch.sqrt(self.var.clamp_min(0.0)).reshape(-1)

    def _quantiles(self, probs: torch.Tensor) -> torch.Tensor:
        z = torch.special.ndtri(probs.to(self.m)).unsqueeze(-1)
        return self.mean.unsqueeze(0) + z * self.std.unsqueeze(0)

    def _marginal(self, mean: torch.Tensor, sd: torch.Tensor) -> list[dict[str, Any]]:
        return [{"family": "normal", "loc": a, "scale": b} for a, b in zip(mean.tolist(), sd.tolist())]

    def summary(self, prob: float = 0.9, *, natural: bool = True) -> Table:
        """Latent marginals and sites, one row per latent value (:attr:`names`).

        Columns: ``mean``, ``sd`` and the central ``prob`` interval (``q5``, ``q50``, ``q95`` by default), then the
        site: ``lam1``, ``lam2``, ``pseudo_target`` and ``pseudo_noise``. The run report is :attr:`info`, the
        hyperparameters :meth:`hyperparameters`. ``natural`` is accepted for the common signature (latent values
        have no natural scale).
        """
        prob = check_fraction(prob, "prob", high_closed=False)
        lo = 100 * (1 - prob) / 2
        probs = torch.tensor([(1 - prob) / 2, 0.5, 1 - (1 - prob) / 2], dtype=torch.float64)
        q = self._quantiles(probs)
        cols: dict[str, list[Any]] = {"mean": self.mean.tolist(), "sd": self.std.tolist()}
        for j, name in enumerate((f"q{lo:g}", "q50", f"q{100 - lo:g}")):
            cols[name] = q[j].tolist()
        cols.update(lam1=self.lam1.reshape(-1).tolist(), lam2=self.lam2.reshape(-1).tolist(),
                    pseudo_target=self.pseudo_targets.reshape(-1).tolist(),
                    pseudo_noise=self.pseudo_noise.reshape(-1).tolist())
        return Table(self.names, cols, title=f"{self._title()}, ELBO {self.elbo:.6g}")

    # ------------------------------------------------------------------ serialisation
    def _state(self) -> dict[str, Any]:
        return {"link": self.link, "lam1": self.lam1, "lam2": self.lam2, "theta": self.theta, "m": self.m,
                "var": self.var, "elbo": self.elbo, "converged": self.converged,
                "trace": {k: list(v) for k, v in self.trace.items()},
                "quadrature": self.quadrature.spec() if self.quadrature is not None else None}

    @classmethod
    def _from_state(cls, state: dict[str, Any], target: Any, common: dict[str, Any]) -> LatentPosterior:
        model = target
        if model is None:
            raise TypeError(f"{cls.__name__}.from_state_dict needs the model (target=...) it was computed for")
        if state.get("link") != model.link:
            raise ValueError(f"state was made with likelihood {state.get('link')!r} but model uses {model.link!r}")
        dev = model.device
        theta = torch.as_tensor(state["theta"], dtype=torch.float64).to(dev)
        lam1 = torch.as_tensor(state["lam1"], dtype=torch.float64).to(dev)
        lam2 = torch.as_tensor(state["lam2"], dtype=torch.float64).to(dev)
        L, alpha = cls._refactor(model, theta, lam1, lam2)
        q = state.get("quadrature") or (common.get("info") or {}).get("quadrature")
        quad = Quadrature(int(q["num_points"]), str(q["rule"]), scale=float(q["scale"]), width=float(q["width"])) \
            if isinstance(q, dict) else None
        es = common.get("engine_state")             # a dict, as for every posterior: engine.resume reads it
        return cls(model, lam1, lam2, theta, torch.as_tensor(state["m"]).to(dev), torch.as_tensor(state["var"]).to(dev),
                   L=L, alpha=alpha, elbo=state.get("elbo", math.nan), converged=state.get("converged", False),
                   trace=state.get("trace"), info=common.get("info"),
                   engine_state=es, quadrature=quad)

    def _with_info(self, extra: dict[str, Any], *, converged: bool | None = None) -> LatentPosterior:
        """A copy with ``extra`` merged into ``info`` (the tensors are shared: posteriors never change)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.info = RunInfo.of(self.info)
        new.info.update(extra)
        if converged is not None:
            new.converged = bool(converged)
        return new

    # ------------------------------------------------------------------ draws
    @torch.no_grad()
    def sample(self, n: int, generator: torch.Generator | None = None, seed: int | None = None) -> torch.Tensor:
        r"""``(n, N)`` (or ``(n, N K)``, row-major ``f[n,k]``) draws of the latent values :math:`\mathbf f \sim q`.

        By conditioning prior draws on the pseudo-data (Matheron's rule; exact for this Gaussian :math:`q`):

        .. math::

            \mathbf f = \mathbf f_0 + K (K + S)^{-1}(\tilde{\mathbf y} - \mathbf f_0 - \boldsymbol\varepsilon),
            \qquad \mathbf f_0 \sim \mathcal N(0, K),\ \boldsymbol\varepsilon \sim \mathcal N(0, S),

        which needs only the factors of :math:`K` (with the shared jitter policy) and of :math:`K + S`, never
        :math:`V` itself (forming :math:`V = K - K(K+S)^{-1}K` cancels badly where the sites are strong); with K latent
        functions, per function.
        """
        n = check_positive_int(n, "n")
        gen = resolve_generator(seed, generator, device=self.m.device)
        K = self.model.kernel_matrix(self.theta)
        Lk = cholesky_with_jitter(K, theta=self.theta, what="kernel matrix").L
        if self.lam1.dim() == 2:
            return self._sample_classes(n, gen, K, Lk)
        N = self.m.shape[0]
        z = randn((N, n), gen, dtype=self.m.dtype, device=self.m.device)
        eps = randn((N, n), gen, dtype=self.m.dtype, device=self.m.device)
        f0 = Lk @ z
        resid = self.pseudo_targets.unsqueeze(-1) - f0 - torch.sqrt(self.pseudo_noise).unsqueeze(-1) * eps
        return (f0 + K @ torch.cholesky_solve(resid, self._L)).T.contiguous()

    def _sample_classes(self, n: int, gen: torch.Generator, K: torch.Tensor, Lk: torch.Tensor) -> torch.Tensor:
        N, C = self.m.shape
        s, ytilde = self.pseudo_noise, self.pseudo_targets
        z = randn((C, N, n), gen, dtype=self.m.dtype, device=self.m.device)
        eps = randn((C, N, n), gen, dtype=self.m.dtype, device=self.m.device)
        f0 = Lk @ z
        resid = ytilde.T.unsqueeze(-1) - f0 - torch.sqrt(s.T).unsqueeze(-1) * eps
        f = f0 + K @ torch.cholesky_solve(resid, self._L)                        # (C, N, n)
        return f.permute(2, 1, 0).reshape(n, N * C).contiguous()

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict_latent(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Mean and variance of :math:`q(f_*)` at new inputs (GP regression on the pseudo-data).

        .. math::

            m_* = K_{*X}(K + S)^{-1}\tilde{\mathbf y},\qquad v_* = k_{**} - \|L^{-1} K_{X*}\|^2

        Parameters
        ----------
        X_new : array-like of shape (n, n_features)

        Returns
        -------
        mean, var : torch.Tensor of shape (n,), or (n, K) with K latent functions (one regression per function)
        """
        if self.lam1.dim() == 2:
            return self._predict_classes(X_new)
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha
        W = torch.linalg.solve_triangular(self._L, Ksx.T, upper=False)
        var = (kss - (W * W).sum(0)).clamp_min(0.0)
        return mean, var

    @torch.no_grad()
    def predict_proba(self, X_new: Any) -> torch.Tensor:
        r"""Class probabilities :math:`\mathbb E_{q(\mathbf f_*)}[p(y_* \mid \mathbf f_*)]` at new inputs.

        Binary, shape ``(n,)``: :math:`p(y_* = 1 \mid \mathcal D)` ("1" is ``model.classes[1]``); probit
        :math:`\Phi(m_*/\sqrt{1 + v_*})` (closed form), logit the quadrature of :math:`\sigma(f_*)`. K classes, shape
        ``(n, K)``, rows summing to 1: the softmax quadrature of :mod:`gpvi.models.multiclass` for :math:`K \le 3`,
        else 4096 fixed quasi-Monte Carlo points (:func:`gpvi.numerics.softmax_rules.fixed_draws`); robust-max the
        1-D Gauss-Hermite formula.
        """
        lik = self.model.likelihood
        if self.lam1.dim() == 2:
            mean, var = self._predict_classes(X_new)
            return lik.predict_proba(mean, var, quadrature=self.quadrature)
        if not getattr(lik, "binary", False):
            raise TypeError(f"predict_proba needs a binary likelihood; this posterior's is {lik.name!r}")
        mean, var = self.predict_latent(X_new)
        if lik.name == "probit":
            return torch.special.ndtr(mean / torch.sqrt(1.0 + var))
        return gaussian_expectation(lik.response, mean, var, self.quadrature).clamp(0.0, 1.0)

    def predict(self, X_new: Any) -> BernoulliPredictive | CategoricalPredictive | ObservationPredictive:  # type: ignore[override]
        """The predictive of the targets at ``X_new``: :class:`BernoulliPredictive` (binary) or
        :class:`CategoricalPredictive` (K classes) of labels, or for counts, outliers and proportions
        (:class:`gpvi.GPGeneralisedRegression`) the :class:`~gpvi.posteriors.observation.ObservationPredictive` of
        :math:`y_*` (mean, intervals, log density by quadrature over :math:`q(f_*)`); all work with ``gpvi.metrics``."""
        lik = self.model.likelihood
        if self.lam1.dim() == 1 and not getattr(lik, "binary", False):
            return ObservationPredictive(lik, *self.predict_latent(X_new), quadrature=self.quadrature)
        p = self.predict_proba(X_new)
        if p.dim() == 2:
            return CategoricalPredictive(p, self.model.classes)
        return BernoulliPredictive(p)

    def _predict_classes(self, X_new: Any) -> tuple[torch.Tensor, torch.Tensor]:
        Ksx = self.model.cross_covariance(self.theta, X_new)
        kss = self.model.prior_variance(self.theta, X_new)
        mean = Ksx @ self._alpha.T
        W = torch.linalg.solve_triangular(self._L, Ksx.T.expand(self.num_latent, -1, -1), upper=False)
        var = (kss.unsqueeze(-1) - (W * W).sum(-2).T).clamp_min(0.0)
        return mean, var

    def __repr__(self) -> str:
        k = "" if self.lam1.dim() == 1 else f", K={self.num_latent}"
        return (f"LatentPosterior(link={self.link!r}, N={self.model.num_data}{k}, elbo={self.elbo:.6g}, "
                f"converged={self.converged}, mode={self.info.get('mode')!r})")
