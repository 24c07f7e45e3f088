r"""Starting points of the chains, from the :class:`~gpvi.inference.init.Start` an init strategy returns.

``run(target, init=...)`` resolves ``init`` with :func:`gpvi.inference.init.resolve_init`, as every engine does;
the strategy's :class:`~gpvi.inference.init.Start` is turned into one point per chain here
(:func:`chain_starts`), with draws from the run's generator:

* explicit rows (:class:`init_to_chains`, or a ``(num_chains, D)`` array given as ``init``): used as they are;
* a start with a scale :math:`C` from a posterior (a warm start from DSVI's Gaussian), or from a Laplace or given
  scale when the engine's ``init_scale`` is ``None``: :math:`\theta_c = \theta_0 + C z_c`, :math:`z_c \sim
  \mathcal N(0, I)`, one draw per chain;
* otherwise jitter around the point: :math:`\theta_c = \theta_0 + s\, z_c` with :math:`s` = ``init_scale``
  (:data:`DEFAULT_INIT_SCALE` when ``None``).

Draws where the log joint is not finite are redrawn (up to :data:`MAX_INIT_TRIES` times). A starting point
``theta_0`` or explicit rows where the log joint is not finite are refused at once with a ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...models.target import as_target, target_device
from ...rng import randn
from ...validation import as_float_tensor
from ..init import Start, check_start

__all__ = ["init_to_chains", "chain_starts", "DEFAULT_INIT_SCALE", "MAX_INIT_TRIES"]

DEFAULT_INIT_SCALE = 0.1
"""Standard deviation of the per-chain jitter around a point start when ``init_scale`` is ``None`` (log scale)."""

MAX_INIT_TRIES = 100
"""Redraws of starting points where the log joint is not finite before giving up."""


class init_to_chains:  # noqa: N801 - strategies read as functions, as in NumPyro
    """Start chain ``c`` at row ``c`` of a ``(num_chains, D)`` array (an MCMC-only init strategy).

    ``NUTS.run(target, init=rows)`` with a 2-D array uses this strategy. To start the chains from draws of
    another posterior ``p``, pass ``init=p.sample(num_chains, seed=...)``.

    Parameters
    ----------
    rows : array-like of shape (num_chains, D)

    Examples
    --------
    >>> import torch, gpvi
    >>> from gpvi.inference.mcmc import init_to_chains
    >>> target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    >>> init_to_chains(torch.zeros(3, 2))(target).info["rows"].shape
    torch.Size([3, 2])
    """

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __call__(self, target: Any) -> Start:
        D = len(as_target(target).names)
        t = as_float_tensor(self.rows, "init", ndim=2).detach().cpu()
        if t.shape[-1] != D:
            raise ValueError(f"init must have length D = {D} (one value per parameter of the target); "
                             f"got shape {tuple(t.shape)}")
        if t.shape[0] == 0:
            raise ValueError("init of shape (chains, D) has no rows")
        return Start(t.mean(0), info={"mean": "given", "rows": t.clone()})

    def __repr__(self) -> str:
        return "init_to_chains(...)"


def _log_joint(target: Any, theta: torch.Tensor) -> torch.Tensor:
    """The log joint at ``theta`` (rows kept on the CPU here) evaluated on the target's device, back on theta's."""
    dev = target_device(target)
    with torch.no_grad():
        return target.log_joint(theta if dev is None else theta.to(dev)).to(theta.device)


def chain_starts(target: Any, start: Start, num_chains: int, init_scale: float | None,
                 generator: torch.Generator) -> tuple[torch.Tensor, dict[str, Any]]:
    r"""One starting point per chain from ``start`` (see the module docstring for the rule).

    Parameters
    ----------
    target : target
    start : Start
        From an init strategy; ``start.info["rows"]`` (from :class:`init_to_chains`) gives explicit rows.
    num_chains : int
    init_scale : float or None
        Jitter around a point start; ``None``: the start's own scale when it has one, else
        :data:`DEFAULT_INIT_SCALE`. A scale from a posterior (``start.scale_source == "posterior"``) is always used.
    generator : torch.Generator
        Randomness of the jitter / draws.

    Returns
    -------
    starts : torch.Tensor of shape (num_chains, D)
        Points where the log joint is finite.
    info : dict
        ``chains``: "given rows", "jitter" or "draws from the start's scale (<source>)"; ``init_scale`` used.

    Raises
    ------
    ValueError
        Rows of the wrong number, a start (or a row) where the log joint is not finite, or no finite starting
        points after :data:`MAX_INIT_TRIES` draws.
    """
    D, C = len(target.names), num_chains
    rows = start.info.get("rows")
    if rows is not None:
        t = torch.as_tensor(rows, dtype=torch.float64, device=start.theta.device)
        if t.shape[0] != C:
            raise ValueError(f"init of shape (chains, D) must have num_chains = {C} rows; got {t.shape[0]}")
        bad = ~torch.isfinite(_log_joint(target, t))
        if bool(bad.any()):
            raise ValueError(f"the log joint is not finite at init rows {bad.nonzero().flatten().tolist()}")
        return t.to(target_device(target) or t.device, copy=True), {"chains": "given rows"}

    centre = start.theta.detach().to(torch.float64).cpu()
    scale = start.scale_tril
    sampler: Callable[[int], torch.Tensor]
    if scale is not None and (start.scale_source == "posterior" or init_scale is None):
        C_ = scale.detach().to(torch.float64).cpu()

        def sampler(n: int) -> torch.Tensor:
            return centre + randn((n, D), generator, device=centre.device) @ C_.T
        what = f"draws from the start's scale ({start.scale_source})"
        info: dict[str, Any] = {"chains": what}
    else:
        if not bool(torch.isfinite(centre).all()):
            raise ValueError("init contains non-finite values")
        check_start(target, centre)                    # the one start check every engine uses
        s = DEFAULT_INIT_SCALE if init_scale is None else float(init_scale)

        def sampler(n: int) -> torch.Tensor:
            return centre + s * randn((n, D), generator, device=centre.device)
        what = "jittered starting points"
        info = {"chains": "jitter", "init_scale": s}

    starts = sampler(C)
    for _ in range(MAX_INIT_TRIES):
        good = torch.isfinite(starts).all(-1)
        if bool(good.any()):
            good[good.clone()] = torch.isfinite(_log_joint(target, starts[good]))
        if bool(good.all()):
            dev = target_device(target)
            return (starts if dev is None else starts.to(dev)), info
        starts[~good] = sampler(int((~good).sum()))
    raise ValueError(f"could not find finite starting points: the log joint was not finite at {what} "
                     f"after {MAX_INIT_TRIES} tries")
