"""gpvi.plots: figures are returned (Agg backend), show what they claim, and reject bad input."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from gpvi.evaluation.plots import bound, compare_marginals, observation_predictive, trace  # noqa: E402
from gpvi.posteriors import GaussianPosterior, PointPosterior, SamplePosterior  # noqa: E402

NAMES = ["a", "b", "c"]


@pytest.fixture
def q():
    mean = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
    L = torch.tensor([[1.0, 0, 0], [0.3, 0.5, 0], [0.0, 0.2, 2.0]], dtype=torch.float64)
    return GaussianPosterior(mean, L, NAMES)


@pytest.fixture
def mc(q, generator):
    draws = q.sample(4 * 300, generator=generator).reshape(4, 300, 3)
    warm = q.sample(4 * 50, generator=generator).reshape(4, 50, 3) + 3.0
    return SamplePosterior(draws, NAMES, info={"warmup_draws": warm})


def visible(fig):
    return [ax for ax in fig.axes if ax.get_visible()]


def test_compare_marginals_gaussian_curve_is_exact_marginal(q, mc, tmp_path):
    fig = compare_marginals(q, mc, labels=("DSVI", "NUTS"), ncols=2)
    assert isinstance(fig, Figure)
    axes = visible(fig)
    assert [ax.get_title() for ax in axes] == NAMES
    assert len(fig.axes) == 4 and len(axes) == 3              # 2 x 2 grid, last panel hidden
    sd = torch.sqrt(torch.diagonal(q.covariance))
    for j, ax in enumerate(axes):
        dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
        assert len(dashed) == 1
        x = torch.as_tensor(dashed[0].get_xdata())
        y = torch.as_tensor(dashed[0].get_ydata())
        expect = torch.exp(-0.5 * ((x - q.mean[j]) / sd[j]) ** 2) / (sd[j] * math.sqrt(2 * math.pi))
        torch.testing.assert_close(y, expect, rtol=1e-12, atol=1e-15)
        # the histogram is a density: bar areas sum to ~1 (mass outside the 0.1%-99.9% range is left out)
        area = sum(p.get_width() * p.get_height() for p in ax.patches)
        assert 0.95 < area <= 1.0 + 1e-9
        # the KDE of the reference is drawn as a solid line
        assert any(ln.get_linestyle() == "-" for ln in ax.get_lines())
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert "DSVI" in labels and "NUTS" in labels
    fig.savefig(tmp_path / "marginals.png")
    assert (tmp_path / "marginals.png").stat().st_size > 0


def test_compare_marginals_other_posteriors(q, mc):
    point = PointPosterior(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), NAMES)
    fig = compare_marginals(point, mc, names=["b"])
    (ax,) = visible(fig)
    assert ax.get_title() == "b"
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert list(dashed[0].get_xdata()) == [0.2, 0.2]          # a vertical line at the point estimate
    fig2 = compare_marginals(mc, mc, names="a", kde=False)    # sample vs sample: KDE curve for q
    assert len(visible(fig2)) == 1
    fig3 = compare_marginals(mc, q)                           # non-sample reference: draws from it
    assert len(visible(fig3)) == 3


def test_compare_marginals_bad_input(q, mc):
    with pytest.raises(ValueError, match="names contains 'z'"):
        compare_marginals(q, mc, names=["z"])
    other = GaussianPosterior(torch.zeros(3, dtype=torch.float64), torch.eye(3, dtype=torch.float64), ["x", "y", "z"])
    with pytest.raises(ValueError, match="different parameters"):
        compare_marginals(other, mc)
    with pytest.raises(ValueError, match="bins"):
        compare_marginals(q, mc, bins=0)


def test_trace(mc):
    fig = trace(mc)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 6
    left = fig.axes[0]
    assert len(left.get_lines()) == 4                          # one line per chain
    assert len(left.get_lines()[0].get_xdata()) == 300
    fig_w = trace(mc, names=["c"], warmup=True)
    assert len(fig_w.axes) == 2
    line = fig_w.axes[0].get_lines()[0]
    assert len(line.get_xdata()) == 350 and line.get_xdata()[0] == -50
    with pytest.raises(TypeError, match="sample posterior"):
        trace(GaussianPosterior(torch.zeros(1, dtype=torch.float64), torch.eye(1, dtype=torch.float64), ["a"]))


def test_bound_rolling_average():
    vals = [1.0, 2.0, float("nan"), 4.0, 5.0]
    fig = bound(vals, window=2, ylim_quantile=None)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    raw, avg = ax.get_lines()
    # windows of the last 2 steps over the finite values: [1], [1,2], [2], [4], [4,5]
    assert list(avg.get_ydata()) == [1.0, 1.5, 2.0, 4.0, 4.5]
    assert list(raw.get_xdata()) == [1, 2, 3, 4, 5]


def test_bound_from_traces():
    class Result:
        trace = {"bound": [-5.0, -4.0, -3.0], "bound_avg": [-5.0, -4.5, -4.0], "rho": [0.1, 0.1, 0.1]}
    _, avg = bound(Result()).axes[0].get_lines()
    assert list(avg.get_ydata()) == [-5.0, -4.5, -4.0]        # the engine's own rolling average is used
    fig = bound({"elbo": [-3.0, -2.0], "step": [10, 20]})
    assert fig.axes[0].get_ylabel() == "elbo"
    assert list(fig.axes[0].get_lines()[0].get_xdata()) == [10, 20]
    assert bound(torch.tensor([-1.0, -0.5])).axes[0].get_ylabel() == "bound"
    with pytest.raises(ValueError, match="no bound trace"):
        bound({"rho": [1.0]})
    with pytest.raises(ValueError, match="key 'x'"):
        bound({"bound": [1.0]}, key="x")
    with pytest.raises(ValueError, match="empty"):
        bound([])
    assert bound(np.array([-1.0, -0.5, -0.4])).axes[0].get_ylabel() == "bound"
    with pytest.raises(TypeError, match="result must be"):
        bound(3.0)
    with pytest.raises(TypeError, match="result"):
        bound("abc")
    with pytest.raises(ValueError, match="window"):
        bound([1.0], window=0)


def _generalised_post(likelihood, y_of_f, n=25):
    import gpvi

    g = torch.Generator().manual_seed(5)
    X = torch.linspace(0, 6, n, dtype=torch.float64).unsqueeze(-1)
    y = y_of_f(torch.sin(X[:, 0]), g)
    model = gpvi.GPGeneralisedRegression(X, y, likelihood=likelihood, theta=torch.tensor([0.0, 0.5]),
                                         feature_names=["dose"])
    return gpvi.CVI(progress_bar=False).run(model)


def test_observation_predictive_poisson_draws_the_predictive_mean_and_interval(tmp_path):
    post = _generalised_post("poisson", lambda f, g: torch.poisson(torch.exp(1 + f), generator=g))
    fig = observation_predictive(post, level=0.8, num_grid=50, latent=True)
    assert isinstance(fig, Figure) and len(fig.axes) == 2                    # the latent mean on a second axis
    ax, ax2 = fig.axes
    (mean_line,) = [ln for ln in ax.get_lines() if ln.get_label() == "predictive mean"]
    x = torch.as_tensor(mean_line.get_xdata())
    pred = post.predict(x.unsqueeze(-1))
    assert x.shape == (50,) and float(x[0]) < 0 < 6 < float(x[-1])            # data range and 5% beyond
    torch.testing.assert_close(torch.as_tensor(mean_line.get_ydata()), pred.mean, rtol=1e-12, atol=1e-12)
    (latent_line,) = ax2.get_lines()
    torch.testing.assert_close(torch.as_tensor(latent_line.get_ydata()), pred.latent_mean, rtol=1e-12, atol=1e-12)
    # the band: the 80% interval, integer counts
    (band,) = ax.collections[:1]
    verts = torch.as_tensor(band.get_paths()[0].vertices[:, 1])
    lo, hi = pred.interval(0.8)
    assert set(verts.tolist()) <= set(lo.tolist()) | set(hi.tolist()) and (verts == verts.round()).all()
    # the data points: the training counts
    (points,) = [c for c in ax.collections if c.get_label() == "data"]
    np.testing.assert_array_equal(points.get_offsets(), np.c_[post.model.X.numpy(), post.model.y.numpy()])
    assert ax.get_xlabel() == "dose" and [t.get_text() for t in ax.get_legend().get_texts()] == [
        "80% predictive interval", "predictive mean", "data", "latent mean"]
    fig.savefig(tmp_path / "counts.png")
    assert (tmp_path / "counts.png").stat().st_size > 0


def test_observation_predictive_student_t_on_a_given_grid_and_bad_input():
    from gpvi.models.latent_likelihoods import StudentT

    post = _generalised_post(StudentT(3.0, 0.2),
                             lambda f, g: f + 0.2 * torch.randn(f.shape, generator=g, dtype=torch.float64))
    grid = torch.linspace(-1, 7, 31, dtype=torch.float64)
    fig = observation_predictive(post, post.model.X[:5], post.model.y[:5], grid=grid, title="t")
    (ax,) = fig.axes
    line = ax.get_lines()[0]
    np.testing.assert_array_equal(line.get_xdata(), grid.numpy())
    torch.testing.assert_close(torch.as_tensor(line.get_ydata()), post.predict(grid.unsqueeze(-1)).mean,
                               rtol=1e-12, atol=1e-12)
    assert ax.get_title() == "t" and len(ax.collections[1].get_offsets()) == 5
    with pytest.raises(ValueError, match="level must be in"):
        observation_predictive(post, level=1.0)
    with pytest.raises(ValueError, match="X has 5 rows but y has 4"):
        observation_predictive(post, post.model.X[:5], post.model.y[:4])
    with pytest.raises(TypeError, match="post must be CVI's posterior of a GPGeneralisedRegression"):
        observation_predictive(GaussianPosterior(torch.zeros(1, dtype=torch.float64),
                                                 torch.eye(1, dtype=torch.float64), ["a"]))


def test_observation_predictive_refuses_two_inputs():
    import gpvi

    X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    post = gpvi.CVI(progress_bar=False, num_steps=3).run(
        gpvi.GPGeneralisedRegression(X, torch.arange(12.0) % 3, likelihood="poisson"))
    with pytest.raises(ValueError, match="post's model has 2 inputs; observation_predictive draws one-input fits"):
        observation_predictive(post)


def test_import_is_lazy():
    """Importing gpvi.plots must not import matplotlib (it is an optional extra)."""
    code = "import sys, gpvi.evaluation.plots; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
