"""A small result table (no pandas dependency): rows by name, typed columns, readable repr.

``summary()`` and ``compare()`` return a :class:`Table` instead of printing, so notebooks, tests and
benchmarks reuse the numbers; ``to_pandas()`` and ``to_markdown()`` convert it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["Table"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


class Table:
    """Rows keyed by a name, columns of numbers or strings.

    Parameters
    ----------
    index : sequence of str
        Row names (e.g. hyperparameter names).
    columns : mapping of str to sequence
        Column name -> one value per row.
    title : str, optional

    Examples
    --------
    >>> t = Table(["a", "b"], {"mean": [0.0, 1.5], "sd": [1.0, 2.0]})
    >>> t["b"]["sd"]
    2.0
    >>> t.column("mean")
    [0.0, 1.5]
    """

    def __init__(self, index: Sequence[str], columns: Mapping[str, Sequence[Any]], *, title: str = "") -> None:
        self.index = [str(i) for i in index]
        self.columns = {k: list(v) for k, v in columns.items()}
        for k, v in self.columns.items():
            if len(v) != len(self.index):
                raise ValueError(f"column {k!r} has {len(v)} values for {len(self.index)} rows")
        self.title = title

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, row: str) -> dict[str, Any]:
        try:
            i = self.index.index(row)
        except ValueError:
            raise KeyError(f"no row {row!r}; rows are {self.index}") from None
        return {k: v[i] for k, v in self.columns.items()}

    def column(self, name: str) -> list[Any]:
        """All values of one column."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; columns are {list(self.columns)}")
        return self.columns[name]

    def rows(self) -> list[dict[str, Any]]:
        """One dict per row, with the row name under ``"name"``."""
        return [{"name": n, **self[n]} for n in self.index]

    def to_pandas(self):  # pragma: no cover - optional dependency
        """Convert to a ``pandas.DataFrame`` (pandas must be installed)."""
        try:
            import pandas as pd                      # imported on use: pandas is not a dependency of gpvi
        except ImportError as exc:
            raise ImportError("to_pandas needs pandas: pip install pandas") from exc
        return pd.DataFrame(self.columns, index=self.index)

    def to_markdown(self, floatfmt=_fmt) -> str:
        """GitHub-flavoured markdown."""
        head = ["name", *self.columns]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for n in self.index:
            r = self[n]
            lines.append("| " + " | ".join([n, *(floatfmt(r[k]) for k in self.columns)]) + " |")
        return "\n".join(lines)

    def __repr__(self) -> str:
        head = ["name", *self.columns]
        body = [[n, *(_fmt(self[n][k]) for k in self.columns)] for n in self.index]
        widths = [max(len(h), *(len(r[j]) for r in body)) if body else len(h) for j, h in enumerate(head)]
        out = [self.title] if self.title else []
        out.append("  ".join(h.rjust(w) if j else h.ljust(w) for j, (h, w) in enumerate(zip(head, widths))))
        for r in body:
            out.append("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))))
        return "\n".join(out)

    def _repr_markdown_(self) -> str:  # notebooks
        return (f"**{self.title}**\n\n" if self.title else "") + self.to_markdown()
