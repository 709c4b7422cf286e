"""Training from a real Prometheus vs from a file holding the same samples, at fleet scale.

Builds >= 1,000 containers x 14 days from the shared Bitbrains trace (the first 14 days of its 250 VMs, repeated
in 4 namespaces, timestamps rounded to the 5-minute grid), writes it as a tidy file and as backfilled Prometheus
TSDB blocks (cached under bench/results/cache), then times `recommender train` on each, as child processes.
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

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support.openmetrics import write_openmetrics  # noqa: E402
from tests.support.prometheus_server import PrometheusServer  # noqa: E402

DAY = 86400


def build_fleet(source: Path, namespaces: int, days: int) -> pd.DataFrame:
    usage = pd.read_csv(source, engine="pyarrow")
    usage = usage[usage["timestamp"] < usage["timestamp"].min() + days * DAY].copy()
    usage["timestamp"] = (usage["timestamp"] // 300) * 300
    usage = usage.drop_duplicates(["workload", "pod", "container", "timestamp"])
    fleet = pd.concat([usage.assign(namespace=f"team-{i}") for i in range(namespaces)], ignore_index=True)
    return fleet.sort_values(["namespace", "workload", "pod", "container", "timestamp"])


#: Runs one command and prints its peak RSS (KiB): a fresh parent per command, so each peak is its own.
_MEASURE = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(done.returncode)"
)


def run_child(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, *command],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=3600,
        stdin=subprocess.DEVNULL,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    peak_kib = int(done.stderr.strip().splitlines()[-1])
    return elapsed, peak_kib / 1024, done.stderr


def main(source: Path, namespaces: int = 4, days: int = 14) -> dict[str, object]:
    cache = REPO / "bench" / "results" / "cache" / f"bitbrains-{namespaces}x{days}d"
    cache.mkdir(parents=True, exist_ok=True)
    tidy = cache / "usage.csv.gz"
    fleet = build_fleet(source, namespaces, days)
    containers = fleet.groupby(["namespace", "workload", "container"]).ngroups
    if not tidy.exists():
        print(f"writing {len(fleet):,} rows for {containers} containers", file=sys.stderr)
        fleet.to_csv(tidy, index=False)
    tsdb = cache / "tsdb"
    if not tsdb.exists():
        metrics = cache / "metrics.om"
        if not metrics.exists():
            kinds = {key: "Deployment" for key in fleet.groupby(["namespace", "workload"]).groups}
            print("writing OpenMetrics", file=sys.stderr)
            write_openmetrics(fleet, kinds, metrics.with_suffix(".tmp"), decoys=False)
            metrics.with_suffix(".tmp").rename(metrics)
        print("backfilling with promtool", file=sys.stderr)
        PrometheusServer(metrics, cache / "build")
        (cache / "build" / "tsdb").rename(tsdb)
        metrics.unlink()
    as_of = int(fleet["timestamp"].max()) + 1
    script = str(Path(sys.executable).parent / "recommender")
    with tempfile.TemporaryDirectory() as scratch:
        server = PrometheusServer(None, Path(scratch) / "prom", copy_tsdb_from=tsdb).start()
        try:
            env = {
                "KOORD_RECOMMENDER_PROMETHEUS__CPU_RATE_WINDOW_SECONDS": "600",
                "KOORD_RECOMMENDER_PROMETHEUS__HISTORY_SECONDS": str(days * DAY),
            }
            prom_seconds, prom_rss, _ = run_child(
                [script, "train", "--prometheus-url", server.url, "--store", f"{scratch}/p", "--as-of", str(as_of)], env
            )
        finally:
            server.stop()
        file_seconds, file_rss, _ = run_child([script, "train", "--input", str(tidy), "--store", f"{scratch}/f", "--as-of", str(as_of)], {})
        manifest = json.loads(next(Path(f"{scratch}/p/versions").iterdir()).joinpath("manifest.json").read_text())
    queries = manifest["read_metrics"]["queries"]
    return {
        "benchmark": "prometheus",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m bench prometheus",
        "containers": containers,
        "days": days,
        "samples": len(fleet),
        "prometheus_seconds": round(prom_seconds, 1),
        "prometheus_peak_rss_mib": round(prom_rss),
        "file_seconds": round(file_seconds, 1),
        "file_peak_rss_mib": round(file_rss),
        "ratio_prometheus_to_file": round(prom_seconds / file_seconds, 2),
        "queries": queries,
        "containers_per_query": round(containers / queries, 1),
        "bytes_received": manifest["read_metrics"]["bytes"],
        "workload_containers_trained": manifest["row_counts"]["workload_containers"],
    }
