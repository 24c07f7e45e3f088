r"""``gpvi demo``: the README's main job, on bundled data.

1. **Bodyfat** (StatLib, the DSVI paper's Table 5 task: 14 inputs including ``Density``; 227 training / 25 test
   rows, seeded split): ML-II (type-II maximum likelihood, :class:`gpvi.ML2`) and DSVI (a full-covariance
   Gaussian posterior over the 16 log-hyperparameters, :class:`gpvi.DSVI`, started at the ML-II estimate), with
   test SMSE and NLPD (standardised targets) and the most relevant hyperparameter marginals.
2. **Pima** (Ripley's split, 200 / 332 rows): a :class:`gpvi.GPClassifier` (logit link, full-batch CVI with
   type-II hyperparameters), with test error and mean log-loss in bits.

A compact summary table closes the run. ``quick=True`` is a smoke run (few restarts and steps, a few seconds;
its numbers are not converged).
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

import gpvi

from .exceptions import advising
from .inference.progress import interrupt_propagates
from .table import Table

__all__ = ["run_demo", "demo", "DEMO_DSVI_STEPS"]

DEMO_DSVI_STEPS = 6000
"""Cap on the DSVI steps of the full demo, which bounds its run time (DSVI may stop earlier by its convergence
rule)."""

_ADVICE = {"ml2": {"bound": "the demo's settings are fixed; in a script, gpvi.ML2(bounds=...) widens the box",
                   "ml2_convergence": "the demo's settings are fixed; in a script, raise gpvi.ML2(num_restarts=...)"},
           "cvi": {"bound": "the demo's settings are fixed; in a script, gpvi.GPClassifier(prior=...) sets the prior "
                            "that keeps theta inside the box"}}
"""What the demo's notes advise (:func:`gpvi.exceptions.advising`): its own settings are not the user's to change."""
_QUICK = {"restarts": 1, "dsvi_steps": 150, "elbo_draws": 100, "pred_draws": 20, "max_sweeps": 20}
_FULL = {"restarts": 5, "dsvi_steps": DEMO_DSVI_STEPS, "elbo_draws": 1000, "pred_draws": 200, "max_sweeps": 500}


def _fmt(v: float, spec: str = ".4f") -> str:
    return format(v, spec)


def _top_marginals(fit: Any, q: Any, feature_names: tuple[str, ...], k: int = 4):
    """Table of the k most relevant lengthscales (smallest DSVI mean) plus signal and noise variance."""
    sq, sf = q.summary(), fit.summary()
    names = list(q.names)
    ls = [i for i, n in enumerate(names) if n.startswith("log_lengthscale")]
    mean = sq.column("mean")
    top = sorted(ls, key=lambda i: mean[i])[:k]
    rows = top + [i for i, n in enumerate(names) if not n.startswith("log_lengthscale")]
    index, cols = [], {"ML-II": [], "DSVI median": [], "DSVI 90% interval": [], "log-scale mean +- sd": []}
    for i in rows:
        n = names[i]
        r, rf = sq[n], sf[n]
        label = r["natural"]
        if n.startswith("log_lengthscale") and i < len(feature_names):
            label = f"lengthscale ({feature_names[i]})"
        index.append(label)
        cols["ML-II"].append(f"{rf['nat_q50']:.4g}")
        cols["DSVI median"].append(f"{r['nat_q50']:.4g}")
        cols["DSVI 90% interval"].append(f"[{r['nat_q5']:.4g}, {r['nat_q95']:.4g}]")
        cols["log-scale mean +- sd"].append(f"{r['mean']:.3f} +- {r['sd']:.3f}")
    return Table(index, cols, title="Most relevant hyperparameters (natural scale; lengthscales: shortest "
                                    f"{len(top)} of {len(ls)})")


@contextlib.contextmanager
def _stop_on_interrupt() -> Iterator[None]:
    """Record warnings, but end the whole demo on Ctrl-C: an engine's partial result
    (:class:`~gpvi.exceptions.InterruptedRunWarning`) becomes :class:`KeyboardInterrupt`, so the next stage does
    not start (the CLI then exits with status 130)."""
    warnings.simplefilter("always")
    with interrupt_propagates():
        yield


def demo(*, quick: bool = False, seed: int = 0, progress_bar: bool = True, out: TextIO | None = None):
    """Run the demonstration and return its summary :class:`~gpvi.table.Table` (also printed to ``out``).

    Parameters
    ----------
    quick : bool
        Smoke run: 1 ML-II restart, 150 DSVI steps, few draws; a few seconds, numbers not converged.
    seed : int
        Seed of the Bodyfat split and of every engine.
    progress_bar : bool
        tqdm bars on ML-II restarts, DSVI steps and CVI sweeps.
    out : text stream, optional
        Where the report goes (default ``sys.stdout``).

    Returns
    -------
    Table
        One row per (data set, method): test metrics and wall time.

    Examples
    --------
    >>> import io
    >>> from gpvi.demo import demo
    >>> t = demo(quick=True, progress_bar=False, out=io.StringIO())   # doctest: +SKIP
    >>> t.index                                                        # doctest: +SKIP
    ['bodyfat  ML-II', 'bodyfat  DSVI', 'pima  CVI GPClassifier']
    """
    out = sys.stdout if out is None else out
    cfg = _QUICK if quick else _FULL

    def say(*a: Any) -> None:
        print(*a, file=out, flush=True)

    notes: list[str] = []
    say(f"gpvi {gpvi.__version__} demo{' (quick smoke run: few iterations, numbers not converged)' if quick else ''}"
        f", seed {seed}\n")

    # ---------------------------------------------------------------- 1. Bodyfat: ML-II and DSVI
    ds = gpvi.datasets.load_bodyfat(seed=seed)
    model = gpvi.GPRegression(ds.X_train, ds.y_train, feature_names=list(ds.feature_names))
    say(f"[1/2] Bodyfat: GP regression, N = {ds.n_train} train / {ds.n_test} test, d = {ds.n_features} inputs "
        f"(incl. Density), D = {model.dim} log-hyperparameters, prior N(0, 10) on each")
    with warnings.catch_warnings(record=True) as caught, _stop_on_interrupt(), advising(**_ADVICE["ml2"]):
        t0 = time.perf_counter()
        fit = gpvi.ML2(num_restarts=cfg["restarts"], seed=seed, progress_bar=progress_bar).run(model)
        t_ml2 = time.perf_counter() - t0
        p_ml2 = fit.predict(ds.X_test)
        t0 = time.perf_counter()
        q = gpvi.DSVI(scale="full", seed=seed, num_steps=cfg["dsvi_steps"], num_elbo_draws=cfg["elbo_draws"],
                      progress_bar=progress_bar).run(model, init=fit)
        t_dsvi = time.perf_counter() - t0
        p_dsvi = q.predict(ds.X_test, num_draws=cfg["pred_draws"], seed=seed)
    for w in caught:
        if quick and issubclass(w.category, gpvi.ConvergenceWarning):
            continue
        notes.append(f"{w.category.__name__}: {str(w.message).splitlines()[0]}")
    m = {"ml2": (gpvi.metrics.smse(p_ml2, ds.y_test), gpvi.metrics.nlpd(p_ml2, ds.y_test)),
         "dsvi": (gpvi.metrics.smse(p_dsvi, ds.y_test), gpvi.metrics.nlpd(p_dsvi, ds.y_test))}
    say(f"  ML-II: log marginal likelihood {fit.value:.3f} (best of {cfg['restarts']} restart(s)), {t_ml2:.1f} s")
    say(f"  DSVI:  ELBO {q.elbo:.3f} +- {q.elbo_se:.3f} after {q.info['steps']} steps "
        f"(converged: {q.info['converged']}), {t_dsvi:.1f} s")
    say()
    say(_top_marginals(fit, q, ds.feature_names))
    say()

    # ---------------------------------------------------------------- 2. Pima: CVI classifier
    pima = gpvi.datasets.load_pima()
    say(f"[2/2] Pima: GP classification, N = {pima.n_train} train / {pima.n_test} test, d = {pima.n_features}; "
        "logit link, full-batch CVI, type-II hyperparameters")
    with warnings.catch_warnings(record=True) as caught, _stop_on_interrupt(), advising(**_ADVICE["cvi"]):
        t0 = time.perf_counter()
        clf = gpvi.GPClassifier(likelihood="logit", mode="full", max_sweeps=cfg["max_sweeps"], random_state=seed,
                                verbose=int(progress_bar)).fit(pima.X_train, pima.y_train)
        t_cvi = time.perf_counter() - t0
    for w in caught:
        if quick and issubclass(w.category, gpvi.ConvergenceWarning):
            continue
        notes.append(f"{w.category.__name__}: {str(w.message).splitlines()[0]}")
    p = clf.predict_proba(pima.X_test)[:, 1]
    err, ll = gpvi.metrics.error_rate(p, pima.y_test), gpvi.metrics.log_loss_bits(p, pima.y_test)
    say(f"  CVI: ELBO {clf.elbo_:.3f}, {t_cvi:.1f} s")
    say()

    table = Table(
        ["bodyfat  ML-II", "bodyfat  DSVI", "pima  CVI GPClassifier"],
        {"test SMSE": [_fmt(m["ml2"][0]), _fmt(m["dsvi"][0]), "-"],
         "test NLPD": [_fmt(m["ml2"][1]), _fmt(m["dsvi"][1]), "-"],
         "test error": ["-", "-", _fmt(err)],
         "log-loss (bits)": ["-", "-", _fmt(ll)],
         "time (s)": [f"{t_ml2:.1f}", f"{t_dsvi:.1f}", f"{t_cvi:.1f}"]},
        title="Summary (test data; regression metrics on standardised targets)")
    say(table)
    if notes:
        say()
        for n in dict.fromkeys(notes):
            say(f"note: {n}")
    return table


def run_demo(*, quick: bool = False, seed: int = 0, progress_bar: bool = True) -> int:
    """``gpvi demo``: run :func:`demo`, print its report, return the exit status 0."""
    demo(quick=quick, seed=seed, progress_bar=progress_bar)
    return 0
