"""The admission webhook and the scheduler extender inside a real control plane (kube-apiserver,
kube-controller-manager, kube-scheduler, etcd) with our service on 127.0.0.1 over TLS.

- A Deployment's pods, created by the controller-manager in a namespace labelled for it, are stored with our
  requests, proportional limits and our audit annotation; one in an unlabelled namespace is left alone; a VPA naming
  us with updateMode Off leaves its pods alone, one with Initial sizes them, and an HPA on CPU keeps CPU ours to
  leave (the service watches namespaces, VPAs and HPAs on this apiserver); a koord-batch pod gets Koordinator's batch
  resources; with our service stopped, pods are still
  created unchanged (fail open).
- kube-scheduler, with us registered as an extender, binds a new pod to the node whose pods' forecast peak over
  the next hours is lowest, although that node's pods use more CPU on average.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest
from kubernetes import client

from recommender.mutation import APPLIED_ANNOTATION
from recommender.optin import MODE_KEY
from recommender.units import cpu_cores_from_quantity, memory_bytes_from_quantity
from tests.conftest import entry_point
from tests.e2e.conftest import _binaries
from tests.integration.server import serving, tls_files
from tests.support.control_plane import ControlPlane, crd_files

pytestmark = pytest.mark.e2e
DAY, STEP = 86400, 300
HOUR = 3600


#: Keeps every pod but the scheduling test's own off its two nodes.
TEST_TAINT = {"key": "e2e.koord-recommender/scheduler-test", "effect": "NoSchedule"}


def usage_frame(now: int) -> pd.DataFrame:
    """Three days of usage ending at `now`. night-owl is busy 1-5 h after `now`'s time of day and idle otherwise;
    day-sleeper is busy 7-21 h after it: more CPU on average (1.3 vs 0.75 cores), but quiet in the next six hours."""
    times = np.arange(now - 3 * DAY, now, STEP)
    phase = (times - now) % DAY
    rows = []

    def add(namespace: str, workload: str, container: str, pods: int, cpu: np.ndarray, memory: float) -> None:
        for p in range(pods):
            rows.append(
                pd.DataFrame(
                    {
                        "timestamp": times,
                        "namespace": namespace,
                        "workload": workload,
                        "pod": f"{workload}-{p}",
                        "container": container,
                        "cpu_cores": cpu,
                        "memory_bytes": memory,
                        "cpu_limit_cores": 4.0,
                        "memory_limit_bytes": 4 * 2**30,
                    }
                )
            )

    add("shop", "web", "app", 2, 0.4 + 0.1 * np.sin(2 * np.pi * phase / DAY), 600 * 2**20)
    add("shop", "night-owl", "main", 2, np.where((phase >= 1 * HOUR) & (phase < 5 * HOUR), 3.0, 0.3), 300 * 2**20)
    add("shop", "day-sleeper", "main", 2, np.where((phase >= 7 * HOUR) & (phase < 21 * HOUR), 2.0, 0.3), 300 * 2**20)
    add("batch", "crunch", "worker", 1, np.full(times.size, 1.2), 800 * 2**20)
    # The opt-in: the same workload in a namespace nobody labelled, and two that VPAs name.
    add("plain", "web", "app", 2, np.full(times.size, 0.4), 600 * 2**20)
    for workload in ("frozen", "sized", "scaled"):
        add("vpa", workload, "app", 2, np.full(times.size, 0.4), 600 * 2**20)
    return pd.concat(rows, ignore_index=True)


@dataclass
class Cluster:
    plane: ControlPlane
    core: client.CoreV1Api
    apps: client.AppsV1Api
    pods_file: Path
    nodes_file: Path
    stop_service: Callable[[], None]
    service: str
    verify: ssl.SSLContext


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binaries = _binaries()
    work = tmp_path_factory.mktemp("webhook")
    now = int(time.time()) // STEP * STEP
    usage_frame(now).to_csv(work / "usage.csv", index=False)
    trained = subprocess.run(
        [entry_point(), "train", "--input", str(work / "usage.csv"), "--store", str(work / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert trained.returncode == 0, trained.stderr
    _, cert, key, ca_file = tls_files(work)
    pods_file, nodes_file = work / "pods.json", work / "nodes.json"
    for path in (pods_file, nodes_file):
        path.write_text('{"items": []}')
    env = {
        "KOORD_RECOMMENDER_EXTENDER__PODS_FILE": str(pods_file),
        "KOORD_RECOMMENDER_EXTENDER__NODES_FILE": str(nodes_file),
        "KOORD_RECOMMENDER_WEBHOOK__COLOCATION_PROFILES": json.dumps(
            [{"name": "batch", "namespaces": ["batch"], "qos_class": "BE", "priority_class_name": "koord-batch"}]
        ),
    }
    verify = ssl.create_default_context(cafile=str(ca_file))
    plane = ControlPlane(binaries, work / "plane")
    # The webhook learns namespace labels, VPAs and HPAs from this apiserver (it retries until the plane is up).
    env |= {
        "KOORD_RECOMMENDER_WEBHOOK__KUBECONFIG": str(plane.kubeconfig),
        "KOORD_RECOMMENDER_WEBHOOK__BACKOFF_MAX_SECONDS": "2",
    }
    service_stack = ExitStack()
    service = service_stack.enter_context(serving(work / "store", work, tls=(cert, key), verify=verify, env=env))
    ca_data = base64.b64encode(ca_file.read_bytes()).decode()
    try:
        plane.start(
            controller_manager=True,
            scheduler_config={
                "extenders": [
                    {
                        "urlPrefix": f"{service}/scheduler",
                        "filterVerb": "filter",
                        "prioritizeVerb": "prioritize",
                        "weight": 100,
                        "enableHTTPS": True,
                        "tlsConfig": {"caData": ca_data},
                        "nodeCacheCapable": False,
                        "ignorable": False,
                        "httpTimeout": "5s",
                    }
                ]
            },
        )
        api = plane.api()
        client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(
            {
                "metadata": {"name": "koord-recommender"},
                "webhooks": [
                    {
                        "name": "pods.koord-recommender.io",
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Ignore",
                        "timeoutSeconds": 3,
                        "clientConfig": {"url": f"{service}/mutate", "caBundle": ca_data},
                        "rules": [
                            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                        ],
                        "namespaceSelector": {
                            "matchExpressions": [
                                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}
                            ]
                        },
                    }
                ],
            }
        )
        core = client.CoreV1Api(api)
        for namespace in ("shop", "batch"):
            core.create_namespace({"metadata": {"name": namespace, "labels": {MODE_KEY: "Initial"}}})
        for namespace in ("plain", "vpa"):
            core.create_namespace({"metadata": {"name": namespace}})
        plane.install_crds(crd_files())
        custom = client.CustomObjectsApi(api)
        for workload, mode in (("frozen", "Off"), ("sized", "Initial"), ("scaled", "Initial")):
            custom.create_namespaced_custom_object(
                "autoscaling.k8s.io",
                "v1",
                "vpa",
                "verticalpodautoscalers",
                {
                    "apiVersion": "autoscaling.k8s.io/v1",
                    "kind": "VerticalPodAutoscaler",
                    "metadata": {"name": workload},
                    "spec": {
                        "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload},
                        "recommenders": [{"name": "koord-recommender"}],
                        "updatePolicy": {"updateMode": mode},
                    },
                },
            )
        client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler(
            "vpa",
            {
                "metadata": {"name": "scaled"},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "scaled"},
                    "minReplicas": 2,
                    "maxReplicas": 4,
                    "metrics": [
                        {
                            "type": "Resource",
                            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
                        }
                    ],
                },
            },
        )
        client.SchedulingV1Api(api).create_priority_class({"metadata": {"name": "koord-batch"}, "value": 5000})
        time.sleep(2)  # the webhook configuration reaches the apiserver's informer
        wait_for_watches(service, verify)
        yield Cluster(plane, core, client.AppsV1Api(api), pods_file, nodes_file, service_stack.close, service, verify)
    finally:
        plane.stop()
        service_stack.close()


def wait_for_watches(service: str, verify: ssl.SSLContext, timeout: float = 60) -> None:
    """Until the service's caches hold the VPAs and the HPA just made (bounded)."""
    deadline = time.monotonic() + timeout
    expected = {"verticalpodautoscalers": 3.0, "horizontalpodautoscalers": 1.0}
    held: dict[str, float] = {}
    while time.monotonic() < deadline:
        text = httpx.get(f"{service}/metrics", verify=verify, timeout=5).text
        held = {
            line.split('"')[1]: float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("koord_recommender_watch_objects{")
        }
        if all(held.get(kind) == count for kind, count in expected.items()) and held.get("namespaces", 0) >= 4:
            return
        time.sleep(0.5)
    raise AssertionError(f"the webhook's watches hold {held} after {timeout} s")


def deployment(name: str, container: str, namespace: str = "shop", replicas: int = 2) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": container,
                            "image": "registry.example/app:1",
                            "resources": {
                                "requests": {"cpu": "1", "memory": "1Gi"},
                                "limits": {"cpu": "2", "memory": "2Gi"},
                            },
                        }
                    ]
                },
            },
        },
    }


def pods_of(cluster: Cluster, namespace: str, app: str, count: int, timeout: float = 90) -> list[Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = cluster.core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        if len(pods) >= count:
            return list(pods)
        time.sleep(0.5)
    raise AssertionError(f"the controller-manager made no {count} pods of {namespace}/{app} in {timeout} s")


def recommended(cluster: Cluster, namespace: str, workload: str) -> dict[str, Any]:
    shown = subprocess.run(
        [entry_point(), "show", "--store", str(cluster.pods_file.parent / "store"), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return next(
        r
        for r in json.loads(shown.stdout)["recommendations"]
        if (r["namespace"], r["workload"]) == (namespace, workload)
    )


def test_deployment_pods_are_stored_with_our_requests(cluster: Cluster) -> None:
    cluster.apps.create_namespaced_deployment("shop", deployment("web", "app"))
    rec = recommended(cluster, "shop", "web")
    for pod in pods_of(cluster, "shop", "web", 2):
        resources = pod.spec.containers[0].resources
        cpu, memory = (
            cpu_cores_from_quantity(resources.requests["cpu"]),
            memory_bytes_from_quantity(resources.requests["memory"]),
        )
        assert cpu == pytest.approx(rec["cpu"]["target"], abs=0.001)
        assert memory == pytest.approx(rec["memory"]["target"], rel=0.01)
        # Limits keep the original limit/request ratio (2x), as VPA does.
        assert cpu_cores_from_quantity(resources.limits["cpu"]) == pytest.approx(2 * cpu, abs=0.002)
        assert memory_bytes_from_quantity(resources.limits["memory"]) == pytest.approx(2 * memory, rel=0.01)
        record = json.loads(pod.metadata.annotations[APPLIED_ANNOTATION])
        assert record["mode"] == "Initial" and record["source"] == f"namespace label {MODE_KEY}=Initial"


def test_a_pod_in_a_namespace_nobody_opted_in_is_left_alone(cluster: Cluster) -> None:
    cluster.apps.create_namespaced_deployment("plain", deployment("web", "app", namespace="plain", replicas=1))
    pod = pods_of(cluster, "plain", "web", 1)[0]
    assert pod.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert APPLIED_ANNOTATION not in (pod.metadata.annotations or {})


def test_a_vpa_naming_us_decides_by_its_update_mode_and_an_hpa_keeps_its_resource(cluster: Cluster) -> None:
    for workload in ("frozen", "sized", "scaled"):
        cluster.apps.create_namespaced_deployment("vpa", deployment(workload, "app", namespace="vpa", replicas=1))
    frozen = pods_of(cluster, "vpa", "frozen", 1)[0]
    assert frozen.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
    assert APPLIED_ANNOTATION not in (frozen.metadata.annotations or {})
    rec = recommended(cluster, "vpa", "sized")
    sized = pods_of(cluster, "vpa", "sized", 1)[0]
    assert cpu_cores_from_quantity(sized.spec.containers[0].resources.requests["cpu"]) == pytest.approx(
        rec["cpu"]["target"], abs=0.001
    )
    assert (
        json.loads(sized.metadata.annotations[APPLIED_ANNOTATION])["source"]
        == "VerticalPodAutoscaler vpa/sized (updateMode Initial)"
    )
    # The HPA scales `scaled` on CPU: only memory is ours to set.
    scaled = pods_of(cluster, "vpa", "scaled", 1)[0]
    requests = scaled.spec.containers[0].resources.requests
    assert requests["cpu"] == "1" and memory_bytes_from_quantity(requests["memory"]) < 2**30


def test_a_batch_pod_gets_koordinator_batch_resources(cluster: Cluster) -> None:
    cluster.apps.create_namespaced_deployment("batch", deployment("crunch", "worker", namespace="batch", replicas=1))
    pod = pods_of(cluster, "batch", "crunch", 1)[0]
    assert pod.metadata.labels["koordinator.sh/qosClass"] == "BE"
    assert pod.spec.priority_class_name == "koord-batch" and pod.spec.priority == 5000
    requests = pod.spec.containers[0].resources.requests
    assert "kubernetes.io/batch-cpu" in requests and "cpu" not in requests
    assert int(requests["kubernetes.io/batch-cpu"]) > 0  # integer milli-cores


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}


def test_the_scheduler_binds_where_the_forecast_peak_is_lowest(cluster: Cluster) -> None:
    # The webhook test's pods are still pending (there were no nodes): remove them, or the scheduler would place
    # them on the quieter node first and even the two nodes out before our pod comes.
    cluster.apps.delete_namespaced_deployment("web", "shop", propagation_policy="Foreground")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and cluster.core.list_namespaced_pod("shop", label_selector="app=web").items:
        time.sleep(0.5)
    assert not cluster.core.list_namespaced_pod("shop", label_selector="app=web").items
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "e2e",
        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # 12 cores: night-owl's peak keeps node-a under the 65 % filter threshold, so the scores decide.
    capacity = {"cpu": "12", "memory": "64Gi", "pods": "110"}
    for name in ("node-a", "node-b"):
        cluster.core.create_node(node(name))
        cluster.core.patch_node_status(
            name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": [ready]}}
        )
        # The apiserver taints new nodes not-ready; without kubelets (and the node lifecycle controller) we lift it.
        # Our own taint instead: pods other tests left pending (no nodes then) would land on these nodes in any
        # order and tie the scores (node-b at 7 beside node-a's 7); only the newcomer tolerates it.
        cluster.core.patch_node(name, {"spec": {"taints": [TEST_TAINT]}})
    # Bare pods named after their workload (generateName), placed by hand: no owner for the garbage collector to
    # miss, and the same workload resolution the webhook and the extender use for any pod.
    for workload, host in (("night-owl", "node-a"), ("day-sleeper", "node-b")):
        for _ in range(2):
            cluster.core.create_namespaced_pod(
                "shop",
                {
                    "metadata": {"generateName": f"{workload}-", "labels": {"role": "existing"}},
                    "spec": {
                        "nodeName": host,
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.example/app:1",
                                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                            }
                        ],
                    },
                },
            )
    # The serving Deployment's sidecar keeps these files fresh; one pass of the same command here.
    written = subprocess.run(
        [
            entry_point(),
            "cluster-files",
            "--once",
            "--kubeconfig",
            str(cluster.plane.kubeconfig),
            "--pods-file",
            str(cluster.pods_file),
            "--nodes-file",
            str(cluster.nodes_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert written.returncode == 0, written.stderr
    assert "2 nodes" in written.stderr
    # The new pod belongs to a workload we know (a pod we know nothing of gets a neutral answer everywhere).
    newcomer = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "newcomer", "namespace": "shop", "generateName": "web-", "labels": {"role": "new"}},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.example/app:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                }
            ],
            "tolerations": [{"key": TEST_TAINT["key"], "operator": "Exists", "effect": TEST_TAINT["effect"]}],
        },
    }
    # The service re-reads those files on its next poll (5 s): ask it directly until it has (bounded).
    by_node: dict[str, int] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        scores = httpx.post(
            f"{cluster.service}/scheduler/prioritize",
            json={"Pod": newcomer, "NodeNames": ["node-a", "node-b"]},
            verify=cluster.verify,
            timeout=10,
        ).json()
        by_node = {entry["Host"]: entry["Score"] for entry in scores}
        if by_node["node-a"] != by_node["node-b"]:
            break
        time.sleep(0.5)
    assert by_node["node-b"] > by_node["node-a"], by_node
    cluster.core.create_namespaced_pod("shop", newcomer)
    deadline = time.monotonic() + 60
    bound = None
    while time.monotonic() < deadline and not bound:
        bound = cluster.core.read_namespaced_pod("newcomer", "shop").spec.node_name
        time.sleep(0.5)
    if bound is None:
        conditions = cluster.core.read_namespaced_pod("newcomer", "shop").status.conditions
        pytest.fail(f"not scheduled in 60 s: {conditions}")
    assert bound == "node-b", f"bound to {bound}: node-a's pods peak in the next hours, node-b's do not"


def test_pods_are_created_unchanged_when_the_service_is_down(cluster: Cluster) -> None:
    cluster.stop_service()
    cluster.apps.create_namespaced_deployment("shop", deployment("web-2", "app"))
    for pod in pods_of(cluster, "shop", "web-2", 2):
        assert pod.spec.containers[0].resources.requests == {"cpu": "1", "memory": "1Gi"}
        assert APPLIED_ANNOTATION not in (pod.metadata.annotations or {})
