r"""DSVI's monitoring and stop rule: the rolling bound average and the convergence rule on it and on q.

Paper supplement (slides "Monitoring convergence"): the instantaneous bound
:math:`\mathcal L^{(t)} = \frac1S\sum_s\log g(\theta_s) + \sum_d\log C_{dd} + \mathcal H_\phi` at every step and its
rolling-window average. Every W steps the rule compares this window's averages with the previous window's: the
bound average moved by at most ``tol * max(1, |avg|) + 2 se`` (se from the windows' variances), and the window
averages of :math:`\mu` and :math:`C` moved by at most ``param_tol`` marginal sds of q. The rule must hold at
``patience`` consecutive checks for the state to count as having reached its *plateau*.

The finish (``gap_tol``, for runs the rule ends): from the plateau on, the run goes on and keeps the window
averages of :math:`(\mu, C)` as batch means; their average is what the run returns (Polyak-Ruppert averaging over
the final windows), and the batch means give its error. In q's own coordinates -- :math:`\delta = C^{-1}\Delta\mu`
and :math:`A = C^{-1}\Delta C` (lower triangular) -- the bound of a Gaussian target falls by
:math:`\tfrac12\lVert\delta\rVert^2 + \tfrac12\sum_{i>j}A_{ij}^2 + \sum_i A_{ii}^2` to second order, so the
expected shortfall of the average of B batch means :math:`x_b` is estimated by

.. math::

    \widehat{\mathrm{gap}} = \frac{1}{B(B-1)}\sum_b \Big[\tfrac12\lVert\delta_b\rVert^2
    + \tfrac12\sum_{i>j}A_{b,ij}^2 + \sum_i A_{b,ii}^2\Big],\qquad
    \delta_b = \bar C^{-1}(\mu_b - \bar\mu),\ A_b = \bar C^{-1}(C_b - \bar C),

and the run is *converged* (and stops) once at least ``min_batches`` batches are averaged and
``GAP_CALIBRATION`` :math:`\times\,\widehat{\mathrm{gap}} \le` ``gap_tol`` nats (the factor 2.5 corrects
for the correlation between adjacent batch means, calibrated on Gaussian targets where the gap is known). Its
cost adapts to the problem: about :math:`(D + D(D+1)/2\cdot c)/(2 S\,\mathrm{gap\_tol})` averaged steps
(S draws per step, c ~ 1-2).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...validation import check_bool, check_choice, check_positive, check_positive_int
from ..contract import record_bound

__all__ = ["Convergence", "NATURAL_WINDOW", "DEFAULT_WINDOW", "GAP_CALIBRATION", "average_gap", "batch_average"]

NATURAL_WINDOW = 100
"""Window W for ``optimizer="natural"`` with ``window="auto"`` (its iterates move in units of q's scale)."""
DEFAULT_WINDOW = 200
"""Window W of the paper, used by the other optimizers with ``window="auto"``."""
GAP_CALIBRATION = 2.5
"""Factor on the batch-means gap estimate. Means of adjacent windows of 100 iterates are positively correlated at
the decaying step sizes, so the plain batch-means variance is too small; the factor is calibrated on Gaussian
targets, where the gap is known exactly (it is KL(q || p))."""


class Convergence:
    r"""DSVI's convergence rule and stop rule (an object the driver calls after every step): ``DSVI(convergence=...)``.

    Every W steps the window averages of the bound, :math:`\mu` and :math:`C` are compared with the previous
    window's (module docstring); the rule must hold at ``patience`` consecutive checks for ``converged`` to be
    True.

    Parameters
    ----------
    window : int or "auto"
        W >= 1, the rolling window of the bound and the check period. ``"auto"`` (default): 200 as in the paper,
        100 for the ``"natural"`` rule (whose iterates move in units of q's scale, so 100 steps suffice to see
        drift).
    tol : float
        Bound part: successive window averages differ by at most ``tol * max(1, |avg|) + 2 * se`` (se = standard
        error of the difference, from the windows' variances).
    param_tol : float
        Parameter part: the window averages of :math:`\mu` and :math:`C` moved by at most ``param_tol``:
        :math:`\max_d |\Delta\bar\mu_d| / \mathrm{sd}_d` and :math:`\max_{ij} |\Delta\bar C_{ij}| /
        \mathrm{sd}_i` (sd = marginal scales of q, the row norms of C). Averages over a window measure drift
        rather than the step-to-step noise of the iterates.
    patience : int
        Consecutive checks the rule must hold for ``converged``.
    stop : bool or "auto"
        End the run before ``num_steps`` once converged. A run ended this way returns the average of
        :math:`(\mu, C)` over the windows since the plateau (with ``gap_tol=None``: the last ``patience``
        windows, over which the rule held), not the final iterate. ``"auto"`` (default): for the ``"natural"``
        rule only (the others run all ``num_steps``).
    gap_tol : float or None
        For runs the rule ends: after the plateau, keep averaging windows until the estimated shortfall of the
        average's bound below the optimum is at most ``gap_tol`` nats (default 0.01; module docstring).
        ``None``: stop at the plateau, returning the average of the last ``patience`` windows.
    min_batches : int
        Fewest windows averaged (>= 2, default 3; the plateau's ``patience`` windows count) before the gap
        estimate may end the run. With the default the run can end at the plateau itself, with the plateau's
        windows averaged, when their estimated gap is already small (small D: the run costs no more than a stop at
        the plateau); otherwise it goes on until the estimate, from more batch means, is below ``gap_tol``.

    Examples
    --------
    >>> Convergence(window=50, stop=False)
    Convergence(window=50, tol=0.001, param_tol=0.2, patience=3, stop=False, gap_tol=0.01)
    """

    def __init__(self, window: int | str = "auto", tol: float = 1e-3, param_tol: float = 0.2, patience: int = 3,
                 stop: bool | str = "auto", gap_tol: float | None = 0.01, min_batches: int = 3) -> None:
        if isinstance(window, str):
            check_choice(window, "window", ("auto",))
        else:
            window = check_positive_int(window, "window")
        self.window = window
        self.tol = check_positive(tol, "tol")
        self.param_tol = check_positive(param_tol, "param_tol")
        self.patience = check_positive_int(patience, "patience")
        if isinstance(stop, str):
            check_choice(stop, "stop", ("auto",))
        else:
            stop = check_bool(stop, "stop")
        self.stop = stop
        self.gap_tol = None if gap_tol is None else check_positive(gap_tol, "gap_tol")
        self.min_batches = check_positive_int(min_batches, "min_batches")
        if self.min_batches < 2:
            raise ValueError(f"min_batches must be >= 2 (a variance needs two batch means); got {min_batches}")

    @property
    def may_stop_early(self) -> bool:
        return self.stop is not False

    def window_for(self, optimizer: str) -> int:
        """W for a run with the given (resolved) optimizer."""
        if self.window == "auto":
            return NATURAL_WINDOW if optimizer == "natural" else DEFAULT_WINDOW
        return int(self.window)

    def stops(self, optimizer: str) -> bool:
        """Whether a run with this optimizer ends once converged."""
        return optimizer == "natural" if self.stop == "auto" else bool(self.stop)

    def __call__(self, state: Any, info: dict[str, Any]) -> bool:
        return self.stops(state.optimizer) and state.converged

    # ------------------------------------------------------------------ bookkeeping, once per step
    def record(self, state: Any, bound: float, rho: float, num_valid: int, info: dict[str, Any]) -> None:
        """Append the step's bound to the window and the trace; run the rule every W steps."""
        record_bound(state, bound, info, rho=rho, num_valid=float(num_valid))
        W = state.window.maxlen
        if state.t % W == 0 and len(state.window) == W:
            self._check(state)
        info["converged"] = state.converged

    def finishes(self, state: Any) -> bool:
        """Whether a run in ``state`` finishes with the averaging phase (``gap_tol`` set, a run the rule ends)."""
        return self.gap_tol is not None and self.stops(state.optimizer)

    @staticmethod
    def accumulate(state: Any) -> None:
        """Add the new iterate to the sums behind this window's averages of :math:`\\mu` and :math:`C`."""
        ck = state.check
        if ck.get("sum_mu") is None:
            ck["sum_mu"], ck["sum_C"], ck["n"] = state.mu.clone(), state.C.clone(), 1
        else:
            ck["sum_mu"].add_(state.mu)
            ck["sum_C"].add_(state.C)
            ck["n"] += 1

    def _check(self, state: Any) -> None:
        """Compare this window's averages (bound, mu, C) with the previous window's."""
        W = len(state.window)
        avg = sum(state.window) / W
        var = sum((b - avg) ** 2 for b in state.window) / max(W - 1, 1)
        ck = state.check
        n = max(ck.get("n", 0), 1)
        mu_bar = ck["sum_mu"] / n if ck.get("sum_mu") is not None else state.mu.clone()
        C_bar = ck["sum_C"] / n if ck.get("sum_C") is not None else state.C.clone()
        sd = C_bar.abs() if state.scale == "diag" else (C_bar ** 2).sum(-1).sqrt()
        if ck.get("avg") is not None:
            se = math.sqrt((var + ck["var"]) / W)
            ok_bound = abs(avg - ck["avg"]) <= self.tol * max(1.0, abs(avg)) + 2.0 * se
            dmu = float(((mu_bar - ck["mu"]).abs() / sd).max())
            dC_abs = (C_bar - ck["C"]).abs()
            dC = float((dC_abs / sd).max()) if state.scale == "diag" else float((dC_abs / sd[:, None]).max())
            ok = ok_bound and dmu <= self.param_tol and dC <= self.param_tol
            ck["streak"] = ck.get("streak", 0) + 1 if ok else 0
            ck["last"] = {"t": state.t, "dbound": abs(avg - ck["avg"]), "se": se, "dmu_sd": dmu, "dC_sd": dC}
            if not self.finishes(state):
                state.converged = ck["streak"] >= self.patience
        hist = list(ck.get("history") or [])[-(self.patience - 1):] if self.patience > 1 else []
        window = {"t": state.t, "n": n, "mu": mu_bar, "C": C_bar}
        hist.append(window)
        ck.update(avg=avg, var=var, mu=mu_bar, C=C_bar, sum_mu=None, sum_C=None, n=0, history=hist)
        if self.finishes(state):
            if ck.get("batches") is not None:
                ck["batches"] = ck["batches"] + [window]
            elif ck.get("streak", 0) >= self.patience:          # the plateau: start averaging its windows
                ck["batches"], ck["plateau_t"] = list(hist), state.t
            batches = ck.get("batches")
            if batches is not None and len(batches) >= self.min_batches:
                ck["gap"] = GAP_CALIBRATION * average_gap(batches, state.scale == "diag")
                state.converged = ck["gap"] <= self.gap_tol

    def settings(self) -> dict[str, Any]:
        return {"window": self.window, "tol": self.tol, "param_tol": self.param_tol, "patience": self.patience,
                "stop": self.stop, "gap_tol": self.gap_tol, "min_batches": self.min_batches}

    def __repr__(self) -> str:
        extra = "" if self.min_batches == 3 else f", min_batches={self.min_batches}"
        return (f"Convergence(window={self.window!r}, tol={self.tol:g}, param_tol={self.param_tol:g}, "
                f"patience={self.patience}, stop={self.stop!r}, gap_tol={self.gap_tol!r}{extra})")


def batch_average(batches: list[dict[str, Any]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The iterate average over ``batches`` (window means weighted by their sizes) and the number of iterates."""
    w = torch.tensor([float(b["n"]) for b in batches], dtype=torch.float64)
    n = float(w.sum())
    w = w / n
    mu = sum(wi * b["mu"] for wi, b in zip(w, batches))
    C = sum(wi * b["C"] for wi, b in zip(w, batches))
    return mu, C, int(n)


def average_gap(batches: list[dict[str, Any]], diag: bool) -> float:
    r"""Estimated expected shortfall (nats) of the bound at the average of ``batches`` below the optimum.

    The batch-means variance of the average in q's own coordinates, weighted by the bound's curvature there
    (module docstring). NaN for fewer than two batches.

    Examples
    --------
    >>> import torch
    >>> b = [{"n": 100, "mu": torch.tensor([x]), "C": torch.tensor([[1.0]])} for x in (0.0, 0.2)]
    >>> round(average_gap(b, diag=False), 6)                  # 0.5 * (0.1^2 + 0.1^2) / (2 * 1)
    0.005
    """
    B = len(batches)
    if B < 2:
        return math.nan
    mu, C, _ = batch_average(batches)
    total = 0.0
    for b in batches:
        if diag:
            d = (b["mu"] - mu) / C
            A = (b["C"] - C) / C
            total += 0.5 * float(d @ d) + float((A * A).sum())
        else:
            d = torch.linalg.solve_triangular(C, (b["mu"] - mu).unsqueeze(-1), upper=False).squeeze(-1)
            A = torch.linalg.solve_triangular(C, b["C"] - C, upper=False)
            off = torch.tril(A, -1)
            total += 0.5 * float(d @ d) + 0.5 * float((off * off).sum()) + float((torch.diagonal(A) ** 2).sum())
    return total / (B * (B - 1))
