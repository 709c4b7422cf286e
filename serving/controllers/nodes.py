"""Opt-in writer of per-node values Koordinator already reads (reclaim-ratio labels, usage-thresholds annotation).

Part of `recommender sync`: from the nodes and running pods the shared list + watch caches hold
(`serving.kube_watch`, as the cluster-files sidecar keeps them), it builds the same node view as the extender over the
loaded model version and merge-patches the metadata of each node the model learned, only when a value changed, at
each of the status writer's full passes. Koordinator's own controllers then compute batch resources and filter nodes
with our forecasts, unchanged.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from recommender.placement import NodeLoads, node_metadata
from serving.controllers.cluster_view import RUNNING_PODS
from serving.controllers.status import SyncReport
from serving.kube import api_message
from serving.kube_watch import Informer
from serving.settings import ServingSettings
from serving.state import ServiceState, timeline_of


class NodeColocationSync:
    """One pass over the nodes: `sync_once(report)` adds each node written, unchanged or failed to `report`; the
    `informers` (nodes, running pods) are listed and watched by the status writer's loop."""

    def __init__(self, api: client.ApiClient, state: ServiceState, settings: ServingSettings) -> None:
        self.core = client.CoreV1Api(api)
        self.state = state
        self.settings = settings
        resync, backoff = settings.sync.resync_seconds, settings.sync.backoff_max_seconds
        self.nodes = Informer("nodes", self.core.list_node, resync_seconds=resync, backoff_max_seconds=backoff)
        self.pods = Informer(
            "pods",
            self.core.list_pod_for_all_namespaces,
            field_selector=RUNNING_PODS,
            resync_seconds=resync,
            backoff_max_seconds=backoff,
        )
        self.informers = [self.nodes, self.pods] if self.enabled() else []

    def enabled(self) -> bool:
        return self.settings.colocation.write_reclaim_ratios or self.settings.colocation.write_usage_thresholds

    def sync_once(self, report: SyncReport) -> None:
        snapshot = self.state.require()
        nodes: list[dict[str, Any]] = self.nodes.values()
        pods: list[dict[str, Any]] = self.pods.values()
        forecasts = {n.node: n for n in snapshot.loaded.recommendations.nodes}
        loads = NodeLoads.build(pods, nodes, snapshot.lookup, timeline_of(snapshot), self.settings.extender, forecasts)
        now = time.time()
        for node in nodes:
            meta = node.get("metadata") or {}
            name = f"Node {meta.get('name')}"
            wanted = node_metadata(loads, node, now, self.settings.colocation, self.settings.extender)
            if wanted is None:
                report.ignored.append(name)
                continue
            labels, annotations = wanted
            current_labels, current_annotations = meta.get("labels") or {}, meta.get("annotations") or {}
            if all(current_labels.get(k) == v for k, v in labels.items()) and all(
                current_annotations.get(k) == v for k, v in annotations.items()
            ):
                report.unchanged.append(name)
                continue
            try:
                self.core.patch_node(meta["name"], {"metadata": {"labels": labels, "annotations": annotations}})
                report.written.append(name)
            except ApiException as error:
                report.failed[name] = f"HTTP {error.status}: {api_message(error)}"
