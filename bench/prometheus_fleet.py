"""The benchmark fleet of `python -m bench prometheus-train`: real Bitbrains usage as cAdvisor and kube-state-metrics
series backfilled into a Prometheus TSDB with promtool, cached outside git between runs.

Namespace i holds the 250 Bitbrains VMs of `bitbrains-aug` (one pod, one container each) from day `i mod 17` of the
month, shifted back onto one common 14-day window, so 40 namespaces give 10,000 containers whose usage differs from
namespace to namespace (VMs absent from a window drop out: 997 of 1,000). The OpenMetrics text is written one
namespace at a time with numpy formatting (a 10,000-container fleet never sits in memory as one frame); CPU is a
counter scraped every 5 minutes, the working set a gauge at the same times, owners, node, limits and CFS counters
every 30 minutes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from tests.support.openmetrics import COUNTER_START, _labels, owner_series

DAY = 86400
STEP = 300
SCRAPE_OFFSET = 30
META_EVERY = 6  # steps: kube-state-metrics and CFS counters every 30 minutes
PER_NAMESPACE = 250
CACHE = Path.home() / ".cache" / "koord-recommender" / "bench-prometheus"


def namespace_usage(source: pd.DataFrame, index: int, days: int) -> pd.DataFrame:
    """The VMs of namespace `index`: the source from day `index mod (span - days + 1)`, shifted onto the first window."""
    start = int(source["timestamp"].min() // DAY + 1) * DAY
    span = int((source["timestamp"].max() - start) // DAY)
    offset = (index % (span - days + 1)) * DAY
    rows = source[(source["timestamp"] >= start + offset) & (source["timestamp"] < start + offset + days * DAY)].copy()
    rows["timestamp"] = (rows["timestamp"] - offset) // STEP * STEP
    rows = rows.drop_duplicates(["workload", "timestamp"]).sort_values(["workload", "timestamp"])
    return rows.assign(namespace=f"team-{index:02d}")


def read_source(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, engine="pyarrow")


def fleet(source: pd.DataFrame, containers: int, days: int) -> Iterator[pd.DataFrame]:
    """The fleet's namespaces one by one (the last cut so the fleet has at most `containers` VMs)."""
    left = containers
    for index in range(-(-containers // PER_NAMESPACE)):
        usage = namespace_usage(source, index, days)
        keep = sorted(usage["workload"].unique())[: min(left, PER_NAMESPACE)]
        left -= PER_NAMESPACE
        yield usage[usage["workload"].isin(keep)]


def _series_lines(name: str, labels: str, times: np.ndarray, values: np.ndarray, fmt: str) -> str:
    stamps = (times - SCRAPE_OFFSET).astype(np.int64).astype(str)
    formatted = np.char.mod(fmt, values)
    return "".join(f"{name}{labels} {v} {t}\n" for v, t in zip(formatted.tolist(), stamps.tolist()))


def write_openmetrics(source: pd.DataFrame, containers: int, days: int, path: Path) -> int:
    """The fleet as OpenMetrics, one metric family after the other (promtool wants each family in one piece)."""
    lines = 0
    with open(path, "w", encoding="utf-8") as out:

        def family(name: str, kind: str, write: object) -> None:
            nonlocal lines
            out.write(f"# TYPE {name} {kind}\n")
            for usage in fleet(source, containers, days):
                for workload, rows in usage.groupby("workload", sort=True):
                    text = write(str(usage["namespace"].iloc[0]), str(workload), rows)  # type: ignore[operator]
                    lines += text.count("\n")
                    out.write(text)
            print(f"  {name}: {lines:,} lines so far", file=sys.stderr, flush=True)

        def cpu(ns: str, vm: str, rows: pd.DataFrame) -> str:
            times = rows["timestamp"].to_numpy()
            steps = np.diff(times, prepend=times[0] - STEP)
            counter = COUNTER_START + np.cumsum(rows["cpu_cores"].fillna(0.0).to_numpy() * steps)
            labels = _labels({"namespace": ns, "pod": vm, "container": "main", "image": "registry/app:1"})
            return _series_lines("container_cpu_usage_seconds_total", labels, times, counter, "%.6f")

        def memory(ns: str, vm: str, rows: pd.DataFrame) -> str:
            rows = rows[rows["memory_bytes"].notna()]
            labels = _labels({"namespace": ns, "pod": vm, "container": "main", "image": "registry/app:1"})
            return _series_lines(
                "container_memory_working_set_bytes",
                labels,
                rows["timestamp"].to_numpy(),
                rows["memory_bytes"].to_numpy(),
                "%.0f",
            )

        def every(rows: pd.DataFrame) -> pd.DataFrame:
            return pd.concat([rows.iloc[::META_EVERY], rows.iloc[-1:]]).drop_duplicates("timestamp")

        def cfs(metric: str) -> object:
            def write(ns: str, vm: str, rows: pd.DataFrame) -> str:
                times = rows["timestamp"].to_numpy()
                ratio = np.clip(
                    rows["cpu_cores"].fillna(0.0).to_numpy() / rows["cpu_limit_cores"].to_numpy() - 0.5, 0, 1
                )
                values = np.cumsum(np.full(times.size, 3000.0)) if metric == "periods" else np.cumsum(3000.0 * ratio)
                sparse = np.unique(np.append(np.arange(0, times.size, META_EVERY), times.size - 1))
                labels = _labels({"namespace": ns, "pod": vm, "container": "main"})
                return _series_lines(f"container_cpu_cfs_{metric}_total", labels, times[sparse], values[sparse], "%.1f")

            return write

        def owners(metric: str) -> object:
            def write(ns: str, vm: str, rows: pd.DataFrame) -> str:
                own, parents = owner_series(ns, vm, "Deployment", vm)
                labels = _labels(own) if metric == "kube_pod_owner" else _labels(parents[0][1])
                times = every(rows)["timestamp"].to_numpy()
                return _series_lines(metric, labels, times, np.ones(times.size), "%.0f")

            return write

        def info(ns: str, vm: str, rows: pd.DataFrame) -> str:
            labels = _labels({"namespace": ns, "pod": vm, "node": f"node-{abs(hash(vm)) % 50}", "host_ip": "10.0.0.1"})
            times = every(rows)["timestamp"].to_numpy()
            return _series_lines("kube_pod_info", labels, times, np.ones(times.size), "%.0f")

        def limits(ns: str, vm: str, rows: pd.DataFrame) -> str:
            sparse = every(rows)
            text = ""
            for resource, unit, column in (
                ("cpu", "core", "cpu_limit_cores"),
                ("memory", "byte", "memory_limit_bytes"),
            ):
                labels = _labels(
                    {
                        "namespace": ns,
                        "pod": vm,
                        "container": "main",
                        "node": "node-0",
                        "resource": resource,
                        "unit": unit,
                    }
                )
                text += _series_lines(
                    "kube_pod_container_resource_limits",
                    labels,
                    sparse["timestamp"].to_numpy(),
                    sparse[column].to_numpy(),
                    "%.6f",
                )
            return text

        family("container_cpu_usage_seconds", "counter", cpu)
        family("container_memory_working_set_bytes", "gauge", memory)
        family("container_cpu_cfs_periods", "counter", cfs("periods"))
        family("container_cpu_cfs_throttled_periods", "counter", cfs("throttled_periods"))
        family("kube_pod_owner", "gauge", owners("kube_pod_owner"))
        family("kube_replicaset_owner", "gauge", owners("kube_replicaset_owner"))
        family("kube_pod_info", "gauge", info)
        family("kube_pod_container_resource_limits", "gauge", limits)
        out.write("# EOF\n")
    return lines


def tsdb(source_path: Path, containers: int, days: int) -> Path:
    """The cached TSDB of the fleet (built on first use: OpenMetrics, then promtool; minutes at 10,000 containers)."""
    cache = CACHE / f"bitbrains-{containers}x{days}d"
    done = cache / "tsdb"
    if done.exists():
        return done
    cache.mkdir(parents=True, exist_ok=True)
    source = read_source(source_path)
    metrics = cache / "metrics.om"
    started = time.perf_counter()
    print(f"writing OpenMetrics for {containers} containers x {days} days to {metrics}", file=sys.stderr, flush=True)
    lines = write_openmetrics(source, containers, days, metrics)
    print(
        f"wrote {lines:,} samples in {time.perf_counter() - started:.0f} s; backfilling with promtool",
        file=sys.stderr,
        flush=True,
    )
    building = cache / "building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir()
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=744h",
            str(metrics),
            str(building),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=7200,
    )
    building.rename(done)
    metrics.unlink()
    print(f"TSDB ready in {time.perf_counter() - started:.0f} s: {done}", file=sys.stderr, flush=True)
    return done


def tidy_file(source_path: Path, containers: int, days: int) -> Path:
    """The same samples as a tidy Parquet file (the file path's input)."""
    path = CACHE / f"bitbrains-{containers}x{days}d" / "usage.parquet"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        usage = pd.concat(list(fleet(read_source(path=source_path), containers, days)), ignore_index=True)
        usage = usage.sort_values(["namespace", "workload", "pod", "container", "timestamp"])
        usage.to_parquet(path.with_suffix(".tmp"), index=False)
        path.with_suffix(".tmp").rename(path)
    return path


if __name__ == "__main__":
    tsdb(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
