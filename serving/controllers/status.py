"""`recommender sync`: keep VerticalPodAutoscaler and Koordinator Recommendation statuses in step with the model.

Lists the objects, writes the status of each one we own (VPAs whose spec.recommenders names us; every workload
Recommendation) through a JSON patch on the status subresource, only when it changed, then watches both kinds until
the next resync so new objects are answered within seconds. API errors back off with jitter; a new model version
is picked up at the next resync.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from recommender.cluster_status import koordinator_status, same_status, vpa_status
from recommender.errors import KubernetesError, ModelStoreError
from recommender.resources import WorkloadRecommendation
from recommender.settings import SyncSettings
from serving.kube import api_message
from serving.state import ServiceState

log = logging.getLogger(__name__)

VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
RECOMMENDATION = ("analysis.koordinator.sh", "v1alpha1", "recommendations")


@dataclass
class SyncReport:
    written: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _name(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind', '?')} {meta.get('namespace')}/{meta.get('name')}"


class StatusSync:
    """One resync pass (`sync_once`) and the watch loop (`run`)."""

    def __init__(
        self,
        api: client.ApiClient,
        state: ServiceState,
        settings: SyncSettings,
        extra: Callable[[SyncReport], None] | None = None,
        adjust: Callable[[dict[str, Any], list[WorkloadRecommendation]], list[WorkloadRecommendation]] | None = None,
    ) -> None:
        """`extra`: a further pass run at every resync (the opt-in node writer of `serving.controllers.nodes`, the checkpoint
        writer of `serving.controllers.checkpoints`); `adjust`: what a VPA's recommendations become before its status is
        built (the checkpoint warm start)."""
        self.custom = client.CustomObjectsApi(api)
        self.state = state
        self.settings = settings
        self.extra = extra
        self.adjust = adjust

    def _targets(self, namespace: str, workload: str) -> list[WorkloadRecommendation]:
        snapshot = self.state.require()
        return [r for k, r in snapshot.by_key.items() if k.namespace == namespace and k.workload == workload]

    def _desired(self, kind: tuple[str, str, str], obj: dict[str, Any]) -> dict[str, Any] | None:
        """The status we want on `obj`, or None when the object is not ours."""
        meta = obj.get("metadata") or {}
        version = self.state.require().revision  # the live update, when one is served
        namespace = meta.get("namespace", "")
        if kind == VPA:
            spec = obj.get("spec") or {}
            names = [r.get("name") for r in spec.get("recommenders") or []]
            if self.settings.recommender_name not in names:
                return None
            target = spec.get("targetRef") or {}
            recommendations = self._targets(namespace, target.get("name", ""))
            if self.adjust is not None:
                recommendations = self.adjust(obj, recommendations)
            return vpa_status(recommendations, obj, version)
        target = ((obj.get("spec") or {}).get("target") or {}).get("workload") or {}
        return koordinator_status(self._targets(namespace, target.get("name", "")), obj, version)

    def reconcile(self, kind: tuple[str, str, str], obj: dict[str, Any], report: SyncReport) -> None:
        name = _name(obj)
        desired = self._desired(kind, obj)
        if desired is None:
            report.ignored.append(name)
            return
        if same_status(obj.get("status"), desired):
            report.unchanged.append(name)
            return
        meta = obj["metadata"]
        group, version, plural = kind
        try:
            self.custom.patch_namespaced_custom_object_status(
                group,
                version,
                meta["namespace"],
                plural,
                meta["name"],
                [{"op": "add", "path": "/status", "value": desired}],
                _content_type="application/json-patch+json",
            )
            report.written.append(name)
        except ApiException as error:
            report.failed[name] = f"HTTP {error.status}: {api_message(error)}"

    def _kinds(self) -> list[tuple[str, str, str]]:
        return [k for k, on in ((VPA, self.settings.vpa), (RECOMMENDATION, self.settings.koordinator)) if on]

    def sync_once(self) -> SyncReport:
        """Reconcile every object of both kinds against the newest valid model version."""
        self.state.refresh()
        self.state.require()
        report = SyncReport()
        for kind in self._kinds():
            for obj in self._list(kind):
                self.reconcile(kind, obj, report)
        if self.extra is not None:
            self.extra(report)
        return report

    def _list(self, kind: tuple[str, str, str]) -> Iterable[dict[str, Any]]:
        group, version, plural = kind
        try:
            answer = self.custom.list_cluster_custom_object(group, version, plural)
            items: list[dict[str, Any]] = answer["items"]  # type: ignore[index]
            return items
        except ApiException as error:
            if error.status == 404:
                log.warning("%s/%s %s is not installed in this cluster; skipping it", group, version, plural)
                return []
            raise KubernetesError(f"listing {plural}.{group}: HTTP {error.status}: {api_message(error)}") from None

    def run(self, stop: threading.Event, on_report: Callable[[SyncReport], None] = lambda _: None) -> None:
        """Resync every `resync_seconds`, answering watch events in between, until `stop` is set."""
        failures = 0
        while not stop.is_set():
            try:
                on_report(self.sync_once())
                failures = 0
                self._watch_until_resync(stop, on_report)
            except (KubernetesError, ModelStoreError, ApiException, OSError) as error:
                failures += 1
                delay = min(self.settings.backoff_max_seconds, 2.0**failures) * random.uniform(0.5, 1.0)
                log.warning("sync failed (%s); retrying in %.1f s", error, delay)
                stop.wait(delay)

    def _watch_until_resync(self, stop: threading.Event, on_report: Callable[[SyncReport], None]) -> None:
        """Watch each kind in turn for its share of the resync period (the client's watch is blocking)."""
        kinds = self._kinds()
        share = max(1, int(self.settings.resync_seconds / max(len(kinds), 1)))
        for kind in kinds:
            if stop.is_set():
                return
            group, version, plural = kind
            stream = watch.Watch().stream(
                self.custom.list_cluster_custom_object, group, version, plural, timeout_seconds=share
            )
            for event in stream:
                if stop.is_set():
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    report = SyncReport()
                    self.reconcile(kind, event["object"], report)
                    if report.written or report.failed:
                        on_report(report)
