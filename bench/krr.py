"""A KRR-equivalent reference (`python -m bench.krr URL --history-seconds S --as-of T`): the queries of KRR's
`simple` strategy against the same Prometheus, to time a recommendation pass the way users run it today.

KRR (robusta-dev/krr) finds the pods of each workload, then asks per workload container and resource, each an
instant query over a subquery of the whole history: the p95 of the CPU rate and its number of points, the max of
the working set and its number of points (shared/docs/anchors.md section 3). Its recommendation: CPU = the largest
pod p95, memory = the largest pod max x 1.15, only with at least 100 points. Here the pods come from
kube-state-metrics' owner series (KRR reads the Kubernetes API; no cluster here), and the queries go out on 10
threads, KRR's default `--max-workers`. Prints one JSON line: queries, bytes received, recommendations.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipelines import promql

WORKERS = 10
PERCENTILE = 0.95
MEMORY_BUFFER = 1.15
MIN_POINTS = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--history-seconds", type=int, default=14 * 86400)
    parser.add_argument("--as-of", type=int, required=True)
    parser.add_argument("--rate-window-seconds", type=int, default=600)
    args = parser.parse_args()
    http = httpx.Client(base_url=args.url, timeout=300, limits=httpx.Limits(max_connections=WORKERS))
    received = queries = 0

    def post(path: str, form: dict[str, str | list[str]]) -> list[dict[str, Any]]:
        nonlocal received, queries
        response = http.post(path, data=form)
        response.raise_for_status()
        received += len(response.content)
        queries += 1
        data: Any = response.json()["data"]
        return list(data if path.endswith("/series") else data["result"])

    window = {"start": str(args.as_of - args.history_seconds), "end": str(args.as_of)}
    replicasets = {
        (x["namespace"], x["replicaset"]): x["owner_name"]
        for x in post("/api/v1/series", {"match[]": ["kube_replicaset_owner"], **window})
    }
    workload_of = {}
    for x in post("/api/v1/series", {"match[]": ["kube_pod_owner"], **window}):
        name = str(x["owner_name"])
        workload_of[(x["namespace"], x["pod"])] = (
            replicasets.get((x["namespace"], name), name) if x["owner_kind"] == "ReplicaSet" else name
        )
    pods: dict[tuple[str, str, str], set[str]] = defaultdict(set)
    for x in post(
        "/api/v1/series",
        {"match[]": ['container_memory_working_set_bytes{container!="",container!="POD",image!=""}'], **window},
    ):
        namespace, pod = str(x["namespace"]), str(x["pod"])
        pods[(namespace, workload_of.get((namespace, pod), pod), str(x["container"]))].add(pod)
    history, step = promql.duration(args.history_seconds), "5m"
    rate = promql.duration(args.rate_window_seconds)

    def recommend(key: tuple[str, str, str]) -> tuple[float | None, float | None]:
        namespace, _, container = key
        matchers = f"namespace={promql.quote(namespace)},pod=~{promql.regex_alternatives(pods[key])},container={promql.quote(container)}"
        cpu = f"max(rate(container_cpu_usage_seconds_total{{{matchers}}}[{rate}])) by (container, pod, job)"
        memory = f"max(container_memory_working_set_bytes{{{matchers}}}) by (container, pod, job)"

        def instant(query: str) -> list[float]:
            return [float(x["value"][1]) for x in post("/api/v1/query", {"query": query, "time": str(args.as_of)})]

        cpu_p95 = instant(f"quantile_over_time({PERCENTILE}, {cpu}[{history}:{step}])")
        cpu_points = instant(f"count_over_time({cpu}[{history}:{step}])")
        memory_max = instant(f"max_over_time({memory}[{history}:{step}])")
        memory_points = instant(f"count_over_time({memory}[{history}:{step}])")
        cpu_value = max(cpu_p95) if cpu_p95 and sum(cpu_points) >= MIN_POINTS else None
        memory_value = max(memory_max) * MEMORY_BUFFER if memory_max and sum(memory_points) >= MIN_POINTS else None
        return cpu_value, memory_value

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        results = list(pool.map(recommend, sorted(pods)))
    print(
        json.dumps(
            {
                "queries": queries,
                "bytes": received,
                "containers": len(pods),
                "recommendations": sum(c is not None for c, _ in results),
            }
        )
    )


if __name__ == "__main__":
    main()
