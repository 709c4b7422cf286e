"""Prometheus metrics of the service, in a registry per app (so tests and several apps never share counters).

Besides latency per route, webhook decisions and extender calls, it exports the model version and age, every
container's target and bounds as VPA's status holds them, and VPA's quality family (how far usage falls from the
recommendation, as a relative-difference histogram), under our prefix.
"""

from __future__ import annotations

import time

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from serving.state import ServiceState, Snapshot

#: Latency buckets in seconds: the webhook's goal is a p99 under 5 ms, the apiserver's timeout is 10-30 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


#: Relative-difference buckets of VPA's quality metrics: (usage - recommendation) / recommendation.
RELATIVE_DIFF_BUCKETS = (-1.0, -0.5, -0.25, -0.1, -0.05, 0.0, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _quality(snapshot: Snapshot) -> dict[str, tuple[list[tuple[str, float]], float]]:
    """Per resource, cumulative buckets and sum of (usage - target) / target over the last day of every container,
    VPA's `quality_usage_recommendation_relative_diffs`."""
    result = {}
    for resource, usage_field in (("cpu", "recent_cpu_cores"), ("memory", "recent_memory_bytes")):
        diffs = []
        for rec in snapshot.loaded.recommendations.recommendations:
            learned = getattr(rec, resource)
            usage = np.array([np.nan if v is None else v for v in getattr(rec.history, usage_field, [])], dtype=float)
            if learned is not None and learned.target > 0 and usage.size:
                diffs.append((usage[~np.isnan(usage)] - learned.target) / learned.target)
        values = np.concatenate(diffs) if diffs else np.zeros(0)
        buckets = [(str(edge), float(np.count_nonzero(values <= edge))) for edge in RELATIVE_DIFF_BUCKETS]
        result[resource] = (buckets + [("+Inf", float(values.size))], float(values.sum()))
    return result


class ModelCollector(Collector):
    """Metrics read from the loaded snapshot at scrape time (nothing to keep in sync)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state
        self._quality: tuple[str, dict[str, tuple[list[tuple[str, float]], float]]] | None = None

    def quality(self, snapshot: Snapshot) -> dict[str, tuple[list[tuple[str, float]], float]]:
        """The quality histograms of the loaded version, computed once per version."""
        if self._quality is None or self._quality[0] != snapshot.revision:
            self._quality = (snapshot.revision, _quality(snapshot))
        return self._quality[1]

    def collect(self) -> list[Metric]:
        info = GaugeMetricFamily("koord_recommender_model_info", "Loaded model version (value 1).", labels=["version"])
        age = GaugeMetricFamily(
            "koord_recommender_model_age_seconds",
            "Now minus the decision time of the served lines (the live update's, else the version's).",
        )
        recommendation = GaugeMetricFamily(
            "koord_recommender_recommendation",
            "Per container recommendation, as VPA's status: target, lowerBound, upperBound, uncappedTarget (cores or bytes).",
            labels=["namespace", "workload", "container", "resource", "bound"],
        )
        quality = HistogramMetricFamily(
            "koord_recommender_quality_usage_recommendation_relative_diffs",
            "(usage - target) / target over the last day of every container, as VPA's quality metric of that name.",
            labels=["resource"],
        )
        live = GaugeMetricFamily(
            "koord_recommender_live_update_info",
            "The live loop's update served (value 1: its sequence number as a label); absent while the version's "
            "own lines are served.",
            labels=["version", "sequence"],
        )
        live_age = GaugeMetricFamily(
            "koord_recommender_live_update_age_seconds",
            "Now minus when the served live update was written: grows while the loop cannot read Prometheus.",
        )
        snapshot = self.state.snapshot
        if snapshot is not None and snapshot.live is not None:
            live.add_metric([snapshot.live.version, str(snapshot.live.sequence)], 1)
            live_age.add_metric([], time.time() - snapshot.live.written_at)
        if snapshot is not None:
            for resource, (buckets, total) in self.quality(snapshot).items():
                quality.add_metric([resource], buckets, total)
            info.add_metric([snapshot.version], 1)
            age.add_metric([], snapshot.age_seconds())
            for rec in snapshot.loaded.recommendations.recommendations:
                for resource in ("cpu", "memory"):
                    learned = getattr(rec, resource)
                    if learned is None:
                        continue
                    for bound, value in (
                        ("target", learned.target),
                        ("lowerBound", learned.lower_bound),
                        ("upperBound", learned.upper_bound),
                        ("uncappedTarget", learned.uncapped_target),
                    ):
                        recommendation.add_metric([rec.namespace, rec.workload, rec.container, resource, bound], value)
        return [info, age, live, live_age, recommendation, quality]


class Metrics:
    """The service's metric objects, registered in their own registry."""

    def __init__(self, state: ServiceState) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "koord_recommender_http_request_duration_seconds",
            "Request latency per route.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=LATENCY_BUCKETS,
        )
        self.webhook_decisions = Counter(
            "koord_recommender_webhook_decisions",
            "Admission reviews by outcome (patched, would_patch, unchanged, off, skipped, not_synced, error, overloaded, too_large).",
            ["outcome", "dry_run"],
            registry=self.registry,
        )
        self.webhook_hpa_conflicts = Counter(
            "koord_recommender_webhook_hpa_conflicts",
            "Pods whose resource was left unchanged because a HorizontalPodAutoscaler scales their workload on it.",
            ["resource"],
            registry=self.registry,
        )
        self.extender_calls = Counter(
            "koord_recommender_extender_calls", "Scheduler extender calls by verb.", ["verb"], registry=self.registry
        )
        self.extender_nodes = Counter(
            "koord_recommender_extender_nodes",
            "Nodes judged by the extender, by result (fit, failed, unknown).",
            ["verb", "result"],
            registry=self.registry,
        )
        self.reloads = Counter(
            "koord_recommender_reloads",
            "Hot reloads by what was reloaded (model, tls).",
            ["what"],
            registry=self.registry,
        )
        self.watch_synced = Gauge(
            "koord_recommender_watch_synced",
            "1 when the list + watch cache of this kind has listed (webhook opt-in sources).",
            ["kind"],
            registry=self.registry,
        )
        self.watch_objects = Gauge(
            "koord_recommender_watch_objects",
            "Objects held by the list + watch cache of this kind.",
            ["kind"],
            registry=self.registry,
        )
        self.ready = Gauge("koord_recommender_ready", "1 when a valid model version is loaded.", registry=self.registry)
        self.ready.set_function(lambda: float(state.snapshot is not None))
        self.registry.register(ModelCollector(state))
