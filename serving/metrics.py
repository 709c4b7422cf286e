"""Prometheus metrics of the service, in a registry per app (so tests and several apps never share counters).

Besides latency per route, webhook decisions and extender calls, it exports the model version and age and the
recommendation families VPA's recommender exports (per container target and bounds, `vpa_`-like names under our
prefix), so dashboards built for VPA can be pointed at us.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from serving.state import ServiceState

#: Latency buckets in seconds: the webhook's goal is a p99 under 5 ms, the apiserver's timeout is 10-30 s.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class ModelCollector(Collector):
    """Metrics read from the loaded snapshot at scrape time (nothing to keep in sync)."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def collect(self) -> list[GaugeMetricFamily]:
        info = GaugeMetricFamily("koord_recommender_model_info", "Loaded model version (value 1).", labels=["version"])
        age = GaugeMetricFamily("koord_recommender_model_age_seconds", "Now minus the loaded version's decision time.")
        recommendation = GaugeMetricFamily(
            "koord_recommender_recommendation",
            "Per container recommendation, as VPA's status: target, lowerBound, upperBound, uncappedTarget (cores or bytes).",
            labels=["namespace", "workload", "container", "resource", "bound"],
        )
        snapshot = self.state.snapshot
        if snapshot is not None:
            info.add_metric([snapshot.version], 1)
            age.add_metric([], time.time() - snapshot.loaded.recommendations.as_of)
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
        return [info, age, recommendation]


class Metrics:
    """The service's metric objects, registered in their own registry."""

    def __init__(self, state: ServiceState) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "koord_recommender_http_request_duration_seconds", "Request latency per route.", ["method", "route", "status"],
            registry=self.registry, buckets=LATENCY_BUCKETS,
        )
        self.webhook_decisions = Counter(
            "koord_recommender_webhook_decisions", "Admission reviews by outcome (patched, unchanged, skipped, error).",
            ["outcome", "dry_run"], registry=self.registry,
        )
        self.extender_calls = Counter(
            "koord_recommender_extender_calls", "Scheduler extender calls by verb.", ["verb"], registry=self.registry
        )
        self.extender_nodes = Counter(
            "koord_recommender_extender_nodes", "Nodes judged by the extender, by result (fit, failed, unknown).",
            ["verb", "result"], registry=self.registry,
        )
        self.reloads = Counter(
            "koord_recommender_reloads", "Hot reloads by what was reloaded (model, tls).", ["what"], registry=self.registry
        )
        self.ready = Gauge("koord_recommender_ready", "1 when a valid model version is loaded.", registry=self.registry)
        self.ready.set_function(lambda: float(state.snapshot is not None))
        self.registry.register(ModelCollector(state))
