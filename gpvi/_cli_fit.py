"""The fit verbs of the ``gpvi`` command (:mod:`gpvi.cli`): ``fit-regression`` (GP regression by ML-II, DSVI or NUTS)
and ``fit-classifier`` (CVI), each reading a CSV (:mod:`gpvi._cli_csv`), printing a summary and saving the fit
(``--save``, :mod:`gpvi.io`); and the advice their warnings give (:func:`gpvi.exceptions.advising`).
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

import numpy as np

import gpvi

from ._cli_csv import CLIError, check_output, read_csv, standardise
from .io import SavedFit, save_fit

__all__ = ["REGRESSION_ADVICE", "GENERALISED_ADVICE", "advice", "classifier_progress", "fit_regression",
           "fit_classifier", "save_to", "print_hyperparameters"]


# --------------------------------------------------------------------------- output
def save_to(fit: SavedFit, path: str, args: argparse.Namespace) -> None:
    """Save ``fit`` to ``path`` (``--save``), unless a Ctrl-C was swallowed on the way; one line says where."""
    if getattr(args, "interrupted", None):          # a Ctrl-C some library swallowed: save nothing
        raise KeyboardInterrupt
    try:
        save_fit(path, fit)
    except OSError as exc:
        raise CLIError(f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"saved to {path} (read it back with gpvi.io.load_fit, or: gpvi predict {path} NEW.csv)")


# --------------------------------------------------------------------------- commands
_NUTS_ONLY = ("num_draws", "chains", "warmup")

REGRESSION_ADVICE = {"bound": "the CLI's search box is fixed: --exclude leaves out an input the fit does not use; "
                              "--method dsvi or nuts puts a prior on every hyperparameter",
                     "ml2_convergence": "raise --restarts"}
"""What ``fit-regression``'s warnings advise (:func:`gpvi.exceptions.advising`): its options, not ``ML2``'s."""


GENERALISED_ADVICE = {"bound": "the CLI's search box is fixed: --exclude leaves out an input the fit does not use"}
"""What ``fit-regression --likelihood`` (not gaussian) warnings advise: type-II has no ``--method`` or ``--restarts``."""


def advice(args: argparse.Namespace) -> dict[str, str]:
    """The advice of a command's warnings: options of that command (``fit-classifier``: by ``--prior``)."""
    if args.command == "fit-regression":
        return REGRESSION_ADVICE if args.likelihood == "gaussian" else GENERALISED_ADVICE
    if args.command == "fit-classifier":
        return {"bound": "marked in the list below; the CLI's search box is fixed: " + (
            "--prior default or scaled keeps theta inside it" if args.prior == "none" else
            "--exclude leaves out an input the fit does not use")}
    return {}


def _check_method_flags(args: argparse.Namespace) -> None:
    if args.num_steps is not None and args.method != "dsvi":
        raise CLIError(f"--num-steps sets the DSVI steps and applies to --method dsvi only; got --method "
                       f"{args.method}" + (" (NUTS draws per chain: --num-draws)" if args.method == "nuts" else ""))
    for name in _NUTS_ONLY:
        if getattr(args, name) is not None and args.method != "nuts":
            raise CLIError(f"--{name.replace('_', '-')} applies to --method nuts only; got --method {args.method}"
                           + (" (DSVI steps: --num-steps)" if args.method == "dsvi" and name == "num_draws" else ""))


def fit_regression(args: argparse.Namespace) -> int:
    """``fit-regression`` with the Gaussian likelihood: ML-II, then DSVI or NUTS (``--method``, default dsvi)."""
    args.method = "dsvi" if args.method is None else args.method
    args.restarts = 3 if args.restarts is None else args.restarts
    _check_method_flags(args)
    if args.save:
        check_output(args.save, "--save")
    data = read_csv(args.csv, args.target, features=args.features, exclude=args.exclude)   # fails before fitting
    X, y, names = data.X, data.y, data.names
    Xs, ys, (mu, sd, ym, ysd) = standardise(X, y, names, args.target, args.csv)
    data.warn()

    model = gpvi.GPRegression(Xs, ys, feature_names=names)       # theta names carry the CSV header
    progress = not args.no_progress
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=args.restarts, seed=args.seed, progress_bar=progress).run(model)
    if args.method == "ml2":
        post = fit
    elif args.method == "dsvi":
        kw = {} if args.num_steps is None else {"num_steps": args.num_steps}
        post = gpvi.DSVI(scale="full", seed=args.seed, progress_bar=progress, **kw).run(model, init=fit)
    else:
        sizes = (4 if args.chains is None else args.chains, 500 if args.warmup is None else args.warmup)
        sizes += () if args.num_draws is None else (args.num_draws,)       # chains, warm-up, draws per chain
        post = gpvi.NUTS(*sizes, seed=args.seed, progress_bar=progress).run(model, init=fit)
    elapsed = time.perf_counter() - t0
    print(f"GP regression on {args.csv}: N = {len(y)}, d = {X.shape[1]}, method {args.method}, {elapsed:.1f} s. "
          f"Inputs and target standardised (target mean {ym:.4g}, sd {ysd:.4g}); lengthscales are in units of each "
          "input's training sd.")
    print("inputs: " + ", ".join(f"[{j}] {n}" for j, n in enumerate(names)))
    if args.method == "dsvi":
        print(f"ELBO {post.elbo:.4f} +- {post.elbo_se:.4f}, {post.info['steps']} steps, "
              f"converged: {post.info['converged']}")
    elif args.method == "ml2":
        print(f"log marginal likelihood {post.value:.4f}")
    print(post.summary())
    if args.save:
        save_to(SavedFit(kind="regression", method=args.method, features=names, target=args.target, x_mean=mu,
                       x_std=sd, y_mean=ym, y_std=ysd, posterior=post), args.save, args)
    return 0


def classifier_progress(args: argparse.Namespace) -> dict[str, Any]:
    """How :class:`gpvi.GPClassifier` is told to show progress (its one progress argument)."""
    return {"verbose": 0 if args.no_progress else 1}


def _check_classifier_flags(args: argparse.Namespace) -> None:
    """The flags that do not apply to ``--hyperparameters bayes`` (before any fitting)."""
    if args.hyperparameters != "bayes":
        return
    if args.save:
        raise CLIError("--save does not apply to --hyperparameters bayes: the fully Bayesian predictive holds a CVI "
                       "posterior per draw of q(theta) and is not saved; use --hyperparameters type2 to save a fit")
    if args.prior == "none":
        raise CLIError("--prior none (ML-II) applies to --hyperparameters type2: a flat prior is improper for the "
                       "fully Bayesian fit; use --prior default or scaled")
    if args.mode != "full":
        raise CLIError("--mode applies to --hyperparameters type2 and fixed: the fully Bayesian fit runs its own "
                       "full-batch CVI")
    if args.weight is not None:
        raise CLIError("--weight applies to --hyperparameters type2 and fixed: the fully Bayesian fit's evidence (EP) "
                       "has no weighted sites")
    if args.latent:
        raise CLIError("--latent applies to --hyperparameters type2 and fixed: the fully Bayesian fit holds a CVI "
                       "posterior per draw of q(theta)")


def fit_classifier(args: argparse.Namespace) -> int:
    _check_classifier_flags(args)
    if args.save:
        check_output(args.save, "--save")
    data = read_csv(args.csv, args.target, features=args.features, exclude=args.exclude, weight=args.weight,
                    labels=True)
    X, labels, names, weights = data.X, data.y, data.names, data.weights
    Xs, _, (mu, sd, _, _) = standardise(X, None, names, path=args.csv, weights=weights)
    data.warn()

    clf = gpvi.GPClassifier(likelihood=args.likelihood, mode=args.mode, random_state=args.seed,
                            hyperparameters=args.hyperparameters, prior=None if args.prior == "none" else args.prior,
                            **classifier_progress(args))
    t0 = time.perf_counter()
    clf.fit(Xs, labels, sample_weight=weights)
    elapsed = time.perf_counter() - t0
    proba = clf.predict_proba(Xs)
    idx = np.searchsorted(clf.classes_, labels)
    err = float(np.mean(proba.argmax(1) != idx))
    bits = float(-np.mean(np.log2(np.clip(proba[np.arange(len(idx)), idx], 1e-15, 1.0))))
    pos = f" (positive: {clf.classes_[1]})" if len(clf.classes_) == 2 else ""
    how = {"type2": f"type-II hyperparameters, CVI mode {args.mode}", "fixed": f"fixed hyperparameters, CVI mode "
           f"{args.mode}", "bayes": "hyperparameters integrated out (q(theta) on EP's evidence)"}[args.hyperparameters]
    weighted = f", weights from column {args.weight!r}" if args.weight is not None else ""
    print(f"GP classification on {args.csv}: N = {len(labels)}, d = {X.shape[1]} ({', '.join(names)}), classes "
          f"{clf.classes_.tolist()}{pos}, likelihood {getattr(clf, 'link_', args.likelihood)}, {how}{weighted}, "
          f"{elapsed:.1f} s. Inputs standardised.")
    bound = "q(theta)'s ELBO" if args.hyperparameters == "bayes" else "ELBO"
    print(f"{bound} {clf.elbo_:.4f}   training error {err:.4f}   training log-loss {bits:.4f} bits")
    if args.hyperparameters == "bayes":
        print(clf.posterior_.summary())                 # q(theta): one row per hyperparameter
    else:
        print_hyperparameters(clf.posterior_, clf.hyperparameters_, names, args.hyperparameters)
        _print_fit_facts(clf.posterior_, len(labels), args.latent)
    if args.save:
        save_to(SavedFit(kind="classification", method=f"cvi-{args.mode}", features=names, target=args.target,
                       x_mean=mu, x_std=sd, classifier=clf), args.save, args)
    return 0


def _print_fit_facts(post: Any, n: int, latent: bool) -> None:
    """CVI's convergence in one line; the latent table (one row per training point and class) only with --latent."""
    info = post.info
    sweeps, evals = info.get("sweeps"), info.get("theta_evaluations")
    print(f"CVI {'converged' if info.get('converged') else 'did not converge'}"
          + (f": {sweeps:g} sweeps" if isinstance(sweeps, (int, float)) else "")
          + (f", {evals} hyperparameter evaluations" if isinstance(evals, int) else "") + ".")
    print(f"Latent marginals and sites at the {n} training points" + (":" if latent else ": --latent prints them, "
          "a --save file keeps them."))
    if latent:
        print(post.summary())


def print_hyperparameters(post: Any, values: dict[str, float], names: list[str], how: str) -> None:
    """The kernel hyperparameters ``values`` (``{natural name: value}``) of a type-II or fixed CVI fit ``post``, per
    input named by its CSV column (``names``), in the standardised inputs' units; those that ended on the type-II
    box marked."""
    at_bound = post.info.get("at_bound") or {}
    print("Kernel hyperparameters (" + ("type-II" if how == "type2" else "fixed") + "; lengthscales in units of each "
          "input's standard deviation):")
    for name, natural in zip(post.model.names, post.model.natural_names):
        shown = re.sub(r"\[(\d+)\]", lambda m: f"[{names[int(m.group(1))]}]", natural)
        mark = f"   (at the {at_bound[name]} bound)" if name in at_bound else ""
        print(f"  {shown:<32} {values[natural]:.4g}{mark}")
