"""The live loop's figures: its cost per pass on a real Prometheus (`live-cost`) and its reaction to a step up
against VPA's rule replayed on the same samples (`live-reaction`).

`python -m bench live-cost --containers 1000 --passes 11`: the fleet of `prometheus-train` (cached TSDB), a version
trained on its 14 days but the last `passes` steps by the streaming Prometheus path (`recommender train
--prometheus-url`, a measured child: its wall, CPU, peak RSS and queries are in the result; cached beside the
fleet), then `passes` passes of `LiveLoop` with a clock that moves one 5-minute step per pass (each reads one new
step of every container, as a pass does at `prometheus.step_seconds` = 60 every minute). Per pass: wall and CPU
seconds (ours and Prometheus'), queries, bytes received, the update's size; the checkpoint (every 5 minutes) on its
own. The reference, in the same run (`--no-reference` leaves it out): bringing the lines up to date the daily way
(`train --incremental` over the same steps: read, partial_fit, refit).

`python -m bench live-cost --containers 10000 --model-only`: the model part of each pass only (`LiveLoop.apply`:
live_update, predict, publish) on the same version, with the fleet's file's samples of the same steps.

`python -m bench live-reaction`: a container at 0.5 cores for 8 days that steps to 1.0 (synthetic), and the first
sustained burst of a real trace (`google-2019`, the bundled data); after each 5-minute step the loop's model
(`live_update`) and one sized by VPA's rule (`request_policy=vpa`: VPA's decaying histogram, p90 + 15 %) are
continued with the same samples. Reaction: time from the step until the request (and our short-term line) covers
the new level.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.prometheus import (
    NO_COMPACTION,
    _as_of,
    load,
    process_figures,
    run_child,
    where_the_peak_is,
    with_prometheus,
)
from bench.prometheus_fleet import CACHE, DAY, STEP, tidy_file, tsdb
from cli.settings import Settings
from models.settings import StoreSettings
from models.store import ModelStore
from models.workload import WorkloadRecommender
from pipelines.live import LiveLoop
from pipelines.settings import LiveSettings, PrometheusSettings
from pipelines.train import train_from_prometheus
from tests.support.prometheus_server import PrometheusServer

REPO = Path(__file__).resolve().parent.parent


def _settings(url: str, store: Path, days: int) -> Settings:
    return Settings(
        store=StoreSettings(path=str(store)),
        # The backfill scrapes every 5 minutes, so rate() needs a window of two scrapes (as in prometheus-train).
        prometheus=PrometheusSettings(url=url, cpu_rate_window_seconds=600, history_seconds=days * DAY),
        # The checkpoint (every 5 minutes, so one pass in five at a 1-minute interval) is measured on its own.
        live=LiveSettings(
            read_lag_seconds=0, leader_election=False, metrics_port=None, checkpoint_interval_seconds=10 * DAY
        ),
    )


def _base(data: Path, containers: int, days: int, start_live: int) -> tuple[Path, dict[str, Any] | None]:
    """The version the loop continues, trained by the streaming Prometheus path (`recommender train --prometheus-url`,
    one measured child against a fresh Prometheus over the fleet's TSDB, as in `prometheus-train`) on the samples
    before `start_live`, and cached beside the fleet; and that training pass's figures (wall, CPU, peak RSS,
    queries), kept beside the version so a cached one still reports them."""
    base = CACHE / f"bitbrains-{containers}x{days}d" / f"live-base-prometheus-{start_live}"
    figures_file = base / "training.json"
    if base.exists():
        return base, json.loads(figures_file.read_text()) if figures_file.exists() else None
    print(f"training the version on the days before {start_live} (cached in {base})", file=sys.stderr, flush=True)
    building = base.with_name(base.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    env = {
        "KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS": "600",
        "KOORD_RECOMMENDER_PROMETHEUS__HISTORY_SECONDS": str(days * DAY),
    }
    script = str(Path(sys.executable).parent / "recommender")

    def train(url: str) -> dict[str, Any]:
        before = load()
        command = [script, "train", "--prometheus-url", url, "--store", str(building), "--as-of", str(start_live + 1)]
        seconds, rss, _, traced = run_child(command, env)
        manifest = json.loads(next((building / "versions").iterdir()).joinpath("manifest.json").read_text())
        return {
            "command": f"recommender train --prometheus-url URL --as-of {start_live + 1} (streaming path)",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_before": before,
            "load_after": load(),
            "seconds": round(seconds, 1),
            "cpu_seconds": traced.get("cpu_seconds"),
            "peak_rss_mib": round(rss),
            "queries": manifest["read_metrics"]["queries"],
            "bytes_received": manifest["read_metrics"]["bytes"],
            "containers": manifest["row_counts"]["workload_containers"],
            "partitions": manifest["row_counts"]["partitions"],
            "rss": {k: v for k, v in where_the_peak_is(traced, every_seconds=30.0).items() if k != "steps"},
        }

    with tempfile.TemporaryDirectory() as scratch:
        figures = with_prometheus(data, Path(scratch) / "prometheus", train)
    figures_file = building / "training.json"
    figures_file.write_text(json.dumps(figures, indent=2) + "\n")
    building.rename(base)
    print(f"trained: {json.dumps(figures)}", file=sys.stderr, flush=True)
    return base, figures


def bench_model_part(source: Path, containers: int, passes: int, days: int = 14) -> dict[str, object]:
    """`live-cost --model-only`: a pass without its Prometheus read, for fleets whose TSDB is not built. The same
    version as `live-cost`'s (trained from the fleet's file up to the same step), then `passes` passes of
    `LiveLoop.apply` (live_update, predict, publish: the loop's own code after its read) with the file's samples of
    one new 5-minute step each; the read's cost is what `live-cost` measures at the size it can."""
    data = tsdb(source, containers, days)
    tidy = tidy_file(source, containers, days)
    end, start_live = _live_window(data, passes)
    base, training = _base(data, containers, days, start_live)
    steps = pd.read_parquet(tidy, filters=[("timestamp", ">", start_live), ("timestamp", "<=", end)])
    with tempfile.TemporaryDirectory() as scratch_dir:
        live_store = Path(scratch_dir) / "live"
        shutil.copytree(base, live_store)
        store = ModelStore(live_store)
        now = [float(store.manifest().data_window.last_sample)]
        loop = LiveLoop(_settings("http://unused", live_store, days), store, clock=lambda: now[0])
        loaded = time.perf_counter()
        loop.state = loop.resume(now[0])
        load_seconds = time.perf_counter() - loaded
        rows = []
        for index in range(passes):
            now[0] += STEP
            at = start_live + (index + 1) * STEP
            usage = steps[steps["timestamp"] == at].reset_index(drop=True)
            phases: dict[str, float] = {}
            cpu = time.process_time()
            update = loop.apply(usage, usage.iloc[:0], at, {}, phases)
            assert update is not None
            rows.append(
                {
                    **{f"{name}_seconds": round(value, 3) for name, value in phases.items()},
                    "cpu_seconds": round(time.process_time() - cpu, 3),
                    "rows": len(usage),
                    "update_bytes": update.entry.bytes,
                }
            )
            print(f"pass {index + 1}/{passes}: {rows[-1]}", file=sys.stderr, flush=True)
        checkpoint = _checkpoint(loop, live_store)
    steady = rows[1:] or rows
    median = {key: float(np.median([r[key] for r in steady])) for key in steady[0]}
    return {
        **_cost_header(containers, passes, " --model-only"),
        "measured": "the model part of a pass (LiveLoop.apply), not its Prometheus read",
        "version_training": training,
        "version_load_seconds": round(load_seconds, 2),
        "first_pass": rows[0],
        "median_pass_after_the_first": median,
        "checkpoint": checkpoint,
        "share_of_a_60s_interval_cpu": _cpu_share(median, checkpoint),
        "passes": rows,
    }


def _checkpoint(loop: LiveLoop, store: Path) -> dict[str, float]:
    """One checkpoint of the loop's state: wall and CPU seconds, bytes."""
    began, cpu = time.perf_counter(), time.process_time()
    loop.checkpoint()
    return {
        "seconds": round(time.perf_counter() - began, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "bytes": (store / "live" / "checkpoint.joblib").stat().st_size,
    }


def _cpu_share(median: dict[str, float], checkpoint: dict[str, float]) -> float:
    """Our CPU per minute over 60 s: a pass, and a fifth of a checkpoint (one every 5 minutes, the default)."""
    return round((median["cpu_seconds"] + checkpoint["cpu_seconds"] / 5) / 60, 4)


def _live_window(data: Path, passes: int) -> tuple[int, int]:
    """The last step the passes read and the step the version ends at: the fleet's last step but one (a series read
    at its very last step has no sample inside the range), `passes` 5-minute steps after the version. Both modes
    use it, so they continue one cached version."""
    end = _as_of(data) - 1 - STEP
    return end, end - passes * STEP


def _cost_header(containers: int, passes: int, flags: str) -> dict[str, Any]:
    """The command, date, load and fleet a `live-cost` result opens with."""
    return {
        "command": f"python -m bench live-cost --containers {containers} --passes {passes}{flags}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "load_before": load(),
        "cpus": os.cpu_count(),
        "containers": containers,
    }


def bench_cost(source: Path, containers: int, passes: int, days: int = 14, reference: bool = True) -> dict[str, object]:
    data = tsdb(source, containers, days)
    end, start_live = _live_window(data, passes)
    base, training = _base(data, containers, days, start_live)
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        server = PrometheusServer(None, scratch / "prometheus", copy_tsdb_from=data).start(extra_args=NO_COMPACTION)
        try:
            assert server.process is not None
            live_store = scratch / "live"
            shutil.copytree(base, live_store)
            now = [float(ModelStore(live_store).manifest().data_window.last_sample)]
            settings = _settings(server.url, live_store, days)
            loop = LiveLoop(settings, ModelStore(live_store), clock=lambda: now[0])
            rows = []
            for index in range(passes):
                now[0] += STEP
                _, prometheus_cpu = process_figures(server.process.pid)
                cpu = time.process_time()
                report = loop.step()
                ours_cpu = time.process_time() - cpu
                _, prometheus_after = process_figures(server.process.pid)
                assert report is not None and report.update is not None
                rows.append(
                    {
                        "seconds": round(report.seconds, 3),
                        "cpu_seconds": round(ours_cpu, 3),
                        "prometheus_cpu_seconds": round(prometheus_after - prometheus_cpu, 3),
                        "queries": report.costs["queries"],
                        "bytes": report.costs["bytes"],
                        "rows": report.rows,
                        "update_bytes": report.update.entry.bytes,
                        **{f"{name}_seconds": round(value, 3) for name, value in report.phases.items()},
                    }
                )
                print(f"pass {index + 1}/{passes}: {rows[-1]}", file=sys.stderr, flush=True)
            checkpoint = _checkpoint(loop, live_store)
            # The reference: the daily path brought up to date over the same hour (read, partial_fit, refit).
            compared = _reference(server.url, base, scratch / "reference", days, end) if reference else None
        finally:
            server.stop()
    steady = rows[1:] or rows
    median = {key: float(np.median([r[key] for r in steady])) for key in steady[0]}
    return {
        **_cost_header(containers, passes, "" if reference else " --no-reference"),
        "version_training": training,
        "first_pass": rows[0],
        "median_pass_after_the_first": median,
        "share_of_a_60s_interval": round(median["seconds"] / 60, 4),
        "share_of_a_60s_interval_cpu": _cpu_share(median, checkpoint),
        "checkpoint": checkpoint,
        "reference_incremental_train_over_the_same_steps": compared,
        "ratio_pass_to_reference_seconds": round(median["seconds"] / compared["seconds"], 4) if compared else None,
        "passes": rows,
    }


def _reference(url: str, base: Path, store: Path, days: int, end: int) -> dict[str, Any]:
    """`train --incremental` from `base` up to `end` against `url`: the daily way of bringing the lines up to date."""
    shutil.copytree(base, store)
    began = time.perf_counter()
    cpu = time.process_time()
    _, costs = train_from_prometheus(_settings(url, store, days), as_of=end + 1, incremental=True)
    return {
        "seconds": round(time.perf_counter() - began, 2),
        "cpu_seconds": round(time.process_time() - cpu, 2),
        "queries": costs["queries"],
        "bytes": costs["bytes"],
    }


# -- reaction ------------------------------------------------------------------------------------------------
def _synthetic() -> tuple[pd.DataFrame, int, float]:
    """8 days at 0.5 cores (5 % noise), then 1.0: the usage, the step's time and the new level."""
    rng = np.random.default_rng(7)
    start = 1_700_000_000 // DAY * DAY
    times = np.arange(start, start + 9 * DAY, STEP)
    step_at = start + 8 * DAY + 9 * 3600
    cpu = np.where(times >= step_at, 1.0, 0.5) * (1 + 0.05 * rng.standard_normal(times.size))
    usage = pd.DataFrame(
        {
            "timestamp": times,
            "namespace": "synthetic",
            "workload": "step",
            "pod": "step-0",
            "container": "main",
            "cpu_cores": np.maximum(cpu, 0.0),
            "memory_bytes": 5e8,
        }
    )
    return usage, int(step_at), 1.0


def _real_burst(path: Path) -> tuple[pd.DataFrame, int, float, str]:
    """The first container of the trace whose 6 hours after some hour run at least twice the day before (median
    over median, from at least 0.05 cores), with 8 days before it: its usage, the burst's start, its level (median of the 6 hours) and name."""
    usage = pd.read_csv(path, engine="pyarrow")
    for key, rows in usage.groupby(["namespace", "workload", "pod", "container"], sort=True):
        rows = rows.sort_values("timestamp")
        series = rows.set_index("timestamp")["cpu_cores"]
        times = series.index.to_numpy()
        hours = np.unique(times[times >= times[0] + 8 * DAY] // 3600 * 3600)
        for hour in hours:
            first = times[times >= hour]
            if not first.size:
                break
            at = int(first[0])
            before = series[(times >= at - DAY) & (times < at)]
            after = series[(times >= at) & (times < at + 6 * 3600)]
            if len(before) > 200 and len(after) > 60 and after.median() >= 2 * before.median() >= 0.1:
                window = rows[(rows["timestamp"] >= at - 8 * DAY) & (rows["timestamp"] < at + 12 * 3600)]
                return window, int(at), float(after.median()), "/".join(map(str, key))
    raise SystemExit(f"{path}: no sustained burst found")


def _replay(usage: pd.DataFrame, step_at: int, level: float) -> dict[str, Any]:
    """Both models fitted before the step, then continued step by step: when each covers `level`."""
    history = usage[usage["timestamp"] < step_at]
    after = usage[usage["timestamp"] >= step_at]
    ours = WorkloadRecommender().fit(history)
    vpa = WorkloadRecommender(request_policy="vpa").fit(history)
    reached = after[after["cpu_cores"] >= level]["timestamp"]
    # The soonest any rule can follow: the first 5-minute sample at the level.
    usage_reached = round((int(reached.min()) + STEP - step_at) / 3600, 3) if len(reached) else None
    found: dict[str, float | None] = {"ours_request": None, "ours_short_term": None, "vpa_request": None}
    timeline = []
    for t in sorted(after["timestamp"].unique()):
        rows = after[after["timestamp"] == t]
        ours.live_update(rows)
        vpa.live_update(rows)
        mine, theirs = ours.predict().recommendations[0].cpu, vpa.predict().recommendations[0].cpu
        assert mine is not None and theirs is not None
        elapsed = (t + STEP - step_at) / 3600  # the sample at t covers the 5 minutes before it
        for name, value in (
            ("ours_request", mine.target),
            ("ours_short_term", mine.short_term[0]),
            ("vpa_request", theirs.target),
        ):
            if found[name] is None and value >= level:
                found[name] = round(elapsed, 3)
        timeline.append(
            (round(elapsed, 3), round(mine.target, 3), round(mine.short_term[0], 3), round(theirs.target, 3))
        )
        if all(v is not None for v in found.values()):
            break
    return {
        "level_cores": round(level, 3),
        "hours_until_usage_reached_it": usage_reached,
        "hours_until_covered": found,
        "first_steps": timeline[:6],
    }


def bench_reaction(trace: Path) -> dict[str, object]:
    usage, step_at, level = _synthetic()
    synthetic = _replay(usage, step_at, level)
    real, at, real_level, name = _real_burst(trace)
    burst = _replay(real, at, real_level)
    return {
        "command": "python -m bench live-reaction",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "synthetic_step_0.5_to_1.0_cores": synthetic,
        "real_burst": {"container": name, "trace": trace.parent.name, "at": at, **burst},
        "note": "ours: the live loop's model (live_update, no refit); vpa: VPA's rule (request_policy=vpa) on the "
        "same 5-minute samples; hours from the step until the request (or our short-term line) covers the level",
    }
