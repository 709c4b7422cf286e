"""Training from a real Prometheus, side by side in one run with the file path on the same samples and a
KRR-equivalent reference against the same Prometheus (`python -m bench prometheus-train --containers 1000`).

The fleet (`bench/prometheus_fleet.py`): real Bitbrains usage, 1,000 or 10,000 containers x 14 days, backfilled into
Debian's Prometheus with promtool and cached under ~/.cache/koord-recommender/bench-prometheus/. Each path gets a
fresh copy of that TSDB served by a fresh Prometheus with the same flags (query log on, no compaction, so nothing
but the path runs in it), and is one child process: `recommender train --prometheus-url` (ours), `python -m
bench.krr` (KRR's `simple` queries, bench/krr.py), and `recommender train --input usage.parquet` (the file path,
no Prometheus). Per path: wall time, our child's peak RSS, queries and bytes received, Prometheus' peak RSS (its
VmHWM) and CPU seconds. Runs alternate between the paths (`--runs`), since the machine is shared.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.prometheus_fleet import tidy_file, tsdb  # noqa: E402
from tests.support.prometheus_server import PrometheusServer  # noqa: E402

DAY = 86400
#: Only the blocks promtool wrote: Prometheus must not compact them while a path is measured.
NO_COMPACTION = ["--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"]
#: Runs one command under `trace_child` in a fresh parent of the standard library only: the child is forked from
#: it, and a child's ru_maxrss counts the parent's image it was forked with (a parent with pandas loaded made the
#: KRR-equivalent's 37 MiB read 110).
_MEASURE = "import sys; from bench.rss import trace_child; sys.exit(trace_child(sys.argv[1:]))"


def run_child(command: list[str], env: dict[str, str]) -> tuple[float, float, str, dict[str, Any]]:
    """Wall seconds, peak RSS (MiB), stdout and the VmRSS trace (`trace_child`) of one child process; raises if it
    fails. The child and what it starts run in a session of their own, killed whole if this run is stopped (a
    SIGTERM or Ctrl-C to the benchmark leaves no `recommender train` behind)."""
    started = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, "-c", _MEASURE, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    ) as child:
        try:
            stdout, stderr = child.communicate(timeout=3600 * 3)
        except BaseException:
            os.killpg(child.pid, signal.SIGKILL)
            raise
    elapsed = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{stderr[-3000:]}")
    traced: dict[str, Any] = json.loads(stderr.strip().splitlines()[-1])
    return elapsed, traced["peak_kib"] / 1024, stdout, traced


def where_the_peak_is(traced: dict[str, Any], every_seconds: float = 5.0) -> dict[str, Any]:
    """The RSS trace (the process and its descendants, `bench.rss.tree_rss_kib`) cut to one sample per
    `every_seconds` (and the peak sample), the last log line before the peak,
    and the stamped log lines (when each step began)."""
    trace: list[list[float]] = traced["trace"]
    if not trace:
        return {}
    top = max(trace, key=lambda x: x[1])
    kept, next_at = [], 0.0
    for t, mib in trace:
        if t >= next_at or [t, mib] == top:
            kept.append([t, mib])
            next_at = t + every_seconds
    before = [text for t, text in traced["steps"] if t <= top[0]]
    return {
        "peak_at_seconds": top[0],
        "peak_tree_rss_mib": top[1],
        "step_at_peak": before[-1] if before else None,
        "steps": traced["steps"],
        "tree_rss_mib": kept,
    }


def process_figures(pid: int) -> tuple[float, float]:
    """Peak RSS (MiB, VmHWM) and CPU seconds (user + system) of a running process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return peak, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_prometheus(data: Path, scratch: Path, run: Any) -> dict[str, Any]:
    """`run(url)`'s figures, with Prometheus' peak RSS and CPU while it ran (a fresh server on a fresh TSDB copy)."""
    server = PrometheusServer(None, scratch, copy_tsdb_from=data).start(extra_args=NO_COMPACTION)
    try:
        assert server.process is not None
        idle_rss, cpu_before = process_figures(server.process.pid)
        figures: dict[str, Any] = run(server.url)
        peak, cpu_after = process_figures(server.process.pid)
        figures.update(
            prometheus_peak_rss_mib=round(peak),
            prometheus_rss_at_start_mib=round(idle_rss),
            prometheus_cpu_seconds=round(cpu_after - cpu_before, 1),
            prometheus_queries_logged=server.queries_logged(),
        )
        return figures
    finally:
        server.stop()


def krr_pass(url: str, days: int, as_of: int) -> dict[str, Any]:
    """The KRR-equivalent reference's pass (bench/krr.py) against `url`, as one measured child."""
    command = [sys.executable, "-m", "bench.krr", url, "--history-seconds", str(days * DAY), "--as-of", str(as_of)]
    seconds, rss, out, _ = run_child(command, {})
    answer = json.loads(out.strip().splitlines()[-1])
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mib": round(rss),
        "queries": answer["queries"],
        "bytes_received": answer["bytes"],
        "containers": answer["containers"],
        "recommendations": answer["recommendations"],
    }


def main(source: Path, containers: int, days: int, runs: int, workers: int, file: bool = True) -> dict[str, object]:
    started = time.perf_counter()
    print(f"fleet of {containers} containers x {days} days (cached after the first build)", file=sys.stderr, flush=True)
    data = tsdb(source, containers, days)
    tidy = tidy_file(source, containers, days) if workers == 0 and file else None
    as_of = _as_of(data)
    script = str(Path(sys.executable).parent / "recommender")
    env = {
        # The backfill scrapes every 5 minutes, so rate() needs a window of two scrapes (as in tests/integration).
        "KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS": "600",
        "KOORD_RECOMMENDER_PROMETHEUS__HISTORY_SECONDS": str(days * DAY),
        "PYTHONPATH": str(REPO),
    }
    parallel = ["--workers", str(workers)] if workers else []
    results: dict[str, list[dict[str, Any]]] = {"ours": [], "krr_equivalent": [], "file": []}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)

        def ours(url: str) -> dict[str, Any]:
            store = scratch / f"ours-{len(results['ours'])}"
            seconds, rss, _, traced = run_child(
                [script, "train", "--prometheus-url", url, "--store", str(store), "--as-of", str(as_of), *parallel], env
            )
            manifest = json.loads(next((store / "versions").iterdir()).joinpath("manifest.json").read_text())
            return {
                "seconds": round(seconds, 1),
                "peak_rss_mib": round(rss),
                "queries": manifest["read_metrics"]["queries"],
                "bytes_received": manifest["read_metrics"]["bytes"],
                "read_seconds": manifest["read_metrics"].get("read_seconds"),
                "read_wait_seconds": manifest["read_metrics"].get("read_wait_seconds"),
                "containers": manifest["row_counts"]["workload_containers"],
                "partitions": manifest["row_counts"]["partitions"],
                "fit_metrics": {
                    k: v
                    for k, v in manifest["fit_metrics"].items()
                    if "rss" in k or k in ("fit_seconds", "partition_fit_seconds_sum")
                },
                "rss": where_the_peak_is(traced),
            }

        def krr(url: str) -> dict[str, Any]:
            return krr_pass(url, days, as_of)

        for run in range(runs):
            for name, path in (("ours", ours), ("krr_equivalent", krr)):
                before = load()
                print(f"run {run + 1}/{runs}: {name} (load {before})", file=sys.stderr, flush=True)
                figures = with_prometheus(data, scratch / f"prom-{name}-{run}", path)
                figures["load_before"] = before
                results[name].append(figures)
                print(f"  {json.dumps(figures)}", file=sys.stderr, flush=True)
            if tidy is not None:
                before = load()
                print(f"run {run + 1}/{runs}: file (load {before})", file=sys.stderr, flush=True)
                seconds, rss, _, traced = run_child(
                    [
                        script,
                        "train",
                        "--input",
                        str(tidy),
                        "--store",
                        str(scratch / f"file-{run}"),
                        "--as-of",
                        str(as_of),
                    ],
                    env,
                )
                results["file"].append(
                    {
                        "seconds": round(seconds, 1),
                        "peak_rss_mib": round(rss),
                        "load_before": before,
                        "rss": where_the_peak_is(traced),
                    }
                )
                print(f"  {json.dumps(results['file'][-1])}", file=sys.stderr, flush=True)
    best = {name: min(r["seconds"] for r in rows) for name, rows in results.items() if rows}
    return {
        "benchmark": "prometheus-train",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench prometheus-train --containers {containers} --days {days} --runs {runs}"
        + (f" --workers {workers}" if workers else "")
        + ("" if file else " --no-file"),
        "containers": containers,
        "days": days,
        "cpu_count": os.cpu_count(),
        "runs": results,
        "ratio_ours_to_krr_equivalent_seconds": [
            round(o["seconds"] / k["seconds"], 2) for o, k in zip(results["ours"], results["krr_equivalent"])
        ],
        "ratio_ours_to_krr_equivalent_prometheus_peak_rss": [
            round(o["prometheus_peak_rss_mib"] / k["prometheus_peak_rss_mib"], 2)
            for o, k in zip(results["ours"], results["krr_equivalent"])
        ],
        "best_seconds": best,
        "total_seconds": round(time.perf_counter() - started),
    }


def _to_stderr(description: str, /, *, detail: bool = False) -> None:
    """A progress sink printing each line (`recommender.progress.Step`)."""
    print(description, file=sys.stderr, flush=True)


def read_variant(name: str) -> dict[str, Any]:
    """The settings of a `--variants` name: `default`, or `cN` (N queries in flight), `eM` (M of them evaluating at
    once; default N) and `+gzip` (compressed answers), e.g. `c1+gzip` (one query at a time, gzip: main's read
    before issue 17's last part), `c2e2`."""
    if name == "default":
        return {}
    found = re.fullmatch(r"c(\d+)(?:e(\d+))?(\+gzip)?", name)
    if found is None:
        raise SystemExit(f"--variants: {name!r} is not `default` or `cN[eM][+gzip]`")
    flight = int(found.group(1))
    return {
        "concurrency": flight,
        "evaluating": int(found.group(2) or flight),
        "compress_answers": found.group(3) is not None,
    }


def bench_read(
    source: Path, containers: int, days: int, krr: bool, variants: list[str] | None = None
) -> dict[str, object]:
    """`python -m bench prometheus-read`: the streamed read of training from Prometheus without the fit (the facts
    and the newest-sample probe once, then each partition's usage as `train._stream_prometheus` cuts them), in
    this process, against a fresh Prometheus, once per variant of our settings (`read_variant`); with `krr`, the
    KRR-equivalent's whole pass against another fresh one: the read's cost per container at a size whose whole
    pass does not fit the time at hand. CPU seconds are ours (this process, `process_time`) and Prometheus'."""
    import gc

    from pipelines.partitions import plan_partitions
    from pipelines.prometheus import PrometheusClient
    from pipelines.prometheus_source import PrometheusSource
    from pipelines.settings import PrometheusSettings, ScaleSettings
    from pipelines.train import map_big_blocks, peak_rss_mib, release_freed_memory
    from recommender.progress import quiet

    data = tsdb(source, containers, days)
    as_of = _as_of(data)

    def read(url: str, overrides: dict[str, Any]) -> dict[str, Any]:
        map_big_blocks()
        Path("/proc/self/clear_refs").write_text("5")  # this variant's peak RSS, not an earlier one's
        settings = PrometheusSettings(url=url, cpu_rate_window_seconds=600, history_seconds=days * DAY, **overrides)
        end = (as_of - 1) // settings.step_seconds * settings.step_seconds
        start = end - settings.history_seconds
        started, cpu_started = time.perf_counter(), time.process_time()
        with PrometheusClient(settings) as client:
            prometheus = PrometheusSource(client, settings)
            facts = prometheus.plan(start, end, _to_stderr)
            newest = prometheus.newest_step(start, end)
            steps = (end - start) // settings.step_seconds + 1
            per_partition = max(1, ScaleSettings().partition_samples // steps)
            partitions = plan_partitions({(ns, "*"): n for ns, n in facts.containers.items()}, per_partition)
            samples = 0
            for partition in partitions:
                got = prometheus.read(start, end, quiet, facts.scoped(partition.namespaces, settings))
                samples += len(got.usage)
                del got
                gc.collect()
                release_freed_memory()
                print(f"  {partition.name}: {samples:,} samples so far", file=sys.stderr, flush=True)
            costs = client.stats.summary()
        return {
            "containers": sum(facts.containers.values()),
            "partitions": len(partitions),
            "samples": samples,
            "newest_step": newest,
            "seconds": round(time.perf_counter() - started, 1),
            "cpu_seconds": round(time.process_time() - cpu_started, 1),
            "concurrency": settings.concurrency,
            "evaluating": settings.evaluating,
            "compress_answers": settings.compress_answers,
            "peak_rss_mib": round(peak_rss_mib()),
            **costs,
        }

    def ours(overrides: dict[str, Any]) -> Any:
        return lambda url: read(url, overrides)

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        paths: list[tuple[str, Any]] = [
            ("ours_read" + ("" if name == "default" else f"_{name}"), ours(read_variant(name)))
            for name in variants or ["default"]
        ]
        paths += [("krr_equivalent", lambda url: krr_pass(url, days, as_of))] if krr else []
        for name, path in paths:
            before = load()
            print(f"{name} (load {before})", file=sys.stderr, flush=True)
            results[name] = {"load_before": before, **with_prometheus(data, Path(scratch) / name, path)}
    return {
        "benchmark": "prometheus-read",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench prometheus-read --containers {containers} --days {days}"
        + ("" if krr else " --no-krr")
        + ("" if variants in (None, ["default"]) else f" --variants {','.join(variants or [])}"),
        "runs": results,
        "ms_per_container": {
            name: round(1000 * r["seconds"] / r["containers"], 1) for name, r in results.items() if r.get("containers")
        },
    }


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _as_of(data: Path) -> int:
    """Just after the fleet's last sample: the end of the TSDB's block (its meta.json), on the 5-minute grid."""
    ends = [json.loads(meta.read_text())["maxTime"] for meta in data.glob("*/meta.json")]
    return -(-int(max(ends) // 1000) // 300) * 300 + 1


def bench_decode(series: int = 250, points: int = 4032, runs: int = 5) -> dict[str, object]:
    """`python -m bench prometheus-decode`: our streaming decoder on a range answer of real-looking samples (in 1 MiB
    chunks, as the client reads them) against the naive decoder it replaced (orjson.loads of the whole body, then
    float() per value), same process, alternating; median seconds per series and each one's peak allocation."""
    import statistics
    import tracemalloc

    import numpy as np
    import orjson

    from pipelines.prometheus import decode_matrix

    rng = np.random.default_rng(0)
    stamps = 1_375_315_200 + 300 * np.arange(points)
    result = [
        {
            "metric": {"namespace": "team-00", "pod": f"vm-{i}", "container": "main"},
            "values": [[int(t), repr(float(v))] for t, v in zip(stamps, rng.gamma(0.5, 0.6, points))],
        }
        for i in range(series)
    ]
    body = orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
    del result
    chunks = [body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)]

    def naive() -> None:
        items = orjson.loads(body)["data"]["result"]
        for item in items:
            np.array([float(v) for _, v in item["values"]])

    def ours() -> None:
        decode_matrix(chunks, "bench")

    times: dict[str, list[float]] = {"ours": [], "naive": []}
    peaks: dict[str, float] = {}
    for _ in range(runs):
        for name, function in (("ours", ours), ("naive", naive)):
            started = time.perf_counter()
            function()
            times[name].append(time.perf_counter() - started)
    for name, function in (("ours", ours), ("naive", naive)):
        tracemalloc.start()
        function()
        peaks[name] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "benchmark": "prometheus-decode",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench prometheus-decode --series {series} --points {points} --runs {runs}",
        "answer_mb": round(len(body) / 1e6, 1),
        "ms_per_series": {name: round(1000 * value / series, 2) for name, value in median.items()},
        "ratio_ours_to_naive": round(median["ours"] / median["naive"], 3),
        "peak_allocated_mib_beyond_the_body": {name: round(value) for name, value in peaks.items()},
        "load": load(),
    }
