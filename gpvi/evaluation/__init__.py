"""Evaluation: predictive metrics (:mod:`~gpvi.evaluation.metrics`) and plots (:mod:`~gpvi.evaluation.plots`,
matplotlib imported on use)."""

from . import metrics, plots

__all__ = ["metrics", "plots"]
