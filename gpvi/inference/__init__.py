"""Inference: engines that turn a target into a posterior.

Shared pieces: :mod:`~gpvi.inference.derivatives` (log joint, gradients, Hessians), :mod:`~gpvi.numerics.families`
(standard distributions of location-scale families), :mod:`~gpvi.inference.schedules` (step sizes),
:mod:`~gpvi.inference.progress` (progress bars). One sub-package or module per engine: :mod:`~gpvi.inference.ml2`
(ML-II / MAP), :mod:`~gpvi.inference.dsvi` (DSVI, DSVI-ARD), :mod:`~gpvi.inference.salimans_knowles` (Salimans-Knowles),
:mod:`~gpvi.inference.cvi` (CVI for GP classification), :mod:`~gpvi.inference.mcmc` (NUTS/HMC baseline).
"""
