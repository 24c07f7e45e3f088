"""One unconstrained vector theta for the positive hyperparameters of any GPyTorch kernel.

The DSVI paper (section 3.4) works with log-hyperparameters
``theta = [log l_1^2, ..., log l_d^2, log sigma_f^2, log sigma^2]``. This module derives that vector from a
GPyTorch kernel's own parameters so that any kernel built from GPyTorch parts (RBF, Matern, RQ, periodic,
linear, sums and products, ScaleKernel wrappers) gets one:

* each trainable parameter becomes a block of theta through the bijection of its constraint
  (:mod:`gpvi.models.parameters`): ``log`` of its value for ``Positive()`` (lengthscales: ``log lengthscale^2``, the
  paper's choice), ``log(value - a)`` for ``GreaterThan(a)``, ``logit`` for ``Interval(a, b)``; unconstrained
  parameters enter as they are;
* a frozen parameter (``requires_grad=False``) is held at its value and is not in theta;
* priors registered on the kernel are found and tied to their blocks (:class:`gpvi.models.model_prior.ModelPrior`
  makes them the model's prior).

GPyTorch's hidden softplus transform is removed: the kernel is deep-copied and its constraints replaced by
their bijections, so ``raw_lengthscale = theta / 2`` exactly and no round trip through softplus occurs. Values enter
GPyTorch differentiably through :func:`torch.func.functional_call`, always with
``gpytorch.settings.lazily_evaluate_kernels(False)``: with lazy evaluation on, the kernel matrix would be
evaluated after ``functional_call`` has restored the module's own parameters (silently wrong values).
Batches of theta use a copy of the kernel expanded to batch shape ``(S,)`` (``Kernel.expand_batch``),
so one call returns ``(S, N, M)``.

Ordering is a post-order walk of the module tree (a wrapper's own parameters after its children's), which
for the default ``ScaleKernel(RBFKernel(ard_num_dims=d))`` gives the paper's order: lengthscales, then
signal variance.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import replace

import gpytorch
import torch
from torch.func import functional_call

from .parameters import HyperparameterBlock, ModuleParametrisation, strip_raw
from .scaled_rbf import is_scaled_rbf

__all__ = ["HyperparameterBlock", "KernelParametrisation"]


class KernelParametrisation(ModuleParametrisation):
    """Map theta (log-hyperparameters) to a GPyTorch kernel's matrices, differentiably and batched.

    Parameters
    ----------
    kernel : gpytorch.kernels.Kernel
        The user's kernel. It is deep-copied; the original is never modified.
    dtype, device
        Where the copy lives (float64 by default).

    Attributes
    ----------
    blocks : list of HyperparameterBlock
    names : list of str
        Names of the theta entries, in order.
    dim : int
        Number of kernel hyperparameters (length of the kernel part of theta).
    fixed : dict
        ``{natural name: value}`` of the frozen parameters (``requires_grad=False``), held at their values.
    fast_path : bool
        ``ScaleKernel(RBFKernel)`` with every parameter trainable and ``Positive()``: the models may use
        :mod:`gpvi.models.scaled_rbf` (registered priors do not change the covariance, so they keep it).
    """

    def __init__(self, kernel: gpytorch.kernels.Kernel, *, dtype: torch.dtype = torch.float64,
                 device: torch.device | str | None = None) -> None:
        if not isinstance(kernel, gpytorch.kernels.Kernel):
            raise TypeError(f"kernel must be a gpytorch.kernels.Kernel; got {type(kernel).__name__}")
        if len(kernel.batch_shape) != 0:
            raise ValueError(f"kernel must have an empty batch_shape; got {tuple(kernel.batch_shape)}")
        super().__init__(kernel, dtype=dtype, device=device, what="kernel")
        self.kernel = self.module
        self.fast_path = (is_scaled_rbf(self.kernel) and not self.fixed
                          and all(b.bijection.kind == "log" for b in self.blocks))
        self._batched: dict[int, gpytorch.kernels.Kernel] = {}

    def bind_inputs(self, X: torch.Tensor, feature_names: Sequence[str] | None = None, *, name: str = "X") -> None:
        """Check, at construction, that the kernel accepts ``X``'s columns, and label ARD entries by feature name.

        The kernel (a copy) is evaluated once on a two-row probe whose entries are the column indices
        ``0, ..., d - 1``; each sub-kernel records the columns it receives (after ``active_dims``), so

        * an ``active_dims`` index outside ``[0, d)``, or an ``ard_num_dims`` other than the number of columns a
          sub-kernel receives (e.g. ``RBFKernel(ard_num_dims=5)`` on 2 columns), is a ``ValueError`` naming the
          sub-kernel, instead of a ``RuntimeError`` from inside GPyTorch at the first evaluation;
        * with ``feature_names``, the per-column lengthscale entries are named by the column they act on:
          ``log_lengthscale_sq[nox]`` / ``lengthscale[nox]`` instead of ``[3]`` (positional names stay when no
          names are known, or when a sub-kernel transforms its inputs).

        Parameters
        ----------
        X : torch.Tensor of shape (n, d)
        feature_names : sequence of str, optional
            One name per column of ``X`` (checked by :func:`gpvi.validation.check_feature_names`).
        name : str
            Name of ``X`` in messages.

        Raises
        ------
        ValueError
            The kernel does not fit ``d`` columns.
        """
        d = int(X.shape[1])
        k = copy.deepcopy(self.kernel)
        seen: dict[str, torch.Tensor] = {}
        for path, mod in k.named_modules():
            if not isinstance(mod, gpytorch.kernels.Kernel):
                continue
            label = f"kernel.{path}" if path else "kernel"
            active = getattr(mod, "active_dims", None)
            if active is not None and active.numel() and (int(active.max()) >= d or int(active.min()) < 0):
                raise ValueError(f"{label} ({type(mod).__name__}) has active_dims {active.tolist()} but {name} has "
                                 f"{d} column(s)")
            mod.forward = self._recording(mod.forward, path, seen)
        probe = torch.arange(d, dtype=X.dtype, device=X.device).expand(2, d).clone()
        try:
            with gpytorch.settings.lazily_evaluate_kernels(False):
                full = k(probe, probe)
                full = full.to_dense() if hasattr(full, "to_dense") else full
                diag = k(probe, probe, diag=True)
        except Exception as exc:      # GPyTorch's own shape errors, whatever their type
            self._check_ard(k, seen, d, name)           # the usual cause, named (inputs are recorded before use)
            raise ValueError(f"the kernel {type(self.kernel).__name__} cannot be evaluated on {name} with {d} "
                             f"column(s): {type(exc).__name__}: {exc}") from None
        if tuple(full.shape) != (2, 2) or tuple(diag.shape) != (2,):
            raise ValueError(f"the kernel {type(self.kernel).__name__} gives a matrix of shape {tuple(full.shape)} "
                             f"for 2 rows of {name}; gpvi needs a single-output kernel ((n, n) for n rows)")
        self._check_ard(k, seen, d, name)
        self._columns = {p: [int(c) for c in v.tolist()] for p, v in seen.items()
                         if all(float(c).is_integer() and 0 <= c < d for c in v.tolist())}
        if feature_names is not None:
            self._label_features(list(feature_names), seen, d)

    @staticmethod
    def _check_ard(k: gpytorch.kernels.Kernel, seen: dict[str, torch.Tensor], d: int, name: str) -> None:
        """Raise naming the first sub-kernel whose ``ard_num_dims`` differs from the columns it received."""
        for path, mod in k.named_modules():
            ard = getattr(mod, "ard_num_dims", None) if isinstance(mod, gpytorch.kernels.Kernel) else None
            if ard is not None and path in seen and seen[path].shape[-1] != ard:
                label = f"kernel.{path}" if path else "kernel"
                raise ValueError(f"{label} ({type(mod).__name__}) has ard_num_dims={ard} but receives "
                                 f"{seen[path].shape[-1]} column(s) of {name} ({name} has {d}); build it with "
                                 f"ard_num_dims={seen[path].shape[-1]}")

    @staticmethod
    def _recording(forward, path: str, seen: dict[str, torch.Tensor]):
        def wrapped(x1, x2, *args, **kwargs):
            seen.setdefault(path, x1.detach().reshape(-1, x1.shape[-1])[0].clone())
            return forward(x1, x2, *args, **kwargs)
        return wrapped

    def _label_features(self, feature_names: list[str], seen: dict[str, torch.Tensor], d: int) -> None:
        """Rename per-column lengthscale entries ``...[i]`` to ``...[feature]`` where the columns are known."""
        blocks = []
        for b in self.blocks:
            owner, _, pname = b.path.rpartition(".")
            cols = seen.get(owner)
            size = b.stop - b.start
            if (strip_raw(pname) == "lengthscale" and cols is not None and cols.numel() == size and size == len(b.names)
                    and all(n.endswith(f"[{i}]") for i, n in enumerate(b.names))):
                idx = cols.tolist()
                if all(float(c).is_integer() and 0 <= c < d for c in idx):
                    label = [feature_names[int(c)] for c in idx]
                    b = replace(b, names=tuple(n[: -len(f"[{i}]")] + f"[{label[i]}]" for i, n in enumerate(b.names)),
                                natural_names=tuple(n[: -len(f"[{i}]")] + f"[{label[i]}]"
                                                    for i, n in enumerate(b.natural_names)))
            blocks.append(b)
        self.blocks = blocks
        self.names = [n for b in blocks for n in b.names]
        self.natural_names = [n for b in blocks for n in b.natural_names]

    def theta_from_kernel(self) -> torch.Tensor:
        """theta at the values the user's kernel held when this object was built, shape ``(dim,)``."""
        return self.theta_from_module()

    def _module_for(self, batch: int | None) -> gpytorch.kernels.Kernel:
        if batch is None:
            return self.kernel
        mod = self._batched.get(batch)
        if mod is None:
            mod = copy.deepcopy(self.kernel).expand_batch(torch.Size([batch]))
            for orig, copied in zip(self.kernel.modules(), mod.modules()):
                if getattr(orig, "active_dims", None) is not None:     # expand_batch batches this buffer too,
                    copied.active_dims = orig.active_dims.clone()      # which index_select then refuses
            self._batched[batch] = mod
        return mod

    def matrix(self, theta_k: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor | None = None,
               *, diag: bool = False) -> torch.Tensor:
        """Kernel matrix ``k(x1, x2)`` at theta: ``(N, M)`` for theta ``(dim,)``, ``(S, N, M)`` for ``(S, dim)``.

        With ``diag=True`` returns the diagonal ``(N,)`` / ``(S, N)`` (requires ``x2 is None``).
        """
        batch = theta_k.shape[0] if theta_k.dim() == 2 else None
        module = self._module_for(batch)
        params = self.raw_parameters(theta_k)
        x2_ = x1 if x2 is None else x2
        if batch is not None:
            # batched inputs (views): kernels whose output shape follows the inputs' batch shape (ConstantKernel
            # inside a sum, whose expand_batch leaves the summands' batch_shape empty) then see the batch too
            x1, x2_ = x1.expand(batch, *x1.shape), x2_.expand(batch, *x2_.shape)
        with gpytorch.settings.lazily_evaluate_kernels(False):
            out = functional_call(module, params, (x1, x2_), {"diag": diag}, strict=False)
            if hasattr(out, "to_dense"):
                out = out.to_dense()
        if batch is not None:
            want = (batch, x1.shape[-2]) if diag else (batch, x1.shape[-2], x2_.shape[-2])
            if tuple(out.shape) != want:
                out = out.expand(*want)
        return out

    def log_input_scale(self, X: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        r"""Per theta coordinate, the log of the squared input scale it is measured against: :math:`\log
        \operatorname{var}(x_j)` for the lengthscale of input j (0 for a constant column, which has no scale and
        whose lengthscale the data cannot move), the log of the mean variance of the non-constant columns for a
        lengthscale shared by all columns (a sub-kernel with ``active_dims``: over its own columns), 0 for variances
        and every other parameter. Standardised inputs give 0
        everywhere; scaling input j by s adds :math:`2 \log s` to its coordinate, as it does to the lengthscale^2
        that fits the same function. ``weights`` (one per row, non-negative): weighted variances, as if each row
        were repeated ``weights`` times."""
        out = torch.zeros(self.dim, dtype=X.dtype, device=X.device)
        d = X.shape[1]
        var, shared, const = _column_scales(X, weights)
        log_var = torch.where(const, torch.zeros_like(var), torch.log(var))
        n_scaled = max(int((~const).sum()), 1)
        for b in self.blocks:
            if b.log and b.natural_power == 0.5:
                cols = getattr(self, "_columns", {}).get(b.path.rpartition(".")[0])
                if cols is not None and sorted(cols) != list(range(d)):     # a sub-kernel on some columns
                    idx = torch.tensor(cols, dtype=torch.long, device=X.device)
                    if b.stop - b.start == len(cols):
                        out[b.start:b.stop] = log_var[idx]
                    elif bool((~const[idx]).any()):
                        out[b.start:b.stop] = torch.log(var[idx][~const[idx]].mean())
                elif b.stop - b.start == d:
                    out[b.start:b.stop] = log_var
                elif bool((~const).any()):
                    out[b.start:b.stop] = math.log(shared / n_scaled)
        return out

    def initial_theta(self, X: torch.Tensor, weights: torch.Tensor | None = None, *,
                      keep_user: bool = True) -> torch.Tensor:
        """The start: a parameter the user set on the kernel keeps that value (``keep_user``; see
        :attr:`~gpvi.models.parameters.ModuleParametrisation.user_set`), the others a data-scaled value:
        lengthscale^2 = d * var(x_j), others 1 (``weights``: as in :meth:`log_input_scale`).

        A constant column (variance 0) says nothing about its lengthscale and the data cannot move it, so it starts
        long: 100 times the largest variance of the other columns (1 if all are constant). A short start there would
        make every prediction at another value of that column fall back to the prior. A lengthscale shared by all
        columns (isotropic) starts at the sum of the non-constant columns' variances (``d var`` when none is
        constant: the mean squared distance between two rows is twice that sum); constant columns add nothing to
        distances, so they add nothing to this sum. A lengthscale with a ``GreaterThan`` or ``Interval`` constraint
        starts at that data-scaled value when the constraint allows it; every other constrained parameter left at
        GPyTorch's initial value starts there (GPyTorch keeps it inside the constraint).
        """
        theta = torch.zeros(self.dim, dtype=X.dtype, device=X.device)
        d = X.shape[1]
        var, shared, _ = _column_scales(X, weights)
        module = self.theta_from_module().to(theta)
        for b in self.blocks:
            sl = slice(b.start, b.stop)
            is_lengthscale = strip_raw(b.path.rsplit(".", 1)[-1]) == "lengthscale"
            if keep_user and b.path in self.user_set:
                theta[sl] = module[sl]
            elif is_lengthscale and b.bijection.kind == "log":          # theta = log lengthscale^2
                theta[sl] = torch.log(d * var) if b.stop - b.start == d else math.log(shared)
            elif is_lengthscale and b.bijection.kind in ("greater", "interval"):
                sq = d * var if b.stop - b.start == d else torch.full((b.stop - b.start,), shared).to(theta)
                scaled = b.bijection.inverse(torch.sqrt(sq))
                theta[sl] = torch.where(torch.isfinite(scaled), scaled, module[sl])
            elif b.bijection.kind in ("greater", "interval"):
                theta[sl] = module[sl]
        return theta


def _column_scales(X: torch.Tensor, weights: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, float, torch.Tensor]:
    """The columns' variances (a constant column, whose variance says nothing about its lengthscale: 100 times the
    largest variance of the others, 1 if all are constant), their sum over the non-constant columns (``d * 100 *
    that`` when all are constant) and the mask of constant columns; ones, ``d`` and no constant column for a single
    row. With ``weights``, the weighted variances over the rows of positive weight (a row repeated k times and a
    row of weight k give the same numbers)."""
    d = X.shape[1]
    if weights is not None:
        keep = weights > 0
        X, weights = X[keep], weights[keep]
    if X.shape[0] <= 1:
        return (torch.ones(d, dtype=X.dtype, device=X.device), float(d),
                torch.zeros(d, dtype=torch.bool, device=X.device))
    if weights is None:
        var = X.var(dim=0, unbiased=False)
    else:
        w = (weights / weights.sum()).to(X.dtype).unsqueeze(-1)
        var = (w * (X - (w * X).sum(0)) ** 2).sum(0)
    const = var <= 1e-12 * X.abs().amax(dim=0) ** 2          # relative: a column in any units
    big = float(var[~const].max()) if bool((~const).any()) else 0.01
    shared = float(var[~const].sum()) if bool((~const).any()) else d * 100.0 * big
    var = torch.where(const, torch.full_like(var, 100.0 * big), var)
    return var, shared, const
