r"""DSVI's option objects: the update rule with its step size, and a block-diagonal scale.

* :class:`SGD`, :class:`Natural`, :class:`Adam` -- the update rule of :class:`~gpvi.inference.dsvi.engine.DSVI`
  (``optimizer=``), each carrying its initial step size :math:`\rho_0` (``lr``), the ratio :math:`\rho_C/\rho_\mu`
  (``lr_scale``), its step-size schedule and its own knobs, as optax's ``optax.adam(learning_rate=...)`` or
  NumPyro's ``numpyro.optim.Adam(step_size=...)`` do. The strings ``"sgd"``, ``"natural"``, ``"adam"`` mean the
  rule with its defaults; ``"auto"`` lets DSVI pick ``Natural()`` or ``SGD()`` per target
  (:meth:`~gpvi.inference.dsvi.engine.DSVI.resolve_optimizer`). The maths of the three rules is in
  :mod:`~gpvi.inference.dsvi.updates`.
* :class:`BlockDiagonal` -- ``DSVI(scale=BlockDiagonal(...))``, a full scale whose entries linking different
  groups of parameters stay zero.

Names follow the paper: ``lr`` = :math:`\rho_0` for :math:`\mu`; ``lr * lr_scale`` = :math:`\rho_0` for :math:`C`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch

from ...validation import as_float_tensor, check_choice, check_fraction, check_positive
from ..schedules import SCHEDULES, make_schedule
from .setup import curvature_rate
from .updates import adam_step, natural_step

__all__ = ["SGD", "Natural", "Adam", "UpdateRule", "BlockDiagonal", "OPTIMIZERS", "as_rule",
           "NATURAL_LR", "NATURAL_SCHEDULE"]

OPTIMIZERS = ("auto", "sgd", "natural", "adam")
NATURAL_LR = 0.05
"""Initial step size rho_0 of :class:`Natural` with ``lr="auto"`` (in units of q's own scale)."""
NATURAL_SCHEDULE = {"tau": 200.0, "kappa": 0.6}
"""Robbins-Monro options of :class:`Natural` with ``schedule="auto"``: rho_t = rho_0 / (1 + t/200)^0.6."""
ADAM_LR = 0.01
"""Initial step size rho_0 of :class:`Adam` with ``lr="auto"``."""


@dataclass(frozen=True, eq=False, repr=False)
class UpdateRule:
    r"""What the three update rules share: the step size, its schedule, and which parameters move.

    Parameters
    ----------
    lr : float or "auto"
        :math:`\rho_0` for :math:`\mu` (> 0). ``"auto"``: the rule's own default (see each rule). With a
        schedule object (which carries its own :math:`\rho_0`) leave it at ``"auto"``.
    lr_scale : float
        :math:`\rho_C/\rho_\mu` (>= 0); ``0`` keeps :math:`C` at its initial value.
    schedule : {"auto", "decay", "robbins_monro", "constant"} or schedule object
        Step-size schedule (:mod:`gpvi.inference.schedules`) applied to both rates. ``"auto"``: the rule's default.
        ``"decay"`` is the paper's "multiply by 0.95 every k steps", k = ``num_steps // 20``;
        ``"robbins_monro"`` is :math:`\rho_0/(1+t/\tau)^\kappa` (:math:`\tau` = ``num_steps / 10``,
        :math:`\kappa = 0.6`); ``"constant"`` keeps :math:`\rho_0`.
    schedule_options : dict, optional
        Options of a named schedule (``tau``, ``kappa``, ``factor``, ``every``), e.g. for a minibatch target the
        decay by about N / M over the run of ``schedule="robbins_monro", schedule_options={"kappa": 1.0,
        "tau": num_steps * M / N}`` (the gradient noise grows like :math:`\sqrt{N/M}`).
    fixed_mean : array-like of bool, shape (D,), optional
        True where :math:`\mu_d` is held at its initial value (the slides' tip "some components of :math:`\mu`
        can be fixed at zero"); its gradient is zeroed and the step leaves it unchanged. Like ``lr_scale=0`` for
        :math:`C`, it says which parameters the rule moves (optax's ``masked``).
    """

    name: ClassVar[str] = ""
    lr: float | str = "auto"
    lr_scale: float = 1.0
    schedule: Any = "auto"
    schedule_options: dict[str, Any] | None = None
    fixed_mean: Any = None

    def __post_init__(self) -> None:
        lr = check_choice(self.lr, "lr", ("auto",)) if isinstance(self.lr, str) else check_positive(self.lr, "lr")
        object.__setattr__(self, "lr", lr)
        object.__setattr__(self, "lr_scale", check_positive(self.lr_scale, "lr_scale", allow_zero=True))
        options = dict(self.schedule_options or {})
        object.__setattr__(self, "schedule_options", options)
        if isinstance(self.schedule, str):
            check_choice(self.schedule, "schedule", ("auto",) + tuple(SCHEDULES))
            if self.schedule == "auto" and options:
                raise ValueError("schedule_options need a named schedule (schedule='auto' picks its own options)")
            if self.schedule != "auto":
                make_schedule(self.schedule, 1.0, **options)                    # validates the options
        else:
            make_schedule(self.schedule, 1.0)
            if lr != "auto":
                raise ValueError("lr must be left at 'auto' when schedule is a schedule object (it carries rho0)")
            if options:
                raise ValueError("schedule_options only apply to a named schedule")
        if self.fixed_mean is not None:
            t = as_float_tensor(self.fixed_mean, "fixed_mean", ndim=1)
            if not bool(((t == 0) | (t == 1)).all()):
                raise ValueError("fixed_mean must hold booleans (True = component of mu held fixed)")
            object.__setattr__(self, "fixed_mean", t.bool())

    # ------------------------------------------------------------------ step size
    def default_lr(self, target: Any, mu0: torch.Tensor, generator: torch.Generator, batch: Any) -> float:
        """:math:`\\rho_0` for ``lr="auto"`` (overridden per rule)."""
        raise NotImplementedError

    def initial_rate(self, target: Any, mu0: torch.Tensor, generator: torch.Generator, batch: Any) -> float:
        """The resolved :math:`\\rho_0` for :math:`\\mu`: the schedule object's, ``lr``, or the rule's default."""
        if not isinstance(self.schedule, str):
            return float(self.schedule.rho0)
        if self.lr != "auto":
            return float(self.lr)
        return self.default_lr(target, mu0, generator, batch)

    def default_schedule(self, rho0: float, num_steps: int) -> Any:
        """The schedule of ``schedule="auto"``: ``"decay"`` over ``num_steps`` (overridden by :class:`Natural`)."""
        return make_schedule("decay", rho0, num_steps=num_steps)

    def make_schedule(self, rho0: float, num_steps: int) -> Any:
        """The step-size schedule of a run of ``num_steps`` steps starting at ``rho0``."""
        if not isinstance(self.schedule, str):
            return self.schedule
        if self.schedule == "auto":
            return self.default_schedule(rho0, num_steps)
        return make_schedule(self.schedule, rho0, num_steps=num_steps, **self.schedule_options)

    # ------------------------------------------------------------------ the step
    def init_opt(self, mu0: torch.Tensor, C0: torch.Tensor) -> dict[str, Any]:
        """The rule's own state kept in ``DSVIState.opt`` (empty but for Adam's moments)."""
        return {}

    def propose(self, state: Any, est: Any, rho: float, rho_C: float, mask: torch.Tensor | None,
                info: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposed ``(d_mu, d_C)`` from the gradient estimate ``est`` (Algorithm 1 for :class:`SGD`)."""
        return rho * est.grad_mu, rho_C * est.grad_C

    def settings(self) -> dict[str, Any]:
        """Plain values for ``info["settings"]``."""
        out: dict[str, Any] = {"name": self.name}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "schedule" and not isinstance(v, str):
                v = repr(v)
            elif f.name == "fixed_mean" and v is not None:
                v = [bool(b) for b in v]
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            v = getattr(self, f.name)
            default = f.default
            if f.name == "fixed_mean":
                if v is not None:
                    parts.append(f"fixed_mean={[bool(b) for b in v]}")
            elif f.name == "schedule_options":
                if v:
                    parts.append(f"schedule_options={v!r}")
            elif v != default:
                parts.append(f"{f.name}={v!r}")
        return f"{type(self).__name__}({', '.join(parts)})"


@dataclass(frozen=True, eq=False, repr=False)
class SGD(UpdateRule):
    r"""Algorithm 1 of the paper: :math:`\mu \leftarrow \mu + \rho_t\hat\nabla_\mu`,
    :math:`C \leftarrow C + \rho_{C,t}\hat\nabla_C` (eq. 5-8; eq. 9 for a diagonal scale).

    Parameters
    ----------
    lr : float or "auto"
        ``"auto"``: :math:`\rho_0 = 0.5/\hat\lambda`, :math:`\hat\lambda` the largest curvature
        :math:`|\mathrm{eig}(\nabla^2\log g)|` at the initial mean, by 20 power iterations with finite-difference
        Hessian-vector products (2 log-joint evaluations each, batched): the mean update stays stable whatever
        the scale of the problem. A heuristic of gpvi (the paper hand-picks :math:`\rho_0`, e.g. 0.05 / N for
        DSVI-ARD). The resolved rates are ``info["lr_mu"]``, ``info["lr_C"]``.
    lr_scale : float
        Default 0.1, the paper's :math:`\rho_C = 0.1\rho_t`.
    schedule : str or schedule object
        ``"auto"``: ``"decay"``.
    schedule_options, fixed_mean
        See :class:`UpdateRule`.

    Examples
    --------
    >>> SGD(lr=0.1, schedule="constant")
    SGD(lr=0.1, schedule='constant')
    """

    name: ClassVar[str] = "sgd"
    lr_scale: float = 0.1

    def default_lr(self, target: Any, mu0: torch.Tensor, generator: torch.Generator, batch: Any) -> float:
        return curvature_rate(target, mu0, generator, batch)


@dataclass(frozen=True, eq=False, repr=False)
class Natural(UpdateRule):
    r"""Algorithm 1's gradients preconditioned by q's scale, with a KL trust region (gpvi's, not the paper's).

    :math:`\mu \leftarrow \mu + \rho\, CC^\top\hat\nabla_\mu`,
    :math:`C \leftarrow C(I + \rho_C\operatorname{tril}(C^\top\hat\nabla_C))`, each step halved until the
    Gaussian KL divergence between q before and after is at most ``max_step_kl``
    (:func:`~gpvi.inference.dsvi.updates.natural_step`); the fixed points are Algorithm 1's. The default rule for
    exact GP regression targets, started at the MAP with the Laplace scale.

    Parameters
    ----------
    lr : float or "auto"
        ``"auto"``: :math:`\rho_0 = 0.05` (steps are in units of q's own scale, so no problem-dependent rate).
    lr_scale : float
        Default 1 (the steps are already scale-free).
    schedule : str or schedule object
        ``"auto"``: :math:`\rho_t = \rho_0/(1 + t/200)^{0.6}` (Robbins-Monro, independent of ``num_steps`` so that
        a run ended by the convergence rule does not depend on it).
    max_step_kl : float
        Largest KL divergence of one step (> 0, default 0.1); larger proposed steps are halved until they fit
        (``info["trust_clips"]`` counts them). At the default rate it binds only on rare outlying gradient
        estimates and during the first steps.
    schedule_options, fixed_mean
        See :class:`UpdateRule`.

    Examples
    --------
    >>> Natural(max_step_kl=0.05)
    Natural(max_step_kl=0.05)
    """

    name: ClassVar[str] = "natural"
    max_step_kl: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "max_step_kl", check_positive(self.max_step_kl, "max_step_kl"))

    def default_lr(self, target: Any, mu0: torch.Tensor, generator: torch.Generator, batch: Any) -> float:
        return NATURAL_LR

    def default_schedule(self, rho0: float, num_steps: int) -> Any:
        return make_schedule("robbins_monro", rho0, **NATURAL_SCHEDULE)

    def propose(self, state: Any, est: Any, rho: float, rho_C: float, mask: torch.Tensor | None,
                info: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        diag = state.scale == "diag"
        d_mu, d_C, shrink = natural_step(state.C, diag, est.grad_mu, est.grad_C, rho, rho_C, self.max_step_kl,
                                         None if diag else mask)
        info["trust_shrink"] = shrink
        if shrink < 1.0:
            state.counters["trust_clips"] = state.counters.get("trust_clips", 0) + 1
        return d_mu, d_C


@dataclass(frozen=True, eq=False, repr=False)
class Adam(UpdateRule):
    r"""Algorithm 1's stochastic gradients fed to Adam (Kingma & Ba 2015): per-coordinate step sizes, a
    departure from the paper (no Robbins-Monro guarantee).

    Parameters
    ----------
    lr : float or "auto"
        ``"auto"``: :math:`\rho_0 = 0.01`.
    lr_scale : float
        Default 1.
    schedule : str or schedule object
        ``"auto"``: ``"decay"``.
    betas : (float, float)
        Decay rates of Adam's first and second moments, each in [0, 1).
    eps : float
        Added to the root of the second moment (> 0).
    schedule_options, fixed_mean
        See :class:`UpdateRule`.

    Examples
    --------
    >>> Adam(lr=0.02, betas=(0.8, 0.99))
    Adam(lr=0.02, betas=(0.8, 0.99))
    """

    name: ClassVar[str] = "adam"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.betas, (tuple, list)) or len(self.betas) != 2:
            raise TypeError("betas must be a pair (beta1, beta2)")
        object.__setattr__(self, "betas", tuple(check_fraction(b, f"betas[{i}]", low_open=False, high_closed=False)
                                                for i, b in enumerate(self.betas)))
        object.__setattr__(self, "eps", check_positive(self.eps, "eps"))

    def default_lr(self, target: Any, mu0: torch.Tensor, generator: torch.Generator, batch: Any) -> float:
        return ADAM_LR

    def init_opt(self, mu0: torch.Tensor, C0: torch.Tensor) -> dict[str, Any]:
        return {"m_mu": torch.zeros_like(mu0), "v_mu": torch.zeros_like(mu0), "m_C": torch.zeros_like(C0),
                "v_C": torch.zeros_like(C0), "n": 0}

    def propose(self, state: Any, est: Any, rho: float, rho_C: float, mask: torch.Tensor | None,
                info: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return adam_step(state.opt, est.grad_mu, est.grad_C, rho, rho_C, self.betas, self.eps)


RULES: dict[str, type[UpdateRule]] = {"sgd": SGD, "natural": Natural, "adam": Adam}


def as_rule(optimizer: Any) -> UpdateRule | str:
    """``optimizer`` checked: ``"auto"``, or an :class:`UpdateRule` (a name gives the rule with its defaults)."""
    if isinstance(optimizer, (SGD, Natural, Adam)):
        return optimizer
    if isinstance(optimizer, str):
        check_choice(optimizer, "optimizer", OPTIMIZERS)
        return optimizer if optimizer == "auto" else RULES[optimizer]()
    raise TypeError(f"optimizer must be one of {list(OPTIMIZERS)} or an update rule (SGD, Natural, Adam from "
                    f"gpvi.inference.dsvi); got {type(optimizer).__name__}")


class BlockDiagonal:
    """A full lower-triangular scale C whose entries linking different groups of parameters stay zero.

    Parameters
    ----------
    blocks : sequence
        A partition of ``range(D)`` into groups of indices (``[[0, 3], [1, 2]]``), or contiguous block sizes
        (``[2, 3]``: parameters 0-1 and 2-4). Checked against D when a run starts.

    Examples
    --------
    >>> BlockDiagonal([2, 3])
    BlockDiagonal([2, 3])
    """

    def __init__(self, blocks: Sequence[Any]) -> None:
        if isinstance(blocks, (str, bytes)) or not isinstance(blocks, Sequence) or len(blocks) == 0:
            raise TypeError("blocks must be a non-empty list of block sizes or a list of index groups")
        if all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in blocks):
            self.blocks: list[Any] = [int(b) for b in blocks]
        else:
            try:
                self.blocks = [[int(i) for i in g] for g in blocks]
            except TypeError:
                raise TypeError("blocks must be a list of block sizes or a list of index groups") from None

    def __repr__(self) -> str:
        return f"BlockDiagonal({self.blocks!r})"
