"""Our manifests as a real kube-apiserver sees them: server-side dry-run creation of every object (with the VPA and
Koordinator CRDs installed), so schema, defaulting and admission all judge them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic

from tests.support.control_plane import ControlPlane

pytestmark = pytest.mark.e2e
MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
#: Kinds whose CRDs (cert-manager, Prometheus Operator) or API (component config) this control plane does not have.
NOT_SERVED = {"Certificate", "Issuer", "ServiceMonitor", "KubeSchedulerConfiguration"}


def objects() -> list[dict[str, Any]]:
    found = []
    for path in sorted([*MANIFESTS.glob("base/*.yaml"), *MANIFESTS.glob("examples/*.yaml")]):
        if path.name != "kustomization.yaml":
            found += [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] not in NOT_SERVED]
    return found


def test_every_manifest_is_accepted_by_the_apiserver(plane: ControlPlane) -> None:
    api = plane.api()
    resources = dynamic.DynamicClient(api).resources
    core = client.CoreV1Api(api)
    existing = {n.metadata.name for n in core.list_namespace().items}
    for document in [d for d in objects() if d["kind"] == "Namespace"] + [{"metadata": {"name": "shop"}}]:
        if document["metadata"]["name"] not in existing:
            core.create_namespace(document)  # created for real: the namespaced objects are dry-run into them
    checked = ["Namespace"]
    for document in [d for d in objects() if d["kind"] != "Namespace"]:
        resource = resources.get(api_version=document["apiVersion"], kind=document["kind"])
        namespace = document["metadata"].get("namespace") or ("koord-recommender" if resource.namespaced else None)
        created = resource.create(body=document, namespace=namespace, dry_run="All")
        assert created.metadata.name == document["metadata"]["name"]
        checked.append(document["kind"])
    assert {
        "Deployment",
        "CronJob",
        "MutatingWebhookConfiguration",
        "ClusterRole",
        "VerticalPodAutoscaler",
        "Recommendation",
    } <= set(checked)
