"""The summary of what ``gpvi.infer`` returns tells the report's story (issue 58): its title is the report's
headline, so it can neither call q reliable when the report says q's own k-hat is large, nor hide an interruption."""

from __future__ import annotations

import warnings

import pytest
import torch

import gpvi
from gpvi.posteriors import GaussianPosterior
from gpvi.posteriors.mixture import GaussianMixture
from gpvi.posteriors.weighted import psis


def _student_t(th, nu=3.0):
    """A 2-D Student-t with 3 degrees of freedom: tails no Gaussian q covers."""
    return -(nu + 2) / 2 * torch.log1p((th ** 2).sum(-1) / nu)


@pytest.fixture(scope="module")
def heavy_tailed():
    target = gpvi.Target(_student_t, names=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gpvi.infer(target, seed=0, engine=gpvi.DSVI(num_steps=1000, seed=0, progress_bar=False),
                          progress_bar=False)


def test_title_is_the_reports_story_not_the_proposals(heavy_tailed):
    post, report = heavy_tailed, heavy_tailed.report
    assert report.answer == "psis" and report.khat > 0.5          # q itself is not close (the report's 2nd line)
    title = post.summary().title
    assert "q is reliable" not in title
    assert str(report).splitlines()[0] in title and f"q's own k-hat {report.khat:.2f}" in title


def test_interrupted_infer_summary_is_flagged():
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    q = GaussianPosterior(torch.zeros(2, dtype=torch.float64), torch.eye(2, dtype=torch.float64), ["a", "b"],
                          target, info={"interrupted": True})
    with pytest.warns(gpvi.exceptions.InterruptedRunWarning):
        post = gpvi.infer(target, q=q, progress_bar=False)
    title = post.summary().title
    assert "NOT TRUSTED" in title and "interrupted (Ctrl-C)" in title


def test_weighted_draws_of_another_proposal_do_not_speak_for_q():
    """PSIS of a proposal that is not q (a defensive mixture) judges the weighted draws, not q."""
    target = gpvi.Target(lambda th: -0.5 * (th ** 2).sum(-1), names=["a", "b"])
    g = GaussianPosterior(torch.zeros(2, dtype=torch.float64), 1.2 * torch.eye(2, dtype=torch.float64), ["a", "b"],
                          target)
    mix = GaussianMixture([g, g], torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64)), target)
    w = psis(mix, num_draws=2000, seed=0)
    assert w.khat <= 0.5
    title = w.summary().title
    assert "q is reliable" not in title and "weighted draws are reliable" in title
    assert "q is reliable" in psis(g, num_draws=2000, seed=0).summary().title        # psis of q: about q
