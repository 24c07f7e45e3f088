"""Cross-cutting reliability checks (issue 8) not already covered by each engine's own tests.

Each engine's test file covers its fault injection, interruption and in-process resume; DSVI and CVI also
resume in a new process there. Here: NUTS resumed in a new process, float64 end to end from float32/int
inputs for every engine, and no engine touching the global RNGs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import torch

import gpvi
from gpvi.exceptions import ConvergenceWarning, InterruptedRunWarning

from tests.conftest import make_gp_data


def _target():
    mean = torch.tensor([1.0, -2.0], dtype=torch.float64)
    return gpvi.Target(lambda th: -0.5 * ((th - mean) ** 2).sum(-1), ["a", "b"])


# heavy (a second process imports torch, GPyTorch, Pyro): make test-slow; the in-process state_dict round trip of
# every engine is in tests/inference/test_contract.py
@pytest.mark.slow
def test_nuts_state_saved_to_disk_resumes_in_a_new_process(tmp_path):
    kw = dict(num_chains=2, num_warmup=20, num_draws=15, seed=3, progress_bar=False)

    def stop(chain, iteration, record):
        if (chain, iteration) == (1, 25):
            raise KeyboardInterrupt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        full = gpvi.NUTS(**kw).run(_target())
        with pytest.warns(InterruptedRunWarning):
            part = gpvi.NUTS(**kw).run(_target(), callback=stop)
    torch.save(part.engine_state.state_dict(), tmp_path / "state.pt")
    script = textwrap.dedent(f"""
        import warnings, torch, gpvi
        mean = torch.tensor([1.0, -2.0], dtype=torch.float64)
        target = gpvi.Target(lambda th: -0.5 * ((th - mean) ** 2).sum(-1), ["a", "b"])
        state = torch.load({str(tmp_path / 'state.pt')!r}, weights_only=True)
        warnings.simplefilter("ignore")
        mc = gpvi.NUTS(**{kw!r}).run(target, state=state)
        torch.save(mc.draws, {str(tmp_path / 'out.pt')!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300,
                   env={"OMP_NUM_THREADS": "1", "PATH": ""})
    assert torch.equal(torch.load(tmp_path / "out.pt"), full.draws)


def test_float32_and_integer_inputs_give_float64_results_end_to_end():
    X, y = make_gp_data(30, 2, seed=5)
    Xf, yf = X.float().numpy(), (y * 10).round().to(torch.int64).numpy()
    model = gpvi.GPRegression(Xf, yf)
    fit = gpvi.ML2(num_restarts=1).run(model)
    q = gpvi.DSVI(num_steps=30, progress_bar=False, seed=0).run(model, init=fit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mc = gpvi.NUTS(num_chains=1, num_warmup=10, num_draws=10, seed=0, progress_bar=False).run(model, init=fit)
    for t in (fit.theta, q.mean, q.scale_tril, q.covariance, mc.draws, q.sample(3, seed=0)):
        assert t.dtype == torch.float64
    for post in (fit, q, mc):
        pred = post.predict(Xf[:4], num_draws=5)
        assert pred.mean.dtype == torch.float64 and pred.var.dtype == torch.float64
        assert pred.log_prob(yf[:4] / 1.0).dtype == torch.float64
    clf = gpvi.GPClassifier(hyperparameters="fixed", random_state=0)
    clf.fit(Xf, (y > 0).numpy().astype(np.int32))
    assert clf.predict_proba(Xf).dtype == np.float64


def test_no_engine_touches_global_rng():
    torch_state = torch.random.get_rng_state().clone()
    np_state = np.random.get_state()[1].copy()
    X, y = make_gp_data(25, 2, seed=6)
    model = gpvi.GPRegression(X, y)
    gpvi.ML2(num_restarts=2, seed=1).run(model)
    q = gpvi.DSVI(num_steps=20, progress_bar=False, seed=1).run(model)
    q.predict(X[:3], num_draws=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gpvi.NUTS(num_chains=1, num_warmup=5, num_draws=5, seed=1, progress_bar=False).run(model)
    gpvi.GPClassifier(mode="stochastic", hyperparameters="fixed", random_state=1).fit(X, y > 0)
    assert torch.equal(torch_state, torch.random.get_rng_state())
    assert np.array_equal(np_state, np.random.get_state()[1])


def test_progress_bar_ends_showing_the_final_postfix(capsys):
    """The postfix is throttled; the bar's last line must still show the value of the last step."""
    from gpvi.inference.progress import Progress

    bar = Progress(50, desc="t", min_interval=3600.0)
    for i in range(50):
        bar.update(1, bound=float(i))
    bar.close()
    err = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()
    assert "bound=49" in err[-1] and "50/50" in err[-1]
