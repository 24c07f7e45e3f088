r"""Where EP starts in the engine's evaluations: sites predicted from the nearest earlier evaluations.

:class:`~gpvi.inference.cvi.ep_evidence.EPEvidenceTarget` starts every evaluation from one fixed set of sites (EP's
at the warm-start point, :meth:`~gpvi.inference.cvi.ep_evidence.EPEvidenceTarget.warm_sites`). The engine's draws of
:math:`\theta` lie about one sd of :math:`q(\theta)` from it, and EP needs about 3.5 sweeps from there to its stopping
rule (1e-3): at N = 400 each sweep is a Cholesky factor and an inverse of an N x N matrix. EP's sites are smooth
functions of :math:`\theta`, and by the middle of a run the engine has evaluated hundreds of nearby points. A
:class:`SiteBank` keeps the converged sites of the last ``size`` evaluations and starts a new one from the
weighted least-squares plane through its ``k`` nearest neighbours (:math:`k = 3D + 3`; the nearest one alone while
the bank holds fewer, and above :data:`PLANE_MAX_DIM` log-hyperparameters), site by site:
:math:`\tilde\tau(\theta) \approx a + J(\theta - \theta_*)`, weights
:math:`1/(d_i + 10^{-3}\max_j d_j)` by Euclidean distance in the log-hyperparameters, precisions clipped at 0;
once the bank holds twice the coefficients of a full quadratic, :math:`p = 1 + D + D(D+1)/2`, it fits that
quadratic through the :math:`2p` nearest entries instead (up to :data:`QUADRATIC_MAX_DIM`); the fit's intercept
comes from a QR factorisation (:func:`intercept_weights`). On the tuning families
of issue 59 the quadratic's first undamped sweep changed the sites by 2.7x less than the plane's (median relative
change 1.6e-3 against 4.3e-3 at xor N = 100, 1.7e-3 against 5.8e-3 at spirals N = 200; a third of the evaluations
then stop after that one sweep against 1-2%), and EP took 1.84 / 1.67 / 1.90 / 1.75 / 1.46 sweeps per evaluation
against 2.43 / 2.04 / 2.48 / 2.28 / 1.87 (xor N = 100 / 400, spirals N = 200, checkerboard N = 200 / 400, D = 3);
with D = 4 / 5 / 9 (clf8 on 3 / 4 / all 8 inputs) 2.43 / 2.75 / 3.78 against 2.74 / 2.99 / 3.96. q(theta) moved by
at most 0.007 of its sds, the test probabilities by at most 8e-4 (``benchmarks/studies/results/bayes_bank_h59c.md``).

EP still runs to the same stopping rule from that start, so every evaluation is EP's evidence to the same
tolerance; what changes is where within it the sweeps stop, which now depends on the earlier evaluations (the
evidence is no longer a function of :math:`\theta` alone at the level of the tolerance; a seeded run still repeats
bit for bit). Multi-class EP (sites: :math:`K\times K` precisions per point) starts from the nearest entry's
sites, which are valid sites, where a plane's need not be positive semi-definite. Measured in
``benchmarks/results/classification_bayes_speed_bank59*.md`` and ``multiclass_bayes_h59b_synth4_merged.md``
(against long NUTS runs) and ``benchmarks/studies/results/bayes_profile_ep59.md`` (counts).
"""

from __future__ import annotations

import torch

__all__ = ["SiteBank", "PLANE_MAX_DIM", "QUADRATIC_MAX_DIM", "RANK_RTOL", "intercept_weights"]

PLANE_MAX_DIM = 10
"""Above this many log-hyperparameters a :class:`SiteBank` starts from the nearest entry's sites, not the plane:
on the Ionosphere subsample (D = 35, N = 100) the plane through 3 D + 3 neighbours started EP further from its fixed
point than the nearest entry (6.3 against 5.5 sweeps per evaluation; 5.6 from the fixed start), on Sonar (D = 61)
both took 1.9 (2.8 from the fixed start); at D = 3 and 9 the plane took fewer than the nearest (xor N = 400: 2.7
against 3.0, clf8 N = 200: 4.7 against 4.9, damped)."""


QUADRATIC_MAX_DIM = PLANE_MAX_DIM
"""Up to this many log-hyperparameters (once the bank holds twice its coefficients) a :class:`SiteBank` fits a full
quadratic in theta through the 2 (1 + D + D (D + 1) / 2) nearest entries instead of the plane (module docstring;
measured at D = 3, 4, 5 and 9)."""


RANK_RTOL = 1e-8
""":func:`intercept_weights` falls back to the pseudo-inverse for a row whose triangular factor has a diagonal entry
below this times its largest."""


class SiteBank:
    """The converged sites of the last ``size`` evaluations, and starts predicted from them (module docstring).

    Parameters
    ----------
    size : int
        Evaluations kept (a ring: the oldest is replaced).
    neighbours : int, optional
        k, the neighbours of the local plane (default 3 D + 3).
    """

    def __init__(self, size: int = 128, neighbours: int | None = None) -> None:
        if int(size) < 1:
            raise ValueError(f"size must be >= 1; got {size!r}")
        self.size = int(size)
        self.neighbours = neighbours
        self.theta: torch.Tensor | None = None
        self.tau: torch.Tensor | None = None
        self.nu: torch.Tensor | None = None
        self.count = 0
        self._next = 0

    def __len__(self) -> int:
        return min(self.count, self.size)

    def add(self, theta: torch.Tensor, tau: torch.Tensor, nu: torch.Tensor, keep: torch.Tensor) -> None:
        """Store the rows ``keep`` of ``theta`` ``(S, D)`` and their sites ``(S, N)``."""
        rows = keep.nonzero().flatten()
        if rows.numel() == 0:
            return
        if self.theta is None:
            S = self.size
            self.theta = theta.new_zeros(S, theta.shape[-1])
            self.tau, self.nu = tau.new_zeros(S, tau.shape[-1]), nu.new_zeros(S, nu.shape[-1])
        for r in rows.tolist():
            i = self._next
            self.theta[i], self.tau[i], self.nu[i] = theta[r], tau[r], nu[r]
            self._next = (i + 1) % self.size
            self.count += 1

    def starts(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Starting sites ``(S, N)`` for the rows of ``theta`` ``(S, D)``; the bank must hold at least one entry."""
        n = len(self)
        if n == 0:
            raise ValueError("the bank is empty")
        T, A, B = self.theta[:n], self.tau[:n], self.nu[:n]
        d = torch.cdist(theta, T)
        near = d.argmin(-1)
        tau, nu = A[near].clone(), B[near].clone()
        D = theta.shape[-1]
        quadratic = self.neighbours is None and D <= QUADRATIC_MAX_DIM and n >= 2 * _quadratic_terms(D)
        k = 2 * _quadratic_terms(D) if quadratic else (self.neighbours if self.neighbours is not None else 3 * D + 3)
        if n < max(k, D + 2) or D > PLANE_MAX_DIM:
            return tau, nu
        dist, idx = d.topk(k, dim=-1, largest=False)                          # (S, k)
        w = 1.0 / (dist + 1e-3 * dist.amax(-1, keepdim=True) + 1e-300)
        dx = T[idx] - theta.unsqueeze(1)                                       # (S, k, D)
        cols = [torch.ones(*idx.shape, 1, dtype=T.dtype, device=T.device), dx]
        if quadratic:
            iu = torch.triu_indices(D, D, device=T.device)
            cols.append((dx.unsqueeze(-1) * dx.unsqueeze(-2))[..., iu[0], iu[1]])
        X = torch.cat(cols, -1) * w.unsqueeze(-1)                              # (S, k, terms)
        # the fit's value at theta is the intercept: row 0 of pinv(X) weighs the (weighted) neighbours' sites
        u = intercept_weights(X) * w                                           # (S, k)
        fit_tau = (u.unsqueeze(-1) * A[idx]).sum(1)
        fit_nu = (u.unsqueeze(-1) * B[idx]).sum(1)
        good = torch.isfinite(fit_tau).all(-1) & torch.isfinite(fit_nu).all(-1)
        tau = torch.where(good.unsqueeze(-1), fit_tau.clamp_min(0.0), tau)
        nu = torch.where(good.unsqueeze(-1), fit_nu, nu)
        return tau, nu


def intercept_weights(X: torch.Tensor) -> torch.Tensor:
    r"""The least-squares fit's intercept as weights on the observations: for ``X`` ``(S, k, p)`` of full column
    rank whose *first* column is the (weighted) intercept, the first row of :math:`X^+` ``(S, k)``, as
    ``torch.linalg.pinv(X)[:, 0, :]`` gives it (the bank's path before issue 59's fifth pass).

    From the reduced QR factorisation :math:`X = QR`, :math:`X^+ = R^{-1}Q^\top`, so the row is
    :math:`Q\mathbf a` with :math:`R^\top\mathbf a = \mathbf e_1` (one triangular solve of order p): one
    batched Householder QR instead of the SVD of :func:`torch.linalg.pinv` (its cost against the SVD's, and the
    weights' agreement with the pseudo-inverse's on the tuning families' fits: ``benchmarks/studies/results/
    ep_sweep_lean_h59ep.md``). A row whose :math:`R` has a diagonal entry below :data:`RANK_RTOL` times its largest
    (numerically rank deficient, where the pseudo-inverse's minimum-norm answer and the triangular solve's part)
    takes the pseudo-inverse's row (none did in those fits)."""
    Q, R = torch.linalg.qr(X)
    e1 = torch.zeros(*R.shape[:-1], 1, dtype=R.dtype, device=R.device)
    e1[..., 0, 0] = 1.0
    a = torch.linalg.solve_triangular(R.transpose(-1, -2), e1, upper=False)       # (S, p, 1)
    u = (Q @ a).squeeze(-1)
    d = R.diagonal(dim1=-2, dim2=-1).abs()
    weak = ~(d.amin(-1) > RANK_RTOL * d.amax(-1)) | ~torch.isfinite(u).all(-1)
    if bool(weak.any()):
        u[weak] = torch.linalg.pinv(X[weak])[:, 0, :]
    return u


def _quadratic_terms(D: int) -> int:
    """Coefficients of a full quadratic in D variables: 1 + D + D (D + 1) / 2."""
    return 1 + D + D * (D + 1) // 2
