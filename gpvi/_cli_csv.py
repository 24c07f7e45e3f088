"""Files of the ``gpvi`` command (:mod:`gpvi.cli`): the CSV columns a fit uses, checked cell by cell, the choice of
inputs (``--features`` / ``--exclude``, row-index columns), class labels as text, the standardisation of the
columns the command fits on, and output paths checked before any fitting. Every fault is a :class:`CLIError`
naming the file, line and column (the command prints it as one line, exit status 2).

Inputs: with ``--features`` exactly the columns named, in that order; otherwise every column but the target, the
``--weight`` column and those named by ``--exclude``. A column whose header is a row-name header (empty,
``rownames``, ``row.names``, ``Unnamed: 0``: R's ``write.csv`` and pandas' ``to_csv`` write one) is then left out
with a note; an input holding the row numbers 1..N or 0..N-1 in order gets a note naming ``--exclude`` (it may be a
real input such as a time step, so it is kept). Notes are :class:`InputColumnWarning` s.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import shlex
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .validation import check_column_spread, check_sample_weight

__all__ = ["CLIError", "InputColumnWarning", "CSVData", "read_csv", "load_csv", "load_features", "standardise",
           "check_output", "write_csv"]

INDEX_HEADERS = ("", "rownames", "row.names", "row_names", "unnamed: 0")
"""Headers (compared in lower case) of a row-name column, left out of the inputs unless ``--features`` names it."""

_MISSING = ("na", "n/a", "#n/a")


class CLIError(Exception):
    """An error reported to the user as one line, exit status 2."""


class InputColumnWarning(UserWarning):
    """A column left out of the inputs, or an input that looks like a row index."""


@dataclass
class CSVData:
    """The columns a fit uses: inputs ``X`` (n, d) named ``names``, target ``y`` (floats, or class labels: int64
    when every label is an integer, else text), ``weights`` (or None), and ``notes`` about the choice of inputs."""

    X: Any
    y: Any
    names: list[str]
    weights: Any = None
    notes: list[str] = field(default_factory=list)

    def warn(self) -> None:
        """Issue the notes as :class:`InputColumnWarning` s (the command does so once the input is accepted, so that
        an erroneous input gets only its error)."""
        for note in self.notes:
            warnings.warn(note, InputColumnWarning, stacklevel=3)


def _listing(header: list[str]) -> str:
    return ", ".join(h if h else "''" for h in header)


def _read_columns(path: str | os.PathLike, choose: Callable[[Path, list[str]], tuple[list[int], int | None]],
                  min_rows: int) -> tuple[Any, list[str], list[str]]:
    """Parse the columns ``choose(path, header)`` selects, ``(numeric, text)``: the numeric ones as finite floats,
    the text one (or None) as stripped strings; ``(data (n, k), texts, header)``."""
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
            cols, text = choose(p, header)
            rows, texts = [], []
            for lineno, row in enumerate(reader, start=2):
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(header):
                    raise CLIError(f"{p}, line {lineno}: {len(row)} fields but the header has {len(header)}")
                rows.append([_number(p, lineno, header[j], row[j].strip()) for j in cols])
                if text is not None:
                    texts.append(_text(p, lineno, header[text], row[text].strip()))
    except csv.Error as exc:
        raise CLIError(f"{p}: malformed CSV ({exc})") from None
    except UnicodeDecodeError:
        raise CLIError(f"{p}: not a text (UTF-8) CSV file") from None
    if len(rows) < min_rows:
        raise CLIError(f"{p}: needs at least {min_rows} data row{'s' if min_rows > 1 else ''}; found {len(rows)}")
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(cols)), texts, header


def _as_float(c: str) -> float:
    if "_" in c:                        # float() reads "1_000"; a CSV number has no underscores
        raise ValueError(c)
    return float(c)


def _number(p: Path, lineno: int, col: str, c: str) -> float:
    try:
        v = _as_float(c)
    except ValueError:
        what = "an empty cell" if not c else f"non-numeric value {c!r}"
        raise CLIError(f"{p}, line {lineno}, column {col!r}: {what}") from None
    if not math.isfinite(v):
        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is not a finite number")
    return v


def _text(p: Path, lineno: int, col: str, c: str) -> str:
    """A class label: any text but an empty cell, a missing value (``NA``) or a non-finite number."""
    if not c:
        raise CLIError(f"{p}, line {lineno}, column {col!r}: an empty cell")
    if c.lower() in _MISSING:
        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is a missing value")
    try:
        v = _as_float(c)
    except ValueError:
        return c
    if not math.isfinite(v):
        raise CLIError(f"{p}, line {lineno}, column {col!r}: {c!r} is not a finite number")
    return c


def _duplicates(p: Path, header: list[str], among: list[str] | None = None) -> None:
    dup = sorted({h for h in header if header.count(h) > 1 and (among is None or h in among)})
    if dup:
        raise CLIError(f"{p}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")


def _class_labels(texts: list[str], p: Path, target: str) -> Any:
    """Labels as int64 when every label is an integer (``1`` and ``1.0`` are one class), else the text; at least
    two classes."""
    try:
        values = np.array([_as_float(t) for t in texts])
    except ValueError:
        labels = np.array(texts)
    else:
        if not bool(np.all(values == np.round(values))):
            bad = sorted({float(v) for v in values if v != round(v)})[:3]
            raise CLIError(f"{p}: column {target!r} must hold integer class labels or text; got {bad}")
        labels = values.astype(np.int64)
    classes = np.unique(labels)
    if classes.size < 2:
        raise CLIError(f"{p}: column {target!r} holds a single class ({classes[0]}); a classifier needs at least two")
    return labels


def _index_notes(X: Any, names: list[str]) -> list[str]:
    """Notes on inputs that hold the row numbers 1..N or 0..N-1 in order."""
    n, notes = X.shape[0], []
    for j, name in enumerate(names):
        for start in (0, 1):
            if n >= 3 and np.array_equal(X[:, j], np.arange(start, start + n)):
                notes.append(f"input column {name!r} holds the row numbers {start}..{start + n - 1} in order, so the "
                             f"fit depends on the row order; if it is a row index, leave it out with --exclude "
                             f"{shlex.quote(name)}")
    return notes


def read_csv(path: str | os.PathLike, target: str, *, features: list[str] | None = None,
             exclude: list[str] | None = None, weight: str | None = None, labels: bool = False) -> CSVData:
    """Read the target, the inputs and the weights of a fit from a CSV with a header row (module docstring).

    Parameters
    ----------
    path : str or path-like
        CSV file: one header row, comma-separated; the columns used hold finite numbers (the target of a classifier:
        any text). Blank lines are skipped; other columns are not read.
    target : str
        The target (or label) column.
    features, exclude : list of str, optional
        The inputs, in this order (``--features``); or the columns that are not inputs (``--exclude``). Not both.
    weight : str, optional
        A column of non-negative likelihood weights (``--weight``); never an input.
    labels : bool
        Read the target as class labels (at least two classes).

    Raises
    ------
    CLIError
        A missing/empty/undecodable file; a named column the file lacks (the message lists the columns); a target
        or weight column named as an input; duplicate names among the columns used; ragged rows; empty,
        non-numeric, NaN/inf cells; fewer than 2 rows; no input column; bad weights or labels.
    """
    if features is not None and exclude is not None:
        raise CLIError("--features and --exclude cannot be used together")
    auto: list[str] = []
    inputs: list[str] = []

    def choose(p: Path, header: list[str]) -> tuple[list[int], int | None]:
        if target not in header:
            raise CLIError(f"{p}: no column {target!r}; columns are {_listing(header)}")
        if weight is not None and weight == target:
            raise CLIError(f"--weight {weight!r} is the label column")
        if weight is not None and weight not in header:
            raise CLIError(f"{p}: no column {weight!r} for --weight; columns are {_listing(header)}")
        for flag, named in (("--features", features), ("--exclude", exclude)):
            for c in named or ():
                if c not in header:
                    raise CLIError(f"{flag}: {p} has no column {c!r}; its columns are {_listing(header)}")
        if features is not None:
            if "" in features:
                raise CLIError(f"--features: {p} has a column with an empty header; give it a name in the header to "
                               "use it as an input")
            for c in features:
                role = "the target column" if c == target else "the --weight column" if c == weight else None
                if role or features.count(c) > 1:
                    raise CLIError(f"--features names {c!r} " + ("twice" if not role else f"({role}): not an input"))
            inputs.extend(features)
        else:
            rest = [h for h in header if h not in (target, weight) and h not in (exclude or ())]
            auto.extend(h for h in rest if h.lower() in INDEX_HEADERS)
            inputs.extend(h for h in rest if h not in auto)
        _duplicates(p, header, among=[target, weight, *inputs])
        if not inputs:
            left = [f"the --weight column {weight!r}"] if weight else []
            left += [f"--exclude {_listing(exclude)}"] if exclude else []
            left += [f"the row-name column(s) {_listing(auto)} (name one in --features to use it)"] if auto else []
            raise CLIError(f"{p}: needs at least one feature column besides {target!r}"
                           + (f"; left out: {', '.join(left)}" if left else ""))
        numeric = [header.index(h) for h in inputs] + ([header.index(weight)] if weight else [])
        return (numeric, header.index(target)) if labels else (numeric + [header.index(target)], None)

    data, texts, _ = _read_columns(path, choose, min_rows=2)
    d = len(inputs)
    X, p = data[:, :d], Path(path)
    y = _class_labels(texts, p, target) if labels else data[:, -1]
    notes = [f"column {c!r} is taken for row names (as R's write.csv and pandas' to_csv write them) and is not an "
             "input" + ("; name it in --features to use it" if c else "") for c in auto]
    notes += _index_notes(X, inputs) if features is None else []
    weights = None
    if weight is not None:

        weights = data[:, d]
        try:
            check_sample_weight(weights, len(weights), f"the weights in column {weight!r}")
        except ValueError as exc:
            raise CLIError(f"{p}: {exc}") from None
    return CSVData(np.ascontiguousarray(X), y, list(inputs), weights, notes)


def load_csv(path: str | os.PathLike, target: str, *, features: list[str] | None = None,
             exclude: list[str] | None = None) -> tuple[Any, Any, list[str]]:
    """Read a numeric CSV with a header row; return ``(X, y, feature_names)`` as float64 numpy arrays.

    Parameters
    ----------
    path : str or path-like
        CSV file: one header row, comma-separated, every cell used a finite number. Blank lines are skipped.
    target : str
        Name of the target column.
    features, exclude : list of str, optional
        The input columns (in this order), or the columns left out; by default every other column is an input,
        except a row-name column (module docstring). Notes on the inputs are :class:`InputColumnWarning` s.

    Returns
    -------
    X : numpy.ndarray of shape (n, d)
    y : numpy.ndarray of shape (n,)
    feature_names : list of str, length d

    Raises
    ------
    CLIError
        As :func:`read_csv` — the message names the file, column and line.

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
    data = read_csv(path, target, features=features, exclude=exclude)
    data.warn()
    return data.X, data.y, data.names


def load_features(path: str | os.PathLike, features: list[str]) -> Any:
    """The ``features`` columns of a CSV, by name and in that order, as an ``(n, d)`` float64 array."""
    def choose(p: Path, header: list[str]) -> tuple[list[int], None]:
        missing = [f for f in features if f not in header]
        if missing:
            raise CLIError(f"{p}: no column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}; the "
                           f"fit needs {_listing(features)} and the file has {_listing(header)}")
        _duplicates(p, header, among=features)
        return [header.index(f) for f in features], None

    return _read_columns(path, choose, min_rows=1)[0]


def standardise(X, y=None, names=None, target=None, path=None, weights=None):
    """``(X_std, y_std or None, (x_mean, x_sd, y_mean, y_sd))``: columns centred and scaled by their mean and sd
    (a constant input keeps sd 1; a constant target is refused); a column whose sd overflows is a
    :class:`CLIError` naming ``path`` and the column (``names``, ``target``). ``weights`` (inputs only): the weighted
    mean and sd, as of the rows repeated."""

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


def check_output(path: str, flag: str) -> Path:
    """Fail early (before any fitting) when ``path`` cannot be written: a folder, or its folder is missing."""
    p = Path(path)
    if p.is_dir():
        raise CLIError(f"{flag} {p}: is a folder; give a file name")
    parent = p.parent
    if not parent.exists():
        raise CLIError(f"{flag} {p}: the folder {parent} does not exist")
    if not parent.is_dir():
        raise CLIError(f"{flag} {p}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{flag} {p}: the folder {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise CLIError(f"{flag} {p}: the file exists and is not writable")
    return p


def write_csv(out: Path | None, header: list[str], rows: list[list[str]]) -> None:
    """Write a table as CSV to ``out`` (checked by :func:`check_output`), or to stdout when ``out`` is None."""

    try:
        with open(out, "w", newline="", encoding="utf-8") if out is not None else contextlib.nullcontext(sys.stdout) \
                as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(header)
            w.writerows(rows)
    except BrokenPipeError:                 # the reader of stdout went away (| head): gpvi.cli.main ends quietly
        raise
    except OSError as exc:
        raise CLIError(f"cannot write {out}: {exc.strerror or exc}") from None
