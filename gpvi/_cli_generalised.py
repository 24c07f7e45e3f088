r"""``gpvi fit-regression --likelihood {poisson,negative-binomial,student-t,laplace,beta}`` (:mod:`gpvi.cli`): a
:class:`gpvi.GPGeneralisedRegression` fitted to a CSV file by CVI, with type-II hyperparameters.

The model is :math:`y_n \sim p(y \mid f_n, \phi)`, :math:`f \sim \mathcal{GP}(0, k_\theta)` with the default kernel
``ScaleKernel(RBFKernel(ard_num_dims=d))`` on the standardised inputs. Counts (Poisson, negative binomial, log link)
and proportions (Beta, in (0, 1)) are modelled as they are; Student-t and Laplace targets are standardised, as the
Gaussian regression's are (the likelihood's scale is then in units of the target's sd, and the zero-mean GP is centred
at the target's mean). The kernel's log-hyperparameters :math:`\theta` and the likelihood's parameters :math:`\phi`
(negative-binomial dispersion, Student-t ``df`` and ``scale``, Laplace and Beta ``scale``) maximise the CVI bound

.. math::

    \mathcal L(\theta, \phi, q) = \sum_n \mathbb E_{q(f_n)}[\log p(y_n \mid f_n, \phi)]
    - \mathrm{KL}(q(\mathbf f)\,\|\,\mathcal N(0, K_\theta))

with no prior (:class:`gpvi.inference.cvi.TypeII` with ``prior=None`` for :math:`\theta` and :math:`q`, alternated
with an M-step in :math:`\phi` by :class:`gpvi.inference.cvi.LikelihoodTypeII`). Count fits start CVI where the
engine starts every count model: from the sites of the log counts (:meth:`gpvi.CVI.default_init`,
:func:`gpvi.models.latent_likelihoods.log_count_sites`), which counts in the hundreds need.

Bad targets end with one line and exit status 2 before any fitting: counts that are negative or not integers, Beta
targets outside (0, 1) (the likelihood's own check, :mod:`gpvi.models.latent_likelihoods`, naming the column, the
file and the first rows, counted from 0 among the data rows), and the options of the Gaussian fit (``--method``,
``--restarts``, ``--num-steps``, ``--num-draws``, ``--chains``, ``--warmup``), which do not apply.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import numpy as np
import torch

import gpvi

from ._cli_csv import CLIError, check_output, read_csv, standardise
from ._cli_fit import print_hyperparameters, save_to
from ._saved_fit import SavedFit
from .inference.cvi import LikelihoodTypeII, TypeII
from .models.latent_likelihoods import Beta, Laplace, NegativeBinomial, Poisson, StudentT
from .models.likelihood_priors import LIKELIHOOD_PARAMS

__all__ = ["LIKELIHOODS", "fit_generalised"]

LIKELIHOODS: dict[str, Any] = {"poisson": Poisson, "negative-binomial": lambda: NegativeBinomial(1.0),
                               "student-t": lambda: StudentT(4.0, 0.5), "laplace": lambda: Laplace(0.5),
                               "beta": lambda: Beta(1.0)}
"""``--likelihood`` choice (besides ``gaussian``) -> the likelihood the fit starts from (its parameters are learned)."""

_STANDARDISED = ("student-t", "laplace")
_GAUSSIAN_ONLY = ("method", "restarts", "num_steps", "num_draws", "chains", "warmup")


def _check_flags(args: argparse.Namespace) -> None:
    for name in _GAUSSIAN_ONLY:
        if getattr(args, name) is not None:
            raise CLIError(f"--{name.replace('_', '-')} applies to --likelihood gaussian only; --likelihood "
                           f"{args.likelihood} is fitted by CVI with type-II hyperparameters")


def _check_targets(lik: Any, y: np.ndarray, args: argparse.Namespace) -> None:
    try:
        lik.check_targets(torch.as_tensor(y, dtype=torch.float64), f"column {args.target!r}")
    except ValueError as exc:
        raise CLIError(f"{args.csv}: {exc} (--likelihood {args.likelihood}; rows counted from 0 among the data "
                       "rows)") from None


def fit_generalised(args: argparse.Namespace) -> int:
    """``fit-regression --likelihood L`` for L other than ``gaussian`` (module docstring); returns the exit status."""
    _check_flags(args)
    if args.save:
        check_output(args.save, "--save")
    data = read_csv(args.csv, args.target, features=args.features, exclude=args.exclude)   # fails before fitting
    X, y, names = data.X, data.y, data.names
    lik = LIKELIHOODS[args.likelihood]()
    _check_targets(lik, y, args)
    standardised = args.likelihood in _STANDARDISED
    Xs, ys, (mu, sd, ym, ysd) = standardise(X, y if standardised else None, names, args.target, args.csv)
    ys = ys if standardised else y
    data.warn()

    model = gpvi.GPGeneralisedRegression(Xs, ys, likelihood=lik, feature_names=names)
    typeii = TypeII(gpvi.CVI(progress_bar=not args.no_progress), prior=None)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:     # the filters stay: an interrupted run still stops
        if lik.name in LIKELIHOOD_PARAMS:
            post = LikelihoodTypeII(typeii).run(model)
        else:
            post = typeii.run(model)
    elapsed = time.perf_counter() - t0
    seen: set[tuple[type, str]] = set()
    for w in caught:                                      # each round of LikelihoodTypeII repeats TypeII's warnings
        key = (w.category, str(w.message))
        if key not in seen:
            seen.add(key)
            warnings.warn(key[1], key[0], stacklevel=2)
    _summary(args, post, X, names, (ym, ysd) if standardised else None, elapsed)
    if args.save:
        save_to(SavedFit(kind="generalised_regression", method="cvi-type2", features=names, target=args.target,
                         x_mean=mu, x_std=sd, y_mean=ym if standardised else 0.0, y_std=ysd if standardised else 1.0,
                         posterior=post, extra={"likelihood": args.likelihood}), args.save, args)
    return 0


def _summary(args: argparse.Namespace, post: Any, X: np.ndarray, names: list[str], scale: Any,
             elapsed: float) -> None:
    lik = post.model.likelihood
    target = (f"target standardised (mean {scale[0]:.4g}, sd {scale[1]:.4g}; the likelihood's scale is in its sd "
              "units)" if scale is not None else "target as it is")
    print(f"GP regression with a {args.likelihood} likelihood on {args.csv}: N = {X.shape[0]}, d = {X.shape[1]}, CVI "
          f"with type-II hyperparameters (no prior), {elapsed:.1f} s. Inputs standardised, {target}; lengthscales "
          "are in units of each input's training sd.")
    print("inputs: " + ", ".join(f"[{j}] {n}" for j, n in enumerate(names)))
    learned = post.info.get("likelihood_params")
    if learned:
        rounds = post.info.get("likelihood_rounds")
        done = "converged" if post.info.get("likelihood_converged") else "did not converge"
        print(f"likelihood {lik!r}: {', '.join(learned)} learned ({rounds} rounds, {done})")
    else:
        print(f"likelihood {lik!r} (no parameters)")
    info = post.info
    sweeps = info.get("sweeps")
    print(f"ELBO {post.elbo:.4f}; CVI {'converged' if info.get('converged') else 'did not converge'}"
          + (f": {sweeps:g} sweeps" if isinstance(sweeps, (int, float)) else "") + ".")
    print_hyperparameters(post, post.hyperparameters(), names, "type2")
