"""The four-line chart of Koordinator's resource model, for people who would rather look than read JSON.

Colours follow Koordinator's own diagrams: limit grey, usage red, short-term reservation dark blue, long-term
reservation light blue; the recommended request is drawn dashed beside them.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from recommender.atomic import atomic_write_bytes
from recommender.resources import ResourceRecommendation, WorkloadRecommendation
from recommender.units import GIB, SECONDS_PER_HOUR

LIMIT, USAGE, SHORT_TERM, LONG_TERM, TARGET = "#8c8c8c", "#d62728", "#08306b", "#6baed6", "#2ca02c"


#: Tick steps of the value axis: 1, 2 or 5 times a power of ten (matplotlib's default also allows 2.5).
ROUND_STEPS = (1, 2, 5, 10)


def _value_axis(axes: Axes) -> None:
    """The value axis from 0, ticked at round steps in the panel's one unit."""
    axes.set_ylim(bottom=0)
    axes.yaxis.set_major_locator(MaxNLocator(nbins=5, steps=ROUND_STEPS))


def _panel(
    axes: Axes,
    resource: ResourceRecommendation | None,
    recent: Sequence[float | None],
    limit: float | None,
    step_seconds: int,
    scale: float,
    unit: str,
    title: str,
) -> None:
    stale = resource is not None and resource.stale
    axes.set_title(title + (" (stale: no fresh forecast, lines held flat)" if stale else ""), fontsize=9)
    axes.set_ylabel(unit)
    axes.axvline(0, color="black", linewidth=0.5)
    if resource is None:
        axes.text(0.5, 0.5, "no samples", transform=axes.transAxes, ha="center")
        return
    hours_ahead = np.arange(len(resource.short_term)) * step_seconds / SECONDS_PER_HOUR
    hours_back = (np.arange(len(recent)) - len(recent)) * step_seconds / SECONDS_PER_HOUR
    usage = np.array([np.nan if v is None else v for v in recent], dtype=float) / scale
    span = (float(hours_back[0]) if len(recent) else 0.0, float(hours_ahead[-1]))
    if limit is not None:
        axes.hlines(limit / scale, *span, colors=LIMIT, linewidth=2, label="limit")
    axes.plot(hours_back, usage, color=USAGE, linewidth=1, label="usage")
    axes.step(
        hours_ahead,
        np.array(resource.short_term) / scale,
        where="post",
        color=SHORT_TERM,
        label="short-term reservation",
    )
    axes.hlines(resource.long_term / scale, 0, span[1], colors=LONG_TERM, linewidth=2, label="long-term reservation")
    axes.hlines(resource.target / scale, 0, span[1], colors=TARGET, linestyles="dashed", label="recommended request")
    axes.set_xlim(*span)
    _value_axis(axes)


def four_lines_figure(recommendations: Sequence[WorkloadRecommendation], step_seconds: int) -> Figure:
    """One row per workload container, CPU on the left and memory on the right; hours relative to as_of."""
    rows = max(len(recommendations), 1)
    figure, axes = plt.subplots(rows, 2, figsize=(12, 2.8 * rows), squeeze=False)
    for row, rec in enumerate(recommendations):
        history_cpu = rec.history.recent_cpu_cores if rec.history else []
        history_memory = rec.history.recent_memory_bytes if rec.history else []
        name = f"{rec.namespace}/{rec.workload}/{rec.container}"
        _panel(
            axes[row][0], rec.cpu, history_cpu, rec.current.cpu_limit_cores, step_seconds, 1.0, "cores", f"{name}: CPU"
        )
        _panel(
            axes[row][1],
            rec.memory,
            history_memory,
            rec.current.memory_limit_bytes,
            step_seconds,
            GIB,
            "GiB",
            f"{name}: memory",
        )
    for column in range(2):
        axes[rows - 1][column].set_xlabel("hours from the decision time (past: observed, future: forecast)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="upper center", ncol=5, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.25 / rows))
    return figure


def _node_panel(axes: Axes, line: Mapping[str, Any], step_seconds: int, scale: float, unit: str, title: str) -> None:
    axes.set_title(title, fontsize=9)
    axes.set_ylabel(unit)
    axes.axvline(0, color="black", linewidth=0.5)
    usage = np.array([np.nan if v is None else v for v in line["usage"]], dtype=float) / scale
    hours_back = (np.arange(len(usage)) - len(usage)) * step_seconds / SECONDS_PER_HOUR
    short = np.asarray(line["short_term_reservation"], dtype=float) / scale
    hours_ahead = np.arange(len(short)) * step_seconds / SECONDS_PER_HOUR
    span = (float(hours_back[0]) if len(usage) else 0.0, float(hours_ahead[-1]) if len(short) else 24.0)
    if line["allocatable"] is not None:
        axes.hlines(line["allocatable"] / scale, *span, colors="black", linestyles="dotted", label="allocatable")
    if line["limit"] is not None:
        axes.hlines(line["limit"] / scale, *span, colors=LIMIT, linewidth=2, label="limit (HP requests)")
    axes.plot(hours_back, usage, color=USAGE, linewidth=1, label="usage (HP, pooled)")
    axes.step(hours_ahead, short, where="post", color=SHORT_TERM, label="short-term reservation")
    axes.hlines(
        line["long_term_reservation"] / scale, 0, span[1], colors=LONG_TERM, linewidth=2, label="long-term reservation"
    )
    found = line["reclaimable"]
    if found is not None and line["allocatable"] is not None:
        top = line["allocatable"] / scale
        axes.fill_between(
            [0, span[1]], top - found["batch"] / scale, top, color="#2ca02c", alpha=0.15, label="batch room (ours)"
        )
        axes.hlines(
            top - found["koordinator"]["usage"] / scale,
            0,
            span[1],
            colors="#ff7f0e",
            linestyles="dashed",
            label="batch room starts (Koordinator usage)",
        )
    axes.set_xlim(*span)
    _value_axis(axes)


def node_lines_figure(lines: Mapping[str, Any]) -> Figure:
    """A node's lines (the REST NodeLines as a dict): CPU left, memory right; hours relative to as_of."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 3.6))
    step = int(lines["step_seconds"])
    _node_panel(axes[0], lines["cpu_cores"], step, 1.0, "cores", f"{lines['node']}: CPU")
    _node_panel(axes[1], lines["memory_bytes"], step, GIB, "GiB", f"{lines['node']}: memory")
    for ax in axes:
        ax.set_xlabel("hours from the decision time (past: observed, future: forecast)")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="upper center", ncol=4, fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, 0, 1, 0.82))
    return figure


def png_bytes(figure: Figure) -> bytes:
    """Render to PNG and release the figure."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    plt.close(figure)
    return buffer.getvalue()


def save_png(figure: Figure, path: Path) -> None:
    """Render to PNG and write atomically."""
    atomic_write_bytes(path, png_bytes(figure))
