"""The demo stops as a whole on Ctrl-C: an interrupted stage does not let the next one start."""

from __future__ import annotations

import io
import warnings

import pytest

import gpvi
from gpvi.demo import demo
from gpvi.exceptions import InterruptedRunWarning


def test_ctrl_c_in_a_stage_ends_the_demo(monkeypatch):
    def interrupted_run(self, target, init=None, **kw):
        warnings.warn("DSVI interrupted after 3 steps; returning the partial result", InterruptedRunWarning)
        return None

    def must_not_run(self, *a, **kw):
        raise AssertionError("the classifier stage started after Ctrl-C")

    monkeypatch.setattr(gpvi.DSVI, "run", interrupted_run)
    monkeypatch.setattr(gpvi.GPClassifier, "fit", must_not_run)
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt, match="interrupted after 3 steps"):
        demo(quick=True, progress_bar=False, out=out)
    assert "[1/2] Bodyfat" in out.getvalue() and "[2/2]" not in out.getvalue()
