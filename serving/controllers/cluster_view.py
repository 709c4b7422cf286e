"""`recommender cluster-files`: keep the extender's view of the cluster (pods and nodes, as `kubectl get -o json`
prints them) fresh on disk, atomically, for the `serve` process beside it to re-read.

It lists pods (not finished) and nodes once, then watches both from the lists' resourceVersion (`serving.kube_watch`:
410 Gone and the resync period re-list, failures back off), and rewrites both files when something changed, at most
once per interval, so a new pod or node reaches the extender within seconds without the API server being asked for
every pod every few seconds. A separate process rather than watches inside the server: the server's request path
never waits on the API server, and the same files let the extender be run and tested without a cluster.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from recommender.atomic import atomic_write_bytes
from recommender.errors import KubernetesError
from serving.kube import api_message
from serving.kube_watch import Informer, Informers

log = logging.getLogger(__name__)
#: Pods that have finished hold no resources (the watch reports a pod that finishes as deleted).
RUNNING_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def _listing(kind: str, items: list[dict[str, Any]]) -> bytes:
    return orjson.dumps({"apiVersion": "v1", "kind": kind, "items": items})


class ClusterFiles:
    """The pods and nodes informers and the loop that writes their objects to the two files."""

    def __init__(
        self,
        api: client.ApiClient,
        pods_file: Path,
        nodes_file: Path,
        *,
        interval_seconds: float,
        resync_seconds: float,
        backoff_max_seconds: float,
    ) -> None:
        core = client.CoreV1Api(api)
        self.pods_file, self.nodes_file = pods_file, nodes_file
        self.interval_seconds = interval_seconds
        self.changed = threading.Event()
        self.pods = Informer(
            "pods",
            core.list_pod_for_all_namespaces,
            field_selector=RUNNING_PODS,
            resync_seconds=resync_seconds,
            backoff_max_seconds=backoff_max_seconds,
            on_change=self.changed.set,
        )
        self.nodes = Informer(
            "nodes",
            core.list_node,
            resync_seconds=resync_seconds,
            backoff_max_seconds=backoff_max_seconds,
            on_change=self.changed.set,
        )
        self.writes = 0

    def write(self) -> tuple[int, int]:
        """Replace both files with what the informers hold; returns (pods, nodes)."""
        pods, nodes = self.pods.values(), self.nodes.values()
        atomic_write_bytes(self.pods_file, _listing("PodList", pods))
        atomic_write_bytes(self.nodes_file, _listing("NodeList", nodes))
        self.writes += 1
        return len(pods), len(nodes)

    def once(self) -> tuple[int, int]:
        """List both kinds once and write the files (`--once`)."""
        try:
            self.pods.list_once()
            self.nodes.list_once()
        except ApiException as error:
            raise KubernetesError(f"listing pods and nodes: HTTP {error.status}: {api_message(error)}") from None
        return self.write()

    def run(self, stop: threading.Event) -> None:
        """Watch until `stop`; after a change, rewrite the files once both kinds have listed, then wait the interval
        (changes meanwhile are written together)."""
        informers = Informers([self.pods, self.nodes])
        informers.start()
        try:
            while not stop.is_set():
                if not self.changed.wait(timeout=1.0) or informers.problem() is not None:
                    continue
                self.changed.clear()
                try:
                    log.info("wrote %d pods and %d nodes", *self.write())
                except OSError as error:
                    self.changed.set()  # keep what is on disk; try again after the interval
                    log.warning("cluster files not written: %s", error)
                stop.wait(self.interval_seconds)
        finally:
            informers.stop()
