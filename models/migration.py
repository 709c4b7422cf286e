"""Old pickles in a model store, brought to today's estimators as they load (`__setstate__`), so a store written by
an older release keeps serving and continuing (`train --incremental`) without a retrain.

Each step names the release change it undoes; the state it gets is the pickled `__dict__`, the one it returns what
today's class would have pickled for the same fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from models.pods import SAMPLE_COLUMNS
from models.settings import ModelSettings
from recommender.settings import ForecastSettings

#: The settings groups `WorkloadRecommender` took as parameters before they became scalars and sub-estimators.
SETTINGS_PARAMETERS = ("histogram", "policy", "reservation", "forecast")
#: The `ForecastSettings` fields that are parameters of `WorkloadRecommender` itself (the usage ceiling's, issue 39;
#: the pod spread's, issue 38). A version pickled before one of them existed takes its default.
FORECAST_PARAMETERS = (
    "ceiling_near_limit_fraction",
    "ceiling_throttled_fraction",
    "cpu_pod_spread_half_life_seconds",
    "memory_pod_spread_half_life_seconds",
)


def migrate_workload_state(
    state: dict[str, Any], parameters: Callable[[ModelSettings], dict[str, Any]]
) -> dict[str, Any]:
    """A pickled `WorkloadRecommender`'s state, migrated; `parameters`: today's parameters of a settings groups' fit
    (`WorkloadRecommender.from_settings(...).get_params(deep=False)`)."""
    # Before OOM kills were counted only which groups had one was kept: each counts as one kill.
    if "oom_groups_" in state:
        groups = state.pop("oom_groups_")
        state["oom_kills_"] = pd.Series(1, index=pd.Index(groups, dtype=object), dtype=np.int64)
    # Before per-resource sample counts every sample of a pod counted for both resources.
    for name in ("pods_", "workloads_"):
        if name in state and "cpu_samples" not in state[name].columns:
            state[name] = state[name].assign(**dict.fromkeys(SAMPLE_COLUMNS, state[name]["samples"]))
    # Before issue 38 there was no learned live line: such a version keeps its day-ahead lines until refitted.
    state.setdefault("live_line", None)
    state.setdefault("live_line_enabled", True)
    # Before issue 39 no line was held under the usage ceiling, and before pods were counted (issue 38) the lines
    # kept the busiest pod's level: such a version takes the defaults (it counts pods from its next training on).
    for name in FORECAST_PARAMETERS:
        state.setdefault(name, ForecastSettings.model_fields[name].default)
    # Before issue 16 the parameters were the settings groups themselves (None: the defaults).
    if "histogram" in state:
        groups = {name: value for name in SETTINGS_PARAMETERS if (value := state.pop(name, None)) is not None}
        state.update(parameters(ModelSettings(**groups)))
    return state


def migrate_node_state(state: dict[str, Any], forecaster: Callable[[ForecastSettings], Any]) -> dict[str, Any]:
    """A pickled `NodeForecaster`'s state, migrated: before issue 16 its `forecast` parameter was the settings group
    (`forecaster` makes today's `FleetForecaster` of it)."""
    if isinstance(state.get("forecast"), ForecastSettings):
        state["forecast"] = forecaster(state["forecast"])
    return state


def migrate_seasonal_state(state: dict[str, Any]) -> dict[str, Any]:
    """A pickled `SeasonalMaxReservation`'s state, migrated: before issue 41 its grid was dense (groups x slots,
    -inf where no sample); today it keeps the observed cells only."""
    if "grid_" in state:
        grid = state.pop("grid_")
        rows, slots = np.nonzero(np.isfinite(grid))
        state["cell_starts_"] = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=grid.shape[0]))])
        state["cell_slots_"] = slots.astype(np.int64)
        state["cell_values_"] = grid[rows, slots]
        state["n_slots_"] = int(grid.shape[1])
    return state


def migrate_histogram_state(state: dict[str, Any]) -> dict[str, Any]:
    """A pickled `DecayingHistogram`'s state, migrated: before issue 41 its weights were dense (groups x buckets);
    today it keeps the buckets that got a sample."""
    if "weights_" in state:
        weights = state.pop("weights_")
        rows, buckets = np.nonzero(weights)
        state["weight_starts_"] = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=weights.shape[0]))])
        state["weight_buckets_"] = buckets.astype(np.int64)
        state["weight_values_"] = weights[rows, buckets]
    return state


def migrate_live_line_state(state: dict[str, Any]) -> dict[str, Any]:
    """A pickled `LiveLineForecaster`'s state, migrated: before its blend was checked on the newest training rows
    (issue 38) it was fitted on all of them and kept whole, its lines had no floor, each container's factor sank as
    fast as it rose, and the fleet's factor moved by an absolute `adaptation_rate` x (share - P), the same moves as a
    relative `fleet_adaptation_rate` of that x P."""
    state.setdefault("validation_fraction", 0.0)
    state.setdefault("floor_at_last_step", False)
    state.setdefault("own_sink_rate", state.get("own_adaptation_rate", 0.0))
    if "adaptation_rate" in state:
        state["fleet_adaptation_rate"] = state.pop("adaptation_rate") * state["target_violation"]
    if "coef_" in state:
        state.setdefault("shrinkage_", 1.0)
    return state
