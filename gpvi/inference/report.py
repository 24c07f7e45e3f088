"""What :func:`gpvi.infer` did and why: :class:`InferenceReport`."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

__all__ = ["InferenceReport"]


@dataclass
class InferenceReport:
    """What :func:`infer` did and why (prints as one screen; renders as HTML in notebooks).

    Attributes
    ----------
    answer : {"grid", "q", "psis", "nuts"}
        Which posterior was returned (``"grid"``: the lattice quadrature of step 0, :mod:`gpvi.inference.grid`).
    reason : str
    trusted : bool
        False when the answer failed its own check (NUTS short of ``min_ess`` / R-hat 1.01); the reason and the
        first line of the report say so, and ``infer`` warns.
    check : dict
        The weighted answer's check: ``proposal`` ("q" or "mixture": the base of the defensive proposal),
        ``khat`` and its ``threshold``, ``ess`` and ``num_draws`` of its weights, ``mcse_mean`` and ``mcse_sd``
        (largest batch MCSE over the parameters, in weighted sds), ``reliable``; after a refinement (module
        docstring, step 4) also ``refined`` (its rounds of new draws) and ``first`` (the first check's ``khat``,
        ``ess``, ``num_draws``, ``mcse_mean``, ``mcse_sd``), the other keys then being the refined proposal's;
        when that check passed, ``second`` (the second opinion's ``khat``, ``threshold``, ``ess``, ``num_draws``,
        ``mcse_mean``, ``mcse_sd``, ``reliable``), ``reliable`` then being both.
    interrupted : str
        The stage a Ctrl-C ended, empty when none did: ``"map"`` (the MAP restarts of the default start),
        ``"laplace"`` (their Laplace scales), ``"q"`` (the engine runs), ``"psis"`` (PSIS and the check) or
        ``"nuts"``; the answer is then the partial result of that stage and not trusted.
    mcse_mean : float
        The returned answer's largest Monte Carlo standard error of a mean, in posterior sds (0 for q, whose
        moments are exact; the batch MCSE for weighted draws; ArviZ's MCSE for NUTS).
    khat : float
        Pareto :math:`\\hat k` of q's importance weights.
    elbo, elbo_se : float
        The variational engine's final bound and its Monte Carlo standard error.
    converged : bool
        The engine's convergence rule held (S&K: its fixed number of steps ran and the window-split check
        passed).
    log_evidence, log_evidence_se : float
        Importance-sampling estimate of :math:`\\log p(y)` from q's draws (reliable only when ``khat`` is small).
    psis_ess : float
        Effective sample size of the PSIS weights.
    q : GaussianPosterior
        The variational posterior that was diagnosed (whatever the answer).
    times : dict of str to float
        Wall time (s) of each stage: ``grid`` (step 0, the MAP restarts included when it ran), ``q`` (the MAP
        restarts included when the grid did not run), ``psis`` (the check included), ``nuts``.
    nuts : dict
        NUTS diagnostics when it ran: smallest bulk ESS, largest split R-hat, divergences, gradient evaluations
        (warm-up and draws; and the draws' alone).
    starts : list of dict
        The starts (one per distinct MAP optimum; ``q.info["starts"]``): MAP log joint, final bound, its se.
    starts_agree : bool or None
        Whether the starts' final bounds agree within their Monte Carlo error (``q.info["starts_agree"]``).
    basin_mass : list of float
        When the starts' Gaussians lie in several basins: the posterior mass of each (best q's first), estimated
        by PSIS of their mixture; empty otherwise.
    khat_mixture, log_evidence_mixture, log_evidence_mixture_se : float
        :math:`\\hat k` of that mixture and its importance-sampling log evidence (NaN without one).
    engine : str
        The variational engine's name (``"SKGaussian"``, ``"DSVI"``, ...; ``"grid"`` when the grid answered).
    grid : dict
        Step 0's record when it ran (:func:`~gpvi.inference.grid.grid_posterior`): ``reliable``, ``reason``,
        ``step``, ``cells``, ``waves``, ``coset_mean``, ``coset_sd``, ``edge_mass``, ``log_evidence``, ...; empty
        when it did not (more than ``GRID_MAX_D`` parameters, not an exact GP target, ``grid=False`` or a given q).
    """

    answer: str
    reason: str
    khat: float
    elbo: float
    elbo_se: float
    converged: bool
    log_evidence: float
    log_evidence_se: float
    psis_ess: float
    times: dict[str, float] = field(default_factory=dict)
    nuts: dict[str, Any] = field(default_factory=dict)
    starts: list[dict[str, Any]] = field(default_factory=list)
    starts_agree: bool | None = None
    basin_mass: list[float] = field(default_factory=list)
    khat_mixture: float = math.nan
    log_evidence_mixture: float = math.nan
    log_evidence_mixture_se: float = math.nan
    q: Any = field(default=None, repr=False)
    engine: str = "q"
    trusted: bool = True
    check: dict[str, Any] = field(default_factory=dict)
    mcse_mean: float = math.nan
    interrupted: str = ""
    grid: dict[str, Any] = field(default_factory=dict)

    def _grid_line(self) -> list[str]:
        g = self.grid
        if not g:
            return []
        if not g.get("reliable"):
            return [f"  grid (step 0): not used: {g.get('reason', '')} ({g.get('wall', 0.0):.1f} s)"]
        return [f"  grid: {g['cells']:,} cells at h = {g['step']:g} Laplace sd in {g['waves']} waves; the 2h cosets "
                f"agree: means within {g['coset_mean']:.3f} sd, sds within {g['coset_sd']:.1%}; mass at the edge "
                f"{g['edge_mass']:.1e}; log evidence {g['log_evidence']:.3f} (quadrature)"]

    def lines(self) -> list[str]:
        head = "gpvi.infer: answer = " if self.trusted else "gpvi.infer: NOT TRUSTED: answer = "
        if self.answer == "grid":
            return [f"{head}grid ({self.reason})", *self._grid_line(),
                    "  wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.times.items())
                    + f" (total {sum(self.times.values()):.1f} s)"]
        out = [f"{head}{self.answer} ({self.reason})", *self._grid_line(),
               f"  {self.engine} bound {self.elbo:.3f} +- {self.elbo_se:.3f} (converged: {self.converged})"
               + self._starts_line(),
               f"  PSIS of q: k-hat {self.khat:.2f}, weights' ESS {self.psis_ess:.0f}, "
               f"log evidence {self.log_evidence:.3f} +- {self.log_evidence_se:.3f}"]
        c = self.check
        if c.get("first"):
            f = c["first"]
            out.append(f"  first check ({c['proposal']} proposal, {f['num_draws']} draws): k-hat {f['khat']:.2f}, "
                       f"weights' ESS {f['ess']:.0f}, batch MCSE {max(f['mcse_mean'], f['mcse_sd']):.3f} sd: "
                       "proposal refined from its weighted draws")
        if c:
            out.append(f"  check ({'refined ' if c.get('first') else ''}{c['proposal']} proposal, "
                       f"{c['num_draws']} draws): k-hat {c['khat']:.2f} "
                       f"(<= {c['threshold']:.2f}?), weights' ESS {c['ess']:.0f}, batch MCSE of means <= "
                       f"{c['mcse_mean']:.3f} sd, of sds <= {c['mcse_sd']:.3f} sd: "
                       + ("reliable" if c["reliable"] else "not reliable"))
        if c.get("second"):
            t = c["second"]
            out.append(f"  second opinion (the scaled copies alone, {t['num_draws']} draws): k-hat {t['khat']:.2f} "
                       f"(<= {t['threshold']:.2f}?), weights' ESS {t['ess']:.0f}, batch MCSE "
                       f"{max(t['mcse_mean'], t['mcse_sd']):.3f} sd: "
                       + ("reliable" if t["reliable"] else "not reliable"))
        out.append(f"  answer's Monte Carlo error: means within {self.mcse_mean:.3f} sd (1 MCSE)"
                   if self.mcse_mean > 0 else "  answer's Monte Carlo error: none (q's moments are exact)")
        if self.basin_mass:
            out.append(f"  basins: the starts' Gaussians lie in {len(self.basin_mass)} basins holding "
                       + " / ".join(f"{m:.0%}" for m in self.basin_mass)
                       + f" of the mass (PSIS of their mixture: k-hat {self.khat_mixture:.2f}, log evidence "
                       f"{self.log_evidence_mixture:.3f} +- {self.log_evidence_mixture_se:.3f})")
        if self.nuts:
            out.append("  NUTS from q: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in self.nuts.items()))
        out.append("  wall time: " + ", ".join(f"{k} {v:.1f} s" for k, v in self.times.items())
                   + f" (total {sum(self.times.values()):.1f} s)")
        return out

    def title(self) -> str:
        """The report's headline (its first line) with q's own :math:`\\hat k`: the title of the returned posterior's
        ``summary()``, which so tells the report's story (a weighted answer's own k-hat is its proposal's, not q's),
        an interruption or a failed check included."""
        own = f"; q's own k-hat {self.khat:.2f}" if math.isfinite(self.khat) else ""
        return self.lines()[0] + own

    def _starts_line(self) -> str:
        if len(self.starts) < 2:
            return ""
        bounds = ", ".join(f"{r['elbo']:.2f}" for r in self.starts)
        verdict = "they agree" if self.starts_agree else "they differ: the best is kept"
        return f"; {len(self.starts)} starts (distinct MAP optima), bounds {bounds}: {verdict}"

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        rows = "".join(f"<li>{html.escape(x.strip())}</li>" for x in self.lines()[1:])
        return f"<b>{html.escape(self.lines()[0])}</b><ul>{rows}</ul>"
