r"""The protocol of a CVI site likelihood :math:`p(y_n \mid f_n)` (one latent value per data point).

A likelihood is any object with ``name``, ``binary``, ``derivatives(y, f) -> (h, h', h'')``,
``closed_form(y, m, v) -> None | (E, dE/dm, dE/dv)``, ``log_prob(y, f)`` and ``spec()``; optionally
``check_targets(y, name) -> y`` (validation of the targets, called by the models at construction).
:class:`Likelihood` documents it and supplies the defaults; subclass or duck-type it. The expectations that CVI
needs from it are :func:`gpvi.models.likelihoods.expected_log_lik`.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Likelihood"]


class Likelihood:
    r"""Base of the site likelihoods (documentation of the protocol; subclass or duck-type it).

    Attributes
    ----------
    name : str
        ``"logit"``, ``"probit"``, ``"gaussian"``, ``"poisson"``... recorded in every result.
    binary : bool
        Whether targets are binary labels (0/1 floats internally); then ``response(f)`` is :math:`p(y = 1\mid f)`.
    """

    name: str = "likelihood"
    binary: bool = False

    def derivatives(self, y: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""``(h, h', h'')`` of :math:`h(f) = \log p(y \mid f)`, broadcasting ``y`` against ``f``."""
        raise NotImplementedError

    def log_prob(self, y: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        r""":math:`\log p(y \mid f)`, broadcast."""
        return self.derivatives(y, f)[0]

    def closed_form(self, y: torch.Tensor, m: torch.Tensor, v: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Exact ``(E, dE/dm, dE/dv)`` when available, else ``None`` (then a rule is used)."""
        return None

    def spec(self) -> dict[str, Any]:
        """A description that :func:`gpvi.models.likelihoods.make_likelihood` can rebuild."""
        return {"name": self.name}

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
