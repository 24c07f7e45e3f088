"""Numerics that several layers use, below the models and the posteriors (imports only gpvi's root modules).

* :mod:`~gpvi.numerics.families` -- standard distributions of location-scale families (DSVI's :math:`\\phi`);
* :mod:`~gpvi.numerics.predictive` -- predictive distributions (Gaussian mixtures over hyperparameter draws);
* :mod:`~gpvi.numerics.ep`, :mod:`~gpvi.numerics.ep_multiclass` -- expectation propagation for the binary and the
  multi-class latent GP (the evidence behind the fully Bayesian classifier).

:mod:`gpvi.linalg` (every Cholesky), :mod:`gpvi.validation`, :mod:`gpvi.rng`, :mod:`gpvi.exceptions` and
:mod:`gpvi.table` sit at the root, below everything.
"""
