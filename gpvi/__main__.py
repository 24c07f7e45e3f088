"""Command line: ``python -m gpvi demo`` (the README's main job)."""

from __future__ import annotations

import argparse
import sys
import time


def _demo(args: argparse.Namespace) -> int:
    import torch

    import gpvi

    torch.set_num_threads(max(1, torch.get_num_threads()))
    ds = gpvi.datasets.load_bodyfat(seed=args.seed)
    model = gpvi.GPRegression(ds.X_train, ds.y_train)
    t0 = time.perf_counter()
    fit = gpvi.ML2(num_restarts=2 if args.quick else 5, seed=args.seed).run(model)
    t_fit = time.perf_counter() - t0
    pred = fit.predict(ds.X_test)
    print(f"ML-II on {ds.name} (N={ds.n_train}, d={ds.n_features}): log marginal likelihood {fit.value:.3f} "
          f"(restart {fit.info['best_restart']} of {len(fit.info['restarts'])}), {t_fit:.1f} s")
    print(fit.summary())
    print(f"test SMSE {gpvi.metrics.smse(pred, ds.y_test):.4f}   test NLPD {gpvi.metrics.nlpd(pred, ds.y_test):.4f} "
          f"(standardised targets)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpvi", description="Gaussian-process inference toolkit")
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run the main demonstration on bundled data")
    p_demo.add_argument("--quick", action="store_true", help="smoke run with fewer iterations")
    p_demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p_demo.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
