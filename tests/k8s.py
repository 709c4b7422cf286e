"""Kubernetes objects as the API server sends them: pods of each controller, AdmissionReviews, nodes, pod lists.

Pods are what a controller creates (ownerReferences, pod-template-hash, generateName, no name yet on CREATE, no
namespace in metadata: the review carries it), after the API server's defaulting; resources vary by shape.
"""

from __future__ import annotations

import base64
import copy
import json
import uuid
from typing import Any

import jsonpatch

#: Every shape `resources` takes in real pods.
RESOURCE_SHAPES: dict[str, dict[str, Any] | None] = {
    "absent": None,
    "empty": {},
    "requests-only": {"requests": {"cpu": "500m", "memory": "512Mi"}},
    "limits-only": {"limits": {"cpu": "2", "memory": "4Gi"}},
    "both": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "cpu-only": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}},
    "guaranteed": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
    "with-extra-resource": {"requests": {"cpu": "1", "nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
}


def container(name: str, resources: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    found: dict[str, Any] = {
        "name": name,
        "image": f"registry.example/{name}:1.0",
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        **extra,
    }
    if resources is not None:
        found["resources"] = copy.deepcopy(resources)
    return found


def _owner(kind: str, name: str, api_version: str = "apps/v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": str(uuid.uuid4()),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod(
    owner: str,
    workload: str,
    containers: list[dict[str, Any]],
    init_containers: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as its controller creates it: `owner` is deployment, statefulset, daemonset, job, cronjob or bare."""
    metadata: dict[str, Any] = {"labels": {"app": workload, **(labels or {})}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    if owner == "deployment":
        template_hash = "5d8f7c9b4"
        metadata["labels"]["pod-template-hash"] = template_hash
        metadata["generateName"] = f"{workload}-{template_hash}-"
        metadata["ownerReferences"] = [_owner("ReplicaSet", f"{workload}-{template_hash}")]
    elif owner == "statefulset":
        metadata["name"] = f"{workload}-0"
        metadata["generateName"] = f"{workload}-"
        metadata["labels"]["statefulset.kubernetes.io/pod-name"] = f"{workload}-0"
        metadata["ownerReferences"] = [_owner("StatefulSet", workload)]
    elif owner == "daemonset":
        metadata["generateName"] = f"{workload}-"
        metadata["ownerReferences"] = [_owner("DaemonSet", workload)]
    elif owner in ("job", "cronjob"):
        job = f"{workload}-28911520" if owner == "cronjob" else workload
        metadata["generateName"] = f"{job}-"
        metadata["labels"].update({"batch.kubernetes.io/job-name": job, "job-name": job})
        metadata["ownerReferences"] = [_owner("Job", job, "batch/v1")]
    elif owner == "bare":
        metadata["name"] = workload
    else:
        raise ValueError(owner)
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Never" if owner in ("job", "cronjob") else "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
    }
    if init_containers:
        spec["initContainers"] = init_containers
    return {"metadata": metadata, "spec": spec, "status": {}}


def review(
    pod_object: dict[str, Any], namespace: str, dry_run: bool = False, operation: str = "CREATE"
) -> dict[str, Any]:
    """The AdmissionReview the API server POSTs to a pod mutating webhook."""
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod_object["metadata"].get("name", ""),
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "groups": ["system:serviceaccounts"],
            },
            "object": pod_object,
            "oldObject": None,
            "dryRun": dry_run,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def apply_response(pod_object: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server stores it after applying the webhook's JSON Patch (it must apply cleanly)."""
    assert response["apiVersion"] == "admission.k8s.io/v1" and response["kind"] == "AdmissionReview"
    answer = response["response"]
    assert answer["allowed"] is True
    if "patch" not in answer:
        return pod_object
    assert answer["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(answer["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod_object, patch)
    return result


def node(name: str, cpu: str = "16", memory: str = "64Gi", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annotations or {}},
        "status": {"capacity": {"cpu": cpu, "memory": memory}, "allocatable": {"cpu": cpu, "memory": memory}},
    }


def running(pod_object: dict[str, Any], namespace: str, node_name: str, name: str) -> dict[str, Any]:
    """A pod as `kubectl get pods -o json` shows it once scheduled."""
    placed = copy.deepcopy(pod_object)
    placed["metadata"].update(name=name, namespace=namespace)
    placed["spec"]["nodeName"] = node_name
    placed["status"] = {"phase": "Running"}
    return placed


def listing(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}
