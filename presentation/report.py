"""What `recommender show` writes: the overview (the dashboard's own computation, `presentation.overview`) of the
chosen workloads as a table, JSON, YAML, CSV or a self-contained HTML report.

Every format carries the same numbers: per container the current request (the limit only where there is no
request), the recommendation, the change (recommended - current: negative frees resources) per replica and times the
replicas, its risks; totals per namespace and
for everything shown. JSON and YAML also carry the recommendations themselves (bounds, lines, models).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import jinja2
import yaml
from rich.table import Table
from rich.text import Text

from presentation.overview import Overview, Totals, WorkloadSummary, overview
from presentation.settings import OverviewSettings
from recommender.resources import RecommendationSet
from recommender.text import printable
from recommender.units import GIB

FORMATS = ("table", "json", "yaml", "csv", "html")


def chosen(
    recommendations: RecommendationSet, namespaces: Sequence[str], workloads: Sequence[str]
) -> RecommendationSet:
    """The recommendations of the namespaces and workloads matching any of the globs (all where none is given)."""

    def keep(value: str, patterns: Sequence[str]) -> bool:
        return not patterns or any(fnmatch.fnmatchcase(value, p) for p in patterns)

    kept = [r for r in recommendations.recommendations if keep(r.namespace, namespaces) and keep(r.workload, workloads)]
    return recommendations.model_copy(update={"recommendations": kept})


def payload(version: str, recommendations: RecommendationSet, settings: OverviewSettings) -> dict[str, Any]:
    """The JSON / YAML document: the version, the overview (totals and rows) and the recommendations."""
    found: dict[str, Any] = {"version": version, **json.loads(recommendations.model_dump_json())}
    found["overview"] = json.loads(overview(recommendations, settings).model_dump_json())
    return found


def as_json(document: dict[str, Any]) -> str:
    return json.dumps(document) + "\n"


def as_yaml(document: dict[str, Any]) -> str:
    return str(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


CSV_COLUMNS = (
    "namespace",
    "workload",
    "container",
    "kind",
    "replicas",
    "cpu_request_cores",
    "cpu_recommended_cores",
    "cpu_recommended_limit_cores",
    "cpu_change_cores",
    "cpu_change_cores_all_replicas",
    "memory_request_bytes",
    "memory_recommended_bytes",
    "memory_recommended_limit_bytes",
    "memory_change_bytes",
    "memory_change_bytes_all_replicas",
    "risks",
    "ceiling_rules",
    "stale",
)


def as_csv(found: Overview) -> str:
    """One row per container, numbers in cores and bytes (empty where unknown), risks and ceiling rules joined by
    '; ', and which resources are stale (`cpu`, `memory`, `cpu; memory` or empty: left out of the totals)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in found.workloads:
        cells: list[Any] = [row.namespace, row.workload, row.container, row.kind or "", row.replicas]
        for comparison in (row.cpu_cores, row.memory_bytes):
            cells += [
                comparison.current_request,
                comparison.recommended,
                comparison.recommended_limit,
                comparison.change,
                comparison.change_all_replicas,
            ]
        writer.writerow(
            ["" if v is None else v for v in cells]
            + ["; ".join(row.risks), "; ".join(row.ceiling_rules), _stale_resources(row)]
        )
    return buffer.getvalue()


def cores(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value:{'+' if signed else ''}.2f}"


def gib(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else f"{value / GIB:{'+' if signed else ''}.2f}"


def _stale_resources(row: WorkloadSummary) -> str:
    return "; ".join(name for name, c in (("cpu", row.cpu_cores), ("memory", row.memory_bytes)) if c.stale)


STALE_CELL = "stale"


def _row_cells(row: WorkloadSummary) -> list[str]:
    """A stale resource's changes read `stale`: nothing would be applied, and the totals leave them out."""
    cpu, memory = row.cpu_cores, row.memory_bytes
    return [
        str(row.replicas),
        f"{cores(cpu.current_request)} -> {cores(cpu.recommended)}",
        *([STALE_CELL] * 2 if cpu.stale else [cores(cpu.change, True), cores(cpu.change_all_replicas, True)]),
        f"{gib(memory.current_request)} -> {gib(memory.recommended)}",
        *([STALE_CELL] * 2 if memory.stale else [gib(memory.change, True), gib(memory.change_all_replicas, True)]),
    ]


def totals_line(totals: Totals) -> str:
    """One sentence of totals, per replica and across replicas."""
    return (
        f"CPU {totals.cpu_request_cores:.2f} -> {totals.cpu_recommended_cores:.2f} cores per replica "
        f"({totals.cpu_request_cores_all_replicas:.2f} -> {totals.cpu_recommended_cores_all_replicas:.2f} across replicas), "
        f"memory {gib(totals.memory_request_bytes)} -> {gib(totals.memory_recommended_bytes)} GiB per replica "
        f"({gib(totals.memory_request_bytes_all_replicas)} -> {gib(totals.memory_recommended_bytes_all_replicas)} across replicas); "
        f"{totals.at_risk} of {totals.containers} containers at risk"
        + (f", {totals.stale} stale (no samples for days: left out of these sums)" if totals.stale else "")
    )


NAMESPACE_HEADERS = ("containers", "at risk", "stale", "CPU cores", "CPU x replicas", "memory GiB", "mem. x replicas")


def _namespace_cells(t: Totals) -> list[str]:
    return [
        str(t.containers),
        str(t.at_risk),
        str(t.stale),
        f"{cores(t.cpu_request_cores)} -> {cores(t.cpu_recommended_cores)}",
        f"{cores(t.cpu_request_cores_all_replicas)} -> {cores(t.cpu_recommended_cores_all_replicas)}",
        f"{gib(t.memory_request_bytes)} -> {gib(t.memory_recommended_bytes)}",
        f"{gib(t.memory_request_bytes_all_replicas)} -> {gib(t.memory_recommended_bytes_all_replicas)}",
    ]


HEADERS = ("replicas", "CPU cores", "CPU change", "CPU x replicas", "memory GiB", "mem. change", "mem. x replicas")


def as_tables(found: Overview, title: str) -> list[Table]:
    """The containers and the totals per namespace, for a terminal (rich)."""
    rows = Table(title=f"Recommendations ({title})", title_justify="left")
    risky = any(row.risks for row in found.workloads)
    rows.add_column("namespace/workload", no_wrap=True)  # never cut short: it is what one copies
    rows.add_column("container", no_wrap=True)
    for column in HEADERS:
        rows.add_column(column, justify="right", overflow="fold")
    if risky:
        rows.add_column("risks", min_width=16)
    for row in found.workloads:
        cells: list[Text | str] = [
            Text(printable(f"{row.namespace}/{row.workload}")),
            Text(printable(row.container)),
            *_row_cells(row),
        ]
        rows.add_row(*cells, *([Text("; ".join(row.risks))] if risky else []))
    rows.caption = (
        "CPU cores, memory GiB: current request (the limit where there is none) -> recommended request, per replica; "
        "a change below zero frees resources; `stale`: no samples for days, so nothing would change and the totals "
        f"leave it out. Total: {totals_line(found.cluster)}."
    )
    namespaces = Table(title="Totals per namespace", title_justify="left")
    for column in ("namespace", *NAMESPACE_HEADERS):
        namespaces.add_column(column, justify="left" if column == "namespace" else "right")
    for name, totals in found.namespaces.items():
        namespaces.add_row(Text(printable(name)), *_namespace_cells(totals))
    return [rows, namespaces]


_HTML = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string("""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>koord-recommender: {{ title }}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; } th, td { padding: 4px 8px; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.risk { color: #a40000; } .muted { color: #666; }
</style></head><body>
<h1>Recommendations: {{ title }}</h1>
<p class="muted">Recommendations made for {{ as_of }} UTC. Current request (the limit where there is none) against the
recommended request, per replica and times each workload's current replicas; a change below zero frees resources;
"stale": no samples for days, so nothing would change and the totals leave it out.</p>
<p><strong>Total:</strong> {{ total }}.</p>
<h2>Totals per namespace</h2>
<table><thead><tr><th>namespace</th>{% for h in namespace_headers %}<th>{{ h }}</th>{% endfor %}</tr></thead><tbody>
{% for name, cells in namespaces %}<tr><td>{{ name }}</td>{% for c in cells %}<td class="num">{{ c }}</td>{% endfor %}</tr>
{% endfor %}</tbody></table>
<h2>Containers</h2>
<table><thead><tr><th>namespace/workload</th><th>container</th>{% for h in headers %}<th>{{ h }}</th>{% endfor %}<th>risks</th></tr></thead><tbody>
{% for row, cells in rows %}<tr><td>{{ row.namespace }}/{{ row.workload }}</td><td>{{ row.container }}</td>
{% for c in cells %}<td class="num">{{ c }}</td>{% endfor %}<td class="risk">{{ row.risks | join("; ") }}</td></tr>
{% endfor %}</tbody></table>
</body></html>
""")


def as_html(found: Overview, title: str) -> str:
    """A self-contained page (inline style, no script, nothing fetched): the same tables as `as_tables`."""
    return _HTML.render(
        title=printable(title),
        as_of=datetime.fromtimestamp(found.as_of, UTC).strftime("%Y-%m-%d %H:%M"),
        total=totals_line(found.cluster),
        headers=HEADERS,
        namespace_headers=NAMESPACE_HEADERS,
        namespaces=[(name, _namespace_cells(t)) for name, t in found.namespaces.items()],
        rows=[(row, _row_cells(row)) for row in found.workloads],
    )
