"""Training from tidy usage files or Prometheus: read, cut at the decision time, fit (or continue the latest
version's models with only the newer samples), and publish or return recommendations."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from models.nodes import NodeForecaster
from models.store import DataWindow, Manifest, ModelStore
from models.workload import WorkloadRecommender
from pipelines.ingest import SampleBounds, quarantine, read_oom_events, read_usage
from pipelines.prometheus import PrometheusClient
from pipelines.prometheus_source import PrometheusSource
from pipelines.settings import TrainingSettings
from recommender.errors import InputFileError, PartialDataError, PrometheusError
from recommender.progress import Step, quiet
from recommender.resources import RecommendationSet

#: `end_at` shifts by whole steps of the tidy format, so samples keep their place on the 5-minute grid.
SHIFT_STEP_SECONDS = 300


@dataclass(frozen=True)
class TrainingResult:
    model: WorkloadRecommender
    recommendations: RecommendationSet
    usage_rows: int
    oom_events: int
    fit_seconds: float
    node_model: NodeForecaster | None = None


def has_placement(usage: pd.DataFrame) -> bool:
    """Whether the usage says which node pods ran on (the `node` column, with at least one value)."""
    return "node" in usage.columns and bool(usage["node"].notna().any())


def fit_nodes(
    usage: pd.DataFrame, settings: TrainingSettings, resume: NodeForecaster | None = None
) -> NodeForecaster | None:
    """The node model on usage with placement (continued from `resume`); None when the usage has no placement."""
    if not has_placement(usage):
        return resume
    if resume is not None:
        return resume.partial_fit(usage)
    return NodeForecaster.from_settings(settings, settings.colocation).fit(usage)


def load_history(input_path: Path, as_of: int | None, bounds: SampleBounds, step: Step = quiet) -> pd.DataFrame:
    """Read a usage file and keep only the rows before `as_of` (all of them when None)."""
    step(f"reading {input_path}")
    usage = read_usage(input_path, bounds)
    if as_of is not None:
        usage = usage[usage["timestamp"] < as_of]
    if usage.empty:
        when = f" before as-of {as_of}" if as_of is not None else ""
        raise InputFileError(input_path, f"has no usage rows{when}")
    return usage


def fit_history(
    usage: pd.DataFrame,
    settings: TrainingSettings,
    as_of: int | None,
    horizon_seconds: int,
    oom_events: pd.DataFrame | None = None,
    step: Step = quiet,
    resume: WorkloadRecommender | None = None,
    resume_nodes: NodeForecaster | None = None,
) -> TrainingResult:
    """Fit the workload models on usage rows (or continue `resume` with them) and, where the usage says where pods
    ran, the node model; compute the recommendations and node lines at `as_of` (default: data end)."""
    if oom_events is not None and as_of is not None:
        oom_events = oom_events[oom_events["timestamp"] < as_of]
    verb = "continuing" if resume is not None else "fitting"
    step(f"{verb} {usage.groupby(['namespace', 'workload', 'container']).ngroups} workload containers")
    started = time.perf_counter()
    if resume is not None:
        model = resume.partial_fit(usage, oom_events=oom_events)
    else:
        model = WorkloadRecommender.from_settings(settings).fit(usage, oom_events=oom_events)
    if has_placement(usage):
        step("fitting the node model")
    node_model = fit_nodes(usage, settings, resume_nodes)
    fit_seconds = time.perf_counter() - started
    refused = {
        k.removeprefix("vpa.skipped."): int(v) for k, v in model.vpa_summary().items() if k.startswith("vpa.skipped.")
    }
    if refused:
        step(f"vpa policy: skipped samples VPA refuses: {', '.join(f'{n} ({why})' for why, n in refused.items())}")
    step("computing recommendations")
    recommendations = model.predict(as_of=as_of, horizon_seconds=horizon_seconds)
    if node_model is not None:
        recommendations = recommendations.model_copy(
            update={"nodes": node_model.predict(as_of=as_of, horizon_seconds=horizon_seconds)}
        )
    return TrainingResult(
        model, recommendations, len(usage), 0 if oom_events is None else len(oom_events), fit_seconds, node_model
    )


def with_kinds(recommendations: RecommendationSet, kinds: dict[tuple[str, str], str]) -> RecommendationSet:
    """The recommendations with each workload's kind (from the owner discovery) where it is known."""
    return recommendations.model_copy(
        update={
            "recommendations": [
                r.model_copy(update={"kind": kinds.get((r.namespace, r.workload), r.kind)})
                for r in recommendations.recommendations
            ]
        }
    )


def recommend_from_file(
    input_path: Path, as_of: int, horizon_seconds: int, settings: TrainingSettings, step: Step = quiet
) -> RecommendationSet:
    """The `recommend` contract: learn only from rows before `as_of`, forecast the horizon after it."""
    usage = load_history(input_path, as_of, SampleBounds.at(settings.ingest, time.time()), step)
    return fit_history(usage, settings, as_of, horizon_seconds, step=step).recommendations


def train_from_file(
    input_path: Path,
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    oom_events_path: Path | None = None,
    horizon_seconds: int = 86400,
    incremental: bool = False,
    end_at: int | None = None,
    step: Step = quiet,
) -> Manifest:
    """Fit on a usage file and publish a new model version; a failure anywhere leaves the store untouched.

    `incremental`: continue the latest version's models with only the rows after its data window. `end_at`: move
    every timestamp by the same whole number of 5-minute steps so the newest sample lands at most one step before
    this Unix time (the demo's old trace then reads as current); the file is not touched, the source says so."""
    bounds = SampleBounds.at(settings.ingest, time.time())
    usage = load_history(input_path, as_of, bounds, step)
    oom_events = read_oom_events(oom_events_path, bounds) if oom_events_path is not None else None
    source = str(input_path)
    if end_at is not None:
        shift = (end_at - int(usage["timestamp"].max())) // SHIFT_STEP_SECONDS * SHIFT_STEP_SECONDS
        usage = usage.assign(timestamp=usage["timestamp"] + shift)
        if oom_events is not None:
            oom_events = oom_events.assign(timestamp=oom_events["timestamp"] + shift)
        source += f" (timestamps moved {shift / 86400:+.1f} days at load so the data ends now; the file is unchanged)"
    parent = _parent(settings, incremental)
    if parent is not None:
        usage = usage[usage["timestamp"] > parent.manifest.data_window.last_sample]
        if oom_events is not None:
            oom_events = oom_events[oom_events["timestamp"] > parent.manifest.data_window.last_sample]
        if usage.empty:
            raise InputFileError(
                input_path,
                f"has no rows after {parent.manifest.data_window.last_sample}, the end of version {parent.manifest.version}",
            )
    result = fit_history(
        usage,
        settings,
        as_of,
        horizon_seconds,
        oom_events,
        step,
        resume=parent.model if parent else None,
        resume_nodes=parent.node_model if parent else None,
    )
    return _publish(settings, result, usage, source, step, parent=parent)


@dataclass(frozen=True)
class _Parent:
    manifest: Manifest
    model: WorkloadRecommender
    node_model: NodeForecaster | None


def _parent(settings: TrainingSettings, incremental: bool) -> _Parent | None:
    """The latest verified version to continue from, or None for a full fit (none asked for, or none yet)."""
    if not incremental:
        return None
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    if store.latest_name() is None:
        return None
    manifest = store.manifest()
    return _Parent(manifest, store.load_model(manifest.version), store.load_node_model(manifest.version))


def train_from_prometheus(
    settings: TrainingSettings,
    *,
    as_of: int | None = None,
    allow_partial: bool = False,
    horizon_seconds: int = 86400,
    incremental: bool = False,
    step: Step = quiet,
) -> tuple[Manifest, dict[str, float]]:
    """Read the last `history_seconds` from Prometheus, fit, publish; returns the manifest and the query costs.

    A namespace batch that fails after retries makes the run fail without publishing (PartialDataError naming
    what was skipped), unless `allow_partial`, which publishes the rest and records what was skipped.
    `incremental`: continue the latest version's models, reading only the steps after its data window.
    """
    prom = settings.prometheus
    start, end = prometheus_window(settings, as_of)
    parent = _parent(settings, incremental)
    if parent is not None:
        start = max(start, parent.manifest.data_window.last_sample + prom.step_seconds)
        if start > end:
            raise PrometheusError(
                f"nothing new since {parent.manifest.data_window.last_sample}, the end of version {parent.manifest.version}"
            )
    started = time.perf_counter()
    with PrometheusClient(prom) as client:
        read = PrometheusSource(client, prom).read(start, end, step)
        costs = {**client.stats.summary(), "read_seconds": round(time.perf_counter() - started, 3)}
    if read.skipped and not allow_partial:
        raise PartialDataError(read.skipped)
    usage, quarantined = tidy_prometheus_usage(
        read.usage, settings, start, end, SampleBounds.at(settings.ingest, time.time())
    )
    result = fit_history(
        usage,
        settings,
        as_of,
        horizon_seconds,
        read.oom_events,
        step,
        resume=parent.model if parent else None,
        resume_nodes=parent.node_model if parent else None,
    )
    result = replace(result, recommendations=with_kinds(result.recommendations, read.workload_kinds))
    manifest = _publish(
        settings,
        result,
        usage,
        str(prom.url),
        step,
        read_metrics=costs,
        skipped=read.skipped,
        quarantined=quarantined,
        parent=parent,
    )
    return manifest, costs


def prometheus_window(settings: TrainingSettings, as_of: int | None) -> tuple[int, int]:
    """First and last step (Unix seconds) of the `history_seconds` read before `as_of` (default: now)."""
    prom = settings.prometheus
    end = int((time.time() if as_of is None else as_of - 1) // prom.step_seconds * prom.step_seconds)
    return end - prom.history_seconds, end


def tidy_prometheus_usage(
    usage: pd.DataFrame, settings: TrainingSettings, start: int, end: int, bounds: SampleBounds
) -> tuple[pd.DataFrame, dict[str, str]]:
    """The rows (each with a sample, sorted as a usage file is: `PrometheusSource.read` gives them so) without the
    workload containers quarantined for an impossible sample (returned by name, with why); an error when none."""
    usage, quarantined = quarantine(usage, bounds)
    if usage.empty:
        raise PrometheusError(f"{settings.prometheus.url}: no usage samples between {start} and {end}")
    return usage, quarantined


def _publish(
    settings: TrainingSettings,
    result: TrainingResult,
    usage: pd.DataFrame,
    source: str,
    step: Step,
    read_metrics: dict[str, float] | None = None,
    skipped: dict[str, str] | None = None,
    quarantined: dict[str, str] | None = None,
    parent: _Parent | None = None,
) -> Manifest:
    step(f"publishing to {settings.store.path}")
    first_sample = int(usage["timestamp"].min())
    if parent is not None:
        first_sample = min(first_sample, parent.manifest.data_window.first_sample)
    store = ModelStore(settings.store.path, settings.store.retention_versions)
    return store.publish(
        result.recommendations,
        result.model,
        source=source,
        parameters=settings.model_dump(mode="json", include={"histogram", "policy", "reservation", "forecast"}),
        row_counts={
            "usage_rows": result.usage_rows,
            "workload_containers": len(result.recommendations.recommendations),
            "pods": int(usage["pod"].nunique()),
            "nodes": len(result.recommendations.nodes),
            "oom_events": result.oom_events,
            "quarantined_containers": len(quarantined or {}),
        },
        fit_metrics={
            "fit_seconds": round(result.fit_seconds, 3),
            **result.model.selection_summary(),
            **result.model.vpa_summary(),
        },
        data_window=DataWindow(
            first_sample=first_sample,
            last_sample=int(usage["timestamp"].max()),
            as_of=result.recommendations.as_of,
        ),
        read_metrics=read_metrics,
        skipped=skipped,
        quarantined=quarantined,
        parent_version=parent.manifest.version if parent else None,
        node_model=result.node_model,
    )
