"""`recommender sync`: keep VerticalPodAutoscaler and Koordinator Recommendation statuses in step with the model.

The objects come from the shared list + watch caches (`serving.kube_watch.Informer`, as the webhook's and the
cluster-files sidecar's do): a full pass writes the status of each object we own (VPAs whose spec.recommenders names
us; every workload Recommendation) through a JSON patch on the status subresource, only when it changed, at start,
every resync period and after any re-list; in between, each watch event of either kind is answered within seconds.
Pass failures back off with jitter; a new model version is picked up at the next full pass.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from models.store import LiveUpdate
from recommender.cluster_status import LiveFreshness, koordinator_status, same_status, vpa_status
from recommender.errors import KubernetesError, ModelStoreError
from recommender.resources import WorkloadRecommendation
from serving.kube import api_message
from serving.kube_watch import Informer, Informers
from serving.settings import SyncSettings
from serving.state import ServiceState

log = logging.getLogger(__name__)

VPA = ("autoscaling.k8s.io", "v1", "verticalpodautoscalers")
RECOMMENDATION = ("analysis.koordinator.sh", "v1alpha1", "recommendations")
Kind = tuple[str, str, str]
#: How often the loop looks up from the event queue for a stop request or a due pass, seconds.
TICK_SECONDS = 1.0


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
    """One full pass (`sync_once`: list, then reconcile everything) and the watching loop (`run`)."""

    def __init__(
        self,
        api: client.ApiClient,
        state: ServiceState,
        settings: SyncSettings,
        extra: Callable[[SyncReport], None] | None = None,
        adjust: Callable[[dict[str, Any], list[WorkloadRecommendation]], list[WorkloadRecommendation]] | None = None,
        watched: list[Informer] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`extra`: a further pass run at every full pass (the opt-in node writer of `serving.controllers.nodes`, the
        checkpoint writer of `serving.controllers.checkpoints`); `adjust`: what a VPA's recommendations become before
        its status is built (the checkpoint warm start); `watched`: the further informers `extra` reads, listed and
        watched with ours; `clock`: what the live update's age is measured against."""
        self.custom = client.CustomObjectsApi(api)
        self.clock = clock
        self.state = state
        self.settings = settings
        self.extra = extra
        self.adjust = adjust
        self._events: queue.Queue[tuple[Kind, dict[str, Any]]] = queue.Queue()
        self.vpas = self._informer(VPA)
        self.recommendations = self._informer(RECOMMENDATION)
        self.kinds = [
            (kind, informer)
            for kind, informer, on in (
                (VPA, self.vpas, settings.vpa),
                (RECOMMENDATION, self.recommendations, settings.koordinator),
            )
            if on
        ]
        ours = [informer for _, informer in self.kinds]
        if self.vpas not in ours and settings.write_vpa_checkpoints:
            ours.append(self.vpas)  # the checkpoint writer reads the VPAs naming us
        self.informers = ours + list(watched or [])

    def _informer(self, kind: Kind) -> Informer:
        group, version, plural = kind

        def answer(event: str, obj: dict[str, Any]) -> None:
            if event in ("ADDED", "MODIFIED"):
                self._events.put((kind, obj))

        return Informer(
            plural,
            self.custom.list_cluster_custom_object,
            group,
            version,
            plural,
            resync_seconds=self.settings.resync_seconds,
            backoff_max_seconds=self.settings.backoff_max_seconds,
            on_event=answer,
            missing_ok=True,
        )

    def _targets(self, namespace: str, workload: str) -> list[WorkloadRecommendation]:
        snapshot = self.state.require()
        return [r for k, r in snapshot.by_key.items() if k.namespace == namespace and k.workload == workload]

    def _desired(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The status we want on `obj`, or None when the object is not ours."""
        meta = obj.get("metadata") or {}
        snapshot = self.state.require()
        version = snapshot.revision  # the live update, when one is served
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
            return vpa_status(recommendations, obj, version, self._freshness(snapshot.live))
        target = ((obj.get("spec") or {}).get("target") or {}).get("workload") or {}
        return koordinator_status(self._targets(namespace, target.get("name", "")), obj, version)

    def _freshness(self, live: LiveUpdate | None) -> LiveFreshness | None:
        if live is None:
            return None
        limit = self.settings.live_stale_after_seconds
        return LiveFreshness(live.revision, live.written_at, limit, self.clock() - live.written_at > limit)

    def reconcile(self, kind: Kind, obj: dict[str, Any], report: SyncReport) -> None:
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

    def sync_once(self) -> SyncReport:
        """List every watched kind once, then reconcile everything against the newest valid model version."""
        for informer in self.informers:
            informer.list_now()
        return self.full_pass()

    def full_pass(self) -> SyncReport:
        """Reconcile every cached object of both kinds (and run `extra`) against the newest valid model version."""
        self.state.refresh()
        self.state.require()
        report = SyncReport()
        for kind, informer in self.kinds:
            for obj in informer.values():
                self.reconcile(kind, obj, report)
        if self.extra is not None:
            self.extra(report)
        return report

    def run(self, stop: threading.Event, on_report: Callable[[SyncReport], None] = lambda _: None) -> None:
        """Watch until `stop`: a full pass once every informer has listed, then every `resync_seconds` and after any
        re-list (a watch gap may have hidden changes); each watch event in between is reconciled on its own."""
        informers = Informers(self.informers)
        informers.start()
        try:
            self._loop(informers, stop, on_report)
        finally:
            informers.stop()

    def _loop(self, informers: Informers, stop: threading.Event, on_report: Callable[[SyncReport], None]) -> None:
        failures, due, lists = 0, 0.0, [-1] * len(self.informers)
        while not stop.is_set():
            if informers.problem() is not None:
                stop.wait(TICK_SECONDS)
                continue
            now = time.monotonic()
            listed = [informer.lists for informer in self.informers]
            if now >= due or listed != lists:
                try:
                    on_report(self.full_pass())
                except (KubernetesError, ModelStoreError, ApiException, OSError) as error:
                    failures += 1
                    delay = min(self.settings.backoff_max_seconds, 2.0**failures) * random.uniform(0.5, 1.0)
                    log.warning("sync failed (%s); retrying in %.1f s", error, delay)
                    stop.wait(delay)
                    continue
                failures, due, lists = 0, now + self.settings.resync_seconds, listed
            try:
                kind, obj = self._events.get(timeout=TICK_SECONDS)
            except queue.Empty:
                continue
            report = SyncReport()
            try:
                self.reconcile(kind, obj, report)
            except (KubernetesError, ModelStoreError, ApiException, OSError) as error:
                log.warning("%s not reconciled (%s); the next full pass retries it", _name(obj), error)
                continue
            if report.written or report.failed:
                on_report(report)
