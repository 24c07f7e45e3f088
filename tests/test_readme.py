"""Every code block of README.md and docs/*.md runs as written, and every link in them resolves.

Each page is tested on its own (one test per page). Its fenced blocks run in document order, in one namespace, in
a fresh temporary directory (later blocks use names and files that earlier ones define):

* ``python`` blocks are executed;
* ``bash`` blocks marked ``<!-- test: run -->`` on the line above run each ``gpvi ...`` line through
  ``gpvi.cli.main`` and require exit status 0 (other lines of such a block are not allowed);
* every other ``bash`` block may hold only ``gpvi`` and ``make`` lines, checked line by line: each ``gpvi``
  subcommand and option it shows exists (``gpvi SUBCOMMAND --help`` lists it) and each ``make`` target exists in the
  Makefile.

No other kind of block is allowed, so nothing in the documentation escapes these tests. Blocks whose full run is long
are shortened in the default suite by the substitutions in ``QUICK`` (per page): each must match at most once per
block and at least once per page, so a page cannot drift away from what is tested. ``GPVI_README_FULL=1`` runs every
block exactly as written.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- test: run -->"
FULL = os.environ.get("GPVI_README_FULL") == "1"

# A tiny NUTS run: 1 chain, 10 + 10 transitions, trees of depth <= 3.
_TINY_NUTS = "num_chains=1, num_warmup=10, num_draws=10, max_tree_depth=3, progress_bar=False"
# gpvi.infer with a short Adam-DSVI (no MAP restarts), 100 PSIS draws and one tiny NUTS run if k-hat asks for it.
_QUICK_INFER = ("gpvi.infer(model, seed=0, engine=gpvi.DSVI(optimizer=\"adam\", num_steps=100, num_elbo_draws=50, "
                f"seed=0, progress_bar=False), nuts=gpvi.NUTS({_TINY_NUTS}), num_psis_draws=100, max_extensions=0, "
                "progress_bar=False)")
# DSVI from one Laplace start, 100 steps and a 50-draw bound (the default: 30 MAP restarts, a run from each distinct
# optimum, a finish to 0.01 nats).
_QUICK_DSVI = "progress_bar=False, num_steps=100, num_elbo_draws=50).run(model, init=\"laplace\")"

QUICK: dict[str, list[tuple[str, str]]] = {
    "README.md": [
        # Pendulum: 315 training rows -> 60 for every block that uses the model.
        ("gpvi.GPRegression(ds.X_train, ds.y_train)", "gpvi.GPRegression(ds.X_train[:60], ds.y_train[:60])"),
        ("gpvi.infer(model, seed=0)", _QUICK_INFER),
        ("gpvi.DSVI(seed=0).run(model)", "gpvi.DSVI(seed=0, " + _QUICK_DSVI),
        # NUTS: 4 x (500 + 1000) transitions -> 1 x (10 + 10).
        ("num_chains=4, num_warmup=500, num_draws=1000", _TINY_NUTS),
    ],
    "docs/index.md": [],
    "docs/regression.md": [
        # Boston: 455 training rows -> 60.
        ("gpvi.GPRegression(ds.X_train, ds.y_train)", "gpvi.GPRegression(ds.X_train[:60], ds.y_train[:60])"),
        ("gpvi.DSVI(scale=\"full\", seed=0).run(model)", "gpvi.DSVI(scale=\"full\", seed=0, " + _QUICK_DSVI),
        ("num_chains=4, num_warmup=500, num_draws=1000", _TINY_NUTS),
        ("gpvi.infer(model, seed=0)", _QUICK_INFER),
        # Logistic regression: 5,000 and 2,000 DSVI steps -> 500 and 200.
        ("num_steps=5000", "num_steps=500"),
        ("num_steps=2000", "num_steps=200"),
        # The command line: pendulum's 315 training rows -> 40, DSVI from 1 restart and 50 steps.
        ("np.column_stack([pend.X_train, pend.y_train])", "np.column_stack([pend.X_train[:40], pend.y_train[:40]])"),
        ("--method dsvi --seed 0", "--method dsvi --seed 0 --restarts 1 --num-steps 50 --no-progress"),
    ],
    "docs/classification.md": [
        # Single-site CVI: 20,000 steps (100 sweeps) -> 2,000.
        ("num_steps=20_000", "num_steps=2_000"),
    ],
    "docs/latent.md": [
        # NUTS over (theta, log r, whitened f): 2 x (200 + 200) transitions -> 1 x (10 + 10).
        ("num_chains=2, num_warmup=200, num_draws=200", _TINY_NUTS),
    ],
    "docs/results.md": [],
    "docs/development.md": [],
}


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


_FENCE = re.compile(r"^(?P<mark><!-- test: run -->\n)?```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```[ \t]*$", re.M | re.S)


def _blocks(page: Path) -> list[tuple[str, str, bool]]:
    """``(language, code, marked to run)`` of every fenced block of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    return [(m["lang"].strip(), m["code"], m["mark"] is not None) for m in _FENCE.finditer(text)]


def _lines(code: str) -> list[str]:
    """The non-empty lines of a shell block, comments removed."""
    return [ln for ln in (line.split("#", 1)[0].strip() for line in code.splitlines()) if ln]


def _quick(code: str, subs: list[tuple[str, str]], used: set[str], where: str) -> str:
    if FULL:
        return code
    for old, new in subs:
        n = code.count(old)
        if n:
            assert n == 1, f"{where}: the QUICK substitution {old!r} matches {n} times in one block"
            used.add(old)
            code = code.replace(old, new)
    return code


def test_every_page_is_listed_and_every_block_is_python_or_bash():
    assert set(QUICK) == {_rel(p) for p in PAGES}, "QUICK must have an entry (maybe empty) for every page"
    for page in PAGES:
        for i, (lang, code, run) in enumerate(_blocks(page), 1):
            where = f"{_rel(page)} block {i}"
            assert lang in ("python", "bash"), f"{where}: {lang or 'unlabelled'} blocks are not tested"
            assert not run or lang == "bash", f"{where}: only bash blocks take {RUN_MARK}"
            if lang == "bash":
                programs = ("gpvi",) if run else ("gpvi", "make")
                for line in _lines(code):
                    assert line.split()[0] in programs, f"{where}: only {programs} lines are tested: {line}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_code_block_runs(page, tmp_path, monkeypatch, capsys):
    from gpvi.cli import main

    matplotlib.use("Agg")
    monkeypatch.chdir(tmp_path)                               # files the blocks write land here
    subs = QUICK[_rel(page)]
    ns: dict = {"__name__": "__docs__"}
    used: set[str] = set()
    for i, (lang, code, run) in enumerate(_blocks(page), 1):
        where = f"{_rel(page)} {lang} block {i}"
        code = _quick(code, subs, used, where)
        if lang == "python":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                try:
                    exec(compile(code, where, "exec"), ns)
                except Exception as err:                       # name the block in the failure
                    raise AssertionError(f"{where} failed: {err!r}\n{code}") from err
        elif run:
            for line in _lines(code):
                status = main(shlex.split(line)[1:])
                out = capsys.readouterr()
                assert status == 0, f"{where}: `{line}` exited with {status}\n{out.out}\n{out.err}"
    if not FULL:
        missing = [old for old, _ in subs if old not in used]
        assert not missing, f"QUICK substitutions of {_rel(page)} that no longer match it: {missing}"
    import matplotlib.pyplot as plt
    plt.close("all")


def _commands(program: str) -> list[tuple[str, list[str]]]:
    cmds = []
    for page in PAGES:
        for lang, code, _run in _blocks(page):
            if lang == "bash":
                cmds += [(_rel(page), shlex.split(ln)[1:]) for ln in _lines(code) if ln.startswith(program + " ")]
    return cmds


def test_every_gpvi_command_and_option_shown_exists(capsys):
    from gpvi.cli import main

    cmds = _commands("gpvi")
    assert {c[0] for _, c in cmds} >= {"demo", "fit-regression", "fit-classifier", "predict", "bench"}
    for page, args in cmds:
        assert main([args[0], "--help"]) == 0, f"{page}: no gpvi subcommand {args[0]!r}"
        help_text = capsys.readouterr().out
        for tok in args[1:]:
            for opt in re.findall(r"--[a-z][a-z-]*", tok):
                assert opt in help_text, f"{page} shows `gpvi {args[0]} {opt}`, which --help does not list"


def test_every_make_target_shown_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    cmds = _commands("make")
    assert {c[0] for _, c in cmds} >= {"demo", "test"}
    for page, args in cmds:
        assert re.search(rf"^{re.escape(args[0])}:", makefile, flags=re.M), f"{page}: no make target {args[0]!r}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``: lower case, punctuation dropped, spaces to hyphens."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    heads = re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", [*PAGES, ROOT / "CHANGELOG.md"], ids=_rel)
def test_every_relative_link_resolves(page):
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):               # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{_rel(page)} links to {target}, which does not exist"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{_rel(page)} links to {target}: no such heading in {dest.name}"


def test_readme_stays_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the guide belongs in docs/"
