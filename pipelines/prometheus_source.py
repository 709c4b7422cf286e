"""Usage history from Prometheus, as the same tidy frame the file reader returns.

Reads cAdvisor (CPU counter, working set, CFS throttling) and kube-state-metrics (owners, node, requests, limits,
OOM kills), and resolves each pod to its workload from the owner chain alone, so no cluster access is needed:
ReplicaSet -> Deployment, Job -> CronJob, StatefulSet and DaemonSet as they are, pods without an owner as
themselves. Namespaces are batched into as few queries as the series budget allows; metadata comes from the
series endpoint (index only) or one instant query each. A batch that fails after retries is reported by name.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from pipelines import promql
from pipelines.prometheus import Labels, PrometheusClient, Series
from recommender.errors import PrometheusError
from recommender.settings import PrometheusSettings
from recommender.progress import Step

log = logging.getLogger(__name__)
NO_OWNER = "<none>"


@dataclass
class PrometheusUsage:
    """The tidy usage read from Prometheus, OOM kills, and what could not be read (workload group -> why)."""

    usage: pd.DataFrame
    oom_events: pd.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)
    workload_kinds: dict[tuple[str, str], str] = field(default_factory=dict)


class PrometheusSource:
    """Builds the queries for one read window and turns the answers into tidy rows."""

    def __init__(self, client: PrometheusClient, settings: PrometheusSettings, namespaces: list[str] | None = None) -> None:
        """`namespaces`: read only these (every query, metadata too, is scoped to them: one partition of a
        distributed run); None reads every namespace."""
        self.client = client
        self.s = settings
        self.namespaces = namespaces

    # -- selectors -------------------------------------------------------------------------------------------
    def _base(self, extra: list[promql.Matcher] | None = None) -> list[promql.Matcher]:
        matchers = [promql.eq(k, v) for k, v in sorted(self.s.extra_labels.items())]
        if self.namespaces is not None:
            matchers.append(promql.one_of(self.s.namespace_label, self.namespaces))
        return matchers + (extra or [])

    def _container_matchers(self, namespaces: list[str] | None = None) -> list[promql.Matcher]:
        matchers = self._base([promql.ne(self.s.container_label, c) for c in self.s.ignored_containers])
        if namespaces is not None:
            matchers.append(promql.one_of(self.s.namespace_label, namespaces))
        return matchers

    def _keys(self) -> list[str]:
        return [self.s.namespace_label, self.s.pod_label, self.s.container_label]

    # -- the read ----------------------------------------------------------------------------------------------
    def containers_per_namespace(self, start: int, end: int) -> dict[str, int]:
        """Pod containers with a memory series between `start` and `end`, per namespace (one index-only query)."""
        s = self.s
        inventory = self.client.series([promql.selector(s.memory_metric, self._container_matchers())], start, end)
        per_namespace: dict[str, set[tuple[str, str]]] = defaultdict(set)
        for labels in inventory:
            per_namespace[labels.get(s.namespace_label, "")].add((labels.get(s.pod_label, ""), labels.get(s.container_label, "")))
        if not per_namespace:
            raise PrometheusError(
                f"no {s.memory_metric} series with a container label in {self.client.base_url} between {start} and {end}"
            )
        return {namespace: len(containers) for namespace, containers in per_namespace.items()}

    def read(self, start: int, end: int, step: Step) -> PrometheusUsage:
        """Everything between `start` and `end` (Unix seconds, aligned to the step)."""
        step(f"discovering containers in {self.client.base_url}")
        per_namespace = self.containers_per_namespace(start, end)
        step(f"resolving owners of {sum(per_namespace.values())} containers")
        owners = self._owners(start, end)
        batches = self._batches(per_namespace)
        step(f"reading usage of {len(per_namespace)} namespaces in {len(batches)} batches")
        # CPU, memory and throttling of each batch are separate queries, so `concurrency` can overlap them.
        tasks = [(i, part) for i in range(len(batches)) for part in ("cpu", "memory", "throttling")]
        results = self.client.map_bounded(lambda task: self._read_part(batches[task[0]], task[1], start, end), tasks)
        parts: dict[int, list[pd.DataFrame]] = defaultdict(list)
        skipped: dict[str, str] = {}
        for (index, _), result in zip(tasks, results):
            if isinstance(result, PrometheusError):
                for namespace in batches[index]:
                    skipped.setdefault(f"{namespace}/*", str(result))
            else:
                parts[index].append(result)
        frames = [
            _join_parts(parts[i]) for i in range(len(batches)) if not any(f"{ns}/*" in skipped for ns in batches[i])
        ]
        step("reading requests, limits and OOM kills")
        usage = pd.concat(frames, ignore_index=True) if frames else _empty_usage()
        usage = self._attach_owners(usage, owners)
        usage = self._attach_resources(usage, end)
        oom = self._oom_events(start, end, usage)
        kinds = {(ns, w): k for (ns, w, k) in usage[["namespace", "workload", "workload_kind"]].drop_duplicates().itertuples(index=False)}
        usage = usage.drop(columns=["workload_kind"])
        return PrometheusUsage(usage=usage, oom_events=oom, skipped=skipped, workload_kinds=kinds)

    def _batches(self, counts: dict[str, int]) -> list[list[str]]:
        """Namespaces grouped so each query covers at most `max_series_per_query` containers (a big one alone)."""
        batches: list[list[str]] = []
        current: list[str] = []
        size = 0
        for namespace, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
            if current and size + count > self.s.max_series_per_query:
                batches.append(current)
                current, size = [], 0
            current.append(namespace)
            size += count
        if current:
            batches.append(current)
        return batches

    def _read_part(self, namespaces: list[str], part: str, start: int, end: int) -> pd.DataFrame:
        """One query for a batch of namespaces: the CPU or memory line, or each container's throttled share."""
        s = self.s
        keys = promql.by(self._keys())
        matchers = self._container_matchers(namespaces)
        # No `max by` here: aggregating per step doubles Prometheus' work; the rare duplicate series of one
        # container (a restart's new cgroup, a second scrape job) are merged by max on our side instead.
        if part == "cpu":
            cpu = promql.selector(s.cpu_usage_metric, matchers)
            query = f"rate({cpu}[{promql.duration(s.cpu_rate_window_seconds)}])"
            return self._frame(self.client.query_range(query, start, end, s.step_seconds), "cpu_cores")
        if part == "memory":
            memory = promql.selector(s.memory_metric, matchers)
            query = f"max_over_time({memory}[{promql.duration(s.memory_window_seconds)}])"
            return self._frame(self.client.query_range(query, start, end, s.step_seconds), "memory_bytes")
        window = promql.duration(end - start + s.step_seconds)
        throttled = (
            f"sum {keys} (increase({promql.selector(s.cpu_throttled_periods_metric, matchers)}[{window}])) / "
            f"sum {keys} (increase({promql.selector(s.cpu_periods_metric, matchers)}[{window}]))"
        )
        return pd.DataFrame(
            [
                (x.get(s.namespace_label, ""), x.get(s.pod_label, ""), x.get(s.container_label, ""), value)
                for x, value in self.client.query(throttled, end)
                if np.isfinite(value)
            ],
            columns=["namespace", "pod", "container", "cpu_throttled_fraction"],
        )

    def _frame(self, series: list[Series], column: str) -> pd.DataFrame:
        """Rows of (timestamp, namespace, pod, container, value); several series of one container merged by max."""
        s = self.s
        lengths = [len(x.times) for x in series]
        total = sum(lengths)

        def repeated(label: str) -> np.ndarray:
            return np.repeat(np.array([x.labels.get(label, "") for x in series], dtype=object), lengths)

        frame = pd.DataFrame(
            {
                "timestamp": np.fromiter((t for x in series for t in x.times), dtype=np.float64, count=total).astype(np.int64),
                "namespace": repeated(s.namespace_label),
                "pod": repeated(s.pod_label),
                "container": repeated(s.container_label),
                column: np.fromiter((v for x in series for v in x.values), dtype=np.float64, count=total),
            }
        )
        keys = [(x.labels.get(s.namespace_label), x.labels.get(s.pod_label), x.labels.get(s.container_label)) for x in series]
        if len(set(keys)) < len(keys):
            frame = frame.groupby(["timestamp", "namespace", "pod", "container"], sort=False).agg({column: "max"}).reset_index()
        return frame

    # -- owners ------------------------------------------------------------------------------------------------
    def _owners(self, start: int, end: int) -> dict[tuple[str, str], tuple[str, str]]:
        """(namespace, pod) -> (workload kind, workload name), from kube-state-metrics' owner series."""
        s = self.s
        ns, pod = s.namespace_label, s.pod_label
        pod_owner = self.client.series([promql.selector(s.pod_owner_metric, self._base())], start, end)
        rs_owner = self.client.series([promql.selector(s.replicaset_owner_metric, self._base())], start, end)
        job_owner = self.client.series([promql.selector(s.job_owner_metric, self._base())], start, end)
        replicaset_to = {
            (x.get(ns, ""), x.get("replicaset", "")): (x.get("owner_kind", NO_OWNER), x.get("owner_name", NO_OWNER)) for x in rs_owner
        }
        job_to = {(x.get(ns, ""), x.get("job_name", "")): (x.get("owner_kind", NO_OWNER), x.get("owner_name", NO_OWNER)) for x in job_owner}
        resolved: dict[tuple[str, str], tuple[str, str]] = {}
        # Controllers first, so a pod with several owner series resolves to its controller.
        for labels in sorted(pod_owner, key=lambda x: x.get("owner_is_controller") == "true"):
            key = (labels.get(ns, ""), labels.get(pod, ""))
            resolved[key] = self._resolve(key, labels, replicaset_to, job_to)
        return resolved

    @staticmethod
    def _resolve(
        key: tuple[str, str],
        labels: Labels,
        replicaset_to: dict[tuple[str, str], tuple[str, str]],
        job_to: dict[tuple[str, str], tuple[str, str]],
    ) -> tuple[str, str]:
        namespace, pod = key
        kind, name = labels.get("owner_kind", NO_OWNER), labels.get("owner_name", NO_OWNER)
        if kind in ("", NO_OWNER) or name in ("", NO_OWNER):
            return "Pod", pod
        parent = {"ReplicaSet": replicaset_to, "Job": job_to}.get(kind, {}).get((namespace, name))
        if parent is not None and parent[0] not in ("", NO_OWNER) and parent[1] not in ("", NO_OWNER):
            return parent
        return kind, name

    def _attach_owners(self, usage: pd.DataFrame, owners: dict[tuple[str, str], tuple[str, str]]) -> pd.DataFrame:
        pairs = usage[["namespace", "pod"]].drop_duplicates()
        resolved = [owners.get((n, p), ("Pod", p)) for n, p in pairs.itertuples(index=False)]
        table = pairs.assign(workload_kind=[k for k, _ in resolved], workload=[w for _, w in resolved])
        return usage.merge(table, on=["namespace", "pod"], how="left")

    # -- requests, limits, node, OOM ------------------------------------------------------------------------------
    def _attach_resources(self, usage: pd.DataFrame, end: int) -> pd.DataFrame:
        """Each pod container's last requests and limits in the window (kube-state-metrics), its node and its
        PriorityClass name (kube_pod_info's `priority_class`: koord-batch and koord-free pods borrow room, not reserve it)."""
        s = self.s
        window = promql.duration(s.history_seconds)
        keys = promql.by([*self._keys(), "resource"])
        columns = {
            ("requests", "cpu"): "cpu_request_cores",
            ("requests", "memory"): "memory_request_bytes",
            ("limits", "cpu"): "cpu_limit_cores",
            ("limits", "memory"): "memory_limit_bytes",
        }
        for kind, metric in (("requests", s.requests_metric), ("limits", s.limits_metric)):
            matchers = self._base([promql.one_of("resource", ["cpu", "memory"])])
            answer = self.client.query(f"max {keys} (last_over_time({promql.selector(metric, matchers)}[{window}]))", end)
            rows = [
                (x.get(s.namespace_label, ""), x.get(s.pod_label, ""), x.get(s.container_label, ""), x.get("resource", ""), v)
                for x, v in answer
            ]
            frame = pd.DataFrame(rows, columns=["namespace", "pod", "container", "resource", "value"])
            for resource in ("cpu", "memory"):
                column = columns[(kind, resource)]
                part = frame[frame["resource"] == resource].drop(columns="resource").rename(columns={"value": column})
                usage = usage.merge(part, on=["namespace", "pod", "container"], how="left")
        info = self.client.series(
            [promql.selector(s.pod_info_metric, self._base())], end - s.history_seconds, end
        )
        nodes = pd.DataFrame(
            [
                (x.get(s.namespace_label, ""), x.get(s.pod_label, ""), x.get(s.node_label) or None, x.get("priority_class") or None)
                for x in info
            ],
            columns=["namespace", "pod", "node", "priority_class"],
        ).drop_duplicates(["namespace", "pod"], keep="last")
        return usage.merge(nodes, on=["namespace", "pod"], how="left")

    def _oom_events(self, start: int, end: int, usage: pd.DataFrame) -> pd.DataFrame:
        """Times a container restarted while its last termination reason was OOMKilled; memory = its limit."""
        s = self.s
        keys = promql.by(self._keys())
        restarts = promql.selector(s.restarts_metric, self._base())
        reason = promql.selector(s.terminated_reason_metric, self._base([promql.eq("reason", "OOMKilled")]))
        window = promql.duration(s.cpu_rate_window_seconds)
        query = (
            f"(max {keys} (increase({restarts}[{window}])) > 0) "
            f"and on ({','.join(self._keys())}) (max {keys} ({reason}) == 1)"
        )
        series = self.client.query_range(query, start, end, s.step_seconds)
        events = self._frame(series, "restarts").drop(columns="restarts")
        if events.empty:
            return pd.DataFrame(columns=["timestamp", "namespace", "workload", "pod", "container", "memory_bytes"])
        # One event per restart: consecutive steps of the same increase belong to one kill.
        events = events.sort_values(["namespace", "pod", "container", "timestamp"])
        gap = events.groupby(["namespace", "pod", "container"])["timestamp"].diff()
        events = events[gap.isna() | (gap > s.cpu_rate_window_seconds)]
        meta = usage[["namespace", "pod", "container", "workload", "memory_limit_bytes"]].drop_duplicates(
            ["namespace", "pod", "container"]
        )
        events = events.merge(meta, on=["namespace", "pod", "container"], how="inner")
        return events.rename(columns={"memory_limit_bytes": "memory_bytes"})[
            ["timestamp", "namespace", "workload", "pod", "container", "memory_bytes"]
        ]


def _join_parts(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """CPU and memory rows joined on (time, pod container); the throttled share joined per pod container."""
    lines = [p for p in parts if "timestamp" in p.columns]
    usage = lines[0].merge(lines[1], on=["timestamp", "namespace", "pod", "container"], how="outer")
    throttling = next(p for p in parts if "timestamp" not in p.columns)
    return usage.merge(throttling, on=["namespace", "pod", "container"], how="left")


def _empty_usage() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "timestamp": pd.Series([], dtype=np.int64),
            "namespace": pd.Series([], dtype=object),
            "pod": pd.Series([], dtype=object),
            "container": pd.Series([], dtype=object),
            "cpu_cores": pd.Series([], dtype=np.float64),
            "memory_bytes": pd.Series([], dtype=np.float64),
        }
    )
