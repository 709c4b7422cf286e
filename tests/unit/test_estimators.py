"""Every estimator in `models/` keeps scikit-learn's parameter contract (scalars in `__init__`, so `get_params`,
`set_params` and `clone` reach them), the composite ones are built from the settings in one call, and models
stored before the parameters became scalars still load and predict the same."""

from __future__ import annotations

import gzip
import importlib
import inspect
import json
import pkgutil
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
from sklearn.base import BaseEstimator, clone
from sklearn.utils.estimator_checks import (
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)

import models
from models.ensemble import line_forecaster, model_name
from models.nodes import NodeForecaster
from models.settings import ModelSettings
from models.vpa import VpaRecommender
from models.workload import FleetForecaster, WorkloadRecommender, vpa_estimator
from recommender import colocation
from recommender.resources import NodeForecast, RecommendationSet
from recommender.settings import (
    ColocationSettings,
    ForecastSettings,
    HistogramSettings,
    LiveLineSettings,
    PolicySettings,
)
from tests.conftest import make_usage

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "models-13284e9"
#: The settings the stored models were fitted with (see the fixture's README).
OLD_SETTINGS = ModelSettings(
    policy=PolicySettings(safety_margin_fraction=0.2), forecast=ForecastSettings(selection_days=1, history_days=1)
)


def estimator_classes() -> list[type[BaseEstimator]]:
    """Every estimator class defined in `models/`, found by import so a new one cannot be left out."""
    found = []
    for info in pkgutil.iter_modules(models.__path__):
        module = importlib.import_module(f"models.{info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if (
                issubclass(cls, BaseEstimator)
                and cls.__module__ == module.__name__
                and not cls.__name__.startswith("_")
            ):
                found.append(cls)
    return sorted(found, key=lambda cls: cls.__name__)


def built(cls: type[BaseEstimator]) -> BaseEstimator:
    """An instance with its sub-estimators filled in where it has a settings constructor."""
    if cls is WorkloadRecommender:
        return WorkloadRecommender.from_settings(OLD_SETTINGS)
    if cls is NodeForecaster:
        return NodeForecaster.from_settings(OLD_SETTINGS, ColocationSettings())
    return cls()


def test_every_estimator_is_checked() -> None:
    names = {cls.__name__ for cls in estimator_classes()}
    assert {"WorkloadRecommender", "NodeForecaster", "FleetForecaster", "DecayingHistogram", "VpaRecommender"} <= names
    assert len(names) >= 14


@pytest.mark.parametrize("cls", estimator_classes(), ids=lambda cls: cls.__name__)
def test_parameters_follow_the_scikit_learn_contract(cls: type[BaseEstimator]) -> None:
    estimator = built(cls)
    name = cls.__name__
    check_parameters_default_constructible(name, cls())
    check_no_attributes_set_in_init(name, estimator)
    check_get_params_invariance(name, estimator)
    check_set_params(name, estimator)
    # Every parameter is a scalar, a plain container or an estimator (whose own parameters are scalars).
    for value in estimator.get_params(deep=True).values():
        assert value is None or isinstance(value, (bool, int, float, str, list, tuple, dict, BaseEstimator)), value


@pytest.mark.parametrize("cls", estimator_classes(), ids=lambda cls: cls.__name__)
def test_clone_and_set_params_round_trip(cls: type[BaseEstimator]) -> None:
    estimator = built(cls)
    params = estimator.get_params(deep=True)
    copy = clone(estimator)
    assert _comparable(copy.get_params(deep=True)) == _comparable(params)
    # Each scalar parameter set to a new value is what get_params and a clone then give.
    for key, value in params.items():
        changed = _other(value)
        if changed is None:
            continue
        copy = clone(estimator).set_params(**{key: changed})
        assert clone(copy).get_params(deep=True)[key] == changed, key
        assert estimator.get_params(deep=True)[key] == value, f"{key}: the original changed"


def test_nested_parameters_reach_the_sub_estimators_and_the_fit() -> None:
    model = WorkloadRecommender.from_settings(ModelSettings())
    assert model.get_params()["cpu_histogram__half_life_seconds"] == 86400
    model.set_params(cpu_histogram__half_life_seconds=3600.0, forecast__selection_days=2, vpa__pod_min_cpu_cores=0.1)
    usage = make_usage(workloads=1, pods=1, days=3)
    fitted = model.fit(usage)
    assert fitted.cpu_histogram_.half_life_seconds == 3600.0
    assert fitted.cpu_histogram_ is not model.cpu_histogram, "the template is cloned, never fitted itself"
    rec = fitted.predict().recommendations[0]
    assert rec.cpu is not None and rec.cpu.target >= 0.1


def test_defaults_are_the_settings_defaults() -> None:
    """The literal defaults of the scalar parameters are the settings groups' (one source of truth for users)."""
    assert FleetForecaster().get_params() == FleetForecaster.from_settings(ForecastSettings()).get_params()
    plain, from_settings = WorkloadRecommender().get_params(False), WorkloadRecommender.from_settings(ModelSettings())
    for key, value in from_settings.get_params(False).items():
        if isinstance(value, BaseEstimator):
            assert plain[key] is None
        else:
            assert plain[key] == value or (plain[key] is None and value in ([], {})), key
    vpa = vpa_estimator(HistogramSettings(), PolicySettings()).get_params()
    assert vpa == VpaRecommender().get_params()


def as_stored(recommendations: RecommendationSet) -> RecommendationSet:
    """`recommendations` without what the fixture's release did not record (the recent sample weights, issue 39)
    and without the limits, which that release stated unrounded and by other rules (one limit on every surface, on
    the grid the webhook writes, issue 39; CPU's floor is new), nor the usage of the last day, which now ends with
    the slot of the newest sample (`_recent_days_match` compares it): both sides of a comparison go through this."""
    unrecorded = {
        "cpu_recent_samples": None,
        "memory_recent_samples": None,
        "recent_cpu_cores": [],
        "recent_memory_bytes": [],
    }
    restated = {"limit": None, "limit_rule": None}

    def resource(value: Any, name: str) -> Any:
        if value is None:
            return None
        # The peak was capped at the short-term line's highest step; it is now raised to it (`_peaks_raised`).
        floor = {"limit_floor": None} if name == "cpu" else {}
        peak = value.peak.model_copy(update={"value": max(value.short_term)})
        return value.model_copy(update={**restated, **floor, "peak": peak})

    return recommendations.model_copy(
        update={
            "recommendations": [
                r.model_copy(
                    update={
                        "history": r.history.model_copy(update=unrecorded) if r.history else None,
                        "cpu": resource(r.cpu, "cpu"),
                        "memory": resource(r.memory, "memory"),
                    }
                )
                for r in recommendations.recommendations
            ]
        }
    )


def test_models_stored_before_scalar_parameters_load_and_predict_the_same() -> None:
    model = joblib.load(OLD / "workload-recommender.joblib")
    expected = RecommendationSet.model_validate_json(gzip.decompress((OLD / "recommendations.json.gz").read_bytes()))
    assert _comparable(model.get_params(deep=True)) == _comparable(
        WorkloadRecommender.from_settings(OLD_SETTINGS).get_params(deep=True)
    )
    predicted = model.predict(expected.as_of)
    assert as_stored(_before_the_ceiling(predicted)) == as_stored(expected)
    _recent_days_match(predicted, expected)
    _peaks_raised(predicted, expected)
    # It continues (incremental training) and clones as a model of today.
    later = make_usage(workloads=2, pods=2, days=3)
    later = later[later["timestamp"] > model.data_end_]
    assert len(model.partial_fit(later).predict().recommendations) == len(expected.recommendations)
    clone(model)

    nodes = joblib.load(OLD / "node-forecaster.joblib")
    stored = json.loads(gzip.decompress((OLD / "nodes.json.gz").read_bytes()))
    assert isinstance(nodes.forecast, FleetForecaster) and nodes.forecast.selection_days == 1

    # The same lines; beside them the live rise tables and their activity split (issue 18), which the old model
    # learns at its defaults.
    def lines(n: dict[str, Any]) -> dict[str, Any]:
        new = ("live_rise", "live_activity")
        return {**n, **{r: {k: v for k, v in n[r].items() if not k.startswith(new)} for r in ("cpu", "memory")}}

    predicted = [n.model_dump(mode="json") for n in nodes.predict()]
    assert all(len(n[r]["live_rise"]) == colocation.LEVEL_BINS for n in predicted for r in ("cpu", "memory"))
    assert [lines(n) for n in predicted] == [
        lines(NodeForecast.model_validate(n).model_dump(mode="json")) for n in stored
    ]


def test_a_fit_today_equals_the_fit_stored_before_the_change() -> None:
    """Moving the parameters and splitting the module changed no result: a fresh fit on the fixture's data gives
    the recommendations the old code stored, but for the fleet-chosen lines, which changed on purpose since (issue
    38: the baselines' flat rules joined the candidates, and a fleet this small takes them)."""
    expected = RecommendationSet.model_validate_json(gzip.decompress((OLD / "recommendations.json.gz").read_bytes()))
    usage = make_usage(workloads=2, pods=2, days=2)
    usage["node"] = ["n0" if pod.endswith("p0") else "n1" for pod in usage["pod"]]
    # The fixture's release had no learned live line (the next step's line fits on these two days).
    no_live_line = OLD_SETTINGS.model_copy(update={"live_line": LiveLineSettings(enabled=False)})
    fitted = _before_the_ceiling(WorkloadRecommender.from_settings(no_live_line).fit(usage).predict(expected.as_of))
    chosen = {"models", "short_term", "long_term", "target", "uncapped_target", "lower_bound", "peak"}

    def unchosen(recommendations: RecommendationSet) -> list[dict[str, Any]]:
        plain = recommendations.model_dump(mode="json")["recommendations"]
        return [
            {k: {f: v for f, v in r[k].items() if f not in chosen} if k in ("cpu", "memory") else r[k] for k in r}
            for r in plain
        ]

    assert unchosen(as_stored(fitted)) == unchosen(as_stored(expected))
    # A fleet this small stands each container alone: its lines are the reference, the flat (1 - P) quantile of the
    # history window, unscaled.
    selector = line_forecaster(OLD_SETTINGS.forecast, "request")
    reference = model_name(selector.candidate_models()[selector.reference])
    assert all(
        r.memory is not None
        and r.memory.models.target == f"{reference} cost={r.memory.models.quality['target'].cost:.3g} x1"
        for r in fitted.recommendations
    )


def _recent_days_match(predicted: RecommendationSet, stored: RecommendationSet) -> None:
    """The last day's usage as the fixture's release stored it, one slot later: the newest slot (the one `as_of`
    falls in, off the grid here) is now its last step, and the oldest leaves."""
    for new, old in zip(predicted.recommendations, stored.recommendations, strict=True):
        assert new.history is not None and old.history is not None
        for name in ("recent_cpu_cores", "recent_memory_bytes"):
            assert getattr(new.history, name)[:-1] == getattr(old.history, name)[1:]


def _peaks_raised(predicted: RecommendationSet, stored: RecommendationSet) -> None:
    """The peak as the fixture's release stored it was at most the short-term line's highest step; now it is at
    least that step (issue 39: a peak under its own line)."""
    for new, old in zip(predicted.recommendations, stored.recommendations, strict=True):
        for name in ("cpu", "memory"):
            before, after = getattr(old, name), getattr(new, name)
            assert before.peak.value <= max(before.short_term) <= after.peak.value


def _before_the_ceiling(recommendations: RecommendationSet) -> RecommendationSet:
    """`recommendations` as stored before the usage ceiling (issue 39), after checking it held none of their lines
    (the fixture's limits are twice its usage): its fields dropped."""
    recs = []
    for rec in recommendations.recommendations:
        update = {}
        for resource in ("cpu", "memory"):
            learned = getattr(rec, resource)
            assert learned is not None and learned.ceiling is not None and not learned.ceiling_rules
            update[resource] = learned.model_copy(update={"ceiling": None})
        recs.append(rec.model_copy(update=update))
    return recommendations.model_copy(update={"recommendations": recs})


def _other(value: Any) -> Any:
    """A different value of the same kind, or None when there is no obvious one (estimators, containers, None)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 0.5 if np.isfinite(value) and value else 0.5
    return None


def _comparable(params: dict[str, Any]) -> dict[str, Any]:
    """Parameters with estimators replaced by their class names (estimators compare by identity)."""
    return {k: type(v).__name__ if isinstance(v, BaseEstimator) else v for k, v in params.items()}
