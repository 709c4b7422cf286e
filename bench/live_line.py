"""The learned live line's cost (`python -m bench live-line --containers 10000`): what it adds to a live pass.

A synthetic fleet (daily cycles, clustered bursts, 1 % missing samples; no data file needed) on the training grid's
shape (22 days of 5-minute steps). The model is fitted once (timed: `train`'s share), then each pass issues the
fleet's lines (`LiveLineForecaster.predict` on the grid) and moves the online calibration (`AdaptiveScale.updated`
on the step since), as `WorkloadRecommender.live_update` does every interval. The reference, in the same run: the
simplest rolling line on the same grid (the max of the last 6 hours, `np.nanmax` over 72 steps), the floor of what
any recent-usage line costs.
"""

from __future__ import annotations

import os
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import numpy as np

from models.live_line import STEPS_PER_DAY, LiveLineForecaster

GRID_DAYS = 22


def synthetic_grid(containers: int, days: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    steps = days * STEPS_PER_DAY
    phase = 2 * np.pi * np.arange(steps) / STEPS_PER_DAY
    grid = rng.lognormal(-1.0, 1.0, (containers, 1)) * (1 + 0.4 * np.sin(phase))[None, :]
    bursts = np.repeat(rng.random((containers, steps // 12)) < 0.03, 12, axis=1)
    grid *= 1 + bursts * rng.uniform(0.5, 2.0, (containers, 1)) + rng.gamma(2.0, 0.05, (containers, steps))
    grid[rng.random(grid.shape) < 0.01] = np.nan
    return grid


def bench_live_line(containers: int, passes: int) -> dict[str, Any]:
    grid = synthetic_grid(containers, GRID_DAYS + 1)
    end = 1_700_006_400 + GRID_DAYS * 86400
    width = GRID_DAYS * STEPS_PER_DAY
    started = time.perf_counter()
    model = LiveLineForecaster(target_violation=0.01).fit(grid[:, :width], grid_end=end)
    fit_seconds = time.perf_counter() - started
    scale = model.initial_scale()
    ours, reference = [], []
    lines = model.predict(grid[:, :width], issued_at=end)
    for k in range(1, passes + 1):
        window = grid[:, k : width + k]  # the grid slid one step, as a pass's newest step arrives
        started = time.perf_counter()
        scale = scale.updated(lines, window[:, -1:])
        lines = model.predict(window, issued_at=end + 300 * k) * scale.factors(containers)
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        np.nanmax(window[:, -72:], axis=1)
        reference.append(time.perf_counter() - started)
    return {
        "benchmark": "live-line",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": f"python -m bench live-line --containers {containers} --passes {passes}",
        "cpu_count": os.cpu_count(),
        "containers": containers,
        "fit_seconds": round(fit_seconds, 2),
        "training_rows": model.training_rows_,
        "pass_seconds_median": round(statistics.median(ours), 4),
        "pass_seconds_max": round(max(ours), 4),
        "reference_seconds_median": round(statistics.median(reference), 4),
        "ratio_to_reference": round(statistics.median(ours) / statistics.median(reference), 1),
        "served_share": float(np.isfinite(lines).mean()),
    }
