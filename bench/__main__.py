"""Benchmarks, each next to a reference measured in the same run: `recommend`, `prometheus-train` (bench/prometheus.py:
training from a real Prometheus vs the file path and a KRR-equivalent reference; `prometheus-read`, its streamed read
alone vs the KRR-equivalent, for fleets whose whole pass takes too long), `scale` (bench/scale.py: distributed
training at 1k-50k containers on
1-4 Dask workers), `live-line` (bench/live_line.py: the learned live line's fit and cost per pass), `live-cost` and
`live-reaction` (bench/live.py: the live loop's cost per pass, and its reaction
to a step up against VPA's rule), and (bench/serving.py) the `webhook`, `extender` and `rest` consumers
over TLS, or `serving` for all three on one rig, and `isolation` (small reviews and probes while big reviews run).

`fit` (bench/fit.py: the workload model's fit alone, on rows in memory, next to KRR's `simple` on the same rows;
`--tile N`: the fleet's forecast choice alone on N copies of the partitions, its CPU and memory).

`python -m bench recommend [--input FILE] [--runs 3]` times the real console script end to end
(`recommender recommend ... --horizon 24h`) and, as the reference, a bare pandas+pyarrow read of the same file
in a fresh interpreter: the ratio says what our work costs on top of just loading the data. Peak memory is the
child's max RSS. Results are printed and written to bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED_INPUT = REPO.parent / "shared" / "data" / "bitbrains-aug" / "usage.csv.gz"
#: The shared Bitbrains month where this workspace has it (the figures in docs/benchmarks.md), else the Google slice
#: the repository ships: a fresh clone's `make bench` runs on what it has.
DEFAULT_INPUT = SHARED_INPUT if SHARED_INPUT.is_file() else REPO / "data" / "google-2019" / "usage.csv.gz"
RESULTS = REPO / "bench" / "results"


def timed(command: list[str], timeout: float) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    elapsed = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"benchmark command failed: {' '.join(command)}\n{completed.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return elapsed, max(peak, before) / 1024


def bench_recommend(input_path: Path, runs: int, as_of: int | None) -> dict[str, object]:
    script = str(Path(sys.executable).parent / "recommender")
    if as_of is None:
        import pandas as pd

        stamps = pd.read_csv(input_path, usecols=["timestamp"], engine="pyarrow")["timestamp"]
        as_of = int(stamps.max()) + 1
    reference = [sys.executable, "-c", f"import pandas as pd; pd.read_csv({str(input_path)!r}, engine='pyarrow')"]
    ours_times, reference_times, peaks = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        output = str(Path(scratch) / "out.json")
        command = [
            script,
            "recommend",
            "--input",
            str(input_path),
            "--as-of",
            str(as_of),
            "--horizon",
            "24h",
            "--output",
            output,
        ]
        for run in range(runs):
            ref_seconds, _ = timed(reference, timeout=600)
            ours_seconds, peak = timed(command, timeout=600)
            reference_times.append(ref_seconds)
            ours_times.append(ours_seconds)
            peaks.append(peak)
            print(
                f"run {run + 1}/{runs}: recommend {ours_seconds:.2f} s, reference read {ref_seconds:.2f} s",
                file=sys.stderr,
            )
        recommendations = len(json.loads(Path(output).read_text())["recommendations"])
    ours, ref = statistics.median(ours_times), statistics.median(reference_times)
    return {
        "benchmark": "recommend",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join(["recommender", *command[1:]]).replace(output, "OUT.json"),
        "input": str(input_path),
        "runs": runs,
        "recommendations": recommendations,
        "median_seconds": round(ours, 2),
        "all_seconds": [round(t, 2) for t in ours_times],
        "reference_median_seconds": round(ref, 2),
        "ratio_to_reference": round(ours / ref, 2),
        "peak_rss_mib": round(max(peaks)),
        "cpu_count": os.cpu_count(),
    }


def fleet_arguments(parser: argparse.ArgumentParser, containers: int) -> None:
    """The options of a benchmark on the Prometheus bench fleet (bench/prometheus_fleet.py)."""
    parser.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    parser.add_argument(
        "--containers", type=int, default=containers, help="fleet size: 250 Bitbrains VMs per namespace"
    )
    parser.add_argument("--days", type=int, default=14)


def stop_on_sigterm() -> None:
    """A SIGTERM stops the benchmark as Ctrl-C does: through its `finally` blocks, which stop the Prometheus it
    started and the children it measures (`run_child`), instead of leaving them running."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="name", required=True)
    rec = sub.add_parser("recommend", help="time `recommender recommend` against a bare read of the same file")
    rec.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    rec.add_argument("--runs", type=int, default=3)
    rec.add_argument("--as-of", type=int, default=None, help="decision time (default: end of the data)")
    prom = sub.add_parser(
        "prometheus-train",
        help="train from a real Prometheus vs the file path and a KRR-equivalent reference, same run",
    )
    fleet_arguments(prom, 1000)
    prom.add_argument("--runs", type=int, default=2, help="alternating runs of each path")
    prom.add_argument(
        "--workers",
        type=int,
        default=0,
        help="train ours on a local Dask cluster of N workers (0: one process, with the file path)",
    )
    prom.add_argument(
        "--no-file",
        action="store_true",
        help="leave out the file path (a 10,000-container fleet's rows read whole need some 10 GB)",
    )
    read = sub.add_parser(
        "prometheus-read",
        help="the streamed Prometheus read without the fit vs the KRR-equivalent's whole pass, same run",
    )
    fleet_arguments(read, 10000)
    read.add_argument("--no-krr", action="store_true", help="leave out the KRR-equivalent reference")
    read.add_argument(
        "--variants",
        default="default",
        help="our read's settings, each against its own fresh Prometheus in this run: comma-separated `default` or "
        "`cN[eM][+gzip]` (N queries in flight, M of them evaluating, compressed answers), e.g. `c1+gzip,c1,default`",
    )
    fit = sub.add_parser("fit", help="the workload model's fit alone on rows in memory vs KRR's simple on them")
    fit.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    fit.add_argument("--runs", type=int, default=3)
    fit.add_argument("--as-of", type=int, default=None, help="fit on the rows before this time (default: all)")
    fit.add_argument(
        "--tile",
        type=int,
        default=0,
        help="N > 0: the fleet's forecast choice alone, on partitions by namespace repeated N times (its CPU and memory)",
    )
    live_cost = sub.add_parser(
        "live-cost", help="the live loop's cost per pass on a real Prometheus vs an incremental train"
    )
    live_cost.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    live_cost.add_argument("--containers", type=int, default=1000)
    live_cost.add_argument("--passes", type=int, default=11, help="passes, one 5-minute step each")
    live_cost.add_argument(
        "--model-only",
        action="store_true",
        help="only the model part of each pass (live_update, predict, publish), with the fleet's file's samples",
    )
    live_cost.add_argument(
        "--no-reference",
        action="store_true",
        help="leave out the reference (an incremental train over the same steps: ~20 minutes at 10,000 containers)",
    )
    live_line = sub.add_parser("live-line", help="the learned live line's fit and cost per pass vs a rolling max")
    live_line.add_argument("--containers", type=int, default=10000)
    live_line.add_argument("--passes", type=int, default=11)
    live_reaction = sub.add_parser("live-reaction", help="time from a step up to the line following it, ours vs VPA")
    live_reaction.add_argument("--trace", type=Path, default=DEFAULT_INPUT, help="5-minute usage (bitbrains-aug)")
    decode = sub.add_parser(
        "prometheus-decode", help="our streaming decoder of range answers vs orjson.loads of the whole body"
    )
    decode.add_argument("--series", type=int, default=250)
    decode.add_argument("--points", type=int, default=4032)
    decode.add_argument("--runs", type=int, default=5)
    scale = sub.add_parser("scale", help="distributed training at 1k/10k/50k containers on 1/2/4 Dask workers")
    scale.add_argument("--input", type=Path, default=DEFAULT_INPUT)
    scale.add_argument("--sizes", default="1000,10000,50000", help="fleet sizes, containers")
    scale.add_argument("--workers", default="1,2,4", help="local Dask worker processes")
    scale.add_argument(
        "--reference-sizes", default="1000,10000", help="sizes also trained single-process (the reference)"
    )
    scale.add_argument("--days", type=float, default=2.0, help="history per container, days of 5-minute samples")
    scale.add_argument("--partition-containers", type=int, default=500)
    for name, what in (
        ("webhook", "admission reviews over TLS vs a bare echo endpoint"),
        ("extender", "prioritize over 1,000 and 5,000 nodes vs a bare echo endpoint"),
        ("rest", "GET of one recommendation vs a bare endpoint"),
        ("serving", "webhook, extender and rest on one rig"),
    ):
        one = sub.add_parser(name, help=what)
        one.add_argument("--requests", type=int, default=3000, help="per run (bounded further by a 30 s cap)")
        if name in ("extender", "serving"):
            one.add_argument(
                "--orders",
                default="new,same",
                help="the extender's candidate lists: `new`, the names in a new order each call as kube-scheduler "
                "sends them (the headline), and/or `same`, the same list each call (a list the extender remembers)",
            )
    isolation = sub.add_parser(
        "isolation", help="500 small reviews/s and probes with a 1 MB review every second, vs a bare endpoint"
    )
    isolation.add_argument("--seconds", type=int, default=20, help="length of each of the three runs")
    isolation.add_argument("--rate", type=int, default=500, help="small reviews per second")
    isolation.add_argument("--big", choices=["env", "containers"], default="env", help="what makes the 1 MB review big")
    args = parser.parse_args(sys.argv[1:] or ["recommend"])
    if (
        args.name in ("recommend", "prometheus-train", "prometheus-read", "scale", "live-cost", "fit")
        and not args.input.is_file()
    ):
        raise SystemExit(f"{args.input}: no such file (--input; the default is {DEFAULT_INPUT})")
    if args.name == "recommend":
        result = bench_recommend(args.input, args.runs, args.as_of)
    elif args.name == "prometheus-train":
        from bench.prometheus import main as bench_prometheus

        result = bench_prometheus(args.input, args.containers, args.days, args.runs, args.workers, not args.no_file)
    elif args.name == "prometheus-read":
        from bench.prometheus import bench_read

        result = bench_read(args.input, args.containers, args.days, not args.no_krr, args.variants.split(","))
    elif args.name == "fit":
        from bench.fit import main as bench_fit

        result = bench_fit(args.input, args.runs, args.as_of, args.tile)
    elif args.name == "live-cost":
        from bench.live import bench_cost, bench_model_part

        if args.model_only:
            result = bench_model_part(args.input, args.containers, args.passes)
        else:
            result = bench_cost(args.input, args.containers, args.passes, reference=not args.no_reference)
    elif args.name == "live-line":
        from bench.live_line import bench_live_line

        result = bench_live_line(args.containers, args.passes)
    elif args.name == "live-reaction":
        from bench.live import bench_reaction

        result = bench_reaction(args.trace)
    elif args.name == "prometheus-decode":
        from bench.prometheus import bench_decode

        result = bench_decode(args.series, args.points, args.runs)
    elif args.name == "scale":
        from bench.scale import main as bench_scale

        def numbers(text: str) -> list[int]:
            return [int(x) for x in text.split(",") if x]

        result = bench_scale(
            args.input,
            numbers(args.sizes),
            numbers(args.workers),
            numbers(args.reference_sizes),
            args.days,
            args.partition_containers,
        )
    elif args.name == "isolation":
        result = bench_isolation(args.seconds, args.rate, args.big)
    else:
        orders = tuple(getattr(args, "orders", "new").split(","))
        if not set(orders) <= {"new", "same"}:
            raise SystemExit(f"--orders {args.orders}: `new` and/or `same`")
        result = bench_serving(args.name, args.requests, orders)
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = (
        args.name
        if args.name not in ("prometheus-train", "live-cost", "live-line")
        else f"{args.name}-{args.containers}"
    )
    name += "-model" if getattr(args, "model_only", False) else ""
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def bench_serving(name: str, requests: int, orders: tuple[str, ...]) -> dict[str, object]:
    from bench import serving

    chosen = ("webhook", "extender", "rest") if name == "serving" else (name,)
    result: dict[str, object] = {
        "benchmark": name,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench {name} --requests {requests}"
        + (f" --orders {','.join(orders)}" if "extender" in chosen else ""),
        "cpu_count": os.cpu_count(),
    }
    with serving.rig() as rig:
        for one in chosen:
            print(f"running {one}", file=sys.stderr)
            if one == "extender":
                result[one] = serving.bench_extender(rig, min(requests, 500), orders)
            else:
                result[one] = getattr(serving, f"bench_{one}")(rig, requests)
    return result


def bench_isolation(seconds: int, rate: int, big: str) -> dict[str, object]:
    from bench import serving

    with serving.rig(nodes=100) as rig:
        return {
            "benchmark": "isolation",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "command": f"python -m bench isolation --seconds {seconds} --rate {rate} --big {big}",
            "cpu_count": os.cpu_count(),
            **serving.bench_isolation(rig, seconds, rate, big),
        }


if __name__ == "__main__":
    main()
