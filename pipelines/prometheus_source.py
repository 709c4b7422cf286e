"""Usage history from Prometheus, as the same tidy frame the file reader returns.

Reads cAdvisor (CPU counter, working set, CFS throttling) and kube-state-metrics (owners, node, requests, limits,
OOM kills), and resolves each pod to its workload from the owner chain alone, so no cluster access is needed:
ReplicaSet -> Deployment, Job -> CronJob, StatefulSet and DaemonSet as they are, pods without an owner as
themselves. Per-container facts come first, from the series endpoint (index only) or one instant query each;
then the usage, in batches of namespaces sized by the points an answer will hold (`plan_batches`), each answer
decoded as it streams in and turned into that batch's tidy rows at once: a batch's raw answer never outlives it.
A batch that fails after retries is reported by name.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from pipelines import promql
from pipelines.prometheus import Labels, PrometheusClient, RangeQuery, Series
from pipelines.settings import PrometheusSettings
from recommender.arrays import IntArray
from recommender.errors import PrometheusError
from recommender.progress import Step

log = logging.getLogger(__name__)
NO_OWNER = "<none>"


@dataclass
class PrometheusUsage:
    """The tidy usage read from Prometheus, OOM kills, what could not be read (workload group -> why), and the
    containers with a NaN sample ((namespace, workload, container) -> the first), which `usage` cannot show: a NaN
    there is a missing value."""

    usage: pd.DataFrame
    oom_events: pd.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)
    workload_kinds: dict[tuple[str, str], str] = field(default_factory=dict)
    nan_samples: dict[tuple[str, str, str], str] = field(default_factory=dict)


class PrometheusSource:
    """Builds the queries for one read window and turns the answers into tidy rows."""

    def __init__(
        self, client: PrometheusClient, settings: PrometheusSettings, namespaces: list[str] | None = None
    ) -> None:
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
            per_namespace[labels.get(s.namespace_label, "")].add(
                (labels.get(s.pod_label, ""), labels.get(s.container_label, ""))
            )
        if not per_namespace:
            raise PrometheusError(
                f"no {s.memory_metric} series with a container label in {self.client.base_url} between {start} and {end}"
            )
        return {namespace: len(containers) for namespace, containers in per_namespace.items()}

    def read(self, start: int, end: int, step: Step, plan: ReadPlan | None = None) -> PrometheusUsage:
        """Everything between `start` and `end` (Unix seconds, aligned to the step), as one tidy frame sorted as a
        usage file is (each batch comes sorted; its namespaces are put in order without sorting the rows again).
        `plan`: facts already read (`ReadPlan.scoped` to one partition's namespaces), so only the usage is asked for."""
        plan = self.plan(start, end, step) if plan is None else plan
        blocks: dict[str, BatchRows] = {}
        nan_samples: dict[tuple[str, str, str], str] = {}
        for got in self.batches(plan, step):
            nan_samples.update(got.nan_samples)
            # Containers come sorted by namespace first, so each namespace is one run of containers and of rows.
            namespaces = got.containers["namespace"].to_numpy()
            ends = np.cumsum(got.containers["rows"].to_numpy())
            bounds = [0, *(np.flatnonzero(namespaces[1:] != namespaces[:-1]) + 1), len(namespaces)]
            for first, last in itertools.pairwise(bounds):
                if last > first:
                    rows = slice(int(ends[first - 1]) if first else 0, int(ends[last - 1]))
                    blocks[str(namespaces[first])] = BatchRows(got.rows.iloc[rows], got.containers.iloc[first:last])
        if len(blocks) == 1:  # one namespace (a partition of a streamed read): no copy
            only = next(iter(blocks.values()))
            usage, containers = only.rows.reset_index(drop=True), only.containers
        elif blocks:
            usage = _concat_rows([blocks[ns].rows for ns in sorted(blocks)])
            containers = pd.concat([blocks[ns].containers for ns in sorted(blocks)], ignore_index=True)
        else:
            usage = _empty_usage()
            containers = usage.drop(columns=["timestamp", "cpu_cores", "memory_bytes"])
        del blocks
        self._warn_without_cpu(usage)
        return PrometheusUsage(
            usage.drop(columns=["workload_kind"]),
            plan.oom_events(containers),
            plan.skipped,
            plan.kinds(containers),
            nan_samples,
        )

    def _warn_without_cpu(self, usage: pd.DataFrame) -> None:
        """Say so when containers have memory samples but not one has a CPU sample: the mark of a rate() window
        shorter than two scrapes of the counter, which otherwise leaves every CPU recommendation empty unexplained."""
        # fmax skips NaN, so the fleet's largest CPU value is NaN only when every one is (and no array is made).
        if len(usage) == 0 or not np.isnan(np.fmax.reduce(usage["cpu_cores"].to_numpy())):
            return
        with_memory = usage.loc[np.isfinite(usage["memory_bytes"].to_numpy()), ["namespace", "pod", "container"]]
        if len(with_memory) == 0:
            return
        s = self.s
        log.warning(
            "no CPU samples for any of the %d containers with memory samples: rate(%s[%ds]) needs two scrapes of the "
            "counter in its window, so a counter scraped every %d s or less often gives none; set "
            "prometheus.cpu_rate_window_seconds (KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS) to at least "
            "twice the scrape interval. CPU is left without a recommendation.",
            len(with_memory.drop_duplicates()),
            s.cpu_usage_metric,
            s.cpu_rate_window_seconds,
            s.cpu_rate_window_seconds,
        )

    def plan(self, start: int, end: int, step: Step) -> ReadPlan:
        """Discovery and every per-container fact (owners, requests, limits, node, OOM kills), from the index and
        instant queries, and the batches the usage will be read in."""
        s = self.s
        step(f"discovering containers in {self.client.base_url}")
        per_namespace = self.containers_per_namespace(start, end)
        step(
            f"resolving owners of {sum(per_namespace.values())} containers; reading requests, limits, nodes and OOM kills"
        )
        owners = self._owners(start, end)
        resources = self._resources(end)
        placement = self._placement(end)
        oom = self._oom_series(start, end)
        steps = (end - start) // s.step_seconds + 1
        batches = plan_batches(per_namespace, steps, s.max_points_per_query, s.max_series_per_query)
        return ReadPlan(start, end, s.step_seconds, batches, per_namespace, owners, resources, placement, oom)

    def batches(self, plan: ReadPlan, step: Step) -> Iterator[BatchRows]:
        """The usage of each batch as a tidy frame, in the plan's order, as the batches are read (at most
        `concurrency` at once); a batch that fails after retries is recorded in `plan.skipped` and yields nothing."""
        total = len(plan.batches)
        step(f"reading usage in {total} batches of at most {self.s.max_points_per_query:,} points per query")

        def read(batch: Batch) -> BatchRows | PrometheusError:
            try:
                return self._batch_frame(batch, plan)
            except PrometheusError as error:
                return error

        with ThreadPoolExecutor(max_workers=self.s.concurrency) as pool:
            # At most `concurrency` batches submitted ahead of the one handed out: a slow consumer never piles them up.
            pending: deque[Future[BatchRows | PrometheusError]] = deque()
            upcoming = iter(plan.batches)
            for batch in itertools.islice(upcoming, self.s.concurrency):
                pending.append(pool.submit(read, batch))
            for number, batch in enumerate(plan.batches, 1):
                result = pending.popleft().result()
                for following in itertools.islice(upcoming, 1):
                    pending.append(pool.submit(read, following))
                if isinstance(result, PrometheusError):
                    for namespace in batch.namespaces:
                        plan.skipped.setdefault(f"{namespace}/*", str(result))
                    continue
                step(f"batch {number}/{total}: {batch.containers} containers, {len(result.rows):,} samples")
                yield result

    def _batch_frame(self, batch: Batch, plan: ReadPlan) -> BatchRows:
        """One batch's CPU and memory lines on the step grid (several series of one container merged by max) and
        its throttled share, as tidy rows sorted as a usage file is, with the per-container facts attached; and
        the facts once per container with rows."""
        matchers = self._container_matchers(batch.namespaces)
        # No `max by` here: aggregating per step doubles Prometheus' work; the rare duplicate series of one
        # container (a restart's new cgroup, a second scrape job) are merged by max on our side instead.
        # The CPU, memory and throttling queries (and their time chunks) at once, `concurrency` in flight.
        usage = self._usage_queries(matchers)
        answers = self.client.query_ranges(
            [
                RangeQuery(query, plan.start, plan.end, plan.step_seconds, batch.steps_per_query)
                for query in usage.values()
            ]
            + [self._throttled_query(matchers, plan, batch.steps_per_query)]
        )
        lines = dict(zip(usage, answers))
        throttled = self._throttled(answers[-1])
        del answers
        keys = sorted(
            {self._key(x.labels) for series in lines.values() for x in series},
            key=lambda key: (key[0], plan.owner(key)[1], key[1], key[2]),
        )
        index = {key: i for i, key in enumerate(keys)}
        n_steps = (plan.end - plan.start) // plan.step_seconds + 1
        grids = {}
        # Prometheus answers on the query's steps; the time of each slot is kept anyway (other stores may not).
        stamps = np.zeros((len(keys), n_steps), dtype=np.int64)
        # On the grid NaN is a missing value (fmax skips it): a NaN Prometheus answered is noted here, to quarantine.
        nan_samples: dict[tuple[str, str, str], str] = {}
        for column, series in lines.items():
            grid = np.full((len(keys), n_steps), np.nan)
            for x in series:
                slots = np.floor((x.times - plan.start) / plan.step_seconds).astype(np.int64)
                inside = (slots >= 0) & (slots < n_steps)
                key = self._key(x.labels)
                row = index[key]
                np.fmax.at(grid[row], slots[inside], x.values[inside])
                stamps[row, slots[inside]] = x.times[inside].astype(np.int64)
                nan = inside & np.isnan(x.values)
                if nan.any():
                    nan_samples.setdefault(
                        (key[0], plan.owner(key)[1], key[2]),
                        f"{column} NaN is not a finite number at {x.times[nan][0]:.0f}",
                    )
            grids[column] = grid
        del lines
        rows, slots = np.nonzero(~np.isnan(grids["cpu_cores"]) | ~np.isnan(grids["memory_bytes"]))
        facts = plan.facts(keys, throttled)
        frame = pd.DataFrame(
            {
                "timestamp": stamps[rows, slots],
                **{column: _per_row(facts[column], rows) for column in ("namespace", "pod", "container")},
                "cpu_cores": grids["cpu_cores"][rows, slots],
                "memory_bytes": grids["memory_bytes"][rows, slots],
                **{column: _per_row(facts[column], rows) for column in FACT_COLUMNS},
            },
            # Each column is new: kept as it is, not copied into one block of the floats (0.22 CPU s a pass at 1,000
            # containers, on the read's path).
            copy=False,
        )
        counts = np.bincount(rows, minlength=len(keys))
        return BatchRows(frame, facts[counts > 0].assign(rows=counts[counts > 0]).reset_index(drop=True), nan_samples)

    def _usage_queries(self, matchers: list[promql.Matcher]) -> dict[str, str]:
        """The CPU and memory line of the containers `matchers` select, by tidy column."""
        s = self.s
        cpu = f"rate({promql.selector(s.cpu_usage_metric, matchers)}[{promql.duration(s.cpu_rate_window_seconds)}])"
        memory = (
            f"max_over_time({promql.selector(s.memory_metric, matchers)}[{promql.duration(s.memory_window_seconds)}])"
        )
        return {"cpu_cores": cpu, "memory_bytes": memory}

    def newest_step(self, start: int, end: int) -> int | None:
        """The newest step of [start, end] at which some container has a CPU or memory line: the fleet's newest
        usage sample, where every partition's forecast grid ends, known before any partition is read. One instant
        count at `end` (a live fleet), else one range query of the count per step (one point a step, though
        Prometheus then reads the window's samples once); None when there is none."""
        lines = self._usage_queries(self._container_matchers())
        query = f"count({lines['cpu_cores']}) or count({lines['memory_bytes']})"
        if self.client.query(query, end):
            return end
        counts = self.client.query_range(query, start, end, self.s.step_seconds)
        stamps = [int(x.times[np.isfinite(x.values)].max()) for x in counts if np.isfinite(x.values).any()]
        return max(stamps) if stamps else None

    def _key(self, labels: Labels) -> tuple[str, str, str]:
        s = self.s
        return labels.get(s.namespace_label, ""), labels.get(s.pod_label, ""), labels.get(s.container_label, "")

    def _throttled_query(self, matchers: list[promql.Matcher], plan: ReadPlan, steps_per_query: int) -> RangeQuery:
        """The CFS throttling of the containers `matchers` select: one range query whose steps are windows of
        `steps_per_query` steps back from the end (so Prometheus holds one window's samples at a time, as for the
        usage), giving per window the throttled and all periods."""
        s = self.s
        keys = promql.by(self._keys())
        width = steps_per_query * plan.step_seconds
        windows = -(-(plan.end - plan.start + plan.step_seconds) // width)
        span = promql.duration(width)
        part = {
            name: f'label_replace(sum {keys} (increase({promql.selector(metric, matchers)}[{span}])), "cfs", "{name}", "", "")'
            for name, metric in (("throttled", s.cpu_throttled_periods_metric), ("periods", s.cpu_periods_metric))
        }
        return RangeQuery(
            f"{part['throttled']} or {part['periods']}", plan.end - (windows - 1) * width, plan.end, width
        )

    def _throttled(self, answer: list[Series]) -> dict[tuple[str, str, str], float]:
        """Each container's share of CFS periods throttled over the window (`_throttled_query`'s answer): the ratio
        of the windows' sums."""
        sums: dict[tuple[str, str, str], dict[str, float]] = defaultdict(lambda: {"throttled": 0.0, "periods": 0.0})
        for x in answer:
            part_name = x.labels.get("cfs", "")
            if part_name in ("throttled", "periods"):
                sums[self._key(x.labels)][part_name] += float(x.values[np.isfinite(x.values)].sum())
        return {key: total["throttled"] / total["periods"] for key, total in sums.items() if total["periods"] > 0}

    # -- owners ------------------------------------------------------------------------------------------------
    def _owners(self, start: int, end: int) -> dict[tuple[str, str], tuple[str, str]]:
        """(namespace, pod) -> (workload kind, workload name), from kube-state-metrics' owner series."""
        s = self.s
        ns, pod = s.namespace_label, s.pod_label
        pod_owner = self.client.series([promql.selector(s.pod_owner_metric, self._base())], start, end)
        rs_owner = self.client.series([promql.selector(s.replicaset_owner_metric, self._base())], start, end)
        job_owner = self.client.series([promql.selector(s.job_owner_metric, self._base())], start, end)
        replicaset_to = {
            (x.get(ns, ""), x.get("replicaset", "")): (x.get("owner_kind", NO_OWNER), x.get("owner_name", NO_OWNER))
            for x in rs_owner
        }
        job_to = {
            (x.get(ns, ""), x.get("job_name", "")): (x.get("owner_kind", NO_OWNER), x.get("owner_name", NO_OWNER))
            for x in job_owner
        }
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

    # -- requests, limits, node, OOM ------------------------------------------------------------------------------
    def _resources(self, end: int) -> dict[tuple[str, str, str], dict[str, float]]:
        """Each pod container's last requests and limits in the window (kube-state-metrics), by column name."""
        s = self.s
        window = promql.duration(s.history_seconds)
        keys = promql.by([*self._keys(), "resource"])
        facts: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
        for kind, metric in (("request", s.requests_metric), ("limit", s.limits_metric)):
            matchers = self._base([promql.one_of("resource", ["cpu", "memory"])])
            answer = self.client.query(
                f"max {keys} (last_over_time({promql.selector(metric, matchers)}[{window}]))", end
            )
            for labels, value in answer:
                resource = labels.get("resource", "")
                if resource in RESOURCE_UNITS:
                    facts[self._key(labels)][f"{resource}_{kind}_{RESOURCE_UNITS[resource]}"] = value
        return facts

    def _placement(self, end: int) -> dict[tuple[str, str], tuple[str | None, str | None]]:
        """(namespace, pod) -> (node, PriorityClass name) from kube_pod_info's series (koord-batch and koord-free
        pods borrow room, not reserve it); the last label set seen wins."""
        s = self.s
        info = self.client.series([promql.selector(s.pod_info_metric, self._base())], end - s.history_seconds, end)
        return {
            (x.get(s.namespace_label, ""), x.get(s.pod_label, "")): (
                x.get(s.node_label) or None,
                x.get("priority_class") or None,
            )
            for x in info
        }

    def _oom_series(self, start: int, end: int) -> pd.DataFrame:
        """Times a container restarted while its last termination reason was OOMKilled: one row per kill."""
        s = self.s
        keys = promql.by(self._keys())
        restarts = promql.selector(s.restarts_metric, self._base())
        reason = promql.selector(s.terminated_reason_metric, self._base([promql.eq("reason", "OOMKilled")]))
        window = promql.duration(s.cpu_rate_window_seconds)
        query = (
            f"(max {keys} (increase({restarts}[{window}])) > 0) "
            f"and on ({','.join(self._keys())}) (max {keys} ({reason}) == 1)"
        )
        rows = [
            (int(t), *self._key(x.labels))
            for x in self.client.query_range(query, start, end, s.step_seconds)
            for t in x.times
        ]
        events = pd.DataFrame(rows, columns=["timestamp", "namespace", "pod", "container"]).drop_duplicates()
        events = events.sort_values(["namespace", "pod", "container", "timestamp"])
        # One event per restart: consecutive steps of the same increase belong to one kill.
        gap = events.groupby(["namespace", "pod", "container"])["timestamp"].diff()
        return events[gap.isna() | (gap > s.cpu_rate_window_seconds)].reset_index(drop=True)


RESOURCE_UNITS = {"cpu": "cores", "memory": "bytes"}
FACT_COLUMNS = (
    "cpu_throttled_fraction",
    "workload",
    "workload_kind",
    "cpu_request_cores",
    "memory_request_bytes",
    "cpu_limit_cores",
    "memory_limit_bytes",
    "node",
    "priority_class",
)


@dataclass(frozen=True)
class BatchRows:
    """A batch's tidy rows and its containers (one row each: the per-container facts and `rows`, how many of the
    tidy rows are its), in the same order: what is per container is read off the few containers, not the rows."""

    rows: pd.DataFrame
    containers: pd.DataFrame
    nan_samples: dict[tuple[str, str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Batch:
    """Namespaces read by one CPU and one memory query (each split in time into ranges of `steps_per_query`)."""

    namespaces: list[str]
    containers: int
    steps_per_query: int


def plan_batches(counts: dict[str, int], steps: int, max_points: int, max_series: int) -> list[Batch]:
    """Namespaces (largest first) packed into batches whose answers hold at most `max_points` points (containers x
    steps) and `max_series` containers; a namespace too big for one answer is read alone, its range split in time
    so each answer stays within `max_points`. Consecutive batches together always exceed a budget, so there are
    at most twice as many as a perfect packing would need."""
    batches: list[Batch] = []
    current: list[str] = []
    size = 0

    def close() -> None:
        nonlocal current, size
        if current:
            batches.append(Batch(current, size, max(1, min(steps, max_points // max(size, 1)))))
        current, size = [], 0

    for namespace, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if current and (size + count > max_series or (size + count) * steps > max_points):
            close()
        current.append(namespace)
        size += count
    close()
    return batches


@dataclass
class ReadPlan:
    """What a read knows before the usage: the window, the batches, and every per-container fact; `skipped`
    collects the batches that could not be read."""

    start: int
    end: int
    step_seconds: int
    batches: list[Batch]
    containers: dict[str, int]
    owners: dict[tuple[str, str], tuple[str, str]]
    resources: dict[tuple[str, str, str], dict[str, float]]
    placement: dict[tuple[str, str], tuple[str | None, str | None]]
    oom: pd.DataFrame
    skipped: dict[str, str] = field(default_factory=dict)

    def scoped(self, namespaces: list[str] | None, settings: PrometheusSettings) -> ReadPlan:
        """This plan for the usage of `namespaces` only (None: all), batched anew within them and with its own
        `skipped`: one partition's read, sharing the facts (which are per container: small) with the others."""
        counts = self.containers if namespaces is None else {n: self.containers.get(n, 0) for n in namespaces}
        counts = {namespace: n for namespace, n in counts.items() if n}
        steps = (self.end - self.start) // self.step_seconds + 1
        batches = plan_batches(counts, steps, settings.max_points_per_query, settings.max_series_per_query)
        return replace(self, batches=batches, containers=counts, skipped={})

    def owner(self, key: tuple[str, str, str]) -> tuple[str, str]:
        """(kind, workload) of a pod container's pod; a pod without a known owner is its own workload."""
        return self.owners.get((key[0], key[1]), ("Pod", key[1]))

    def facts(self, keys: list[tuple[str, str, str]], throttled: dict[tuple[str, str, str], float]) -> pd.DataFrame:
        """One row per pod container of `keys`: its identity, workload and kind, requests, limits, node, PriorityClass
        and throttled share (NaN or None where unknown)."""
        nan = float("nan")
        rows = []
        for key in keys:
            kind, workload = self.owner(key)
            resources = self.resources.get(key, {})
            node, priority = self.placement.get((key[0], key[1]), (None, None))
            rows.append(
                (
                    *key,
                    throttled.get(key, nan),
                    workload,
                    kind,
                    *(
                        resources.get(c, nan)
                        for c in ("cpu_request_cores", "memory_request_bytes", "cpu_limit_cores", "memory_limit_bytes")
                    ),
                    node,
                    priority,
                )
            )
        return pd.DataFrame(rows, columns=["namespace", "pod", "container", *FACT_COLUMNS])

    def oom_events(self, containers: pd.DataFrame) -> pd.DataFrame:
        """The OOM kills of `containers` (those with usage; one row each, `BatchRows.containers`), with their
        workload and memory limit (the memory at the kill)."""
        columns = ["timestamp", "namespace", "workload", "pod", "container", "memory_bytes"]
        meta = containers[["namespace", "pod", "container", "workload", "memory_limit_bytes"]]
        events = self.oom.merge(meta, on=["namespace", "pod", "container"], how="inner")
        return (
            events.rename(columns={"memory_limit_bytes": "memory_bytes"})[columns]
            if len(events)
            else pd.DataFrame(columns=columns)
        )

    def kinds(self, containers: pd.DataFrame) -> dict[tuple[str, str], str]:
        """(namespace, workload) -> workload kind, for the workloads of `containers` (`BatchRows.containers`)."""
        pairs = containers[["namespace", "workload", "workload_kind"]].drop_duplicates()
        return {(ns, w): k for ns, w, k in pairs.itertuples(index=False)}


def _per_row(per_container: pd.Series, rows: IntArray) -> np.ndarray | pd.Categorical:
    """A per-container column repeated for each row of its container (`rows`: the container of each row). Names
    become a categorical over the batch's few distinct ones: a million rows then hold small codes instead of strings
    (each row's string was the frame's largest cost, and the estimators factorized them back into codes)."""
    if per_container.dtype.kind == "f":
        return per_container.to_numpy()[rows]
    codes, names = pd.factorize(per_container)
    # Gathered in the categorical's own small code type; the codes are factorize's, valid by construction. The
    # categories always of the default string dtype (an all-None column too), so batches' columns can be united.
    small = codes.astype(np.min_scalar_type(-max(len(names), 1)))
    return pd.Categorical.from_codes(small[rows], categories=pd.Index(names, dtype="str"), validate=False)


def _concat_rows(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Batches' rows one after the other, each categorical column over the union of the batches' names (a plain
    concat turns categoricals of different names into strings, one per row)."""
    return pd.DataFrame(
        {
            column: union_categoricals([frame[column] for frame in frames])
            if isinstance(frames[0][column].dtype, pd.CategoricalDtype)
            else pd.concat([frame[column] for frame in frames], ignore_index=True)
            for column in frames[0].columns
        },
        copy=False,  # every column is new (`_batch_frame`)
    )


def _empty_usage() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "timestamp": pd.Series([], dtype=np.int64),
            "namespace": pd.Series([], dtype=object),
            "pod": pd.Series([], dtype=object),
            "container": pd.Series([], dtype=object),
            "cpu_cores": pd.Series([], dtype=np.float64),
            "memory_bytes": pd.Series([], dtype=np.float64),
            **{
                column: pd.Series(
                    [],
                    dtype=object if column in ("workload", "workload_kind", "node", "priority_class") else np.float64,
                )
                for column in FACT_COLUMNS
            },
        }
    )
