r"""What CVI's two posteriors share: a Gaussian over latent GP values held in site form.

:class:`SitePosterior` is the part of :class:`~gpvi.posteriors.latent.LatentPosterior` (one latent GP, sites of
shape (N,)) and :class:`~gpvi.posteriors.multiclass.MulticlassPosterior` (K class-factorised latent GPs, sites of
shape (N, K)) that does not depend on the number of latent functions: the sites and the quantities read from them,
the marginals as the common posterior surface (flattened row-major), the summary table and the serialisation. With
sites :math:`\tilde\lambda^{(1)}, \tilde\lambda^{(2)} < 0` (Khan & Lin 2017, after eq. 13) each latent GP's
:math:`q` is GP regression on pseudo-targets :math:`\tilde y = -\tilde\lambda^{(1)}/(2\tilde\lambda^{(2)})` with
pseudo-noise :math:`s = -1/(2\tilde\lambda^{(2)})`.

A subclass sets ``kind``, :meth:`_latent_names`, :meth:`_refactor` (the factors of :math:`K + S` and
:math:`\boldsymbol\alpha` from the sites, for :meth:`from_state_dict`), :meth:`_title`
and its own ``sample`` and predictions.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..table import Table
from ..validation import check_fraction
from .base import Posterior

__all__ = ["SitePosterior"]


class SitePosterior(Posterior):
    r"""A Gaussian over latent GP values in site form (see the module docstring); not used on its own.

    Parameters
    ----------
    model : LatentGP or GPMulticlass
    lam1, lam2 : torch.Tensor of shape (N,) or (N, K)
        Sites (``lam2 < 0``).
    theta : torch.Tensor of shape (D,)
        Kernel log-hyperparameters the posterior was computed at.
    m, var : torch.Tensor, the shape of the sites
        Marginal means and variances at the training inputs.
    L : torch.Tensor of shape (N, N) or (K, N, N)
        Lower Cholesky factors of :math:`K + S` (per class).
    alpha : torch.Tensor of shape (N,) or (K, N)
        :math:`(K + S)^{-1}\tilde{\mathbf y}` (per class).
    elbo : float
    converged : bool
    trace, info, engine_state : optional
        The run's per-check records, report and final state (a private copy is kept).
    quadrature : Quadrature, optional
        The rule for predictions (default: the subclass's).
    """

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
        self.quadrature = quadrature if quadrature is not None else self._default_quadrature()

    # ------------------------------------------------------------------ hooks
    @staticmethod
    def _latent_names(shape: tuple[int, ...]) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def _default_quadrature() -> Any:
        return None

    @classmethod
    def _refactor(cls, model: Any, theta: torch.Tensor, lam1: torch.Tensor, lam2: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L, alpha)`` of the sites at ``theta`` (checks the sites' shape against the model first)."""
        raise NotImplementedError

    def _title(self) -> str:
        raise NotImplementedError

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
    def _from_state(cls, state: dict[str, Any], target: Any, common: dict[str, Any]) -> SitePosterior:
        from ..numerics.quadrature import Quadrature

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
                   engine_state=es,
                   quadrature=quad)

    def _with_info(self, extra: dict[str, Any], *, converged: bool | None = None) -> SitePosterior:
        """A copy with ``extra`` merged into ``info`` (the tensors are shared: posteriors never change)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.info = {**self.info, **extra}
        if converged is not None:
            new.converged = bool(converged)
        return new
