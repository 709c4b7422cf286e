"""Koordinator's conventions (anchors.md section 1) and workload resolution from a pod's own metadata."""

from __future__ import annotations

import json
from typing import Any

import pytest

from recommender import koordinator as k
from recommender.owners import workload_candidates
from tests.k8s import RESOURCE_SHAPES, container, pod


def with_labels(labels: dict[str, str], shape: str = "both", priority: int | None = 0) -> dict[str, Any]:
    found = pod("deployment", "web", [container("main", RESOURCE_SHAPES[shape])], labels=labels)
    found["spec"]["priority"] = priority
    return found


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("guaranteed", "Guaranteed"),
        ("both", "Burstable"),
        ("absent", "BestEffort"),
        ("empty", "BestEffort"),
        ("limits-only", "Guaranteed"),
    ],
)
def test_kubernetes_qos(shape: str, expected: str) -> None:
    assert k.kubernetes_qos(with_labels({}, shape)) == expected


def test_qos_label_wins_and_defaults_follow_kubernetes_qos() -> None:
    assert k.qos_class(with_labels({k.QOS_LABEL: "BE"}, "guaranteed")) == "BE"
    assert k.qos_class(with_labels({}, "guaranteed")) == "LSR"
    assert k.qos_class(with_labels({}, "both")) == "LS"
    assert k.qos_class(with_labels({k.QOS_LABEL: "bogus"}, "absent")) == "BE"


@pytest.mark.parametrize(
    ("labels", "priority", "shape", "expected"),
    [
        ({k.PRIORITY_CLASS_LABEL: "koord-mid"}, 9500, "both", "koord-mid"),
        ({}, 9500, "both", "koord-prod"),
        ({}, 7000, "both", "koord-mid"),
        ({}, 5999, "both", "koord-batch"),
        ({}, 3000, "both", "koord-free"),
        ({}, 0, "both", "koord-prod"),
        ({}, 0, "absent", "koord-batch"),
        ({k.QOS_LABEL: "BE"}, None, "both", "koord-batch"),
    ],
)
def test_priority_class_resolution(labels: dict[str, str], priority: int | None, shape: str, expected: str) -> None:
    assert k.priority_class(with_labels(labels, shape, priority)) == expected


def test_validator_rules() -> None:
    assert k.violations(with_labels({}, "both")) == []
    assert k.violations(with_labels({k.QOS_LABEL: "BE"}, priority=5000)) == []
    assert k.violations(with_labels({k.QOS_LABEL: "BE"}, priority=0)) == ["QoS BE cannot run as priority none"]
    assert k.violations(with_labels({k.QOS_LABEL: "BE"}, priority=9000)) == ["QoS BE cannot run as priority koord-prod"]
    assert k.violations(with_labels({k.QOS_LABEL: "LSR"}, "guaranteed", 7000)) == [
        "QoS LSR requires koord-prod, not koord-mid"
    ]
    assert k.violations(with_labels({k.QOS_LABEL: "LSR"}, "guaranteed", 9000)) == []
    fractional = with_labels({k.QOS_LABEL: "LSE"}, "both", 9000)
    fractional["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1500m"
    assert k.violations(fractional) == ["QoS LSE requires whole CPUs; container main requests 1500m"]
    batch = with_labels({k.QOS_LABEL: "LS"}, "absent", 5000)
    batch["spec"]["containers"][0]["resources"] = {"requests": {"kubernetes.io/batch-cpu": "500"}}
    assert k.violations(batch) == ["batch resources require QoS BE, not LS"]


def test_extended_resources_renames_in_integer_millicores_and_copies_missing_requests() -> None:
    renamed = k.extended_resources({"limits": {"cpu": "1500m", "memory": "1Gi", "nvidia.com/gpu": "1"}}, k.BATCH)
    assert renamed == {
        "requests": {"kubernetes.io/batch-cpu": "1500", "kubernetes.io/batch-memory": str(1024**3)},
        "limits": {
            "kubernetes.io/batch-cpu": "1500",
            "kubernetes.io/batch-memory": str(1024**3),
            "nvidia.com/gpu": "1",
        },
    }
    assert k.extended_resources({"requests": {"cpu": "0.25"}}, k.MID) == {"requests": {"kubernetes.io/mid-cpu": "250"}}
    assert k.extended_resources({"requests": {"cpu": "1"}}, k.PROD) == {"requests": {"cpu": "1"}}


def test_usage_thresholds_annotation_overrides_defaults() -> None:
    assert k.usage_thresholds(None, 65, 95) == (65, 95)
    given = {k.USAGE_THRESHOLDS_ANNOTATION: json.dumps({"usageThresholds": {"cpu": 50}})}
    assert k.usage_thresholds(given, 65, 95) == (50, 95)
    assert k.usage_thresholds({k.USAGE_THRESHOLDS_ANNOTATION: '{"cpu": 70, "memory": 80}'}, 65, 95) == (70, 80)
    for bad in ("not json", "[1]", '{"cpu": 500}', '{"cpu": "x"}'):
        assert k.usage_thresholds({k.USAGE_THRESHOLDS_ANNOTATION: bad}, 65, 95) == (65, 95)


def test_thresholds_our_writer_lowered_are_not_the_operators() -> None:
    ours = {"written": {"cpu": 45, "memory": 90}, "operator": {"cpu": 50}}
    annotations = {
        k.USAGE_THRESHOLDS_ANNOTATION: json.dumps({"usageThresholds": {"cpu": 45, "memory": 90}}),
        k.WRITTEN_THRESHOLDS_ANNOTATION: json.dumps(ours),
    }
    # cpu: still our 45, the operator had set 50; memory: still our 90, the operator had set nothing (default 95)
    assert k.operator_thresholds(annotations) == {"cpu": 50.0}
    assert k.usage_thresholds(annotations, 65, 95) == (50, 95)
    # the operator has since changed memory to 80: that value is theirs, cpu is still ours
    changed = {**annotations, k.USAGE_THRESHOLDS_ANNOTATION: json.dumps({"usageThresholds": {"cpu": 45, "memory": 80}})}
    assert k.usage_thresholds(changed, 65, 95) == (50, 80)
    # a damaged record is ignored: the annotation's values count as the operator's
    assert k.usage_thresholds({**annotations, k.WRITTEN_THRESHOLDS_ANNOTATION: "{broken"}, 65, 95) == (45, 90)


@pytest.mark.parametrize(
    ("owner", "first"),
    [
        ("deployment", "web"),
        ("statefulset", "web"),
        ("daemonset", "web"),
        ("job", "web"),
        ("cronjob", "web"),
        ("bare", "web"),
    ],
)
def test_workload_candidates_name_the_controller_first(owner: str, first: str) -> None:
    assert workload_candidates(pod(owner, "web", [container("main", None)]))[0] == first


def test_workload_candidates_fall_back_to_the_direct_owner_and_generate_name() -> None:
    job = pod("cronjob", "nightly", [container("main", None)])
    assert workload_candidates(job) == ["nightly", "nightly-28911520"]
    odd = pod("deployment", "web", [container("main", None)])
    odd["metadata"]["labels"].pop("pod-template-hash")
    assert workload_candidates(odd) == ["web-5d8f7c9b4"]
    assert workload_candidates({"metadata": {"generateName": "x-"}}) == ["x"]
    assert workload_candidates({}) == []
