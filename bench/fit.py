"""`python -m bench fit`: the workload model's fit alone, on rows already in memory, next to a KRR-equivalent
computation on the same rows (per container the 95th percentile of CPU and the max of memory, KRR's `simple`
strategy, one pandas groupby), in the same process and run.

Reading and validating the file happen once, before any timing, so what is timed is our fit's own CPU time and wall
time: the per-sample part (histograms, reservations, pod states, the VPA policy, the usage grids: `fit` without the
forecasts) and the forecast fit (`fit_fleet_forecasts`: every candidate backtested at the rolling origins, chosen
and calibrated for the fleet, CPU and memory in two threads). CPU seconds are the process' (all threads). The peak
is the process' resident memory during the fit (sampled every 50 ms from /proc/self/status), with the rows held,
and how far above the resident memory before the run it went.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(start: tuple[float, float]) -> tuple[float, float]:
    wall, cpu = _clock()
    return round(wall - start[0], 2), round(cpu - start[1], 2)


def resident_mib() -> float:
    """This process' resident memory now (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class PeakResident:
    """The highest `resident_mib` seen while the block runs, sampled by a thread every 50 ms."""

    def __enter__(self) -> PeakResident:
        self.peak = resident_mib()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, resident_mib())

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, resident_mib())


def krr_simple(usage: pd.DataFrame) -> pd.DataFrame:
    """KRR's `simple` recommendation per container: the 95th percentile of its CPU and the max of its memory."""
    by_container = usage.groupby(["namespace", "workload", "container"], sort=False, observed=True)
    return pd.DataFrame({"cpu": by_container["cpu_cores"].quantile(0.95), "memory": by_container["memory_bytes"].max()})


def main(input_path: Path, runs: int, as_of: int | None, tile: int = 0) -> dict[str, object]:
    """`tile` N > 0: the fleet's forecast choice alone on the rows fitted in partitions by namespace (as the
    Prometheus stream cuts them), the partitions repeated N times (the same grids, so a fleet N times the size at
    the cost of one), its CPU, wall and peak resident memory above the process before it."""
    if tile:
        return fleet_choice(input_path, runs, as_of, tile)
    from models.workload import fit_fleet_forecasts
    from pipelines.ingest import SampleBounds, read_usage
    from pipelines.settings import TrainingSettings
    from pipelines.train import new_workload_model

    settings = TrainingSettings()
    print(f"reading {input_path}", file=sys.stderr, flush=True)
    usage = read_usage(input_path, SampleBounds.at(settings.ingest, time.time()))
    if as_of is not None:
        usage = usage[usage["timestamp"] < as_of].reset_index(drop=True)
    print(f"{len(usage):,} rows; {runs} runs", file=sys.stderr, flush=True)
    rows: list[dict[str, float]] = []
    for run in range(runs):
        before = resident_mib()
        with PeakResident() as resident:
            start = _clock()
            model = new_workload_model(settings).fit(usage, fit_forecasts=False)
            per_sample = _since(start)
            start = _clock()
            fit_fleet_forecasts([model])
            forecasts = _since(start)
        del model
        start = _clock()
        krr_simple(usage)
        reference = _since(start)
        row = {
            "per_sample_wall_seconds": per_sample[0],
            "per_sample_cpu_seconds": per_sample[1],
            "forecast_wall_seconds": forecasts[0],
            "forecast_cpu_seconds": forecasts[1],
            "fit_wall_seconds": round(per_sample[0] + forecasts[0], 2),
            "fit_cpu_seconds": round(per_sample[1] + forecasts[1], 2),
            "fit_peak_rss_mib": round(resident.peak),
            "fit_rss_above_start_mib": round(resident.peak - before),
            "krr_simple_wall_seconds": reference[0],
            "ratio_fit_to_krr_simple_wall": round((per_sample[0] + forecasts[0]) / max(reference[0], 1e-9), 1),
        }
        rows.append(row)
        print(f"run {run + 1}/{runs}: {row}", file=sys.stderr, flush=True)
    return {
        "benchmark": "fit",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench fit --input {input_path} --runs {runs}" + (f" --as-of {as_of}" if as_of else ""),
        "rows": len(usage),
        "containers": int(usage.groupby(["namespace", "workload", "container"], observed=True).ngroups),
        "runs": rows,
        "median": {key: statistics.median(row[key] for row in rows) for key in rows[0]},
    }


def fleet_choice(input_path: Path, runs: int, as_of: int | None, tile: int) -> dict[str, object]:
    import copy

    from models.workload import fit_fleet_forecasts
    from pipelines.ingest import SampleBounds, read_usage
    from pipelines.settings import TrainingSettings
    from pipelines.train import map_big_blocks, new_workload_model

    map_big_blocks()  # as a streamed run: freed big blocks leave the process, so the peak is the choice's own
    settings = TrainingSettings()
    usage = read_usage(input_path, SampleBounds.at(settings.ingest, time.time()))
    if as_of is not None:
        usage = usage[usage["timestamp"] < as_of].reset_index(drop=True)
    end = int(usage["timestamp"].max())
    parts = [
        new_workload_model(settings).fit(rows.reset_index(drop=True), data_end=end, fit_forecasts=False)
        for _, rows in usage.groupby("namespace", sort=True, observed=True)
    ]
    del usage
    containers = tile * sum(len(part.forecast_groups_) for part in parts)
    print(f"{len(parts)} partitions x {tile}: {containers:,} containers; {runs} runs", file=sys.stderr, flush=True)
    rows: list[dict[str, float]] = []
    for run in range(runs):
        models = [copy.copy(part) for _ in range(tile) for part in parts]
        before = resident_mib()
        with PeakResident() as resident:
            start = _clock()
            fit_fleet_forecasts(models)
            wall, cpu = _since(start)
        del models
        row = {
            "forecast_wall_seconds": wall,
            "forecast_cpu_seconds": cpu,
            "peak_rss_above_start_mib": round(resident.peak - before),
            # The reference, a structure of the fleet's size: both resources' usage grids (each partition's N times).
            "grids_mib": round(tile * sum(p.cpu_grid_.nbytes + p.memory_grid_.nbytes for p in parts) / 2**20),
        }
        rows.append(row)
        print(f"run {run + 1}/{runs}: {row}", file=sys.stderr, flush=True)
    return {
        "benchmark": "fit-fleet-choice",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench fit --input {input_path} --runs {runs} --tile {tile}"
        + (f" --as-of {as_of}" if as_of else ""),
        "partitions": len(parts) * tile,
        "containers": containers,
        "runs": rows,
        "median": {key: statistics.median(row[key] for row in rows) for key in rows[0]},
    }
