"""scikit-learn's estimator checks on GPClassifier (issue 19, item 4).

Every check that ``sklearn.utils.estimator_checks.parametrize_with_checks`` yields for ``GPClassifier`` runs here
(scikit-learn >= 1.6; the module is skipped without it). The estimator is checked with small, fast settings:
``hyperparameters="fixed"``, ``max_sweeps=5``, ``num_quadrature=20`` (20 x 20 nodes per site for 3 classes) and
``progress_bar=False``: the checks fit dozens of times, on up to 300 rows and 3 or 4 classes, and type-II fits with
the default budget took 146 s for the whole set (``max_sweeps=30``), these settings about 15 s. The checks' data are
not fitted to ``tol`` within 5 sweeps, so ``ConvergenceWarning`` is silenced here.

Checks not passed, and why:

* ``check_dtype_object`` -- expected to fail. An object-dtype ``X`` of numbers is accepted (the check's first part;
  ``test_object_dtype_X_of_numbers_is_accepted_and_others_refused`` below checks it), and an entry such as
  ``{"foo": "bar"}`` is refused with a ``TypeError`` as the check wants, but with gpvi's own message ("X must be an
  array of numbers; got dtype object with a non-numeric entry ... of type dict"), not numpy's ``float()`` wording
  ("argument must be a string or a real number") that the check matches: gpvi refuses strings too, so numpy's
  wording would mislead.
* ``check_decision_proba_consistency`` -- expected to fail in general (it passes with these settings).
  ``decision_function`` is the latent posterior mean (scikit-learn's convention for a latent-function classifier,
  and what the issue asks for), while ``predict_proba`` is :math:`\\mathbb E_q[\\sigma(f)]`, which also depends on
  the latent variance: the two rank points differently where the variances differ. Measured on the check's data
  with type-II hyperparameters (``max_sweeps=30``): 5 of 20 ranks differ; with the fixed hyperparameters used
  here, the ranks happen to agree.
* ``check_array_api_input`` -- skipped by scikit-learn itself unless ``SCIPY_ARRAY_API=1`` is set (gpvi takes numpy
  arrays and torch tensors; it does not declare array-API support).

No other check is skipped. The eight sample-weight checks run and pass since ``fit`` takes ``sample_weight``
(2026-11-25), among them ``check_sample_weight_equivalence_on_dense_data`` (integer weights against repeated rows,
zero weights against removed rows, to scikit-learn's default ``rtol=1e-7``; ``tests/test_sample_weight.py`` checks
the same for type-II and multi-class fits). The class-weight, multi-output, multi-label and sparse-support checks are
not yielded: there is no ``class_weight`` and the tags say single-output, no multi-label, no sparse input (sparse
``X`` is refused with a message that says so, which a check verifies).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn", minversion="1.6")

from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import gpvi  # noqa: E402
from gpvi.sklearn import GPClassifier  # noqa: E402

EXPECTED_FAILED = {
    "check_dtype_object": "gpvi refuses a dict entry of an object X with its own TypeError message, not numpy's "
                          "float() wording (see the module docstring)",
    "check_decision_proba_consistency": "decision_function is the latent mean; predict_proba also depends on the "
                                        "latent variance, so ranks can differ (see the module docstring)",
}


def _fast() -> GPClassifier:
    return GPClassifier(hyperparameters="fixed", max_sweeps=5, num_quadrature=20, progress_bar=False)


@parametrize_with_checks([_fast()], expected_failed_checks=lambda est: EXPECTED_FAILED)
def test_scikit_learn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpvi.ConvergenceWarning)
        check(estimator)


def test_object_dtype_X_of_numbers_is_accepted_and_others_refused():
    """The parts of ``check_dtype_object`` that apply: numbers in an object array fit like floats; a dict does not."""
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(30, 3))
    y = (X[:, 0] > 0.5).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpvi.ConvergenceWarning)
        a = _fast().fit(X, y)
        b = _fast().fit(X.astype(object), y.astype(object))
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X.astype(object)))
    np.testing.assert_array_equal(b.classes_, [0, 1])
    Xbad = X.astype(object)
    Xbad[0, 0] = {"foo": "bar"}
    with pytest.raises(TypeError, match="non-numeric entry"):
        _fast().fit(Xbad, y)
