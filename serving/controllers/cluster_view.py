"""`recommender cluster-files`: keep the extender's view of the cluster (pods and nodes, as `kubectl get -o json`
prints them) fresh on disk, atomically, for the `serve` process beside it to re-read.

A separate loop rather than watches inside the server: the server's request path never waits on the API server,
and the same files let the extender be run and tested without a cluster.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from recommender.atomic import atomic_write_bytes
from recommender.errors import KubernetesError

log = logging.getLogger(__name__)
#: Pods that have finished hold no resources.
RUNNING_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def write_cluster_files(api: client.ApiClient, pods_file: Path, nodes_file: Path) -> tuple[int, int]:
    """List pods (not finished) and nodes once and replace both files; returns (pods, nodes)."""
    core = client.CoreV1Api(api)
    try:
        pods = core.list_pod_for_all_namespaces(field_selector=RUNNING_PODS)
        nodes = core.list_node()
    except ApiException as error:
        raise KubernetesError(f"listing pods and nodes: HTTP {error.status}: {error.reason}") from None
    atomic_write_bytes(pods_file, orjson.dumps(api.sanitize_for_serialization(pods)))
    atomic_write_bytes(nodes_file, orjson.dumps(api.sanitize_for_serialization(nodes)))
    return len(pods.items), len(nodes.items)


def run(api: client.ApiClient, pods_file: Path, nodes_file: Path, interval_seconds: float, stop: threading.Event) -> None:
    """Refresh every `interval_seconds` until `stop`; an API error keeps the last files and is retried next time."""
    while not stop.is_set():
        try:
            counted = write_cluster_files(api, pods_file, nodes_file)
            log.info("wrote %d pods and %d nodes", *counted)
        except (KubernetesError, OSError) as error:
            log.warning("cluster files not refreshed: %s", error)
        stop.wait(interval_seconds)
