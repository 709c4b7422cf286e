"""Load generator, run as its own process: `python -m bench.load --url URL [...]` prints one JSON summary.

Closed loop (`--concurrency` workers, each sends when its last answer came) measures throughput; with `--rate`
requests are started on a fixed schedule (open loop) to measure latency at a given load. Bounded by `--requests`
and `--time-cap`. Latency is measured per request from its start to the end of the body; each request gets its
keep-alive connection from a pool of `--concurrency`, all opened before timing starts, as the API server and
the scheduler keep theirs. It runs on uvloop so that the client takes as little of the CPU as it can.
With `--bodies FILE` (one body a line) the n-th request sends line n and the connections are opened with the lines
after `--requests`, so a file of `--requests` + `--concurrency` lines sends every request a body of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import time
from pathlib import Path

import httpx
import uvloop


async def run(args: argparse.Namespace) -> dict[str, object]:
    bodies = args.bodies.read_bytes().splitlines() if args.bodies else [args.body.read_bytes() if args.body else None]
    headers = dict(h.split(":", 1) for h in args.header)
    context = ssl.create_default_context(cafile=str(args.ca)) if args.ca else True
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    started = time.perf_counter()
    deadline = started + args.time_cap
    next_index = 0

    async with httpx.AsyncClient(verify=context, limits=limits, timeout=10) as client:
        # Open every connection (TLS handshake) before timing, as long-lived API server connections are.
        await asyncio.gather(
            *(
                client.request(
                    args.method, args.url, content=bodies[(args.requests + i) % len(bodies)], headers=headers
                )
                for i in range(args.concurrency)
            )
        )

        async def worker() -> None:
            nonlocal next_index, errors
            while True:
                index = next_index
                next_index += 1
                if index >= args.requests or time.perf_counter() > deadline:
                    return
                if args.rate:
                    delay = started + index / args.rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                sent = time.perf_counter()
                try:
                    response = await client.request(
                        args.method, args.url, content=bodies[index % len(bodies)], headers=headers
                    )
                except httpx.HTTPError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - sent)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        started = time.perf_counter()
        deadline = started + args.time_cap
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)

    def percentile(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3) if ordered else float("nan")

    return {
        "requests": len(latencies),
        "errors": errors,
        "statuses": statuses,
        "seconds": round(elapsed, 3),
        "requests_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": percentile(0.5),
        "p99_ms": percentile(0.99),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 3) if ordered else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--method", default="POST")
    parser.add_argument("--body", type=Path)
    parser.add_argument("--bodies", type=Path, help="one body a line, taken in turn (instead of --body)")
    parser.add_argument("--header", action="append", default=[], help="K:V, repeatable")
    parser.add_argument("--ca", type=Path, help="CA bundle to verify the server with")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--rate", type=float, default=0.0, help="requests per second (open loop); 0: as fast as possible"
    )
    parser.add_argument("--time-cap", type=float, default=30.0, help="seconds")
    print(json.dumps(uvloop.run(run(parser.parse_args()))))


if __name__ == "__main__":
    main()
