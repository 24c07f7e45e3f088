r"""Warm-up adaptation: dual averaging of the step size and Stan's windowed estimate of :math:`M^{-1}`.

Step size (Hoffman & Gelman 2014, Algorithm 5; Stan's constants :math:`\gamma = 0.05`, :math:`t_0 = 10`,
:math:`\kappa = 0.75`, :math:`\mu = \log 10\epsilon_0`): after transition :math:`t` with acceptance statistic
:math:`a_t`,

.. math::

    \bar s_t = (1 - \tfrac1{t + t_0})\bar s_{t-1} + \tfrac1{t + t_0}(\delta - a_t),\quad
    \log\epsilon_t = \mu - \tfrac{\sqrt t}{\gamma}\bar s_t,\quad
    \log\bar\epsilon_t = t^{-\kappa}\log\epsilon_t + (1 - t^{-\kappa})\log\bar\epsilon_{t-1},

and :math:`\bar\epsilon` is used after warm-up.

Metric (Stan's windows): a 75-transition start buffer, then mass-matrix windows of 25, 50, 100, ... transitions (the
last one stretched to the end buffer), then a 50-transition end buffer; for warm-ups shorter than 150 the buffers are
15 % and 10 % of it. At the end of each window :math:`M^{-1}` becomes the window's sample variance (or covariance)
shrunk towards :math:`10^{-3}`: :math:`\frac{n}{n + 5}\hat\Sigma + 10^{-3}\frac{5}{n + 5} I`, the step size is searched
again and dual averaging restarts.

With ``Adaptation(mass_estimate="draws_and_gradients")`` a diagonal :math:`M^{-1}` is instead estimated from the
window's draws and their log-density gradients (nutpie's diagonal estimate; Seyboldt, Carlson & Carpenter):
:math:`M^{-1}_{dd} = \sqrt{\widehat{\operatorname{Var}}(x_d) / \widehat{\operatorname{Var}}(\partial_d \log p)}`,
the diagonal affine map that minimises the sample Fisher divergence to a standard normal; for a Gaussian with
diagonal covariance :math:`\Sigma` it is :math:`\Sigma` itself, since :math:`\operatorname{Var}(\partial_d \log p)
= 1/\Sigma_{dd}`. It is shrunk as above.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["DualAveraging", "Windows", "Welford", "draws_and_gradients_diagonal"]


class DualAveraging:
    """Dual averaging of :math:`\\log\\epsilon` towards acceptance ``target``."""

    def __init__(self, eps0: float, target: float, *, gamma: float = 0.05, t0: float = 10.0, kappa: float = 0.75):
        self.target, self.gamma, self.t0, self.kappa = target, gamma, t0, kappa
        self.restart(eps0)

    def restart(self, eps0: float) -> None:
        self.mu = math.log(10.0 * eps0)
        self.t, self.s_bar, self.x_bar = 0, 0.0, 0.0
        self.eps = eps0

    def update(self, accept: float) -> float:
        """The next step size after a transition with acceptance statistic ``accept``."""
        a = min(1.0, accept) if accept == accept else 0.0
        self.t += 1
        eta = 1.0 / (self.t + self.t0)
        self.s_bar = (1.0 - eta) * self.s_bar + eta * (self.target - a)
        x = self.mu - self.s_bar * math.sqrt(self.t) / self.gamma
        w = self.t ** (-self.kappa)
        self.x_bar = (1.0 - w) * self.x_bar + w * x
        self.eps = math.exp(x)
        return self.eps

    @property
    def final(self) -> float:
        """:math:`\\bar\\epsilon`, the step size kept after warm-up."""
        return math.exp(self.x_bar) if self.t else self.eps


class Windows:
    """Stan's warm-up windows for ``num_warmup`` transitions: which transitions feed the metric, where windows end."""

    def __init__(self, num_warmup: int, *, init_buffer: int = 75, term_buffer: int = 50, base_window: int = 25):
        W = num_warmup
        if init_buffer + base_window + term_buffer > W:
            init_buffer, term_buffer = int(0.15 * W), int(0.1 * W)
            base_window = W - init_buffer - term_buffer
        self.ends: list[int] = []
        self.start, self.stop = init_buffer, W - term_buffer
        if W < 20 or base_window <= 0:
            return
        size, end = base_window, init_buffer + base_window
        while True:
            self.ends.append(min(end, self.stop))
            if end >= self.stop:
                break
            size *= 2
            end = end + size
            if end + 2 * size >= self.stop:      # the window after this one would not fit: stretch this one
                end = self.stop

    def collects(self, i: int) -> bool:
        """Whether transition ``i`` (0-based) feeds the metric estimate."""
        return bool(self.ends) and self.start <= i < self.stop

    def window_ends(self, i: int) -> bool:
        """Whether a window ends after transition ``i`` (0-based)."""
        return (i + 1) in self.ends


class Welford:
    """Running mean and (co)variance of the draws of one window, with Stan's regularisation."""

    def __init__(self, d: int, dense: bool) -> None:
        self.d, self.dense = d, dense
        self.reset()

    def reset(self) -> None:
        self.n = 0
        self.mean = np.zeros(self.d)
        self.m2 = np.zeros((self.d, self.d)) if self.dense else np.zeros(self.d)

    def add(self, z: np.ndarray) -> None:
        self.n += 1
        delta = z - self.mean
        self.mean = self.mean + delta / self.n
        if self.dense:
            self.m2 = self.m2 + np.outer(z - self.mean, delta)
        else:
            self.m2 = self.m2 + (z - self.mean) * delta

    def inverse_mass(self) -> np.ndarray:
        """:math:`\\frac{n}{n+5}\\hat\\Sigma + 10^{-3}\\frac{5}{n+5}` (identity for the dense case)."""
        n = self.n
        cov = self.m2 / max(n - 1, 1)
        shrink = 1e-3 * 5.0 / (n + 5.0)
        if self.dense:
            cov = 0.5 * (cov + cov.T)
            return (n / (n + 5.0)) * cov + shrink * np.eye(self.d)
        return (n / (n + 5.0)) * cov + shrink


def draws_and_gradients_diagonal(draws: Welford, grads: Welford) -> np.ndarray:
    r"""A diagonal :math:`M^{-1}` from one window's draws and gradients (module notes):
    :math:`\frac{n}{n+5}\sqrt{\hat v_x / \hat v_g} + 10^{-3}\frac{5}{n+5}`, each ratio clipped to
    :math:`[10^{-20}, 10^{20}]`; a coordinate whose gradient did not vary in the window keeps its draws' variance."""
    n = draws.n
    vx, vg = draws.m2 / max(n - 1, 1), grads.m2 / max(n - 1, 1)
    est = np.where(vg > 0, np.sqrt(vx / np.where(vg > 0, vg, 1.0)), vx)
    return (n / (n + 5.0)) * np.clip(est, 1e-20, 1e20) + 1e-3 * 5.0 / (n + 5.0)
