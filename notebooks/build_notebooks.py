"""Write the gpvi notebooks (without outputs) from the readable cell sources below.

Usage (from the repository root or from ``notebooks/``)::

    .venv/bin/python notebooks/build_notebooks.py

Edit the cells here, not in the ``.ipynb`` files, and re-run; ``tests/test_notebooks.py`` checks that the committed
notebooks are what this script writes and executes all of them in quick mode (``GPVI_QUICK=1``).

Every notebook reads ``GPVI_QUICK`` in its first code cell: ``1`` gives a reduced smoke run (CI; a few seconds of
computation, numbers not converged), anything else the full settings meant for a user.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}


def _cells(spec: list[tuple[str, str]]):
    out = []
    for kind, src in spec:
        src = src.strip("\n")
        out.append(new_markdown_cell(src) if kind == "md" else new_code_cell(src))
    return out


# ================================================================================================== 01
NB01 = [
    ("md", r"""
# Posteriors over GP hyperparameters: ML-II vs DSVI vs NUTS

A GP regression model has hyperparameters $\theta$ (log squared lengthscales, log signal and noise variances).
The usual practice, **ML-II**, picks one $\theta$ by maximising the marginal likelihood. gpvi also gives you the
posterior $p(\theta \mid \mathcal D)$ under a prior $\mathcal N(0, 10)$ on each component, two ways, over *the same
log joint*:

* **DSVI** (Titsias & Lázaro-Gredilla 2014, section 3.4): a full-covariance Gaussian $q(\theta)$ fitted by doubly
  stochastic variational inference — seconds to minutes;
* **NUTS** (Pyro's kernel): the MCMC reference — much slower.

Predictions average over the posterior (a mixture over $\theta$ draws). This notebook compares the three on
**Bodyfat** (with and without the `Density` input) and **Boston**: marginal densities, test SMSE/NLPD, the DSVI
bound trace and ArviZ summaries.

*Run time*: about 6 minutes with the default settings on a 2-core machine (NUTS on Bodyfat dominates; for Boston
the saved draws of `benchmarks/nuts_boston.py` are used when present, otherwise NUTS adds about 20 minutes). With
the environment variable `GPVI_QUICK=1` (what CI uses) every run is cut to a few iterations and the notebook
finishes in well under a minute — its numbers are then **not** converged and not meant to be read.
"""),
    ("code", r"""
import os
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import torch
from IPython.display import display

warnings.filterwarnings("ignore", message="IProgress not found")   # text progress bars without ipywidgets
import gpvi  # noqa: E402

%matplotlib inline

QUICK = os.environ.get("GPVI_QUICK", "0") == "1"     # CI: GPVI_QUICK=1 (reduced, not converged)
SEED = 0
if QUICK:
    S = dict(restarts=1, dsvi_steps=150, nuts_chains=1, nuts_warmup=30, nuts_samples=30, nuts_depth=5,
             n_max=150, pred_draws=50, seeds=[0, 1], psis_draws=100)
    warnings.filterwarnings("ignore", category=gpvi.ConvergenceWarning)   # short runs do not converge
else:
    # dsvi_steps=None: the engine's default number of steps
    S = dict(restarts=5, dsvi_steps=None, nuts_chains=4, nuts_warmup=500, nuts_samples=500, nuts_depth=10,
             n_max=None, pred_draws=200, seeds=[0, 1, 2, 3, 4], psis_draws=1000)
PROGRESS = not QUICK
RESULTS = Path("..") / "benchmarks" / "results"     # benchmark results (the notebook runs from notebooks/)
print("GPVI_QUICK=1: reduced smoke run" if QUICK else "full settings", S)
"""),
    ("code", r"""
def run_methods(model, ds, *, nuts=True, mc=None, title=""):
    # ML-II; DSVI started at the ML-II estimate; NUTS started from draws of q (or a given (posterior, seconds)).
    posts, times = {}, {}
    t0 = time.perf_counter()
    posts["ML-II"] = gpvi.ML2(num_restarts=S["restarts"], seed=SEED, progress_bar=PROGRESS).run(model)
    times["ML-II"] = time.perf_counter() - t0
    kw = {} if S["dsvi_steps"] is None else {"num_steps": S["dsvi_steps"]}
    t0 = time.perf_counter()
    posts["DSVI"] = gpvi.DSVI(scale="full", seed=SEED, progress_bar=PROGRESS, **kw).run(model, init=posts["ML-II"])
    times["DSVI"] = time.perf_counter() - t0
    if mc is not None:
        posts["NUTS"], times["NUTS"] = mc
    elif nuts:
        t0 = time.perf_counter()
        posts["NUTS"] = gpvi.NUTS(num_chains=S["nuts_chains"], num_warmup=S["nuts_warmup"],
                                  num_draws=S["nuts_samples"], max_tree_depth=S["nuts_depth"], seed=SEED,
                                  progress_bar=PROGRESS).run(model, init=posts["DSVI"])
        times["NUTS"] = time.perf_counter() - t0
    cols = {"test SMSE": [], "test NLPD": [], "time (s)": []}
    for name, post in posts.items():
        pred = post.predict(ds.X_test, num_draws=S["pred_draws"])
        cols["test SMSE"].append(gpvi.metrics.smse(pred, ds.y_test))
        cols["test NLPD"].append(gpvi.metrics.nlpd(pred, ds.y_test))
        cols["time (s)"].append(times[name])
    return posts, gpvi.table.Table(list(posts), cols, title=title)


def overlay(posts, feature_names, names=None, title=None):
    # Paper Figure 4 style: NUTS histogram + KDE (black), DSVI Gaussian (dashed red), ML-II estimate (blue line).
    fig = gpvi.plots.compare_marginals(posts["DSVI"], posts["NUTS"], names, labels=("DSVI", "NUTS"), title=title)
    idx = [posts["NUTS"].names.index(n) for n in (names or posts["NUTS"].names)]
    for ax, j in zip(fig.axes, idx):
        ax.axvline(float(posts["ML-II"].theta[j]), color="C0", linewidth=1.2, label="ML-II")
        if j < len(feature_names):                       # log_lengthscale_sq[j] belongs to input j
            ax.set_title(f"{posts['NUTS'].names[j]}: {feature_names[j]}", fontsize=9)
    fig.axes[0].legend(fontsize=7, frameon=False)
    return fig


def subset(ds, n_max):
    # The first n_max training rows (quick mode only); the test set is unchanged.
    return (ds.X_train, ds.y_train) if n_max is None else (ds.X_train[:n_max], ds.y_train[:n_max])
"""),
    ("md", r"""
## 1. Bodyfat, and why ML-II is said to overfit it

Bodyfat (StatLib, 252 men) asks for the percentage of body fat from 14 body measurements. The target was not
measured independently: it was **computed** from one of the inputs, the body density from underwater weighing,
by Siri's equation

$$\text{body fat} = \frac{495}{\text{Density}} - 450 .$$

With `Density` among the inputs (the paper's 14-input task, `load_bodyfat()`'s default), the regression is
therefore almost deterministic: the GP needs one short lengthscale (for `Density`), a tiny noise variance, and
can switch every other input off (lengthscale $\to \infty$). What noise remains comes from a handful of rows where
`Density` and body fat disagree (cases 48, 76, 96 and 169, and case 182 with body fat 0; they are kept, as in every
published use of the data — see `gpvi/datasets/data/PROVENANCE.md`). The next cell checks Siri's equation on the
raw values.

The DSVI paper (Table 5) reports that **ML-II overfits Bodyfat**: test SMSE 0.1992 against 0.0726 for DSVI and
MCMC. The mechanism it has in mind: 16 hyperparameters fitted to 227 points by maximising one objective can commit
to lengthscales of irrelevant inputs that explain noise in the training rows, and a single $\theta$ ignores the
uncertainty in the noise variance and lengthscales; DSVI and MCMC average the predictive over $p(\theta\mid\mathcal
D)$ instead. Below we check whether that happens here.
"""),
    ("code", r"""
bodyfat = gpvi.datasets.load_bodyfat(seed=SEED)                  # 14 inputs incl. Density, seeded 90/10 split
print(bodyfat.n_train, "train /", bodyfat.n_test, "test rows; inputs:", ", ".join(bodyfat.feature_names))

# Siri's equation on the original units (undo the standardisation)
density = bodyfat.X_train[:, 0] * bodyfat.x_std[0] + bodyfat.x_mean[0]
fat = bodyfat.y_to_original(bodyfat.y_train)
resid = fat - (495.0 / density - 450.0)
print(f"|body fat - Siri(Density)|: median {resid.abs().median():.3f}, 95th percentile "
      f"{resid.abs().quantile(0.95):.3f}, max {resid.abs().max():.2f} percentage points "
      f"(target sd {bodyfat.y_std:.2f})")
print("training rows with |residual| > 1 point (0-based source rows):",
      bodyfat.train_indices[resid.abs() > 1].tolist())
"""),
    ("code", r"""
X, y = subset(bodyfat, S["n_max"])
bf_model = gpvi.GPRegression(X, y)
print(bf_model)
bf_posts, bf_table = run_methods(bf_model, bodyfat, title="Bodyfat (14 inputs): test metrics, standardised targets")
bf_table
"""),
    ("md", r"""
**Does ML-II overfit here?** Compare the rows above, and ML-II over several random splits in the next cell. In our
full runs (5 restarts, splits with seeds 0–4, all 227 training rows) ML-II finds the `Density` relation on every
split and reaches test SMSE of about 0.0002–0.013 — far *below* the paper's 0.1992, and below the paper's
DSVI/MCMC 0.0726 too. So the paper's ML-II failure does **not** reproduce with gpvi's ML-II (L-BFGS from seeded
restarts inside a box). We checked the obvious explanation, a poor local optimum: on splits 0–2, every one of 10
restarts ends at an optimum that predicts well (test SMSE at most 0.015). A different version or preprocessing of
the data is at least as likely; the paper does not say. The differences between the three methods are small on
this task: almost all posterior mass sits where the noise variance is tiny and `Density` does the work, so
averaging over $\theta$ changes little. Where averaging over $\theta$ helps is the *13-input* task without
`Density` (section 2).
"""),
    ("code", r"""
rows = {"with Density (14 inputs)": [], "without Density (13 inputs)": []}
for seed in S["seeds"]:
    for label, dens in (("with Density (14 inputs)", True), ("without Density (13 inputs)", False)):
        d = gpvi.datasets.load_bodyfat(seed=seed, include_density=dens)
        Xs, ys = subset(d, S["n_max"])
        fit = gpvi.ML2(num_restarts=S["restarts"], seed=SEED).run(gpvi.GPRegression(Xs, ys))
        rows[label].append(gpvi.metrics.smse(fit.predict(d.X_test), d.y_test))
gpvi.table.Table([f"split seed {s}" for s in S["seeds"]], rows, title="ML-II test SMSE over random splits")
"""),
    ("md", r"""
### Marginals: DSVI against NUTS

Each panel is one log-hyperparameter: the NUTS draws as a histogram with their kernel density estimate (black),
DSVI's Gaussian marginal (dashed red) and the ML-II estimate (blue). Irrelevant inputs have large log squared
lengthscales; their posterior is wide and shaped by the prior $\mathcal N(0, 10)$, while ML-II pushes them to the
edge of its box.
"""),
    ("code", r"""
overlay(bf_posts, bodyfat.feature_names, title="Bodyfat (14 inputs): DSVI vs NUTS marginals")
"""),
    ("md", r"""
Look for marginals a Gaussian cannot follow. In our full run (seed 0, 4 chains × 500 draws) two of them are
**bimodal**: `Chest` and `Wrist`. NUTS finds two explanations of the residual beside `Density` — either `Wrist` or
`Chest` is the second relevant input (log squared lengthscale about 2) while the other is switched off (about 7).
DSVI's Gaussian $q$ commits to one of them (`Wrist` relevant, `Chest` off): minimising
$\mathrm{KL}(q\,\|\,p)$ is mode-seeking. The chains rarely jump between the modes, so those two parameters also
have the largest R-hat and the smallest ESS — NUTS's `ConvergenceWarning` above says so. The table below puts
numbers on each marginal.
"""),
    ("code", r"""
gpvi.metrics.compare(bf_posts["DSVI"], bf_posts["NUTS"])    # a = DSVI, b = NUTS: dmean in NUTS sds, sd ratio, W1
"""),
    ("md", r"""
### The DSVI bound

The instantaneous bound estimate of every step and its rolling-window average (the paper's Figure 3 style).
A flat rolling average is what DSVI's convergence rule (`q.info["converged"]`) looks for.
"""),
    ("code", r"""
q = bf_posts["DSVI"]
print(f"ELBO {q.elbo:.3f} +- {q.elbo_se:.3f}; steps {q.info['steps']}; converged: {q.info['converged']}; "
      f"{q.info['time_s']:.1f} s")
gpvi.plots.bound(q)
"""),
    ("md", r"""
### ArviZ

Both posteriors export to `arviz.InferenceData` with one named variable per hyperparameter (`q.to_arviz()` draws
from the Gaussian $q$; the NUTS export keeps the chains and sampler statistics), so ArviZ's summaries and plots
work unchanged. For DSVI the draws are independent, so only the moment columns are meaningful.
"""),
    ("code", r"""
display(az.summary(bf_posts["DSVI"].to_arviz(), kind="stats"))
az.summary(bf_posts["NUTS"].to_arviz())
"""),
    ("md", r"""
### Can we trust q? PSIS, and `gpvi.infer`

Pareto-smoothed importance sampling of q against the exact log joint (`q.psis`) gives the diagnostic $\hat k$
(Vehtari et al. 2024; Yao et al. 2018): $\hat k \le 0.5$, q is close to the posterior; $\le 0.7$, its
importance-weighted draws are; above, sample the posterior. `gpvi.infer` makes that decision in one call (a Gaussian
q → PSIS → q, the weighted draws, or NUTS warm-started from q, with q's covariance as the mass matrix) and says what
it did in `post.report`. Its default engine is Salimans & Knowles' Hessian-free regression from every MAP optimum;
here it is given the DSVI engine fitted above.
"""),
    ("code", r"""
w = bf_posts["DSVI"].psis(num_draws=S["psis_draws"], seed=SEED)
print(f"PSIS k-hat {w.khat:.2f}, weights' ESS {w.ess:.0f} of {S['psis_draws']}; "
      f"IS log evidence {w.log_evidence:.2f} +- {w.log_evidence_se:.2f} vs DSVI bound {bf_posts['DSVI'].elbo:.2f}")
kw = {} if S["dsvi_steps"] is None else {"num_steps": S["dsvi_steps"]}
post = gpvi.infer(gpvi.GPRegression(X, y, feature_names=list(bodyfat.feature_names)), seed=SEED,
                  engine=gpvi.DSVI(scale="full", seed=SEED, progress_bar=PROGRESS, **kw),
                  nuts=gpvi.NUTS(num_chains=S["nuts_chains"], num_warmup=S["nuts_warmup"],
                                 num_draws=S["nuts_samples"], max_tree_depth=S["nuts_depth"], seed=SEED,
                                 progress_bar=PROGRESS),
                  num_psis_draws=S["psis_draws"], progress_bar=PROGRESS)
post.report
"""),
    ("md", r"""
## 2. Bodyfat without `Density` (13 inputs)

`load_bodyfat(include_density=False)` drops `Density`: the realistic task of predicting body fat from tape-measure
and scale measurements. Now the signal is weak and spread over several inputs, the noise is large, and the
hyperparameters are genuinely uncertain — the setting where averaging over them should pay off against a single
ML-II estimate.
"""),
    ("code", r"""
bodyfat13 = gpvi.datasets.load_bodyfat(seed=SEED, include_density=False)
X, y = subset(bodyfat13, S["n_max"])
bf13_model = gpvi.GPRegression(X, y)
bf13_posts, bf13_table = run_methods(bf13_model, bodyfat13, nuts=False,
                                     title="Bodyfat without Density (13 inputs): test metrics")
bf13_table
"""),
    ("code", r"""
s = bf13_posts["DSVI"].summary()
top = sorted(range(bodyfat13.n_features), key=lambda j: s.column("mean")[j])[:5]
print("most relevant inputs (shortest DSVI posterior-mean lengthscales):")
for j in top:
    r = s[s.index[j]]
    print(f"  {bodyfat13.feature_names[j]:8s} lengthscale median {r['nat_q50']:.3g}  "
          f"90% interval [{r['nat_q5']:.3g}, {r['nat_q95']:.3g}]")
"""),
    ("md", r"""
## 3. Boston

Boston housing (506 rows, 13 inputs, target censored at 50) is the data set of the paper's Figure 4. NUTS on
Boston is expensive (about 20 minutes for 4 chains on this 2-core machine), so with the full settings the notebook
uses the draws saved by `benchmarks/nuts_boston.py` (same split, model and prior) when they exist, and runs NUTS
itself otherwise. Quick mode runs everything on the first 150 training rows.
"""),
    ("code", r"""
boston = gpvi.datasets.load_boston(seed=SEED)
X, y = subset(boston, S["n_max"])
boston_model = gpvi.GPRegression(X, y)
saved = RESULTS / "nuts_boston_draws.npz"
mc = None
if not QUICK and SEED == 0 and saved.exists():
    z = np.load(saved)
    assert list(z["names"]) == boston_model.names
    mc_post = gpvi.SamplePosterior(torch.from_numpy(z["draws"]), list(z["names"]), boston_model)
    import json
    wall = json.loads((RESULTS / "nuts_boston.json").read_text())["data"]["wall_time_s"]
    mc = (mc_post, wall)
    print(f"NUTS draws from {saved}: {tuple(mc_post.draws.shape)} (chains, draws, D); that run took {wall:.0f} s")
boston_posts, boston_table = run_methods(boston_model, boston, mc=mc, title="Boston: test metrics")
boston_table
"""),
    ("code", r"""
names = ["log_lengthscale_sq[5]", "log_lengthscale_sq[12]", "log_signal_var", "log_noise_var"]
overlay(boston_posts, boston.feature_names, names, title="Boston: DSVI vs NUTS (paper Figure 4 style; all parameters in notebook 03)")
"""),
    ("code", r"""
gpvi.metrics.compare(boston_posts["DSVI"], boston_posts["NUTS"])
"""),
    ("md", r"""
## 4. A model written the statistician's way

Stan, PyMC and BoTorch users put priors on natural-scale quantities: a half-normal on the lengthscales, on the signal
and noise standard deviations, here with a constant kernel term whose variance has a prior registered on the GPyTorch
kernel. gpvi takes the model as written (`prior={name: distribution}` plus the registered prior) and samples
$\theta$ = the log values with the log-Jacobians added. On 12 rows of Boston (inputs `rm` and `lstat`) the posterior
is visibly skewed; `gpvi.infer` checks its Gaussian $q$ against the exact log joint (PSIS) and runs NUTS from it
when the check fails. `benchmarks/natural_priors.py` compares its answer with a long NUTS run (table below).
"""),
    ("code", r"""
import gpytorch
from torch.distributions import HalfNormal

cols = [list(boston.feature_names).index(c) for c in ("rm", "lstat")]
kernel = (gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
          + gpytorch.kernels.ConstantKernel(constant_prior=gpytorch.priors.HalfNormalPrior(1.0)))
small = gpvi.GPRegression(boston.X_train[:12, cols], boston.y_train[:12], kernel=kernel, feature_names=["rm", "lstat"],
                          prior={"lengthscale": HalfNormal(1.0), "signal_sd": HalfNormal(1.0),
                                 "noise_sd": HalfNormal(0.5)})
for name, prior in small.prior_summary().items():
    print(f"{name:26s} {prior}")
"""),
    ("code", r"""
kw = {}
if QUICK:   # a short DSVI and a tiny NUTS: not converged
    kw = dict(engine=gpvi.DSVI(optimizer="adam", num_steps=100, num_elbo_draws=50, seed=SEED, progress_bar=False),
              nuts=gpvi.NUTS(num_chains=1, num_warmup=10, num_draws=10, max_tree_depth=3, progress_bar=False),
              num_psis_draws=100, max_extensions=0)
t0 = time.perf_counter()
small_post = gpvi.infer(small, seed=SEED, progress_bar=PROGRESS, **kw)
print(f"gpvi.infer: {time.perf_counter() - t0:.0f} s")
print(small_post.report)
small_post.summary()
"""),
    ("code", r"""
from IPython.display import Image, Markdown

bench = RESULTS / "natural_priors.md"
if bench.exists():      # the committed benchmark: gpvi.infer and q against 4 x 1,000 NUTS draws, natural scale
    text = bench.read_text()
    display(Markdown(text[text.index("## "):]))
    display(Image(str(RESULTS / "natural_priors.png")))
"""),
    ("md", r"""
## Summary

* DSVI gives a full Gaussian posterior over all log-hyperparameters, started at ML-II, at a small fraction of the
  cost of NUTS; `gpvi.metrics.compare` and `gpvi.plots.compare_marginals` measure how close it is to NUTS.
* Predictions from any posterior are `post.predict(X, num_draws)` — a mixture over $\theta$ draws — scored with
  `gpvi.metrics.smse` / `nlpd`; the same code scores ML-II.
* On Bodyfat *with* `Density`, ML-II does not overfit in our runs (unlike the paper's Table 5); see notebook
  `03_reproduce_dsvi_table5.ipynb` for the full Table 5 comparison and `benchmarks/results/` for the measured runs.
"""),
]


# ================================================================================================== 02
NB02 = [
    ("md", r"""
# GP classification with CVI

`gpvi.GPClassifier` fits a GP classifier by **conjugate-computation variational inference** (CVI; Khan & Lin
2017, section 4): the Gaussian posterior $q(\mathbf f)$ is kept in site form, $2N$ numbers, and every step is an
exact GP-regression computation on pseudo-targets. Kernel hyperparameters are learned by maximising the ELBO
between CVI sweeps (type II). It follows scikit-learn's estimator conventions.

1. Ripley's two-dimensional synthetic problem: the decision boundary and the uncertainty of the latent function.
2. Pima and Ionosphere: CVI (full-batch and doubly stochastic single-site) against GPyTorch's variational GP
   (Adam) and scikit-learn's Laplace classifier — the ELBO against wall time, and test metrics.
3. Against MCMC: type-II CVI, fully Bayesian CVI (hyperparameters integrated out) and NUTS over the
   hyperparameters and the whitened latent values, on a subsample of Ripley's data.
4. Multi-class: the same comparison on iris and wine, read from the committed benchmark.
5. The prior on the hyperparameters: where the default's centre is far from the data (Sonar), and what
   `prior="scaled"` and `prior=None` do.
6. Beyond classification: the same CVI on Poisson counts (`gpvi.GPGeneralisedRegression`).

*Run time*: about 6 minutes with the default settings on 2 cores (section 3's NUTS is 5 of them); `GPVI_QUICK=1`
(CI) cuts budgets and skips Ionosphere.
"""),
    ("code", r"""
import os
import sys
import time
import warnings

import numpy as np
import torch
from IPython.display import display
from matplotlib.figure import Figure

warnings.filterwarnings("ignore", message="IProgress not found")   # text progress bars without ipywidgets
import gpvi  # noqa: E402

%matplotlib inline

QUICK = os.environ.get("GPVI_QUICK", "0") == "1"     # CI: GPVI_QUICK=1 (reduced budgets)
SEED = 0
if QUICK:
    S = dict(datasets=["pima"], adam_lr=0.1, adam_budget=2.0, ngd_lr=0.5, ngd_budget=1.0, grid=40)
else:
    S = dict(datasets=["pima", "ionosphere"], adam_lr=0.1, adam_budget=45.0, ngd_lr=0.5, ngd_budget=20.0, grid=120)
# learning rates: the best ones of the benchmark's sweeps on both data sets (NGD at lr 1.0 diverges on Ionosphere)
PROGRESS = not QUICK

# benchmark helpers (GPyTorch and scikit-learn runs on the same objective) live in ../benchmarks
sys.path.insert(0, os.path.abspath(".."))
from benchmarks.cvi_classification import gpytorch_run, sklearn_laplace  # noqa: E402
"""),
    ("md", r"""
## 1. Ripley's synthetic data: decision boundary and uncertainty

250 training points in two dimensions, each class a mixture of two Gaussians; the original 1000-point test set.
"""),
    ("code", r"""
ripley = gpvi.datasets.load_ripley()
t0 = time.perf_counter()
clf = gpvi.GPClassifier(likelihood="logit", mode="full", random_state=SEED, verbose=int(PROGRESS))
clf.fit(ripley.X_train, ripley.y_train)
print(f"fitted in {time.perf_counter() - t0:.1f} s; ELBO {clf.elbo_:.3f}; hyperparameters {clf.hyperparameters_}")
p = clf.predict_proba(ripley.X_test)[:, 1]
print(f"test error {gpvi.metrics.error_rate(p, ripley.y_test):.3f} (Ripley's Bayes rate is about 0.08), "
      f"log-loss {gpvi.metrics.log_loss_bits(p, ripley.y_test):.3f} bits")
clf.posterior_.summary()
"""),
    ("code", r"""
# predictive probability p(y*=1 | x*) and the latent standard deviation sd[f(x*)] on a grid
Xtr, ytr = ripley.X_train.numpy(), ripley.y_train.numpy()
g0 = np.linspace(Xtr[:, 0].min() - 0.5, Xtr[:, 0].max() + 0.5, S["grid"])
g1 = np.linspace(Xtr[:, 1].min() - 0.5, Xtr[:, 1].max() + 0.5, S["grid"])
G0, G1 = np.meshgrid(g0, g1)
grid = np.c_[G0.ravel(), G1.ravel()]
prob = clf.predict_proba(grid)[:, 1].reshape(G0.shape)
_, var = clf.posterior_.predict_latent(torch.as_tensor(grid))
sd = var.sqrt().numpy().reshape(G0.shape)

fig = Figure(figsize=(11, 4.2), layout="constrained")
ax1, ax2 = fig.subplots(1, 2)
cs = ax1.contourf(G0, G1, prob, levels=np.linspace(0, 1, 11), cmap="RdBu_r", alpha=0.8)
ax1.contour(G0, G1, prob, levels=[0.5], colors="k", linewidths=1.5)
fig.colorbar(cs, ax=ax1, label="p(y* = 1 | x*)")
cs2 = ax2.contourf(G0, G1, sd, levels=12, cmap="viridis")
ax2.contour(G0, G1, prob, levels=[0.5], colors="w", linewidths=1.2)
fig.colorbar(cs2, ax=ax2, label="sd of the latent f(x*)")
for ax, title in ((ax1, "predictive probability, boundary p = 0.5"), (ax2, "latent uncertainty")):
    ax.scatter(Xtr[ytr == 0, 0], Xtr[ytr == 0, 1], s=10, c="C0", edgecolors="k", linewidths=0.3, label="class 0")
    ax.scatter(Xtr[ytr == 1, 0], Xtr[ytr == 1, 1], s=10, c="C3", edgecolors="k", linewidths=0.3, label="class 1")
    ax.set_title(title)
    ax.set_xlabel("xs (standardised)")
ax1.set_ylabel("ys (standardised)")
ax1.legend(loc="lower left", fontsize=8)
fig
"""),
    ("md", r"""
The latent standard deviation is smallest where training points are dense and grows away from the data: there
the predictive probability is pulled back towards 1/2 (the logit predictive $\mathbb E_q[\sigma(f_*)]$ averages
over $q(f_*)$), which is what a point estimate of $f$ cannot do.

## 2. Pima and Ionosphere: CVI against GPyTorch VI and scikit-learn's Laplace

To compare optimisers on the **same objective**, every method runs at the same kernel hyperparameters
$\theta^\ast$ (those learned by `GPClassifier`), as in `benchmarks/cvi_classification.py`, whose helper functions
this notebook reuses:

* **CVI full** — all sites every step, one Cholesky per step ($\beta = 0.5$);
* **CVI stochastic** — one site per step with an $O(N^2)$ rank-one update of the cached factor;
* **GPyTorch VI + Adam** — `CholeskyVariationalDistribution`, inducing points fixed at the training inputs;
* **GPyTorch natural VI + NGD** — `NaturalVariationalDistribution` with natural-gradient steps;
* **scikit-learn Laplace** — `GaussianProcessClassifier` at $\theta^\ast$ (its Laplace Gaussian's ELBO is shown
  as a horizontal line) and with its own ML-II hyperparameters (test metrics only).

All ELBOs use gpvi's quadrature for the expected log-likelihood; the logit link throughout.
"""),
    ("code", r"""
from gpvi.inference.cvi import num_steps_for_sweeps
from gpvi.models.classification import GPClassification

results = {}
for name in S["datasets"]:
    ds = gpvi.datasets.load(name)
    clf = gpvi.GPClassifier(random_state=SEED).fit(ds.X_train, ds.y_train)
    theta = clf.theta_.clone()
    model = GPClassification(ds.X_train, ds.y_train, theta=theta)
    K = model.kernel_matrix(theta)
    runs = {}
    for mode in ("full", "stochastic"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            post = gpvi.CVI(mode=mode, beta=0.5, tol=1e-11, seed=SEED, progress_bar=False,
                            num_steps=num_steps_for_sweeps(2000 if mode == "full" else 200, model.num_data,
                                                           mode=mode)).run(model, init=theta)
        p = post.predict_proba(ds.X_test).numpy()
        runs[f"CVI {mode}"] = dict(times=list(post.trace["time_s"]), elbos=list(post.trace["elbo"]),
                                   elbo=post.elbo, p=p)
    best = max(r["elbo"] for r in runs.values())
    for label, natural, lr, budget in (("GPyTorch VI + Adam", False, S["adam_lr"], S["adam_budget"]),
                                       ("GPyTorch natural VI + NGD", True, S["ngd_lr"], S["ngd_budget"])):
        r = gpytorch_run(ds, model, K, model.kernel_at(theta), natural=natural, lr=lr, max_iter=20000,
                         budget_s=budget, target=best - 1e-3)
        runs[f"{label} (lr {lr})"] = dict(times=r["times"], elbos=r["elbos"], elbo=r["final_elbo"],
                                         metrics=r["metrics"])
    sk = sklearn_laplace(ds, clf.hyperparameters_, ds.n_features, model, K)
    results[name] = dict(ds=ds, runs=runs, sk=sk)
    print(f"{name}: N = {ds.n_train}, d = {ds.n_features}; best ELBO {best:.4f}")
"""),
    ("code", r"""
fig = Figure(figsize=(5.5 * len(results), 4), layout="constrained")
axes = fig.subplots(1, len(results), squeeze=False)[0]
for ax, (name, res) in zip(axes, results.items()):
    best = max(r["elbo"] for r in res["runs"].values())
    for label, r in res["runs"].items():
        t = np.maximum(np.asarray(r["times"], dtype=float), 1e-4)
        gap = np.maximum(best - np.asarray(r["elbos"], dtype=float), 1e-6)
        ax.loglog(t, gap, marker=".", markersize=3, label=label)
    ax.axhline(max(best - res["sk"]["fixed"]["elbo"], 1e-6), color="k", linestyle=":",
               label="scikit-learn Laplace (its q's ELBO)")
    ax.axhline(1e-3 * abs(best), color="0.5", linewidth=0.8, linestyle="--", label="1e-3 relative target")
    ax.set_title(f"{name}: ELBO gap to the best, against wall time")
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("best ELBO - ELBO (nats)")
axes[0].legend(fontsize=7)
fig
"""),
    ("code", r"""
def test_metrics(p, y):
    p = np.clip(np.asarray(p, dtype=float), 1e-15, 1 - 1e-15)
    return gpvi.metrics.error_rate(p, y), gpvi.metrics.log_loss_bits(p, y)

for name, res in results.items():
    ds, idx, cols = res["ds"], [], {"ELBO at theta*": [], "test error": [], "log-loss (bits)": []}
    for label, r in res["runs"].items():
        if "p" in r:
            err, ll = test_metrics(r["p"], ds.y_test)
        else:
            err, ll = r["metrics"]["error"], r["metrics"]["logloss_bits"]
        idx.append(label)
        cols["ELBO at theta*"].append(r["elbo"])
        cols["test error"].append(err)
        cols["log-loss (bits)"].append(ll)
    for label, key, elbo in (("scikit-learn Laplace at theta*", "fixed", res["sk"]["fixed"]["elbo"]),
                             ("scikit-learn Laplace, own hyperparameters", "own", float("nan"))):
        idx.append(label)
        cols["ELBO at theta*"].append(elbo)
        cols["test error"].append(res["sk"][key]["metrics"]["error"])
        cols["log-loss (bits)"].append(res["sk"][key]["metrics"]["logloss_bits"])
    display(gpvi.table.Table(idx, cols, title=f"{name}: N = {ds.n_train} train / {ds.n_test} test"))
"""),
    ("md", r"""
Full-batch CVI reaches the optimum of the ELBO in a handful of steps, each one Cholesky, with its default
$\beta = 0.5$ and no tuning; the variational methods then agree on test metrics (they optimise the same objective),
while Laplace's Gaussian has a visibly lower ELBO. GPyTorch's optimisers need their learning rate chosen: the
rates used here are the best of the benchmark's sweeps, and NGD at rate 1.0, the best on Pima, diverges on
Ionosphere.
The measured comparison on four data sets, with times to a 1e-3 target over learning-rate sweeps, is in
[`benchmarks/results/cvi_classification.md`](../benchmarks/results/cvi_classification.md); the cost of single-site
steps against $N$ is in [`benchmarks/results/cvi_step_cost.md`](../benchmarks/results/cvi_step_cost.md).
"""),
    ("md", r"""
## 3. Against MCMC: the hyperparameters integrated out

Type II fixes the kernel hyperparameters $\theta$ at one value. Two answers integrate over them:

* **fully Bayesian CVI** (`gpvi.inference.cvi.FullyBayesianCVI`, also `GPClassifier(hyperparameters="bayes")`):
  a Gaussian $q(\theta)$ fitted (by Salimans & Knowles' Hessian-free regression, the default, or DSVI) to EP's
  approximate evidence, $\max_{q(\theta)}\,\mathbb E_q[\log Z_{EP}(\theta) + \log p(\theta)] + \mathcal H[q]$
  (`evidence="cvi"` uses the profiled CVI bound $\mathcal L_{CVI}(\theta)$ instead, a lower bound whose gap grows
  with the signal variance), and predictions averaged over draws of $q(\theta)$, each with its converged CVI
  posterior;
* **NUTS** over $\theta$ and the whitened latent values $\mathbf v$ with $\mathbf f = L_\theta \mathbf v$
  (`gpvi.models.whitened.WhitenedLatentGP`): no variational approximation at all, the reference.

On a random subsample of Ripley's training set (the NUTS run costs one $O(N^3)$ factorisation per leapfrog step);
the test set is the full one. Prior on $\theta$: $\mathcal N(0, 10 I)$ for all three.
"""),
    ("code", r"""
from gpvi.inference.cvi import FullyBayesianCVI
from gpvi.inference.salimans_knowles import SKGaussian
from gpvi.models.whitened import WhitenedLatentGP

M = dict(n=30, chains=1, warmup=30, draws=30, fb_draws=8) if QUICK else dict(n=80, chains=4, warmup=300, draws=500,
                                                                               fb_draws=32)
rows = np.sort(np.random.default_rng(SEED).choice(ripley.X_train.shape[0], size=M["n"], replace=False))
Xs, ys = ripley.X_train[rows], ripley.y_train[rows]
model = gpvi.GPClassification(Xs, ys)
answers, times = {}, {}

t0 = time.perf_counter()
typeii = gpvi.GPClassifier(random_state=SEED).fit(Xs, ys)
times["type-II"] = time.perf_counter() - t0
answers["type-II"] = torch.as_tensor(typeii.predict_proba(ripley.X_test)[:, 1])

t0 = time.perf_counter()
engine = (SKGaussian(num_steps=40, method="gradient", num_draws=4, num_elbo_draws=10, progress_bar=False)
          if QUICK else None)                       # None: FullyBayesianCVI's default (S&K Hessian-free, 200 steps)
fb = FullyBayesianCVI(engine, num_draws=M["fb_draws"], seed=SEED, progress_bar=PROGRESS).run(model)
times["fully Bayesian CVI"] = time.perf_counter() - t0
answers["fully Bayesian CVI"] = fb.predict_proba(ripley.X_test)

target = WhitenedLatentGP(model)
t0 = time.perf_counter()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")                                   # judged by the diagnostics printed below
    mc = gpvi.NUTS(num_chains=M["chains"], num_warmup=M["warmup"], num_draws=M["draws"], seed=SEED,
                   progress_bar=PROGRESS).run(target)
times["NUTS (theta, v)"] = time.perf_counter() - t0
D = model.dim
draws = mc.samples
keep = torch.linspace(0, draws.shape[0] - 1, min(200, draws.shape[0])).round().long()
answers["NUTS (theta, v)"] = target.predict_proba(draws[keep], ripley.X_test)
diag = mc.diagnostics()
print(f"NUTS: max split R-hat of theta {float(diag['r_hat'][:D].max()):.3f}, min bulk ESS of theta "
      f"{float(diag['ess_bulk'][:D].min()):.0f}, over all {D + M['n']} coordinates "
      f"{float(diag['r_hat'].max()):.3f} / {float(diag['ess_bulk'].min()):.0f}")
"""),
    ("code", r"""
nuts_mean, nuts_sd = draws[:, :D].mean(0), draws[:, :D].std(0)
display(gpvi.table.Table(list(model.names), {
    "type-II": typeii.theta_.tolist(),
    "fully Bayesian mean": fb.mean.tolist(), "fully Bayesian sd": fb.std.tolist(),
    "NUTS mean": nuts_mean.tolist(), "NUTS sd": nuts_sd.tolist(),
    "fully Bayesian - NUTS (NUTS sd)": ((fb.mean - nuts_mean) / nuts_sd).tolist()},
    title="log-hyperparameters: point, q(theta) and NUTS marginals"))
ref = answers["NUTS (theta, v)"]
cols = {"test error": [], "log-loss (bits)": [], "mean |p - p_NUTS|": [], "wall (s)": []}
for label, p in answers.items():
    err, ll = test_metrics(p, ripley.y_test)
    cols["test error"].append(err)
    cols["log-loss (bits)"].append(ll)
    cols["mean |p - p_NUTS|"].append(float((torch.as_tensor(p) - ref).abs().mean()))
    cols["wall (s)"].append(times[label])
display(gpvi.table.Table(list(answers), cols, title=f"Ripley, N = {M['n']} train / {len(ripley.y_test)} test"))

fig = Figure(figsize=(4 * D, 3), layout="constrained")
for j, ax in enumerate(fig.subplots(1, D)):
    x = draws[:, j].numpy()
    ax.hist(x, bins=30, density=True, color="0.8", label="NUTS")
    g = np.linspace(x.min() - 1, x.max() + 1, 200)
    m, sd = float(fb.mean[j]), float(fb.std[j])
    ax.plot(g, np.exp(-0.5 * ((g - m) / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), "C0", label="fully Bayesian q")
    ax.axvline(float(typeii.theta_[j]), color="C3", label="type-II")
    ax.set_title(model.names[j], fontsize=9)
fig.axes[0].legend(fontsize=7)
fig
"""),
    ("md", r"""
Integrating over $\theta$ moves the predictive probabilities towards NUTS's; type-II's are the ones furthest away
where the data leave $\theta$ uncertain (small $N$). $q(\theta)$ is Gaussian and EP's evidence is an
approximation of $\log p(\mathbf y \mid \theta)$, so small differences from NUTS remain by construction. The
benchmark [`benchmarks/results/classification_bayes.md`](../benchmarks/results/classification_bayes.md) makes the
same comparison on the binary benchmark sets, with wall times, and
[`classification_nuts_ref.md`](../benchmarks/results/classification_nuts_ref.md) against long NUTS references (in
quick mode the numbers above are not meaningful).
"""),
    ("md", r"""
## 4. Multi-class: the same comparison, read from the benchmark

With K classes, K latent GPs share the kernel and the softmax couples them. `FullyBayesianCVI()` on a
`GPMulticlass` model (or `GPClassifier(hyperparameters="bayes")`) fits $q(\theta)$ on **multi-class EP**'s evidence
for the softmax with $K \le 3$ (full $K\times K$ sites per point); `evidence="cvi"` uses the profiled multi-class
CVI bound (the only choice for robust-max and $K > 3$). NUTS runs over $\theta$ and one whitened latent vector per
class. Each fit takes minutes (NUTS ten or more), so this section shows the committed run of
`benchmarks/multiclass_bayes.py` on iris and wine instead of fitting here.
"""),
    ("code", r"""
import json
from pathlib import Path

RESULTS = Path("..") / "benchmarks" / "results"     # committed benchmark results (the notebook runs from notebooks/)
mc_rows, mc_cols = [], {"log loss": [], "mean |p - p_NUTS|": [], "max |theta - NUTS| (NUTS sd)": [], "wall (s)": []}
labels = {"map": "MAP-II", "bayes_ep": "fully Bayesian, EP (default)", "bayes": "fully Bayesian, CVI bound",
          "nuts": "NUTS (theta, V)"}
for name in ("iris", "wine"):
    path = RESULTS / f"multiclass_bayes_{name}.json"
    if not path.exists():
        print(f"{path} not found: run benchmarks/multiclass_bayes.py")
        continue
    r = json.loads(path.read_text())["data"]["results"][0]
    for key, label in labels.items():
        if key not in r:
            continue
        m = r[key]
        mc_rows.append(f"{name} ({r['N_train']} train, d={r['d']}): {label}")
        mc_cols["log loss"].append(m["log_loss"])
        mc_cols["mean |p - p_NUTS|"].append(m.get("prob_mad_vs_nuts", float("nan")))
        td = m.get("theta_diff_sd")
        mc_cols["max |theta - NUTS| (NUTS sd)"].append(max(abs(x) for x in td) if td else float("nan"))
        mc_cols["wall (s)"].append(m["time_s"])
if mc_rows:
    display(gpvi.table.Table(mc_rows, mc_cols, title="3-class softmax GP classification vs NUTS (committed benchmark run)"))
"""),
    ("md", r"""
On the bound, $q(\theta)$ sits at too small signal variances (the bound's gap grows with them) and predicts no
closer to NUTS than MAP-II; on multi-class EP every $\theta$ mean is within 0.2 NUTS sd and the test
probabilities are the closest to NUTS's, at about 40% of NUTS's wall time. The full tables (every $\theta$, NUTS
diagnostics, run details) are in [`multiclass_bayes_iris.md`](../benchmarks/results/multiclass_bayes_iris.md) and
[`multiclass_bayes_wine.md`](../benchmarks/results/multiclass_bayes_wine.md).
"""),
    ("md", r"""
## 5. The prior on the hyperparameters

Type-II (MAP-II) and the fully Bayesian fit put a prior on the kernel's log-hyperparameters. The default,
$\mathcal N(0, 10 I)$ as for regression, is centred at signal variance 1 and **lengthscale 1 on every input**. With
standardised inputs that is a sensible centre in a few dimensions, but in $d$ dimensions two typical points are
about $\sqrt{2d}$ apart, so at lengthscale 1 the kernel between them is about $e^{-d}$: on Sonar's 60 inputs the
prior's centre says that no two training points are related. Its standard deviation ($\sqrt{10}$ on each log
lengthscale², 60 times over) makes leaving that region expensive, and MAP-II stays there, predicting close to 1/2.
`GPClassifier(prior=...)` chooses:

* `"default"`: $\mathcal N(0, 10 I)$ (and a `gpvi.exceptions.InputScaleWarning` when an input's standard deviation is
  outside [0.1, 10]: standardise first);
* `"scaled"`: the same variance centred at the data-scaled start (lengthscale² $= d\,\mathrm{var}(x_j)$ on input
  $j$, signal variance 1), where the kernel between typical points is about $e^{-1}$; it gives the same
  predictions in any units of the inputs;
* `None`: no prior (ML-II; `hyperparameters="type2"` only), irrelevant inputs then run to the box and are named
  in a `gpvi.exceptions.BoundWarning`;
* any `torch.distributions` distribution over $	heta$ (in `clf.model_.names`' order).

On the 100-row subsample of Sonar used by the benchmarks (a fraction of a second per fit):
"""),
    ("code", r"""
from benchmarks.classification_bayes import subsample

sonar = gpvi.datasets.load("sonar")
Xs, ys = subsample(sonar.X_train, sonar.y_train, 100, SEED)          # the benchmarks' 100-row subsample
rows, cols = [], {"test error": [], "log-loss (bits)": [], "log signal var": [], "median lengthscale": [],
                  "median k(x, x') / signal var": [], "wall (s)": []}
for label, prior in (("default N(0, 10 I)", "default"), ("'scaled'", "scaled"), ("None (ML-II)", None)):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpvi.exceptions.BoundWarning)            # ML-II's irrelevant inputs end on the box
        clf = gpvi.GPClassifier(prior=prior, random_state=SEED).fit(Xs, ys)
    wall = time.perf_counter() - t0
    err, ll = test_metrics(clf.predict_proba(sonar.X_test)[:, 1], sonar.y_test)
    th = clf.theta_                                                   # log lengthscale^2 per input, log signal var
    Z = torch.as_tensor(Xs) / th[:-1].mul(0.5).exp()                  # inputs in lengthscale units
    corr = torch.exp(-0.5 * torch.cdist(Z, Z) ** 2)[torch.triu_indices(len(ys), len(ys), 1).unbind()]
    rows.append(label)
    for key, value in zip(cols, (err, ll, float(th[-1]), float(th[:-1].mul(0.5).exp().median()),
                                 float(corr.median()), wall)):
        cols[key].append(value)
display(gpvi.table.Table(rows, cols, title=f"Sonar, N = {len(ys)} train / {len(sonar.y_test)} test, d = {Xs.shape[1]}"))
"""),
    ("md", r"""
Under the default prior the fitted kernel relates no two training points (median correlation about $10^{-23}$), so
the predictions sit near 1/2 on the right side (a low error, a log loss near 1 bit); `"scaled"` keeps a median
correlation of order 0.1 and predicts with confidence; ML-II, without a prior, runs most lengthscales to the box.
The default stays $\mathcal N(0, 10 I)$; on the four binary benchmark sets and the three multi-class ones
`"scaled"` was never worse than it by more than 0.004 nats of test log loss and much better on Sonar and
Ionosphere, but it was chosen after those two rows had been seen, so they are not an independent test of it
([`classification_peers.md`](../benchmarks/results/classification_peers.md)). Under `"scaled"` the fully Bayesian
fit is checked against long NUTS runs in
[`classification_nuts_ref_scaled.md`](../benchmarks/results/classification_nuts_ref_scaled.md) (on Sonar it misses:
its log signal variance is 0.47 NUTS sd low).
"""),
    ("md", r"""
## 6. Beyond classification: Poisson counts

CVI needs only the expected log-likelihood of each site and its derivatives, so the same engine fits a GP to counts:
`gpvi.GPGeneralisedRegression` with $y_n \sim \mathrm{Poisson}(e^{f_n})$, $f \sim \mathcal{GP}(0, k_\theta)$, the
kernel's hyperparameters by type II on the CVI bound. Its `predict` is the predictive of the counts themselves,
$p(y_* \mid \mathcal D) = \int \mathrm{Poisson}(y_* \mid e^{f_*})\,q(f_*)\,df_*$, by quadrature: a mean and integer
quantiles. Sixty synthetic counts with rate $e^{1 + \sin x}$; the other likelihoods (negative binomial, Student-t,
Laplace, Beta), the likelihood's own parameters and the checks against GPyTorch and NUTS are in
[`docs/latent.md`](../docs/latent.md).
"""),
    ("code", r"""
from gpvi.inference.cvi import TypeII

g = torch.Generator().manual_seed(SEED)
x_counts = torch.linspace(0, 10, 60, dtype=torch.float64).unsqueeze(-1)
rate = lambda x: torch.exp(1.0 + torch.sin(x))                      # the true rate
counts = torch.poisson(rate(x_counts[:, 0]), generator=g)
t0 = time.perf_counter()
count_model = gpvi.GPGeneralisedRegression(x_counts, counts, likelihood="poisson")
count_post = TypeII(gpvi.CVI(progress_bar=False), prior=None).run(count_model)
print(f"fitted in {time.perf_counter() - t0:.1f} s; ELBO {count_post.elbo:.3f}; "
      f"hyperparameters {count_post.hyperparameters()}")
"""),
    ("code", r"""
# the predictive of the counts: its mean, its 90% interval (integers), the latent mean (the log rate) on the right;
# dotted: the true rate
fig = gpvi.plots.observation_predictive(count_post, latent=True, title="Poisson counts: predictive of y")
ax = fig.axes[0]
grid = torch.linspace(0, 10, 200, dtype=torch.float64)
ax.plot(grid.numpy(), rate(grid).numpy(), color="k", linestyle=":", linewidth=1, label="true rate")
fig
"""),
    ("code", r"""
# fresh counts at new inputs: how often does the 90% predictive interval hold them?
x_new = torch.rand(500, 1, generator=g, dtype=torch.float64) * 10
y_new = torch.poisson(rate(x_new[:, 0]), generator=g)
pred = count_post.predict(x_new)
lo, hi = pred.interval(0.9)
inside = ((y_new >= lo) & (y_new <= hi)).double().mean()
print(f"90% interval holds {inside:.3f} of 500 fresh counts (integer quantiles hold at least 90% each); "
      f"mean log predictive probability {pred.log_prob(y_new).mean():.3f} nats")
"""),
    ("md", r"""
The interval is wider than the Poisson noise alone where $q(f_*)$ is uncertain (at the ends of the data) and, as
integer quantiles, holds at least 90% of the mass at each input, so the fraction of fresh counts inside it is at or
somewhat above 0.9. The same fit from the command line: `gpvi fit-regression counts.csv --target y --likelihood
poisson --save fit.pt`, then `gpvi predict fit.pt new.csv` (columns `mean`, `sd`, `q5`, `q95`).
"""),
]


# ================================================================================================== 03
NB03 = [
    ("md", r"""
# Reproducing the DSVI paper's Table 5 and Figure 4

Titsias & Lázaro-Gredilla (2014), section 3.4: GP regression on **Boston**, **Bodyfat** and **Pendulum** with the
hyperparameters chosen by ML-II, by DSVI (a full Gaussian over the log-hyperparameters, vague normal priors) and by
MCMC. Table 5 reports test SMSE and NLPD; Figure 4 overlays DSVI's Gaussian marginals on the MCMC marginals.

This notebook shows

1. the benchmark's result, `benchmarks/results/dsvi_table5.md` (from `benchmarks/dsvi_table5.py`, several seeded
   splits, NUTS as the MCMC), when it exists — with the paper's numbers beside ours;
2. a **reduced** run of the same protocol made here (one split; shorter runs), always in quick mode
   (`GPVI_QUICK=1`, on at most 150 training rows, numbers not meaningful) and with the full settings when the
   benchmark's result is missing (or `RERUN = True`): that takes about 30–60 minutes on a 2-core machine, mostly
   NUTS.

The paper does not give its splits or its preprocessing; our numbers will differ. They are reported as measured,
never tuned towards the paper's.
"""),
    ("code", r"""
import os
import re
import time
import warnings
from pathlib import Path

from IPython.display import Markdown, display

warnings.filterwarnings("ignore", message="IProgress not found")   # text progress bars without ipywidgets
import gpvi  # noqa: E402

%matplotlib inline

QUICK = os.environ.get("GPVI_QUICK", "0") == "1"     # CI: GPVI_QUICK=1 (reduced, not converged)
RERUN = False                                       # True: run the reduced protocol even if the benchmark exists
SEED = 0
RESULTS = Path("..") / "benchmarks" / "results"
if QUICK:
    S = dict(restarts=1, dsvi_steps=100, nuts_chains=1, nuts_warmup=20, nuts_samples=30, nuts_depth=5, n_max=150,
             pred_draws=50)
    warnings.filterwarnings("ignore", category=gpvi.ConvergenceWarning)
else:
    S = dict(restarts=5, dsvi_steps=None, nuts_chains=2, nuts_warmup=300, nuts_samples=500, nuts_depth=10,
             n_max=None, pred_draws=200)
PROGRESS = not QUICK

# The paper's Table 5 (smse, nlpd) and its average times per experiment
PAPER = {
    "boston":   {"ML-II": (0.0743, 0.1783), "DSVI": (0.0709, 0.1425), "MCMC": (0.0699, 0.1317)},
    "bodyfat":  {"ML-II": (0.1992, -0.1284), "DSVI": (0.0726, -2.0750), "MCMC": (0.0726, -2.0746)},
    "pendulum": {"ML-II": (0.2727, 0.4537), "DSVI": (0.2807, 0.4465), "MCMC": (0.2801, 0.4462)},
}
PAPER_TIME = {"ML-II": "40 s", "DSVI": "30 min", "MCMC": "20 h"}
"""),
    ("md", r"""
## 1. The benchmark's result
"""),
    ("code", r"""
md_path = RESULTS / "dsvi_table5.md"
HAVE_BENCHMARK = md_path.exists()
if HAVE_BENCHMARK:
    # the report links its figures relative to benchmarks/results/: point the links there from notebooks/
    text = re.sub(r"\]\((?!https?:|/|\.\./)([^)]+\.(?:png|md|json))\)", r"](../benchmarks/results/\1)",
                  md_path.read_text())
    display(Markdown(text))
else:
    print(f"{md_path} not found: run `gpvi bench table5` (or `python -m benchmarks.dsvi_table5`) to make it; "
          "the reduced run below stands in for it.")
RUN_REDUCED = QUICK or RERUN or not HAVE_BENCHMARK
print("reduced run below:", "yes" + (" (quick mode)" if QUICK else "") if RUN_REDUCED else "no (set RERUN = True)")
"""),
    ("md", r"""
## 2. A reduced run of the protocol

For each data set: one seeded split (`load_boston(seed=0)`, `load_bodyfat(seed=0)`, `load_pendulum(seed=0)`:
90/10 for Boston and Bodyfat, 315/315 for Pendulum), the default model (`ScaleKernel(RBF, ARD)` + Gaussian noise,
prior $\mathcal N(0, 10)$ on every log-hyperparameter), then

* **ML-II**: `gpvi.ML2` (L-BFGS from seeded restarts);
* **DSVI**: `gpvi.DSVI(scale="full")` started at the ML-II estimate, predictive = mixture over 200 draws of $q$;
* **MCMC**: `gpvi.NUTS` started from draws of $q$ (the paper's MCMC took 20 hours; ours is far shorter, so treat
  its numbers as a rough reference unless its R-hat is close to 1).
"""),
    ("code", r"""
def run_dataset(ds):
    X, y = (ds.X_train, ds.y_train) if S["n_max"] is None else (ds.X_train[:S["n_max"]], ds.y_train[:S["n_max"]])
    model = gpvi.GPRegression(X, y)
    posts, times = {}, {}
    t0 = time.perf_counter()
    posts["ML-II"] = gpvi.ML2(num_restarts=S["restarts"], seed=SEED, progress_bar=PROGRESS).run(model)
    times["ML-II"] = time.perf_counter() - t0
    kw = {} if S["dsvi_steps"] is None else {"num_steps": S["dsvi_steps"]}
    t0 = time.perf_counter()
    posts["DSVI"] = gpvi.DSVI(scale="full", seed=SEED, progress_bar=PROGRESS, **kw).run(model, init=posts["ML-II"])
    times["DSVI"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    posts["MCMC"] = gpvi.NUTS(num_chains=S["nuts_chains"], num_warmup=S["nuts_warmup"], num_draws=S["nuts_samples"],
                              max_tree_depth=S["nuts_depth"], seed=SEED,
                              progress_bar=PROGRESS).run(model, init=posts["DSVI"])
    times["MCMC"] = time.perf_counter() - t0
    metrics = {}
    for name, post in posts.items():
        pred = post.predict(ds.X_test, num_draws=S["pred_draws"])
        metrics[name] = (gpvi.metrics.smse(pred, ds.y_test), gpvi.metrics.nlpd(pred, ds.y_test))
    return dict(model=model, posts=posts, times=times, metrics=metrics)


reduced = {}
if RUN_REDUCED:
    for name, loader in (("boston", gpvi.datasets.load_boston), ("bodyfat", gpvi.datasets.load_bodyfat),
                         ("pendulum", gpvi.datasets.load_pendulum)):
        ds = loader(seed=SEED)
        reduced[name] = run_dataset(ds)
        t = reduced[name]["times"]
        print(f"{name}: N = {reduced[name]['model'].num_data} train / {ds.n_test} test, d = {ds.n_features}; "
              + ", ".join(f"{k} {v:.1f} s" for k, v in t.items()))
"""),
    ("md", r"""
### Table 5: ours beside the paper's
"""),
    ("code", r"""
if reduced:
    index, cols = [], {"SMSE (ours)": [], "SMSE (paper)": [], "NLPD (ours)": [], "NLPD (paper)": [],
                       "time (ours, s)": [], "time (paper, average)": []}
    for name, res in reduced.items():
        for method in ("ML-II", "DSVI", "MCMC"):
            index.append(f"{name}  {method}")
            smse, nlpd = res["metrics"][method]
            cols["SMSE (ours)"].append(smse)
            cols["SMSE (paper)"].append(PAPER[name][method][0])
            cols["NLPD (ours)"].append(nlpd)
            cols["NLPD (paper)"].append(PAPER[name][method][1])
            cols["time (ours, s)"].append(res["times"][method])
            cols["time (paper, average)"].append(PAPER_TIME[method])
    title = "Table 5, reduced run" + (" (QUICK: smoke run, not meaningful)" if QUICK else " (one split)")
    display(gpvi.table.Table(index, cols, title=title))
"""),
    ("md", r"""
How to read the comparison:

* **Splits and data versions differ.** The paper does not publish its splits; we use seeded 90/10 splits
  (Pendulum: a random 315/315 split, as its original split is not recorded in our copy). With 25–51 test points a
  single split moves SMSE by tens of percent; `benchmarks/dsvi_table5.py` averages several splits.
* **Bodyfat** is nearly deterministic given `Density` (notebook 01): our ML-II finds that relation and its SMSE is
  far below the paper's 0.1992, so the paper's "ML-II overfits Bodyfat" does not reproduce here. The paper's much
  lower Bodyfat NLPD (about −2.07) suggests a smaller noise level than ours; we keep the rows where `Density` and
  body fat disagree, which set our noise variance.
* **Times.** The paper's ML-II / DSVI / MCMC took 40 s / 30 min / 20 h on average; here the ratio DSVI : MCMC is
  what matters (same machine, same log joint).
* **MCMC length.** The reduced run's NUTS is short; check its R-hat before trusting it as the reference.
"""),
    ("md", r"""
### Figure 4: DSVI marginals against MCMC (Boston)

The paper shows three Boston hyperparameters; here are all of them: the NUTS draws as histograms with their kernel
density estimates (solid black) and DSVI's Gaussian marginals (dashed red).
"""),
    ("code", r"""
if reduced:
    b = reduced["boston"]["posts"]
    display(gpvi.plots.compare_marginals(b["DSVI"], b["MCMC"], labels=("DSVI", "MCMC (NUTS)"),
                                         title="Boston: DSVI (dashed red) vs MCMC (black)"))
    display(gpvi.metrics.compare(b["DSVI"], b["MCMC"]))
    print("NUTS max R-hat:", float(b["MCMC"].r_hat().max()), " min ESS:", float(b["MCMC"].ess().min()))
"""),
    ("md", r"""
The fidelity targets of the benchmark (issue 4: DSVI means within 0.2 NUTS sds, sds within 25 %, DSVI at most
1/20 of the NUTS time to 400 effective samples, measured on Boston) are checked in `benchmarks/dsvi_table5.md`
above, with long NUTS runs; the reduced run's NUTS is too short for that check.
"""),
]


def build(path: Path, cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    nb = new_notebook(cells=_cells(cells))
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata["language_info"] = {"name": "python"}
    return nb


NOTEBOOKS = {
    "01_hyperparameter_posteriors.ipynb": NB01,
    "02_gp_classification_cvi.ipynb": NB02,
    "03_reproduce_dsvi_table5.ipynb": NB03,
}


def notebooks() -> dict[str, nbformat.NotebookNode]:
    """The notebooks as nbformat objects (no outputs), by file name."""
    out = {}
    for name, cells in NOTEBOOKS.items():
        nb = build(HERE / name, cells)
        for i, cell in enumerate(nb.cells):      # deterministic ids: a rebuild without changes is byte-identical
            cell["id"] = f"nb{name[:2]}-{i:02d}"
        out[name] = nb
    return out


def main() -> None:
    for name, nb in notebooks().items():
        nbformat.validate(nb)
        (HERE / name).write_text(nbformat.writes(nb) + "\n")
        print("wrote", HERE / name)


if __name__ == "__main__":
    main()
