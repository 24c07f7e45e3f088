r"""The parameters of a GPyTorch module (kernel, Gaussian likelihood, mean) as slices of one unconstrained theta.

Each parameter tensor the user left trainable becomes a :class:`HyperparameterBlock` of theta, mapped to its
natural value (the value GPyTorch reports, e.g. ``kernel.lengthscale``) by the bijection its constraint asks for
(:class:`Bijection`):

=====================================  ==================================================  =========================
constraint                             natural value :math:`v(\theta)`                     :math:`\log|dv/d\theta|`
=====================================  ==================================================  =========================
``Positive()`` (lower bound 0)         :math:`e^{p\theta}` (:math:`p = \tfrac12` for a     :math:`\log p + p\theta`
                                       lengthscale: theta = log l^2; else 1)
``GreaterThan(a)``, :math:`a \ne 0`    :math:`a + e^{\theta}`                              :math:`\theta`
``Interval(a, b)``                     :math:`a + (b - a)\,\sigma(\theta)`                 :math:`\log(b-a) + \log\sigma(\theta) + \log\sigma(-\theta)`
none                                   :math:`\theta`                                      0
=====================================  ==================================================  =========================

GPyTorch's hidden softplus is removed: the module is deep-copied and each constraint replaced by one whose
transform is the bijection above, so ``raw = raw_per_theta * theta`` exactly. A ``LessThan`` constraint (no
lower bound) is refused with a ``ValueError`` naming the parameter.

A parameter with ``requires_grad=False`` (frozen) is **not** in theta: it keeps the value set on it, with its own
constraint, and is listed in :attr:`ModuleParametrisation.fixed`.

Priors registered on the module (``lengthscale_prior=``, ``outputscale_prior=``, ``noise_prior=``,
``ConstantMean(constant_prior=...)``) are found with ``named_priors()`` and tied to the block whose natural value
their closure returns (:meth:`ModuleParametrisation.registered_priors`); a prior on a frozen parameter is a
constant. A prior whose closure is not one parameter's natural value is refused.

**Values set by the user** (one rule for regression and classification): GPyTorch initialises every raw parameter
of its kernels, likelihoods and means to 0 (``lengthscale = softplus(0) = 0.693``, ``noise = 0.693 + 1e-4``,
``constant = 0``). A trainable parameter whose raw value is not all zero was set by the user (``kernel.lengthscale =
2.0``, ``initialize(...)``, a constraint's ``initial_value``): it is listed in
:attr:`ModuleParametrisation.user_set`, and the models start there (and ``GPClassifier(hyperparameters="fixed")``
keeps it). A parameter left at GPyTorch's initial value gets the model's data-scaled start instead.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import gpytorch
import torch

__all__ = ["Bijection", "HyperparameterBlock", "ModuleParametrisation", "RegisteredPrior"]

_NAMES = {"lengthscale": "log_lengthscale_sq", "outputscale": "log_signal_var", "noise": "log_noise_var"}
_NATURAL = {"lengthscale": "lengthscale", "outputscale": "signal_var", "noise": "noise_var"}


@dataclass(frozen=True)
class Bijection:
    r"""theta -> natural value of one block: ``kind`` in ``"log"`` (:math:`e^{p\theta}`), ``"greater"``
    (:math:`a + e^\theta`), ``"interval"`` (:math:`a + (b-a)\sigma(\theta)`) or ``"raw"`` (:math:`\theta`);
    ``power`` is :math:`p`, ``lower``/``upper`` are :math:`a, b`."""

    kind: str = "log"
    power: float = 1.0
    lower: float = 0.0
    upper: float = math.inf

    def forward(self, theta: torch.Tensor) -> torch.Tensor:
        if self.kind == "log":
            return torch.exp(self.power * theta)
        if self.kind == "greater":
            return self.lower + torch.exp(theta)
        if self.kind == "interval":
            return self.lower + (self.upper - self.lower) * torch.sigmoid(theta)
        return theta

    def log_abs_det(self, theta: torch.Tensor) -> torch.Tensor:
        r"""Elementwise :math:`\log|dv/d\theta|`, same shape as ``theta``."""
        if self.kind == "log":
            return math.log(self.power) + self.power * theta
        if self.kind == "greater":
            return theta
        if self.kind == "interval":
            return (math.log(self.upper - self.lower) + torch.nn.functional.logsigmoid(theta)
                    + torch.nn.functional.logsigmoid(-theta))
        return torch.zeros_like(theta)

    def derivative(self, theta: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        r""":math:`dv/d\theta` at ``theta`` (``value`` = :meth:`forward` of it)."""
        if self.kind == "log":
            return self.power * value
        if self.kind == "greater":
            return value - self.lower
        if self.kind == "interval":
            s = torch.sigmoid(theta)
            return (self.upper - self.lower) * s * (1.0 - s)
        return torch.ones_like(value)

    def inverse(self, value: torch.Tensor) -> torch.Tensor:
        if self.kind == "log":
            return torch.log(value) / self.power
        if self.kind == "greater":
            return torch.log(value - self.lower)
        if self.kind == "interval":
            return torch.logit((value - self.lower) / (self.upper - self.lower))
        return value

    @property
    def raw_per_theta(self) -> float:
        """GPyTorch's raw value per theta in the copy (``raw = raw_per_theta * theta``)."""
        return self.power if self.kind == "log" else 1.0


@dataclass(frozen=True)
class HyperparameterBlock:
    """One GPyTorch parameter tensor mapped to a slice of theta.

    Attributes
    ----------
    path : str
        Parameter path inside the module (e.g. ``"base_kernel.raw_lengthscale"``).
    shape : torch.Size
        Shape of the raw parameter (without a batch dimension).
    start, stop : int
        Slice of theta that holds it.
    raw_per_theta : float
        ``raw = raw_per_theta * theta`` in the deep copy (0.5 for lengthscales, theta = log l^2; 1 otherwise).
    log : bool
        Whether theta is a log value (``Positive()`` constraint).
    names : tuple of str
        Names of the theta entries.
    natural_names : tuple of str
        Names on the natural scale (``lengthscale[0]``, ``signal_var``...).
    natural_power : float
        natural value = ``exp(natural_power * theta)`` for log parameters (0.5 for lengthscales).
    bijection : Bijection
        theta -> natural value, with its log-Jacobian (any constraint kind).
    """

    path: str
    shape: torch.Size
    start: int
    stop: int
    raw_per_theta: float
    log: bool
    names: tuple[str, ...]
    natural_names: tuple[str, ...]
    natural_power: float
    bijection: Bijection = Bijection()


@dataclass(frozen=True)
class RegisteredPrior:
    """A prior registered on the GPyTorch module: ``prior.log_prob(natural value of block)`` (or a constant for
    a frozen parameter, ``block is None``), under the name ``name`` (``"base_kernel.lengthscale_prior"``)."""

    name: str
    prior: object
    block: HyperparameterBlock | None
    constant: float = 0.0


def strip_raw(name: str) -> str:
    return name[4:] if name.startswith("raw_") else name


def walk(module: torch.nn.Module, prefix: str = ""):
    """Post-order walk yielding (owner module, param name, full path); skips constraint and prior modules."""
    for child_name, child in module.named_children():
        if isinstance(child, (gpytorch.constraints.Interval, gpytorch.priors.Prior)):
            continue
        yield from walk(child, f"{prefix}{child_name}.")
    for pname, param in module._parameters.items():
        if param is not None:
            yield module, pname, f"{prefix}{pname}"


def _constraint_of(owner: torch.nn.Module, pname: str):
    getter = getattr(owner, "constraint_for_parameter_name", None)
    return getter(pname) if getter is not None else None


def _bijection_for(constraint, path: str, stem: str, what: str) -> Bijection:
    """The bijection of a constraint (see the module docstring), or a ValueError naming the parameter."""
    if constraint is None:
        return Bijection("raw")
    lb_t, ub_t = torch.as_tensor(constraint.lower_bound), torch.as_tensor(constraint.upper_bound)
    if lb_t.numel() > 1 and bool((lb_t != lb_t.reshape(-1)[0]).any()) or \
            ub_t.numel() > 1 and bool((ub_t != ub_t.reshape(-1)[0]).any()):
        raise ValueError(f"{what} parameter {path!r} has constraint {constraint!r} with bounds that differ between "
                         f"entries; gpvi supports one lower and one upper bound per parameter")
    lb, ub = float(lb_t.reshape(-1)[0]), float(ub_t.reshape(-1)[0])
    if math.isinf(lb):
        raise ValueError(f"{what} parameter {path!r} has constraint {constraint!r} (no lower bound); gpvi "
                         f"parametrises Positive(), GreaterThan(a) and Interval(a, b) constraints. Rebuild it with "
                         f"e.g. {stem}_constraint=gpytorch.constraints.Interval(a, b)")
    if math.isinf(ub):
        return Bijection("log", 0.5 if stem == "lengthscale" else 1.0) if lb == 0.0 else Bijection("greater", 1.0, lb)
    return Bijection("interval", 1.0, lb, ub)


def _theta_names(b: Bijection, stem: str, what: str = "module") -> tuple[str, str]:
    # a ConstantMean's constant is the mean constant; a ConstantKernel's is a variance, named "constant"
    nat = "mean_constant" if what == "mean" and stem == "constant" else _NATURAL.get(stem, stem)
    if b.kind == "log":
        return _NAMES.get(stem, f"log_{stem}"), nat
    if b.kind == "greater":
        return f"log_excess_{nat}", nat
    if b.kind == "interval":
        return f"logit_{nat}", nat
    return nat, nat


def _replace_constraint(owner: torch.nn.Module, pname: str, b: Bijection, dtype, device) -> None:
    """Give the copy a constraint whose transform is ``b`` (raw = raw_per_theta * theta, no softplus)."""
    if b.kind == "log":
        c = gpytorch.constraints.Positive(transform=torch.exp, inv_transform=torch.log)
    elif b.kind == "greater":
        c = gpytorch.constraints.GreaterThan(0.0, transform=torch.exp, inv_transform=torch.log)
    else:
        c = gpytorch.constraints.Interval(0.0, 1.0, transform=torch.sigmoid, inv_transform=torch.logit)
    c.lower_bound = torch.tensor(b.lower, dtype=dtype, device=device)    # bounds in float64, never float32-rounded
    c.upper_bound = torch.tensor(b.upper, dtype=dtype, device=device)
    owner.register_constraint(pname, c)


class ModuleParametrisation:
    """The trainable parameters of a GPyTorch module as theta blocks (see the module docstring).

    Parameters
    ----------
    module : torch.nn.Module
        A GPyTorch kernel, likelihood or mean; deep-copied, never modified.
    dtype, device
        Where the copy lives.
    what : str
        What the module is, in messages (``"kernel"``, ``"likelihood"``, ``"mean"``).

    Attributes
    ----------
    module : torch.nn.Module
        The copy, its constraints replaced.
    blocks : list of HyperparameterBlock
    names, natural_names : list of str
    dim : int
    fixed : dict
        ``{natural name: value}`` of the frozen parameters (not in theta).
    original_values : dict
        ``{path: natural value}`` of the trainable parameters as the user's module held them.
    user_set : frozenset of str
        Paths of the trainable parameters the user set (raw value not all zero, i.e. not GPyTorch's initial
        value; see the module docstring): the models' start uses these values.
    """

    def __init__(self, module: torch.nn.Module, *, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None, what: str = "module") -> None:
        self.what = what
        self.original_values = {}
        user_set = set()
        for owner, pname, path in walk(module):
            c = _constraint_of(owner, pname)
            raw = owner._parameters[pname].detach()
            self.original_values[path] = (c.transform(raw) if c is not None else raw).clone().to(dtype)
            if bool((raw != 0).any()):
                user_set.add(path)
        k = copy.deepcopy(module).to(dtype=dtype, device=device)
        blocks: list[HyperparameterBlock] = []
        self.fixed: dict[str, float | list] = {}
        self._fixed_paths: dict[str, torch.Tensor] = {}
        offset = 0
        for owner, pname, path in list(walk(k)):
            param = owner._parameters[pname]
            stem = strip_raw(pname)
            b = _bijection_for(_constraint_of(owner, pname), path, stem, what)
            theta_name, nat_name = _theta_names(b, stem, what)
            size = param.numel()
            indexed = size > 1 or (stem == "lengthscale" and getattr(owner, "ard_num_dims", None) is not None)
            names = tuple(f"{theta_name}[{i}]" if indexed else theta_name for i in range(size))
            nat_names = tuple(f"{nat_name}[{i}]" if indexed else nat_name for i in range(size))
            if not param.requires_grad:                         # frozen: held at its value, not in theta
                value = self.original_values.pop(path)
                self._fixed_paths[path] = value
                owner_path = path.rsplit(".", 1)[0] + "." if "." in path else ""
                for n, v in zip(nat_names, value.reshape(-1).tolist()):
                    self.fixed[n if n not in self.fixed else owner_path + n] = v
                continue
            if b.kind != "raw":
                _replace_constraint(owner, pname, b, dtype, param.device)
            blocks.append(HyperparameterBlock(path, param.shape, offset, offset + size, b.raw_per_theta,
                                              b.kind == "log", names, nat_names,
                                              b.power if b.kind == "log" else 1.0, b))
            offset += size
        all_names = [n for bl in blocks for n in bl.names]
        if len(set(all_names)) != len(all_names):       # make names unique by prefixing module paths
            fixed = []
            for bl in blocks:
                owner_path = bl.path.rsplit(".", 1)[0] + "." if "." in bl.path else ""
                fixed.append(HyperparameterBlock(bl.path, bl.shape, bl.start, bl.stop, bl.raw_per_theta, bl.log,
                                                 tuple(owner_path + n for n in bl.names),
                                                 tuple(owner_path + n for n in bl.natural_names), bl.natural_power,
                                                 bl.bijection))
            blocks = fixed
        self.module = k
        self.user_set = frozenset(b.path for b in blocks if b.path in user_set)
        self.blocks = blocks
        self.names = [n for bl in blocks for n in bl.names]
        self.natural_names = [n for bl in blocks for n in bl.natural_names]
        self.dim = offset
        self._registered: list[RegisteredPrior] | None = None

    # ------------------------------------------------------------------ values
    def theta_from_module(self) -> torch.Tensor:
        """theta at the values the user's module held when this object was built, shape ``(dim,)``, on the CPU (where
        those values are kept; callers move it to the data's device)."""
        theta = torch.zeros(self.dim, dtype=torch.float64, device="cpu")
        for b in self.blocks:
            v = self.original_values[b.path].to(torch.float64).reshape(-1).cpu()
            theta[b.start:b.stop] = b.bijection.inverse(v)
        return theta

    def raw_parameters(self, theta_k: torch.Tensor) -> dict[str, torch.Tensor]:
        """Raw GPyTorch parameter values (of the copy) for theta of shape ``(dim,)`` or ``(S, dim)``."""
        lead = theta_k.shape[:-1]
        return {b.path: (theta_k[..., b.start:b.stop] * b.raw_per_theta).reshape(tuple(lead) + tuple(b.shape))
                for b in self.blocks}

    def natural(self, theta_k: torch.Tensor) -> torch.Tensor:
        """Natural-scale values of theta (each block through its bijection), same shape."""
        out = theta_k.clone()
        for b in self.blocks:
            out[..., b.start:b.stop] = b.bijection.forward(theta_k[..., b.start:b.stop])
        return out

    # ------------------------------------------------------------------ registered priors
    def registered_priors(self) -> list[RegisteredPrior]:
        """The priors registered on the module, each tied to the block whose natural value it scores.

        Each prior's closure is evaluated on a scratch copy whose blocks hold distinct probe values; it must
        return exactly one block's natural value (or a frozen parameter's value: a constant term).

        Raises
        ------
        ValueError
            A prior on a quantity that is not one parameter's natural value, or one whose ``log_prob`` at the
            frozen value is not finite.
        """
        if self._registered is not None:
            return self._registered
        scratch = copy.deepcopy(self.module)
        probe = 0.3 + 0.0173 * torch.arange(self.dim, dtype=torch.float64)
        raws = self.raw_parameters(probe)
        with torch.no_grad():
            for path, raw in raws.items():
                owner_path, _, pname = path.rpartition(".")
                owner = scratch.get_submodule(owner_path) if owner_path else scratch
                owner._parameters[pname].copy_(raw.to(owner._parameters[pname]))
        nat = self.natural(probe)
        out: list[RegisteredPrior] = []
        for (name, owner, prior, closure, _), (_, s_owner, _, s_closure, _) in zip(self.module.named_priors(),
                                                                                 scratch.named_priors()):
            with torch.no_grad():
                value = torch.as_tensor(s_closure(s_owner)).detach().reshape(-1).to(torch.float64).cpu()
            match = [b for b in self.blocks if b.stop - b.start == value.numel()
                     and torch.allclose(value, nat[b.start:b.stop], rtol=1e-12, atol=0.0)]
            if len(match) == 1:
                out.append(RegisteredPrior(name, prior, match[0]))
                continue
            fixed = [v for v in self._fixed_paths.values() if v.numel() == value.numel()
                     and torch.allclose(value, v.reshape(-1).cpu(), rtol=1e-12, atol=0.0)]
            if fixed:
                with torch.no_grad():
                    lp = float(torch.as_tensor(prior.log_prob(closure(owner))).sum())
                if not math.isfinite(lp):
                    raise ValueError(f"the {self.what}'s prior {name!r} ({type(prior).__name__}) is {lp} at the frozen "
                                     f"value {value.tolist()}")
                out.append(RegisteredPrior(name, prior, None, lp))
                continue
            raise ValueError(f"the {self.what}'s prior {name!r} ({type(prior).__name__}) is on a quantity that is not "
                             f"one parameter's value, which gpvi cannot tie to its hyperparameters; register it on "
                             f"a parameter (e.g. lengthscale_prior=) or give it by name: prior={{name: distribution}}")
        self._registered = out
        return out

