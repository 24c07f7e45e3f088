"""Every Python source of the repository compiles without a warning.

Python 3.12 prints a ``SyntaxWarning`` for an invalid escape sequence such as ``"\\mathbf"`` in a non-raw docstring
(Python 3.11, the development machine's, only a silent ``DeprecationWarning``), and a later Python will refuse it. A
docstring with LaTeX must be a raw string or double its backslashes.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for folder in ("gpvi", "benchmarks", "tests") for p in (ROOT / folder).rglob("*.py"))


def test_sources_are_found():
    assert len(SOURCES) > 100
    assert ROOT / "gpvi" / "__init__.py" in SOURCES


@pytest.mark.parametrize("folder", ["gpvi", "benchmarks", "tests"])
def test_every_source_compiles_without_warnings(folder):
    bad = []
    for path in (p for p in SOURCES if p.relative_to(ROOT).parts[0] == folder):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
            except (SyntaxError, SyntaxWarning, DeprecationWarning) as exc:
                bad.append(f"{path.relative_to(ROOT)}: {exc}")
    assert not bad, "\n".join(bad)
