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
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tests.support.openmetrics import COUNTER_START, _labels, owner_series

DAY = 86400
STEP = 300
SCRAPE_OFFSET = 30
META_EVERY = 6  # steps: kube-state-metrics and CFS counters every 30 minutes
PER_NAMESPACE = 250
CACHE = Path.home() / ".cache" / "koord-recommender" / "bench-prometheus"


def namespace_usage(
    source: pd.DataFrame, index: int, days: int, shifted: dict[int, pd.DataFrame] | None = None
) -> pd.DataFrame:
    """The VMs of namespace `index`: the source from day `index mod (span - days + 1)`, shifted onto the first window.
    `shifted`: the shifted windows already cut, by offset (namespaces 17 apart share one)."""
    start = int(source["timestamp"].min() // DAY + 1) * DAY
    span = int((source["timestamp"].max() - start) // DAY)
    offset = (index % (span - days + 1)) * DAY
    rows = None if shifted is None else shifted.get(offset)
    if rows is None:
        window = (source["timestamp"] >= start + offset) & (source["timestamp"] < start + offset + days * DAY)
        rows = source[window].copy()
        rows["timestamp"] = (rows["timestamp"] - offset) // STEP * STEP
        rows = rows.drop_duplicates(["workload", "timestamp"]).sort_values(["workload", "timestamp"])
        if shifted is not None:
            shifted[offset] = rows
    return rows.assign(namespace=f"team-{index:02d}")


def read_source(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, engine="pyarrow")


def fleet(
    source: pd.DataFrame, containers: int, days: int, shifted: dict[int, pd.DataFrame] | None = None
) -> Iterator[pd.DataFrame]:
    """The fleet's namespaces one by one (the last cut so the fleet has at most `containers` VMs)."""
    left = containers
    for index in range(-(-containers // PER_NAMESPACE)):
        usage = namespace_usage(source, index, days, shifted)
        keep = sorted(usage["workload"].unique())[: min(left, PER_NAMESPACE)]
        left -= PER_NAMESPACE
        yield usage[usage["workload"].isin(keep)]


def _lines(name: str, labels: pa.Array, values: pa.Array, times: np.ndarray) -> memoryview:
    """OpenMetrics sample lines `name{labels} value timestamp`, one per element, formatted in Arrow's C++ kernels
    (a Python loop over 100 million lines took hours): the joined strings' data buffer is the text itself."""
    stamps = pa.array(times - SCRAPE_OFFSET, pa.int64()).cast(pa.string())
    ends = pc.binary_join_element_wise(stamps, pa.scalar("\n"), "")
    text = pc.binary_join_element_wise(pc.binary_join_element_wise(pa.scalar(name), labels, ""), values, ends, " ")
    offsets, data = text.buffers()[1], text.buffers()[2]
    first, last = np.frombuffer(offsets, np.int32, count=len(text) + 1, offset=text.offset * 4)[[0, -1]]
    return memoryview(data)[int(first) : int(last)]


def _floats(values: np.ndarray) -> pa.Array:
    """Shortest round-trip text of each float (OpenMetrics takes any Go-parsable float)."""
    return pa.array(values, pa.float64()).cast(pa.string())


def _integers(values: np.ndarray) -> pa.Array:
    return pa.array(np.rint(values).astype(np.int64)).cast(pa.string())


def _per_row(labels: list[str], codes: np.ndarray) -> pa.Array:
    """Each row's label text, from one label text per workload and the rows' workload codes."""
    return pc.take(pa.array(labels, pa.string()), pa.array(codes, pa.int32()))


def _sparse(codes: np.ndarray) -> np.ndarray:
    """Rows kept for the 30-minute series: every `META_EVERY`-th sample of each workload and its last one."""
    starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    sizes = np.diff(np.r_[starts, codes.size])
    position = np.arange(codes.size) - np.repeat(starts, sizes)
    last = position == np.repeat(sizes, sizes) - 1
    return np.flatnonzero((position % META_EVERY == 0) | last)


def write_openmetrics(source: pd.DataFrame, containers: int, days: int, path: Path) -> int:
    """The fleet as OpenMetrics, one metric family after the other (promtool wants each family in one piece), each
    family written namespace by namespace with every workload's lines formatted at once."""
    lines = 0
    started = time.perf_counter()
    shifted: dict[int, pd.DataFrame] = {}  # at most 17 windows of 250 VMs x 14 days: about 1.5 GB
    with open(path, "wb") as out:

        def family(
            name: str, kind: str, write: Callable[[str, list[str], np.ndarray, pd.DataFrame], Iterator[memoryview]]
        ) -> None:
            nonlocal lines
            out.write(f"# TYPE {name} {kind}\n".encode())
            for usage in fleet(source, containers, days, shifted):
                namespace = str(usage["namespace"].iloc[0])
                codes, vms = pd.factorize(usage["workload"], sort=True)
                for text in write(namespace, [str(v) for v in vms], codes, usage):
                    lines += int(np.count_nonzero(np.frombuffer(text, np.uint8) == ord("\n")))
                    out.write(text)
            print(
                f"  {name}: {lines:,} lines so far, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True
            )

        def container(ns: str, vm: str, **extra: str) -> str:
            return _labels({"namespace": ns, "pod": vm, "container": "main", **extra})

        def cpu(ns: str, vms: list[str], codes: np.ndarray, usage: pd.DataFrame) -> Iterator[memoryview]:
            times = usage["timestamp"].to_numpy()
            steps = np.diff(times, prepend=times[0] - STEP)
            first = np.r_[True, codes[1:] != codes[:-1]]
            steps[first] = STEP
            work = pd.Series(usage["cpu_cores"].fillna(0.0).to_numpy() * steps)
            counter = COUNTER_START + work.groupby(codes).cumsum().to_numpy()
            labels = [container(ns, vm, image="registry/app:1") for vm in vms]
            yield _lines("container_cpu_usage_seconds_total", _per_row(labels, codes), _floats(counter), times)

        def memory(ns: str, vms: list[str], codes: np.ndarray, usage: pd.DataFrame) -> Iterator[memoryview]:
            known = usage["memory_bytes"].notna().to_numpy()
            labels = [container(ns, vm, image="registry/app:1") for vm in vms]
            yield _lines(
                "container_memory_working_set_bytes",
                _per_row(labels, codes[known]),
                _integers(usage["memory_bytes"].to_numpy()[known]),
                usage["timestamp"].to_numpy()[known],
            )

        def cfs(metric: str) -> Callable[[str, list[str], np.ndarray, pd.DataFrame], Iterator[memoryview]]:
            def write(ns: str, vms: list[str], codes: np.ndarray, usage: pd.DataFrame) -> Iterator[memoryview]:
                if metric == "periods":
                    share = np.ones(len(usage))
                else:
                    cores = usage["cpu_cores"].fillna(0.0).to_numpy()
                    share = np.clip(cores / usage["cpu_limit_cores"].to_numpy() - 0.5, 0, 1)
                values = pd.Series(3000.0 * share).groupby(codes).cumsum().to_numpy()
                sparse = _sparse(codes)
                labels = [container(ns, vm) for vm in vms]
                yield _lines(
                    f"container_cpu_cfs_{metric}_total",
                    _per_row(labels, codes[sparse]),
                    _floats(values[sparse]),
                    usage["timestamp"].to_numpy()[sparse],
                )

            return write

        def constant(
            metric: str, labels_of: Callable[[str, str], str]
        ) -> Callable[[str, list[str], np.ndarray, pd.DataFrame], Iterator[memoryview]]:
            def write(ns: str, vms: list[str], codes: np.ndarray, usage: pd.DataFrame) -> Iterator[memoryview]:
                sparse = _sparse(codes)
                labels = [labels_of(ns, vm) for vm in vms]
                ones = pa.array(np.full(sparse.size, "1"), pa.string())
                yield _lines(metric, _per_row(labels, codes[sparse]), ones, usage["timestamp"].to_numpy()[sparse])

            return write

        def limits(ns: str, vms: list[str], codes: np.ndarray, usage: pd.DataFrame) -> Iterator[memoryview]:
            sparse = _sparse(codes)
            for resource, unit, column in (
                ("cpu", "core", "cpu_limit_cores"),
                ("memory", "byte", "memory_limit_bytes"),
            ):
                labels = [container(ns, vm, node="node-0", resource=resource, unit=unit) for vm in vms]
                yield _lines(
                    "kube_pod_container_resource_limits",
                    _per_row(labels, codes[sparse]),
                    _floats(usage[column].to_numpy()[sparse]),
                    usage["timestamp"].to_numpy()[sparse],
                )

        family("container_cpu_usage_seconds", "counter", cpu)
        family("container_memory_working_set_bytes", "gauge", memory)
        family("container_cpu_cfs_periods", "counter", cfs("periods"))
        family("container_cpu_cfs_throttled_periods", "counter", cfs("throttled_periods"))
        family(
            "kube_pod_owner",
            "gauge",
            constant("kube_pod_owner", lambda ns, vm: _labels(owner_series(ns, vm, "Deployment", vm)[0])),
        )
        family(
            "kube_replicaset_owner",
            "gauge",
            constant("kube_replicaset_owner", lambda ns, vm: _labels(owner_series(ns, vm, "Deployment", vm)[1][0][1])),
        )
        family(
            "kube_pod_info",
            "gauge",
            constant(
                "kube_pod_info",
                lambda ns, vm: _labels(
                    {"namespace": ns, "pod": vm, "node": f"node-{abs(hash(vm)) % 50}", "host_ip": "10.0.0.1"}
                ),
            ),
        )
        family("kube_pod_container_resource_limits", "gauge", limits)
        out.write(b"# EOF\n")
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
