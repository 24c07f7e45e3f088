"""Where one ``gpvi.infer`` call on a full data set spends its time (issue 39, item 4): the cost of one log joint with
and without its gradient (S = 1 and 8 draws, medians of 5), then ``gpvi.infer(model, seed=0)`` with its stage walls,
the check's verdicts and NUTS's draws, gradient evaluations and tree depth.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.infer_profile [boston]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpvi  # noqa: E402
from benchmarks._common import header, median_time, write  # noqa: E402
from benchmarks.nuts_fidelity import model_of  # noqa: E402


def main(name: str = "boston") -> None:
    m = model_of(name)
    out: dict[str, Any] = {"data": name, "cost_ms": {}}
    for S in (1, 8):
        x = torch.zeros(S, len(m.names), dtype=torch.float64, requires_grad=True)
        grad = median_time(lambda: torch.autograd.grad(m.log_joint(x).sum(), x), repeats=5)[0]
        with torch.no_grad():
            value = median_time(lambda: m.log_joint(x.detach()), repeats=5)[0]
        out["cost_ms"][S] = {"log joint + gradient per draw": 1000 * grad / S, "log joint per draw": 1000 * value / S}
    t0 = time.perf_counter()
    post = gpvi.infer(m, seed=0, progress_bar=False)
    r = post.report
    out.update(wall=time.perf_counter() - t0, answer=r.answer, times=r.times, nuts=r.nuts,
               check={k: v for k, v in r.check.items() if k != "second"}, second=r.check.get("second"))
    if r.answer == "nuts":
        out["tree_depth"] = float(post.stats["tree_depth"].double().mean())
        out["steps_per_draw"] = float(post.stats["n_steps"].double().mean())
    lines = [header(f"gpvi.infer on {name}, seed 0: where the time goes (issue 39)"), "",
             "| draws S | log joint + gradient per draw (ms) | log joint per draw (ms) |", "|---|---|---|"]
    lines += [f"| {S} | {c['log joint + gradient per draw']:.1f} | {c['log joint per draw']:.1f} |"
              for S, c in out["cost_ms"].items()]
    lines += ["", f"Answer: {r.answer}; wall {out['wall']:.0f} s: "
              + ", ".join(f"{k} {v:.0f} s" for k, v in r.times.items()) + ".", "",
              f"Check: {out['check']}", "", f"Second opinion: {out['second']}", "", f"NUTS: {r.nuts}",
              "" if r.answer != "nuts" else
              f"\nTree depth {out['tree_depth']:.2f}, leapfrog steps per draw {out['steps_per_draw']:.2f}.\n"]
    write(f"infer_profile_{name}", "\n".join(lines) + "\n", out)


if __name__ == "__main__":
    main(*sys.argv[1:2])
