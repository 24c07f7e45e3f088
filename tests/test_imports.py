"""What ``import gpvi`` and ``gpvi --help`` load, and what they leave alone (issue 58).

Heavy modules are imported where they are used: scikit-learn (and the SciPy statistics and pandas it pulls in) with
:class:`gpvi.GPClassifier` or a dataset loader that needs it, ArviZ with a diagnostic, matplotlib with a plot. Each
check runs in a fresh interpreter, as a user's script starts. (Pyro is imported by GPyTorch itself when installed.)
Importing gpvi changes no process-wide setting either: glibc malloc's thresholds are set only on request
(:mod:`gpvi.allocator`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("sklearn", "scipy.stats", "pandas", "matplotlib", "arviz")


def _loaded_after(code: str, env: dict[str, str] | None = None) -> dict:
    prog = (code + "\nimport sys, json\nprint(json.dumps({'heavy': sorted(m for m in " + repr(HEAVY) +
            " if m in sys.modules), 'applied': getattr(sys.modules.get('gpvi.allocator'), 'applied', False)}))")
    base = {k: v for k, v in os.environ.items() if k != "GPVI_MALLOC_THRESHOLDS"}
    out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={**base, "OMP_NUM_THREADS": "1", **(env or {})})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_gpvi_loads_no_heavy_optional_module():
    assert _loaded_after("import gpvi")["heavy"] == []


def test_gpvi_help_loads_no_heavy_optional_module():
    code = "import contextlib, io\nfrom gpvi.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n" \
           "    assert main(['--help']) == 0\n    assert main(['fit-classifier', '--help']) == 0"
    assert _loaded_after(code)["heavy"] == []


def test_the_classifier_and_the_loaders_still_load_what_they_need():
    got = _loaded_after("import gpvi\nfrom gpvi import GPClassifier\nassert gpvi.GPClassifier is GPClassifier\n"
                        "assert 'GPClassifier' in dir(gpvi) and set(gpvi.__all__) <= set(dir(gpvi))\n"
                        "assert all(getattr(gpvi, n) is not None for n in gpvi.__all__)\n"
                        "from gpvi.sklearn import GPClassifier as C\nassert C is GPClassifier")
    assert "sklearn" in got["heavy"]
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        import gpvi

        gpvi.NoSuchThing


def test_import_gpvi_leaves_the_allocator_alone_unless_asked():
    assert _loaded_after("import gpvi")["applied"] is False
    assert _loaded_after("import gpvi", {"GPVI_MALLOC_THRESHOLDS": "1"})["applied"] is _GLIBC
    code = "import contextlib, io, sys\nimport gpvi.cli\nwith contextlib.redirect_stdout(io.StringIO()):\n    {}"
    assert _loaded_after(code.format("gpvi.cli.main(['--help'])"))["applied"] is False    # a caller's process
    # the command's own process (argv from the command line): the thresholds are set, GPVI_MALLOC_THRESHOLDS=0 opts out
    entry = code.format("sys.argv = ['gpvi', '--help']; gpvi.cli.main()")
    assert _loaded_after(entry)["applied"] is _GLIBC
    assert _loaded_after(entry, {"GPVI_MALLOC_THRESHOLDS": "0"})["applied"] is False


def _glibc() -> bool:
    import platform

    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


_GLIBC = _glibc()
