"""Training from tidy usage files: read, cut at the decision time, fit, and publish or return recommendations."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from models.store import DataWindow, Manifest, ModelStore
from models.workload import WorkloadRecommender
from pipelines.ingest import read_oom_events, read_usage
from recommender.errors import InputFileError
from recommender.resources import RecommendationSet
from recommender.settings import Settings

Step = Callable[[str], None]


def _quiet(_: str) -> None:
    """Progress sink for callers that show none."""


@dataclass(frozen=True)
class TrainingResult:
    model: WorkloadRecommender
    recommendations: RecommendationSet
    usage_rows: int
    oom_events: int
    fit_seconds: float


def load_history(input_path: Path, as_of: int | None, step: Step = _quiet) -> pd.DataFrame:
    """Read a usage file and keep only the rows before `as_of` (all of them when None)."""
    step(f"reading {input_path}")
    usage = read_usage(input_path)
    if as_of is not None:
        usage = usage[usage["timestamp"] < as_of]
    if usage.empty:
        when = f" before as-of {as_of}" if as_of is not None else ""
        raise InputFileError(input_path, f"has no usage rows{when}")
    return usage


def fit_history(
    usage: pd.DataFrame,
    settings: Settings,
    as_of: int | None,
    horizon_seconds: int,
    oom_events: pd.DataFrame | None = None,
    step: Step = _quiet,
) -> TrainingResult:
    """Fit the workload models on usage rows and compute the recommendations at `as_of` (default: data end)."""
    if oom_events is not None and as_of is not None:
        oom_events = oom_events[oom_events["timestamp"] < as_of]
    step(f"fitting {usage.groupby(['namespace', 'workload', 'container']).ngroups} workload containers")
    started = time.perf_counter()
    model = WorkloadRecommender(settings.histogram, settings.policy, settings.reservation, settings.forecast).fit(usage, oom_events=oom_events)
    fit_seconds = time.perf_counter() - started
    step("computing recommendations")
    recommendations = model.predict(as_of=as_of, horizon_seconds=horizon_seconds)
    return TrainingResult(model, recommendations, len(usage), 0 if oom_events is None else len(oom_events), fit_seconds)


def recommend_from_file(
    input_path: Path, as_of: int, horizon_seconds: int, settings: Settings, step: Step = _quiet
) -> RecommendationSet:
    """The `recommend` contract: learn only from rows before `as_of`, forecast the horizon after it."""
    usage = load_history(input_path, as_of, step)
    return fit_history(usage, settings, as_of, horizon_seconds, step=step).recommendations


def train_from_file(
    input_path: Path,
    settings: Settings,
    *,
    as_of: int | None = None,
    oom_events_path: Path | None = None,
    horizon_seconds: int = 86400,
    step: Step = _quiet,
) -> Manifest:
    """Fit on a usage file and publish a new model version; a failure anywhere leaves the store untouched."""
    usage = load_history(input_path, as_of, step)
    oom_events = read_oom_events(oom_events_path) if oom_events_path is not None else None
    result = fit_history(usage, settings, as_of, horizon_seconds, oom_events, step)
    step(f"publishing to {settings.store.path}")
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    return store.publish(
        result.recommendations,
        result.model,
        source=str(input_path),
        parameters=settings.model_dump(mode="json", include={"histogram", "policy", "reservation", "forecast"}),
        row_counts={
            "usage_rows": result.usage_rows,
            "workload_containers": len(result.recommendations.recommendations),
            "pods": int(usage["pod"].nunique()),
            "oom_events": result.oom_events,
        },
        fit_metrics={"fit_seconds": round(result.fit_seconds, 3), **result.model.selection_summary()},
        data_window=DataWindow(
            first_sample=int(usage["timestamp"].min()),
            last_sample=int(usage["timestamp"].max()),
            as_of=result.recommendations.as_of,
        ),
    )
