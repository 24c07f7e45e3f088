"""The README's first example, timed: ``gpvi.infer`` on the pendulum training rows at seed 0, its report, and its
means and sds against the long NUTS reference of ``nuts_fidelity.py`` (``results/nuts_fidelity_ref.npz``).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.studies.readme_pendulum
"""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpvi  # noqa: E402
from benchmarks.studies._common import RESULTS, header, write  # noqa: E402


def main() -> None:
    ds = gpvi.datasets.load_pendulum()
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        post = gpvi.infer(model, seed=0, progress_bar=False)
    wall = time.perf_counter() - t0
    ref = np.load(RESULTS / "nuts_fidelity_ref.npz")["pendulum"]
    ref = ref.reshape(-1, ref.shape[-1])
    m, s = ref.mean(0), ref.std(0, ddof=1)
    dmean = np.abs(post.mean.cpu().numpy() - m) / s
    ratio = post.std.cpu().numpy() / s
    row = {"wall": wall, "answer": post.report.answer, "trusted": bool(post.report.trusted),
           "times": {k: float(v) for k, v in post.report.times.items()}, "max_dmean_sd": float(dmean.max()),
           "sd_ratio_min": float(ratio.min()), "sd_ratio_max": float(ratio.max())}
    md = [header("The README's example: gpvi.infer on pendulum, seed 0"), "",
          f"Wall {wall:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in row['times'].items())}); answer "
          f"{row['answer']}, trusted {row['trusted']}; against the long NUTS reference: max |Δmean| "
          f"{row['max_dmean_sd']:.3f} reference sd, sd ratios {row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f}.",
          "", "```", str(post.report), "```"]
    write("readme_pendulum", "\n".join(md) + "\n", row)


if __name__ == "__main__":
    main()
