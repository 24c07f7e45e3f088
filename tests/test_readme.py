"""Every code block of README.md runs as written.

The ``python`` blocks are executed in order in one namespace (later blocks use names the earlier ones define).
Blocks whose full run is long (the README states how long) are shortened in the default suite by the substitutions
in ``QUICK`` below — each must match exactly once, so the README cannot drift away from what is tested; set
``GPVI_README_FULL=1`` to run every block exactly as written. The ``bash`` blocks are checked command by command:
every ``gpvi`` subcommand and option they show exists (``--help`` of that subcommand lists it), and the ``make``
targets exist in the Makefile.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path

import matplotlib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

QUICK: list[tuple[str, str]] = [
    # DSVI on Boston: several starts (5 MAP restarts, 3 distinct optima) and a finish to 0.01 nats; one Laplace start,
    # 100 steps and a 50-draw bound here.
    ('gpvi.DSVI(scale="full", seed=0).run(model)',
     'gpvi.DSVI(scale="full", seed=0, num_steps=100, num_elbo_draws=50, progress_bar=False).run(model, '
     'init="laplace")'),
    # ML-II: 5 restarts -> 1.
    ("gpvi.ML2(num_restarts=5, seed=0)", "gpvi.ML2(num_restarts=1, seed=0)"),
    # PSIS: 1000 draws of q through the batched log joint -> 100.
    ("q.psis(model, num_draws=1000, seed=0)", "q.psis(model, num_draws=100, seed=0)"),
    # gpvi.infer: a short DSVI, 100 PSIS draws and (if k-hat asks for it) a tiny NUTS run.
    ("gpvi.infer(model, seed=0)",
     "gpvi.infer(model, seed=0, engine=gpvi.DSVI(num_steps=100, num_elbo_draws=50, seed=0, progress_bar=False), "
     "nuts=gpvi.NUTS(num_chains=1, num_warmup=10, num_draws=10, max_tree_depth=3, progress_bar=False), "
     "num_psis_draws=100, progress_bar=False)"),
    # NUTS: 4 x (500 + 1000) transitions -> 1 x (10 + 10) with trees of depth <= 3.
    ("num_chains=4, num_warmup=500, num_draws=1000",
     "num_chains=1, num_warmup=10, num_draws=10, max_tree_depth=3, progress_bar=False"),
]


def _blocks(lang: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def _quick(code: str, used: list[str]) -> str:
    if os.environ.get("GPVI_README_FULL") == "1":
        return code
    for old, new in QUICK:
        n = code.count(old)
        if n:
            assert n == 1, f"README: {old!r} appears {n} times in one block"
            used.append(old)
            code = code.replace(old, new)
    return code


def test_every_python_block_of_the_readme_runs(capsys):
    matplotlib.use("Agg")
    blocks = _blocks("python")
    assert len(blocks) >= 5
    ns: dict = {"__name__": "__readme__"}
    used: list[str] = []
    for i, code in enumerate(blocks):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                exec(compile(_quick(code, used), f"README.md python block {i + 1}", "exec"), ns)
            except Exception as err:                           # name the block in the failure
                raise AssertionError(f"README python block {i + 1} failed: {err!r}\n{code}") from err
    if os.environ.get("GPVI_README_FULL") != "1":
        missing = [old for old, _ in QUICK if old not in used]
        assert not missing, f"QUICK substitutions that no longer match the README: {missing}"
    import matplotlib.pyplot as plt
    plt.close("all")


def _gpvi_commands() -> list[list[str]]:
    cmds = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("gpvi "):
                cmds.append(shlex.split(line)[1:])
    return cmds


def test_every_gpvi_command_and_option_in_the_readme_exists(capsys):
    from gpvi.cli import main

    cmds = _gpvi_commands()
    assert {c[0] for c in cmds} >= {"demo", "fit-regression", "fit-classifier", "predict", "bench"}
    for args in cmds:
        assert main([args[0], "--help"]) == 0
        help_text = capsys.readouterr().out
        for tok in args[1:]:
            for opt in re.findall(r"--[a-z][a-z-]*", tok):
                assert opt in help_text, f"README shows `gpvi {args[0]} {opt}`, which --help does not list"


def test_make_targets_in_the_readme_exist():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("make "):
                target = line.split()[1]
                assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"no make target {target!r}"
