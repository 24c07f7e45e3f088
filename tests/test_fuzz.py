"""A fuzz of every public entry point and every CLI command (issue 16, item 2).

Malformed inputs (NaN, inf, 1e308, object and string arrays, wrong shapes, empty arrays, booleans, negative or
float seeds, strings for numbers, wrong kernels, crafted files...) go to the models, the engines' constructors and
``run`` on tiny inputs, ``predict``, save/load, ``datasets.load`` and ``gpvi.cli.main``. The contract:

* the only exceptions are ``ValueError`` / ``TypeError`` (``NotPSDError`` is a ``ValueError``), or a
  ``NumericalFaultError`` that carries the last good state;
* an accepted input never gives a NaN result without a warning;
* the CLI answers 0 or 2 (one line ``gpvi: error: ...``), never a traceback.

Every case is a plain parametrised list (deterministic), with one hypothesis search over array contents
(``derandomize=True``). ``test_fuzz_counts`` records how many inputs the file tries.
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Any, Callable

import gpytorch
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gpvi
from gpvi.cli import main
from gpvi.exceptions import NumericalFaultError
from gpvi.inference.cvi.typeii import TypeII

F64 = torch.float64
CLEAN = (ValueError, TypeError)


# ------------------------------------------------------------------------------------------------ the contract
def _has_nan(obj: Any, depth: int = 0) -> bool:
    """Whether a result holds a NaN anywhere a user would read it."""
    if depth > 4 or obj is None:
        return False
    if isinstance(obj, torch.Tensor):
        return bool(obj.is_floating_point() and torch.isnan(obj.detach()).any())
    if isinstance(obj, np.ndarray):
        return bool(obj.dtype.kind == "f" and np.isnan(obj).any())
    if isinstance(obj, float):
        return math.isnan(obj)
    if isinstance(obj, (list, tuple)):
        return any(_has_nan(v, depth + 1) for v in obj)
    if isinstance(obj, dict):
        return any(_has_nan(v, depth + 1) for v in obj.values())
    if isinstance(obj, gpvi.numerics.predictive.MixturePredictive):
        return _has_nan((obj.mean, obj.var), depth + 1)
    if isinstance(obj, gpvi.posteriors.base.Posterior):
        return _has_nan((obj.mean, getattr(obj, "value", None)), depth + 1)
    if isinstance(obj, (gpvi.GPRegression, gpvi.models.classification.LatentGP)):
        return _has_nan(obj.X, depth + 1)
    return False


OUTCOMES: dict[str, int] = {}
"""Tally of :func:`attempt` outcomes in this session (``pytest -s -k fuzz_counts`` prints it after the others)."""


def attempt(fn: Callable[[], Any]) -> str:
    """Run ``fn`` under the contract; return ``"refused"``, ``"fault"`` or ``"accepted"``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn()
        except CLEAN:
            OUTCOMES["refused"] = OUTCOMES.get("refused", 0) + 1
            return "refused"
        except NumericalFaultError as err:
            assert err.state is not None, "a NumericalFaultError must carry the last good state"
            OUTCOMES["fault"] = OUTCOMES.get("fault", 0) + 1
            return "fault"
    if _has_nan(out):
        said = [w for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
        assert said, f"a NaN result without a warning: {out!r}"
        OUTCOMES["nan-with-warning"] = OUTCOMES.get("nan-with-warning", 0) + 1
        return "accepted"
    OUTCOMES["accepted"] = OUTCOMES.get("accepted", 0) + 1
    return "accepted"


# ------------------------------------------------------------------------------------------------ inputs
def _data(n=8, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d))
    return X, np.sin(3 * X[:, 0]) + 0.1 * rng.standard_normal(n)


X0, Y0 = _data()
L0 = (Y0 > 0).astype(int)


def _with(cell, value):
    X = X0.copy()
    X[cell] = value
    return X


def _obj(*cells):
    X = X0.astype(object)
    for (i, j), v in cells:
        X[i, j] = v
    return X


BAD_X = {
    "nan": _with((0, 0), np.nan), "inf": _with((1, 1), np.inf), "-inf": _with((2, 0), -np.inf),
    "1e308-cell": _with((3, 1), 1e308), "-1e308-cell": _with((3, 0), -1e308), "spread-1e200": X0 * 1e200,
    "scale-1e150": X0 * 1e150, "scale-1e-300": X0 * 1e-300, "constant-1e300": np.c_[X0[:, 0], np.full(8, 1e300)],
    "offset-1e9": X0 + 1e9, "1-D": X0[:, 0], "3-D": X0[None], "scalar": 1.0, "0-rows": np.zeros((0, 2)),
    "0-cols": np.zeros((8, 0)), "1-row": X0[:1], "short": X0[:5], "object-str": _obj(((0, 1), "2")),
    "object-none": _obj(((0, 0), None)), "object-list": _obj(((1, 1), [1.0])), "str-array": np.full((8, 2), "a"),
    "complex": X0.astype(complex), "bool": X0 > 0, "int-2**60": np.full((8, 2), 2 ** 60, dtype=np.int64),
    "ragged": [[1.0, 2.0], [3.0]], "None": None, "string": "X", "dict": {"a": 1.0}, "float32-inf":
    _with((0, 0), np.inf).astype(np.float32), "duplicated-rows": np.repeat(X0[:4], 2, axis=0),
    "constant-column": np.c_[X0[:, 0], np.ones(8)], "tensor-f32": torch.tensor(X0, dtype=torch.float32),
    "tensor-grad": torch.tensor(X0, requires_grad=True),
}
BAD_Y = {
    "nan": np.r_[np.nan, Y0[1:]], "inf": np.r_[Y0[:-1], np.inf], "1e308": np.r_[1e308, Y0[1:]],
    "2-D": np.c_[Y0, Y0], "column": Y0[:, None], "short": Y0[:5], "constant": np.ones(8), "str": np.full(8, "a"),
    "object": np.array(list(Y0[:7]) + ["x"], dtype=object), "None": None, "bool": Y0 > 0, "empty": np.zeros(0),
    "scalar": 3.0, "three-classes": np.arange(8) % 3, "one-class": np.ones(8, dtype=int), "labels-1-2":
    1 + L0, "labels-pm1": 2 * L0 - 1, "labels-str": np.where(L0 == 1, "yes", "no"),
}
BAD_SCALARS = {"-1": -1, "0": 0, "0.5": 0.5, "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "1e308": 1e308,
               "str": "3", "None": None, "True": True, "list": [1], "np-neg": np.int64(-3), "complex": 1j}


def _reg():
    return gpvi.GPRegression(X0, Y0)


def _cls():
    return gpvi.GPClassification(X0, L0)


def _quad():
    return gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), ["a", "b"])


# ------------------------------------------------------------------------------------------------ models
MODELS = {
    "GPRegression": lambda X, y: gpvi.GPRegression(X, y),
    "GPClassification": lambda X, y: gpvi.GPClassification(X, y),
    "LatentGP-gaussian": lambda X, y: gpvi.models.classification.LatentGP(X, y, likelihood=gpvi.models.likelihoods.Gaussian(0.1)),
    "BayesianLogisticRegression": lambda X, y: gpvi.BayesianLogisticRegression(X, y),
    "GPClassifier.fit": lambda X, y: gpvi.GPClassifier(hyperparameters="fixed", max_sweeps=3).fit(X, y).predict_proba(X0),
}


def _evaluate(model):
    """Use an accepted model once, so a deferred failure shows up here."""
    if isinstance(model, gpvi.GPRegression):
        return model, model.log_joint(model.initial_theta())
    if isinstance(model, gpvi.models.classification.LatentGP):
        return model, model.kernel_matrix()
    if isinstance(model, gpvi.BayesianLogisticRegression):
        return model, model.log_joint(torch.zeros(model.dim, dtype=F64))
    return model


@pytest.mark.parametrize("which", sorted(MODELS))
@pytest.mark.parametrize("xname", sorted(BAD_X))
def test_models_bad_X(which, xname):
    y = L0 if which != "GPRegression" and "gaussian" not in which else Y0
    attempt(lambda: _evaluate(MODELS[which](BAD_X[xname], y)))


@pytest.mark.parametrize("which", sorted(MODELS))
@pytest.mark.parametrize("yname", sorted(BAD_Y))
def test_models_bad_y(which, yname):
    attempt(lambda: _evaluate(MODELS[which](X0, BAD_Y[yname])))


BAD_KERNELS = {
    "ard-5": lambda: gpytorch.kernels.RBFKernel(ard_num_dims=5),
    "scaled-ard-1": lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=1)),
    "active-dims-9": lambda: gpytorch.kernels.RBFKernel(active_dims=[9]),
    "interval-constraint": lambda: gpytorch.kernels.RBFKernel(
        lengthscale_constraint=gpytorch.constraints.Interval(0.1, 2.0)),
    "batch-kernel": lambda: gpytorch.kernels.RBFKernel(batch_shape=torch.Size([3])),
    "not-a-kernel": lambda: "rbf", "module": lambda: torch.nn.Linear(2, 2),
    "periodic-ok": lambda: gpytorch.kernels.PeriodicKernel(),
    "sum-ok": lambda: gpytorch.kernels.RBFKernel() + gpytorch.kernels.LinearKernel(),
}


@pytest.mark.parametrize("kname", sorted(BAD_KERNELS))
@pytest.mark.parametrize("which", ["GPRegression", "GPClassification"])
def test_models_bad_kernels(kname, which):
    make = gpvi.GPRegression if which == "GPRegression" else gpvi.GPClassification
    y = Y0 if which == "GPRegression" else L0
    attempt(lambda: _evaluate(make(X0, y, kernel=BAD_KERNELS[kname]())))


@pytest.mark.parametrize("name,value", [
    ("prior", "normal"), ("prior", torch.distributions.Normal(torch.zeros(5, dtype=F64), 1.0)),
    ("jitter", -1.0), ("jitter", math.nan), ("max_jitter", 1e-20), ("batch_size", 0), ("batch_size", 2.5),
    ("feature_names", ["a"]), ("feature_names", ["a", "a"]), ("feature_names", "ab"), ("feature_names", [1, 2]),
    ("device", "nope"), ("device", 3),
])
def test_regression_bad_options(name, value):
    attempt(lambda: _evaluate(gpvi.GPRegression(X0, Y0, **{name: value})))


@pytest.mark.parametrize("tname", ["nan", "inf", "1e308", "short", "long", "str", "None-list", "2-D-wrong",
                                   "3-D", "object", "empty-batch"])
def test_log_joint_and_predict_bad_theta(tname):
    model = _reg()
    theta = {"nan": [math.nan] * 4, "inf": [math.inf] * 4, "1e308": [1e308] * 4, "short": [0.0] * 3,
             "long": [0.0] * 5, "str": "0000", "None-list": [None] * 4, "2-D-wrong": np.zeros((2, 3)),
             "3-D": np.zeros((1, 1, 4)), "object": np.array([0, "1", 0, 0], dtype=object),
             "empty-batch": np.zeros((0, 4))}[tname]
    attempt(lambda: model.log_joint(theta))
    attempt(lambda: model.predict(theta, X0[:2]))
    attempt(lambda: _cls().kernel_matrix(theta[:3] if isinstance(theta, list) else theta))


# ------------------------------------------------------------------------------------------------ engines
def _small(name: str) -> dict[str, Any]:
    """Settings that keep a run of each engine to a few milliseconds."""
    return {"ML2": dict(num_restarts=1, max_iter=5), "DSVI": dict(num_steps=3, num_elbo_draws=5, progress_bar=False),
            "DSVIARD": dict(num_steps=3, progress_bar=False, num_elbo_draws=5),
            "CVI": dict(num_steps=3, progress_bar=False),
            "NUTS": dict(num_chains=1, num_warmup=3, num_draws=3, progress_bar=False, max_tree_depth=3),
            "HMC": dict(num_chains=1, num_warmup=3, num_draws=3, progress_bar=False, num_leapfrog_steps=2),
            "SKGaussian": dict(num_steps=6, window=3, num_elbo_draws=5, progress_bar=False),
            "SKExpFamily": dict(family=gpvi.inference.salimans_knowles.Gamma(), num_steps=5),
            "TypeII": dict(cvi=gpvi.CVI(num_steps=2, progress_bar=False), max_iter=1, inner_num_steps=2)}[name]


ENGINES: dict[str, Any] = {"ML2": gpvi.ML2, "DSVI": gpvi.DSVI, "DSVIARD": gpvi.inference.dsvi.DSVIARD, "CVI": gpvi.CVI,
                           "NUTS": gpvi.NUTS, "HMC": gpvi.HMC, "SKGaussian": gpvi.SKGaussian,
                           "SKExpFamily": gpvi.inference.salimans_knowles.SKExpFamily, "TypeII": TypeII}


def _target_for(name: str):
    if name in ("CVI", "TypeII"):
        return _cls()
    if name == "DSVIARD":
        return gpvi.BayesianLogisticRegression(X0, L0, prior_var=None)
    if name == "ML2":
        return _reg()
    return _quad()


def _run(name: str, engine: Any, target: Any = None) -> Any:
    if name == "SKExpFamily":         # Algorithm 1 on a Gamma(3, 1) target, from a proper Gamma start
        log_p = target if target is not None else (lambda x: 2.0 * torch.log(x.clamp_min(1e-300)) - x)
        return engine.run(log_p, init=gpvi.inference.salimans_knowles.Gamma().natural(shape=2.0, rate=1.0))
    return engine.run(_target_for(name) if target is None else target)


def _params(name: str) -> list[str]:
    sig = inspect.signature(ENGINES[name].__init__)
    return [p for p in sig.parameters if p not in ("self", "settings", "family")]


_BUDGETS = ("num_steps", "num_draws", "num_warmup", "max_iter", "num_restarts", "inner_num_steps", "num_elbo_draws",
            "num_chains", "window", "max_tree_depth", "num_leapfrog_steps")
# Findings in files this fuzz does not own, reported to their owners; strict: the test fails once they are fixed.
KNOWN: dict[tuple[str, str, str], str] = {}
ENGINE_SETTINGS = [pytest.param(e, p, v, id=f"{e}-{p}-{v}",
                                marks=[pytest.mark.xfail(strict=True, reason=KNOWN[(e, p, v)])]
                                if (e, p, v) in KNOWN else [])
                   for e in sorted(ENGINES) for p in _params(e) for v in sorted(BAD_SCALARS)]


@pytest.mark.parametrize("engine,pname,vname", ENGINE_SETTINGS)
def test_engine_constructor_and_run_with_bad_settings(engine, pname, vname):
    """Every constructor argument of every engine with every malformed scalar: refused at construction, or the
    engine then runs on a tiny target within the contract (a later failure must still be a clean one)."""
    value = BAD_SCALARS[vname]
    made: list[Any] = []
    if attempt(lambda: made.append(ENGINES[engine](**{**_small(engine), pname: value}))) != "accepted":
        return
    if pname in _BUDGETS and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 50:
        return                                          # a huge budget is a valid request, not a fuzz case
    attempt(lambda: _run(engine, made[0]))


BAD_INITS = {"nan": [math.nan, 0.0], "inf": [math.inf, 0.0], "1e308": [1e308, 1e308], "short": [0.0],
             "str": "ab", "object": np.array([0, "x"], dtype=object), "3-D": np.zeros((1, 1, 2)),
             "empty": np.zeros(0), "bool": [True, False], "big": [1e6, -1e6], "None-list": [None, None]}


@pytest.mark.parametrize("engine", ["ML2", "DSVI", "NUTS", "HMC", "SKGaussian", "SKExpFamily"])
@pytest.mark.parametrize("iname", sorted(BAD_INITS))
def test_engine_run_with_bad_init(engine, iname):
    eng = ENGINES[engine](**{**_small(engine), **({"prior": True} if engine == "ML2" else {})})
    if engine == "SKExpFamily":
        attempt(lambda: eng.run(lambda x: -x, init=BAD_INITS[iname]))
    else:
        attempt(lambda: eng.run(_quad(), init=BAD_INITS[iname]))


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("target", ["object", "string", "None", "no-names", "nan-target"])
def test_engine_run_with_bad_targets(engine, target):
    tgt = {"object": object(), "string": "gp", "None": None, "no-names": type("T", (), {"log_joint": lambda s, t: t})(),
           "nan-target": gpvi.Target(lambda th: th.sum(-1) * math.nan, ["a", "b"])}[target]
    eng = ENGINES[engine](**_small(engine))
    attempt(lambda: _run(engine, eng, tgt))


# ------------------------------------------------------------------------------------------------ predict
@pytest.fixture(scope="module")
def fitted():
    model = _reg()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = gpvi.ML2(num_restarts=1, seed=0).run(model)
        gauss = gpvi.GaussianPosterior(point.theta, 0.01 * torch.eye(4, dtype=F64), model.names, model)
        clf = gpvi.GPClassifier(hyperparameters="fixed", max_sweeps=3).fit(X0, L0)
    return point, gauss, clf


@pytest.mark.parametrize("xname", sorted(BAD_X) + ["X*1e300", "X*1e100", "wrong-width"])
def test_predict_bad_inputs(xname, fitted):
    X = {"X*1e300": X0 * 1e300, "X*1e100": X0 * 1e100, "wrong-width": np.zeros((3, 5))}.get(xname, BAD_X.get(xname))
    point, gauss, clf = fitted
    attempt(lambda: point.predict(X))
    attempt(lambda: gauss.predict(X, num_draws=5))
    attempt(lambda: clf.predict_proba(X))
    attempt(lambda: clf.decision_function(X))


@pytest.mark.parametrize("arg", [0, -1, 2.5, "5", None, True, math.nan])
def test_predict_bad_settings(arg, fitted):
    point, gauss, _ = fitted
    attempt(lambda: gauss.predict(X0, num_draws=arg))
    attempt(lambda: gauss.predict(X0, seed=arg))
    attempt(lambda: gauss.sample(arg))
    attempt(lambda: point.summary(prob=arg))
    pred = point.predict(X0[:3])
    attempt(lambda: pred.interval(arg))
    attempt(lambda: pred.quantile(arg))
    attempt(lambda: pred.log_prob(arg))


# ------------------------------------------------------------------------------------------------ save / load
def test_save_and_load_bad_inputs(tmp_path, fitted):
    point, _, clf = fitted
    from gpvi.io import SavedFit, load_fit, save_fit

    good = SavedFit(kind="regression", method="ml2", features=["a", "b"], target="y", x_mean=np.zeros(2),
                    x_std=np.ones(2), posterior=point)
    save_fit(tmp_path / "ok.pt", good)
    files = {"missing": tmp_path / "nope.pt", "folder": tmp_path, "empty": tmp_path / "empty.pt",
             "text": tmp_path / "t.pt", "dict": tmp_path / "d.pt", "truncated": tmp_path / "trunc.pt"}
    files["empty"].write_bytes(b"")
    files["text"].write_text("not a fit")
    torch.save({"format": "gpvi-fit", "version": 99}, files["dict"])
    files["truncated"].write_bytes((tmp_path / "ok.pt").read_bytes()[:100])
    for p in files.values():
        assert attempt(lambda: load_fit(p)) == "refused", p
    for bad in ("fit", None, 3, point, SavedFit(kind="regression", method="ml2", features=["a"], target="y",
                                                x_mean=np.zeros(1), x_std=np.ones(1), posterior=point)):
        attempt(lambda: save_fit(tmp_path / "x.pt", bad))
    with pytest.raises(OSError):        # a folder that does not exist: Python's own error (the CLI checks first)
        save_fit(tmp_path / "no" / "dir.pt", good)
    back = load_fit(tmp_path / "ok.pt")
    for xname in ("nan", "1-D", "object-str", "wrong", "None"):
        X = BAD_X.get(xname, np.zeros((2, 3)))
        attempt(lambda: back.predict(X))


# ------------------------------------------------------------------------------------------------ datasets
@pytest.mark.parametrize("name", ["boston", "nope", "", None, 3, "BOSTON", "pima"])
@pytest.mark.parametrize("kw", [{}, {"seed": -1}, {"seed": 1.5}, {"seed": "0"}, {"test_fraction": 2.0},
                                {"test_fraction": math.nan}, {"bogus": 1}, {"seed": True}])
def test_datasets_load_bad_arguments(name, kw):
    attempt(lambda: gpvi.datasets.load(name, **kw))


# ------------------------------------------------------------------------------------------------ the CLI
CSV = {
    "ok": "a,b,y\n" + "".join(f"{x:.4f},{z:.4f},{t:.4f}\n" for (x, z), t in zip(X0, Y0)),
    "labels": "a,b,label\n" + "".join(f"{x:.4f},{z:.4f},{t}\n" for (x, z), t in zip(X0, L0)),
    "huge": "a,b,y\n1,2,3\n4,1e308,6\n5,6,7\n", "tiny": "a,b,y\n1e-300,2e-300,3\n4e-300,1e-300,6\n5e-300,6e-300,7\n",
    "strings": "a,b,y\n1,x,3\n4,5,6\n", "bom": "\ufeffa,b,y\n1,2,3\n4,5,6\n7,8,1\n", "quoted": 'a,"b,c",y\n1,2,3\n',
    "binary": "\x00\x01\x02", "underscore": "a,b,y\n1,1_0,3\n4,5,6\n", "spaces": "a,b,y\n 1 , 2 ,3\n4,5,6\n7,8,9\n",
}


def _cli_cases() -> list[list[str]]:
    r, c = "{ok}", "{labels}"
    cases = [[], ["nope"], ["--version"], ["demo", "--seed", "-1"], ["demo", "--seed", "1_0"],
             ["demo", "--seed", "1.5"], ["demo", "--bogus"]]
    for name in CSV:
        cases += [["fit-regression", "{%s}" % name, "--target", "y", "--method", "ml2", "--restarts", "1"],
                  ["fit-classifier", "{%s}" % name, "--target", "label", "--mode", "full"]]
    for flag in ("--restarts", "--num-steps", "--seed"):
        for v in ("-1", "0", "1_000", "1.5", "", " 3", "\u0663", "1e3", "nan", "x"):
            cases.append(["fit-regression", r, "--target", "y", "--method", "dsvi" if flag == "--num-steps" else "ml2",
                          flag, v])
    cases += [["fit-regression", r, "--target", "nope"], ["fit-regression", r, "--target", "y", "--method", "ep"],
              ["fit-regression", r, "--target", "y", "--method", "ml2", "--num-draws", "5"],
              ["fit-regression", r, "--target", "y", "--method", "ml2", "--save", "{tmp}"],
              ["fit-regression", r, "--target", "y", "--method", "ml2", "--save", "{tmp}/no/such.pt"],
              ["fit-classifier", c, "--target", "label", "--likelihood", "cauchit"],
              ["fit-classifier", r, "--target", "y"], ["fit-classifier", c, "--target", "a"],
              ["predict", "{ok}", "{ok}"], ["predict", "{tmp}/none.pt", r], ["predict", "{fit}", "{huge}"],
              ["predict", "{fit}", "{strings}"], ["predict", "{fit}", "{labels}"], ["predict", "{fit}", r],
              ["predict", "{fit}", r, "--num-draws", "0"], ["predict", "{fit}", r, "--out", "{tmp}"],
              ["bench", "nope"], ["bench"]]
    return cases


CLI_CASES = _cli_cases()


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    paths = {"tmp": str(tmp)}
    for name, text in CSV.items():
        p = tmp / f"{name}.csv"
        if name == "binary":
            p.write_bytes(text.encode("latin-1"))
        else:
            p.write_text(text, encoding="utf-8")
        paths[name] = str(p)
    paths["fit"] = str(tmp / "fit.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["fit-regression", paths["ok"], "--target", "y", "--method", "ml2", "--restarts", "1",
                     "--no-progress", "--save", paths["fit"]]) == 0
    return paths


@pytest.mark.parametrize("argv", CLI_CASES, ids=[" ".join(a)[:60] for a in CLI_CASES])
def test_cli_commands(argv, cli_files, capsys):
    argv = [a.format(**cli_files) for a in argv]
    if argv and argv[0] in ("fit-regression", "fit-classifier"):
        argv.append("--no-progress")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        status = main(argv)
    out, err = capsys.readouterr()
    assert status in (0, 2), (argv, status, err)
    assert "Traceback" not in err
    if status == 2 and argv and argv[0] not in ("--version",) and "usage:" not in err:
        lines = [ln for ln in err.splitlines() if ln.startswith("gpvi: error: ")]
        assert len(lines) == 1, err
    if status == 0 and "nan" in out.lower().replace("natural", "").replace("nat_", ""):
        assert "gpvi: warning" in err, (argv, out)


# ------------------------------------------------------------------------------------------------ hypothesis
_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -1e308, 1e-308, 0.0]))


@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(X=hnp.arrays(np.float64, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=5), elements=_floats),
       scale=st.sampled_from([1.0, 1e-300, 1e150, 1e300]))
def test_hypothesis_regression_data_and_prediction(X, scale):
    y = np.linspace(-1.0, 1.0, X.shape[0])
    made: list[Any] = []
    if attempt(lambda: made.append(_evaluate(gpvi.GPRegression(X, y)))) == "accepted":
        model = made[0][0]
        attempt(lambda: model.predict(model.initial_theta(), X * scale))


def test_fuzz_counts():
    """How many inputs the file tries (reported in the issue); a floor so that cases are not lost silently."""
    n = (len(MODELS) * (len(BAD_X) + len(BAD_Y)) + 2 * len(BAD_KERNELS) + 13 + 11 * 3
         + len(ENGINE_SETTINGS) + 6 * len(BAD_INITS) + 5 * len(ENGINES)
         + (len(BAD_X) + 3) * 4 + 7 * 7 + 6 + 5 + 5 + 7 * 8 + len(CLI_CASES) + 80)
    assert n >= 1000, n
    print(f"\nfuzz: {n} inputs; outcomes of the calls made so far in this session: {OUTCOMES}")
