"""The backtest's report: a markdown table per part of the decision days, and PNG charts.

Charts: violation rate against overprovision as each method's short-term line is scaled by alpha (one curve per
method, CPU and memory), and a few example containers with their usage and our four lines on one decision day.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from models.metrics import CHURN_FACTOR, LineScore, overprovision, usage_to_line_ratio
from pipelines.backtest import (
    CHURN_LINES,
    DAY,
    LINES,
    LIVE_EVERY_SECONDS,
    RESOURCES,
    BacktestResult,
    Fleet,
    MethodScores,
)
from presentation.charts import save_png
from recommender.atomic import atomic_write_text

LINE_TITLES = {"short_term": "short-term", "request": "request", "long_term": "long-term"}


def _pct(value: float) -> str:
    if np.isnan(value):
        return "n/a"
    return "inf" if not np.isfinite(value) else f"{value * 100:.2f} %"


def markdown_table(scores: dict[str, dict[str, MethodScores]]) -> str:
    """One row per resource, line and method: raw, matched 1 % and 5 % (with p90 container violation), peak."""
    rows = [
        "| resource | line | method | violation | overprovision | p90 container violation | overprov. @1 % | p90 viol. @1 % "
        "| overprov. @5 % | p90 viol. @5 % | peak MdAPE | days above peak |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for resource, methods in scores.items():
        for line in LINES:
            for method, result in methods.items():
                s = result.lines[line]
                one, five = s.matched
                rows.append(
                    f"| {resource} | {LINE_TITLES[line]} | {method} | {_pct(s.violation)} | {_pct(s.overprovision)} "
                    f"| {_pct(s.p90_container_violation)} | {_pct(one.overprovision)} | {_pct(one.p90_container_violation)} "
                    f"| {_pct(five.overprovision)} | {_pct(five.p90_container_violation)} "
                    f"| {_pct(result.peak.median_absolute_percentage_error)} | {_pct(result.peak.exceeded_fraction)} |"
                )
    return "\n".join(rows)


def report_markdown(result: BacktestResult, source: str) -> str:
    """The whole report: protocol summary, then the table for all, validation and held-out decision days."""
    first = result.origin + result.decision_days[0] * DAY
    last = result.origin + result.decision_days[-1] * DAY
    half = len(result.decision_days) // 2
    parts = [
        f"# Backtest of {source}",
        "",
        f"{len(result.decision_days)} decisions, daily at 00:00 UTC from {first} to {last} (Unix seconds); "
        f"validation = the first {half} decision days, held out = the remaining {len(result.decision_days) - half}. "
        f"Wall time {result.seconds:.0f} s.",
        "",
    ]
    for part, title in (("all", "All decision days"), ("validation", "Validation days"), ("held_out", "Held-out days")):
        parts += [f"## {title}", "", markdown_table(result.scores[part]), ""]
    if any(result.live["all"].values()):
        parts += ["## The live cadence", "", LIVE_INTRO.format(minutes=LIVE_EVERY_SECONDS // 60), ""]
        for part, title in (("all", "all"), ("validation", "validation"), ("held_out", "held-out")):
            parts += [f"### {title.capitalize()} days", "", live_table(result.live[part]), ""]
    parts += ["## Day-to-day movement", "", churn_table(result.scores["all"]), ""]
    parts += ["## Model choices", "", choice_table(result), ""]
    return "\n".join(parts)


LIVE_INTRO = (
    "The short-term line as the live loop serves it: `ours_live` is re-issued every {minutes} minutes from the "
    "samples before each issue (the learned line of `recommender replay`, refitted weekly on earlier rows and "
    "calibrated online); `ours_day_ahead` is the short-term line above, issued once a day; `max_1h` and `max_6h` "
    "are the max of the last hour and of the last 6 hours, re-issued as often. The same samples as the day-ahead "
    "lines'. Compare at the level the line is built for (`forecast.short_term_target_violation`)."
)


def live_table(scores: dict[str, dict[str, LineScore]]) -> str:
    """One row per resource and line at the live cadence: raw violation, matched 1 % and 5 % (with p90)."""
    rows = [
        "| resource | line | violation | overprov. @1 % | p90 viol. @1 % | overprov. @5 % | p90 viol. @5 % |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for resource, methods in scores.items():
        for method, s in methods.items():
            one, five = s.matched
            rows.append(
                f"| {resource} | {method} | {_pct(s.violation)} | {_pct(one.overprovision)} "
                f"| {_pct(one.p90_container_violation)} | {_pct(five.overprovision)} "
                f"| {_pct(five.p90_container_violation)} |"
            )
    return "\n".join(rows)


def churn_table(scores: dict[str, dict[str, MethodScores]]) -> str:
    """Per resource, constant line and method: the share of a container's changes from one decision day to the
    next beyond 1.5x either way (`line_churn`), which the scores above do not see."""
    rows = [
        f"| resource | line | method | changes beyond {CHURN_FACTOR:g}x from one day to the next |",
        "|---|---|---|---:|",
    ]
    for resource, methods in scores.items():
        for line in CHURN_LINES:
            for method, result in methods.items():
                rows.append(f"| {resource} | {LINE_TITLES[line]} | {method} | {_pct(result.churn[line])} |")
    return "\n".join(rows)


def choice_table(result: BacktestResult) -> str:
    """Share of the (container, decision day) pairs on which the selection picked each candidate."""
    rows = ["| resource | line | candidate | share |", "|---|---|---|---:|"]
    for resource, decisions in result.decisions.items():
        for line, choices in decisions.choices.items():
            names = result.candidate_names[line]
            picked = choices[~np.isnan(choices)].astype(np.int64)
            counts = np.bincount(picked, minlength=len(names))
            for index in np.argsort(-counts):
                if counts[index]:
                    rows.append(
                        f"| {resource} | {LINE_TITLES[line]} | `{names[index]}` | {_pct(counts[index] / counts.sum())} |"
                    )
    return "\n".join(rows)


def tradeoff_figure(fleet: Fleet, result: BacktestResult) -> Figure:
    """Violation against overprovision of each method's short-term line as alpha sweeps (pooled, all days)."""
    figure, axes = plt.subplots(1, len(RESOURCES), figsize=(11, 4.2))
    per_day = fleet.steps_per_day
    alphas = np.geomspace(0.3, 20, 60)
    for ax, resource in zip(np.atleast_1d(axes), RESOURCES):
        pods = fleet.pod_grid[resource]
        for method, lines in result.decisions[resource].short_term.items():
            usage, values = [], []
            for i, day in enumerate(result.decision_days):
                future = pods[:, day * per_day : (day + 1) * per_day]
                line = lines[i][fleet.pod_group]
                mask = ~np.isnan(future) & ~np.isnan(line)
                usage.append(future[mask])
                values.append(line[mask])
            u, v = np.concatenate(usage), np.concatenate(values)
            ratio = np.sort(usage_to_line_ratio(u, v))
            violation = 1.0 - np.searchsorted(ratio, alphas, side="right") / max(ratio.size, 1)
            over = [overprovision(u, v, a) for a in alphas]
            ax.plot(np.asarray(over) * 100, violation * 100, label=method, linewidth=2.2 if method == "ours" else 1.2)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("overprovision (%)")
        ax.set_ylabel("violation (%)")
        ax.set_title(f"short-term line, {resource}: line x alpha", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].legend(fontsize=7)
    return figure


def examples_figure(fleet: Fleet, result: BacktestResult, count: int = 4) -> Figure:
    """The busiest containers on the last decision day: usage and our short-term, request and long-term lines."""
    per_day = fleet.steps_per_day
    index = len(result.decision_days) - 1
    day = result.decision_days[index]
    # The busiest containers of the day by total CPU (NaN samples count as nothing).
    busiest = np.argsort(-np.nansum(fleet.group_grid["cpu"][:, day * per_day : (day + 1) * per_day], axis=1))[:count]
    figure, axes = plt.subplots(len(busiest), len(RESOURCES), figsize=(11, 2.4 * len(busiest)), squeeze=False)
    hours = np.arange(per_day) * fleet.step_seconds / 3600
    for row, group in enumerate(busiest):
        for col, resource in enumerate(RESOURCES):
            ax = axes[row, col]
            decisions = result.decisions[resource]
            ax.plot(
                hours,
                fleet.group_grid[resource][group, day * per_day : (day + 1) * per_day],
                color="#d62728",
                lw=0.8,
                label="usage",
            )
            ax.plot(hours, decisions.short_term["ours"][index, group], color="#08306b", lw=1.2, label="short-term")
            ax.axhline(decisions.long_term["ours"][index, group], color="#6baed6", lw=1.2, label="long-term")
            ax.axhline(decisions.request["ours"][index, group], color="#2ca02c", ls="--", lw=1.2, label="request")
            ax.axhline(decisions.request["vpa"][index, group], color="#8c8c8c", ls=":", lw=1.0, label="VPA target")
            ax.set_title(f"{json.loads(fleet.groups[group])[1]} {resource}", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[-1, 0].set_xlabel("hours after the decision")
    axes[0, 0].legend(fontsize=6, ncol=3)
    figure.tight_layout()
    return figure


def write_report(directory: Path, fleet: Fleet, result: BacktestResult, source: str) -> list[Path]:
    """Write report.md and the two charts into `directory`; returns the written paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [directory / "report.md", directory / "tradeoff.png", directory / "examples.png"]
    atomic_write_text(written[0], report_markdown(result, source))
    save_png(tradeoff_figure(fleet, result), written[1])
    save_png(examples_figure(fleet, result), written[2])
    return written
