"""The parts of :class:`gpvi.GPRegression` that come from GPyTorch objects: the noise (gpvi's ``log_noise_var`` or a
``GaussianLikelihood``'s parameter, with its constraint, prior or frozen value), a ``ConstantMean``'s constant, and the
model's prior (:class:`gpvi.models.model_prior.ModelPrior`: registered, named and default priors, one rule).

theta's layout: ``[kernel | noise (absent when frozen) | mean constant (with a trainable ConstantMean)]``.
"""

from __future__ import annotations

import math
from typing import Any

import gpytorch
import torch

from .model_prior import ModelPrior, base_label, shift_part
from .parameters import Bijection, HyperparameterBlock, ModuleParametrisation
from .priors import check_prior

__all__ = ["NoiseMeanPrior", "finite_rows_only"]


class NoiseMeanPrior:
    """Mixin of :class:`gpvi.GPRegression`: builds the noise and mean blocks and the prior (needs ``X``,
    ``kernel_params``, ``names``, ``dim`` and ``initial_theta``)."""

    def _set_noise_and_mean(self, likelihood: Any, mean: Any) -> None:
        """The noise block (gpvi's ``log_noise_var`` or the GaussianLikelihood's) and the mean block, if any."""
        kd = self.kernel_params.dim
        self._lik_params = self._mean_params = None
        self._lik_fixed, self._mean_fixed = {}, {}
        self._fixed_noise = self._fixed_mean = None
        self._noise_diag: torch.Tensor | None = None          # known per-point noise (FixedNoiseGaussianLikelihood)
        parts = [(self.kernel_params, 0)]
        if likelihood is None:
            self._noise_block: HyperparameterBlock | None = HyperparameterBlock(
                "noise", torch.Size([1]), kd, kd + 1, 1.0, True, ("log_noise_var",), ("noise_var",), 1.0,
                Bijection("log", 1.0))
        else:
            fixed_noise = type(likelihood) is gpytorch.likelihoods.FixedNoiseGaussianLikelihood
            if fixed_noise:
                self._noise_diag = self._known_noise(likelihood)
            elif type(likelihood) is not gpytorch.likelihoods.GaussianLikelihood or \
                    likelihood.noise_covar.raw_noise.numel() != 1:
                raise TypeError(f"likelihood must be a gpytorch.likelihoods.GaussianLikelihood (homoskedastic, no "
                                f"batch shape) or FixedNoiseGaussianLikelihood (known noise per point); got "
                                f"{type(likelihood).__name__}")
            lp = self._lik_params = ModuleParametrisation(likelihood, device=self.X.device, what="likelihood")
            self._lik_fixed = lp.fixed
            parts.append((lp, kd))
            self._noise_block = shift_part(lp.blocks, [], kd)[0][0] if lp.dim else None
            if lp.dim == 0:
                self._fixed_noise = 0.0 if fixed_noise else float(likelihood.noise.detach().reshape(-1)[0])
        nd = 0 if self._noise_block is None else 1
        self._mean_block = None
        if mean is not None and type(mean) is not gpytorch.means.ZeroMean:
            if type(mean) is not gpytorch.means.ConstantMean or len(mean.batch_shape) != 0:
                raise TypeError(f"mean must be a gpytorch.means.ConstantMean or ZeroMean (no batch shape); got "
                                f"{type(mean).__name__}")
            mp = self._mean_params = ModuleParametrisation(mean, device=self.X.device, what="mean")
            self._mean_fixed = mp.fixed
            parts.append((mp, kd + nd))
            if mp.dim:
                self._mean_block = shift_part(mp.blocks, [], kd + nd)[0][0]
            else:
                self._fixed_mean = float(mean.constant.detach().reshape(-1)[0])
        self._parts = parts
        self._blocks = list(self.kernel_params.blocks) + ([self._noise_block] if nd else []) + \
            ([self._mean_block] if self._mean_block is not None else [])
        self._plain = likelihood is None and self._mean_params is None and not self.kernel_params.fixed and all(
            b.bijection.kind == "log" for b in self.kernel_params.blocks)

    def _known_noise(self, likelihood: Any) -> torch.Tensor:
        """The per-point noise variances of a ``FixedNoiseGaussianLikelihood``: float64 ``(N,)`` on the data's device,
        finite and non-negative (``ValueError`` naming ``likelihood`` otherwise)."""
        noise = likelihood.noise_covar.noise.detach()
        n = self.X.shape[0]
        if noise.dim() != 1 or noise.shape[0] != n:
            raise ValueError(f"likelihood is a FixedNoiseGaussianLikelihood with noise of shape {tuple(noise.shape)}; "
                             f"it needs one known noise variance per training point, shape ({n},)")
        noise = noise.to(dtype=torch.float64, device=self.X.device).clone()
        if not bool(torch.isfinite(noise).all()) or bool((noise < 0).any()):
            raise ValueError("likelihood is a FixedNoiseGaussianLikelihood whose noise variances are not all finite "
                             "and >= 0")
        return noise

    def prior_parts(self) -> tuple[list[HyperparameterBlock], list[Any]]:
        """theta's blocks and the priors registered on the kernel, likelihood and mean, at their offsets."""
        registered = []
        for params, offset in self._parts:
            registered += shift_part(params.blocks, params.registered_priors(), offset)[1]
        return list(self._blocks), registered

    def _make_prior(self, prior: Any) -> Any:
        blocks, registered = self.prior_parts()
        if isinstance(prior, str):
            if prior not in ("default", "scaled"):
                raise ValueError(f"prior must be 'default', 'scaled', None (the default), a distribution over theta "
                                 f"or a dict of named priors; got {prior!r}")
        elif prior is not None and not isinstance(prior, dict):
            if registered:
                raise ValueError(f"prior is a {type(prior).__name__} over all of theta, but the model registers "
                                 f"priors ({', '.join(r.name for r in registered)}): give one or the other (named "
                                 f"priors, prior={{name: distribution}}, combine with registered ones)")
            self._prior_setting = "user"
            return check_prior(prior, self.dim, device=self.X.device, start=self.initial_theta(), names=self.names)
        base = "scaled" if prior == "scaled" else "default"
        self._prior_setting = base
        centre = (self.scaled_theta() if base == "scaled" else self.standard_theta()).to(torch.float64)
        scale = self.standard_scale()
        if not isinstance(prior, dict) and not registered and self._plain:
            return torch.distributions.Independent(torch.distributions.Normal(centre, scale.to(centre)), 1)
        mp = ModelPrior(blocks, registered, prior if isinstance(prior, dict) else None, base, dim=self.dim,
                        names=self.names, center=centre, scale=scale)
        mp.check(self.initial_theta())
        return mp

    def standard_theta(self) -> torch.Tensor:
        r"""The origin of the standardised problem: theta where every lengthscale equals its input's standard
        deviation and every variance equals var(y), shape (D,).

        Per component: :math:`\log \operatorname{var}(x_j)` for the lengthscale of input :math:`j` (the log of the
        mean variance of the columns for a shared lengthscale, 0 for a constant column:
        :meth:`~gpvi.models.hyperparameters.KernelParametrisation.log_input_scale`); :math:`\log \operatorname{var}(y)`
        for a ``ScaleKernel``'s outputscale, a ``ConstantKernel``'s constant and the noise variance (for a
        ``GreaterThan`` noise constraint, the excess over its floor); :math:`\bar y` for a ``ConstantMean``'s
        constant; 0 for every other kernel parameter (population variances, ``ddof=0``, as the bundled loaders
        standardise). It is 0 on standardised data, and fitting :math:`(a x + b, c y + d)` shifts it exactly as it
        shifts the theta that fits the same function: the default prior is :math:`\mathcal N(0, 10)` on the
        standardised problem (centred here, :meth:`standard_scale`), and ML-II's box is centred here, so the
        answer in standardised units does not depend on the data's units.
        """
        kp = self.kernel_params
        th = torch.zeros(self.dim, dtype=torch.float64, device=self.X.device)
        th[:kp.dim] = kp.log_input_scale(self._Xc).to(torch.float64)
        log_vy = math.log(float(self.y.var(unbiased=False)))
        for b in kp.blocks:
            if b.log and (b.path.endswith("raw_outputscale") or b.path.endswith("raw_constant")):
                th[b.start:b.stop] = log_vy
        nb = self._noise_block
        if nb is not None and nb.bijection.kind in ("log", "greater"):
            th[nb.start] = log_vy / (nb.bijection.power if nb.bijection.kind == "log" else 1.0)
        if self._mean_block is not None:
            th[self._mean_block.start] = float(self.y.mean())
        return th

    def standard_scale(self) -> torch.Tensor:
        r"""The default prior's standard deviation per component, shape (D,): :math:`\sqrt{10}` on the
        log-hyperparameters (the DSVI paper's :math:`\mathcal N(0, 10)`, section 3.4), :math:`\sqrt{10}\,
        \operatorname{sd}(y)` on a ``ConstantMean``'s constant (the same prior on the standardised problem)."""
        sd = torch.full((self.dim,), math.sqrt(10.0), dtype=torch.float64, device=self.X.device)
        if self._mean_block is not None:
            sd[self._mean_block.start] = math.sqrt(10.0) * float(self.y.std(unbiased=False))
        return sd

    def prior_summary(self) -> dict[str, str]:
        """``{theta name: its prior}`` (registered, named or gpvi's default, with its numbers), frozen parameters as
        ``"fixed at v"``."""
        if isinstance(self.prior, ModelPrior):
            out = self.prior.summary()
        elif getattr(self, "_prior_setting", "user") in ("default", "scaled"):
            loc, sd = self.prior.base_dist.loc.tolist(), self.prior.base_dist.scale.tolist()
            out = {n: base_label(self._prior_setting, c, s) for n, c, s in zip(self.names, loc, sd)}
        else:
            out = {n: f"{type(self.prior).__name__} over theta" for n in self.names}
        out.update({n: f"fixed at {v}" for n, v in self.fixed.items()})
        return out


def finite_rows_only(fn, theta: torch.Tensor) -> torch.Tensor:
    """Evaluate ``fn`` on the finite rows of a batch; non-finite rows get ``-inf`` (a single theta raises)."""
    if theta.dim() == 1:
        raise ValueError(f"theta contains non-finite values: {theta.detach().tolist()}")
    good = torch.isfinite(theta).all(-1)
    out = torch.full(theta.shape[:1], -math.inf, dtype=theta.dtype, device=theta.device)
    if bool(good.any()):
        out = out.index_put((good.nonzero().flatten(),), fn(theta[good]))
    return out
