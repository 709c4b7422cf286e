#!/usr/bin/env python3
"""Score the learned live line on the development split in-process, as `replay` + `rolling.py` would, for choosing
its settings (docs/benchmarks.md, "The live short-term line"): every setting of `live_line` was chosen with this on
`eval-data/dev.csv.gz` (Bitbrains VMs 1-125, July 2013), never on the judged half.

Each variant is a JSON object of `LiveLineForecaster` parameters; each is replayed hourly (`pipelines.replay`'s loop
on the grid, refitted weekly) for P = 1 % and 5 %, and scored on the grid's 5-minute cells of the containers with 7
days of history at the start, with the simple rolling lines beside it: pooled violation, overprovision at the
matched 1 % and 5 % and the p90 container violation there (percent).

Usage: .venv/bin/python scripts/live_dev.py [--data eval-data/dev.csv.gz] [--start 2013-07-16] [--end 2013-08-01]
           [--variants '{"default": {}, "calm": {"fleet_adaptation_rate": 0}}'] [--resources cpu,memory]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import warnings

import numpy as np
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.forecast import usage_grid  # noqa: E402
from models.live_line import LiveLineForecaster  # noqa: E402
from pipelines.replay import STEP_SECONDS, ReplayPlan, replay_resource  # noqa: E402
from recommender.progress import quiet  # noqa: E402

COLUMNS = {"cpu": "cpu_cores", "memory": "memory_bytes"}
FLOORS = {"cpu": 1e-3, "memory": float(1 << 20)}
#: The simple lines `rolling.py` re-issues beside ours (name, look-back in 5-minute steps, quantile).
ROLLING_LINES = (
    ("roll_max_1h", 12, 1.0),
    ("roll_max_6h", 72, 1.0),
    ("roll_p95_3h", 36, 0.95),
    ("roll_p99_24h", 288, 0.99),
)


def unix(day: str) -> int:
    return int(pd.Timestamp(day, tz="UTC").timestamp())


def scores(lines: np.ndarray, usage: np.ndarray, floor: float) -> dict[str, float]:
    """Pooled violation; at 1 % and 5 %, the overprovision after one factor and the p90 container violation."""
    ok = ~np.isnan(usage) & ~np.isnan(lines)
    line = np.maximum(lines[ok], floor)
    ratio = usage[ok] / line
    owners = np.nonzero(ok)[0]
    out = {"violation": round(100 * float(np.mean(ratio > 1)), 2)}
    for level in (0.01, 0.05):
        factor = float(np.quantile(ratio, 1 - level))
        out[f"@{level:.0%}"] = round(100 * (factor * line.sum() / usage[ok].sum() - 1), 1)
        shares = pd.Series(ratio > factor).groupby(owners).mean()
        out[f"p90@{level:.0%}"] = round(100 * float(np.quantile(shares, 0.9)), 1)
    return out


def rolling_quantile(grid: np.ndarray, grid_start: int, plan: ReplayPlan, steps: int, q: float) -> np.ndarray:
    """Per issue time, each row's q-quantile of its last `steps` samples (1: the max): `rolling.py`'s simple lines."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for issued in plan.issue_times():
            position = (issued - grid_start) // STEP_SECONDS
            out.append(np.nanquantile(grid[:, max(position - steps, 0) : position], q, axis=1))
    return np.asarray(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=pathlib.Path, default=ROOT / "eval-data" / "dev.csv.gz")
    parser.add_argument("--start", default="2013-07-16")
    parser.add_argument("--end", default="2013-08-01")
    parser.add_argument("--variants", default='{"default": {}}')
    parser.add_argument("--resources", default="cpu,memory")
    args = parser.parse_args()
    start, end = unix(args.start), unix(args.end)
    usage = pd.read_csv(args.data, engine="pyarrow")
    usage = usage[usage["timestamp"] < end]
    codes, _ = pd.factorize(usage["namespace"] + "/" + usage["workload"] + "/" + usage["container"])
    grid_start = int(usage["timestamp"].min()) // STEP_SECONDS * STEP_SECONDS
    width = (end - grid_start) // STEP_SECONDS
    plan = ReplayPlan(start, end, 3600, 7 * 86400)
    first = (start - grid_start) // STEP_SECONDS
    per_issue = plan.every_seconds // STEP_SECONDS
    for resource in args.resources.split(","):
        values = usage[COLUMNS[resource]].to_numpy(dtype=np.float64)
        times = usage["timestamp"].to_numpy(dtype=np.float64)
        grid = usage_grid(codes.astype(np.int64), times, values, int(codes.max()) + 1, end, width, STEP_SECONDS)
        known_from = np.argmax(~np.isnan(grid), axis=1)
        grid = grid[known_from <= first - 7 * 288]  # scored: 7 days of history at the first issue, as rolling.py
        scored = grid[:, first : first + len(plan.issue_times()) * per_issue]

        def report(name: str, lines: np.ndarray, seconds: float, resource: str, scored: np.ndarray) -> None:
            drawn = np.repeat(lines.T, per_issue, axis=1)
            print(resource, name, scores(drawn, scored, FLOORS[resource]), f"{seconds:.0f} s", flush=True)

        for name, steps, q in ROLLING_LINES:
            report(name, rolling_quantile(grid, grid_start, plan, steps, q), 0.0, resource, scored)
        for variant, parameters in json.loads(args.variants).items():
            for level in (0.01, 0.05):
                model = LiveLineForecaster(target_violation=level).set_params(**parameters)
                started = time.monotonic()
                lines = replay_resource(grid, grid_start, plan, model, quiet)
                report(f"{variant} built for {level:.0%}", lines, time.monotonic() - started, resource, scored)


if __name__ == "__main__":
    main()
