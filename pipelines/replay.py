"""`recommender replay`: the live loop's short-term line replayed on a usage file, issued every interval.

At each issue time t = start + k x every, the line for every container covers the 5-minute steps of
[t, t + every) and is built from rows before t only: the learned model (`models.live_line`), fitted for that block
(`--every 5m`: the next step, as the live loop's line; `--every 1h`: the next hour), on the grid's columns before
its fit time (a fit at `start` and every `retrain_every_seconds` after, as the daily training would
have made it), its online calibration moved by what the previous interval showed, and the fallback line where the
model cannot serve a container (cold start, a gap). The output is one row per (container, resource, issue, step):
the evaluation contract `../shared/eval/rolling.py --lines` reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from models.forecast import STEPS_PER_DAY, column_grid, nan_quantile, usage_grid
from models.live_line import STEPS_PER_WEEK, LiveLineForecaster
from models.pods import pod_pairs
from pipelines.ingest import SampleBounds, read_usage
from pipelines.settings import TrainingSettings
from recommender.arrays import FloatArray, IntArray
from recommender.ceiling import LIMIT_COLUMNS, THROTTLED_COLUMNS, ceilings_at, within_ceiling
from recommender.errors import ConfigurationError
from recommender.progress import Step, quiet
from recommender.settings import ForecastSettings

STEP_SECONDS = 300
COLUMNS = ("namespace", "workload", "container", "resource", "issued_at", "step", "value")
RESOURCES = {"cpu": "cpu_cores", "memory": "memory_bytes"}
#: Issue times at most, so a typo (`--every 1s` over a year) is refused before it fills the disk.
MAX_ISSUES = 100_000


@dataclass(frozen=True)
class ReplayPlan:
    """When lines are issued and models refitted, Unix seconds."""

    start: int
    end: int
    every_seconds: int
    retrain_every_seconds: int

    def __post_init__(self) -> None:
        if self.every_seconds <= 0 or self.every_seconds % STEP_SECONDS:
            raise ConfigurationError(f"--every: {self.every_seconds} s is not a positive multiple of 5 minutes")
        if self.start % STEP_SECONDS:
            raise ConfigurationError(f"--start: {self.start} is not on the 5-minute grid (a multiple of 300 s)")
        if self.end <= self.start:
            raise ConfigurationError(f"--end: {self.end} is not after --start {self.start}")
        if self.retrain_every_seconds < self.every_seconds:
            raise ConfigurationError("--retrain-every: shorter than --every")
        if len(self.issue_times()) > MAX_ISSUES:
            raise ConfigurationError(f"--start/--end/--every: more than {MAX_ISSUES:,} issue times")

    def issue_times(self) -> range:
        return range(self.start, self.end, self.every_seconds)


def fallback_line(grid: FloatArray, position: int) -> FloatArray:
    """Where the learned line cannot serve (a cold start, a gap): the flat p99 of the last week, as the day-ahead
    flat line; NaN without a sample in it."""
    return nan_quantile(grid[:, max(position - STEPS_PER_WEEK, 0) : position], 0.99)


#: The pods' own usage grid (pods x steps, on the containers' grid) and each pod's container row: what the online
#: calibration counts, so the level holds for every pod's samples (None: one pod a container, the grid itself).
Pods = tuple[FloatArray, IntArray] | None


def learned_issues(
    grid: FloatArray, grid_start: int, plan: ReplayPlan, model: LiveLineForecaster, step: Step, pods: Pods = None
) -> FloatArray:
    """The (issues x rows) learned lines of one resource's grid (column 0 starts at `grid_start`), calibrated online,
    NaN where the model cannot serve (no fit yet, a cold start, a gap): the live loop's line before its fallback. The
    node backtest issues the node line through this too."""
    issues = plan.issue_times()
    out = np.full((len(issues), grid.shape[0]), np.nan)
    history = (model.training_days + 8) * 288  # the longest look-back of a fit (7-day features at its oldest origin)
    next_fit, fitted = plan.start, False
    scale = model.initial_scale()
    previous: tuple[int, FloatArray] | None = None
    for k, issued in enumerate(issues):
        position = (issued - grid_start) // STEP_SECONDS
        if issued >= next_fit:
            past = grid[:, max(position - history, 0) : position]
            try:
                model.fit(past, grid_end=issued)
                fitted = True
            except ValueError:
                fitted = False
            next_fit = issued + plan.retrain_every_seconds
            step(f"fitted at {pd.Timestamp(issued, unit='s')} UTC ({k}/{len(issues)} issued)", detail=True)
        if previous is not None:
            start, lines = previous
            scale = (
                scale.updated(lines, grid[:, start:position])
                if pods is None
                else scale.updated(lines, pods[0][:, start:position], pods[1])
            )
        if fitted:
            recent = grid[:, max(position - STEPS_PER_WEEK - 288, 0) : position]
            out[k] = model.issue(recent, issued, scale.factors(grid.shape[0]))
            previous = (position, out[k])
    return out


def replay_resource(
    grid: FloatArray, grid_start: int, plan: ReplayPlan, model: LiveLineForecaster, step: Step, pods: Pods = None
) -> FloatArray:
    """The (issues x rows) lines of one resource's grid (column 0 starts at `grid_start`): the learned line, the
    fallback where it cannot serve."""
    out = learned_issues(grid, grid_start, plan, model, step, pods)
    for k, issued in enumerate(plan.issue_times()):
        position = (issued - grid_start) // STEP_SECONDS
        out[k] = np.where(np.isnan(out[k]), fallback_line(grid, position), out[k])
    return out


def served_lines(
    grid: FloatArray,
    grid_start: int,
    plan: ReplayPlan,
    model: LiveLineForecaster,
    limits: tuple[FloatArray, FloatArray],
    forecast: ForecastSettings,
    step: Step,
    pods: Pods = None,
) -> FloatArray:
    """`replay_resource`'s lines held under the usage ceiling at each issue (`recommender.ceiling`; `limits`: the
    grids of the containers' limits and throttled shares), as the live loop serves them; the online calibration
    moves on the raw lines. `replay` writes these and the backtest scores them."""
    lines = replay_resource(grid, grid_start, plan, model, step, pods)
    positions = [(issued - grid_start) // STEP_SECONDS for issued in plan.issue_times()]
    ceiling, evidence = ceilings_at(
        grid,
        *limits,
        positions,
        forecast.history_days * STEPS_PER_DAY,
        forecast.ceiling_near_limit_fraction,
        forecast.ceiling_throttled_fraction,
    )
    return np.stack([within_ceiling(line, ceiling[k], evidence[k]) for k, line in enumerate(lines)])


def run_replay(
    input_path: Path, plan: ReplayPlan, settings: TrainingSettings, step: Step = quiet
) -> tuple[pd.DataFrame, float]:
    """The lines of every container of the file as the live loop would have issued them, and the seconds taken."""
    started = time.monotonic()
    step(f"reading {input_path.name}")
    usage = read_usage(input_path, SampleBounds.at(settings.ingest, time.time()))
    usage = usage[usage["timestamp"] < plan.end]
    names = usage[["namespace", "workload", "container"]].astype(str)
    groups = names.drop_duplicates().sort_values(list(names.columns)).reset_index(drop=True)
    codes = pd.MultiIndex.from_frame(groups).get_indexer(pd.MultiIndex.from_frame(names))
    if len(usage) == 0:
        raise ConfigurationError(f"{input_path}: no usage rows before --end {plan.end}")
    grid_start = int(usage["timestamp"].min()) // STEP_SECONDS * STEP_SECONDS
    grid_end = -(-plan.end // STEP_SECONDS) * STEP_SECONDS
    width = (grid_end - grid_start) // STEP_SECONDS
    times = usage["timestamp"].to_numpy(dtype=np.float64)
    level = settings.forecast.short_term_target_violation
    issues = np.asarray(plan.issue_times(), dtype=np.int64)
    # Each row's pod of its container, for the calibration to count every pod's samples (one pod each: the grid).
    pod_codes, owners = pod_pairs(codes.astype(np.int64), pd.factorize(usage["pod"])[0].astype(np.int64))
    frames = []
    for resource, column in RESOURCES.items():
        step(f"replaying {resource}: {len(groups)} containers, {len(issues)} issues")
        values = usage[column].to_numpy(dtype=np.float64)
        grid = usage_grid(codes.astype(np.int64), times, values, len(groups), grid_end, width, STEP_SECONDS)
        model = LiveLineForecaster.from_settings(settings.live_line, level, STEP_SECONDS, plan.every_seconds)
        limit, throttled = (
            column_grid(usage, column, codes, grid.shape, grid_end, STEP_SECONDS)
            for column in (LIMIT_COLUMNS[resource], THROTTLED_COLUMNS[resource])
        )
        pods = None
        if owners.size > len(groups):
            pod_grid = usage_grid(pod_codes, times, values, owners.size, grid_end, width, STEP_SECONDS)
            pods = (pod_grid, owners)
        lines = served_lines(grid, grid_start, plan, model, (limit, throttled), settings.forecast, step, pods)
        frames.append(_rows(lines, issues, plan.every_seconds, groups, resource))
    step("writing")
    return pd.concat(frames, ignore_index=True), time.monotonic() - started


def _rows(
    lines: FloatArray, issues: np.ndarray, every_seconds: int, names: pd.DataFrame, resource: str
) -> pd.DataFrame:
    """One row per (issue, container, step) where a line was issued."""
    per_issue = every_seconds // STEP_SECONDS
    issue_index, row = np.nonzero(~np.isnan(lines))
    offsets = np.arange(per_issue, dtype=np.int64) * STEP_SECONDS
    issued = np.repeat(issues[issue_index], per_issue)
    picked = np.repeat(row, per_issue)
    return pd.DataFrame(
        {
            "namespace": pd.Categorical(names["namespace"].to_numpy()[picked]),
            "workload": pd.Categorical(names["workload"].to_numpy()[picked]),
            "container": pd.Categorical(names["container"].to_numpy()[picked]),
            "resource": pd.Categorical(np.full(picked.size, resource), categories=list(RESOURCES)),
            "issued_at": issued,
            "step": issued + np.tile(offsets, issue_index.size),
            "value": np.repeat(lines[issue_index, row], per_issue),
        }
    )
