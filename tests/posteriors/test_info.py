"""RunInfo: the same named fields from every engine, engine-specific entries by name, a plain-dict round trip."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpvi
from gpvi.inference.cvi.typeii import TypeII
from gpvi.posteriors import RunInfo, posterior_from_state_dict


def test_lookup_order_fields_counters_details_settings():
    info = RunInfo(engine="E", converged=True, steps=3, counters={"skipped_steps": 2},
                   settings={"num_steps": 10, "lr": 0.1}, details={"lr": 0.5, "extra": [1]})
    assert (info["engine"], info["converged"], info["steps"]) == ("E", True, 3)
    assert info["skipped_steps"] == 2 and "skipped_steps" in info
    assert info["num_steps"] == 10 and "num_steps" in info
    assert info["lr"] == 0.5                                  # a detail shadows a setting of the same name
    assert info.get("missing", "d") == "d" and "missing" not in info
    with pytest.raises(KeyError):
        info["missing"]
    assert math.isnan(info.time_s)


def test_setting_an_entry_goes_to_its_field_counter_or_details():
    info = RunInfo(counters={"skipped_steps": 0})
    info["converged"] = False
    info["skipped_steps"] = 4
    info["new"] = "x"
    info.update(interrupted=True, steps=7)
    assert (info.converged, info.counters["skipped_steps"], info.details["new"]) == (False, 4, "x")
    assert (info.interrupted, info.steps) == (True, 7)
    del info["new"]
    assert "new" not in info
    with pytest.raises(KeyError, match="field"):
        del info["steps"]


def test_info_that_is_not_a_mapping_is_a_clear_type_error():
    with pytest.raises(TypeError, match="info must be"):
        RunInfo.of([("steps", 3)])
    with pytest.raises(TypeError, match="info must be"):
        gpvi.PointPosterior(torch.zeros(2, dtype=torch.float64), ["a", "b"], info="steps=3")


def test_plain_dict_round_trip_and_copy_independence():
    info = RunInfo(engine="E", steps=5, counters={"a": 1}, settings={"s": 2}, details={"d": 3})
    plain = dict(info)
    assert set(plain) == {"engine", "converged", "interrupted", "steps", "time_s", "total_time_s", "settings",
                          "counters", "d"}
    back = RunInfo.of(plain)
    assert back == info and back.details == {"d": 3} and back.counters == {"a": 1}
    copy = RunInfo.of(info)
    copy.counters["a"] = 9
    copy["d"] = 4
    assert info.counters["a"] == 1 and info["d"] == 3


def test_every_engine_fills_the_same_fields():
    X = torch.linspace(-2, 2, 12, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(2 * X).squeeze(-1) + 0.1 * torch.cos(7 * X).squeeze(-1)
    model = gpvi.GPRegression(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        point = gpvi.ML2(num_restarts=2, seed=0, progress_bar=False).run(model)
        runs = {
            "ML2": point,
            "DSVI": gpvi.DSVI(num_steps=60, seed=0, progress_bar=False).run(model, init=point.theta),
            "SKGaussian": gpvi.SKGaussian(num_steps=40, seed=0, progress_bar=False).run(model, init=point.theta),
            "NUTS": gpvi.NUTS(num_chains=1, num_warmup=10, num_draws=10, seed=0, progress_bar=False).run(
                model, init=point.theta),
        }
        Xc = torch.linspace(-2, 2, 20, dtype=torch.float64).unsqueeze(-1)
        clf = gpvi.GPClassification(Xc, (Xc[:, 0] > 0.3).double())
        runs["CVI"] = gpvi.CVI(progress_bar=False).run(clf)
        runs["TypeII"] = TypeII(gpvi.CVI(progress_bar=False)).run(clf)
    for name, post in runs.items():
        info = post.info
        assert isinstance(info, RunInfo), name
        assert info.engine.startswith(name), (name, info.engine)
        assert isinstance(info.converged, bool) and info.interrupted is False, name
        assert isinstance(info.steps, int) and info.steps > 0, name
        assert info.time_s > 0 and info.total_time_s >= info.time_s * 0.99, (name, info.time_s, info.total_time_s)
        assert isinstance(info.settings, dict) and info.settings, name
        assert "RunInfo(engine=" in repr(info)
        # saved and loaded: the same fields
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            back = posterior_from_state_dict(post.state_dict(), target=post.target)
        assert isinstance(back.info, RunInfo)
        assert (back.info.engine, back.info.steps, back.info.converged) == (info.engine, info.steps, info.converged)
