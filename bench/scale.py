"""Distributed training at 1k, 10k and 50k containers on 1, 2 and 4 Dask workers (`python -m bench scale`).

The synthetic fleet resamples the shared Bitbrains trace (250 VMs, 5-minute samples): container i copies a VM
picked at random, from a random start inside its 30 days (time shift), times a log-normal size factor (sigma 0.5,
applied to CPU, memory and limits alike), times 1 + N(0, 0.05) noise per sample (clipped at 0), on a common
5-minute grid of `--days` days. 100 containers per namespace, one pod per workload. The history is shorter than a
real fleet's (weeks of 1-minute samples) so that the whole matrix runs in well under an hour on 2 shared cores:
the forecast settings are cut to match (1 selection day, 1 seasonal day, no STL, no boosted model), which keeps
each container's work the same kind as in production, only less of it.

Each cell runs `recommender train --input FLEET --workers N` as a child process (wall time from outside; the peak
memory of each worker and of the driver are read back from the version's manifest, which records them via
Linux's VmHWM), and, as the reference measured in the same run, the single-process `recommender train` at the
sizes given by `--reference-sizes`. Results go to bench/results/scale.json and a chart to docs/images/results/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
STEP = 300
DAY = 86400
START = 1_700_000_000 // DAY * DAY
PER_NAMESPACE = 100
#: Forecast settings cut to the short synthetic history (see the module docstring).
ENV = {
    "KOORD_RECOMMENDER_FORECAST__SELECTION_DAYS": "1",
    "KOORD_RECOMMENDER_FORECAST__SEASONAL_DAYS": "1",
    "KOORD_RECOMMENDER_FORECAST__USE_STL": "false",
    "KOORD_RECOMMENDER_FORECAST__USE_BOOSTING": "false",
    "KOORD_RECOMMENDER_RESERVATION__SEASONAL_DAYS": "1",
}


def source_grid(trace: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trace's VMs on a 5-minute grid: cpu and memory (VMs x steps, NaN where missing) and their limits."""
    usage = pd.read_csv(trace, engine="pyarrow")
    usage["step"] = (usage["timestamp"] - usage["timestamp"].min()) // STEP
    vms = pd.Index(sorted(usage["workload"].unique()))
    rows = vms.get_indexer(usage["workload"])
    steps = int(usage["step"].max()) + 1
    cpu, memory = np.full((len(vms), steps), np.nan), np.full((len(vms), steps), np.nan)
    cpu[rows, usage["step"]] = usage["cpu_cores"]
    memory[rows, usage["step"]] = usage["memory_bytes"]
    limits = usage.groupby("workload")[["cpu_limit_cores", "memory_limit_bytes"]].last().reindex(vms)
    return cpu, memory, limits["cpu_limit_cores"].to_numpy(), limits["memory_limit_bytes"].to_numpy()


def write_fleet(trace: Path, containers: int, days: float, out: Path, seed: int = 0) -> int:
    """The synthetic fleet (see the module docstring) as Parquet, 1,000 containers per row group; returns rows."""
    cpu, memory, cpu_limit, memory_limit = source_grid(trace)
    steps = int(days * DAY / STEP)
    rng = np.random.default_rng(seed)
    rows = 0
    with pq.ParquetWriter(out, _schema()) as writer:
        for first in range(0, containers, 1000):
            ids = np.arange(first, min(first + 1000, containers))
            vm = rng.integers(0, cpu.shape[0], ids.size)
            shift = rng.integers(0, cpu.shape[1] - steps, ids.size)
            scale = rng.lognormal(0.0, 0.5, ids.size)
            window = shift[:, None] + np.arange(steps)[None, :]
            noise = 1 + rng.normal(0, 0.05, (ids.size, steps))
            chunk_cpu = np.clip(cpu[vm[:, None], window] * scale[:, None] * noise, 0, None)
            chunk_memory = np.clip(memory[vm[:, None], window] * scale[:, None] * noise, 0, None)
            known = ~(np.isnan(chunk_cpu) | np.isnan(chunk_memory))
            container, step = np.nonzero(known)
            names = np.array([f"svc-{i}" for i in ids], dtype=object)
            table = pa.table(
                {
                    "timestamp": START + step.astype(np.int64) * STEP,
                    "namespace": np.array([f"team-{i // PER_NAMESPACE}" for i in ids], dtype=object)[container],
                    "workload": names[container],
                    "pod": np.char.add(names[container].astype(str), "-0").astype(object),
                    "container": np.full(container.size, "main", dtype=object),
                    "cpu_cores": chunk_cpu[known],
                    "memory_bytes": chunk_memory[known],
                    "cpu_limit_cores": (cpu_limit[vm] * scale)[container],
                    "memory_limit_bytes": (memory_limit[vm] * scale)[container],
                },
                schema=_schema(),
            )
            writer.write_table(table)
            rows += table.num_rows
    return rows


def _schema() -> pa.Schema:
    ids = [(name, pa.string()) for name in ("namespace", "workload", "pod", "container")]
    values = [(name, pa.float64()) for name in ("cpu_cores", "memory_bytes", "cpu_limit_cores", "memory_limit_bytes")]
    return pa.schema([("timestamp", pa.int64()), *ids, *values])


def train(fleet: Path, workers: int, partition: int, timeout: float) -> dict[str, Any]:
    """One `recommender train` child: wall seconds and the manifest's counts and memory figures."""
    script = str(Path(sys.executable).parent / "recommender")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as scratch:
        store = Path(scratch) / "store"
        command = ["nice", "-n", "10", script, "train", "--input", str(fleet), "--store", str(store), "--horizon", "1h"]
        if workers:
            command += ["--workers", str(workers), "--partition-containers", str(partition)]
        started = time.perf_counter()
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **ENV},
            stdin=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
        version = (store / "latest").read_text().strip()
        manifest = json.loads((store / "versions" / version / "manifest.json").read_text())
    metrics = manifest["fit_metrics"]
    return {
        "workers": workers,
        "wall_seconds": round(wall, 1),
        "fit_seconds": metrics["fit_seconds"],
        "containers": manifest["row_counts"]["workload_containers"],
        "partitions": manifest["row_counts"].get("partitions", 1),
        "worker_peak_rss_mib_max": metrics.get("worker_peak_rss_mib_max"),
        "worker_peak_rss_mib_sum": metrics.get("worker_peak_rss_mib_sum"),
        "driver_peak_rss_mib": metrics.get("driver_peak_rss_mib"),
    }


def main(
    trace: Path, sizes: list[int], workers: list[int], reference_sizes: list[int], days: float, partition: int
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "benchmark": "scale",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench scale --sizes {','.join(map(str, sizes))} --workers {','.join(map(str, workers))} "
        f"--reference-sizes {','.join(map(str, reference_sizes))} --days {days:g} --partition-containers {partition}",
        "cpu_count": os.cpu_count(),
        "settings": ENV,
        "runs": [],
    }
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
        for size in sizes:
            fleet = Path(scratch) / f"fleet-{size}.parquet"
            started = time.perf_counter()
            rows = write_fleet(trace, size, days, fleet)
            print(f"{size} containers: {rows:,} rows in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            for count in ([0] if size in reference_sizes else []) + workers:
                run = {"size": size, "rows": rows, **train(fleet, count, partition, timeout=3600)}
                print(json.dumps(run), file=sys.stderr)
                result["runs"].append(run)
                (out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
            fleet.unlink()
    plot(result, REPO / "docs" / "images" / "results" / "scale.png")
    return result


def plot(result: dict[str, Any], path: Path) -> None:
    """Wall time and peak memory per worker against fleet size, one line per worker count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = pd.DataFrame(result["runs"])
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, (key, group) in enumerate(runs.groupby("workers")):
        workers = int(str(key))  # the column holds worker counts
        label = "single process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
        left.plot(group["size"], group["wall_seconds"], marker="o", label=label, color=f"C{index}")
        if workers:
            right.plot(group["size"], group["worker_peak_rss_mib_max"], marker="o", label=label, color=f"C{index}")
    sizes = np.array(sorted(runs["size"].unique()), dtype=float)
    one = runs[(runs["workers"] == 1)].set_index("size")["wall_seconds"]
    if sizes.min() in one.index:
        left.plot(sizes, one[sizes.min()] * sizes / sizes.min(), "k:", label="linear from 1 worker at 1k")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("containers")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    left.set_yscale("log")
    left.set_ylabel("wall seconds (recommender train)")
    right.set_ylabel("peak RSS of the largest worker, MiB")
    right.set_ylim(bottom=0)
    figure.suptitle(
        f"Distributed training, synthetic fleet from Bitbrains ({result['date'][:10]}, {result['cpu_count']} cores)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
