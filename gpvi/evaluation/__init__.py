"""Evaluation: predictive metrics, comparison tables and plots (matplotlib, imported lazily)."""

from . import metrics
from .table import Table

__all__ = ["metrics", "Table"]
