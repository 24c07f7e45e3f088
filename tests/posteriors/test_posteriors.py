"""Posterior objects and predictive mixtures: closed forms, shapes, names."""

from __future__ import annotations

import math

import pytest
import torch

import gpvi
from gpvi.evaluation.metrics import compare, error_rate, log_loss_bits, nlpd, smse
from tests.conftest import make_gp_data


def test_two_component_mixture_nlpd_by_hand():
    means = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64)
    variances = torch.tensor([[1.0, 0.5], [4.0, 0.5]], dtype=torch.float64)
    pred = gpvi.numerics.predictive.MixturePredictive(means, variances)
    y = torch.tensor([0.5, 3.0], dtype=torch.float64)

    def npdf(x, m, v):
        return math.exp(-0.5 * (x - m) ** 2 / v) / math.sqrt(2 * math.pi * v)

    p0 = 0.5 * npdf(0.5, 0.0, 1.0) + 0.5 * npdf(0.5, 2.0, 4.0)
    p1 = 0.5 * npdf(3.0, 1.0, 0.5) + 0.5 * npdf(3.0, 1.0, 0.5)
    assert abs(nlpd(pred, y) - (-(math.log(p0) + math.log(p1)) / 2)) < 1e-12
    # moments by the law of total variance
    assert torch.allclose(pred.mean, torch.tensor([1.0, 1.0], dtype=torch.float64))
    assert abs(float(pred.var[0]) - (0.5 * (1 + 0) + 0.5 * (4 + 4) - 1.0)) < 1e-12
    # smse uses the variance of the test targets
    assert abs(smse(pred, y) - (((0.5 - 1) ** 2 + (3 - 1) ** 2) / 2) / float(y.var(unbiased=False))) < 1e-12


def test_mixture_log_prob_does_not_underflow():
    pred = gpvi.numerics.predictive.MixturePredictive(torch.zeros(3, 1, dtype=torch.float64), torch.full((3, 1), 1e-4, dtype=torch.float64))
    lp = pred.log_prob(torch.tensor([1.0], dtype=torch.float64))
    assert math.isfinite(float(lp)) and float(lp) < -4000


def _gaussian(D=3, base=None):
    g = torch.Generator().manual_seed(0)
    C = torch.tril(torch.randn(D, D, generator=g, dtype=torch.float64)) * 0.3
    C.diagonal().copy_(torch.rand(D, generator=g, dtype=torch.float64) + 0.5)
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    return gpvi.GaussianPosterior(mu, C, [f"t{i}" for i in range(D)], base=base)


def test_gaussian_posterior_log_prob_and_moments():
    q = _gaussian()
    mvn = torch.distributions.MultivariateNormal(q.mean, scale_tril=q.scale_tril)
    th = mvn.sample((5,))
    assert torch.allclose(q.log_prob(th), mvn.log_prob(th), atol=1e-12)
    assert torch.allclose(q.log_prob(th[0]), mvn.log_prob(th[0]), atol=1e-12)
    assert torch.allclose(q.covariance, q.scale_tril @ q.scale_tril.T)
    draws = q.sample(40000, seed=1)
    # MC error of a mean: sd / sqrt(n) <= 1.5 / 200; allow 5 standard errors
    assert float((draws.mean(0) - q.mean).abs().max()) < 5 * 1.5 / 200
    assert torch.equal(q.sample(10, seed=3), q.sample(10, seed=3))
    t = q.summary()
    assert t.index == q.names and set(["mean", "sd", "q5", "q50", "q95"]) <= set(t.columns)
    sd = torch.sqrt(torch.diagonal(q.covariance))
    assert abs(t["t1"]["q95"] - (float(q.mean[1]) + 1.6448536269514722 * float(sd[1]))) < 1e-9


def test_student_t_base_covariance_and_log_prob():
    base = gpvi.numerics.families.StandardStudentT(3, df=5.0)
    q = _gaussian(base=base)
    assert torch.allclose(q.covariance, q.scale_tril @ q.scale_tril.T * 5.0 / 3.0)
    th = q.sample(4, seed=2)
    z = torch.linalg.solve_triangular(q.scale_tril, (th - q.mean).T, upper=False).T
    ref = torch.distributions.StudentT(5.0).log_prob(z).sum(-1) - torch.log(torch.diagonal(q.scale_tril)).sum()
    assert torch.allclose(q.log_prob(th), ref.to(torch.float64), atol=1e-6)
    draws = base.sample(200000, torch.Generator().manual_seed(0))
    assert abs(float(draws.var()) - 5.0 / 3.0) < 0.05


def test_state_dict_round_trip():
    q = _gaussian()
    q2 = gpvi.GaussianPosterior.from_state_dict(q.state_dict())
    assert torch.equal(q2.mean, q.mean) and torch.equal(q2.scale_tril, q.scale_tril) and q2.names == q.names


def test_to_arviz_round_trips_names_and_shapes():
    q = _gaussian()
    idata = q.to_arviz(num_draws=100)
    assert list(idata.posterior.data_vars) == q.names
    assert idata.posterior["t0"].shape == (1, 100)
    draws = torch.randn(4, 50, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mc = gpvi.SamplePosterior(draws, q.names, stats={"diverging": torch.zeros(4, 50, dtype=torch.bool)})
    idata = mc.to_arviz()
    assert idata.posterior["t2"].shape == (4, 50)
    assert (idata.posterior["t2"].values == draws[:, :, 2].numpy()).all()
    assert "diverging" in idata.sample_stats


def test_sample_posterior_summary_has_diagnostics_and_compare_identical_is_zero():
    draws = torch.randn(4, 200, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mc = gpvi.SamplePosterior(draws, ["a", "b"])
    s = mc.summary()
    assert {"ess_bulk", "ess_tail", "r_hat", "mcse_mean"} <= set(s.columns)
    assert 400 < s["a"]["ess_bulk"] < 1600 and abs(s["a"]["r_hat"] - 1) < 0.02  # iid draws: ess ~ 800
    import arviz as az
    ref = az.summary(mc.to_arviz(), round_to="none")         # the diagnostics are ArviZ's own
    for col in ("ess_bulk", "ess_tail", "r_hat", "mcse_mean"):
        assert s["b"][col] == pytest.approx(float(ref.loc["b", col]), rel=1e-9)
    t = compare(mc, gpvi.SamplePosterior(draws.clone(), ["a", "b"]))
    assert t.column("dmean_sd") == [0.0, 0.0] and t.column("sd_ratio") == [1.0, 1.0] and t.column("w1") == [0.0, 0.0]
    with pytest.raises(ValueError, match="different parameters"):
        compare(mc, gpvi.SamplePosterior(draws, ["a", "c"]))


def test_summary_natural_scale_for_gp():
    X, y = make_gp_data(20, 1)
    model = gpvi.GPRegression(X, y)
    q = gpvi.GaussianPosterior(torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64),
                               0.1 * torch.eye(3, dtype=torch.float64), model.names, model)
    s = q.summary()
    assert s.column("natural") == ["lengthscale[0]", "signal_var", "noise_var"]
    assert abs(s["log_lengthscale_sq[0]"]["nat_q50"] - 1.0) < 1e-12                 # exp(0/2)
    assert abs(s["log_noise_var"]["nat_q50"] - math.exp(-2.0)) < 1e-12
    # lognormal mean exp(mu + s^2/2) for the variance parameters, MC with 4000 draws: within 1%
    assert abs(s["log_signal_var"]["nat_mean"] / math.exp(1.0 + 0.005) - 1) < 0.01
    pred = q.predict(X[:3], num_draws=7)
    assert pred.num_components == 7 and pred.mean.shape == (3,)


def test_classification_metrics():
    y = torch.tensor([0, 1, 1, 0])
    p = torch.tensor([0.2, 0.9, 0.4, 0.5], dtype=torch.float64)
    assert error_rate(p, y) == 0.25
    expected = -(math.log2(0.8) + math.log2(0.9) + math.log2(0.4) + math.log2(0.5)) / 4
    assert abs(log_loss_bits(p, y) - expected) < 1e-12
    assert error_rate(p, torch.tensor([-1, 1, 1, -1])) == 0.25
    with pytest.raises(ValueError, match="p must hold probabilities"):
        error_rate(p * 2, y)
    with pytest.raises(ValueError, match="three|two classes"):
        error_rate(p, torch.tensor([0, 1, 2, 0]))


def test_state_dicts_load_with_weights_only(tmp_path):
    X, y = make_gp_data(20, 1)
    model = gpvi.GPRegression(X, y)
    fit = gpvi.ML2(num_restarts=2, seed=0).run(model)
    q = _gaussian()
    mc = gpvi.SamplePosterior(torch.zeros(2, 5, 3, dtype=torch.float64), ["a", "b", "c"],
                              info={"table": gpvi.table.Table(["x"], {"v": [1.0]}), "arr": torch.ones(2)})
    for post in (fit, q, mc):
        torch.save(post.state_dict(), tmp_path / "s.pt")
        loaded = torch.load(tmp_path / "s.pt", weights_only=True)
        assert loaded["kind"] == post.state_dict()["kind"]
    assert torch.load(tmp_path / "s.pt", weights_only=True)["info"]["table"]["columns"]["v"] == [1.0]


# ---------------------------------------------------------------------------------------------- common surface
NAMES4 = ["a", "b", "c", "d"]


def _parts(D=4, K=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    mu = torch.randn(D, generator=g, dtype=torch.float64)
    c = torch.rand(D, generator=g, dtype=torch.float64) + 0.5
    W = 0.7 * torch.randn(D, K, generator=g, dtype=torch.float64)
    return mu, c, W


def _all_kinds():
    """One posterior of each kind and storage over NAMES4."""
    mu, c, W = _parts()
    g = torch.Generator().manual_seed(1)
    L = torch.tril(0.3 * torch.randn(4, 4, generator=g, dtype=torch.float64))
    L.diagonal().copy_(c)
    return {
        "point": gpvi.PointPosterior(mu, NAMES4, value=-1.5),
        "full": gpvi.GaussianPosterior(mu, L, NAMES4, elbo=-3.0, elbo_se=0.1),
        "diag": gpvi.GaussianPosterior(mu, c, NAMES4),
        "diag_t": gpvi.GaussianPosterior(mu, c, NAMES4, base=gpvi.numerics.families.StandardStudentT(4, df=5.0)),
        "lowrank": gpvi.GaussianPosterior.lowrank(mu, W, c, NAMES4),
        "samples": gpvi.SamplePosterior(torch.randn(3, 50, 4, generator=g, dtype=torch.float64), NAMES4,
                                        stats={"diverging": torch.zeros(3, 50, dtype=torch.bool)}),
    }


@pytest.mark.parametrize("which", ["point", "full", "diag", "diag_t", "lowrank", "samples"])
def test_common_surface_shapes_and_names(which):
    post = _all_kinds()[which]
    D = 4
    assert post.names == NAMES4 and post.dim == D
    assert post.mean.shape == (D,) and post.std.shape == (D,) and post.mean.dtype == torch.float64
    assert torch.equal(post.stddev, post.std)
    assert post.sample(7, seed=3).shape == (7, D)
    assert torch.equal(post.sample(7, seed=3), post.sample(7, seed=3))
    gen = torch.Generator().manual_seed(5)
    assert post.sample(2, generator=gen).shape == (2, D)
    assert post.quantile(0.3).shape == (D,) and post.quantile([0.1, 0.5, 0.9]).shape == (3, D)
    q = post.quantile(torch.tensor([0.05, 0.95], dtype=torch.float64))
    assert bool((q[0] <= q[1]).all())
    marg = post.marginals()
    assert list(marg) == NAMES4
    for j, name in enumerate(NAMES4):
        assert {"family", "mean", "sd"} <= set(marg[name])
        assert marg[name]["mean"] == float(post.mean[j]) and marg[name]["sd"] == float(post.std[j])
    s = post.summary()
    assert s.index == NAMES4 and s.column("mean") == post.mean.tolist() and s.column("sd") == post.std.tolist()
    assert list(post.to_arviz(num_draws=20).posterior.data_vars) == NAMES4
    for bad in (0.0, 1.0, 1.5, [0.5, -0.1]):
        with pytest.raises(ValueError, match="p must be in \\(0, 1\\)"):
            post.quantile(bad)
    with pytest.raises(TypeError, match="p must be a number"):
        post.quantile("0.5")


def test_marginal_families():
    posts = _all_kinds()
    assert posts["point"].marginals()["a"]["family"] == "point"
    assert posts["point"].marginals()["b"]["value"] == float(posts["point"].theta[1])
    assert posts["full"].marginals()["a"]["family"] == "normal"
    m = posts["diag_t"].marginals()["c"]
    assert m["family"] == "student_t" and m["df"] == 5.0 and m["scale"] == float(posts["diag_t"].scale_diag[2])
    assert posts["lowrank"].marginals()["d"]["family"] == "normal"
    assert posts["samples"].marginals()["a"] == {"family": "empirical", "mean": float(posts["samples"].mean[0]),
                                                 "sd": float(posts["samples"].std[0]), "num_draws": 150}


@pytest.mark.parametrize("which", ["point", "full", "diag", "diag_t", "lowrank", "samples"])
def test_state_dict_round_trip_every_kind(which, tmp_path):
    post = _all_kinds()[which]
    post.info["table"] = gpvi.table.Table(["x"], {"v": [1.0]})
    path = tmp_path / f"{which}.pt"
    torch.save(post.state_dict(), path)
    state = torch.load(path, weights_only=True)
    assert state["kind"] == post.kind and state["version"] == gpvi.posteriors.STATE_VERSION
    assert state["names"] == NAMES4
    for rebuilt in (type(post).from_state_dict(state), gpvi.posteriors.Posterior.from_state_dict(state),
                    gpvi.posteriors.posterior_from_state_dict(state)):
        assert type(rebuilt) is type(post) and rebuilt.names == post.names
        assert torch.equal(rebuilt.mean, post.mean) and torch.equal(rebuilt.std, post.std)
        assert torch.equal(rebuilt.sample(5, seed=2), post.sample(5, seed=2))
        assert rebuilt.info["table"]["columns"]["v"] == [1.0]
        assert getattr(rebuilt, "storage", None) == getattr(post, "storage", None)
    other = "samples" if which != "samples" else "point"
    with pytest.raises(ValueError, match="reads kind"):
        type(_all_kinds()[other]).from_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        gpvi.posteriors.Posterior.from_state_dict({**state, "version": 99})


def test_a_state_dict_of_another_version_or_missing_an_entry_is_refused():
    state = _gaussian().state_dict()
    with pytest.raises(ValueError, match="version None"):
        gpvi.GaussianPosterior.from_state_dict({k: v for k, v in state.items() if k != "version"})
    with pytest.raises(ValueError, match="lacks the entry 'storage'"):
        gpvi.GaussianPosterior.from_state_dict({k: v for k, v in state.items() if k != "storage"})


# ---------------------------------------------------------------------------------------------- storages
def _twins(base=None):
    mu, c, _ = _parts(D=5)
    names = [f"t{i}" for i in range(5)]
    mk = (lambda: None) if base is None else base
    return (gpvi.GaussianPosterior(mu, c, names, base=mk()),
            gpvi.GaussianPosterior(mu, torch.diag(c), names, base=mk()))


@pytest.mark.parametrize("base", [None, lambda: gpvi.numerics.families.StandardStudentT(5, df=4.0)])
def test_diag_storage_equals_full_with_diagonal_scale(base):
    qd, qf = _twins(base)
    assert qd.storage == "diag" and qf.storage == "full"
    assert torch.equal(qd.mean, qf.mean) and torch.equal(qd.std, qf.std)
    assert torch.equal(qd.scale_diag, qf.scale_diag) and torch.equal(qd.scale_tril, qf.scale_tril)
    assert torch.equal(qd.covariance, qf.covariance)
    for seed in (0, 7):
        assert float((qd.sample(300, seed=seed) - qf.sample(300, seed=seed)).abs().max()) <= 1e-12
    gd, gf = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for n in (4, 9):
        assert float((qd.sample(n, generator=gd) - qf.sample(n, generator=gf)).abs().max()) <= 1e-12
    th = qf.sample(6, seed=1)
    assert torch.allclose(qd.log_prob(th), qf.log_prob(th), rtol=0, atol=1e-12)
    A = torch.randn(3, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for x, y in zip(qd.linear_marginals(A), qf.linear_marginals(A)):
        assert torch.allclose(x, y, rtol=1e-14, atol=0)
    if base is None:
        p = [0.05, 0.25, 0.5, 0.9]
        assert torch.allclose(qd.quantile(p), qf.quantile(p), rtol=0, atol=1e-12)
        sd_, sf = qd.summary(), qf.summary()
        assert sd_.columns == sf.columns and sd_.index == sf.index


def test_diag_student_t_quantiles_closed_form():
    import scipy.stats
    qd, _ = _twins(lambda: gpvi.numerics.families.StandardStudentT(5, df=4.0))
    p = [0.05, 0.5, 0.975]
    ref = qd.mean + torch.tensor(scipy.stats.t.ppf(p, 4.0), dtype=torch.float64)[:, None] * qd.scale_diag
    assert torch.allclose(qd.quantile(p), ref, rtol=0, atol=1e-12)
    assert torch.allclose(qd.std, qd.scale_diag * math.sqrt(4.0 / 2.0), rtol=1e-15, atol=0)   # Var t_4 = 2


def test_diag_factorised_base_quantiles_and_marginals():
    one = torch.tensor(1.0, dtype=torch.float64)
    comps = [torch.distributions.Laplace(0.0 * one, one)] * 3
    mu, c = torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    q = gpvi.GaussianPosterior(mu, c, ["x", "y", "z"], base=gpvi.numerics.families.Factorised(comps))
    med_hi = q.quantile([0.5, 0.75])
    assert torch.allclose(med_hi[0], mu, atol=1e-15) and torch.allclose(med_hi[1], c * math.log(2.0), atol=1e-14)
    assert q.marginals()["y"]["family"] == "location_scale" and q.marginals()["y"]["scale"] == 2.0
    assert torch.allclose(q.std, c * math.sqrt(2.0), rtol=1e-15)                                  # Var Laplace = 2


def test_lowrank_moments_match_its_dense_covariance():
    D, K = 6, 2
    mu, d, W = _parts(D, K, seed=4)
    names = [f"t{i}" for i in range(D)]
    q = gpvi.GaussianPosterior.lowrank(mu, W, d, names)
    cov = W @ W.T + torch.diag(d ** 2)
    assert q.storage == "lowrank" and q.factor.shape == (D, K)
    assert torch.allclose(q.covariance, cov, rtol=0, atol=1e-14)
    assert torch.allclose(q.std, torch.sqrt(torch.diagonal(cov)), rtol=1e-14, atol=0)
    L = q.scale_tril
    assert torch.equal(L, torch.tril(L)) and torch.allclose(L @ L.T, cov, rtol=0, atol=1e-12)
    mvn = torch.distributions.MultivariateNormal(mu, covariance_matrix=cov)
    th = mvn.sample((5,))
    assert torch.allclose(q.log_prob(th), mvn.log_prob(th), rtol=0, atol=1e-10)
    assert torch.allclose(q.log_prob(th[0]), mvn.log_prob(th[0]), rtol=0, atol=1e-10)
    p = torch.tensor([0.1, 0.5, 0.8], dtype=torch.float64)
    ref = mu + torch.special.ndtri(p)[:, None] * torch.sqrt(torch.diagonal(cov))
    assert torch.allclose(q.quantile(p), ref, rtol=0, atol=1e-12)
    A = torch.randn(4, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    m_a, sd_a = q.linear_marginals(A)
    assert torch.allclose(m_a, A @ mu, atol=1e-14)
    assert torch.allclose(sd_a ** 2, torch.diagonal(A @ cov @ A.T), rtol=1e-12)
    # draws mu + W e1 + d * e2: the first K normals of the stream feed W, the next D feed d
    g = torch.Generator().manual_seed(11)
    e1 = torch.randn((3, K), generator=g, dtype=torch.float64)
    e2 = torch.randn((3, D), generator=g, dtype=torch.float64)
    assert torch.allclose(q.sample(3, seed=11), mu + e1 @ W.T + e2 * d, rtol=0, atol=1e-14)
    # Monte Carlo moments: covariance entries have sd <= sqrt(2) max var / sqrt(n); allow 5 standard errors
    n = 40000
    draws = q.sample(n, seed=1)
    se = math.sqrt(2.0) * float(torch.diagonal(cov).max()) / math.sqrt(n)
    assert float((torch.cov(draws.T) - cov).abs().max()) < 5 * se
    assert float(((draws.mean(0) - mu) / q.std).abs().max()) < 5 / math.sqrt(n)


def test_lowrank_validation():
    mu, d, W = _parts(3, 1)
    with pytest.raises(ValueError, match="factor \\(3, K\\)"):
        gpvi.GaussianPosterior.lowrank(mu, W[:2], d, ["a", "b", "c"])
    with pytest.raises(ValueError, match="diag must be strictly positive"):
        gpvi.GaussianPosterior.lowrank(mu, W, -d, ["a", "b", "c"])
    with pytest.raises(ValueError, match="standard-normal base"):
        gpvi.GaussianPosterior.lowrank(mu, W, d, ["a", "b", "c"], base=gpvi.numerics.families.StandardStudentT(3, df=3.0))
    with pytest.raises(ValueError, match=r"scale_tril \(3, 3\) or \(3,\)"):
        gpvi.GaussianPosterior(mu, torch.ones(2, dtype=torch.float64), ["a", "b", "c"])
    with pytest.raises(ValueError, match="strictly positive diagonal"):
        gpvi.GaussianPosterior(mu, -d, ["a", "b", "c"])


def test_dense_properties_check_memory_first(monkeypatch):
    from gpvi.validation import memory
    mu, c, W = _parts(D=50, K=3)
    names = [f"t{i}" for i in range(50)]
    qd = gpvi.GaussianPosterior(mu, c, names)
    ql = gpvi.GaussianPosterior.lowrank(mu, W, c, names)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda device: 1000)
    for q in (qd, ql):
        for attr in ("scale_tril", "covariance"):
            with pytest.raises(MemoryError, match="D = 50"):
                getattr(q, attr)
        # everything else works from the compact storage
        q.sample(3, seed=0), q.std, q.quantile(0.3), q.summary(), q.state_dict(), q.log_prob(mu), q.marginals()


def test_large_diag_posterior_never_builds_a_dense_matrix():
    # D = 30,000: one dense (D, D) float64 matrix is 7.2 GB. Peak RSS is measured in a fresh interpreter, so
    # the increase is that of these calls alone (resource.getrusage in kilobytes on Linux).
    import subprocess
    import sys
    code = r"""
import resource, torch
from gpvi.posteriors import GaussianPosterior
D = 30000
g = torch.Generator().manual_seed(0)
mu = torch.randn(D, generator=g, dtype=torch.float64)
c = torch.rand(D, generator=g, dtype=torch.float64) + 0.5
q = GaussianPosterior(mu, c, [f"w{i}" for i in range(D)])
ql = GaussianPosterior.lowrank(mu, 0.1 * torch.randn(D, 4, generator=g, dtype=torch.float64), c, q.names)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for p in (q, ql):
    s = p.sample(20, seed=0)
    sd = p.std
    t = p.summary()
    st = p.state_dict()
    p.quantile([0.1, 0.9]), p.log_prob(s), p.marginals()
    assert s.shape == (20, D) and sd.shape == (D,) and len(t) == D and st["storage"] in ("diag", "lowrank")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    delta_mb = int(out.stdout.strip().splitlines()[-1]) / 1024
    assert delta_mb < 200, f"peak memory grew by {delta_mb:.0f} MB"


# ---------------------------------------------------------------------------------------------- engine state
def test_posterior_keeps_its_own_copy_of_the_engine_state():
    from gpvi.inference.dsvi.engine import DSVI, SGD
    from gpvi.inference.mcmc.state import MCMCState
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=2)
    eng = DSVI(num_steps=10, optimizer=SGD(lr=0.1), progress_bar=False, seed=0)
    st = eng.init(target)
    q = gpvi.GaussianPosterior(st.mu, st.C, target.names, target, engine_state=st)
    mu0, C0 = st.mu.clone(), st.C.clone()
    for _ in range(3):
        eng.step(target, st)
    assert st.t == 3 and not torch.equal(st.mu, mu0)
    assert q.engine_state is not st and q.engine_state.t == 0
    assert torch.equal(q.engine_state.mu, mu0) and torch.equal(q.engine_state.C, C0)
    assert q.state_dict()["engine_state"]["t"] == 0
    # the copy resumes the run: stepping it reproduces the engine's own steps bit for bit
    mine = q.engine_state.copy()
    for _ in range(3):
        eng.step(target, mine)
    assert torch.equal(mine.mu, st.mu)
    # objects without copy() (an MCMC state) and plain dicts are deep-copied
    ms = MCMCState(["a", "b"], {"kind": "nuts"})
    mc = gpvi.SamplePosterior(torch.zeros(1, 3, 2, dtype=torch.float64), ["a", "b"], engine_state=ms)
    ms.chains.append("mutated")
    ms.settings["kind"] = "hmc"
    assert mc.engine_state.chains == [] and mc.engine_state.settings == {"kind": "nuts"}
    d = {"t": 1, "mu": torch.zeros(2, dtype=torch.float64)}
    p = gpvi.PointPosterior(torch.zeros(2, dtype=torch.float64), ["a", "b"], engine_state=d)
    d["t"] = 2
    d["mu"].add_(1.0)
    assert p.engine_state["t"] == 1 and float(p.engine_state["mu"].abs().max()) == 0.0
    assert p.state_dict()["engine_state"]["t"] == 1


# ---------------------------------------------------------------------------------------------- consumers
def test_compare_and_plots_work_on_diag_posteriors():
    qd, qf = _twins()
    t = compare(qd, qf)
    assert t.column("dmean_sd") == [0.0] * 5 and t.column("sd_ratio") == [1.0] * 5
    assert max(t.column("w1")) < 1e-10
    draws = qf.sample(2 * 200, seed=4).reshape(2, 200, 5)
    mc = gpvi.SamplePosterior(draws, qd.names)
    t2 = compare(qd, mc)
    assert max(abs(v) for v in t2.column("dmean_sd")) < 0.3             # 400 draws: se of a mean 0.05 sd
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from gpvi.evaluation.plots import compare_marginals
    from gpvi.evaluation.plots import _is_gaussian
    assert _is_gaussian(qd)
    fig = compare_marginals(qd, mc, labels=("DSVI", "NUTS"))
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 5
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_predict_on_diag_and_lowrank_gp_posteriors():
    X, y = make_gp_data(20, 1)
    model = gpvi.GPRegression(X, y)
    mu = torch.tensor([0.0, 1.0, -2.0], dtype=torch.float64)
    qd = gpvi.GaussianPosterior(mu, torch.full((3,), 0.1, dtype=torch.float64), model.names, model)
    qf = gpvi.GaussianPosterior(mu, 0.1 * torch.eye(3, dtype=torch.float64), model.names, model)
    pd_, pf = qd.predict(X[:4], num_draws=6), qf.predict(X[:4], num_draws=6)
    assert torch.allclose(pd_.mean, pf.mean, rtol=0, atol=1e-12) and torch.allclose(pd_.var, pf.var, rtol=0, atol=1e-12)
    assert qd.summary().column("nat_q50") == qf.summary().column("nat_q50")
    ql = gpvi.GaussianPosterior.lowrank(mu, torch.zeros(3, 1, dtype=torch.float64), torch.full((3,), 0.1,
                                        dtype=torch.float64), model.names, model)
    assert ql.predict(X[:4], num_draws=6).num_components == 6
