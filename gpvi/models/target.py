"""What an inference engine runs on: anything with ``log_joint(theta)`` and ``names``.

DSVI, ML-II, NUTS and the Salimans-Knowles engine all take a *target*. ``gpvi.GPRegression`` is one;
:class:`Target` wraps a bare callable so the engines run on literally the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from ..validation import check_bool, check_device, check_positive_int, check_theta

__all__ = ["TargetLike", "Target", "as_target", "call_log_joint", "is_minibatch_target", "target_device"]


@runtime_checkable
class TargetLike(Protocol):
    """Protocol of an inference target.

    ``log_joint`` maps ``(D,) -> ()`` and ``(S, D) -> (S,)``, is differentiable by autograd, and may return
    ``-inf`` (or NaN) for draws it cannot evaluate; engines count and handle those.
    """

    names: Sequence[str]

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor: ...


class Target:
    """Wrap a log joint density ``log g(theta)`` as an inference target.

    Parameters
    ----------
    fn : callable
        ``fn(theta) -> log g``. If ``batched`` (default), ``fn`` must accept ``(S, D)`` and return ``(S,)``;
        otherwise it is called once per row.
    names : sequence of str or int
        Names of theta's components, or their number ``D`` (names become ``theta[0]``, ...).
    batched : bool
        Whether ``fn`` handles a batch itself.

    Examples
    --------
    >>> import torch, gpvi
    >>> m = torch.tensor([2.0, -1.0], dtype=torch.float64)
    >>> target = gpvi.Target(lambda th: -0.5 * ((th - m) ** 2).sum(-1), names=["a", "b"])
    >>> target.log_joint(torch.zeros(3, 2, dtype=torch.float64)).shape
    torch.Size([3])
    """

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor], names: Sequence[str] | int, *,
                 batched: bool = True) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable; got {type(fn).__name__}")
        if isinstance(names, int) and not isinstance(names, bool):
            d = check_positive_int(names, "names")
            names = [f"theta[{i}]" for i in range(d)]
        elif isinstance(names, str) or not isinstance(names, Sequence):
            raise TypeError("names must be a sequence of str or an int")
        names = [str(n) for n in names]
        if len(names) == 0:
            raise ValueError("names is empty: a target needs at least one parameter")
        if len(set(names)) != len(names):
            raise ValueError("names must be unique")
        self.fn = fn
        self.names = names
        self.batched = check_bool(batched, "batched")

    @property
    def dim(self) -> int:
        """Number of parameters D."""
        return len(self.names)

    def log_joint(self, theta: torch.Tensor) -> torch.Tensor:
        """Evaluate ``log g(theta)``: ``(D,) -> ()``, ``(S, D) -> (S,)``."""
        theta = check_theta(theta, self.dim)
        if theta.dim() == 1:
            out = self.fn(theta.unsqueeze(0))[0] if self.batched else self.fn(theta)
        elif self.batched:
            out = self.fn(theta)
        else:
            out = torch.stack([torch.as_tensor(self.fn(t)) for t in theta])
        if out.shape != theta.shape[:-1]:
            raise ValueError(f"log joint returned shape {tuple(out.shape)} for theta of shape {tuple(theta.shape)}; "
                             f"expected {tuple(theta.shape[:-1])}")
        return out

    def __repr__(self) -> str:
        return f"Target(D={self.dim}, names={self.names[:4]}{'...' if self.dim > 4 else ''})"


def as_target(target: object, name: str = "target") -> TargetLike:
    """Check that ``target`` has ``log_joint`` and ``names``, and that the device of its data, if it names one
    (:func:`target_device`), can hold values (``ValueError`` for ``meta``): every engine's entry."""
    if not callable(getattr(target, "log_joint", None)) or not hasattr(target, "names"):
        raise TypeError(f"{name} must have a log_joint(theta) method and a names attribute "
                        f"(e.g. gpvi.GPRegression or gpvi.Target(fn, names)); got {type(target).__name__}")
    dev = target_device(target)
    if dev is not None:
        check_device(dev, f"{name}.device")
    return target  # type: ignore[return-value]


def target_device(target: Any) -> torch.device | None:
    """The device of ``target``'s data (its ``device`` attribute), or ``None`` for a target that names none
    (e.g. :class:`Target` around a function): where an engine's state and draws must live."""
    dev = getattr(target, "device", None)
    return None if dev is None else torch.device(dev)


def is_minibatch_target(target: Any) -> bool:
    """Whether ``target`` draws minibatches (has ``sample_minibatch``), e.g. :class:`gpvi.models.minibatch.MinibatchTarget`."""
    return callable(getattr(target, "sample_minibatch", None))


def call_log_joint(target: Any, theta: torch.Tensor, batch: Any = None) -> torch.Tensor:
    """``target.log_joint(theta[, batch=batch])``, checked to map ``(S, D) -> (S,)``."""
    lj = target.log_joint(theta) if batch is None else target.log_joint(theta, batch=batch)
    if not isinstance(lj, torch.Tensor) or lj.shape != theta.shape[:1]:
        shape = tuple(lj.shape) if isinstance(lj, torch.Tensor) else type(lj).__name__
        raise ValueError(f"target.log_joint returned {shape} for theta of shape {tuple(theta.shape)}; expected "
                         f"shape ({theta.shape[0]},): log_joint must map (S, D) -> (S,)")
    return lj
