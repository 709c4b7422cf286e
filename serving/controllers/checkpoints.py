"""VerticalPodAutoscalerCheckpoints for `recommender sync`: warm-starting the `vpa` policy from a VPA's history, and
(opt-in) writing ours for a VPA recommender to continue from.

VPA's recommender stores, per VPA and container, a checkpoint named `<vpa>-<container>` in the VPA's namespace
(autoscaling.k8s.io/v1, v3 format). For a VPA that names us, `adjust` reads the checkpoint of each of its containers
that the `vpa` policy sizes and merges it into the learned state before the status is written, as VPA merges the
checkpoints it starts from; checkpoints we wrote ourselves are not read back (they hold what the model already has).
With `sync.write_vpa_checkpoints` the same checkpoints are written from our state, never over one another writer owns.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from models.store import ModelStore
from models.workload import WorkloadRecommender
from recommender.errors import ModelStoreError
from recommender.resources import WorkloadRecommendation
from serving.controllers.status import SyncReport
from serving.kube import api_message
from serving.settings import SyncSettings
from serving.state import ServiceState

log = logging.getLogger(__name__)

CHECKPOINT = ("autoscaling.k8s.io", "v1", "verticalpodautoscalercheckpoints")
MANAGED_BY = "app.kubernetes.io/managed-by"


def checkpoint_name(vpa_name: str, container: str) -> str:
    """VPA's name for a container's checkpoint."""
    return f"{vpa_name}-{container}"


def checkpoint_object(
    namespace: str, vpa_name: str, container: str, status: dict[str, Any], owner: str
) -> dict[str, Any]:
    """A VerticalPodAutoscalerCheckpoint as VPA's writer makes it, labelled as ours."""
    return {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscalerCheckpoint",
        "metadata": {
            "name": checkpoint_name(vpa_name, container),
            "namespace": namespace,
            "labels": {MANAGED_BY: owner},
        },
        "spec": {"vpaObjectName": vpa_name, "containerName": container},
        "status": status,
    }


class CheckpointBridge:
    """Reads (and optionally writes) the checkpoints of the VPAs naming us, against the loaded model version."""

    def __init__(self, api: client.ApiClient, state: ServiceState, store: ModelStore, settings: SyncSettings) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.state = state
        self.store = store
        self.settings = settings
        self._model: tuple[str, WorkloadRecommender] | None = None
        self._warned = False

    def enabled(self) -> bool:
        return self.settings.read_vpa_checkpoints or self.settings.write_vpa_checkpoints

    def _fitted(self) -> WorkloadRecommender | None:
        """The loaded version's estimator (loaded once per version); None when it has no single fitted model."""
        version = self.state.require().version
        if self._model is None or self._model[0] != version:
            try:
                self._model = (version, self.store.load_model(version))
            except ModelStoreError as error:
                log.warning("VPA checkpoints skipped: %s", error)
                return None
        return self._model[1]

    def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(*CHECKPOINT[:2], namespace, CHECKPOINT[2], name),
            )
        except ApiException as error:
            if error.status == 404:
                return None
            if error.status == 403 and not self._warned:
                self._warned = True
                log.warning(
                    "cannot read VPA checkpoints (%s); the vpa policy is not warm-started: grant `get` on "
                    "verticalpodautoscalercheckpoints or set sync.read_vpa_checkpoints=false",
                    api_message(error),
                )
            if error.status == 403:
                return None
            raise

    def adjust(
        self, vpa: dict[str, Any], recommendations: list[WorkloadRecommendation]
    ) -> list[WorkloadRecommendation]:
        """The recommendations of a VPA naming us, warm-started from the checkpoints a VPA recommender left."""
        if not self.settings.read_vpa_checkpoints or not any(_uses_vpa(r) for r in recommendations):
            return recommendations
        model = self._fitted()
        if model is None:
            return recommendations
        meta = vpa.get("metadata") or {}
        as_of = self.state.require().loaded.recommendations.as_of
        out = []
        for rec in recommendations:
            found = (
                self._read(meta.get("namespace", ""), checkpoint_name(meta.get("name", ""), rec.container))
                if _uses_vpa(rec)
                else None
            )
            owner = ((found or {}).get("metadata") or {}).get("labels", {}).get(MANAGED_BY)
            if found is None or owner == self.settings.recommender_name:
                out.append(rec)
                continue
            try:
                out.append(model.warm_started(rec, found.get("status") or {}, as_of))
            except ValueError as error:
                log.warning(
                    "checkpoint %s/%s not used: %s", meta.get("namespace"), found["metadata"].get("name"), error
                )
                out.append(rec)
        return out

    def write(self, report: SyncReport, vpas: list[dict[str, Any]]) -> None:
        """With `sync.write_vpa_checkpoints`: create or replace our checkpoint for each container of the VPAs naming
        us (of `vpas`, the status writer's cache) that the `vpa` policy sizes; one another writer owns is left alone
        (named in `report.ignored`)."""
        model = self._fitted() if self.settings.write_vpa_checkpoints else None
        if model is None:
            return
        by_key = self.state.require().by_key
        now = time.time()
        for vpa in vpas:
            meta, spec = vpa.get("metadata") or {}, vpa.get("spec") or {}
            if self.settings.recommender_name not in [r.get("name") for r in spec.get("recommenders") or []]:
                continue
            namespace, workload = meta.get("namespace", ""), (spec.get("targetRef") or {}).get("name", "")
            for key in by_key:
                if (key.namespace, key.workload) != (namespace, workload):
                    continue
                status = model.vpa_checkpoint(namespace, workload, key.container, now)
                if status is not None:
                    self._put(
                        checkpoint_object(
                            namespace, meta["name"], key.container, status, self.settings.recommender_name
                        ),
                        report,
                    )

    def _put(self, body: dict[str, Any], report: SyncReport) -> None:
        meta = body["metadata"]
        name = f"VerticalPodAutoscalerCheckpoint {meta['namespace']}/{meta['name']}"
        group, version, plural = CHECKPOINT
        try:
            existing = self._read(meta["namespace"], meta["name"])
            if existing is None:
                self.custom.create_namespaced_custom_object(group, version, meta["namespace"], plural, body)
            elif (existing.get("metadata") or {}).get("labels", {}).get(MANAGED_BY) != self.settings.recommender_name:
                report.ignored.append(name)
                return
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                self.custom.replace_namespaced_custom_object(
                    group, version, meta["namespace"], plural, meta["name"], body
                )
            report.written.append(name)
        except ApiException as error:
            report.failed[name] = f"HTTP {error.status}: {api_message(error)}"


def _uses_vpa(rec: WorkloadRecommendation) -> bool:
    return any(found is not None and found.policy == "vpa" for found in (rec.cpu, rec.memory))
