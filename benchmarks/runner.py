"""Fan out independent benchmark jobs (datasets x splits x methods) through joblib.

Every benchmark that runs many independent jobs builds a list of :class:`Job` and calls :func:`run_jobs`.
Locally the jobs run in this process (``n_jobs=1``, the default: timings stay comparable on a small machine)
or in joblib's process pool (``n_jobs > 1``). A user with a cluster switches the backend without code
changes, e.g. with Dask::

    from dask.distributed import Client
    import joblib
    client = Client("scheduler-address:8786")
    with joblib.parallel_config(backend="dask"):
        run_jobs(jobs, n_jobs=-1)

or with Ray (``from ray.util.joblib import register_ray; register_ray()`` then ``backend="ray"``), or by
setting the environment variables ``GPVI_JOBLIB_BACKEND`` and ``GPVI_N_JOBS`` (read by :func:`run_jobs` when the
caller does not pass them) — see ``benchmarks/README.md``.
Each job sets ``OMP_NUM_THREADS``/torch threads to ``threads`` inside the worker, so workers do not oversubscribe
the cores.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Job", "run_jobs"]


@dataclass(frozen=True)
class Job:
    """One unit of benchmark work: ``fn(**kwargs)`` returning a dict of results."""

    fn: Callable[..., dict[str, Any]]
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""


def _execute(job: Job, threads: int) -> dict[str, Any]:
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        out = dict(job.fn(**job.kwargs))
        out.setdefault("error", "")
    except Exception as exc:  # a failed job is reported, not fatal for the whole table
        out = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    out["job"] = job.name
    out["job_wall_s"] = time.perf_counter() - t0
    out.update({k: v for k, v in job.kwargs.items() if isinstance(v, (str, int, float, bool))})
    return out


def run_jobs(jobs: Sequence[Job], *, n_jobs: int | None = None, threads: int = 1, backend: str | None = None,
             verbose: int = 0) -> list[dict[str, Any]]:
    """Run ``jobs`` and return their result dicts in order.

    Parameters
    ----------
    jobs : sequence of Job
    n_jobs : int, optional
        1 runs in-process (no joblib overhead, exact timings); otherwise joblib's ``n_jobs`` (-1: all workers the
        backend offers). Default: ``$GPVI_N_JOBS`` or 1.
    threads : int
        torch / OpenMP threads per job.
    backend : str, optional
        joblib backend ("loky", "threading", "dask", "ray", ...). Default: ``$GPVI_JOBLIB_BACKEND`` or joblib's
        current configuration (so ``joblib.parallel_config(backend=...)`` set by the caller applies).
    """
    if n_jobs is None:
        n_jobs = int(os.environ.get("GPVI_N_JOBS", "1"))
    if n_jobs == 1 and backend is None and not os.environ.get("GPVI_JOBLIB_BACKEND"):
        return [_execute(j, threads) for j in jobs]
    from joblib import Parallel, delayed, parallel_config

    backend = backend or os.environ.get("GPVI_JOBLIB_BACKEND") or None
    if backend is None:
        return list(Parallel(n_jobs=n_jobs, verbose=verbose)(delayed(_execute)(j, threads) for j in jobs))
    with parallel_config(backend=backend):
        return list(Parallel(n_jobs=n_jobs, verbose=verbose)(delayed(_execute)(j, threads) for j in jobs))
