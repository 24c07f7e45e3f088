"""Wall time of a default ``gpvi.GPClassifier`` fit on binary sets, separable ones included (issue 19, item 7).

Target: any binary fit with N <= 200 and default settings in <= 2 s on the 2-core benchmark machine; 3-class iris
through ``OneVsRestClassifier(GPClassifier())`` in <= 10 s.

Protocol. Every fit is ``GPClassifier()`` with everything else at its default (logit link,
full-batch CVI, type-II learning of the ARD kernel's log-hyperparameters with the :class:`gpvi.inference.cvi.TypeII`
defaults). Wall time is the median of ``--repeats`` fits (default 3) on the training rows. Test log loss (mean
negative log predictive probability, nats) and accuracy come from the first of those fits. Sets:

* iris setosa vs versicolor (linearly separable) and versicolor vs virginica (overlapping), from
  ``sklearn.datasets.load_iris``; inputs standardised; the fit is timed on all 100 rows (the case the issue
  timed) and the test metrics come from a separate fit on a stratified 70/30 split (seed 0);
* ``separable40``: 40 rows, 2 inputs, ``x0`` shifted by +-1 from the class boundary (classes separated by a
  margin of 2), ``x1`` irrelevant noise; test set of 400 rows from the same generator (seed 0 / 1);
* pima, ionosphere, sonar, ripley from :mod:`gpvi.datasets` (their own train/test splits; ionosphere has 246 and
  ripley 250 training rows, above the target's N <= 200, and are reported for completeness);
* ``iris3_ovr``: ``OneVsRestClassifier(GPClassifier())`` on 3-class iris (timed on all 150 rows;
  metrics on a stratified 70/30 split).

Variants (``--variants``):

* ``default`` -- the code as it is (type-II with the default N(0, 10 I) prior on theta, ELBO-monotone inner runs);
* ``noprior`` -- ``GPClassifier(prior=None)`` (``TypeII(prior=None)``): plain type-II maximisation of the ELBO,
  same inner runs; shows where the lengthscales of irrelevant inputs go without the prior;
* ``scaled`` -- ``GPClassifier(prior="scaled")``: the prior N(theta_0, 10 I) centred at the data-scaled start
  (lengthscale^2 = d var(x_j), signal variance 1), since 2026-11-25;
* ``baseline`` -- the ``TypeII`` of the file given by ``--baseline`` (e.g. the committed version before this change,
  ``git show <rev>:gpvi/inference/cvi/typeii.py > /tmp/typeii_before.py``), loaded as a sibling module of
  :mod:`gpvi.inference.cvi.typeii` and patched into :mod:`gpvi.sklearn` for the run.

Columns: wall time (median, s), test log loss, accuracy, the learned signal variance and largest lengthscale, how
many log-hyperparameters ended within 0.1 of the box ``theta_bounds`` (``model.theta_box``: it moves with var(x_j)),
and the type-II counters (phases, theta evaluations, inner CVI steps). For the one-vs-rest rows the hyperparameter
columns are those of the first binary problem.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.classifier_speed [--repeats 3] [--variants default noprior]
[--baseline /tmp/typeii_before.py]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import time
import warnings
from typing import Any

import numpy as np

from benchmarks._common import header, write
import gpvi
import gpvi.sklearn as gsk

BOUND = 11.5


def iris_binary(which: str) -> dict[str, Any]:
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    X, y = load_iris(return_X_y=True)
    keep = y < 2 if which == "setosa_versicolor" else y > 0
    X, y = X[keep], (y[keep] == (1 if which == "setosa_versicolor" else 2)).astype(int)
    X = (X - X.mean(0)) / X.std(0)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    return {"X_time": X, "y_time": y, "X_train": Xtr, "y_train": ytr, "X_test": Xte, "y_test": yte}


def separable(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two inputs; classes by the sign of x0, pushed 1 away from 0 (margin 2); x1 irrelevant."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    y = (X[:, 0] > 0).astype(int)
    X[:, 0] += np.where(y == 1, 1.0, -1.0)
    return X, y


def problems() -> dict[str, dict[str, Any]]:
    from sklearn.datasets import load_iris
    from sklearn.model_selection import train_test_split

    out = {"iris_setosa_versicolor": iris_binary("setosa_versicolor"),
           "iris_versicolor_virginica": iris_binary("versicolor_virginica")}
    Xtr, ytr = separable(40, 0)
    Xte, yte = separable(400, 1)
    out["separable40"] = {"X_train": Xtr, "y_train": ytr, "X_test": Xte, "y_test": yte}
    for name in ("pima", "ionosphere", "sonar", "ripley"):
        ds = getattr(gpvi.datasets, f"load_{name}")()
        out[name] = {"X_train": ds.X_train.numpy(), "y_train": ds.y_train.numpy(),
                     "X_test": ds.X_test.numpy(), "y_test": ds.y_test.numpy()}
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=0)
    out["iris3_ovr"] = {"X_time": X, "y_time": y, "X_train": Xtr, "y_train": ytr, "X_test": Xte, "y_test": yte,
                        "ovr": True}
    return out


def make(ovr: bool, prior: Any = "default"):
    from sklearn.multiclass import OneVsRestClassifier

    clf = gsk.GPClassifier(prior=prior)
    return OneVsRestClassifier(clf) if ovr else clf


def describe(est: Any) -> dict[str, Any]:
    clf = est.estimators_[0] if hasattr(est, "estimators_") else est
    post = clf.posterior_
    hyp = clf.hyperparameters_
    ls = [v for k, v in hyp.items() if k.startswith("lengthscale")]
    th = np.asarray(post.theta)
    lo, hi = (b.numpy() for b in clf.model_.theta_box((-BOUND, BOUND)))      # the box moves with var(x_j)
    return {"signal_var": float(hyp.get("signal_var", math.nan)), "max_lengthscale": float(max(ls)),
            "at_bound": int(((th < lo + 0.1) | (th > hi - 0.1)).sum()), "dim": int(th.shape[0]),
            "phases": int(post.info.get("theta_phases", 0)), "evals": int(post.info.get("theta_evaluations", 0)),
            "inner_steps": int(post.info.get("inner_steps", 0))}


def log_loss_acc(est: Any, X: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    p = np.asarray(est.predict_proba(X))
    classes = list(est.classes_)
    idx = np.array([classes.index(v) for v in y])
    py = np.clip(p[np.arange(len(y)), idx], 1e-300, 1.0)
    return float(-np.log(py).mean()), float((np.asarray(est.predict(X)) == y).mean())


def bench(prob: dict[str, Any], repeats: int, prior: Any = "default") -> dict[str, Any]:
    ovr = prob.get("ovr", False)
    Xt, yt = prob.get("X_time", prob["X_train"]), prob.get("y_time", prob["y_train"])
    times, first = [], None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):
            t0 = time.perf_counter()
            est = make(ovr, prior).fit(Xt, yt)
            times.append(time.perf_counter() - t0)
            first = first or est
        fitted = first if "X_time" not in prob else make(ovr, prior).fit(prob["X_train"], prob["y_train"])
    ll, acc = log_loss_acc(fitted, prob["X_test"], prob["y_test"])
    return {"time_s": statistics.median(times), "times_s": times, "n_time": int(len(yt)), "log_loss": ll,
            "accuracy": acc, **describe(first)}


def load_baseline(path: str) -> type:
    spec = importlib.util.spec_from_file_location("gpvi.inference.cvi._typeii_baseline", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.TypeII


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", nargs="+", default=["default", "noprior", "scaled"],
                    choices=["default", "noprior", "scaled", "baseline"])
    ap.add_argument("--baseline", default=None, help="a typeii.py to measure as the 'baseline' variant")
    ap.add_argument("--baseline-repeats", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="problem names to run (default all)")
    args = ap.parse_args()
    if "baseline" in args.variants and not args.baseline:
        ap.error("--variants baseline needs --baseline FILE")
    probs = problems()
    if args.only:
        probs = {k: v for k, v in probs.items() if k in args.only}
    original = gsk.TypeII
    results: dict[str, dict[str, Any]] = {}
    for variant in args.variants:
        prior = {"noprior": None, "scaled": "scaled"}.get(variant, "default")
        if variant in ("default", "noprior", "scaled"):
            gsk.TypeII, reps = original, args.repeats
        else:
            gsk.TypeII, reps = load_baseline(args.baseline), args.baseline_repeats
        results[variant] = {}
        try:
            for name, prob in probs.items():
                r = bench(prob, reps, prior)
                results[variant][name] = r
                print(f"{variant:9s} {name:26s} {r['time_s']:8.2f}s  logloss {r['log_loss']:.4f}  acc "
                      f"{r['accuracy']:.3f}  sf2 {r['signal_var']:.3g}  max ls {r['max_lengthscale']:.3g}  "
                      f"at bound {r['at_bound']}/{r['dim']}", flush=True)
        finally:
            gsk.TypeII = original

    md = header("Default GPClassifier fit: wall time on binary sets, separable ones included")
    md += "\n" + __doc__.split("\n\n", 1)[1].split("Run:")[0] + "\n"
    for variant, rows in results.items():
        reps = args.baseline_repeats if variant == "baseline" else args.repeats
        md += f"\n## {variant} (median of {reps})\n\n"
        md += ("| problem | N timed | wall s | test log loss | accuracy | signal var | max lengthscale | at bound | "
               "phases | theta evals | inner steps |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for name, r in rows.items():
            md += (f"| {name} | {r['n_time']} | {r['time_s']:.2f} | {r['log_loss']:.4f} | {r['accuracy']:.3f} | "
                   f"{r['signal_var']:.3g} | {r['max_lengthscale']:.3g} | {r['at_bound']}/{r['dim']} | "
                   f"{r['phases']} | {r['evals']} | {r['inner_steps']} |\n")
    write("classifier_speed", md, {"repeats": args.repeats, "baseline": args.baseline, "results": results})


if __name__ == "__main__":
    main()
