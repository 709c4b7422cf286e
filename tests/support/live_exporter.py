"""A test exporter on 127.0.0.1: the cAdvisor and kube-state-metrics series of a few containers, whose usage a test
changes while a real Prometheus scrapes it (the live loop's tests)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pandas as pd

from tests.support.openmetrics import COUNTER_START, _labels, owner_series


@dataclass
class Container:
    """One Deployment pod's container: its CPU rate (cores) and working set (bytes) from now on, its CPU counter
    integrated over time, and its restarts (an OOM kill is one, with the reason kube-state-metrics gives)."""

    namespace: str
    workload: str
    pod: str
    container: str
    cpu_cores: float
    memory_bytes: float
    memory_limit_bytes: float
    cpu_request_cores: float = 0.25
    node: str = "node-0"
    memory_request_bytes: float = 256 * 2**20
    counter: float = COUNTER_START
    since: float = field(default_factory=time.time)
    restarts: int = 0
    oom_killed: bool = False

    def cpu_counter(self, now: float) -> float:
        return self.counter + self.cpu_cores * (now - self.since)


class LiveExporter:
    """Serves /metrics for its containers on a free loopback port; `set` and `oom_kill` change them at once."""

    def __init__(self, containers: list[Container]) -> None:
        self.containers = {c.container: c for c in containers}
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.target = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="live-exporter", daemon=True)

    def start(self) -> LiveExporter:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def set(self, container: str, cpu_cores: float | None = None, memory_bytes: float | None = None) -> float:
        """Change a container's usage from now on; returns when (Unix seconds)."""
        with self._lock:
            found = self.containers[container]
            now = time.time()
            found.counter, found.since = found.cpu_counter(now), now
            if cpu_cores is not None:
                found.cpu_cores = cpu_cores
            if memory_bytes is not None:
                found.memory_bytes = memory_bytes
            return now

    def oom_kill(self, container: str) -> float:
        """The container is OOM-killed and restarted now: its restarts count grows, its last reason is OOMKilled."""
        with self._lock:
            found = self.containers[container]
            found.restarts += 1
            found.oom_killed = True
            return time.time()

    def text(self) -> str:
        with self._lock:
            now = time.time()
            lines: list[str] = []
            for c in self.containers.values():
                own = {"namespace": c.namespace, "pod": c.pod, "container": c.container}
                pod_owner, parents = owner_series(c.namespace, c.workload, "Deployment", c.pod)
                lines += [
                    f"container_cpu_usage_seconds_total{_labels({**own, 'image': 'app:1'})} {c.cpu_counter(now):.6f}",
                    f"container_memory_working_set_bytes{_labels({**own, 'image': 'app:1'})} {c.memory_bytes:.0f}",
                    f"kube_pod_owner{_labels(pod_owner)} 1",
                    *(f"{name}{_labels(labels)} 1" for name, labels in parents),
                    f"kube_pod_info{_labels({'namespace': c.namespace, 'pod': c.pod, 'node': c.node})} 1",
                    f"kube_pod_container_status_restarts_total{_labels(own)} {c.restarts}",
                    f"kube_pod_container_status_last_terminated_reason{_labels({**own, 'reason': 'OOMKilled'})} "
                    f"{int(c.oom_killed)}",
                ]
                for kind, cpu, memory in (
                    ("requests", c.cpu_request_cores, c.memory_request_bytes),
                    ("limits", c.cpu_request_cores * 4, c.memory_limit_bytes),
                ):
                    for resource, unit, value in (("cpu", "core", cpu), ("memory", "byte", memory)):
                        labels = _labels({**own, "resource": resource, "unit": unit})
                        lines.append(f"kube_pod_container_resource_{kind}{labels} {value:.6f}")
            return "\n".join(lines) + "\n"


def write_history(containers: list[Container], path: Path, end: int, days: int = 3, seed: int = 0) -> None:
    """`days` of 5-minute usage of the exporter's containers before `end` (their current level with a daily swing
    and noise) on their nodes, as a usage CSV: what the daily training learned before the live loop takes over."""
    rng = np.random.default_rng(seed)
    times = np.arange(end - days * 86400, end, 300)
    swing = 1 + 0.2 * np.sin(2 * np.pi * (times % 86400) / 86400)
    frames = [
        pd.DataFrame(
            {
                "timestamp": times,
                "namespace": c.namespace,
                "workload": c.workload,
                "pod": c.pod,
                "container": c.container,
                "node": c.node,
                "cpu_cores": c.cpu_cores * swing * (1 + 0.05 * rng.standard_normal(times.size)),
                "memory_bytes": c.memory_bytes * (1 + 0.02 * rng.standard_normal(times.size)),
                "cpu_request_cores": c.cpu_request_cores,
                "memory_request_bytes": c.memory_request_bytes,
                "memory_limit_bytes": c.memory_limit_bytes,
            }
        )
        for c in containers
    ]
    pd.concat(frames, ignore_index=True).to_csv(path, index=False)


def live_environment(prometheus_url: str, store: Path) -> dict[str, str]:
    """The settings of a live loop over the exporter as environment variables: 2-second steps (scrapes every
    second), a loop every 2 s, a checkpoint every 4 s, no Lease (the e2e test adds one)."""
    return {
        "KOORD_RECOMMENDER_STORE__PATH": str(store),
        "KOORD_RECOMMENDER_PROMETHEUS__URL": prometheus_url,
        "KOORD_RECOMMENDER_PROMETHEUS__STEP_SECONDS": "2",
        "KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS": "4",
        "KOORD_RECOMMENDER_PROMETHEUS__MEMORY_WINDOW_SECONDS": "2",
        "KOORD_RECOMMENDER_PROMETHEUS__RETRIES": "1",
        "KOORD_RECOMMENDER_PROMETHEUS__BACKOFF_INITIAL_SECONDS": "0.05",
        "KOORD_RECOMMENDER_PROMETHEUS__TIMEOUT_SECONDS": "5",
        "KOORD_RECOMMENDER_LIVE__INTERVAL_SECONDS": "2",
        "KOORD_RECOMMENDER_LIVE__READ_LAG_SECONDS": "2",
        "KOORD_RECOMMENDER_LIVE__CHECKPOINT_INTERVAL_SECONDS": "4",
        "KOORD_RECOMMENDER_LIVE__LEADER_ELECTION": "false",
        "KOORD_RECOMMENDER_LIVE__METRICS_HOST": "127.0.0.1",
        "KOORD_RECOMMENDER_LIVE__METRICS_PORT": "0",
    }


def wait_for_scrapes(prometheus_url: str, timeout: float = 30) -> None:
    """Until Prometheus holds the exporter's first samples (its first scrape comes a few seconds after start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": "container_memory_working_set_bytes"})
            if answer.json()["data"]["result"]:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError("Prometheus did not scrape the exporter in time")
