"""The closed-form log joint (gpvi.models.lean_joint) against GPyTorch's generic path: value and gradient to 1e-10.

Inputs are distinct points on a grid of multiples of 1/4. One exception to 1e-10: GPyTorch's Matern 1/2 under autograd
is off by about 1e-8 relative (its distances near r = 0 on the diagonal carry rounding that exp(-r) passes on at first
order); there the lean path is checked against a direct formula to 1e-12 instead, and against GPyTorch to 1e-7.
"""

from __future__ import annotations

import gpytorch as gp
import pytest
import torch

import gpvi
from gpvi.exceptions import NotPSDError
from gpvi.models.lean_joint import LeanLogJoint

N, D_IN = 24, 3


def _data(n: int = N, d: int = D_IN):
    g = torch.Generator().manual_seed(3)
    X = torch.randint(-8, 9, (3 * n, d), generator=g).to(torch.float64) / 4.0
    X = torch.unique(X, dim=0)[torch.randperm(len(torch.unique(X, dim=0)), generator=g)[:n]]   # distinct rows
    assert X.shape[0] == n
    y = torch.sin(X.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _kernels():
    frozen = gp.kernels.ScaleKernel(gp.kernels.RBFKernel())
    frozen.base_kernel.lengthscale = 0.7
    frozen.base_kernel.raw_lengthscale.requires_grad_(False)
    fixed_const = gp.kernels.ConstantKernel()
    fixed_const.constant = torch.tensor(0.3)
    fixed_const.raw_constant.requires_grad_(False)
    return {
        "rbf_ard": gp.kernels.ScaleKernel(gp.kernels.RBFKernel(ard_num_dims=D_IN)),
        "rbf_iso": gp.kernels.ScaleKernel(gp.kernels.RBFKernel()),
        "rbf_bare": gp.kernels.RBFKernel(ard_num_dims=D_IN),
        "m12_ard": gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=0.5, ard_num_dims=D_IN)),
        "m32_iso": gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=1.5)),
        "m52_ard": gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=2.5, ard_num_dims=D_IN)),
        "rq_ard": gp.kernels.ScaleKernel(gp.kernels.RQKernel(ard_num_dims=D_IN)),
        "rq_iso": gp.kernels.ScaleKernel(gp.kernels.RQKernel()),
        "sum_const": gp.kernels.ScaleKernel(gp.kernels.RBFKernel()) + gp.kernels.ConstantKernel(),
        "sum_fixed_const": gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=2.5, ard_num_dims=D_IN)) + fixed_const,
        "sum_mixed": gp.kernels.RBFKernel(ard_num_dims=D_IN) + gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=1.5)),
        "frozen_ls": frozen,
        "prior_ls": gp.kernels.ScaleKernel(gp.kernels.RBFKernel(lengthscale_prior=gp.priors.GammaPrior(2.0, 1.0))),
    }


def _extras():
    lik = gp.likelihoods.GaussianLikelihood(noise_prior=gp.priors.GammaPrior(2.0, 4.0))
    fixed_mean = gp.means.ConstantMean()
    fixed_mean.constant = torch.tensor(0.2)
    fixed_mean.raw_constant.requires_grad_(False)
    return {"plain": {}, "lik_mean": {"likelihood": lik, "mean": gp.means.ConstantMean()},
            "fixed_mean": {"mean": fixed_mean}}


def _reference(model, theta):
    model.use_fast_path = False
    try:
        t = theta.clone().requires_grad_(True)
        v = model.log_joint(t)
        (g,) = torch.autograd.grad(v.sum(), t)
    finally:
        model.use_fast_path = True
    return v.detach(), g


@pytest.mark.parametrize("extra", list(_extras()))
@pytest.mark.parametrize("name", list(_kernels()))
def test_value_and_gradient_match_gpytorch(name, extra):
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=_kernels()[name], **_extras()[extra])
    assert model._lean_joint is not None
    g = torch.Generator().manual_seed(0)
    theta = model.initial_theta() + 0.4 * torch.randn(4, model.dim, generator=g, dtype=torch.float64)
    v_ref, g_ref = _reference(model, theta)
    v, grad = model.log_joint_and_grad(theta)
    tol = 1e-7 if name.startswith("m12") else 1e-10
    assert torch.allclose(v, v_ref, rtol=tol, atol=tol * float(v_ref.abs().max()))
    assert torch.allclose(grad, g_ref, rtol=tol, atol=tol * float(g_ref.abs().max()))
    # the autograd entry point (one node) gives the same numbers
    t = theta.clone().requires_grad_(True)
    v2 = model.log_joint(t)
    (g2,) = torch.autograd.grad(v2.sum(), t)
    assert torch.equal(v2.detach(), v) and torch.equal(g2, grad)
    # log marginal alone: the prior is the only difference
    lm = model.log_marginal_likelihood(theta)
    assert torch.allclose(lm + model.log_prior(theta), v, rtol=1e-12, atol=1e-12 * float(v.abs().max()))


@pytest.mark.parametrize("n", [14, 700])
def test_both_distance_strategies_match(n):
    """Precomputed squared differences (small N) and the expanded form (larger N) against GPyTorch."""
    X, y = _data(n, 4)
    model = gpvi.GPRegression(X, y)
    dist = next(iter(model._lean_joint._dist.values()))
    assert (dist.pre is not None) == (n == 14)
    theta = model.initial_theta().unsqueeze(0)
    v_ref, g_ref = _reference(model, theta)
    v, g = model.log_joint_and_grad(theta)
    assert torch.allclose(v, v_ref, rtol=1e-10) and torch.allclose(g, g_ref, rtol=1e-9, atol=1e-9 * float(g_ref.abs().max()))


def test_matern12_against_a_direct_formula():
    """Matern 1/2 (ARD) by plain differences, r = 0 exactly on the diagonal, autograd: value and gradient to 1e-12."""
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=0.5, ard_num_dims=D_IN)))
    Xc, n = model._Xc, X.shape[0]
    off = ~torch.eye(n, dtype=torch.bool)

    def direct(th):
        r2 = (((Xc[:, None, :] - Xc[None, :, :]) / torch.exp(0.5 * th[:D_IN])) ** 2).sum(-1)
        r = torch.zeros_like(r2).masked_scatter(off, r2[off].sqrt())
        K = torch.exp(th[D_IN]) * torch.exp(-r) + torch.exp(th[D_IN + 1]) * torch.eye(n, dtype=torch.float64)
        mvn = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=torch.float64), covariance_matrix=K)
        return mvn.log_prob(y - y.mean()) + model.log_prior(th)

    g = torch.Generator().manual_seed(1)
    theta = model.initial_theta() + 0.4 * torch.randn(3, model.dim, generator=g, dtype=torch.float64)
    v, grad = model.log_joint_and_grad(theta)
    for i in range(3):
        t = theta[i].clone().requires_grad_(True)
        vr = direct(t)
        (gr,) = torch.autograd.grad(vr, t)
        assert abs(float(vr) - float(v[i])) < 1e-12 * abs(float(vr))
        assert torch.allclose(grad[i], gr, rtol=1e-10, atol=1e-12 * float(gr.abs().max()))


def test_gradient_matches_finite_differences():
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.RQKernel(ard_num_dims=D_IN)),
                              likelihood=gp.likelihoods.GaussianLikelihood(), mean=gp.means.ConstantMean())
    theta = model.initial_theta().unsqueeze(0)
    _, g = model.log_joint_and_grad(theta)
    h = 1e-5
    for j in range(model.dim):
        e = torch.zeros_like(theta)
        e[0, j] = h
        fd = (model.log_joint(theta + e) - model.log_joint(theta - e)) / (2 * h)
        assert abs(float(fd[0]) - float(g[0, j])) < 1e-6 * max(1.0, abs(float(g[0, j])))


def test_unsupported_kernels_keep_the_gpytorch_path():
    X, y = _data()
    assert gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.RBFKernel(active_dims=[0])))._lean_joint is None
    for k in (gp.kernels.ScaleKernel(gp.kernels.PeriodicKernel()),
              gp.kernels.ScaleKernel(gp.kernels.RBFKernel()) * gp.kernels.ScaleKernel(gp.kernels.LinearKernel()),
              gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=2.5)) + gp.kernels.ScaleKernel(gp.kernels.PeriodicKernel())):
        model = gpvi.GPRegression(X, y, kernel=k)
        assert model._lean_joint is None
        theta = model.initial_theta().unsqueeze(0)
        v, g = model.log_joint_and_grad(theta)
        v_ref, g_ref = _reference(model, theta)
        assert torch.equal(v, v_ref) and torch.equal(g, g_ref)


def test_failed_members_get_minus_inf_and_zero_gradient():
    X, y = _data()
    X = torch.cat([X, X[:1]])                     # a duplicated row: singular without noise
    y = torch.cat([y, y[:1]])
    model = gpvi.GPRegression(X, y, max_jitter=1e-16, jitter=1e-17)   # below the pivot floor N eps
    good = model.initial_theta()
    bad = good.clone()
    bad[-1] = -200.0                              # noise variance e^-200: K singular beyond the jitter allowed
    v, g = model.log_joint_and_grad(torch.stack([good, bad]))
    assert torch.isfinite(v[0]) and v[1] == -float("inf")
    assert torch.equal(g[1], torch.zeros_like(g[1])) and torch.isfinite(g[0]).all()
    with pytest.raises(NotPSDError):
        model.log_joint(bad)


def test_second_derivatives_are_refused_not_wrong():
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.MaternKernel(nu=1.5)))
    t = model.initial_theta().requires_grad_(True)
    with pytest.raises(NotImplementedError, match="second derivatives"):
        torch.autograd.grad(model.log_joint(t), t, create_graph=True)


def test_from_model_follows_data_dtype_and_device():
    X, y = _data()
    model = gpvi.GPRegression(X, y)
    lean = LeanLogJoint.from_model(model)
    v, g = lean.log_joint(model.initial_theta().unsqueeze(0))
    assert v.dtype == g.dtype == torch.float64 and v.device == X.device


def test_closed_form_priors_are_float64():
    """Named and registered priors' density and score in closed form against float64 torch distributions (GPyTorch's
    HalfNormal / HalfCauchy priors keep a float32 base distribution, so their own log_prob rounds to float32; the
    closed form does not)."""
    D = torch.distributions
    X, y = _data()
    f64 = {"dtype": torch.float64}
    named = {"lengthscale": D.HalfNormal(torch.tensor(2.0, **f64)), "signal_sd": D.HalfCauchy(torch.tensor(1.0, **f64)),
             "noise_var": D.InverseGamma(torch.tensor(3.0, **f64), torch.tensor(0.5, **f64))}
    for prior in (named, {"lengthscale": D.LogNormal(torch.tensor(0.0, **f64), torch.tensor(1.0, **f64)),
                          "signal_var": D.Gamma(torch.tensor(2.0, **f64), torch.tensor(1.0, **f64)),
                          "noise_sd": D.Exponential(torch.tensor(3.0, **f64))}):
        model = gpvi.GPRegression(X, y, kernel=gp.kernels.ScaleKernel(gp.kernels.RBFKernel(ard_num_dims=D_IN)),
                                  prior=prior)
        g = torch.Generator().manual_seed(2)
        theta = model.initial_theta() + 0.5 * torch.randn(6, model.dim, generator=g, dtype=torch.float64)
        t = theta.clone().requires_grad_(True)
        v_ref = model.prior.log_prob(t)
        (g_ref,) = torch.autograd.grad(v_ref.sum(), t)
        v, grad = model.prior.log_prob_and_grad(theta)
        assert torch.allclose(v, v_ref.detach(), rtol=1e-12, atol=1e-12)
        assert torch.allclose(grad, g_ref, rtol=1e-12, atol=1e-12)


def test_non_finite_rows_get_minus_inf_and_zero_gradient_on_every_path():
    X, y = _data()
    for kernel in (None, gp.kernels.ScaleKernel(gp.kernels.PeriodicKernel())):      # closed form; GPyTorch's path
        model = gpvi.GPRegression(X, y, kernel=kernel)
        good = model.initial_theta()
        bad = torch.full_like(good, float("nan"))
        for theta in (torch.stack([good, bad]), bad.unsqueeze(0)):
            v, g = model.log_joint_and_grad(theta)
            assert v[-1] == -float("inf") and torch.equal(g[-1], torch.zeros_like(g[-1]))
        with pytest.raises(ValueError, match="theta must have shape"):
            model.log_joint_and_grad(good)


@pytest.mark.parametrize("extra", ["plain", "lik_mean"])
@pytest.mark.parametrize("name", ["rbf_ard", "m52_ard", "sum_fixed_const", "prior_ls"])
def test_a_row_does_not_depend_on_the_other_rows(name, extra):
    """The sampler keeps chain c at row c of a batch of num_chains rows and relies on each row's bits depending on
    that row alone (gpvi.inference.mcmc.chains): other rows changed, one of them failing, one not finite."""
    X, y = _data()
    X, y = torch.cat([X, X[:1]]), torch.cat([y, y[:1]])      # a duplicated row: singular without noise
    model = gpvi.GPRegression(X, y, kernel=_kernels()[name], **_extras()[extra], jitter=1e-17, max_jitter=1e-16)
    lean = model.closed_form
    assert lean is not None
    g = torch.Generator().manual_seed(5)
    theta = model.initial_theta() + 0.5 * torch.randn(4, model.dim, generator=g, dtype=torch.float64)
    v, grad = lean.log_joint(theta)
    singular = torch.zeros(3, model.dim)                       # gpvi's noise variance e^-200: K singular
    noise = [j for j, n in enumerate(model.names) if n == "log_noise_var"]
    singular[:, noise] = -200.0
    for other in (0.5 * torch.randn(3, model.dim, generator=g, dtype=torch.float64), torch.full((3, model.dim), 30.0),
                  singular):
        th = theta.clone()
        th[1:] = model.initial_theta() + other
        v2, g2 = lean.log_joint(th)
        assert torch.equal(v2[0], v[0]) and torch.equal(g2[0], grad[0])
        if other is singular and noise:                      # beyond the jitter allowed: those rows fail
            assert bool((v2[1:] == -float("inf")).all())


@pytest.mark.parametrize("extra", ["plain", "lik_mean"])
@pytest.mark.parametrize("name", ["rbf_ard", "sum_fixed_const"])
@pytest.mark.parametrize("offset", [0, 1])
def test_both_solves_match_gpytorch(name, extra, offset):
    """Up to TRIANGULAR_MAX_N points K^-1 and alpha come from one triangular solve and one product, beyond from
    cholesky_inverse and cholesky_solve: both against GPyTorch, on two successive batches (the right-hand side
    [I | y] is kept between calls; with a mean its y column changes), and the value alone equals the value with the
    gradient. rbf_ard without a mean is the default model's shortcut (gradient chained to theta directly)."""
    from gpvi.models.lean_joint import TRIANGULAR_MAX_N
    X, y = _data(TRIANGULAR_MAX_N + offset)
    model = gpvi.GPRegression(X, y, kernel=_kernels()[name], **_extras()[extra])
    lean = model.closed_form
    assert lean._plain_rbf == (name == "rbf_ard" and extra == "plain")
    g = torch.Generator().manual_seed(4)
    for _ in range(2):
        theta = model.initial_theta() + 0.4 * torch.randn(3, model.dim, generator=g, dtype=torch.float64)
        v_ref, g_ref = _reference(model, theta)
        v, grad = lean.log_joint(theta)
        assert torch.allclose(v, v_ref, rtol=1e-10, atol=1e-10 * float(v_ref.abs().max()))
        assert torch.allclose(grad, g_ref, rtol=1e-10, atol=1e-10 * float(g_ref.abs().max()))
        v0, none = lean.log_joint(theta, grad=False)
        assert none is None and torch.allclose(v0, v, rtol=1e-12, atol=0)


def test_a_large_batch_takes_potri_and_agrees():
    """Beyond TRIANGULAR_MAX_BATCH thetas the batch is solved by cholesky_inverse (bounded memory): same numbers to
    rounding as the same thetas in small batches."""
    from gpvi.models.lean_joint import TRIANGULAR_MAX_BATCH
    X, y = _data()
    model = gpvi.GPRegression(X, y, kernel=_kernels()["sum_fixed_const"], **_extras()["lik_mean"])
    lean = model.closed_form
    g = torch.Generator().manual_seed(6)
    theta = model.initial_theta() + 0.3 * torch.randn(TRIANGULAR_MAX_BATCH + 1, model.dim, generator=g,
                                                      dtype=torch.float64)
    v, grad = lean.log_joint(theta)
    v2, g2 = zip(*(lean.log_joint(t) for t in theta.split(8)))
    v2, g2 = torch.cat(v2), torch.cat(g2)
    assert torch.allclose(v, v2, rtol=1e-12, atol=0)
    assert torch.allclose(grad, g2, rtol=1e-10, atol=1e-10 * float(g2.abs().max()))
    assert max(lean._rhs) <= TRIANGULAR_MAX_BATCH


@pytest.mark.parametrize("extra", ["plain", "lik_mean"])
@pytest.mark.parametrize("name", ["rbf_ard", "rbf_iso", "m52_ard", "rq_iso", "sum_fixed_const", "sum_mixed"])
def test_chunks_and_kept_buffers_give_the_same_numbers(name, extra, monkeypatch):
    """On the CPU beyond TRIANGULAR_MAX_N points, with expanded distances, the log marginal of a batch is evaluated
    in chunks of CHUNK_BYTES, into buffers kept between calls (gpvi.models.lean_joint._buffers): every value equals,
    bit for bit, a one-pass evaluation of the whole batch into fresh tensors, and every gradient to rounding (its
    contraction is a matrix product whose blocking may follow the batch), with and without the gradient, including
    a member that fails (-inf, zero gradient) and a batch that raises."""
    import gpvi.models.lean_joint as lj
    import gpvi.models.lean_terms as lean_terms
    X, y = _data(90)
    X, y = torch.cat([X, X[:1]]), torch.cat([y, y[:1]])      # a duplicated row: singular without noise
    monkeypatch.setattr(lean_terms, "PRECOMPUTED_MAX_ELEMENTS", 0)          # expanded distances at 91 points
    monkeypatch.setattr(lj, "CHUNK_BYTES", 3 * 91 * 91 * 8)                 # chunks of 3
    monkeypatch.setattr(lj, "WORKSPACE_MIN_BYTES", 1)                        # buffers at every batch size
    model = gpvi.GPRegression(X, y, kernel=_kernels()[name], **_extras()[extra], jitter=1e-17, max_jitter=1e-16)
    lean = model.closed_form
    chunked = lj.LeanLogJoint.from_model(model)
    assert chunked._chunk == 3 and lean._chunk == 3
    g = torch.Generator().manual_seed(8)
    theta = model.initial_theta() + 0.4 * torch.randn(11, model.dim, generator=g, dtype=torch.float64)
    noise = [j for j, n in enumerate(model.names) if n == "log_noise_var"]
    if noise:
        theta[4, noise] = -200.0                                           # beyond the jitter allowed
    got = [chunked.log_joint(theta), chunked.log_joint(theta, grad=False), chunked.log_marginal(theta)]
    monkeypatch.setattr(lj, "_buffers", lambda *args: None)
    lean._chunk = None
    want = [lean.log_joint(theta), lean.log_joint(theta, grad=False), lean.log_marginal(theta)]
    for (v, gr), (v0, g0) in zip(got, want):
        assert torch.equal(v, v0)
        assert gr is None and g0 is None or torch.allclose(gr, g0, rtol=1e-12, atol=1e-12 * float(g0.abs().max()))
    if noise:
        assert v[4] == -float("inf") and bool((got[0][1][4] == 0).all())
        with pytest.raises(NotPSDError):
            chunked.log_joint(theta[3:6], raise_on_failure=True)


def test_kept_buffers_are_not_returned_and_follow_the_batch(monkeypatch):
    """Results never alias the kept buffers: a second call leaves the first call's numbers as they were; a larger
    batch replaces the buffers; below WORKSPACE_MIN_BYTES, beyond WORKSPACE_MAX_BYTES or off the CPU nothing is
    kept."""
    import gpvi.models.lean_joint as lj
    assert lj._buffers(1, 80, torch.zeros(1, dtype=torch.float64)) is None           # 50 kB: fresh tensors
    monkeypatch.setattr(lj, "WORKSPACE_MIN_BYTES", 1)
    X, y = _data(80)
    model = gpvi.GPRegression(X, y)
    lean = model.closed_form
    g = torch.Generator().manual_seed(9)
    a = model.initial_theta() + 0.3 * torch.randn(2, model.dim, generator=g, dtype=torch.float64)
    va, ga = lean.log_joint(a)
    keep = va.clone(), ga.clone()
    lean.log_joint(a + 0.5)
    assert torch.equal(va, keep[0]) and torch.equal(ga, keep[1])
    K, L, G = lj._buffers(5, 80, a)
    assert K.shape == (5, 80, 80) and K.is_contiguous() and L.mT.is_contiguous() and G.mT.is_contiguous()
    assert lj._buffers(lj.WORKSPACE_MAX_BYTES // (3 * 8 * 80 * 80) + 1, 80, a) is None
    assert lj._buffers(1, 80, torch.zeros(1, dtype=torch.float64, device="meta")) is None


def test_kept_buffers_keep_the_bits_of_small_problems(monkeypatch):
    """Up to TRIANGULAR_MAX_N points nothing is chunked and the kept buffers change no bit: a large batch (as an
    engine's draws) and a sampler's 4 rows, against fresh tensors (precomputed distances, the default model and a
    Matern sum with a mean)."""
    import gpvi.models.lean_joint as lj
    monkeypatch.setattr(lj, "WORKSPACE_MIN_BYTES", 1)                        # buffers at every batch size
    X, y = _data(40)
    for kernel, extra in ((None, {}), (_kernels()["sum_fixed_const"], _extras()["lik_mean"])):
        model = gpvi.GPRegression(X, y, **({"kernel": kernel} if kernel is not None else {}), **extra)
        lean = model.closed_form
        assert lean._chunk is None
        g = torch.Generator().manual_seed(10)
        for s in (4, 300):
            theta = model.initial_theta() + 0.4 * torch.randn(s, model.dim, generator=g, dtype=torch.float64)
            got = lean.log_joint(theta), lean.log_joint(theta, grad=False)
            with monkeypatch.context() as m:
                m.setattr(lj, "_buffers", lambda *args: None)
                want = lean.log_joint(theta), lean.log_joint(theta, grad=False)
            assert torch.equal(got[0][0], want[0][0]) and torch.equal(got[0][1], want[0][1])
            assert torch.equal(got[1][0], want[1][0])


def test_a_theta_that_requires_grad_takes_fresh_tensors(monkeypatch):
    """The kept buffers are written with out=, which autograd refuses: a theta that requires grad (a direct call
    under grad mode) is evaluated into fresh tensors, with the same numbers."""
    import gpvi.models.lean_joint as lj
    monkeypatch.setattr(lj, "WORKSPACE_MIN_BYTES", 1)                        # buffers at every batch size
    X, y = _data(80)
    lean = gpvi.GPRegression(X, y).closed_form
    theta = gpvi.GPRegression(X, y).initial_theta().expand(3, -1).clone()
    v, g = lean.log_joint(theta)
    v2, g2 = lean.log_joint(theta.clone().requires_grad_(True))
    assert torch.equal(v, v2.detach()) and torch.equal(g, g2.detach())
