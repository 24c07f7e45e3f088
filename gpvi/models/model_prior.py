r"""The prior of a GP model over theta: priors registered on its GPyTorch modules, priors on named natural-scale
quantities, and gpvi's default for the rest.

One rule decides the prior of each theta component :math:`\theta_j`:

1. a prior **registered** on the GPyTorch kernel, likelihood or mean that owns it (``lengthscale_prior=``,
   ``outputscale_prior=``, ``noise_prior=``, ``constant_prior=``), applied to the parameter's natural value as
   GPyTorch evaluates it (``prior.log_prob(kernel.lengthscale)``);
2. or a **named** prior, ``prior={"lengthscale": HalfNormal(1.0), "signal_sd": ..., "noise_sd": ...}``, applied to
   that natural-scale quantity, each entry independently (see :func:`resolve_names` for the names);
3. every component neither covers gets the **base** prior on theta itself: gpvi's default
   :math:`\mathcal N(0, 10)` (``"scaled"``: centred at the model's data-scaled start; ``None``: none, a flat
   prior, for the type-II loops' ML-II).

A component covered by both 1 and 2 is refused (``ValueError``), as is a ``prior=`` distribution over all of theta
together with registered priors: the registered priors are part of the user's model and a whole-theta prior would
silently replace them.

A prior on a natural value :math:`v = g(\theta)` enters the log density over theta with the log-Jacobian,

.. math::

    \log p(\theta) = \sum_{\text{terms}} \Big[\log p_v(g(\theta_J)) + \sum_{j \in J} \log |g'(\theta_j)|\Big]
                     + \sum_{j \notin \text{terms}} \log \mathcal N(\theta_j \mid c_j, 10),

with :math:`g` the block's bijection (:class:`gpvi.models.parameters.Bijection`; for a standard deviation
:math:`s = \sqrt v`, :math:`\log|ds/d\theta| = \log|dv/d\theta| - \log 2 - \tfrac12 \log v`). So the exact GP's
``log_joint`` is :math:`N` times GPyTorch's ``ExactMarginalLogLikelihood`` plus the log-Jacobian when every
component has a registered prior (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from .parameters import HyperparameterBlock, RegisteredPrior
from .prior_densities import density_and_score, float_density_and_score, family

__all__ = ["ModelPrior", "shift_part", "resolve_names", "base_label"]

_ALIASES = {"signal_sd": ("signal_var", True), "noise_sd": ("noise_var", True), "outputscale": ("signal_var", False),
            "noise": ("noise_var", False), "signal_variance": ("signal_var", False),
            "noise_variance": ("noise_var", False)}


@dataclass(frozen=True)
class _Term:
    label: str                    # what the prior is and where it came from, for messages and the summary
    start: int
    stop: int
    dist: Any
    block: HyperparameterBlock
    shape: tuple                  # the shape the natural values take for dist.log_prob
    sd: bool = False              # the prior is on sqrt(natural value)


def shift_part(blocks: list[HyperparameterBlock], registered: list[RegisteredPrior], offset: int):
    """A module's blocks and registered priors moved to start at ``offset`` of the model's theta."""
    moved = {id(b): replace(b, start=b.start + offset, stop=b.stop + offset) for b in blocks}
    return ([moved[id(b)] for b in blocks],
            [replace(r, block=None if r.block is None else moved[id(r.block)]) for r in registered])


_LOG_2PI = math.log(2.0 * math.pi)
FLOAT_ROWS = 8
"""At most this many thetas are computed in Python floats by :meth:`ModelPrior.log_prob_and_grad`."""


def _stem(name: str) -> str:
    return name.split("[", 1)[0]


def resolve_names(key: str, blocks: list[HyperparameterBlock]) -> list[tuple[HyperparameterBlock, list[int], bool]]:
    """The theta components a named prior's key addresses: ``(block, indices into the block, on the sd)``.

    A key is a natural name (``"lengthscale[nox]"``, ``"lengthscale[0]"``, ``"signal_var"``, ``"noise_var"``,
    ``"period_length"``, ``"mean_constant"``, with a module path where names repeat), the name without its index
    (``"lengthscale"``: every entry, each independently), a standard deviation (``"signal_sd"``, ``"noise_sd"``:
    the square root of the variance) or an alias (``"outputscale"``, ``"noise"``).
    """
    target, sd = _ALIASES.get(key, (key, False))
    out = []
    for b in blocks:
        idx = [i for i, n in enumerate(b.natural_names)
               if target in (n, _stem(n), _stem(n).rsplit(".", 1)[-1], n.rsplit(".", 1)[-1])]
        if idx:
            out.append((b, idx, sd))
    return out


def base_label(base: str, centre: float, sd: float) -> str:
    """What a component's base prior is, with its numbers (a model whose base prior is set from its data)."""
    what = ("gpvi default: N(0, 10) on the standardised problem" if base == "default" else
            "gpvi 'scaled': centred at the data-scaled start")
    return f"N({centre:.4g}, {sd * sd:.4g}) on theta ({what})"


def _label(dist: Any) -> str:
    return type(dist).__name__


class ModelPrior:
    r"""``log p(theta)`` of a GP model (see the module docstring for the rule and the maths).

    Parameters
    ----------
    blocks : list of HyperparameterBlock
        The model's theta blocks at their offsets in theta.
    registered : list of RegisteredPrior
        Priors registered on the GPyTorch modules (blocks at their offsets; ``block=None``: a constant).
    named : dict, optional
        ``{name: distribution}`` on natural-scale quantities (:func:`resolve_names`).
    base : {"default", "scaled"} or None
        The prior of the components no registered or named prior covers.
    dim : int
    names : list of str
        theta's names (for messages and :meth:`summary`).
    center : torch.Tensor, optional
        The centre :math:`c` of the base prior, one value per theta component (default 0).
    scale : torch.Tensor, optional
        The base prior's standard deviation per theta component (default :math:`\sqrt{10}` everywhere).
    arg : str
        The argument's name in messages.

    Raises
    ------
    ValueError
        An unknown name, a component with two priors, a distribution whose support includes negative values on
        a positive quantity.
    TypeError
        A named prior without ``log_prob``.
    """

    def __init__(self, blocks: list[HyperparameterBlock], registered: list[RegisteredPrior], named: dict | None,
                 base: str | None, *, dim: int, names: list[str], center: torch.Tensor | None = None,
                 scale: torch.Tensor | None = None, arg: str = "prior") -> None:
        self.dim, self.names, self.base, self.arg = dim, list(names), base, arg
        self.constant = sum(r.constant for r in registered if r.block is None)
        self.constant_labels = [f"{_label(r.prior)} registered as {r.name} (on a frozen parameter: a constant)"
                                for r in registered if r.block is None]
        terms: list[_Term] = []
        owner = [""] * dim
        for r in registered:
            if r.block is None:
                continue
            b = r.block
            on = (", ".join(b.natural_names) if len(b.natural_names) <= 3 else
                  f"{b.natural_names[0]} ... {b.natural_names[-1]} ({len(b.natural_names)} entries)")
            terms.append(_Term(f"{_label(r.prior)} registered as {r.name}, on {on}",
                               b.start, b.stop, r.prior, b, tuple(b.shape)))
            for j in range(b.start, b.stop):
                owner[j] = f"the registered {r.name}"
        for key, dist in (named or {}).items():
            if not isinstance(key, str):
                raise TypeError(f"{arg}'s keys must be names of hyperparameters (str); got {key!r}")
            if not callable(getattr(dist, "log_prob", None)):
                raise TypeError(f"{arg}[{key!r}] must have a log_prob method (e.g. a torch.distributions "
                                f"Distribution); got {type(dist).__name__}")
            found = resolve_names(key, blocks)
            if not found:
                known = sorted({n for b in blocks for n in b.natural_names} | {_stem(n) for b in blocks
                                                                              for n in b.natural_names})
                raise ValueError(f"{arg}[{key!r}] names no hyperparameter of this model; known names: {known} "
                                 f"(and signal_sd / noise_sd for the square roots of the variances)")
            for b, idx, sd in found:
                self._check_support(dist, b, key)
                for i in idx:
                    j = b.start + i
                    if owner[j]:
                        raise ValueError(f"{arg}[{key!r}] and {owner[j]} both give a prior for {self.names[j]}; "
                                         f"give one")
                    owner[j] = f"{arg}[{key!r}]"
                    terms.append(_Term(f"{_label(dist)} from {arg}[{key!r}], on "
                                       f"{'sqrt ' if sd else ''}{b.natural_names[i]}", j, j + 1, dist, b, (), sd))
        self.terms = terms
        self.uncovered = torch.tensor([j for j in range(dim) if not owner[j]], dtype=torch.long)
        loc = torch.zeros(dim, dtype=torch.float64) if center is None else center.detach().to(torch.float64).cpu()
        sd = (torch.full((dim,), math.sqrt(10.0), dtype=torch.float64) if scale is None else
              scale.detach().to(torch.float64).cpu())
        self._loc, self._scale = loc[self.uncovered], sd[self.uncovered]
        self._log_scale = torch.tensor([math.log(v) for v in self._scale.tolist()], dtype=torch.float64)
        self._base_given = center is not None or scale is not None

    def _check_support(self, dist: Any, b: HyperparameterBlock, key: str) -> None:
        support = getattr(dist, "support", None)
        if b.bijection.kind == "raw" or b.bijection.lower < 0 or support is None:
            return
        try:
            negative_allowed = bool(torch.as_tensor(support.check(torch.tensor(-1.0, dtype=torch.float64))).any())
        except Exception:                                   # exotic supports: the start check decides
            return
        if negative_allowed:
            raise ValueError(f"{self.arg}[{key!r}] is a {type(dist).__name__} with support {support}, but "
                             f"{b.natural_names[0]} is positive: use a distribution on the positive reals "
                             f"(HalfNormal, Gamma, LogNormal, InverseGamma ...)")

    # ------------------------------------------------------------------ densities
    def _term_log_prob(self, t: _Term, theta: torch.Tensor) -> torch.Tensor:
        lead = theta.shape[:-1]
        th = theta[..., t.start:t.stop]
        v = t.block.bijection.forward(th)
        lj = t.block.bijection.log_abs_det(th)
        if t.sd:
            lj = lj - math.log(2.0) - 0.5 * torch.log(v)
            v = torch.sqrt(v)
        lp = torch.as_tensor(t.dist.log_prob(v.reshape(tuple(lead) + t.shape)))
        return lp.reshape(tuple(lead) + (-1,)).sum(-1) + lj.sum(-1)

    def log_prob_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        r"""``log p(theta)`` ``(S,)`` and its gradient ``(S, D)`` for a batch, in closed form where the terms'
        distributions are standard ones (:mod:`gpvi.models.prior_densities`): by the chain rule through
        :math:`u = v` or :math:`\sqrt v`, :math:`v = g(\theta)`, plus the derivative of the log-Jacobian; other terms
        by autograd. A few thetas (at most ``FLOAT_ROWS``, a sampler's chains) whose terms all have scalar parameters
        are computed row by row in Python floats (a few microseconds a row instead of a few dozen tensor
        operations)."""
        if theta.shape[0] <= FLOAT_ROWS and self._float_plan() is not None:
            try:
                return self._float_log_prob_and_grad(theta)
            except (OverflowError, ValueError, ZeroDivisionError):   # extreme theta: the tensor path's inf / nan
                pass
        S = theta.shape[0]
        total = torch.full((S,), self.constant, dtype=theta.dtype, device=theta.device)
        grad = torch.zeros_like(theta)
        for t in self.terms:
            th = theta[:, t.start:t.stop]
            b = t.block.bijection
            v = b.forward(th)
            u = torch.sqrt(v) if t.sd else v
            ds = density_and_score(t.dist, u.reshape((S,) + t.shape))
            if ds is None:                                  # an unusual distribution: autograd on this term alone
                with torch.enable_grad():
                    full = theta.detach().clone().requires_grad_(True)
                    lp = self._term_log_prob(t, full)
                    (g,) = torch.autograd.grad(lp.sum(), full)
                total = total + lp.detach()
                grad += g
                continue
            lp, sc = ds[0].reshape(S, -1), ds[1].reshape(th.shape)
            dv = b.derivative(th, v)
            lj = b.log_abs_det(th)
            dlj = (b.power if b.kind == "log" else 1.0 if b.kind == "greater" else
                   1.0 - 2.0 * torch.sigmoid(th) if b.kind == "interval" else 0.0)
            if t.sd:
                lj = lj - math.log(2.0) - 0.5 * torch.log(v)
                sc, dlj = 0.5 * sc / u, dlj - 0.5 * dv / v
            total = total + lp.sum(-1) + lj.sum(-1)
            grad[:, t.start:t.stop] += sc * dv + dlj
        if self.base is not None and self.uncovered.numel():
            idx = self.uncovered.to(theta.device)
            sd = self._scale.to(theta)
            z = (theta[:, idx] - self._loc.to(theta)) / sd
            total = total + (-0.5 * z * z - self._log_scale.to(theta) - 0.5 * _LOG_2PI).sum(-1)
            grad[:, idx] += -z / sd
        return total, grad

    def _float_plan(self) -> list | None:
        """Per term ``(start, stop, family, float parameters, bijection, sd)`` when every term's distribution is a
        standard family with scalar parameters, else None (cached)."""
        if not hasattr(self, "_plan"):
            plan = []
            for t in self.terms:
                fam = family(t.dist)
                if fam is None or any(torch.as_tensor(v).numel() != 1 for v in fam[1].values()):
                    plan = None
                    break
                plan.append((t.start, t.stop, fam[0], {k: float(v) for k, v in fam[1].items()}, t.block.bijection,
                             t.sd))
            self._plan = plan
            n = self.uncovered.numel()
            self._base_float = list(zip(self.uncovered.tolist(), self._loc.reshape(-1).tolist() if n else [],
                                        self._scale.tolist() if n else [], self._log_scale.tolist() if n else []))
        return self._plan

    def _float_log_prob_and_grad(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._float_row(th) for th in theta.tolist()]
        return (torch.tensor([r[0] for r in rows], dtype=theta.dtype, device=theta.device),
                torch.tensor([r[1] for r in rows], dtype=theta.dtype, device=theta.device))

    def _float_row(self, th: list[float]) -> tuple[float, list[float]]:
        total, g = self.constant, [0.0] * len(th)
        for start, stop, name, par, b, sd in self._plan:
            for j in range(start, stop):
                t = th[j]
                if b.kind == "log":
                    v = math.exp(b.power * t)
                    dv, lj, dlj = b.power * v, math.log(b.power) + b.power * t, b.power
                elif b.kind == "greater":
                    e = math.exp(t)
                    v, dv, lj, dlj = b.lower + e, e, t, 1.0
                elif b.kind == "interval":
                    sg = 1.0 / (1.0 + math.exp(-t))
                    v = b.lower + (b.upper - b.lower) * sg
                    dv = (b.upper - b.lower) * sg * (1.0 - sg)
                    lj, dlj = math.log(dv), 1.0 - 2.0 * sg
                else:
                    v, dv, lj, dlj = t, 1.0, 0.0, 0.0
                u = math.sqrt(v) if sd else v
                lp, sc = float_density_and_score(name, par, u)
                if sd:
                    lj, sc, dlj = lj - math.log(2.0) - 0.5 * math.log(v), 0.5 * sc / u, dlj - 0.5 * dv / v
                total += lp + lj
                g[j] += sc * dv + dlj
        if self.base is not None:
            for j, c, sd, log_sd in self._base_float:
                z = (th[j] - c) / sd
                total += -0.5 * z * z - log_sd - 0.5 * _LOG_2PI
                g[j] += -z / sd
        return total, g

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        """``log p(theta)``: ``(D,) -> ()``, ``(S, D) -> (S,)``; differentiable."""
        total = torch.full(theta.shape[:-1], self.constant, dtype=theta.dtype, device=theta.device)
        for t in self.terms:
            total = total + self._term_log_prob(t, theta)
        if self.base is not None and self.uncovered.numel():
            idx = self.uncovered.to(theta.device)
            z = (theta[..., idx] - self._loc.to(theta)) / self._scale.to(theta)
            total = total + (-0.5 * z * z - self._log_scale.to(theta) - 0.5 * math.log(2 * math.pi)).sum(-1)
        return total

    def check(self, start: torch.Tensor) -> None:
        """Refuse a prior that is -inf or NaN at the model's start, naming the term (``ValueError``)."""
        start = start.detach()
        for t in self.terms:
            with torch.no_grad():
                try:
                    lp = float(self._term_log_prob(t, start))
                except ValueError:                  # torch's support validation: outside the support
                    lp = -math.inf
            if not math.isfinite(lp):
                values = t.block.bijection.forward(start[t.start:t.stop])
                raise ValueError(f"{self.arg}: the {t.label} is {lp} at the model's start "
                                 f"({', '.join(self.names[t.start:t.stop])} = {start[t.start:t.stop].tolist()}, "
                                 f"natural value {values.tolist()}); a prior must be finite where the fit starts")

    def summary(self) -> dict[str, str]:
        """``{theta name: its prior}``, in theta's order (frozen parameters' constant terms are not in theta)."""
        out = {n: ("flat (no prior)" if self.base is None else
                   "N(0, 10) on theta (gpvi default)" if self.base == "default" else
                   "N(data-scaled theta, 10) on theta (gpvi 'scaled')") for n in self.names}
        if self.base is not None and self._base_given:
            for j, c, sd in zip(self.uncovered.tolist(), self._loc.tolist(), self._scale.tolist()):
                out[self.names[j]] = base_label(self.base, c, sd)

        for t in self.terms:
            for j in range(t.start, t.stop):
                out[self.names[j]] = t.label + " (with the log-Jacobian of theta -> it)"
        return out

    def __repr__(self) -> str:
        return f"ModelPrior(D={self.dim}, terms={len(self.terms)}, base={self.base!r})"
