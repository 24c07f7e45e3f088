r"""Where a :class:`~gpvi.inference.salimans_knowles.engine.SKGaussian` run starts: the mean :math:`m_1` and the scale of
:math:`V_1 = CC^\top`.

The mean comes from an init strategy's :class:`~gpvi.inference.init.Start`. The scale, in order:

1. a warm start from a Gaussian posterior (``start.scale_source == "posterior"``) keeps its scale;
2. an explicit ``init_scale``: a number (:math:`C = sI`), a ``(D,)`` diagonal, a ``(D, D)`` lower-triangular
   matrix, or ``"laplace"``: :math:`C = \operatorname{chol}((-\nabla^2\log g(m_1))^{-1})`, the curvature at the
   initial mean by the engine's Hessian source, turned into a scale by :func:`gpvi.inference.init.laplace_scale`
   (diagonal :math:`1/\sqrt{-H_{dd}}`, 0.1 where :math:`-H_{dd} \le 0`, when :math:`-H` is not positive
   definite);
3. ``init_scale="auto"``: the start's own scale when it brings one (``init="laplace"``, a given scale), else
   :math:`0.1 I` (q starts narrow).

``info["init"]["scale"]`` records which.
"""

from __future__ import annotations

import numbers
import warnings
from typing import Any

import torch

from ...exceptions import NumericalWarning
from ...validation import as_float_tensor, check_choice, check_positive
from ..derivatives import _autograd_hessian, _fd_hessian, _NoDoubleBackward
from ..init import Start, laplace_scale
from .estimates import strict_cholesky
from .options import HessianSource

__all__ = ["DEFAULT_INIT_SCALE", "check_init_scale", "check_gaussian_warm_start", "initial_scale",
           "initial_precision", "initial_statistics", "probe_hessian"]

DEFAULT_INIT_SCALE = 0.1
"""Scale of :math:`V_1 = (0.1)^2 I` when neither ``init_scale`` nor the start sets one."""


def check_init_scale(init_scale: Any) -> Any:
    """Validate ``init_scale`` ("auto", "laplace", a positive number, or an array checked against D later)."""
    if isinstance(init_scale, numbers.Real) and not isinstance(init_scale, bool):
        check_positive(init_scale, "init_scale")
    elif isinstance(init_scale, str):
        check_choice(init_scale, "init_scale", ("auto", "laplace"))
    elif init_scale is None or isinstance(init_scale, bool):
        raise TypeError(f"init_scale must be 'auto', 'laplace', a positive number or an array; got "
                        f"{type(init_scale).__name__}")
    return init_scale


def check_gaussian_warm_start(init: Any) -> None:
    """Refuse a warm start from a posterior with a non-Gaussian base (its scale is not a covariance factor)."""
    base = getattr(init, "base", None)
    if base is not None and hasattr(init, "scale_tril") and getattr(base, "kind", None) != "normal":
        raise ValueError("init must be a Gaussian posterior (standard-normal base) to set V_1; got a base of kind "
                         f"{getattr(base, 'kind', type(base).__name__)!r}")


def _laplace(target: Any, m0: torch.Tensor, hessian: HessianSource) -> tuple[torch.Tensor, dict[str, Any]]:
    """The Laplace scale at ``m0`` (Hessian by ``hessian``), with the evaluation cost for the counters."""
    kind = hessian.kind
    D = m0.shape[0]
    th = m0.unsqueeze(0)
    how: dict[str, Any] = {}
    if kind in ("auto", "autograd"):
        try:
            _, _, H, _ = _autograd_hessian(target, th, None)
            how.update(hessian_rows=1, hessian_backward=D)
        except _NoDoubleBackward as exc:
            if kind == "autograd":
                raise ValueError(f"hessian='autograd' is not available for this target ({exc}); use "
                                 f"hessian='fd' or 'auto'") from None
            kind = "fd"
    if kind == "fd":
        _, _, H, _ = _fd_hessian(target, th, None, hessian.fd_step)
        how.update(hessian_rows=2 * D + 1, hessian_backward=0)
    H = H[0]
    if not bool(torch.isfinite(H).all()):
        raise ValueError("init_scale='laplace': the Hessian of log g at the initial mean is not finite")
    C, what = laplace_scale(H)
    if C is not None and C.dim() == 2:
        how["scale"] = "laplace"
        return C, how
    if C is not None:                                   # (D,) precisions -H_dd, some <= 0
        how["scale"] = "laplace_diagonal (-H not positive definite)"
        return torch.diag(torch.where(C > 0, C.clamp_min(1e-300).rsqrt(), torch.full_like(C, DEFAULT_INIT_SCALE))), how
    warnings.warn(f"SKGaussian: no Laplace scale at the initial mean ({what}); starting from "
                  f"{DEFAULT_INIT_SCALE} I", NumericalWarning, stacklevel=4)
    how["scale"] = f"init_scale {DEFAULT_INIT_SCALE} (laplace failed: {what})"
    return DEFAULT_INIT_SCALE * torch.eye(D, dtype=m0.dtype, device=m0.device), how


def initial_scale(target: Any, start: Start, init_scale: Any, hessian: HessianSource
                  ) -> tuple[torch.Tensor, dict[str, Any]]:
    r"""The lower-triangular :math:`C` of :math:`V_1 = CC^\top` and a record of how it was set (module docstring).

    The record's ``hessian_rows`` / ``hessian_backward`` count an ``init_scale="laplace"`` evaluation.
    """
    m0 = start.theta
    D = m0.shape[0]
    auto = isinstance(init_scale, str) and init_scale == "auto"
    if start.scale_tril is not None and (start.scale_source == "posterior" or auto):
        C0 = start.scale_tril.to(dtype=m0.dtype, device=m0.device)
        if C0.shape != (D, D):
            raise ValueError(f"the start's scale_tril is {tuple(C0.shape)} but the target has D = {D}")
        how = {"scale": "given (GaussianPosterior)" if start.scale_source == "posterior"
               else str(start.info.get("scale", start.scale_source))}
        if not bool((torch.diagonal(C0) > 0).all()) or not bool(torch.isfinite(C0).all()):
            raise ValueError("the start's scale_tril must be finite with a strictly positive diagonal")
        return C0, how
    elif auto or isinstance(init_scale, numbers.Real):
        s = DEFAULT_INIT_SCALE if auto else float(init_scale)
        C0 = s * torch.eye(D, dtype=m0.dtype, device=m0.device)
        how = {"scale": f"init_scale (auto: {DEFAULT_INIT_SCALE} I)" if auto else "init_scale"}
    elif isinstance(init_scale, str):                                    # "laplace"
        C0, how = _laplace(target, m0, hessian)
    else:
        st = as_float_tensor(init_scale, "init_scale", ndim=(1, 2)).to(device=m0.device)
        if st.dim() == 1:
            if st.shape[0] != D:
                raise ValueError(f"init_scale must have length D = {D}; got {st.shape[0]}")
            C0 = torch.diag(st)
        else:
            if st.shape != (D, D):
                raise ValueError(f"init_scale must be ({D}, {D}); got {tuple(st.shape)}")
            if bool((torch.triu(st, 1) != 0).any()):
                raise ValueError("init_scale must be lower triangular")
            C0 = st.clone()
        how = {"scale": "init_scale"}
    if not bool((torch.diagonal(C0) > 0).all()) or not bool(torch.isfinite(C0).all()):
        raise ValueError("init_scale must be finite with a strictly positive diagonal")
    return C0, how


def initial_precision(C0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r""":math:`P_1 = V_1^{-1} = (C_0 C_0^\top)^{-1}` (symmetrised) and its Cholesky factor :math:`L_1`.

    Raises
    ------
    ValueError
        :math:`P_1` is not numerically positive definite (an ill-conditioned initial scale).
    """
    P0 = torch.cholesky_inverse(C0)                     # (C0 C0^T)^-1
    P0 = 0.5 * (P0 + P0.T)
    L0 = strict_cholesky(P0)
    if L0 is None:
        raise ValueError("the initial scale is too ill-conditioned: V_1^-1 is not numerically positive definite")
    return P0, L0


def probe_hessian(target: Any, m0: torch.Tensor, batch: Any) -> tuple[str, str]:
    """``HessianSource("auto")`` resolved at the initial mean: ``("autograd", note)`` when the target supports
    double backward, else ``("fd", note)`` (central finite differences), with the reason as ``note``."""
    try:
        _autograd_hessian(target, m0.unsqueeze(0), batch)
        return "autograd", "auto: the target supports double backward"
    except _NoDoubleBackward as exc:
        return "fd", f"auto: finite differences because autograd refused second derivatives ({exc})"[:400]


def initial_statistics(method: str, m0: torch.Tensor, P0: torch.Tensor, L0: torch.Tensor
                       ) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    r"""The running statistics at the start and the two empty window sums (one per half of the window).

    Algorithm 2: :math:`a_1 = 0`, :math:`z_1 = m_1`, :math:`P_1`; the Hessian-free variant (in section 6.4's
    parametrisation): :math:`a_1 = 0`, :math:`z_1 = m_1`, :math:`A_1 = L_1^{-\top}`, :math:`B_1 = -L_1`. The sums
    hold the same keys, zero, and their count ``n``.
    """
    D = m0.shape[0]
    stats: dict[str, torch.Tensor] = {"a": torch.zeros_like(m0), "z": m0.clone()}
    if method == "hessian":
        stats["P"] = P0
    else:
        eye = torch.eye(D, dtype=m0.dtype, device=m0.device)
        stats.update(A=torch.linalg.solve_triangular(L0.T, eye, upper=True), B=-L0.clone())   # R_1 = L^-T

    def empty() -> dict[str, Any]:
        out: dict[str, Any] = {k: torch.zeros_like(v) for k, v in stats.items()}
        out["n"] = 0
        return out

    return stats, [empty(), empty()]
