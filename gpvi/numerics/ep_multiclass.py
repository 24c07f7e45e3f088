r"""Expectation propagation for multi-class GP classification (softmax): :math:`\log Z_{EP}(\theta)` and its gradient.

K latent GPs :math:`\mathbf f_k \sim \mathcal N(0, K_\theta)` (one shared kernel; the stacked vector
:math:`F = (\mathbf f_1, \dots, \mathbf f_K)`, class-major, has the prior :math:`\mathcal N(0, I_K\otimes K_\theta)`)
and the softmax likelihood :math:`\prod_n p(y_n\mid\mathbf f_n)`. EP replaces each factor by a Gaussian site in the
K values of its data point, :math:`\tilde t_n(\mathbf f_n)\propto\exp(\tilde{\boldsymbol\nu}_n^\top\mathbf f_n -
\tfrac12\mathbf f_n^\top\tilde\Pi_n\mathbf f_n)` with a full :math:`K\times K` precision :math:`\tilde\Pi_n\succeq 0`
(the sites couple the classes of a point, unlike the class-factorised CVI family), and matches the moments of the
tilted distributions :math:`\hat p_n(\mathbf f_n)\propto p(y_n\mid\mathbf f_n)\,\mathcal N(\mathbf f_n\mid
\mathbf m_{-n}, C_{-n})` (Minka 2001; for the multinomial probit, Riihimäki, Jylänki & Vehtari 2013, who also
write the multi-class EP evidence). Every step is dense in the :math:`N(K-1)` reduced values
(:math:`O((N(K-1))^3)` per sweep: fine for the benchmark sets, N K of a few hundred; reduced coordinates below).
Sites factorised over the classes would cost :math:`O(KN^3)`, but their evidence is biased in the signal variance: on iris at the NUTS posterior mean it fell
2.0 to 4.8 nats below this one's as the log signal variance went from -2 to +2 NUTS sd, moving its peak half an sd
down, and it took more sweeps (``benchmarks/studies/results/multiclass_ep_sites.md``).

**Tilted moments.** The softmax depends on :math:`\mathbf f_n` only through the :math:`K - 1` differences
:math:`\mathbf d = A\mathbf f_n` (:math:`d_j = f_j - f_y`): :math:`\log p(y\mid\mathbf f) = -\log(1 + \sum_j
e^{d_j})`. Under the cavity, :math:`\mathbf d\sim\mathcal N(A\mathbf m_{-n}, AC_{-n}A^\top)`; the normaliser
:math:`\hat Z_n` and the tilted mean and covariance of :math:`\mathbf d` come from the nested quadrature of
:func:`gpvi.numerics.softmax_rules.nested_nodes` (:math:`Q^{K-1}` nodes, so :math:`K\le 3` by default), and those of
:math:`\mathbf f_n` follow exactly, since :math:`\mathbf f_n\mid\mathbf d` is the cavity's Gaussian conditional:
with :math:`G = C_{-n}A^\top(AC_{-n}A^\top)^{-1}`,
:math:`\hat{\mathbf m} = \mathbf m_{-n} + G(\mathbb E[\mathbf d] - A\mathbf m_{-n})`,
:math:`\hat C = C_{-n} - GAC_{-n} + G\,\mathrm{Cov}[\mathbf d]\,G^\top`. The new site is
:math:`\tilde\Pi_n = \hat C^{-1} - C_{-n}^{-1}` (projected onto the positive semidefinite matrices; along the
common mode :math:`\mathbf 1` the tilted equals the cavity, so one eigenvalue is zero),
:math:`\tilde{\boldsymbol\nu}_n = \hat C^{-1}\hat{\mathbf m} - C_{-n}^{-1}\mathbf m_{-n}`.

**Tilted moments for K >= 4** (``num_draws``): the :math:`40^{K-1}` nodes of the nested rule are too many, and the
moments of :math:`\mathbf d` come instead from a fixed quasi-Monte Carlo rule in the K - 1 differences,
importance-weighted, and are lifted to :math:`\mathbf f_n` exactly as above. The proposal is
:math:`\mathcal N(A\boldsymbol\mu_n, AC_{-n}A^\top)`, the cavity's covariance of :math:`\mathbf d` moved to EP's
current posterior mean of the point (close to the tilted mean, where the likelihood's mass is):
:math:`\mathbf d^{(s)} = A\boldsymbol\mu_n + L_d\boldsymbol\varepsilon^{(s)}` (:math:`L_dL_d^\top = AC_{-n}A^\top`),
with the scrambled Sobol' normal points of :func:`gpvi.numerics.softmax_rules.fixed_draws` (dimension K - 1) and
their negatives, each column scaled to unit mean square, and the weights :math:`p(y\mid\mathbf d^{(s)})\,
\mathcal N(\mathbf d^{(s)}\mid A\mathbf m_{-n}, AC_{-n}A^\top) / \mathcal N(\mathbf d^{(s)}\mid A\boldsymbol\mu_n,
AC_{-n}A^\top) = p(y\mid\mathbf d^{(s)})\exp(-\mathbf a^\top\boldsymbol\varepsilon^{(s)} -
\tfrac12\lVert\mathbf a\rVert^2)`, :math:`\mathbf a = L_d^{-1}A(\boldsymbol\mu_n - \mathbf m_{-n})`. The proposal
keeps the cavity's covariance, so the weights stay bounded where the likelihood tends to 1. The same points at every
call: the moments, EP's fixed point and :math:`\log Z_{EP}` stay deterministic functions of :math:`\theta`.

Why the differences: along the common mode the tilted equals the cavity, and a rule in all K values estimates it
there with its Monte Carlo error, so the new site precision :math:`\hat C^{-1} - C_{-n}^{-1}` gets small negative
eigenvalues that the update clips; a clipped site does not match moments, EP's energy is then not stationary in the
sites, and the fixed-point gradient below (which assumes stationarity) is wrong. Such a rule (this module's rule
until 1.0, 2,048 points) clipped 62-90 site eigenvalues at the q(theta) means of the K = 6 and K = 10 benchmark
sets, and its gradient of :math:`\log Z_{EP}` was off by up to 0.80 (per unit log-hyperparameter) from central
differences at K = 10, against 0.22-0.28 for this rule with the same points, which clips none
(``benchmarks/studies/results/multiclass_ep_rule_*.md``). On 200 random sites against the nested rule (diagonal cavities of
variance 0.05..5, means of sd 2; ``multiclass_ep_rule_sites.md``), with 2,048 points: largest error of
:math:`\log\hat Z_n` 1.1e-3 / 3.4e-3 (K = 3 / 4), of the means 4.9e-4 / 2.4e-3 cavity sd, relative error of the
variances 3.4e-3 / 1.1e-2, of the site precisions 6.6e-3 / 3.1e-2 (typical size 0.15; the rule in the K values:
0.18 / 0.18, with 13 / 97 of the 200 sites clipped). What remains is the rule's own error, which sets the number of
points (:data:`NUM_DRAWS`, which says why 2,048): over six other scrambles, the gradient at the q means of the
K = 4 and K = 10 sets is off by a median of 0.15 / 0.33 with 2,048 points (the rule in the K values 0.11 / 0.47)
and 0.04 / 0.22 with 4,096, with a mean of -0.31 / -0.21 in the K = 10 log signal variance (-0.09 at 8,192 points),
at 1.4 / 1.2 times the seconds per sweep for 4,096 (``multiclass_ep_rule_scrambles.md``).

**Posterior and evidence.** With :math:`\tilde\Pi` the block-sparse :math:`NK\times NK` site precision,
:math:`S = \tilde\Pi^{1/2}` (per site, symmetric), :math:`B = I + S(I_K\otimes K_\theta)S` (R&W section 3.6.3's
stable form, no inverse of the prior or of the sites), :math:`\Sigma = (K_F^{-1} + \tilde\Pi)^{-1}`,
:math:`\boldsymbol\mu = \Sigma\tilde{\boldsymbol\nu}`, and the multivariate form of R&W eq. 3.65:

.. math::

    \log Z_{EP} = \sum_n \log\hat Z_n - \tfrac12\log|B| + \tfrac12\tilde{\boldsymbol\nu}^\top\boldsymbol\mu
      + \sum_n\Big[\tfrac12\log\frac{|C_{-n}|}{|\Sigma_{nn}|} - \tfrac12\boldsymbol\mu_n^\top\Sigma_{nn}^{-1}
      \boldsymbol\mu_n + \tfrac12\mathbf m_{-n}^\top C_{-n}^{-1}\mathbf m_{-n}\Big],

(:math:`\Sigma_{nn}` the :math:`K\times K` marginal block of point n). At a fixed point its derivative in the prior
covariance holds the sites fixed (the EP fixed point is stationary in the sites), as in the binary case (R&W eq.
5.27): :math:`\partial\log Z_{EP}/\partial K_F = \tfrac12(\mathbf b\mathbf b^\top - S B^{-1} S)`,
:math:`\mathbf b = \tilde{\boldsymbol\nu} - \tilde\Pi\boldsymbol\mu`, and :math:`\partial/\partial K_\theta` sums its
K diagonal blocks. Tested against finite differences, the binary EP at K = 2 and importance sampling.

**Reduced coordinates.** The softmax is flat along the common mode, so every site has zero precision there (the
tilted equals the cavity along :math:`\mathbf 1`; both rules lift the moments of :math:`\mathbf d` exactly) and
:math:`S_n = UR_nU^\top` with :math:`U` (K x (K - 1)) an orthonormal basis of the complement. With :math:`W =
U\otimes I_N`, :math:`W^\top(I_K\otimes K_\theta)W = I_{K-1}\otimes K_\theta`, hence :math:`|B| = |B'|` and
:math:`SB^{-1}S = W\tilde RB'^{-1}\tilde RW^\top` for :math:`B' = I + \tilde R(I_{K-1}\otimes K_\theta)\tilde R`
of size :math:`N(K-1)`: every factorisation and solve above runs there, :math:`((K-1)/K)^3` of the flops (0.73 at
K = 10; measured per posterior computation in ``benchmarks/studies/results/ep_reduced.md``), to the same numbers up to
rounding.

Names: ``pi`` (N, K, K) and ``nu`` (N, K) the sites; ``damping`` :math:`\delta`: a sweep moves every site to
:math:`(1-\delta)` old + :math:`\delta` new (convex, so the precisions stay positive semidefinite).

**Acceleration.** Damped parallel EP is a fixed-point iteration :math:`x\mapsto G(x) = (1-\delta)x +
\delta F(x)` on the stacked sites :math:`x = (\tilde\Pi, \tilde{\boldsymbol\nu})`, and it converges linearly
and slowly (on the iris benchmark split at :math:`\delta = 0.5`, about 0.8 per sweep: 65 sweeps to 1e-8; undamped,
it oscillates with period 2). ``anderson = m`` applies Anderson acceleration (Walker & Ni 2011, type II) with
memory m: from the last m + 1 residuals :math:`r_i = G(x_i) - x_i`, :math:`\gamma = \arg\min\|r_k -
\Delta R\,\gamma\|` and :math:`x_{k+1} = G(x_k) - \Delta G\,\gamma` (site precisions projected onto the
positive semidefinite matrices). It changes the path, not the fixed point or the stopping rule (the undamped change
:math:`F(x) - x` at the returned sites): 65 -> 23 sweeps there, about 19 from warm starts. Safeguard: when a
sweep at an extrapolated point fails (a cavity not positive definite, a value not finite), EP restarts from the
plain damped step :math:`G(x_k)` with an empty history (counted in ``anderson_restarts``); after 3 restarts it goes on
unaccelerated.
"""

from __future__ import annotations

from typing import NamedTuple

import math

import torch

from ..linalg import cholesky_plain, logdet_from_cholesky
from .anderson import Anderson
from .quadrature import Quadrature
from .softmax_rules import _others, default_quadrature, fixed_draws, log_lik_of_differences, nested_nodes
from ..validation import check_nonnegative_int, check_positive, check_positive_int

__all__ = ["MulticlassEPResult", "multiclass_ep", "tilted_moments", "NUM_DRAWS"]

NUM_DRAWS = 2048
"""Points of the quasi-Monte Carlo rule for K >= 4 (module docstring). 4,096 halves the gradient's error at the q means
of synth4 and synth10 (median 0.15 / 0.33 -> 0.04 / 0.22 over scrambles), but the fully Bayesian fits it drives did
not move: q's largest offset from the long NUTS runs 0.37 -> 0.35 (synth4), 0.09 -> 0.11 (synth6), 0.13 -> 0.14
(synth10), 0.27 -> 0.26 (synth10b), test probabilities' distance from NUTS's by at most 4e-4, for 16-45% more wall
(``benchmarks/studies/results/multiclass_ep_rule_fits_*.md``); so 2,048."""


class MulticlassEPResult(NamedTuple):
    r"""What :func:`multiclass_ep` returns (one kernel matrix)."""

    log_z: torch.Tensor
    """``()`` :math:`\\log Z_{EP}` (``-inf`` when EP failed)."""
    grad_k: torch.Tensor
    """``(N, N)`` :math:`\\partial\\log Z_{EP}/\\partial K_\\theta` at the final sites (zero when EP failed)."""
    pi: torch.Tensor
    """``(N, K, K)`` site precisions."""
    nu: torch.Tensor
    """``(N, K)`` site shifts."""
    mean: torch.Tensor
    """``(N, K)`` posterior means."""
    cov: torch.Tensor
    """``(N, K, K)`` posterior marginal covariances of each point's K values."""
    sweeps: int
    converged: bool
    ok: bool
    anderson_restarts: int = 0
    """Failed Anderson extrapolations, each a restart from the damped step (module docstring)."""


def _psd_sqrt(P: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric square roots of PSD blocks ``(N, K, K)`` and the blocks with negative eigenvalues set to 0."""
    evals, evecs = torch.linalg.eigh(0.5 * (P + P.mT))
    evals = evals.clamp_min(0.0)
    root = (evecs * evals.sqrt().unsqueeze(-2)) @ evecs.mT
    return root, (evecs * evals.unsqueeze(-2)) @ evecs.mT


def _complement(num_classes: int, like: torch.Tensor) -> torch.Tensor:
    r"""``(K, K-1)``: an orthonormal basis :math:`U` of the complement of the common mode :math:`\mathbf 1`."""
    eye = torch.eye(num_classes, dtype=like.dtype, device=like.device)
    return torch.linalg.qr(eye[:, :-1] - 1.0 / num_classes)[0]


def _posterior(K: torch.Tensor, pi: torch.Tensor, nu: torch.Tensor, root: torch.Tensor | None = None):
    r"""From the sites: the factor of B (reduced), the per-point roots of the site precisions in the complement of
    the common mode (N, K-1, K-1), the stacked mean (NK,), the marginal blocks Sigma_nn (N, K, K) and the stacked
    shifts. The site roots are :math:`S_n = UR_nU^\top` (module docstring: every site has zero precision along
    :math:`\mathbf 1`), so :math:`B = I + S(I_K\otimes K)S` has the nonzero part
    :math:`B' = I + \tilde R(I_{K-1}\otimes K)\tilde R`, :math:`B'_{(a,n),(b,m)} = \delta + K_{nm}(R_nR_m)_{ab}`, of
    size :math:`N(K-1)`, with :math:`|B| = |B'|` and :math:`SB^{-1}S = W\tilde RB'^{-1}\tilde RW^\top`
    (:math:`W = U\otimes I_N`); only the diagonal blocks of :math:`\Sigma` are formed."""
    N, C, _ = pi.shape
    U = _complement(C, K)
    Rn = U.mT @ (_psd_sqrt(pi)[0] if root is None else root) @ U          # (N, K-1, K-1)
    c = C - 1
    B = (torch.einsum("nkl,mlj->knjm", Rn, Rn) * K.view(1, N, 1, N)).reshape(c * N, c * N)
    B.diagonal().add_(1.0)
    LB, _ = cholesky_plain(B, raise_on_failure=True)
    RK = torch.einsum("nkj,nm->knjm", Rn, K).reshape(c * N, c * N)       # R (I_{K-1} x K)
    V = torch.linalg.solve_triangular(LB, RK, upper=False)
    nu_f = nu.T.reshape(-1)
    Knu = K @ nu                                                           # (N, K): (I_K x K) nu
    corr = (V.mT @ (V @ (nu @ U).T.reshape(-1))).view(c, N)              # B'^-1 terms in the reduced coordinates
    mu = (Knu - (U @ corr).T).T.reshape(-1)
    V3 = V.view(c * N, c, N)
    Snn = (torch.diag_embed(K.diagonal().unsqueeze(-1).expand(N, C))
           - U @ torch.einsum("rkn,rjn->nkj", V3, V3) @ U.mT)
    return LB, Rn, mu, 0.5 * (Snn + Snn.mT), nu_f


def _differences(y: torch.Tensor, mc: torch.Tensor, Cc: torch.Tensor):
    r"""``(A, mu_d, C A^T, cov_d)``: the difference map :math:`A` ``(N, K-1, K)`` (:math:`d_j = f_j - f_y`) and the
    cavity's mean and covariance of :math:`\mathbf d` (module docstring)."""
    C = mc.shape[1]
    eye = torch.eye(C, dtype=mc.dtype, device=mc.device)
    A = eye[_others(y, C)] - eye[y].unsqueeze(1)                            # (N, K-1, K): d = A f
    mu_d = (A @ mc.unsqueeze(-1)).squeeze(-1)
    CAt = Cc @ A.mT                                                         # (N, K, K-1)
    cov_d = A @ CAt
    return A, mu_d, CAt, 0.5 * (cov_d + cov_d.mT)


def _lift(mc: torch.Tensor, Cc: torch.Tensor, mu_d: torch.Tensor, CAt: torch.Tensor, cov_d: torch.Tensor,
          Ed: torch.Tensor, Cd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The tilted mean and covariance of :math:`\mathbf f` from those of :math:`\mathbf d` (``Ed``, ``Cd``):
    :math:`\mathbf f\mid\mathbf d` is the cavity's Gaussian conditional (module docstring)."""
    G = torch.linalg.solve(cov_d, CAt.mT).mT                                # C A^T (A C A^T)^{-1}, (N, K, K-1)
    m_hat = mc + (G @ (Ed - mu_d).unsqueeze(-1)).squeeze(-1)
    C_hat = Cc - G @ CAt.mT + G @ Cd @ G.mT
    return m_hat, 0.5 * (C_hat + C_hat.mT)


def _tilted(y: torch.Tensor, mc: torch.Tensor, Cc: torch.Tensor, quad: Quadrature):
    """``log Z_hat`` (N,), tilted means (N, K) and covariances (N, K, K) of the softmax sites (module docstring)."""
    A, mu_d, CAt, cov_d = _differences(y, mc, Cc)
    Ld, _ = cholesky_plain(cov_d, raise_on_failure=True)
    d, w = nested_nodes(mu_d, Ld, quad)                                     # (K-1, N, P), (N, P)
    mx = d.amax(0).clamp_min(0.0)
    lp = -(mx + torch.log(torch.exp(-mx) + torch.exp(d - mx).sum(0)))      # log p(y | d) at the nodes
    lw = lp + torch.log(w.clamp_min(0.0))
    log_z = torch.logsumexp(lw, -1)
    om = torch.exp(lw - log_z.unsqueeze(-1))                                # tilted weights (N, P)
    Ed = (d * om).sum(-1).T                                                 # (N, K-1)
    dc = d - Ed.T.unsqueeze(-1)
    Cd = torch.einsum("inp,jnp,np->nij", dc, dc, om)                        # tilted Cov[d] (N, K-1, K-1)
    return (log_z, *_lift(mc, Cc, mu_d, CAt, cov_d, Ed, Cd))


def _qmc_points(num_draws: int, num_classes: int, like: torch.Tensor) -> torch.Tensor:
    """``(2 (num_draws // 2), K)`` antithetic Sobol' normal points, each column scaled to unit mean square."""
    half = fixed_draws(num_draws // 2, num_classes, like)
    pts = torch.cat([half, -half], 0)
    return pts / pts.square().mean(0).sqrt()


_QMC_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _qmc_tables(num_draws: int, dim: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The points :math:`\boldsymbol\varepsilon^{(s)}` of :func:`_qmc_points` in dimension ``dim`` = K - 1, built
    once per (size, dimension, dtype, device): ``eps`` (S, K-1); ``aug`` (K, S), the rows
    :math:`[\boldsymbol\varepsilon^{(s)\top}; 1]` (one product then gives :math:`L_d\boldsymbol\varepsilon + \mathbf c`
    and :math:`\mathbf a^\top\boldsymbol\varepsilon + \tfrac12\lVert\mathbf a\rVert^2`); ``stats`` (S, 1 + (K-1) +
    (K-1)^2), the rows :math:`[1, \boldsymbol\varepsilon^\top, \operatorname{vec}(\boldsymbol\varepsilon
    \boldsymbol\varepsilon^\top)^\top]` (one product of the weights gives their sum and both moments)."""
    key = (num_draws, dim, like.dtype, like.device)
    tables = _QMC_TABLES.get(key)
    if tables is None:
        eps = _qmc_points(num_draws, dim, like)
        one = torch.ones(eps.shape[0], 1, dtype=like.dtype, device=like.device)
        aug = torch.cat([eps, one], 1).T.contiguous()
        stats = torch.cat([one, eps, (eps.unsqueeze(-1) * eps.unsqueeze(-2)).reshape(-1, dim * dim)], 1)
        if len(_QMC_TABLES) > 32:
            _QMC_TABLES.clear()
        tables = _QMC_TABLES[key] = (eps, aug, stats.contiguous())
    return tables


def _tilted_qmc(y: torch.Tensor, mc: torch.Tensor, Cc: torch.Tensor, centre: torch.Tensor, num_draws: int):
    r"""``log Z_hat`` (N,), tilted means (N, K) and covariances (N, K, K) by the shifted quasi-Monte Carlo rule of
    the module docstring, in the K - 1 differences :math:`\mathbf d = A\mathbf f` (proposal
    :math:`\mathcal N(A\,\text{centre}, AC_{-n}A^\top)`). With :math:`\mathbf d = A\,\text{centre} +
    L_d\boldsymbol\varepsilon` only the weighted moments of the points are needed: the tilted mean of
    :math:`\mathbf d` is :math:`A\,\text{centre} + L_d\bar{\boldsymbol\varepsilon}` and its covariance
    :math:`L_d(\overline{\boldsymbol\varepsilon\boldsymbol\varepsilon^\top} - \bar{\boldsymbol\varepsilon}
    \bar{\boldsymbol\varepsilon}^\top)L_d^\top`; those of :math:`\mathbf f` follow exactly, as for the nested
    rule (:func:`_lift`). The log weights are :math:`\log p(y\mid\mathbf d^{(s)}) - \mathbf a^\top
    \boldsymbol\varepsilon^{(s)} - \tfrac12\lVert\mathbf a\rVert^2`, each a pass over (N, S) from products
    with the tables of :func:`_qmc_tables`."""
    N, C = mc.shape
    A, mu_d, CAt, cov_d = _differences(y, mc, Cc)
    Ld, _ = cholesky_plain(cov_d, raise_on_failure=True)
    cd = (A @ centre.unsqueeze(-1)).squeeze(-1)                            # the proposal's centre in d, (N, K-1)
    eps, aug, stats = _qmc_tables(num_draws, C - 1, mc)                    # (S, K-1), (K, S), (S, 1 + ...)
    S = eps.shape[0]
    a = torch.linalg.solve_triangular(Ld, (cd - mu_d).unsqueeze(-1), upper=False).squeeze(-1)    # (N, K-1)
    Lc = torch.cat([Ld, cd.unsqueeze(-1)], -1).reshape(N * (C - 1), C)
    lp = log_lik_of_differences((Lc @ aug).view(N, C - 1, S))               # D = L_d eps + cd, (N, K-1, S)
    if lp is None:                                                          # a sum overflowed: the shifted form
        lp = log_lik_of_differences((Lc @ aug).view(N, C - 1, S), stable=True)
    a_aug = torch.cat([a, 0.5 * a.square().sum(-1, keepdim=True)], -1)   # (N, K)
    lp = torch.addmm(lp, a_aug, aug, alpha=-1.0)                            # importance weights, log (N, S)
    top = lp.amax(-1, keepdim=True)
    om = lp.sub_(top).exp_()
    mom = om @ stats                                                        # sums: weights, eps, eps eps^T
    tot = mom[:, :1]
    log_z = (top + torch.log(tot)).squeeze(-1) - math.log(S)
    e1 = mom[:, 1:C] / tot                                                  # (N, K-1)
    e2 = (mom[:, C:] / tot).view(N, C - 1, C - 1)
    Ed = cd + (Ld @ e1.unsqueeze(-1)).squeeze(-1)
    Cd = Ld @ (e2 - e1.unsqueeze(-1) * e1.unsqueeze(-2)) @ Ld.mT
    return (log_z, *_lift(mc, Cc, mu_d, CAt, cov_d, Ed, 0.5 * (Cd + Cd.mT)))


class _Sweep(NamedTuple):
    """Everything one set of sites determines: the posterior, the cavities and the tilted moments."""

    LB: torch.Tensor
    Rn: torch.Tensor
    mu: torch.Tensor
    nu_f: torch.Tensor
    mun: torch.Tensor
    Snn: torch.Tensor
    Pnn: torch.Tensor
    lam_c: torch.Tensor
    eta_c: torch.Tensor
    mc: torch.Tensor
    logdet_ratio: torch.Tensor
    r"""``(N,)`` :math:`\log|C_{-n}| - \log|\Sigma_{nn}|`."""
    log_z_hat: torch.Tensor
    m_hat: torch.Tensor
    C_hat: torch.Tensor


def _sweep(K: torch.Tensor, y: torch.Tensor, pi: torch.Tensor, nu: torch.Tensor, quad: Quadrature | int,
           root: torch.Tensor | None = None) -> _Sweep:
    """Posterior, cavities (from the K x K marginal blocks) and tilted moments at the sites ``pi``, ``nu``
    (``root``: the blocks' symmetric square roots where known, :func:`_psd_sqrt`)."""
    N, C, _ = pi.shape
    LB, Rn, mu, Snn, nu_f = _posterior(K, pi, nu, root)
    mun = mu.view(C, N).T
    Ls, _ = cholesky_plain(Snn, raise_on_failure=True)
    Pnn = torch.cholesky_inverse(Ls)
    lam_c = Pnn - pi
    eta_c = (Pnn @ mun.unsqueeze(-1)).squeeze(-1) - nu
    Lc, _ = cholesky_plain(0.5 * (lam_c + lam_c.mT), raise_on_failure=True)  # raises when a cavity is not PD
    Cc = torch.cholesky_inverse(Lc)
    mc = (Cc @ eta_c.unsqueeze(-1)).squeeze(-1)
    if isinstance(quad, Quadrature):
        log_z_hat, m_hat, C_hat = _tilted(y, mc, Cc, quad)
    else:                                                                  # K >= 4: the shifted QMC rule
        log_z_hat, m_hat, C_hat = _tilted_qmc(y, mc, Cc, mun, quad)
    logdet_ratio = -logdet_from_cholesky(Lc) - logdet_from_cholesky(Ls)
    return _Sweep(LB, Rn, mu, nu_f, mun, Snn, Pnn, lam_c, eta_c, mc, logdet_ratio, log_z_hat, m_hat, C_hat)


def _new_sites(st: _Sweep) -> tuple[torch.Tensor, torch.Tensor]:
    """The undamped EP update F(x): sites that match the tilted moments of :func:`_sweep`'s state."""
    P_hat = torch.cholesky_inverse(cholesky_plain(st.C_hat, raise_on_failure=True)[0])
    pi_new = _psd_sqrt(P_hat - st.lam_c)[1]
    nu_new = (P_hat @ st.m_hat.unsqueeze(-1)).squeeze(-1) - st.eta_c
    if not (bool(torch.isfinite(pi_new).all()) and bool(torch.isfinite(nu_new).all())):
        raise torch.linalg.LinAlgError("EP: non-finite site update")
    return pi_new, nu_new


def _restart(acc: Anderson, restarts: int) -> tuple[int, Anderson | None]:
    """A failed extrapolation: empty the history; after the third, no more acceleration."""
    if restarts + 1 >= 3:
        return restarts + 1, None
    acc.clear()
    return restarts + 1, acc


def multiclass_ep(K: torch.Tensor, y: torch.Tensor, num_classes: int, *,
                  quadrature: Quadrature | str | None = None, num_draws: int = NUM_DRAWS, damping: float = 0.5,
                  anderson: int = 5, tol: float = 1e-8, max_sweeps: int = 200, pi: torch.Tensor | None = None,
                  nu: torch.Tensor | None = None) -> MulticlassEPResult:
    r"""Parallel, damped EP for the softmax likelihood with K latent GPs sharing ``K`` (module docstring).

    Parameters
    ----------
    K : torch.Tensor of shape (N, N)
        The shared prior covariance :math:`K_\theta` (float64; everything created follows its device and dtype).
    y : torch.Tensor of shape (N,)
        Class indices in ``0 .. num_classes - 1``.
    num_classes : int
        K >= 2.
    quadrature : Quadrature or "qmc", optional
        The 1-D rule of the nested quadrature, or ``"qmc"``: the shifted quasi-Monte Carlo rule of the module
        docstring. Default: :func:`~gpvi.numerics.softmax_rules.default_quadrature` for K <= 3 (:math:`40^{K-1}`
        nodes per point), ``"qmc"`` for K >= 4.
    num_draws : int
        Points of the quasi-Monte Carlo rule (K >= 4 without ``quadrature``; antithetic pairs, default
        :data:`NUM_DRAWS`, 2,048).
    damping : float in (0, 1]
        :math:`\delta` (default 0.5).
    anderson : int
        Memory of the Anderson acceleration (default 5; 0: the plain damped iteration). Same fixed point and
        stopping rule (module docstring).
    tol : float
        EP stops when the largest undamped site change (relative, as in
        :func:`gpvi.numerics.ep.expectation_propagation`) falls below ``tol`` (default 1e-8).
    max_sweeps : int
        Cap on the sweeps (default 200; ``converged`` is False when reached).
    pi, nu : torch.Tensor of shapes (N, K, K), (N, K), optional
        Starting sites (default zero: the prior), e.g. those of an earlier run (a warm start).

    Returns
    -------
    MulticlassEPResult
        ``ok`` is False (``log_z`` ``-inf``, zero gradient) when a factorisation failed or a value was not finite.

    Examples
    --------
    >>> import torch
    >>> X = torch.linspace(-2, 2, 12, dtype=torch.float64)
    >>> K = torch.exp(-0.5 * (X[:, None] - X[None, :]) ** 2)
    >>> y = (X > -0.7).long() + (X > 0.7).long()
    >>> res = multiclass_ep(K, y, 3)
    >>> res.converged, bool(res.log_z < 0), tuple(res.grad_k.shape)
    (True, True, (12, 12))
    """
    if not isinstance(K, torch.Tensor) or K.dim() != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be a tensor of shape (N, N); got {getattr(K, 'shape', type(K))}")
    N = K.shape[0]
    C = check_positive_int(num_classes, "num_classes", minimum=2)
    y = torch.as_tensor(y, device=K.device)
    if y.shape != (N,) or y.dtype.is_floating_point or bool(((y < 0) | (y >= C)).any()):
        raise ValueError(f"y must hold ({N},) integer class indices in 0..{C - 1}; got shape {tuple(y.shape)}, "
                         f"dtype {y.dtype}")
    y = y.long()
    damping = check_positive(damping, "damping")
    if damping > 1.0:
        raise ValueError(f"damping must be in (0, 1]; got {damping!r}")
    tol = check_positive(tol, "tol")
    max_sweeps = check_positive_int(max_sweeps, "max_sweeps")
    anderson = check_nonnegative_int(anderson, "anderson")
    num_draws = check_positive_int(num_draws, "num_draws", minimum=2)
    if quadrature is None:
        quadrature = default_quadrature(C) if C <= 3 else "qmc"
    if not (isinstance(quadrature, Quadrature) or quadrature == "qmc"):
        raise ValueError(f"quadrature must be a Quadrature or 'qmc'; got {quadrature!r}")
    quad: Quadrature | int = quadrature if isinstance(quadrature, Quadrature) else num_draws
    pi = (torch.zeros(N, C, C, dtype=K.dtype, device=K.device) if pi is None
          else torch.as_tensor(pi, dtype=K.dtype, device=K.device).clone())
    nu = (torch.zeros(N, C, dtype=K.dtype, device=K.device) if nu is None
          else torch.as_tensor(nu, dtype=K.dtype, device=K.device).clone())
    if pi.shape != (N, C, C) or nu.shape != (N, C):
        raise ValueError(f"pi and nu must have shapes ({N}, {C}, {C}) and ({N}, {C}); got {tuple(pi.shape)}, "
                         f"{tuple(nu.shape)}")
    sweeps, converged, anderson_restarts = 0, False, 0
    fail = MulticlassEPResult(torch.tensor(-float("inf"), dtype=K.dtype, device=K.device), torch.zeros_like(K), pi,
                              nu, torch.zeros_like(nu), torch.zeros_like(pi), 0, False, False)
    acc = Anderson(anderson) if anderson > 0 else None
    fallback: tuple[torch.Tensor, torch.Tensor] | None = None             # G(x_k) when x_{k+1} was extrapolated
    n_pi = pi.numel()
    try:
        with torch.no_grad():
            st, root = None, None                                          # root: pi's block roots where known
            for sweeps in range(1, max_sweeps + 1):
                try:
                    st = _sweep(K, y, pi, nu, quad, root)
                    pi_new, nu_new = _new_sites(st)
                except torch.linalg.LinAlgError:
                    if fallback is None:                                   # a plain damped point failed: EP fails
                        raise
                    (pi, nu), fallback, st, root = fallback, None, None, None   # restart from the damped step
                    anderson_restarts, acc = _restart(acc, anderson_restarts)
                    continue
                change = max(float(((pi_new - pi).abs() / (1.0 + pi.abs())).max()),
                             float(((nu_new - nu).abs() / (1.0 + nu.abs())).max()))
                if change <= tol:
                    converged = True
                    break
                pi_g = (1.0 - damping) * pi + damping * pi_new
                nu_g = (1.0 - damping) * nu + damping * nu_new
                st, fallback, root = None, None, None                      # the sites move
                if acc is not None:
                    x = acc.step(torch.cat([pi.reshape(-1), nu.reshape(-1)]),
                                 torch.cat([pi_g.reshape(-1), nu_g.reshape(-1)]))
                    if bool(torch.isfinite(x).all()):
                        (root, pi), nu = _psd_sqrt(x[:n_pi].view_as(pi)), x[n_pi:].view_as(nu)
                        fallback = (pi_g, nu_g)
                        continue
                    anderson_restarts, acc = _restart(acc, anderson_restarts)
                pi, nu = pi_g, nu_g
            if st is None:                                                 # not converged: the final sites' state
                st = _sweep(K, y, pi, nu, quad)
            log_z = (st.log_z_hat.sum() - torch.log(st.LB.diagonal()).sum() + 0.5 * (st.nu_f @ st.mu)
                     + 0.5 * st.logdet_ratio.sum()
                     - 0.5 * (st.mun.unsqueeze(-2) @ st.Pnn @ st.mun.unsqueeze(-1)).sum()
                     + 0.5 * (st.mc * st.eta_c).sum())
            # the K diagonal class blocks of 1/2 (b b^T - S B^-1 S), summed; S B^-1 S = W R B'^-1 R W^T and U^T U = I,
            # so the sum is sum_k (R B'^-1 R)_{(k,n),(k,m)} over the K - 1 reduced coordinates, with R block diagonal
            # over the points: sum_{a,c} R_n[k,a] (B'^-1)_{(a,n),(c,m)} R_m[c,k], O(K^3 N^2), not two (NK)^3 products
            bk = (st.nu_f - (pi @ st.mun.unsqueeze(-1)).squeeze(-1).T.reshape(-1)).view(C, N)
            Binv = torch.cholesky_inverse(st.LB).view(C - 1, N, C - 1, N)       # reduced (see _posterior)
            R = torch.einsum("knbm,mbk->nm", torch.einsum("nka,anbm->knbm", st.Rn, Binv), st.Rn)
            grad_k = 0.5 * (bk.T @ bk - R)
    except torch.linalg.LinAlgError:
        return fail._replace(sweeps=sweeps, anderson_restarts=anderson_restarts)
    ok = bool(torch.isfinite(log_z)) and bool(torch.isfinite(grad_k).all())
    if not ok:
        return fail._replace(sweeps=sweeps, anderson_restarts=anderson_restarts)
    return MulticlassEPResult(log_z, grad_k, pi, nu, st.mun, st.Snn, sweeps, converged, True, anderson_restarts)


def tilted_moments(y: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor, quadrature: Quadrature | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``log Z_hat``, mean and covariance of :math:`p(y\\mid\\mathbf f)\\,\\mathcal N(\\mathbf f\\mid\\text{mean},
    \\text{cov})` for each row (softmax; ``mean`` (N, K), ``cov`` (N, K, K)): the moments EP matches."""
    quad = quadrature if quadrature is not None else default_quadrature(mean.shape[1])
    return _tilted(torch.as_tensor(y, device=mean.device).long(), mean, cov, quad)
