"""scikit-learn's estimator checks on ``GPClassifier(random_state=0)``: the default settings, every check.

``parametrize_with_checks`` yields the checks of ``sklearn.utils.estimator_checks.check_estimator`` one test each,
with no expected failures: type-II hyperparameters (the default) on the checks' data of up to 300 rows and 3
classes, among them ``check_sample_weight_equivalence_on_dense_data`` (integer weights against repeated rows, zero
weights against removed rows, to ``rtol=1e-7``), ``check_decision_proba_consistency`` and ``check_dtype_object``.
``check_array_api_input`` is skipped by scikit-learn itself unless ``SCIPY_ARRAY_API=1`` is set (gpvi does not
declare array-API support). Each check must also print nothing: ``verbose=0`` shows no progress bars.
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from gpvi.sklearn import GPClassifier


@parametrize_with_checks([GPClassifier(random_state=0)])
def test_scikit_learn_estimator_checks(estimator, check, capfd):
    check(estimator)
    out, err = capfd.readouterr()
    assert out == "" and err == "", f"the check printed: {(out + err)[:300]!r}"

