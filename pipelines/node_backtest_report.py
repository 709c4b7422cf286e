"""The --nodes backtest's report: markdown tables (per part, scenario, resource and node) and PNG charts."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from pipelines.backtest import RESOURCES
from pipelines.node_backtest import (
    BATCH_METHODS,
    FAIR_PAIRS,
    MID_METHODS,
    SWEEP_PARTS,
    NodeBacktestResult,
    Offered,
    Point,
    summarize,
)
from presentation.charts import save_png
from recommender.atomic import atomic_write_text
from recommender.units import GIB

UNIT = {"cpu": ("core-h", 1.0), "memory": ("GiB-h", GIB)}
COLOURS = {
    "ours": "#08306b",
    "ours_live": "#8c564b",
    "ours_live_line": "#bcbd22",
    "ours_forecast_only": "#2ca02c",
    "koordinator_our_ratio": "#17becf",
    "koordinator_usage": "#d62728",
    "koordinator_request": "#ff7f0e",
    "koordinator_maxUsageRequest": "#9467bd",
    "ours_mid": "#6baed6",
    "koordinator_mid": "#e377c2",
}
REFERENCE = {
    "ours": "koordinator_usage",
    "ours_live": "koordinator_usage",
    "ours_live_line": "koordinator_usage",
    "ours_forecast_only": "koordinator_usage",
    "koordinator_our_ratio": "koordinator_usage",
    "ours_mid": "koordinator_mid",
}


def methods_of(result: NodeBacktestResult, resource: str) -> list[str]:
    """The methods reported for a resource, in table order: Koordinator's CPU has no "request" policy."""
    present = result.summaries["all"]["complete"][resource]
    return [m for m in (*BATCH_METHODS, *MID_METHODS) if m in present]


def summary_table(result: NodeBacktestResult, part: str, scenario: str, resource: str) -> str:
    """One resource's methods: reclaimed room, its ratio to the Koordinator rule it replaces, violations, jumpiness."""
    unit, scale = UNIT[resource]
    rows = [
        f"| method | reclaimed ({unit}) | vs Koordinator | mean offered / allocatable | violations (node-steps) "
        "| violation rate | drops to 0 | mean step change |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    found = result.summaries[part][scenario][resource]
    for method in methods_of(result, resource):
        s = found[method]
        reference = found[REFERENCE[method]] if method in REFERENCE else None
        ratio = (
            f"{(s.reclaimed / reference.reclaimed - 1) * 100:+.1f} %" if reference and reference.reclaimed > 0 else ""
        )
        rows.append(
            f"| {method} | {s.reclaimed / scale:,.0f} | {ratio} | {s.reclaimed_share * 100:.1f} % | {s.violations} | "
            f"{s.violation_rate * 100:.3f} % | {s.zero_drops} | {s.mean_change * 100:.2f} % |"
        )
    return "\n".join(rows)


def node_table(result: NodeBacktestResult, resource: str, scenario: str = "complete") -> str:
    """Per node: allocatable, and reclaimed room and violations of ours and Koordinator's usage policy (all days)."""
    unit, scale = UNIT[resource]
    offers = result.offered[scenario][resource]
    rows = [
        f"| node | pods | allocatable | ours reclaimed ({unit}) | Koordinator usage reclaimed | ours violations | Koordinator usage violations |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    pods = np.bincount(result.placement.node_of_pod, minlength=len(result.placement.names))
    for row, name in enumerate(result.placement.names):
        one = Offered(
            offers.hp[row : row + 1],
            offers.allocatable[row : row + 1],
            offers.short_term[row : row + 1],
            offers.long_term[row : row + 1],
        )
        one.batch = {m: offers.batch[m][row : row + 1] for m in ("ours", "koordinator_usage")}
        ours, koord = (summarize(one, m, slice(None), result.step_seconds) for m in ("ours", "koordinator_usage"))
        rows.append(
            f"| {name} | {pods[row]} | {offers.allocatable[row] / scale:g} | {ours.reclaimed / scale:,.0f} | {koord.reclaimed / scale:,.0f} | "
            f"{ours.violations} | {koord.violations} |"
        )
    return "\n".join(rows)


def sweep_table(result: NodeBacktestResult, resource: str) -> str:
    """Room (vs Koordinator's usage policy) and violations of the two unfloored paths at every swept margin, on the
    validation days (where the defaults are chosen) and the held-out days; the chosen margins in a closing line."""
    reference = {part: result.summaries[part]["complete"][resource]["koordinator_usage"] for part in SWEEP_PARTS}
    methods = list(result.sweeps[resource])
    header = " | ".join(f"{m} {part.replace('_', ' ')}: room, violations" for m in methods for part in SWEEP_PARTS)
    rows = [f"| margin | {header} |", "|---:|" + "---:|" * len(methods) * len(SWEEP_PARTS)]
    for position, (fraction, _) in enumerate(result.sweeps[resource][methods[0]]):
        cells = []
        for method in methods:
            found = result.sweeps[resource][method][position][1]
            for part in SWEEP_PARTS:
                base = reference[part].reclaimed
                ratio = f"{(found[part].reclaimed / base - 1) * 100:+.1f} %" if base > 0 else "n/a"
                cells.append(f"{ratio}, {found[part].violations}")
        rows.append(f"| {fraction * 100:g} % | " + " | ".join(cells) + " |")
    bounds = ", ".join(f"{part.replace('_', ' ')} {reference[part].violations}" for part in SWEEP_PARTS)
    chosen = "; ".join(
        f"{m}: {'none of the swept margins' if (c := result.chosen_margin(resource, m)) is None else f'{c * 100:g} %'}"
        for m in methods
    )
    rows += [
        "",
        f"Koordinator usage policy violations: {bounds}. Smallest margin at most as many on the validation days: {chosen}.",
    ]
    return "\n".join(rows)


def fair_table(result: NodeBacktestResult, resource: str) -> str:
    """Each method against Koordinator with its knob tuned on the validation days to at most the method's violations
    there (usage policy: reclaim threshold; mid: koordlet's safety margin), both judged on the held-out days."""
    rows = [
        "| method | Koordinator rule, tuned knob | validation violations (ours / tuned) | held-out room vs tuned "
        "| held-out violations (ours / tuned) |",
        "|---|---|---:|---:|---:|",
    ]
    for method, tuned in result.fair[resource].items():
        ours = {part: result.summaries[part]["complete"][resource][method] for part in SWEEP_PARTS}
        rule = FAIR_PAIRS[method]
        if tuned is None:
            rows.append(f"| {method} | {rule}: no swept value as safe | {ours['validation'].violations} / - | | |")
            continue
        value, found = tuned
        knob = f"threshold {value:.0f} %" if rule == "usage" else f"safety margin {value:.0f} %"
        base = found["held_out"].reclaimed
        ratio = f"{(ours['held_out'].reclaimed / base - 1) * 100:+.1f} %" if base > 0 else "n/a"
        rows.append(
            f"| {method} | {rule}, {knob} | {ours['validation'].violations} / {found['validation'].violations} | "
            f"{ratio} | {ours['held_out'].violations} / {found['held_out'].violations} |"
        )
    return "\n".join(rows)


def _point(point: Point | None, unit: str, scale: float) -> str:
    if point is None:
        return "none within the budget"
    knob, found = point
    return f"{knob}: {found.reclaimed / scale:,.0f} {unit}, {found.violations}"


def equal_table(result: NodeBacktestResult, resource: str) -> str:
    """Room against Koordinator's usage policy at equal violations (complete metrics), per part and method: at the
    method's violation count as served, and at 0.1 % and 1 % of the part's node-steps (each side's best swept point
    with at most that many violations)."""
    unit, scale = UNIT[resource]
    rows = [
        "| part | method (as served) | budget (node-steps) | ours: knobs, room, violations | Koordinator usage: "
        "threshold, room, violations | room vs Koordinator |",
        "|---|---|---|---|---|---:|",
    ]
    for method, parts in result.equal.get(resource, {}).items():
        for part, found in parts.items():
            for budget, at in found.at.items():
                label = f"our count, {at.budget}" if budget == "ours" else f"{budget}, {at.budget}"
                gain = "n/a" if at.gain is None else f"{at.gain * 100:+.1f} %"
                rows.append(
                    f"| {part.replace('_', ' ')} | {method} ({found.served}) | {label} | "
                    f"{_point(at.ours, unit, scale)} | {_point(at.koordinator, unit, scale)} | {gain} |"
                )
    return "\n".join(rows)


def line_sweep_table(result: NodeBacktestResult, resource: str) -> str:
    """Room (vs Koordinator's usage policy at its default) and violations of the node live line at every swept
    factor and every whole-percent margin, on the validation and the held-out days; the rule's knobs in a closing
    line."""
    reference = {part: result.summaries[part]["complete"][resource]["koordinator_usage"] for part in SWEEP_PARTS}
    swept = result.line_sweeps.get(resource, [])
    factors = sorted({factor for (factor, _), _ in swept})
    rows = [
        "| margin | " + " | ".join(f"factor {factor:g}" for factor in factors) + " |",
        "|---:|" + "---:|" * len(factors),
    ]
    cells: dict[float, list[str]] = {}
    for (_, fraction), found in swept:
        if abs(fraction * 100 - round(fraction * 100)) > 1e-9:
            continue
        text = []
        for part in SWEEP_PARTS:
            base = reference[part].reclaimed
            text.append(f"{(found[part].reclaimed / base - 1) * 100:+.0f} %" if base > 0 else "n/a")
        violations = "/".join(str(found[part].violations) for part in SWEEP_PARTS)
        cells.setdefault(fraction, []).append(f"{' / '.join(text)}, {violations}")
    rows += [f"| {fraction * 100:g} % | " + " | ".join(values) + " |" for fraction, values in cells.items()]
    chosen = result.chosen_line_knobs(resource) if result.equal else None
    rows += [
        "",
        "Each cell: room against Koordinator's usage policy at its default threshold, validation / held out; "
        "violations, validation / held out. The knobs with the most validation room against Koordinator's usage "
        "policy at equal violations (`chosen_line_knobs`): "
        + ("none of the swept knobs" if chosen is None else f"factor {chosen[0]:g}, margin {chosen[1] * 100:g} %")
        + ".",
    ]
    return "\n".join(rows)


def report_markdown(result: NodeBacktestResult, source: str) -> str:
    days = result.decision_days
    lines = [
        f"# Node colocation backtest of {source}",
        "",
        f"{len(result.placement.names)} nodes; placement: {result.placement.rule}. {len(days)} decision days "
        f"(days {days[0]}-{days[-1]} after {result.origin}); {result.seconds:.0f} s.",
        "Reclaimed: batch (or mid) room offered, summed over nodes and 5-minute steps. Violation: a node-step where the "
        "high-priority usage exceeded allocatable minus the room offered. 'vs Koordinator': ours against Koordinator's "
        "usage policy (batch) or mid rule (mid).",
        "",
    ]
    for part in ("all", "validation", "held_out"):
        for scenario in ("complete", "outages"):
            for resource in RESOURCES:
                lines += [
                    f"## {part} days, {scenario} metrics, {resource}",
                    "",
                    summary_table(result, part, scenario, resource),
                    "",
                ]
    for resource in RESOURCES:
        lines += [f"## Per node, {resource} (all days, complete metrics)", "", node_table(result, resource), ""]
    for resource in RESOURCES:
        lines += [
            f"## Fair comparison, {resource} (complete metrics; Koordinator tuned on the validation days)",
            "",
            fair_table(result, resource),
            "",
        ]
    for resource in RESOURCES:
        lines += [
            f"## Room at equal violations, {resource} (complete metrics; against Koordinator's usage policy, its "
            "threshold swept)",
            "",
            equal_table(result, resource),
            "",
        ]
    for resource in RESOURCES:
        lines += [
            f"## Node live line sweep, {resource} (complete metrics; factor on the line, margin as a share of allocatable)",
            "",
            line_sweep_table(result, resource),
            "",
        ]
    for resource in RESOURCES:
        lines += [
            f"## Margin sweep, {resource} (complete metrics; margin as a share of allocatable)",
            "",
            sweep_table(result, resource),
            "",
        ]
    return "\n".join(lines)


def _hourly(values: np.ndarray, per_hour: int) -> np.ndarray:
    usable = values.shape[-1] // per_hour * per_hour
    return np.asarray(np.nanmean(values[..., :usable].reshape(*values.shape[:-1], -1, per_hour), axis=-1))


def over_time_figure(result: NodeBacktestResult, scenario: str = "complete") -> Figure:
    """Fleet-wide room offered per method (hourly means) against the high-priority usage, and violations per day."""
    per_hour = 3600 // result.step_seconds
    figure, axes = plt.subplots(2, len(RESOURCES), figsize=(13, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for col, resource in enumerate(RESOURCES):
        unit, scale = UNIT[resource]
        offers = result.offered[scenario][resource]
        hours = np.arange(offers.hp.shape[1] // per_hour) / 24 + result.decision_days[0]
        top, bottom = axes[0, col], axes[1, col]
        top.plot(
            hours,
            _hourly(np.nansum(offers.hp, axis=0), per_hour) / scale,
            color="black",
            lw=0.8,
            label="high-priority usage",
        )
        top.axhline(offers.allocatable.sum() / scale, color="#8c8c8c", lw=1, ls="--", label="allocatable")
        for method in methods_of(result, resource):
            offered = _hourly(offers.batch[method].sum(axis=0), per_hour) / scale
            top.plot(hours, offered, color=COLOURS[method], lw=1.6 if method == "ours" else 0.9, label=method)
            violated = (offers.hp > offers.allocatable[:, None] - offers.batch[method] + 1e-9).sum(axis=0)
            per_day = (
                violated[: violated.size // (24 * per_hour) * 24 * per_hour].reshape(-1, 24 * per_hour).sum(axis=1)
            )
            bottom.plot(
                np.arange(per_day.size) + result.decision_days[0] + 0.5,
                per_day,
                marker="o",
                ms=3,
                color=COLOURS[method],
                lw=0.8,
            )
        top.set_title(f"{resource}: room offered to batch/mid pods, all nodes ({scenario} metrics)", fontsize=9)
        top.set_ylabel(unit.split("-")[0])
        bottom.set_ylabel("violations / day")
        bottom.set_xlabel("day of the trace")
    axes[0, 0].legend(fontsize=7, ncol=2)
    figure.tight_layout()
    return figure


def node_lines_figure(result: NodeBacktestResult, days: int = 3) -> Figure:
    """The four lines of the busiest node over the first `days` held-out days, with the batch offers."""
    per_day = 86400 // result.step_seconds
    start = len(result.decision_days) // 2 * per_day
    offers_cpu = result.offered["complete"]["cpu"]
    window = slice(start, min(start + days * per_day, offers_cpu.hp.shape[1]))  # fewer when fewer are held out
    node = int(np.nanargmax(np.nanmean(offers_cpu.hp / offers_cpu.allocatable[:, None], axis=1)))
    figure, axes = plt.subplots(1, len(RESOURCES), figsize=(13, 3.8))
    for ax, resource in zip(axes, RESOURCES):
        unit, scale = UNIT[resource]
        offers = result.offered["complete"][resource]
        hours = np.arange(window.stop - window.start) * result.step_seconds / 3600
        alloc = offers.allocatable[node] / scale
        ax.axhline(alloc, color="#8c8c8c", lw=1.5, label="allocatable")
        ax.plot(hours, offers.hp[node, window] / scale, color="#d62728", lw=0.8, label="usage (high priority)")
        ax.plot(hours, offers.short_term[node, window] / scale, color="#08306b", lw=1, label="short-term reservation")
        ax.plot(hours, offers.long_term[node, window] / scale, color="#6baed6", lw=1.5, label="long-term reservation")
        ax.plot(
            hours,
            alloc - offers.batch["ours"][node, window] / scale,
            color="#08306b",
            ls=":",
            lw=1.2,
            label="left for HP (ours)",
        )
        ax.plot(
            hours,
            alloc - offers.batch["koordinator_usage"][node, window] / scale,
            color="#ff7f0e",
            ls=":",
            lw=1.2,
            label="left for HP (Koordinator usage)",
        )
        ax.set_title(
            f"{result.placement.names[node]} {resource} ({unit.split('-')[0]}), "
            f"hours from held-out day {result.decision_days[len(result.decision_days) // 2]}",
            fontsize=9,
        )
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    return figure


def write_node_report(directory: Path, result: NodeBacktestResult, source: str) -> list[Path]:
    """report.md, over-time.png and node-lines.png in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = [
        directory / "report.md",
        directory / "nodes-over-time.png",
        directory / "nodes-outages.png",
        directory / "node-lines.png",
    ]
    atomic_write_text(written[0], report_markdown(result, source))
    save_png(over_time_figure(result), written[1])
    save_png(over_time_figure(result, "outages"), written[2])
    save_png(node_lines_figure(result), written[3])
    return written
