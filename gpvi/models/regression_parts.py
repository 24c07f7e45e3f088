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

from .model_prior import ModelPrior, shift_part
from .parameters import Bijection, HyperparameterBlock, ModuleParametrisation
from .priors import check_prior, default_prior

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
        parts = [(self.kernel_params, 0)]
        if likelihood is None:
            self._noise_block: HyperparameterBlock | None = HyperparameterBlock(
                "noise", torch.Size([1]), kd, kd + 1, 1.0, True, ("log_noise_var",), ("noise_var",), 1.0,
                Bijection("log", 1.0))
        else:
            if type(likelihood) is not gpytorch.likelihoods.GaussianLikelihood or \
                    likelihood.noise_covar.raw_noise.numel() != 1:
                raise TypeError(f"likelihood must be a gpytorch.likelihoods.GaussianLikelihood (homoskedastic, no "
                                f"batch shape); got {type(likelihood).__name__}")
            lp = self._lik_params = ModuleParametrisation(likelihood, device=self.X.device, what="likelihood")
            self._lik_fixed = lp.fixed
            parts.append((lp, kd))
            self._noise_block = shift_part(lp.blocks, [], kd)[0][0] if lp.dim else None
            if lp.dim == 0:
                self._fixed_noise = float(likelihood.noise.detach().reshape(-1)[0])
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

    def prior_parts(self) -> tuple[list[HyperparameterBlock], list[Any]]:
        """theta's blocks and the priors registered on the kernel, likelihood and mean, at their offsets."""
        registered = []
        for params, offset in self._parts:
            registered += shift_part(params.blocks, params.registered_priors(), offset)[1]
        return list(self._blocks), registered

    def _make_prior(self, prior: Any) -> Any:
        blocks, registered = self.prior_parts()
        if prior is not None and not isinstance(prior, dict):
            if registered:
                raise ValueError(f"prior is a {type(prior).__name__} over all of theta, but the model registers "
                                 f"priors ({', '.join(r.name for r in registered)}): give one or the other (named "
                                 f"priors, prior={{name: distribution}}, combine with registered ones)")
            return check_prior(prior, self.dim, device=self.X.device, start=self.initial_theta(), names=self.names)
        if prior is None and not registered and self._plain:
            return default_prior(self.dim, device=self.X.device)
        mp = ModelPrior(blocks, registered, prior, "default", dim=self.dim, names=self.names)
        mp.check(self.initial_theta())
        return mp

    def prior_summary(self) -> dict[str, str]:
        """``{theta name: its prior}`` (registered, named or gpvi's default), frozen parameters as ``"fixed at v"``."""
        if isinstance(self.prior, ModelPrior):
            out = self.prior.summary()
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
