r"""Standard distributions phi(z) for location-scale variational families theta = C z + mu.

DSVI (Titsias & Lazaro-Gredilla 2014, section 2) needs of the standard distribution only that it can be
sampled and has a known entropy :math:`\mathcal H_\phi` (for the reported bound, eq. 4). gpvi provides:

* :class:`StandardNormal` (default): :math:`\mathcal N(0, I)`;
* :class:`StandardMultivariateT` (``base=("t", df)``): the elliptical multivariate Student-t,
  :math:`z = g/\sqrt{u/\nu}` with :math:`g \sim \mathcal N(0, I)`, :math:`u \sim \chi^2_\nu`. Every linear
  combination :math:`a^\top z` is a Student-t with scale :math:`\lVert a\rVert`, so with a triangular C the
  family :math:`\theta = Cz + \mu` does not depend on the order of :math:`\theta`'s components, and marginals
  of q are exact Student-t's;
* :class:`StandardStudentT`: independent standard Student-t components (a product; with a full triangular C the
  family depends on the order of the components — pass the object itself to use it);
* :class:`Factorised`: a product of user-given univariate standard distributions, one per dimension
  (the slides' tip "choose phi(z) = prod_d phi_d(z_d) with different phi_d").

All sampling takes a ``torch.Generator`` (no global RNG). Non-normal components are drawn by inverse CDF
from uniforms, so any univariate ``torch.distributions`` object with ``icdf`` works.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import scipy.special
import torch

from ..rng import randn
from ..validation import check_choice, check_positive, check_positive_int

__all__ = ["StandardNormal", "StandardMultivariateT", "StandardStudentT", "Factorised", "make_standard", "check_base"]

_U_LO = 2.0 ** -60
_U_HI = 1.0 - 2.0 ** -53


def _gen_device(generator: torch.Generator | None) -> torch.device:
    """Where ``generator`` draws (the CPU without one): tensors drawn from it are created there."""
    return generator.device if generator is not None else torch.device("cpu")


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype,
             device: torch.device | None) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, dtype=dtype, device=_gen_device(generator))
    return u.clamp_(_U_LO, _U_HI) if device is None else u.clamp_(_U_LO, _U_HI).to(device)


class StandardNormal:
    """phi(z) = N(z | 0, I_D)."""

    kind = "normal"

    def __init__(self, dim: int) -> None:
        self.dim = check_positive_int(dim, "dim")

    def sample(self, n: int, generator: torch.Generator | None = None, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Draw ``(n, D)`` standard normals."""
        return randn((n, self.dim), generator, dtype=dtype, device=device)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        """Log density summed over the last dimension."""
        return -0.5 * (z * z).sum(-1) - 0.5 * self.dim * math.log(2 * math.pi)

    def entropy(self) -> float:
        r""":math:`\mathcal H_\phi = \tfrac D2 (1 + \log 2\pi)`."""
        return 0.5 * self.dim * (1.0 + math.log(2 * math.pi))

    def variance(self) -> torch.Tensor:
        """Per-dimension variance (ones)."""
        return torch.ones(self.dim, dtype=torch.float64)

    def spec(self) -> dict[str, Any]:
        """Serialisable description (for ``state_dict``)."""
        return {"kind": "normal", "dim": self.dim}

    def __repr__(self) -> str:
        return f"StandardNormal(dim={self.dim})"


class StandardMultivariateT:
    r"""Elliptical standard multivariate Student-t: :math:`\phi(z) = t_\nu(z \mid 0, I_D)`,

    .. math::

        \log\phi(z) = \log\Gamma\big(\tfrac{\nu+D}{2}\big) - \log\Gamma\big(\tfrac{\nu}{2}\big)
        - \tfrac D2\log(\nu\pi) - \tfrac{\nu+D}{2}\log\big(1 + \lVert z\rVert^2/\nu\big),

    entropy :math:`\mathcal H = -\log\Gamma(\frac{\nu+D}2) + \log\Gamma(\frac\nu2) + \frac D2\log(\nu\pi)
    + \frac{\nu+D}2\big(\psi(\frac{\nu+D}2) - \psi(\frac\nu2)\big)`, covariance :math:`\frac{\nu}{\nu-2}I`
    (:math:`\nu > 2`). Draws: :math:`g \sim \mathcal N(0, I)` and :math:`u = 2\,\Gamma^{-1}_{\nu/2}(U)`
    (inverse regularised incomplete gamma of a generator uniform), :math:`z = g\sqrt{\nu/u}`.

    Parameters
    ----------
    dim : int
    df : float
        :math:`\nu > 0`.
    """

    kind = "mvt"

    def __init__(self, dim: int, df: float) -> None:
        self.dim = check_positive_int(dim, "dim")
        self.df = check_positive(df, "df")

    def sample(self, n: int, generator: torch.Generator | None = None, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Draw ``(n, D)``: normals and one chi-square per row, all from ``generator``."""
        g = randn((n, self.dim), generator)
        u = _uniform((n,), generator, torch.float64, None)
        chi2 = 2.0 * torch.from_numpy(scipy.special.gammaincinv(0.5 * self.df, u.cpu().numpy())).to(g.device)
        return (g * torch.sqrt(self.df / chi2)[:, None]).to(dtype=dtype, device=device)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        nu, D = self.df, self.dim
        c = (math.lgamma(0.5 * (nu + D)) - math.lgamma(0.5 * nu) - 0.5 * D * math.log(nu * math.pi))
        return c - 0.5 * (nu + D) * torch.log1p((z * z).sum(-1) / nu)

    def entropy(self) -> float:
        nu, D = self.df, self.dim
        a, b = 0.5 * (nu + D), 0.5 * nu
        return float(-math.lgamma(a) + math.lgamma(b) + 0.5 * D * math.log(nu * math.pi)
                     + a * (scipy.special.digamma(a) - scipy.special.digamma(b)))

    def variance(self) -> torch.Tensor:
        return _t_variance(self.df, self.dim)

    def spec(self) -> dict[str, Any]:
        return {"kind": "mvt", "dim": self.dim, "df": self.df}

    def __repr__(self) -> str:
        return f"StandardMultivariateT(dim={self.dim}, df={self.df:g})"


def _t_variance(df: float, dim: int) -> torch.Tensor:
    r"""Marginal variances ``(dim,)`` of a standard Student-t: :math:`\nu/(\nu - 2)` for :math:`\nu > 2`, else inf."""
    v = df / (df - 2.0) if df > 2 else math.inf
    return torch.full((dim,), v, dtype=torch.float64)


class StandardStudentT:
    """Independent standard Student-t components: phi(z) = prod_d t_df(z_d).

    Parameters
    ----------
    dim : int
    df : float
        Degrees of freedom nu > 0. The variance is nu / (nu - 2) for nu > 2 and infinite otherwise.
    """

    kind = "t"

    def __init__(self, dim: int, df: float) -> None:
        self.dim = check_positive_int(dim, "dim")
        self.df = check_positive(df, "df")
        self._t = torch.distributions.StudentT(torch.tensor(self.df, dtype=torch.float64))

    def sample(self, n: int, generator: torch.Generator | None = None, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
        """Draw ``(n, D)`` by inverse CDF (``scipy.special.stdtrit``) of generator uniforms."""
        u = _uniform((n, self.dim), generator, torch.float64, None)
        z = torch.from_numpy(scipy.special.stdtrit(self.df, u.cpu().numpy()))
        return z.to(dtype=dtype, device=device)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        return self._t.log_prob(z.to(torch.float64)).sum(-1).to(z.dtype)

    def entropy(self) -> float:
        return float(self._t.entropy()) * self.dim

    def variance(self) -> torch.Tensor:
        return _t_variance(self.df, self.dim)

    def spec(self) -> dict[str, Any]:
        return {"kind": "t", "dim": self.dim, "df": self.df}

    def __repr__(self) -> str:
        return f"StandardStudentT(dim={self.dim}, df={self.df:g})"


class Factorised:
    """A product of univariate standard distributions, one per dimension.

    Parameters
    ----------
    components : sequence of univariate distributions
        Each must provide ``icdf`` and ``log_prob`` (e.g. ``torch.distributions.Laplace(0., 1.)``,
        ``Normal(0., 1.)``, ``StudentT(3.)``). They should be in standard form (location 0, unit scale);
        gpvi does not rescale them. The entropy uses each component's ``entropy()`` when it has one, and
        otherwise a 20 000-point midpoint rule on the inverse CDF.
    """

    kind = "factorised"

    def __init__(self, components: Sequence[Any]) -> None:
        if isinstance(components, (str, bytes)) or not isinstance(components, Sequence) or len(components) == 0:
            raise TypeError("components must be a non-empty sequence of univariate distributions")
        for i, c in enumerate(components):
            for attr in ("icdf", "log_prob"):
                if not callable(getattr(c, attr, None)):
                    raise TypeError(f"components[{i}] ({type(c).__name__}) has no {attr} method")
            try:
                c.icdf(torch.tensor(0.5, dtype=torch.float64))
            except NotImplementedError:
                raise TypeError(f"components[{i}] ({type(c).__name__}) does not implement icdf") from None
        self.components = list(components)
        self.dim = len(self.components)
        self._entropy = float(sum(self._entropy_1d(c) for c in self.components))

    @staticmethod
    def _entropy_1d(c: Any) -> float:
        try:
            h = float(c.entropy())
            if math.isfinite(h):
                return h
        except (NotImplementedError, AttributeError, TypeError):
            pass
        u = (torch.arange(20000, dtype=torch.float64) + 0.5) / 20000
        z = c.icdf(u.to(_param_dtype(c)))
        return float(-c.log_prob(z).to(torch.float64).mean())

    def sample(self, n: int, generator: torch.Generator | None = None, *, dtype: torch.dtype = torch.float64,
               device: torch.device | str | None = None) -> torch.Tensor:
        u = _uniform((n, self.dim), generator, torch.float64, None)
        cols = [c.icdf(u[:, j].to(_param_dtype(c))).to(torch.float64) for j, c in enumerate(self.components)]
        return torch.stack(cols, dim=-1).to(dtype=dtype, device=device)

    def log_prob(self, z: torch.Tensor) -> torch.Tensor:
        cols = [c.log_prob(z[..., j].to(_param_dtype(c))).to(z.dtype) for j, c in enumerate(self.components)]
        return torch.stack(cols, dim=-1).sum(-1)

    def entropy(self) -> float:
        return self._entropy

    def variance(self) -> torch.Tensor:
        out = []
        for c in self.components:
            try:
                v = float(c.variance)
            except (NotImplementedError, AttributeError, TypeError):
                v = float("nan")
            out.append(v if not math.isnan(v) else math.inf)
        return torch.tensor(out, dtype=torch.float64)

    def spec(self) -> dict[str, Any]:
        return {"kind": "factorised", "dim": self.dim, "components": [repr(c) for c in self.components]}

    def __repr__(self) -> str:
        return f"Factorised({', '.join(type(c).__name__ for c in self.components)})"


def _param_dtype(c: Any) -> torch.dtype:
    for name in ("loc", "df", "scale", "low", "rate"):
        v = getattr(c, name, None)
        if isinstance(v, torch.Tensor):
            return v.dtype
    return torch.get_default_dtype()


def check_base(base: Any) -> Any:
    """A base setting checked where it can be without D (an engine's constructor): the names, and the degrees of
    freedom of ``("t", df)``; :func:`make_standard` builds it once D is known."""
    if isinstance(base, str):
        if base in ("t", "student_t", "studentt", "mvt"):
            raise TypeError(f"base={base!r} needs its degrees of freedom: base=('t', df), e.g. ('t', 5.0)")
        check_choice(base, "base", ("normal",))
    elif isinstance(base, tuple) and len(base) == 2 and base[0] == "t":
        base = ("t", check_positive(base[1], "df"))
    elif base is None:
        raise TypeError("base must be 'normal', ('t', df), a sequence of univariate distributions or a standard "
                        "distribution object; got None")
    return base


def make_standard(base: Any, dim: int, *, df: float | None = None) -> Any:
    """Build a standard distribution from ``"normal"``, ``"t"`` (with ``df``) or ``("t", df)`` (the multivariate
    t), a sequence of univariate distributions, or return an existing standard-distribution object (e.g. a
    :class:`StandardStudentT` product) after checking its dim."""
    if isinstance(base, str):
        if base == "normal":
            return StandardNormal(dim)
        if base in ("t", "student_t", "studentt", "mvt"):
            if df is None:
                raise ValueError("base='t' needs df (degrees of freedom), e.g. df=5")
            return StandardMultivariateT(dim, df)
        raise ValueError(f"base must be 'normal', 't', a standard distribution or a sequence of univariate "
                         f"distributions; got {base!r}")
    if isinstance(base, tuple) and len(base) == 2 and base[0] == "t":
        return StandardMultivariateT(dim, base[1])
    if isinstance(base, (list, tuple)):
        f = Factorised(base)
        if f.dim != dim:
            raise ValueError(f"base has {f.dim} components but the target has D = {dim}")
        return f
    if all(callable(getattr(base, a, None)) for a in ("sample", "log_prob", "entropy")) and hasattr(base, "dim"):
        if base.dim != dim:
            raise ValueError(f"base has dim {base.dim} but the target has D = {dim}")
        return base
    raise TypeError(f"base must be 'normal', 't', a standard distribution or a sequence of univariate "
                    f"distributions; got {type(base).__name__}")
