#!/usr/bin/env python3
"""Score the project's forecast lines on the development split in-process with the shared harness (no CSV per day).

This is how every forecasting setting was chosen (docs/benchmarks.md, "How settings are chosen"): the shared
harness's `evaluate` calls `fit_resource_forecast` on each decision day's history and scores the lines like
`run_project.py` does, minutes faster than a CLI call per day. Judge the result on the other half with
`run_project.py`, never here.

Besides the harness's scores it prints the churn of the request and long-term lines: the share of a container's
changes from one decision to the next beyond 1.5x (use `--day-stride 1` for day-over-day figures).

Usage: .venv/bin/python scripts/forecast_dev.py [--data eval-data/dev.csv.gz] [--target-violation 0.01]
           [--day-stride 2] [--first-decision 2013-08-01] [--settings '{"selection_groups": 1}']
           [--resources cpu,memory] [--shared ../shared]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.forecast import usage_grid  # noqa: E402
from models.histogram import DecayingHistogram  # noqa: E402
from models.metrics import CHURN_FACTOR, line_churn  # noqa: E402
from models.recommendation import stale_hold  # noqa: E402
from models.workload import fit_resource_forecast  # noqa: E402
from recommender.ceiling import LIMIT_COLUMNS  # noqa: E402
from recommender.settings import (  # noqa: E402
    ForecastSettings,
    HistogramSettings,
    PolicySettings,
    ReservationSettings,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="eval-data/dev.csv.gz")
    parser.add_argument("--target-violation", type=float, default=0.01)
    parser.add_argument("--day-stride", type=int, default=2)
    parser.add_argument("--first-decision", default=None, help="YYYY-MM-DD (UTC): earlier days are history only")
    parser.add_argument("--settings", default="{}", help="ForecastSettings fields as JSON")
    parser.add_argument("--resources", default="cpu,memory")
    parser.add_argument(
        "--peak-rule",
        choices=("floor", "cap", "model"),
        default="floor",
        help="the peak against the short-term line's highest step: raised to it (floor, as served), capped at it "
        "(cap, before 2026-12-07) or the point forecast alone (model)",
    )
    parser.add_argument("--shared", type=pathlib.Path, default=ROOT.parent / "shared")
    args = parser.parse_args()
    sys.path.insert(0, str(args.shared / "eval"))
    import harness  # the shared scoring, used as it is

    settings = ForecastSettings(**json.loads(args.settings)).with_target_violation(args.target_violation)
    steps = (settings.selection_days + settings.history_days + 1) * 288

    data = harness.load_tidy(args.data)
    data.resources = tuple(r for r in data.resources if r in args.resources.split(","))
    asked = current_requests(data.df)

    # Each container's request and long-term values at each decision, for the churn figure.
    constant_lines: dict[tuple[str, tuple[str, ...]], dict[int, tuple[float, float]]] = {}

    class InProcess(harness.Method):  # type: ignore[misc, name-defined]
        name = "project-in-process"

        def recommend_all(self, ds, T, eligible):  # type: ignore[no-untyped-def]
            started = time.time()
            out: dict[tuple[str, ...], dict[str, object]] = {s.key: {} for s in eligible}
            for resource in ds.resources:
                windows = [s.window(T - steps * 300, T) for s in eligible]
                grid = usage_grid(
                    np.concatenate([np.full(len(w), i) for i, w in enumerate(windows)]).astype(np.int64),
                    np.concatenate([w.ts for w in windows]).astype(np.float64),
                    np.concatenate([w.values(resource) for w in windows]),
                    len(eligible),
                    T,
                    steps,
                    300,
                )
                forecast = fit_resource_forecast(grid, settings, T)
                short, request, long_term = forecast.lines(T, 86400, 300)
                # A stale container's lines hold its current request, as `recommend` holds them (scored as 0, every
                # sample of one that resumes would count as a miss), where it has the evidence `recommend` asks for
                # any recommendation (`PolicySettings.min_samples` by recent weight); without it, or without a request
                # or limit (the CLI's last fallback, the VPA-sized target, has no counterpart here), it stays at 0.
                last = np.array([w.ts[-1] if len(w.ts) else -np.inf for w in windows])
                stale = (T - last >= settings.stale_after_seconds) & has_evidence(windows, resource)
                if stale.any():
                    now = np.array([asked_at(asked[resource], s.key, T) for s in eligible], dtype=np.float64)
                    held = stale_hold(now[:, 0], now[:, 1], request)
                    short = np.where(stale[:, None], held[:, None], short)
                    request, long_term = (np.where(stale, held, line) for line in (request, long_term))
                peak = forecast.peak.predict()
                line_peak = np.max(short, axis=1)
                if args.peak_rule != "model":
                    bound = np.fmax if args.peak_rule == "floor" else np.fmin
                    peak = np.where(np.isnan(peak), line_peak, bound(peak, line_peak))
                for i, s in enumerate(eligible):
                    constant_lines.setdefault((resource, s.key), {})[T] = (float(request[i]), float(long_term[i]))
                    out[s.key][resource] = harness.Rec(
                        float(np.nan_to_num(request[i])),
                        np.nan_to_num(short[i]),
                        float(np.nan_to_num(long_term[i])),
                        float(np.nan_to_num(peak[i])),
                    )
            print(
                f"{harness.utc(T)}: {len(eligible)} containers, {time.time() - started:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            return out

    result = harness.evaluate(data, InProcess(), 7.0, args.first_decision, None, args.day_stride)
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    for resource in data.resources:
        for line in ("request", "short_term", "long_term"):
            m = result["results"][resource][line]
            a1, a5 = m["at_1pct"], m["at_5pct"]
            print(
                f"{resource} {line}: violation {pct(m['violation'])}, @1 % {pct(a1['overprovision'])} (p90 {pct(a1['p90_container_violation'])}), "
                f"@5 % {pct(a5['overprovision'])} (p90 {pct(a5['p90_container_violation'])})"
            )
        for position, line in enumerate(("request", "long_term")):
            decided = decisions_by_container(constant_lines, resource, position)
            print(
                f"{resource} {line} churn: {line_churn(decided, ~np.isnan(decided)):.1%} of the changes from one "
                f"decision to the next beyond {CHURN_FACTOR:g}x"
            )
        peak = result["results"][resource]["peak"]
        print(f"{resource} peak: MdAPE {pct(peak['mdape'])}, days above {pct(peak['under_forecast'])}")


def has_evidence(windows: list[Any], resource: str) -> np.ndarray:
    """Per window (a harness `Series`), whether its samples of `resource` support a recommendation as `recommend`
    asks: `PolicySettings.min_samples` of them by recent weight, from the decaying histogram `recommend` counts them
    with (`WorkloadRecommender.recent_samples`: VPA's CPU histogram, memory's long-term one)."""
    half_life = (
        HistogramSettings().cpu_half_life_seconds
        if resource == "cpu"
        else ReservationSettings().long_term_memory_half_life_seconds
    )
    samples = pd.DataFrame(
        {
            "group": np.concatenate([np.full(len(w.ts), i) for i, w in enumerate(windows)]),
            "timestamp": np.concatenate([w.ts for w in windows]).astype(np.float64),
            "value": np.concatenate([w.values(resource) for w in windows]),
        }
    )
    histogram = DecayingHistogram(half_life_seconds=half_life).fit(samples)
    recent = np.zeros(len(windows))
    at = pd.Index(histogram.groups_).get_indexer(np.arange(len(windows)).astype(str))  # labels are strings
    recent[at >= 0] = np.nan_to_num(histogram.recent_samples())[at[at >= 0]]
    enough: np.ndarray = np.rint(recent) >= PolicySettings().min_samples
    return enough


Asked = dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]]


def current_requests(df: pd.DataFrame) -> dict[str, Asked]:
    """Per resource and container (the harness's key), its rows' times, requests and limits (NaN where the file
    has no such column), for `asked_at`."""
    out: dict[str, Asked] = {}
    for resource, request_column in (("cpu", "cpu_request_cores"), ("memory", "memory_request_bytes")):
        table: Asked = {}
        for key, rows in df.groupby(["namespace", "workload", "container"], sort=False):
            rows = rows.sort_values("timestamp")
            requests, limits = (
                rows[c].to_numpy(dtype=np.float64) if c in rows else np.full(len(rows), np.nan)
                for c in (request_column, LIMIT_COLUMNS[resource])
            )
            table[tuple(str(k) for k in key)] = (rows["timestamp"].to_numpy(), requests, limits)
        out[resource] = table
    return out


def asked_at(table: Asked, key: tuple[str, ...], at: int) -> tuple[float, float]:
    """A container's request and limit on its last row before `at` (NaN, NaN without one)."""
    empty = np.empty(0)
    times, requests, limits = table.get(key, (empty, empty, empty))
    row = int(np.searchsorted(times, at, "left")) - 1
    return (float(requests[row]), float(limits[row])) if row >= 0 else (np.nan, np.nan)


def decisions_by_container(
    lines: dict[tuple[str, tuple[str, ...]], dict[int, tuple[float, float]]], resource: str, position: int
) -> np.ndarray:
    """One constant line (`position` in the kept pair) of `resource` as (decisions x containers), NaN where a
    container was not decided on: what `line_churn` reads (the decisions are consecutive, `--day-stride` apart)."""
    kept = {key: per_time for (kind, key), per_time in lines.items() if kind == resource}
    decided_at = sorted({when for per_time in kept.values() for when in per_time})
    table = np.full((len(decided_at), len(kept)), np.nan)
    row = {when: i for i, when in enumerate(decided_at)}
    for column, per_time in enumerate(kept.values()):
        for when, values in per_time.items():
            table[row[when], column] = values[position]
    return table


if __name__ == "__main__":
    main()
