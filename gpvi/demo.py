"""``gpvi demo``: the README's main job on bundled data."""

from __future__ import annotations

import time


def run_demo(*, quick: bool = False, seed: int = 0, progress_bar: bool = True) -> int:
    """ML-II on Bodyfat with test SMSE/NLPD and the hyperparameter summary."""
    import gpvi

    ds = gpvi.datasets.load_bodyfat(seed=seed)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=2 if quick else 5, seed=seed, progress_bar=progress_bar).run(model)
    t_fit = time.perf_counter() - t0
    pred = fit.predict(ds.X_test)
    print(f"ML-II on {ds.name} (N={ds.n_train}, d={ds.n_features}): log marginal likelihood {fit.value:.3f} "
          f"(restart {fit.info['best_restart']} of {len(fit.info['restarts'])}), {t_fit:.1f} s")
    print(fit.summary())
    print(f"test SMSE {gpvi.metrics.smse(pred, ds.y_test):.4f}   test NLPD {gpvi.metrics.nlpd(pred, ds.y_test):.4f} "
          f"(standardised targets)")
    return 0
