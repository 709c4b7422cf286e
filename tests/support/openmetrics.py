"""Tidy usage -> OpenMetrics text with the cAdvisor and kube-state-metrics series a cluster would expose.

Each tidy sample (the average over the 5 minutes before its timestamp) becomes one scrape `scrape_offset` seconds
before that timestamp: the CPU counter advanced by cpu_cores x the interval, and the working set. Owner chains follow
each workload's kind (Deployment -> ReplicaSet -> Pod, CronJob -> Job -> Pod, ...). Pause (`POD`) and pod-level
(`container=""`) cAdvisor series are added with absurd values, so a reader that fails to skip them shows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")
#: Counters start high, as on a node that has been up a while (rate() extrapolation clamps near zero).
COUNTER_START = 1e6
META_EVERY_SECONDS = 1800


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs.items()) + "}"


@dataclass(frozen=True)
class OOMKill:
    namespace: str
    pod: str
    container: str
    timestamp: int


def owner_series(
    namespace: str, workload: str, kind: str, pod: str
) -> tuple[dict[str, str], list[tuple[str, dict[str, str]]]]:
    """kube_pod_owner labels of a pod, and the (metric, labels) of its owner's own owner series."""
    base = {"namespace": namespace, "pod": pod, "uid": f"uid-{abs(hash((namespace, pod))) % 10**8}"}
    if kind == "Deployment":
        replicaset = f"{workload}-5d4f8b9c7"
        return (
            {**base, "owner_kind": "ReplicaSet", "owner_name": replicaset, "owner_is_controller": "true"},
            [
                (
                    "kube_replicaset_owner",
                    {
                        "namespace": namespace,
                        "replicaset": replicaset,
                        "owner_kind": "Deployment",
                        "owner_name": workload,
                        "owner_is_controller": "true",
                    },
                )
            ],
        )
    if kind == "CronJob":
        job = f"{workload}-28012345"
        return (
            {**base, "owner_kind": "Job", "owner_name": job, "owner_is_controller": "true"},
            [
                (
                    "kube_job_owner",
                    {
                        "namespace": namespace,
                        "job_name": job,
                        "owner_kind": "CronJob",
                        "owner_name": workload,
                        "owner_is_controller": "true",
                    },
                )
            ],
        )
    if kind == "Job":
        return (
            {**base, "owner_kind": "Job", "owner_name": workload, "owner_is_controller": "true"},
            [
                (
                    "kube_job_owner",
                    {
                        "namespace": namespace,
                        "job_name": workload,
                        "owner_kind": "<none>",
                        "owner_name": "<none>",
                        "owner_is_controller": "<none>",
                    },
                )
            ],
        )
    if kind == "Pod":
        return ({**base, "owner_kind": "<none>", "owner_name": "<none>", "owner_is_controller": "<none>"}, [])
    return ({**base, "owner_kind": kind, "owner_name": workload, "owner_is_controller": "true"}, [])


def write_openmetrics(
    usage: pd.DataFrame,
    kinds: dict[tuple[str, str], str],
    path: Path,
    *,
    scrape_offset: int = 30,
    oom_kills: Iterable[OOMKill] = (),
    decoys: bool = True,
) -> int:
    """Write the OpenMetrics file; returns the number of samples. `kinds` maps (namespace, workload) -> kind."""
    usage = usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"])
    groups = [
        ((str(ns), str(workload), str(pod), str(container)), rows)
        for (ns, workload, pod, container), rows in usage.groupby(
            ["namespace", "workload", "pod", "container"], sort=False
        )
    ]
    kills = list(oom_kills)
    count = 0
    with open(path, "w", encoding="utf-8") as out:

        def family(name: str, kind: str, lines: Iterator[str]) -> None:
            nonlocal count
            out.write(f"# TYPE {name} {kind}\n")
            for line in lines:
                out.write(line)
                count += 1

        def cpu_lines() -> Iterator[str]:
            for (ns, _, pod, container), rows in groups:
                labels = _labels({"namespace": ns, "pod": pod, "container": container, "image": "registry/app:1"})
                times = rows["timestamp"].to_numpy()
                cpu = rows["cpu_cores"].fillna(0.0).to_numpy()
                steps = np.diff(times, prepend=times[0] - 300)
                counter = COUNTER_START + np.cumsum(cpu * steps)
                for t, c in zip(times, counter):
                    yield f"container_cpu_usage_seconds_total{labels} {c:.6f} {t - scrape_offset}\n"
                if decoys and container == groups[0][0][3]:
                    for extra in ("POD", ""):
                        decoy = _labels({"namespace": ns, "pod": pod, "container": extra})
                        for i, t in enumerate(times):
                            yield f"container_cpu_usage_seconds_total{decoy} {COUNTER_START + 500.0 * i * 300:.1f} {t - scrape_offset}\n"

        def memory_lines() -> Iterator[str]:
            for (ns, _, pod, container), rows in groups:
                labels = _labels({"namespace": ns, "pod": pod, "container": container, "image": "registry/app:1"})
                for t, m in zip(rows["timestamp"].to_numpy(), rows["memory_bytes"].to_numpy()):
                    if not np.isnan(m):
                        yield f"container_memory_working_set_bytes{labels} {m:.0f} {t - scrape_offset}\n"
                if decoys:
                    for extra in ("POD", ""):
                        decoy = _labels({"namespace": ns, "pod": pod, "container": extra})
                        for t in rows["timestamp"].to_numpy():
                            yield f"container_memory_working_set_bytes{decoy} 9e11 {t - scrape_offset}\n"
                    # The same container seen through a second cgroup (as after a restart), lower: merged by max.
                    twin = _labels({"namespace": ns, "pod": pod, "container": container, "id": "/restarted"})
                    for t, m in zip(rows["timestamp"].to_numpy(), rows["memory_bytes"].to_numpy()):
                        if not np.isnan(m):
                            yield f"container_memory_working_set_bytes{twin} {m / 2:.0f} {t - scrape_offset}\n"

        def throttle_lines(metric: str) -> Iterator[str]:
            # 100 ms CFS periods; containers with a CPU limit are throttled in proportion to their usage/limit.
            for (ns, _, pod, container), rows in groups:
                if "cpu_limit_cores" not in rows or rows["cpu_limit_cores"].isna().all():
                    continue
                labels = _labels({"namespace": ns, "pod": pod, "container": container})
                times = rows["timestamp"].to_numpy()
                ratio = np.clip(
                    rows["cpu_cores"].fillna(0.0).to_numpy() / rows["cpu_limit_cores"].to_numpy() - 0.5, 0, 1
                )
                periods = np.cumsum(np.full(times.size, 3000.0))
                values = periods if metric == "periods" else np.cumsum(3000.0 * ratio)
                for t, v in zip(times, values):
                    yield f"container_cpu_cfs_{'periods' if metric == 'periods' else 'throttled_periods'}_total{labels} {v:.1f} {t - scrape_offset}\n"

        pods = (
            usage.groupby(["namespace", "workload", "pod"], sort=False)["timestamp"].agg(["min", "max"]).reset_index()
        )

        def meta_times(first: int, last: int) -> np.ndarray:
            return np.unique(np.append(np.arange(first, last, META_EVERY_SECONDS), last)) - scrape_offset

        def owner_lines(metric: str) -> Iterator[str]:
            seen: set[str] = set()
            for ns, workload, pod, first, last in pods.itertuples(index=False):
                own, parents = owner_series(ns, workload, kinds[(ns, workload)], pod)
                candidates = [("kube_pod_owner", own)] + parents
                for name, labels in candidates:
                    text = _labels(labels)
                    if name != metric or (name != "kube_pod_owner" and text in seen):
                        continue
                    seen.add(text)
                    for t in meta_times(first, last):
                        yield f"{metric}{text} 1 {t}\n"

        # A pod's node and PriorityClass: the usage's own columns where it has them, else spread over three nodes.
        placed = {
            column: usage.groupby(["namespace", "pod"])[column].first().to_dict()
            for column in ("node", "priority_class")
            if column in usage
        }

        def info_lines() -> Iterator[str]:
            for i, (ns, _, pod, first, last) in enumerate(pods.itertuples(index=False)):
                info = {
                    "namespace": ns,
                    "pod": pod,
                    "node": placed.get("node", {}).get((ns, pod), f"node-{i % 3}"),
                    "host_ip": "10.0.0.1",
                }
                if (ns, pod) in placed.get("priority_class", {}):
                    info["priority_class"] = placed["priority_class"][(ns, pod)]
                labels = _labels(info)
                for t in meta_times(first, last):
                    yield f"kube_pod_info{labels} 1 {t}\n"

        def resource_lines(column_cpu: str, column_memory: str) -> Iterator[str]:
            for (ns, _, pod, container), rows in groups:
                for resource, unit, column in (("cpu", "core", column_cpu), ("memory", "byte", column_memory)):
                    if column not in rows or rows[column].isna().all():
                        continue
                    labels = _labels(
                        {
                            "namespace": ns,
                            "pod": pod,
                            "container": container,
                            "node": "node-0",
                            "resource": resource,
                            "unit": unit,
                        }
                    )
                    times, values = rows["timestamp"].to_numpy(), rows[column].to_numpy()
                    for t in meta_times(int(times[0]), int(times[-1])):
                        value = values[min(np.searchsorted(times, t + scrape_offset), len(values) - 1)]
                        if not np.isnan(value):
                            yield f"kube_pod_container_resource_{'limits' if 'limit' in column else 'requests'}{labels} {value:.6f} {t}\n"

        def oom_lines(metric: str) -> Iterator[str]:
            for kill in kills:
                rows = usage[
                    (usage["namespace"] == kill.namespace)
                    & (usage["pod"] == kill.pod)
                    & (usage["container"] == kill.container)
                ]
                labels = {"namespace": kill.namespace, "pod": kill.pod, "container": kill.container}
                for t in rows["timestamp"].to_numpy() - scrape_offset:
                    if metric == "restarts":
                        yield f"kube_pod_container_status_restarts_total{_labels(labels)} {int(t >= kill.timestamp)} {t}\n"
                    else:
                        reason = _labels({**labels, "reason": "OOMKilled"})
                        yield f"kube_pod_container_status_last_terminated_reason{reason} {int(t >= kill.timestamp)} {t}\n"

        family("container_cpu_usage_seconds", "counter", cpu_lines())
        family("container_memory_working_set_bytes", "gauge", memory_lines())
        family("container_cpu_cfs_periods", "counter", throttle_lines("periods"))
        family("container_cpu_cfs_throttled_periods", "counter", throttle_lines("throttled"))
        family("kube_pod_owner", "gauge", owner_lines("kube_pod_owner"))
        family("kube_replicaset_owner", "gauge", owner_lines("kube_replicaset_owner"))
        family("kube_job_owner", "gauge", owner_lines("kube_job_owner"))
        family("kube_pod_info", "gauge", info_lines())
        family("kube_pod_container_resource_limits", "gauge", resource_lines("cpu_limit_cores", "memory_limit_bytes"))
        family(
            "kube_pod_container_resource_requests", "gauge", resource_lines("cpu_request_cores", "memory_request_bytes")
        )
        family("kube_pod_container_status_restarts", "counter", oom_lines("restarts"))
        family("kube_pod_container_status_last_terminated_reason", "gauge", oom_lines("reason"))
        out.write("# EOF\n")
    return count
