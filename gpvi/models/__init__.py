"""Models: what an engine runs on.

A *target* is anything with ``names`` and a batched ``log_joint(theta)`` (:mod:`gpvi.models.target`, which also
declares the optional capabilities engines use as ``Protocol`` s). The GP models build theta <-> kernel maps
(:mod:`~gpvi.models.hyperparameters`), priors over theta (:mod:`~gpvi.models.priors`) and likelihoods
(:mod:`~gpvi.models.likelihoods`):

* :mod:`~gpvi.models.regression` -- exact GP regression (``GPRegression``), log joint through a Cholesky;
* :mod:`~gpvi.models.classification` -- latent GP with a Bernoulli likelihood (``GPClassification``), for CVI;
* :mod:`~gpvi.models.generalised` -- latent GP with counts, outliers or proportions (``GPGeneralisedRegression``;
  likelihoods in :mod:`~gpvi.models.latent_likelihoods`, priors on their parameters in
  :mod:`~gpvi.models.likelihood_priors`), for CVI;
* :mod:`~gpvi.models.logistic` -- Bayesian logistic regression (``BayesianLogisticRegression``);
* :mod:`~gpvi.models.minibatch` -- a target evaluated on random minibatches (``MinibatchTarget``).
"""
