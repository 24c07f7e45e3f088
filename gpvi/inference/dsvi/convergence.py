r"""DSVI's monitoring and stop rule: the rolling bound average and the convergence rule on it and on q.

Paper supplement (slides "Monitoring convergence"): the instantaneous bound
:math:`\mathcal L^{(t)} = \frac1S\sum_s\log g(\theta_s) + \sum_d\log C_{dd} + \mathcal H_\phi` at every step and its
rolling-window average. Every W steps the rule compares this window's averages with the previous window's: the
bound average moved by at most ``tol * max(1, |avg|) + 2 se`` (se from the windows' variances), and the window
averages of :math:`\mu` and :math:`C` moved by at most ``param_tol`` marginal sds of q. The rule must hold at
``patience`` consecutive checks for the state to count as converged.
"""

from __future__ import annotations

import math
from typing import Any

from ...validation import check_bool, check_choice, check_positive, check_positive_int
from ..engine import record_bound

__all__ = ["Convergence", "NATURAL_WINDOW", "DEFAULT_WINDOW"]

NATURAL_WINDOW = 100
"""Window W for ``optimizer="natural"`` with ``window="auto"`` (its iterates move in units of q's scale)."""
DEFAULT_WINDOW = 200
"""Window W of the paper, used by the other optimizers with ``window="auto"``."""


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
        :math:`(\mu, C)` over the last ``patience`` windows (those over which the rule held), not the final
        iterate. ``"auto"`` (default): for the ``"natural"`` rule only (the others run all ``num_steps``).

    Examples
    --------
    >>> Convergence(window=50, stop=False)
    Convergence(window=50, tol=0.001, param_tol=0.2, patience=3, stop=False)
    """

    def __init__(self, window: int | str = "auto", tol: float = 1e-3, param_tol: float = 0.2, patience: int = 3,
                 stop: bool | str = "auto") -> None:
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
            state.converged = ck["streak"] >= self.patience
        hist = list(ck.get("history") or [])[-(self.patience - 1):] if self.patience > 1 else []
        hist.append({"t": state.t, "n": n, "mu": mu_bar, "C": C_bar})
        ck.update(avg=avg, var=var, mu=mu_bar, C=C_bar, sum_mu=None, sum_C=None, n=0, history=hist)

    def settings(self) -> dict[str, Any]:
        return {"window": self.window, "tol": self.tol, "param_tol": self.param_tol, "patience": self.patience,
                "stop": self.stop}

    def __repr__(self) -> str:
        return (f"Convergence(window={self.window!r}, tol={self.tol:g}, param_tol={self.param_tol:g}, "
                f"patience={self.patience}, stop={self.stop!r})")
