"""CSV input of the ``gpvi`` command (:mod:`gpvi.cli`): numeric columns by name, checked cell by cell, and the
standardisation of the columns the command fits on. Every fault is a :class:`CLIError` naming the file, line and
column (the command prints it as one line, exit status 2).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["CLIError", "load_csv", "load_features", "standardise"]


class CLIError(Exception):
    """An error reported to the user as one line, exit status 2."""


def _read_columns(path: str | os.PathLike, choose: Callable[[Path, list[str]], list[int]],
                  min_rows: int) -> tuple[Any, list[str]]:
    """Parse the columns ``choose(path, header)`` selects as finite floats; ``(data (n, k), header)``."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise CLIError(f"{p}: no such file")
    try:
        with p.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise CLIError(f"{p}: the file is empty") from None
            header = [h.strip() for h in header]
            cols = choose(p, header)
            rows = []
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise CLIError(f"{p}, line {lineno}: {len(row)} fields but the header has {len(header)}")
                vals = []
                for j in cols:
                    col, c = header[j], row[j].strip()
                    try:
                        if "_" in c:                    # float() reads "1_000"; a CSV number has no underscores
                            raise ValueError(c)
                        v = float(c)
                    except ValueError:
                        what = "an empty cell" if not c else f"non-numeric value {c!r}"
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: {what}") from None
                    if not math.isfinite(v):
                        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is not a finite number")
                    vals.append(v)
                rows.append(vals)
    except csv.Error as exc:
        raise CLIError(f"{p}: malformed CSV ({exc})") from None
    except UnicodeDecodeError:
        raise CLIError(f"{p}: not a text (UTF-8) CSV file") from None
    if len(rows) < min_rows:
        raise CLIError(f"{p}: needs at least {min_rows} data row{'s' if min_rows > 1 else ''}; found {len(rows)}")
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(cols)), header


def _duplicates(p: Path, header: list[str], among: list[str] | None = None) -> None:
    dup = sorted({h for h in header if header.count(h) > 1 and (among is None or h in among)})
    if dup:
        raise CLIError(f"{p}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")


def load_csv(path: str | os.PathLike, target: str) -> tuple[Any, Any, list[str]]:
    """Read a numeric CSV with a header row; return ``(X, y, feature_names)`` as float64 numpy arrays.

    Parameters
    ----------
    path : str or path-like
        CSV file: one header row, comma-separated, every cell a finite number. Blank lines are skipped.
    target : str
        Name of the target (or label) column; every other column is an input.

    Returns
    -------
    X : numpy.ndarray of shape (n, d)
    y : numpy.ndarray of shape (n,)
    feature_names : list of str, length d

    Raises
    ------
    CLIError
        Missing/empty/undecodable file, missing target column, duplicate column names, ragged rows, non-numeric or
        empty cells, NaN/inf values, fewer than 2 rows or no feature columns — the message names the file, column
        and line.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from gpvi.cli import load_csv
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.csv"
    >>> _ = p.write_text("a,b,y\\n1,2,0.5\\n3,4,1.5\\n")
    >>> X, y, names = load_csv(p, "y")
    >>> X.shape, y.tolist(), names
    ((2, 2), [0.5, 1.5], ['a', 'b'])
    """
    import numpy as np

    def choose(p: Path, header: list[str]) -> list[int]:
        if target not in header:
            raise CLIError(f"{p}: no column {target!r}; columns are {', '.join(header)}")
        _duplicates(p, header)
        if len(header) < 2:
            raise CLIError(f"{p}: needs at least one feature column besides {target!r}")
        return list(range(len(header)))

    data, header = _read_columns(path, choose, min_rows=2)
    j = header.index(target)
    features = [h for i, h in enumerate(header) if i != j]
    return np.delete(data, j, axis=1), data[:, j], features


def load_features(path: str | os.PathLike, features: list[str]) -> Any:
    """The ``features`` columns of a CSV, by name and in that order, as an ``(n, d)`` float64 array."""
    def choose(p: Path, header: list[str]) -> list[int]:
        missing = [f for f in features if f not in header]
        if missing:
            raise CLIError(f"{p}: no column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; the "
                           f"fit needs {', '.join(features)} and the file has {', '.join(header)}")
        _duplicates(p, header, among=features)
        return [header.index(f) for f in features]

    return _read_columns(path, choose, min_rows=1)[0]


def standardise(X, y=None, names=None, target=None, path=None, weights=None):
    """``(X_std, y_std or None, (x_mean, x_sd, y_mean, y_sd))``: columns centred and scaled by their mean and sd
    (a constant input keeps sd 1; a constant target is refused); a column whose sd overflows is a
    :class:`CLIError` naming ``path`` and the column (``names``, ``target``). ``weights`` (inputs only): the weighted
    mean and sd, as of the rows repeated."""
    from .validation import check_column_spread

    try:        # a cell such as 1e308 makes a column's sd overflow: it would silently become all zeros
        check_column_spread(X, "input", names)
        if y is not None:
            check_column_spread(y[:, None], "target", [target])
    except ValueError as exc:
        raise CLIError(f"{path}: {exc}" if path else str(exc)) from None
    if weights is None:
        mu, sd = X.mean(0), X.std(0)
    else:
        p = weights / weights.sum()
        mu = p @ X
        sd = (p @ (X - mu) ** 2) ** 0.5
    sd[sd == 0] = 1.0
    Xs = (X - mu) / sd
    if y is None:
        return Xs, None, (mu, sd, 0.0, 1.0)
    ym, ys = float(y.mean()), float(y.std())
    if ys == 0:
        raise CLIError("the target column is constant; there is nothing to regress")
    return Xs, (y - ym) / ys, (mu, sd, ym, ys)
