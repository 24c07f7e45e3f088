r"""The deterministic rules behind the softmax expectations of :mod:`gpvi.models.multiclass`.

* :func:`nested_nodes`: the iterated (conditional) quadrature over the K - 1 differences :math:`d_j = f_j - f_y`,
  :math:`Q^{K-1}` nodes per site;
* :func:`two_level_moments`: the same rule for K <= 3, summed level by level (no grid of probabilities);
* :func:`default_quadrature`: the 1-D rule per dimension;
* :func:`fixed_draws`: the fixed quasi-Monte Carlo points of ``method="fixed"`` (K > 3);
* :func:`log_lik_of_differences`: the softmax log likelihood from the K - 1 differences, at many points;
* ``_workspace``: the reused scratch buffer of the no-autograd averages.

The likelihoods that use them (:class:`~gpvi.models.multiclass_likelihoods.Softmax`) live in :mod:`gpvi.models.multiclass_likelihoods`.
"""

from __future__ import annotations

import threading

import torch

from ..validation import check_positive_int
from .quadrature import Quadrature

__all__ = ["nested_nodes", "two_level_moments", "default_quadrature", "fixed_draws", "log_lik_of_differences",
           "FIXED_DRAWS_SEED"]

FIXED_DRAWS_SEED = 20170417
"""Scramble seed of the fixed Sobol' points of ``method="fixed"`` (common random numbers: a deterministic bound)."""



def _others(y: torch.Tensor, K: int) -> torch.Tensor:
    """(N, K-1) indices of the classes other than ``y`` (ascending)."""
    ar = torch.arange(K, device=y.device)
    return ar.expand(y.shape[0], K)[ar.unsqueeze(0) != y.unsqueeze(-1)].view(y.shape[0], K - 1)


def nested_nodes(mu: torch.Tensor, Lc: torch.Tensor, quadrature: Quadrature, *, centre_on_lse: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Nodes and weights for :math:`\mathbb E_{\mathcal N(\boldsymbol\mu, L L^\top)}[g(\mathbf d)]`, iterated over conditionals.

    :math:`\mathbf d = \boldsymbol\mu + L\mathbf z`: :math:`d_i \mid d_{<i} \sim \mathcal N(\mu_i + \sum_{j<i} L_{ij} z_j, L_{ii}^2)`,
    each integrated with the 1-D rule ``quadrature`` (Q nodes), so :math:`Q^D` nodes per batch member. With
    ``centre_on_lse`` the rule for :math:`d_i` is centred (its asinh map dense) at
    :math:`c_i = \log(1 + \sum_{j<i} e^{d_j})`, where :math:`\log(1 + \sum_{j\le i} e^{d_j}) = c_i +
    \operatorname{softplus}(d_i - c_i)` bends: each level then integrates a logit-like function.

    Parameters
    ----------
    mu : torch.Tensor of shape (B, D)
    Lc : torch.Tensor of shape (B, D, D)
        Lower Cholesky factors of the covariances.
    quadrature : Quadrature

    Returns
    -------
    d : torch.Tensor of shape (D, B, Q^D)
        The nodes, dimension-major (contiguous per dimension: the moments reduce over D elementwise).
    w : torch.Tensor of shape (B, Q^D)
    """
    B, D = mu.shape
    Z: list[torch.Tensor] = []                                                   # standardised z_j, each (B, P)
    Dn: list[torch.Tensor] = []                                                  # nodes d_j, each (B, P)
    w = mu.new_ones(B, 1)
    for i in range(D):
        P = w.shape[1]
        cm = mu[:, i:i + 1] + ((torch.stack(Z, -1) * Lc[:, i, :i].unsqueeze(1)).sum(-1) if i else 0.0)  # (B, P)
        sd = Lc[:, i, i].unsqueeze(-1).expand(B, P)
        # the softmax bends where d_i = log(1 + sum_{j<i} exp(d_j)): centre the 1-D rule there
        if centre_on_lse:
            c = torch.nn.functional.pad(torch.stack(Dn, -1) if i else mu.new_zeros(B, P, 0), (1, 0)).logsumexp(-1)
        else:
            c = torch.zeros_like(cm)
        f, wi = quadrature.nodes((cm - c).reshape(-1), (sd * sd).reshape(-1))   # (B P, Q)
        f = f + c.reshape(-1, 1)
        Q = f.shape[-1]
        if i + 1 < D:                                                           # z_i feeds the later levels only
            sd_safe = torch.where(sd > 0, sd, torch.ones_like(sd)).reshape(-1, 1)
            zi = (f - cm.reshape(-1, 1)) / sd_safe
            Z = [z.unsqueeze(-1).expand(B, P, Q).reshape(B, P * Q) for z in Z] + [zi.view(B, P * Q)]
        Dn = [x.unsqueeze(-1).expand(B, P, Q).reshape(B, P * Q) for x in Dn] + [f.view(B, P * Q)]
        w = (w.unsqueeze(-1) * wi.view(B, P, Q)).reshape(B, P * Q)
    return torch.stack(Dn, 0), w


def _logistic_parts(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r""":math:`\sigma(t)`, :math:`1 - \sigma(t) = \sigma(-t)` and :math:`\log(1 + e^t)`, each accurate in both tails
    (exponentials and logarithms only: torch's ``log1p`` and ``softplus`` cost 6-15x an ``exp`` here)."""
    s = torch.reciprocal(torch.exp(-t) + 1.0)
    a = torch.reciprocal(torch.exp(t) + 1.0)
    sp = torch.log(torch.exp(-t.abs()) + 1.0) + t.clamp_min(0.0)
    return s, a, sp


def two_level_moments(mu: torch.Tensor, Lc: torch.Tensor, quadrature: Quadrature
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r""":math:`\mathbb E[\log p_y]` (B,), :math:`\mathbb E[p]` and :math:`\mathbb E[p(1-p)]` (B, D + 1; class y in
    column 0) of the softmax over :math:`(0, d_1, \dots, d_D)` for :math:`D = K - 1 \le 2`, by the rule of
    :func:`nested_nodes` (same nodes and weights) without materialising its :math:`Q^D` grid of probabilities.

    With the rule's centre :math:`c = \log(1 + e^{d_1})` of the second level and :math:`t = d_2 - c` (the
    second level's own variable), the softmax factorises level by level (:math:`\sigma` the logistic function,
    :math:`\sigma_1 = \sigma(d_1)`, :math:`\sigma_2 = \sigma(t)`, :math:`a_i = 1 - \sigma_i`):

    .. math::

        \log p_y = -c - \log(1 + e^{t}),\quad p_y = a_1 a_2,\quad p_1 = \sigma_1 a_2,\quad p_2 = \sigma_2,

        p_y(1 - p_y) = a_1(\sigma_1 a_2^2 + \sigma_2 a_2),\quad p_1(1 - p_1) = \sigma_1(a_1 a_2^2 + \sigma_2 a_2),
        \quad p_2(1 - p_2) = \sigma_2 a_2,

    so the inner sums over the second level's nodes are six weighted sums of functions of :math:`t` alone
    (:math:`1, \log(1+e^t), \sigma_2, a_2, a_2^2, \sigma_2 a_2`), combined with the first level's
    :math:`\sigma_1, a_1, c`. Every term is a sum of positive parts (no cancellation). Node-major layout
    (:meth:`~gpvi.numerics.quadrature.Quadrature.nodes_by_node`). Against :func:`nested_nodes` and
    :meth:`gpvi.models.multiclass_likelihoods.Softmax._quadrature_moments` on the same rule: the same numbers to 3e-14
    relative, in less time. Without autograd, K = 3 sums the second level in the reused scratch buffer
    (:func:`_second_level_sums_inplace`, same numbers to 1e-13).
    """
    B, D = mu.shape
    f1, w1 = quadrature.nodes_by_node(mu[:, 0], Lc[:, 0, 0] ** 2)          # (P, B): d_1, its rule centred at 0
    s1, a1, c = _logistic_parts(f1)
    if D == 2 and not (torch.is_grad_enabled() and (mu.requires_grad or Lc.requires_grad)):
        sums = _second_level_sums_inplace(mu, Lc, quadrature, f1, c)
        if sums is not None:
            return _combine_levels(w1, s1, a1, c, *sums)
    if D == 1:
        q = (w1 * s1 * a1).sum(0)
        return -(w1 * c).sum(0), torch.stack([(w1 * a1).sum(0), (w1 * s1).sum(0)], -1), torch.stack([q, q], -1)
    P = f1.shape[0]
    t, w2 = quadrature.nodes_by_node(*_second_level(mu, Lc, f1, c))
    s2, a2, sp2 = _logistic_parts(t)                                       # (Q, P B)
    wa = w2 * a2
    sums = [w2.sum(0), (w2 * sp2).sum(0), (w2 * s2).sum(0), wa.sum(0), (wa * a2).sum(0), (wa * s2).sum(0)]
    return _combine_levels(w1, s1, a1, c, *(x.view(P, B) for x in sums))


def _second_level(mu: torch.Tensor, Lc: torch.Tensor, f1: torch.Tensor, c: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (P B,) and variance (P B,) of the second level's variable t = d_2 - c given each first-level node."""
    P, B = f1.shape
    sd0 = Lc[:, 0, 0]
    z1 = (f1 - mu[:, 0]) / torch.where(sd0 > 0, sd0, torch.ones_like(sd0))
    return ((mu[:, 1] + Lc[:, 1, 0] * z1) - c).reshape(-1), (Lc[:, 1, 1] ** 2).expand(P, B).reshape(-1)


def _second_level_sums_inplace(mu: torch.Tensor, Lc: torch.Tensor, quadrature: Quadrature, f1: torch.Tensor,
                               c: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    r"""The six second-level sums of :func:`two_level_moments`, each (P, B), with every node-sized array in the
    reused scratch buffer (no autograd): :meth:`~gpvi.numerics.quadrature.Quadrature.nodes_into`, then the logistic
    parts of t from one exponential :math:`e = e^{-|t|}`: the larger of :math:`\sigma(t), 1 - \sigma(t)` is
    :math:`1/(1 + e)`, the smaller :math:`e/(1 + e)` (both exact in the tails), and
    :math:`\log(1 + e^t) = \log(1 + e) + \max(t, 0)`. None when a window is degenerate (the caller then takes the
    out-of-place path, which handles it)."""
    P, B = f1.shape
    m2, v2 = _second_level(mu, Lc, f1, c)
    n = quadrature.num_points * P * B
    work = _workspace(6 * n, mu)
    t, w2, x, y, z, u = (work[i * n:(i + 1) * n].view(-1, P * B) for i in range(6))
    if not quadrature.nodes_into(m2, v2, t, w2, x):
        return None
    torch.abs(t, out=x).neg_().exp_()                                   # e = exp(-|t|)
    torch.add(x, 1.0, out=y)                                            # 1 + e
    torch.log(y, out=z).add_(torch.clamp_min(t, 0.0, out=u))            # log(1 + e^t)
    W, Sp = w2.sum(0), z.mul_(w2).sum(0)
    y.reciprocal_()                                                     # the larger logistic part
    x.mul_(y)                                                           # the smaller one
    pos = t >= 0.0
    torch.where(pos, y, x, out=z)                                       # sigma(t)
    torch.where(pos, x, y, out=t)                                       # 1 - sigma(t)
    torch.mul(t, w2, out=x)                                             # w (1 - sigma)
    A, SA = x.sum(0), torch.mul(x, z, out=y).sum(0)
    AA, S = x.mul_(t).sum(0), z.mul_(w2).sum(0)
    return tuple(a.view(P, B) for a in (W, Sp, S, A, AA, SA))


def _combine_levels(w1: torch.Tensor, s1: torch.Tensor, a1: torch.Tensor, c: torch.Tensor, W: torch.Tensor,
                    Sp: torch.Tensor, S: torch.Tensor, A: torch.Tensor, AA: torch.Tensor, SA: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The moments of :func:`two_level_moments` from the first level's weights and logistic parts and the six
    second-level sums (each (P, B))."""
    value = -(w1 * (c * W + Sp)).sum(0)
    Ep = torch.stack([(w1 * a1 * A).sum(0), (w1 * s1 * A).sum(0), (w1 * S).sum(0)], -1)
    Eq = torch.stack([(w1 * a1 * (s1 * AA + SA)).sum(0), (w1 * s1 * (a1 * AA + SA)).sum(0), (w1 * SA).sum(0)], -1)
    return value, Ep, Eq


def default_quadrature(num_classes: int) -> Quadrature:
    """The 1-D rule per dimension of the softmax quadrature: 96 nodes for K = 2 (the binary default); for K >= 3,
    40 per dimension on a window of 6.5 sd (neglected mass 8e-11; 1600 nodes per site at K = 3). Measured against a
    240-node rule (largest error in :math:`E` and its derivatives, K = 3, means of sd 2 + sqrt(v_max)): 6e-8 for
    per-class marginal variances 1..3, 8e-7 for 3..10, 4e-5 for 10..100, 2e-3 for 100..1000; on iris sites at the
    MAP-II optimum (variances 0.7..10) 2e-9, 8e-8 in the sum over sites."""
    return Quadrature(96) if num_classes <= 2 else Quadrature(40, width=6.5)


_WORKSPACE = threading.local()
_WORKSPACE_MAX_BYTES = 1 << 26


def _workspace(numel: int, like: torch.Tensor) -> torch.Tensor:
    """A flat scratch buffer of ``numel`` elements on ``like``'s device and dtype, reused across calls (one per
    thread, CPU only, at most 64 MiB kept; a fresh tensor otherwise). The softmax averages fill a (K, N, S) block
    at every CVI step: allocating it afresh each time cost more in page faults than the arithmetic (N = 210,
    S = 1,024, K = 10: 16,500 faults per call). Callers must not
    return views of it."""
    nbytes = numel * like.element_size()
    if like.device.type != "cpu" or nbytes > _WORKSPACE_MAX_BYTES:
        return torch.empty(numel, dtype=like.dtype, device=like.device)
    buf = getattr(_WORKSPACE, "buf", None)
    if buf is None or buf.dtype != like.dtype or buf.numel() < numel:
        buf = torch.empty(numel, dtype=like.dtype)
        _WORKSPACE.buf = buf
    return buf[:numel]


_FIXED_CACHE: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}


def fixed_draws(num_draws: int, num_classes: int, like: torch.Tensor) -> torch.Tensor:
    r"""``(num_draws, K)`` fixed standard-normal points: a scrambled Sobol' sequence (seed :data:`FIXED_DRAWS_SEED`)
    mapped through the normal quantile function, on ``like``'s device and dtype (the same points at every call:
    common random numbers, a deterministic bound).

    Randomised quasi-Monte Carlo rather than pseudo-random draws: the error of a Sobol' average of a smooth
    integrand falls nearly as :math:`1/n` instead of :math:`1/\sqrt n`. Measured on 200 softmax sites with K = 10
    (means of sd 2.5, variances 0.05..3.05) against a 262,144-point reference: largest error of :math:`E_n`
    7.5e-2 with 2,000 pseudo-random draws (the rule before), 8.1e-3 with 512 Sobol' points, 4.6e-3 with 1,024;
    of :math:`\partial_m E_n`: 1.4e-2, 3.5e-3, 1.0e-3. Powers of two keep the Sobol' balance properties.
    """
    n = check_positive_int(num_draws, "num_draws")
    key = (n, int(num_classes), like.dtype, like.device)
    pts = _FIXED_CACHE.get(key)
    if pts is None:
        with torch.device("cpu"):                   # the engine builds its tables on the default device
            u = torch.quasirandom.SobolEngine(int(num_classes), scramble=True, seed=FIXED_DRAWS_SEED).draw(
                n, dtype=torch.float64)
        tiny = torch.finfo(torch.float64).eps
        pts = torch.special.ndtri(u.clamp(tiny, 1.0 - tiny)).to(device=like.device, dtype=like.dtype)
        if len(_FIXED_CACHE) > 32:
            _FIXED_CACHE.clear()
        _FIXED_CACHE[key] = pts
    return pts


def log_lik_of_differences(D: torch.Tensor, *, stable: bool = False) -> torch.Tensor | None:
    r""":math:`\log p(y\mid\mathbf d) = -\log(1 + \sum_j e^{d_j})`, ``(N, S)``, for the K - 1 differences
    :math:`d_j = f_j - f_y` along axis 1 of ``D`` ``(N, K-1, S)`` (multi-class EP's quasi-Monte Carlo rule), which
    is overwritten. By the log of :math:`1 + \sum_j e^{d_j}` directly (two passes over ``D``; ``log`` rather than
    ``log1p``, three times faster here: where the sum is below 1e-16 the result is 0 instead of :math:`-\sum_j
    e^{d_j}`, an absolute error below 1e-16), or ``None`` when a sum overflows (some :math:`d_j > 709`); with
    ``stable``, by the shifted form :math:`m + \log(e^{-m} + \sum_j e^{d_j - m})`, :math:`m = \max(0, \max_j d_j)`,
    which cannot overflow."""
    if not stable:
        s = D.exp_().sum(1)
        return s.add_(1.0).log_().neg_() if bool(torch.isfinite(s).all()) else None
    mx = D.amax(1).clamp_min_(0.0)
    return -(mx + torch.log(torch.exp(-mx) + D.sub_(mx.unsqueeze(1)).exp_().sum(1)))
