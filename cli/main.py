"""The `recommender` command line. This module is the composition root: the one place that wires the layers.

Every command builds `Settings` once (environment, then flags), passes it down, and turns our errors into a
one-line message on stderr and a non-zero exit code; progress goes to stderr so JSON on stdout stays clean.
"""

from __future__ import annotations

import atexit
import io
import os
import sys
import threading
import time
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import httpx
import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from cli.settings import Settings
from recommender import __version__
from recommender.atomic import atomic_write_bytes, atomic_write_text
from recommender.errors import (
    ConfigurationError,
    KubernetesError,
    RecommenderError,
    UnknownWorkloadError,
    missing_extra,
)
from recommender.text import printable
from recommender.units import (
    SECONDS_PER_DAY,
    cpu_cores_from_quantity,
    memory_bytes_from_quantity,
    parse_duration_seconds,
)

if TYPE_CHECKING:
    from pipelines.train import Executor

app = typer.Typer(
    name="recommender",
    help="koord-recommender: learn what CPU and memory Kubernetes workloads need, and tell the cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain help: rich markup would take "[default: 8080]" for a style tag and print "TCP port ." instead.
    rich_markup_mode=None,
)
#: A message to a pipe or a log file stays one line, however long its paths (rich would fold it at 80 columns there).
err = Console(stderr=True, soft_wrap=not sys.stderr.isatty())
#: Wide enough for the recommendation table when stdout is a pipe or a file (rich assumes 80 columns there).
out = Console(width=None if sys.stdout.isatty() else 150)


def _env(group: str, field: str, shown: str | None = None) -> str:
    """The end of an option's help: the setting's default and environment variable, read from `Settings` so that
    help and configuration cannot drift (`shown`: the default as the flag takes it, e.g. 14d for seconds)."""
    model = Settings.model_fields[group].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    default = model.model_fields[field].get_default(call_default_factory=True)
    if shown is None:
        shown = (
            "none"
            if default in (None, {}, [])
            else ("on" if default is True else "off" if default is False else str(default))
        )
    return f" [default: {shown}; env KOORD_RECOMMENDER_{group.upper()}__{field.upper()}]"


StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store", help="Model store: a directory or an fsspec URL such as s3://bucket/prefix." + _env("store", "path")
    ),
]


class Format(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"
    html = "html"


def _settings(**groups: dict[str, Any]) -> Settings:
    """Settings from the environment, with the given per-group values (None = keep) laid on top."""
    try:
        settings = Settings()
        updates = {}
        for group, values in groups.items():
            given = {k: v for k, v in values.items() if v is not None}
            if given:
                current: BaseModel = getattr(settings, group)
                updates[group] = type(current).model_validate({**current.model_dump(), **given})
        return settings.model_copy(update=updates)
    except ValidationError as error:
        raise ConfigurationError(f"invalid settings: {error}") from None


TargetViolationOption = Annotated[
    float | None,
    typer.Option(
        "--target-violation",
        help="Risk level: the share of 5-minute samples each line may be under, e.g. 0.01 or 0.05 (like VPA's target "
        "percentile, 0.05 = p95); sets the short-term, request and long-term lines [default: 0.01; env "
        "KOORD_RECOMMENDER_FORECAST__SHORT_TERM_TARGET_VIOLATION, __REQUEST_TARGET_VIOLATION, "
        "__LONG_TERM_TARGET_VIOLATION; per namespace or workload: KOORD_RECOMMENDER_FORECAST__TARGET_VIOLATION_OVERRIDES].",
    ),
]


def _forecast_levels(target_violation: float | None) -> dict[str, Any]:
    """The forecast group's per-line levels for `--target-violation` (nothing when not given)."""
    if target_violation is None:
        return {}
    if not 0 < target_violation < 0.5:
        raise ConfigurationError(f"--target-violation: {target_violation} is not a share between 0 and 0.5 (e.g. 0.01)")
    return {f"{line}_target_violation": target_violation for line in ("short_term", "request", "long_term")}


def _duration(text: str, option: str) -> int:
    try:
        return parse_duration_seconds(text)
    except ValueError as error:
        raise ConfigurationError(f"{option}: {error}") from None


#: The longest `--horizon`: the long-term line's week (models.ensemble.LONG_TERM_DAYS), the furthest ahead any line
#: is scored. The short-term line holds a value a step, so an unbounded horizon was unbounded memory (100000d: 5.9 GB).
MAX_HORIZON_DAYS = 7
HORIZON_HELP = f"e.g. 24h; at most {MAX_HORIZON_DAYS}d, the long-term line's week"
#: The latest `--as-of`: the end of the year 9999, the last a date can be written in (a time in milliseconds is past it).
LATEST_AS_OF = 253_402_300_799


def _horizon(text: str) -> int:
    seconds = _duration(text, "--horizon")
    if seconds > MAX_HORIZON_DAYS * SECONDS_PER_DAY:
        raise ConfigurationError(
            f"--horizon {text}: at most {MAX_HORIZON_DAYS}d, the long-term line's week (the furthest the models forecast)"
        )
    return seconds


def _as_of(value: int) -> int:
    if not 0 <= value <= LATEST_AS_OF:
        raise ConfigurationError(
            f"--as-of {value}: not a Unix time in seconds from 0 to {LATEST_AS_OF} (the end of the year 9999)"
        )
    return value


def _writable(path: Path, option: str) -> Path:
    """`path`, once it is known a file can be written there: a directory, or a path under a file or in a directory
    that is not ours, is said before the work rather than as a traceback after it."""
    if path.is_dir():
        raise ConfigurationError(f"{option} {path}: is a directory; give a file name")
    parent = path.parent
    while not parent.exists():  # the missing directories are made when writing
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigurationError(f"{option} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{option} {path}: cannot write in {parent}")
    return path


def _write(path: Path, text: str, option: str) -> None:
    """`text` to `path`, atomically (a file already there is left whole if this fails), or a one-line error."""
    try:
        atomic_write_text(path, text)
    except OSError as error:
        raise ConfigurationError(f"{option} {path}: cannot write: {error.strerror or error}") from None


@contextmanager
def _progress(total: int) -> Iterator[Any]:
    """Steps of a long command: a live bar on a terminal; elsewhere (a pod's log, CI, a pipe) one timestamped line
        per step, so progress shows in logs too. Each call of the yielded function starts the next step (a `detail`
    call reports within it)."""
    if not err.is_terminal:
        started = time.monotonic()
        count = 0

        def line(description: str, /, *, detail: bool = False) -> None:
            nonlocal count
            count += 0 if detail else 1
            stamp = time.strftime("%H:%M:%S", time.gmtime())
            indent = "  " if detail else ""
            err.print(
                f"{stamp} [{count}/{total}] {indent}{_safe(description)} ({time.monotonic() - started:.1f} s)",
                highlight=False,
                soft_wrap=True,
            )

        yield line
        err.print(
            f"{time.strftime('%H:%M:%S', time.gmtime())} done in {time.monotonic() - started:.1f} s", highlight=False
        )
        return
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err, transient=True
    ) as progress:
        task = progress.add_task("starting", total=total)
        started_bar = False

        def step(description: str, /, *, detail: bool = False) -> None:
            nonlocal started_bar
            if started_bar and not detail:
                progress.advance(task)
            started_bar = True
            progress.update(task, description=description)

        yield step
        progress.update(task, completed=total, description="done")


@app.command()
def train(
    input: Annotated[Path | None, typer.Option("--input", help="Tidy usage file: .csv, .csv.gz or .parquet.")] = None,
    prometheus_url: Annotated[
        str | None,
        typer.Option(
            "--prometheus-url",
            help="Read usage from this Prometheus-compatible API instead of a file." + _env("prometheus", "url"),
        ),
    ] = None,
    store: StoreOption = None,
    as_of: Annotated[int | None, typer.Option("--as-of", help="Learn only from samples before this Unix time.")] = None,
    oom_events: Annotated[
        Path | None,
        typer.Option("--oom-events", help="OOM kills (timestamp,namespace,workload,pod,container[,memory_bytes])."),
    ] = None,
    horizon: Annotated[
        str, typer.Option("--horizon", help=f"Forecast horizon of the stored lines, {HORIZON_HELP}.")
    ] = "24h",
    history: Annotated[
        str | None,
        typer.Option(
            "--history",
            help="Prometheus: how far back to read, e.g. 14d." + _env("prometheus", "history_seconds", "14d"),
        ),
    ] = None,
    bearer_token_file: Annotated[
        Path | None,
        typer.Option(
            "--bearer-token-file", help="Prometheus: bearer token file." + _env("prometheus", "bearer_token_file")
        ),
    ] = None,
    ca_file: Annotated[
        Path | None, typer.Option("--ca-file", help="Prometheus: CA bundle (PEM)." + _env("prometheus", "ca_file"))
    ] = None,
    client_cert_file: Annotated[
        Path | None,
        typer.Option(
            "--client-cert-file", help="Prometheus: client certificate." + _env("prometheus", "client_cert_file")
        ),
    ] = None,
    client_key_file: Annotated[
        Path | None,
        typer.Option("--client-key-file", help="Prometheus: client key." + _env("prometheus", "client_key_file")),
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            "--header",
            help="Prometheus: extra header 'Name: value' (repeatable), e.g. X-Scope-OrgID."
            + _env("prometheus", "headers", "none"),
        ),
    ] = None,
    allow_partial: Annotated[
        bool, typer.Option("--allow-partial", help="Prometheus: publish even if some namespaces could not be read.")
    ] = False,
    incremental: Annotated[
        bool, typer.Option("--incremental", help="Continue the latest version's models with only the samples after it.")
    ] = False,
    dask_scheduler: Annotated[
        str | None,
        typer.Option(
            "--dask-scheduler",
            help="Train in partitions on this Dask scheduler, e.g. tcp://dask-scheduler:8786."
            + _env("scale", "scheduler_address"),
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Train in partitions on a local Dask cluster of N worker processes." + _env("scale", "workers"),
        ),
    ] = None,
    partition_containers: Annotated[
        int | None,
        typer.Option(
            "--partition-containers",
            help="Workload containers per partition (on a cluster 500 when unset; in one process, unset: one "
            "partition)." + _env("scale", "partition_containers"),
        ),
    ] = None,
    failure_tolerance: Annotated[
        float | None,
        typer.Option(
            "--failure-tolerance",
            help="Share of partitions that may fail and the rest still publish."
            + _env("scale", "failure_tolerance_fraction"),
        ),
    ] = None,
    target_violation: TargetViolationOption = None,
) -> None:
    """Fit the models on a usage file or on Prometheus, and publish a new model version."""
    from pipelines.train import train_from_file, train_from_prometheus

    if (input is None) == (prometheus_url is None):
        raise ConfigurationError("give exactly one of --input FILE or --prometheus-url URL")
    if dask_scheduler is not None and workers is not None:
        raise ConfigurationError("give at most one of --dask-scheduler ADDRESS or --workers N")
    headers = {}
    for item in header or []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ConfigurationError(f"--header {item!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    settings = _settings(
        store={"path": store},
        prometheus={
            "url": prometheus_url,
            "history_seconds": None if history is None else _duration(history, "--history"),
            "bearer_token_file": bearer_token_file,
            "ca_file": ca_file,
            "client_cert_file": client_cert_file,
            "client_key_file": client_key_file,
            "headers": headers or None,
        },
        scale={
            "scheduler_address": dask_scheduler,
            "workers": workers,
            "partition_containers": partition_containers,
            "failure_tolerance_fraction": failure_tolerance,
        },
        forecast=_forecast_levels(target_violation),
    )
    horizon_seconds, as_of = _horizon(horizon), None if as_of is None else _as_of(as_of)
    with _executor(settings) as executor:
        if input is not None:
            with _progress(6) as step:
                manifest = train_from_file(
                    input,
                    settings,
                    as_of=as_of,
                    oom_events_path=oom_events,
                    horizon_seconds=horizon_seconds,
                    incremental=incremental,
                    executor=executor,
                    step=step,
                )
        else:
            with _progress(8) as step:
                manifest, costs = train_from_prometheus(
                    settings,
                    as_of=as_of,
                    allow_partial=allow_partial,
                    horizon_seconds=horizon_seconds,
                    incremental=incremental,
                    executor=executor,
                    step=step,
                )
            err.print(
                f"Prometheus: {costs['queries']:.0f} queries, {costs['retries']:.0f} retries, "
                f"{costs['bytes'] / 1e6:.1f} MB, {costs['query_seconds']:.1f} s in queries, read in {costs['read_seconds']:.1f} s"
            )
    metrics = manifest.fit_metrics
    if manifest.row_counts["partitions"] > 1:
        err.print(
            f"{manifest.row_counts['partitions']} partitions ({manifest.row_counts['failed_partitions']} failed) on "
            f"{metrics['workers']:.0f} workers in {metrics['fit_seconds']:.1f} s; peak memory per worker "
            f"{metrics['worker_peak_rss_mib_max']:.0f} MiB, all workers {metrics['worker_peak_rss_mib_sum']:.0f} MiB"
        )
    for name, why in sorted(manifest.skipped.items()):
        err.print(f"[yellow]skipped[/] {_safe(name)}: {_safe(why)}", highlight=False)
    counts = manifest.row_counts
    continued = f" (continued from {manifest.parent_version})" if manifest.parent_version else ""
    err.print(
        f"published version [bold]{manifest.version}[/]{continued} to {settings.store.path}: "
        f"{counts['workload_containers']} workload containers from {counts['usage_rows']:,} samples"
        + (
            f"; {len(manifest.quarantined)} quarantined for impossible samples (see the warnings)"
            if manifest.quarantined
            else ""
        )
    )


@contextmanager
def _executor(settings: Settings) -> Iterator[Executor | None]:
    """Where `train`'s phases run: a Dask cluster when a scheduler address or local workers are set, else this
    process (None: the pipeline's in-process executor)."""
    if not (settings.scale.scheduler_address or settings.scale.workers):
        yield None
        return
    from pipelines.distributed import DaskExecutor, dask_client

    with dask_client(settings.scale) as client:
        yield DaskExecutor(client, settings.scale)


@app.command()
def recommend(
    input: Annotated[Path, typer.Option("--input", help="Tidy usage history file.")],
    as_of: Annotated[int, typer.Option("--as-of", help="Decision time, Unix seconds: only earlier rows are used.")],
    output: Annotated[Path, typer.Option("--output", help="Where to write the JSON recommendations.")],
    horizon: Annotated[str, typer.Option("--horizon", help=f"Forecast horizon, {HORIZON_HELP}.")] = "24h",
    target_violation: TargetViolationOption = None,
) -> None:
    """Recommend for every workload container at a decision time (the evaluation contract)."""
    from pipelines.train import recommend_from_file

    settings = _settings(forecast=_forecast_levels(target_violation))
    horizon_seconds, as_of, output = _horizon(horizon), _as_of(as_of), _writable(output, "--output")
    with _progress(3) as step:
        result = recommend_from_file(input, as_of, horizon_seconds, settings, step=step)
    _write(output, result.model_dump_json(), "--output")
    err.print(f"wrote {len(result.recommendations)} recommendations to {output}")


def _instant(text: str, option: str) -> int:
    """Unix seconds, or an ISO date or date-time (UTC unless it names a zone)."""
    raw = text.strip()
    try:
        if raw.lstrip("-").isdigit():
            value = int(raw)
        else:
            import pandas as pd

            stamp = pd.Timestamp(raw)
            value = int((stamp.tz_localize("UTC") if stamp.tzinfo is None else stamp).timestamp())
    except (ValueError, OverflowError) as error:
        raise ConfigurationError(f"{option}: {text!r} is not Unix seconds or an ISO date ({error})") from None
    if not 0 <= value < 1 << 40:
        raise ConfigurationError(f"{option}: {text!r} is outside 1970 .. year 36812")
    return value


@app.command()
def replay(
    input: Annotated[Path, typer.Option("--input", help="Tidy usage file to replay the live loop on.")],
    start: Annotated[str, typer.Option("--start", help="First issue time: Unix seconds or an ISO date (UTC).")],
    end: Annotated[str, typer.Option("--end", help="Issue times stop before this: Unix seconds or an ISO date.")],
    output: Annotated[Path, typer.Option("--output", help="Where to write the lines (Parquet).")],
    every: Annotated[str, typer.Option("--every", help="Interval between two issues, e.g. 1h.")] = "1h",
    retrain_every: Annotated[
        str, typer.Option("--retrain-every", help="Interval between two fits of the model, e.g. 1d or 7d.")
    ] = "7d",
    target_violation: TargetViolationOption = None,
) -> None:
    """The live loop's short-term line replayed on a file: a line every --every, from earlier rows only."""
    from pipelines.replay import ReplayPlan, run_replay

    settings = _settings(forecast=_forecast_levels(target_violation))
    plan = ReplayPlan(
        _instant(start, "--start"),
        _instant(end, "--end"),
        _duration(every, "--every"),
        _duration(retrain_every, "--retrain-every"),
    )
    if output.is_dir():
        raise ConfigurationError(f"--output: {output} is a directory")
    with _progress(4) as step:
        lines, seconds = run_replay(input, plan, settings, step=step)
        buffer = io.BytesIO()
        lines.to_parquet(buffer, index=False)
        try:
            atomic_write_bytes(output, buffer.getvalue())
        except OSError as error:
            raise ConfigurationError(f"--output: cannot write {output} ({error.strerror or error})") from None
    err.print(f"wrote {len(lines):,} line steps to {output} in {seconds:.0f} s")


@app.command()
def backtest(
    input: Annotated[Path, typer.Option("--input", help="Tidy usage file to replay day by day.")],
    report: Annotated[Path | None, typer.Option("--report", help="Directory for report.md and PNG charts.")] = None,
    nodes: Annotated[
        bool,
        typer.Option(
            "--nodes",
            help="Node colocation instead: reclaimed batch/mid room and violations, ours against Koordinator's rules.",
        ),
    ] = False,
    node_cpu: Annotated[
        str, typer.Option("--node-cpu", help="--nodes: allocatable CPU of a packed node (cores).")
    ] = "64",
    node_memory: Annotated[
        str, typer.Option("--node-memory", help="--nodes: allocatable memory of a packed node, e.g. 256Gi.")
    ] = "256Gi",
    seed: Annotated[
        int, typer.Option("--seed", help="--nodes: seed of the random packing and of the metric outages.")
    ] = 0,
    outage_fraction: Annotated[
        float,
        typer.Option(
            "--outage-fraction",
            min=0.0,
            max=0.5,
            help="--nodes: share of node-steps without metrics in the outage scenario.",
        ),
    ] = 0.02,
) -> None:
    """Replay the file day by day, a decision at each midnight from earlier samples only: our lines against VPA, KRR,
    Koordinator, seasonal naive and the oracle."""
    settings = _settings()
    if nodes:
        _node_backtest(input, report, settings, node_cpu, node_memory, seed, outage_fraction)
        return
    from pipelines.backtest import STAGES, run_backtest
    from pipelines.backtest_report import live_table, markdown_table, write_report

    with _progress(STAGES) as step:
        fleet, result = run_backtest(input, settings, step=step)
        written = write_report(report, fleet, result, input.name) if report is not None else []
    sys.stdout.write(markdown_table(result.scores["all"]) + "\n")
    if any(result.live["all"].values()):
        sys.stdout.write("\nThe short-term line at the live cadence (re-issued hourly):\n\n")
        sys.stdout.write(live_table(result.live["all"]) + "\n")
    err.print(
        f"{len(result.decision_days)} decision days in {result.seconds:.0f} s"
        + (f"; report in {report}" if written else "")
    )


def _node_backtest(
    input: Path, report: Path | None, settings: Settings, node_cpu: str, node_memory: str, seed: int, outages: float
) -> None:
    from pipelines.node_backtest import NODE_STAGES, run_node_backtest
    from pipelines.node_backtest_report import equal_table, summary_table, write_node_report

    try:
        size = {"cpu": cpu_cores_from_quantity(node_cpu), "memory": memory_bytes_from_quantity(node_memory)}
    except (ValueError, ArithmeticError) as error:
        raise ConfigurationError(f"--node-cpu/--node-memory: {error}") from None
    with _progress(NODE_STAGES) as step:
        result = run_node_backtest(input, settings, size, seed=seed, outage_fraction=outages, step=step)
        written = write_node_report(report, result, input.name) if report is not None else []
    for resource in ("cpu", "memory"):
        sys.stdout.write(
            f"\n{resource} (all days, complete metrics)\n" + summary_table(result, "all", "complete", resource) + "\n"
        )
        sys.stdout.write(
            f"\n{resource}: room against Koordinator's usage policy at equal violations\n"
            + equal_table(result, resource)
            + "\n"
        )
    err.print(
        f"{len(result.placement.names)} nodes, {len(result.decision_days)} decision days in {result.seconds:.0f} s"
        + (f"; report in {report}" if written else "")
    )


def _safe(text: str) -> str:
    """Text from the data or the user for a rich string: control characters escaped, markup taken literally."""
    return escape(printable(text))


@app.command()
def show(
    store: StoreOption = None,
    format: Annotated[
        Format,
        typer.Option(
            "--format",
            help="table (people), json or yaml (totals, rows and the recommendations), csv (one row a container), html (a self-contained report).",
        ),
    ] = Format.table,
    namespace: Annotated[
        list[str] | None,
        typer.Option("--namespace", "-n", metavar="GLOB", help="Only these namespaces (glob; repeatable)."),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", metavar="GLOB", help="Only these workloads (glob; repeatable)."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write to this file (replaced atomically) instead of stdout.")
    ] = None,
) -> None:
    """Print the latest model version's recommendations and what they would save against current requests: the
    dashboard's numbers, per replica and times replicas, with totals per namespace and overall."""
    from models.store import ModelStore
    from presentation import report
    from presentation.overview import overview

    settings = _settings(store={"path": store})
    if output is not None:
        _writable(output, "--output")
    loaded = ModelStore(settings.store.path, settings.store.retention_versions).load()
    recommendations = report.chosen(loaded.recommendations, namespace or [], workload or [])
    if not recommendations.recommendations:
        asked = " ".join([*(f"--namespace {n}" for n in namespace or []), *(f"--workload {w}" for w in workload or [])])
        raise UnknownWorkloadError(f"no workload of version {loaded.manifest.version} matches {asked}")
    title = f"version {loaded.manifest.version}"
    if format in (Format.json, Format.yaml):
        document = report.payload(loaded.manifest.version, recommendations, settings.overview)
        text = report.as_json(document) if format is Format.json else report.as_yaml(document)
    elif format is Format.table:
        console = Console(file=io.StringIO(), width=out.width if output is None else 200)
        for table in report.as_tables(overview(recommendations, settings.overview), title):
            console.print(table)
        text = console.file.getvalue()  # type: ignore[attr-defined]
    else:
        found = overview(recommendations, settings.overview)
        text = report.as_csv(found) if format is Format.csv else report.as_html(found, title)
    if output is None:
        sys.stdout.write(text)
    else:
        _write(output, text, "--output")
        err.print(f"wrote {format.value} of {len(recommendations.recommendations)} containers to {output}")


@app.command()
def serve(
    store: StoreOption = None,
    host: Annotated[str | None, typer.Option("--host", help="Listen address." + _env("serve", "host"))] = None,
    port: Annotated[int | None, typer.Option("--port", help="TCP port." + _env("serve", "port"))] = None,
    tls_cert_file: Annotated[
        Path | None,
        typer.Option("--tls-cert-file", help="PEM certificate (serve HTTPS)." + _env("serve", "tls_cert_file")),
    ] = None,
    tls_key_file: Annotated[
        Path | None, typer.Option("--tls-key-file", help="PEM private key." + _env("serve", "tls_key_file"))
    ] = None,
) -> None:
    """Serve the REST API, the dashboard (/ui/), the admission webhook and the scheduler extender over the latest model version (docs at /docs)."""
    settings = _settings(
        store={"path": store},
        serve={"host": host, "port": port, "tls_cert_file": tls_cert_file, "tls_key_file": tls_key_file},
    )
    _run_server(settings)


def _has_display() -> bool:
    """Whether a graphical browser can be opened here (never a text browser in this terminal, never a hang)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _open_when_up(url: str, probe: str) -> None:
    """In a daemon thread: wait (at most 20 s) until the service answers `probe`, then open `url` in a browser."""

    def wait_and_open() -> None:
        for _ in range(100):
            try:
                if httpx.get(probe, timeout=1, verify=False).status_code == 200:
                    webbrowser.open(url)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    threading.Thread(target=wait_and_open, name="open-dashboard", daemon=True).start()


def _run_server(settings: Settings, open_browser: bool = False) -> None:
    from serving.server import ensure_can_listen, run

    ensure_can_listen(settings.serve.host, settings.serve.port)  # before the URL is shown
    scheme = "https" if settings.serve.tls_cert_file else "http"
    # A wildcard listen address is reachable on loopback; that is the address to show and open.
    host = "127.0.0.1" if settings.serve.host in ("0.0.0.0", "::", "") else settings.serve.host
    base = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{settings.serve.port}"
    err.print(
        f"serving {settings.store.path} on {scheme}://{settings.serve.host}:{settings.serve.port} (API docs at /docs)"
    )
    err.print(f"dashboard: {base}/ui/", highlight=False)
    if open_browser:
        if _has_display():
            err.print("opening the dashboard in your browser")
            _open_when_up(f"{base}/ui/", f"{base}/healthz")
        else:
            # The command on a line of its own, never wrapped, with the port served and a host to fill in.
            err.print("no display here; to open the dashboard from another machine, tunnel to it:")
            err.print(
                f"  ssh -L {settings.serve.port}:{host}:{settings.serve.port} user@host",
                soft_wrap=True,
                highlight=False,
            )
    run(settings)


@app.command()
def sync(
    store: StoreOption = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="Kubeconfig; unset: in-cluster, then ~/.kube/config." + _env("sync", "kubeconfig")
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="One resync pass, then exit (for a CronJob or a test).")] = False,
    recommender_name: Annotated[
        str | None,
        typer.Option(
            "--recommender-name", help="VPAs naming this recommender are ours." + _env("sync", "recommender_name")
        ),
    ] = None,
    resync: Annotated[
        str | None,
        typer.Option("--resync", help="Full resync period, e.g. 60s." + _env("sync", "resync_seconds", "60s")),
    ] = None,
    reclaim_ratios: Annotated[
        bool | None,
        typer.Option(
            "--reclaim-ratios/--no-reclaim-ratios",
            help="Write node.koordinator.sh/*-reclaim-ratio node labels." + _env("colocation", "write_reclaim_ratios"),
        ),
    ] = None,
    usage_thresholds: Annotated[
        bool | None,
        typer.Option(
            "--usage-thresholds/--no-usage-thresholds",
            help="Write the scheduling.koordinator.sh/usage-thresholds node annotation."
            + _env("colocation", "write_usage_thresholds"),
        ),
    ] = None,
    write_checkpoints: Annotated[
        bool | None,
        typer.Option(
            "--write-vpa-checkpoints/--no-write-vpa-checkpoints",
            help="Write VerticalPodAutoscalerCheckpoints of the vpa policy's state [default off].",
        ),
    ] = None,
) -> None:
    """Write the latest recommendations into VerticalPodAutoscaler and Koordinator Recommendation statuses, the `vpa`
    policy warm-started from the VPA checkpoints in the cluster (and, opt-in, reclaim-ratio labels and usage-thresholds
    annotations on the nodes the model learned, and our own VPA checkpoints)."""
    import threading

    from models.store import ModelStore
    from serving.controllers.checkpoints import CheckpointBridge
    from serving.controllers.nodes import NodeColocationSync
    from serving.controllers.status import StatusSync, SyncReport
    from serving.kube import api_client
    from serving.state import ServiceState

    settings = _settings(
        store={"path": store},
        sync={
            "kubeconfig": kubeconfig,
            "recommender_name": recommender_name,
            "resync_seconds": None if resync is None else _duration(resync, "--resync"),
            "write_vpa_checkpoints": write_checkpoints,
        },
        colocation={"write_reclaim_ratios": reclaim_ratios, "write_usage_thresholds": usage_thresholds},
    )
    state = ServiceState(ModelStore(settings.store.path, settings.store.retention_versions))
    api = api_client(settings.sync.kubeconfig)
    nodes = NodeColocationSync(api, state, settings)
    checkpoints = CheckpointBridge(api, state, state.store, settings.sync)

    def extra(report: SyncReport) -> None:
        if nodes.enabled():
            nodes.sync_once(report)
        checkpoints.write(report, syncer.vpas.values())

    syncer = StatusSync(api, state, settings.sync, extra=extra, adjust=checkpoints.adjust, watched=nodes.informers)

    def show(report: SyncReport) -> None:
        for name in report.written:
            err.print(f"wrote status of {_safe(name)}", highlight=False)
        for name, why in report.failed.items():
            err.print(f"[red]failed[/] {_safe(name)}: {_safe(why)}", highlight=False)

    if once:
        report = syncer.sync_once()
        show(report)
        err.print(
            f"{len(report.written)} written, {len(report.unchanged)} unchanged, {len(report.ignored)} not ours, "
            f"{len(report.failed)} failed"
        )
        if report.failed:
            raise KubernetesError(f"{len(report.failed)} status write(s) failed")
        return
    stop = threading.Event()
    try:
        syncer.run(stop, show)
    except KeyboardInterrupt:
        stop.set()


@app.command()
def live(
    store: StoreOption = None,
    interval: Annotated[
        str | None,
        typer.Option("--interval", help="Time between two reads, e.g. 60s." + _env("live", "interval_seconds", "60s")),
    ] = None,
    leader_election: Annotated[
        bool | None,
        typer.Option(
            "--leader-election/--no-leader-election",
            help="Write only while holding the Lease (off: a single instance, e.g. a local run)."
            + _env("live", "leader_election"),
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", help="Kubeconfig for the Lease." + _env("live", "kubeconfig")),
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="One pass (read, update, publish, checkpoint), then exit.")
    ] = False,
) -> None:
    """Continue the latest model version from Prometheus every interval and publish light updates that `serve` and
    `sync` pick up: the request and its bounds, OOM kills and the short-term line follow usage within minutes (the
    daily `train` still refits the forecasts)."""
    import logging.config
    import signal

    from prometheus_client import start_http_server

    from models.store import ModelStore
    from pipelines.live import LiveLoop, LiveMetrics, StepReport, always_leading
    from serving.logs import LOG_CONFIG

    logging.config.dictConfig(LOG_CONFIG)
    log = logging.getLogger("recommender.live")
    settings = _settings(
        store={"path": store},
        live={
            "interval_seconds": None if interval is None else _duration(interval, "--interval"),
            "leader_election": leader_election,
            "kubeconfig": kubeconfig,
        },
    )
    if settings.prometheus.url is None:
        raise ConfigurationError("the live loop reads Prometheus: set KOORD_RECOMMENDER_PROMETHEUS__URL")
    stop = threading.Event()
    leading, writer = always_leading, ""
    if settings.live.leader_election and not once:
        leading, writer = _lease(settings, stop, log)
    else:
        log.info("leader election off: a single instance, writing")
    metrics = LiveMetrics()
    if settings.live.metrics_port is not None and not once:
        server, _ = start_http_server(settings.live.metrics_port, settings.live.metrics_host, metrics.registry)
        log.info("metrics on %s:%d/metrics", settings.live.metrics_host, server.server_port)
    loop = LiveLoop(
        settings, ModelStore(settings.store.path, settings.store.retention_versions), leading, metrics, writer=writer
    )

    def report(done: StepReport) -> None:
        published = f"update {done.update.revision}" if done.update else "nothing written (not the leader)"
        log.info(
            "read %d rows (%d OOM kills) of %d..%d in %.2f s, %d queries, %d bytes: %s",
            done.rows,
            done.oom_kills,
            done.start,
            done.end,
            done.seconds,
            done.costs.get("queries", 0),
            done.costs.get("bytes", 0),
            published,
        )

    if once:
        done = loop.step()
        if done is None:
            log.info("nothing new to read since the last update")
        else:
            report(done)
        loop.checkpoint()
        return
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        loop.run(stop, report)
    except KeyboardInterrupt:
        stop.set()
        loop.checkpoint()


def _lease(settings: Settings, stop: threading.Event, log: Any) -> tuple[Callable[[], bool], str]:
    """The Lease's `leading` and our identity, its elector running until `stop`; without Kubernetes credentials, a
    single instance."""
    from serving.kube import api_client
    from serving.lease import LeaseElector, own_namespace

    try:
        api = api_client(settings.live.kubeconfig)
    except KubernetesError as error:
        log.warning("no Kubernetes credentials (%s): running as a single instance, without leader election", error)
        return (lambda: True), ""
    elector = LeaseElector(
        api,
        settings.live.lease_name,
        settings.live.lease_namespace or own_namespace(),
        settings.live.lease_duration_seconds,
    )
    log.info("competing for the Lease %s/%s as %s", elector.namespace, elector.name, elector.holder)
    elector.start(stop)
    return elector.leading, elector.holder


@app.command("cluster-files")
def cluster_files(
    pods_file: Annotated[
        Path, typer.Option("--pods-file", help="Where to write the pods (kubectl get pods -A -o json).")
    ],
    nodes_file: Annotated[
        Path, typer.Option("--nodes-file", help="Where to write the nodes (kubectl get nodes -o json).")
    ],
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig", help="Kubeconfig; unset: in-cluster, then ~/.kube/config." + _env("sync", "kubeconfig")
        ),
    ] = None,
    interval: Annotated[
        str | None,
        typer.Option(
            "--interval",
            help="After a change, rewrite the files at most this often, e.g. 5s."
            + _env("extender", "files_interval_seconds", "5s"),
        ),
    ] = None,
    resync: Annotated[
        str | None,
        typer.Option(
            "--resync",
            help="Full re-list period, e.g. 10m; watches carry the changes between."
            + _env("extender", "files_resync_seconds", "10m"),
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="List once, write the files and exit.")] = False,
) -> None:
    """Keep the scheduler extender's view of pods and nodes fresh on disk (run beside `serve`): list once, then watch."""
    import threading

    from serving.controllers.cluster_view import ClusterFiles
    from serving.kube import api_client

    settings = _settings(
        sync={"kubeconfig": kubeconfig},
        extender={
            "files_interval_seconds": None if interval is None else _duration(interval, "--interval"),
            "files_resync_seconds": None if resync is None else _duration(resync, "--resync"),
        },
    )
    extender = settings.extender
    files = ClusterFiles(
        api_client(settings.sync.kubeconfig),
        pods_file,
        nodes_file,
        interval_seconds=extender.files_interval_seconds,
        resync_seconds=extender.files_resync_seconds,
        backoff_max_seconds=extender.files_backoff_max_seconds,
    )
    if once:
        pods, nodes = files.once()
        err.print(f"wrote {pods} pods to {pods_file} and {nodes} nodes to {nodes_file}")
        return
    stop = threading.Event()
    try:
        files.run(stop)
    except KeyboardInterrupt:
        stop.set()


def bundled_dataset() -> Path:
    """The Google 2019 trace (see data/google-2019/SOURCE.md): in a checkout, or where the image puts it
    (<prefix>/share/koord-recommender, the Dockerfile's COPY)."""
    checkout = Path(__file__).resolve().parent.parent / "data" / "google-2019" / "usage.csv.gz"
    installed = Path(sys.prefix) / "share" / "koord-recommender" / "google-2019" / "usage.csv.gz"
    return checkout if checkout.exists() or not installed.exists() else installed


@app.command()
def demo(
    input: Annotated[
        Path | None,
        typer.Option("--input", help="Usage file [default: the bundled Google 2019 trace, moved in time to end now]."),
    ] = None,
    workdir: Annotated[Path, typer.Option("--workdir", help="Where the store and the chart go.")] = Path("demo-output"),
    charts: Annotated[int, typer.Option("--charts", min=1, help="Workloads drawn in the chart.")] = 4,
    serve_after: Annotated[
        bool, typer.Option("--serve/--no-serve", help="Serve the result and its dashboard afterwards.")
    ] = True,
    port: Annotated[int | None, typer.Option("--port", help="TCP port for --serve." + _env("serve", "port"))] = None,
    open_browser: Annotated[
        bool, typer.Option("--open/--no-open", help="Open the dashboard in a browser when a display is available.")
    ] = True,
) -> None:
    """The main job end to end: train on real data, show what would be saved, chart the four lines, serve the dashboard."""
    from models.store import ModelStore
    from pipelines.train import train_from_file
    from presentation import report
    from presentation.charts import four_lines_figure, save_png
    from presentation.overview import overview

    source = input or bundled_dataset()
    settings = _settings(store={"path": workdir / "store"}, serve={"port": port})
    if serve_after:  # a taken port said before a minute of training, not after
        from serving.server import ensure_can_listen

        ensure_can_listen(settings.serve.host, settings.serve.port)
    with _progress(4) as step:
        # The bundled trace is from 2019: moved at load so it ends now, or every page would call the model stale.
        manifest = train_from_file(source, settings, end_at=int(time.time()) if input is None else None, step=step)
    if input is None:
        out.print(f"data: {manifest.source}", highlight=False)
    loaded = ModelStore(settings.store.path, settings.store.retention_versions).load(manifest.version)
    recommendations = loaded.recommendations.recommendations
    for table in report.as_tables(
        overview(loaded.recommendations, settings.overview), f"{source.name}, version {manifest.version}"
    ):
        out.print(table)
    # Chart the workloads still running at the decision time first, the busiest of them first.
    as_of = loaded.recommendations.as_of
    busiest = sorted(
        recommendations,
        key=lambda r: (
            r.history is None or r.history.last_sample < as_of - 86400,
            -(r.history.samples if r.history else 0),
        ),
    )[:charts]
    chart = workdir / "four-lines.png"
    save_png(four_lines_figure(busiest, loaded.recommendations.step_seconds), chart)
    out.print(f"four-line chart of {len(busiest)} workloads: {chart}")
    out.print(
        f"model version {manifest.version} in {settings.store.path}; JSON: recommender show --store {settings.store.path} --format json"
    )
    if serve_after:
        _run_server(settings, open_browser=open_browser)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        out.print(__version__)
        raise typer.Exit()


def main() -> None:
    """Console entry point: our errors become a clear message and an exit code, never a traceback; a command that
    finished ends the process at once (`_end`)."""
    try:
        app()
    except SystemExit as done:
        _end(done)
    except RecommenderError as error:
        _exit_with(error)
    except ModuleNotFoundError as error:
        # A command whose optional extra this installation (or image role) lacks: say which, not a traceback.
        command = next((a for a in sys.argv[1:] if not a.startswith("-")), "this command")
        missing = missing_extra(error, f"recommender {command}", extra="all" if command == "demo" else None)
        if missing is None:
            raise
        _exit_with(missing)


def _end(done: SystemExit) -> NoReturn:
    """Exit with `done`'s code once the exit handlers have run (logs flushed, a Dask cluster closed, child
    processes joined), without the interpreter's teardown freeing what the command held one object at a time,
    which is the system's to reclaim: 0.3-0.5 s at the end of a 1,000-container training pass. Only when no other
    thread is left (one could still be writing); else the interpreter's own exit, which waits for it."""
    if threading.active_count() > 1 or not isinstance(done.code, int | None):
        raise done
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # the reader went away (a closed pipe): the status Python's own exit gives then
        os._exit(120)
    os._exit(done.code or 0)


def _exit_with(error: RecommenderError) -> NoReturn:
    err.print(f"[bold red]error:[/] {_safe(str(error))}", highlight=False, soft_wrap=True)
    sys.exit(error.exit_code)


if __name__ == "__main__":
    main()
