"""Settings, grouped by concern. Every constant the recommender uses lives here, with its unit, default and reason.

Values come from (highest first) explicit arguments, environment variables `KOORD_RECOMMENDER_<GROUP>__<FIELD>`
(for example `KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION=0.2`), then the defaults below. A `Settings`
object is built once at the edge (CLI, app factory) and passed down; nothing reads it from a global.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recommender.units import GIB, MIB, SECONDS_PER_DAY, SECONDS_PER_HOUR


class HistogramSettings(BaseModel):
    """VPA's decaying exponential histograms. Defaults are VPA's, so results match it."""

    bucket_growth_ratio: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Each bucket is this fraction wider than the previous (VPA: 5 %); sets the resolution.",
    )
    cpu_first_bucket_cores: float = Field(0.01, gt=0, description="Width of the first CPU bucket, cores (VPA: 0.01).")
    cpu_max_cores: float = Field(
        1000.0, gt=0, description="CPU value the last bucket starts at or above, cores (VPA: 1000)."
    )
    memory_first_bucket_bytes: float = Field(
        1e7, gt=0, description="Width of the first memory bucket, bytes (VPA: 1e7)."
    )
    memory_max_bytes: float = Field(
        1e12, gt=0, description="Memory value the last bucket starts at or above, bytes (VPA: 1e12)."
    )
    epsilon: float = Field(
        1e-4,
        gt=0,
        description="Bucket weight below which a bucket counts as empty (VPA: 0.001 x min sample weight 0.1).",
    )
    cpu_half_life_seconds: float = Field(
        SECONDS_PER_DAY, gt=0, description="Age at which a CPU sample counts half, seconds (VPA: 24 h)."
    )
    memory_half_life_seconds: float = Field(
        SECONDS_PER_DAY, gt=0, description="Age at which a memory peak counts half, seconds (VPA: 24 h)."
    )
    cpu_sample_weight: float = Field(
        0.1, gt=0, description="Weight of one CPU sample (VPA: 0.1, no request weighting)."
    )
    memory_peak_weight: float = Field(1.0, gt=0, description="Weight of one memory peak (VPA: 1.0).")
    memory_aggregation_interval_seconds: int = Field(
        SECONDS_PER_DAY,
        gt=0,
        description="Memory enters the histogram as one peak per pod per interval, seconds (VPA: 24 h).",
    )
    memory_aggregation_interval_count: int = Field(
        8, gt=0, description="How many of the newest peak intervals are kept (VPA: 8, i.e. 8 days of memory history)."
    )
    oom_min_bump_bytes: float = Field(
        100 * MIB, ge=0, description="An OOM kill records at least usage + this, bytes (VPA: 100 MiB)."
    )
    oom_bump_ratio: float = Field(1.2, ge=1, description="An OOM kill records at least usage x this (VPA: 1.2).")


class RequestPolicyRule(BaseModel):
    """Which request policy the containers of matching workloads get (the first matching rule wins)."""

    namespace: str = Field("*", description="Namespace glob (fnmatch).")
    workload: str = Field("*", description="Workload name glob (fnmatch).")
    policy: Literal["forecast", "vpa"] = Field(description="forecast: our request line; vpa: the VPA recommender's.")


class PolicySettings(BaseModel):
    """How histogram percentiles become a request recommendation (VPA's defaults)."""

    request_policy: Literal["forecast", "vpa"] = Field(
        "forecast",
        description="Who sizes requests (target and bounds): `forecast`, our request line inside VPA-style bounds "
        "(cheaper at the same risk on the development data, docs/benchmarks.md); or `vpa`, the Kubernetes VPA "
        "recommender v1.5.1 exactly (models/vpa.py), for like-for-like comparison and moving from the VPA.",
    )
    request_policy_rules: list[RequestPolicyRule] = Field(
        [],
        description="Per namespace / workload globs choosing the request policy as JSON, first match wins, e.g. "
        '[{"namespace": "legacy-*", "policy": "vpa"}]; no match: `request_policy`.',
    )
    confidence_interval_seconds: float = Field(
        SECONDS_PER_DAY,
        gt=0,
        description="`vpa` policy: the history unit of the confidence factors, seconds (VPA's "
        "--confidence-interval-cpu/-memory: 24 h); samples count as one a minute of it.",
    )

    target_percentile: float = Field(0.9, gt=0, le=1, description="Percentile the target is read at (VPA: p90).")
    lower_bound_percentile: float = Field(0.5, gt=0, le=1, description="Percentile of the lower bound (VPA: p50).")
    upper_bound_percentile: float = Field(0.95, gt=0, le=1, description="Percentile of the upper bound (VPA: p95).")
    safety_margin_fraction: float = Field(0.15, ge=0, description="Added on top of every percentile (VPA: 15 %).")
    lower_bound_confidence_multiplier: float = Field(
        0.001,
        ge=0,
        description="Lower bound x (1 + this/days)^exponent: shrinks it while history is short (VPA: 0.001).",
    )
    lower_bound_confidence_exponent: float = Field(-2.0, description="Exponent of the lower bound's factor (VPA: -2).")
    upper_bound_confidence_multiplier: float = Field(
        1.0, ge=0, description="Upper bound x (1 + this/days)^exponent: widens it while history is short (VPA: 1.0)."
    )
    upper_bound_confidence_exponent: float = Field(1.0, description="Exponent of the upper bound's factor (VPA: 1).")
    min_confidence_days: float = Field(
        1 / 24,
        gt=0,
        description="`forecast` policy: floor of the history length used in the confidence factors, days. VPA (and the "
        "`vpa` policy) divides by zero here and returns absurd bounds for new workloads; one hour keeps the upper "
        "bound finite.",
    )
    pod_min_cpu_cores: float = Field(0.025, ge=0, description="Smallest CPU recommendation per pod, cores (VPA: 25m).")
    pod_min_memory_bytes: float = Field(
        250 * MIB, ge=0, description="Smallest memory recommendation per pod, bytes (VPA: 250 MiB)."
    )
    min_allowed_cpu_cores: float | None = Field(None, ge=0, description="Cap the target from below, cores (none).")
    max_allowed_cpu_cores: float | None = Field(None, gt=0, description="Cap the target from above, cores (none).")
    min_allowed_memory_bytes: float | None = Field(None, ge=0, description="Cap the target from below, bytes (none).")
    max_allowed_memory_bytes: float | None = Field(None, gt=0, description="Cap the target from above, bytes (none).")
    min_samples: int = Field(
        12,
        ge=1,
        description="Known samples of a resource a container needs before it gets any recommendation for it (an hour "
        "at the 5-minute step). VPA gives none without samples; below this a request would be read from a histogram "
        "that is empty or nearly so (the pod minimum, 25m), and the webhook would apply it.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> PolicySettings:
        if not self.lower_bound_percentile <= self.target_percentile <= self.upper_bound_percentile:
            raise ValueError("percentiles must satisfy lower_bound <= target <= upper_bound")
        return self


class ReservationSettings(BaseModel):
    """Koordinator's reservation lines: long-term (its mid rule) and the short-term forecast."""

    long_term_cpu_percentile: float = Field(0.95, gt=0, le=1, description="Koordinator mid: p95 of CPU.")
    long_term_memory_percentile: float = Field(0.98, gt=0, le=1, description="Koordinator mid: p98 of memory.")
    long_term_margin_fraction: float = Field(0.10, ge=0, description="Koordinator mid: x 1.10 on both.")
    long_term_cpu_half_life_seconds: float = Field(12 * SECONDS_PER_HOUR, gt=0, description="Koordinator mid: 12 h.")
    long_term_memory_half_life_seconds: float = Field(24 * SECONDS_PER_HOUR, gt=0, description="Koordinator mid: 24 h.")
    step_seconds: int = Field(300, gt=0, description="Resolution of the short-term line, seconds (5 minutes).")
    recent_window_seconds: int = Field(
        SECONDS_PER_HOUR,
        gt=0,
        description="The short-term line never drops below the max of this last window (fast up).",
    )
    seasonal_days: int = Field(
        7, gt=0, description="How many past days at the same time of day the short-term line looks at."
    )
    slot_tolerance_seconds: int = Field(
        900, ge=0, description="Half-width of the time-of-day window: spikes recur a few minutes early or late."
    )


class ForecastSettings(BaseModel):
    """The forecast models: candidates built for the asked risk level, their fleet-level selection and hierarchical
    calibration (issue 19; README "Models"). Every choice below was settled on the development half of the data
    (docs/benchmarks.md, "How settings are chosen")."""

    short_term_target_violation: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description="Share of 5-minute samples the short-term line may be under (1 %); "
        "`--target-violation` sets all three lines.",
    )
    request_target_violation: float = Field(0.01, gt=0, lt=0.5, description="Same for the request line (1 %).")
    long_term_target_violation: float = Field(
        0.01, gt=0, lt=0.5, description="Same for the long-term line, judged on day-ahead rolling origins (1 %)."
    )
    target_violation_overrides: dict[str, float] = Field(
        default_factory=dict,
        description="Risk level per namespace (`team-a`) or workload (`team-a/api`), applied to all three lines of its "
        'containers; the most specific key wins. Example: {"batch": 0.05, "shop/checkout": 0.005}.',
    )
    selection_days: int = Field(
        7, ge=1, description="Rolling origins (days) the candidates are scored and calibrated on."
    )
    history_days: int = Field(
        14,
        ge=1,
        description="Longest window of a candidate, days: 14, as KRR's; at a 1 % risk, long windows carry "
        "a container's rare bursts into the next day.",
    )
    selection_groups: int = Field(
        3,
        ge=1,
        description="Groups of similar containers (by burstiness) that may choose their own candidate and "
        "calibration factor.",
    )
    group_min_gain: float = Field(
        0.1,
        ge=0,
        lt=1,
        description="A group takes its own candidate only when it is this much cheaper on the group "
        "than the fleet's choice (10 %): a choice needs evidence.",
    )
    group_min_containers: int = Field(
        20,
        ge=1,
        description="Containers a group needs before it may choose its own candidate.",
    )
    fairness_tolerance: float = Field(
        1.0,
        ge=0,
        description="A candidate is chosen only if its p90 container violation at the matched level is at "
        "most that of the flat quantile of `history_days` (KRR's shape) plus this x the target (1: one point at 1 %).",
    )
    calibration_prior_samples: float = Field(
        1e9,
        gt=0,
        description="Samples at which a container's own calibration factor counts as much as its group's. "
        "Large: on the development half, own factors (prior 20,000, about ten weeks of samples) raised the "
        "overprovision at matched risk in 5 of 6 cells: last week's misses are a poor guide to tomorrow's.",
    )
    group_prior_samples: float = Field(
        1e9,
        gt=0,
        description="Samples at which a group's factor counts as much as the fleet's (large, for the same "
        "reason: the fleet's factor, never clipped, carries the calibration).",
    )
    calibration_factor_min: float = Field(
        0.25,
        gt=0,
        description="Guard on a calibration factor (not the calibration itself): smallest allowed. A container "
        "whose own factor is below it (but not idle, 0) is left out of the fleet's and its group's factor.",
    )
    calibration_factor_max: float = Field(
        4.0,
        gt=0,
        description="Guard on a calibration factor: largest allowed. A container whose own factor is above it (its "
        "line is off by more than 4x: broken or poisoned data) is left out of the fleet's and its group's factor, "
        "so a few such containers cannot move everyone else's lines (2 to 5 of 119 on the Bitbrains dev split).",
    )
    seasonal_days: int = Field(
        7, ge=1, description="Days of history the time-of-day models look at (one week: weekday rhythm)."
    )
    narrow_window_steps: int = Field(
        3, ge=0, description="Half-width of the narrow time-of-day window, steps (15 min: spikes come early or late)."
    )
    wide_window_steps: int = Field(12, ge=0, description="Half-width of the wide time-of-day window, steps (1 h).")
    recent_window_steps: int = Field(
        12,
        ge=0,
        description="Fast up: the first steps of the short-term line never fall below the max of this many last "
        "steps (1 h; 0: off).",
    )
    cold_start_factor: float = Field(
        1.5, ge=1, description="A container with under a day of samples gets this x its observed max."
    )
    stale_after_seconds: float = Field(
        3 * 86400.0,
        gt=0,
        description="A container without a sample for this long (3 days) gets no fresh forecast: "
        "its recommendation is marked stale and holds its last request flat instead of extrapolating.",
    )
    memory_peak_margin_fraction: float = Field(
        0.15,
        ge=0,
        description="Memory: without an OOM kill the request stays at most, and a limit we set at least, the "
        "observed 7-day peak x (1 + this) (15 %, KRR's memory buffer): a small fleet cannot inflate a request, and a "
        "Guaranteed pod's limit never lands under a peak it has already reached.",
    )
    peak_quantile: float = Field(
        0.55,
        gt=0,
        lt=1,
        description="The peak forecast is scaled so this share of past days peaked at or below it "
        "(0.55: a point forecast, a little above the median, so at most about half the days peak above it).",
    )
    enabled: bool = Field(
        True,
        description="False: the foundation's rules only (VPA target, Koordinator mid, seasonal max), as baselines.",
    )
    use_stl: bool = Field(
        False,
        description="Include the statsmodels STL model among the short-term candidates (about 5 ms per "
        "container and origin; off: it did not win on the development half). Needs the `stl` extra (statsmodels).",
    )

    def target_for(self, line: str) -> float:
        """The default risk level of one line (`short_term`, `request`, `long_term`)."""
        return float(getattr(self, f"{line}_target_violation"))

    def with_target_violation(self, target: float) -> ForecastSettings:
        """These settings with every line built for the risk level `target`."""
        return self.model_copy(
            update={f"{line}_target_violation": target for line in ("short_term", "request", "long_term")}
        )


class IngestSettings(BaseModel):
    """Physical bounds every sample must meet before anything learns from it (docs/input-validation.md): a file
    breaking them is refused, a Prometheus container breaking them is quarantined."""

    max_cpu_cores: float = Field(
        2048.0,
        gt=0,
        description="Largest CPU usage, request or limit of one container sample, cores. 2048: above the "
        "largest single machines sold (about 1,920 vCPUs), so only a unit error (millicores, core-seconds) or a "
        "corrupt counter reaches it.",
    )
    max_memory_bytes: float = Field(
        32 * 1024 * GIB,
        gt=0,
        description="Largest memory usage, request or limit of one container sample, bytes. "
        "32 TiB: the largest single machines sold, for the same reason.",
    )
    future_tolerance_seconds: float = Field(
        600.0,
        ge=0,
        description="How far past the run's clock a sample's timestamp may be, seconds (10 minutes: clock "
        "skew between nodes, Prometheus and us). Later ones are refused: a timestamp in milliseconds or a broken clock "
        "would otherwise move the data's end years ahead and hide stale models.",
    )


class StoreSettings(BaseModel):
    """Where model versions live and how many are kept."""

    path: str = Field(
        "model-store",
        description="The model store: a directory (a mounted volume shared by training and serving replicas) or an fsspec "
        "URL such as s3://bucket/prefix (needs that file system's fsspec package, e.g. s3fs).",
    )
    retention_versions: int = Field(
        10, ge=1, description="Published versions kept; older ones are deleted after a publish."
    )

    @field_validator("path", mode="before")
    @classmethod
    def _path_as_text(cls, value: object) -> object:
        """A local path is given as a Path by callers and the CLI; the store takes any URL as text."""
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class ScaleSettings(BaseModel):
    """Training on a Dask cluster: workloads in partitions, each read and fitted by one task (README "Scale out")."""

    scheduler_address: str | None = Field(
        None,
        description="Address of a running Dask scheduler, e.g. tcp://dask-scheduler:8786. Unset (and workers 0): "
        "train in this process.",
    )
    workers: int = Field(
        0,
        ge=0,
        description="Without a scheduler address: start a local Dask cluster of this many worker processes (0: none).",
    )
    threads_per_worker: int = Field(
        1,
        ge=1,
        description="Threads of each local worker: one, since fitting holds the GIL most of the time.",
    )
    partition_containers: int = Field(
        500,
        ge=1,
        description="Workload containers per partition (a task's unit of work and memory); whole workloads stay "
        "together, a bigger one is a partition alone.",
    )
    failure_tolerance_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of partitions that may still fail after retries with the version published "
        "anyway (their workloads are named in the manifest's `skipped`). 0: any failure stops the publish.",
    )
    retries: int = Field(
        2,
        ge=0,
        description="Retries of a failed partition task; a worker that dies mid-task has its tasks rerun elsewhere "
        "as well (up to Dask's distributed.scheduler.allowed-failures).",
    )
    timeout_seconds: float = Field(
        6 * SECONDS_PER_HOUR,
        gt=0,
        description="The whole distributed run gives up after this long, seconds (6 h).",
    )


class ServeSettings(BaseModel):
    """The HTTP service."""

    host: str = Field("127.0.0.1", description="Address to listen on; loopback unless you mean to expose it.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 picks a free one).")
    tls_cert_file: Path | None = Field(
        None, description="PEM certificate; with the key, serve HTTPS (webhooks need it)."
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of the certificate.")
    store_poll_seconds: float = Field(
        5.0,
        gt=0,
        description="How often the store's `latest` pointer is checked for a new version, seconds (one small read).",
    )
    tls_poll_seconds: float = Field(
        10.0,
        gt=0,
        description="How often the certificate and key files are checked for a change, seconds (cert-manager rotates them in place).",
    )
    stale_model_age_seconds: int = Field(
        2 * SECONDS_PER_DAY,
        gt=0,
        description="The dashboard and /api/v1/status call a model stale when its decision time is older than this, "
        "seconds (a daily training run has then been missed).",
    )
    webhook_max_body_bytes: int = Field(
        4 * MIB,
        gt=0,
        description="Largest AdmissionReview read, bytes (4 MiB: the API server sends at most about 3 MB, "
        "an object and its old version). A larger one is admitted unchanged with a warning when its uid can be read, else 413.",
    )
    extender_max_body_bytes: int = Field(
        32 * MIB,
        gt=0,
        description="Largest scheduler extender call read, bytes (32 MiB: 5,000 full v1.Node objects of "
        "about 5 KB each with room to spare). A larger one gets an ignorable Error answer.",
    )
    max_body_bytes: int = Field(
        64 * 1024,
        gt=0,
        description="Largest body of every other route, bytes (64 KiB: the REST API and the dashboard only read).",
    )
    max_header_bytes: int = Field(
        64 * 1024,
        gt=0,
        description="Largest request line and headers of one request, bytes (64 KiB, above any bearer token); more closes the connection.",
    )
    header_timeout_seconds: float = Field(
        5.0,
        gt=0,
        description="A request's line and headers must arrive within this long of its first byte (or of the "
        "connection's opening), seconds; otherwise the connection is closed (slowloris).",
    )
    read_timeout_seconds: float = Field(
        15.0,
        gt=0,
        description="A request's whole body must arrive within this long of its first byte, seconds "
        "(a 4 MiB review takes milliseconds inside a cluster); otherwise the connection is closed.",
    )
    keep_alive_timeout_seconds: int = Field(
        5,
        ge=1,
        description="An idle keep-alive connection is closed after this long, seconds (uvicorn's default).",
    )
    worker_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Threads for CPU-heavy work (large reviews, extender calls, charts), off the event loop "
        "that answers probes and small reviews.",
    )
    max_queued_work: int = Field(
        16,
        ge=1,
        description="Heavy requests waiting for or running on those threads at most; beyond it the webhook "
        "admits unchanged with an overload warning, the extender answers neutrally and charts answer 503.",
    )
    switch_interval_seconds: float = Field(
        0.0005,
        gt=0,
        description="Python's thread switch interval while serving, seconds (the interpreter's default is "
        "0.005): how long the event loop may wait for the interpreter lock held by a worker thread, each time it needs it.",
    )
    inline_review_containers: int = Field(
        32,
        ge=0,
        description="A review of at most this many containers (and at most 64 KiB) is decided on the event loop "
        "(about a millisecond); larger ones go to the worker threads.",
    )
    max_review_containers: int = Field(
        256,
        ge=1,
        description="A pod with more containers (and init containers) than this is admitted unchanged with a "
        "warning instead of being sized: it bounds what one review can cost (about 0.1 ms a container) far above any real pod.",
    )
    client_ca_file: Path | None = Field(
        None,
        description="PEM CA bundle: when set, /mutate and /scheduler/* answer 403 unless the client presents a "
        "certificate it signed (the API server's webhook client certificate, the scheduler's extender tlsConfig); "
        "other routes do not ask for one. Unset: rely on the NetworkPolicy in manifests/base.",
    )
    client_names: list[str] = Field(
        [],
        description="Common names a client certificate must have for /mutate and /scheduler/* (JSON list); empty: any "
        "certificate client_ca_file signed.",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self


class PrometheusSettings(BaseModel):
    """Reading usage from Prometheus (or Thanos, Mimir, VictoriaMetrics): what to ask, and how gently."""

    url: str | None = Field(
        None, description="Base URL, e.g. http://prometheus:9090 (with any path prefix). Unset: read files."
    )
    history_seconds: int = Field(
        14 * SECONDS_PER_DAY, gt=0, description="How far back to read, seconds (14 days, like KRR)."
    )
    step_seconds: int = Field(
        300, gt=0, description="Resolution of the usage read, seconds (5 minutes, the tidy format's)."
    )
    cpu_rate_window_seconds: int = Field(
        300, gt=0, description="Window of rate() over the CPU counter, seconds; must span at least two scrapes."
    )
    memory_window_seconds: int = Field(
        300, gt=0, description="Window of max_over_time() over the working set, seconds, so peaks between steps count."
    )
    max_points_per_series: int = Field(
        10000, gt=0, le=11000, description="Points per series per query_range; Prometheus refuses more than 11,000."
    )
    max_series_per_query: int = Field(
        5000,
        gt=0,
        description="Namespaces are batched into one query up to this many containers, to bound each answer.",
    )
    max_points_per_query: int = Field(
        300_000,
        gt=0,
        description=(
            "Points (containers x steps) one usage answer may hold, 300,000 by default (about 11 MB of JSON): "
            "namespaces are batched, and a big namespace's range split in time, to stay under it. Prometheus holds "
            "an answer's points and its JSON while it evaluates and encodes it (measured: about 190 bytes a point "
            "at its peak), so this bounds its memory per query (x `concurrency`), and ours per batch."
        ),
    )
    concurrency: int = Field(2, gt=0, le=32, description="Queries in flight at once: be kind to a shared Prometheus.")
    timeout_seconds: float = Field(120.0, gt=0, description="Per-query timeout, seconds (also sent to Prometheus).")
    retries: int = Field(
        4, ge=0, description="Retries of a query on connection errors, 5xx and 429; never on other 4xx."
    )
    backoff_initial_seconds: float = Field(0.5, gt=0, description="First retry delay, seconds; grows x2 with jitter.")
    backoff_max_seconds: float = Field(20.0, gt=0, description="Longest retry delay, seconds.")
    bearer_token: SecretStr | None = Field(None, description="Bearer token sent as Authorization.")
    bearer_token_file: Path | None = Field(None, description="File holding the bearer token, re-read for every run.")
    basic_auth_username: str | None = Field(
        None,
        description="User name for HTTP basic authentication (with basic_auth_password_file; not with a bearer token).",
    )
    basic_auth_password_file: Path | None = Field(
        None, description="File holding the basic-authentication password (a mounted Secret), re-read for every run."
    )
    ca_file: Path | None = Field(None, description="PEM bundle of CAs to verify Prometheus' TLS certificate.")
    client_cert_file: Path | None = Field(None, description="PEM client certificate for mutual TLS.")
    client_key_file: Path | None = Field(None, description="PEM private key of the client certificate.")
    insecure_skip_verify: bool = Field(False, description="Do not verify TLS certificates (testing only).")
    headers: dict[str, str] = Field(
        default_factory=dict,
        description='Extra HTTP headers, e.g. {"X-Scope-OrgID": "team-a"} for Mimir/Cortex tenants.',
    )
    extra_labels: dict[str, str] = Field(
        default_factory=dict, description='Label matchers added to every series, e.g. {"cluster": "prod"}.'
    )
    namespace_label: str = Field("namespace", description="Label holding the namespace.")
    pod_label: str = Field("pod", description="Label holding the pod name.")
    container_label: str = Field("container", description="Label holding the container name.")
    node_label: str = Field("node", description="Label of kube_pod_info holding the node name.")
    ignored_containers: list[str] = Field(
        default_factory=lambda: ["", "POD"],
        description="Container label values that are not workload containers (pause, pod totals).",
    )
    cpu_usage_metric: str = Field(
        "container_cpu_usage_seconds_total", description="cAdvisor CPU counter, core-seconds."
    )
    memory_metric: str = Field("container_memory_working_set_bytes", description="cAdvisor working set, bytes.")
    cpu_throttled_periods_metric: str = Field(
        "container_cpu_cfs_throttled_periods_total", description="cAdvisor throttled periods."
    )
    cpu_periods_metric: str = Field("container_cpu_cfs_periods_total", description="cAdvisor CFS periods.")
    pod_owner_metric: str = Field("kube_pod_owner", description="kube-state-metrics pod owner.")
    replicaset_owner_metric: str = Field("kube_replicaset_owner", description="kube-state-metrics ReplicaSet owner.")
    job_owner_metric: str = Field("kube_job_owner", description="kube-state-metrics Job owner (CronJob).")
    pod_info_metric: str = Field("kube_pod_info", description="kube-state-metrics pod info (node).")
    requests_metric: str = Field("kube_pod_container_resource_requests", description="kube-state-metrics requests.")
    limits_metric: str = Field("kube_pod_container_resource_limits", description="kube-state-metrics limits.")
    terminated_reason_metric: str = Field(
        "kube_pod_container_status_last_terminated_reason", description="kube-state-metrics last termination reason."
    )
    restarts_metric: str = Field("kube_pod_container_status_restarts_total", description="kube-state-metrics restarts.")

    @model_validator(mode="after")
    def _client_pair(self) -> PrometheusSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("client_cert_file and client_key_file go together")
        return self


class SyncSettings(BaseModel):
    """Writing recommendations into VerticalPodAutoscaler and Koordinator Recommendation statuses."""

    recommender_name: str = Field(
        "koord-recommender", description="VPAs whose spec.recommenders names this are ours; others are left alone."
    )
    kubeconfig: Path | None = Field(
        None, description="Kubeconfig file; unset: in-cluster service account, then ~/.kube/config."
    )
    resync_seconds: float = Field(60.0, gt=0, description="Full resync period, seconds; watches fill the time between.")
    vpa: bool = Field(True, description="Write VerticalPodAutoscaler statuses.")
    koordinator: bool = Field(True, description="Write Koordinator Recommendation statuses.")
    backoff_max_seconds: float = Field(60.0, gt=0, description="Longest wait after an API error, seconds.")
    read_vpa_checkpoints: bool = Field(
        True,
        description="Warm-start the `vpa` policy of the VPAs naming us from the VerticalPodAutoscalerCheckpoints "
        "another recommender (the VPA's) left for them, as VPA does at start: read-only, keeps a cluster's history.",
    )
    write_vpa_checkpoints: bool = Field(
        False,
        description="Write VerticalPodAutoscalerCheckpoints of the `vpa` policy's state for the VPAs naming us, "
        "so a VPA recommender can continue from it; never over a checkpoint another writer owns (opt-in: off).",
    )


class WebhookPolicy(BaseModel):
    """How the admission webhook sizes the containers of matching workloads (the first matching rule wins)."""

    namespace: str = Field("*", description="Namespace glob (fnmatch).")
    workload: str = Field("*", description="Workload name glob (fnmatch).")
    controlled_values: Literal["RequestsOnly", "RequestsAndLimits"] = Field(
        "RequestsAndLimits",
        description="VPA's controlledValues: set requests only, or requests and limits scaled by the "
        "same factor (VPA's default). The former field `mode` is still read: requests-only, requests-and-limits, and "
        "off (no resource controlled).",
    )
    line: Literal["target", "upper_bound", "long_term", "peak"] = Field(
        "target",
        description="Which learned value becomes the request: VPA target, upper bound, long-term reservation or forecast peak.",
    )
    controlled_resources: list[Literal["cpu", "memory"]] = Field(
        ["cpu", "memory"], description="Resources the webhook may change."
    )
    min_cpu_cores: float | None = Field(None, ge=0, description="Smallest CPU request written, cores.")
    max_cpu_cores: float | None = Field(None, gt=0, description="Largest CPU request written, cores.")
    min_memory_bytes: float | None = Field(None, ge=0, description="Smallest memory request written, bytes.")
    max_memory_bytes: float | None = Field(None, gt=0, description="Largest memory request written, bytes.")

    @model_validator(mode="before")
    @classmethod
    def _former_mode(cls, data: object) -> object:
        """Rules written before issue 14 said `mode`; whether to change a pod at all is now the opt-in's to say."""
        if not isinstance(data, dict) or "mode" not in data:
            return data
        data = dict(data)
        mode = data.pop("mode")
        former = {"requests-only": "RequestsOnly", "requests-and-limits": "RequestsAndLimits"}
        if mode == "off":
            data["controlled_resources"] = []
        elif mode in former:
            data.setdefault("controlled_values", former[mode])
        else:
            raise ValueError(f"mode {mode!r} is not off, requests-only or requests-and-limits (now: controlled_values)")
        return data


class ColocationProfile(BaseModel):
    """A ClusterColocationProfile-like rule (Koordinator's); matching profiles apply in name order."""

    name: str
    namespaces: list[str] = Field(["*"], description="Namespace globs the profile applies to.")
    selector: dict[str, str] = Field({}, description="Pod labels that must all match (matchLabels); empty matches all.")
    qos_class: Literal["LSE", "LSR", "LS", "BE"] | None = Field(
        None, description="Value of the koordinator.sh/qosClass label."
    )
    priority_class_name: str | None = Field(None, description="spec.priorityClassName; spec.priority follows it.")
    koordinator_priority: int | None = Field(
        None, description="Value of the koordinator.sh/priority sub-priority label."
    )
    labels: dict[str, str] = Field({}, description="Labels to add.")
    annotations: dict[str, str] = Field({}, description="Annotations to add.")


class WebhookSettings(BaseModel):
    """The mutating admission webhook (POST /mutate). It always allows the pod; these shape the patch."""

    policies: list[WebhookPolicy] = Field(
        [],
        description="Per namespace/workload sizing rules as JSON, first match wins; no match: the defaults of one "
        "rule. They say how to size an opted-in pod, not whether to.",
    )
    colocation_profiles: list[ColocationProfile] = Field(
        [], description="Koordinator colocation rules as JSON (QoS, priority class, batch/mid renaming)."
    )
    priority_class_values: dict[str, int] = Field(
        {"koord-prod": 9000, "koord-mid": 7000, "koord-batch": 5000, "koord-free": 3000},
        description="spec.priority of each PriorityClass a profile may name (Koordinator's installed values).",
    )
    max_model_age_seconds: int = Field(
        7 * SECONDS_PER_DAY,
        gt=0,
        description="Older recommendations are not applied (fail open with a warning), seconds.",
    )
    scaling_factors: bool = Field(
        True,
        description="Write scheduling.koordinator.sh/load-estimated-scaling-factors from the learned usage/request ratio.",
    )
    default_mode: Literal["Off", "Initial", "Auto"] = Field(
        "Off",
        description='Mode of a pod nothing else opts in (README "Opt-in modes"): Off recommends only, Initial '
        "sets requests at creation, Auto is the same for a webhook (it never evicts). Off: nothing changes unless asked.",
    )
    dry_run: bool = Field(
        False,
        description="Only annotate what would change (koord-recommender.io/would-apply), never change resources: "
        "for trying the webhook on a live cluster.",
    )
    watch_api: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Learn namespace labels, VerticalPodAutoscalers and HorizontalPodAutoscalers from the "
        "Kubernetes API (list + watch). auto: when running in a cluster or `kubeconfig` is set; off: only the pod's "
        "own label or annotation and `default_mode` apply.",
    )
    kubeconfig: Path | None = Field(
        None, description="Kubeconfig for those watches; unset: in-cluster service account."
    )
    resync_seconds: float = Field(
        300.0,
        gt=0,
        description="Full re-list of namespaces, VPAs and HPAs, seconds; watches carry the changes between.",
    )
    backoff_max_seconds: float = Field(
        30.0, gt=0, description="Longest wait before retrying a failed list or watch, seconds."
    )


class ExtenderSettings(BaseModel):
    """The scheduler extender (POST /scheduler/filter, /scheduler/prioritize): placement on forecast load."""

    pods_file: Path | None = Field(
        None,
        description="Where pods run: `kubectl get pods -A -o json` output, re-read when it changes; none: nodes count as empty.",
    )
    nodes_file: Path | None = Field(
        None,
        description="Node allocatable and annotations: `kubectl get nodes -o json`; needed for nodeCacheCapable (name-only) calls.",
    )
    cpu_threshold_percent: float = Field(
        65.0,
        gt=0,
        le=100,
        description="Forecast CPU peak above this share of allocatable fails a node (Koordinator LoadAware: 65 %).",
    )
    memory_threshold_percent: float = Field(
        95.0, gt=0, le=100, description="Same for memory (Koordinator LoadAware: 95 %)."
    )
    window_seconds: int = Field(
        6 * SECONDS_PER_HOUR, gt=0, description="How far ahead the forecast peak is taken, seconds."
    )
    default_cpu_cores: float = Field(
        0.25, ge=0, description="CPU of a pod with no recommendation and no request, cores (Koordinator: 250m)."
    )
    default_memory_bytes: float = Field(
        200 * MIB, ge=0, description="Memory of such a pod, bytes (Koordinator: 200 MiB)."
    )
    neutral_score: int = Field(
        5, ge=0, le=10, description="Score of a node we know nothing about (0-10): neither preferred nor avoided."
    )
    files_interval_seconds: float = Field(
        5.0,
        gt=0,
        description="`recommender cluster-files`: after a watched change the files are rewritten at most this "
        "often, seconds (changes in between are written together).",
    )
    files_resync_seconds: float = Field(
        600.0,
        gt=0,
        description="`recommender cluster-files`: full re-list of pods and nodes, seconds; watches carry "
        "every change in between.",
    )
    files_backoff_max_seconds: float = Field(
        30.0,
        gt=0,
        description="`recommender cluster-files`: longest wait before retrying a failed list or watch, seconds.",
    )


class ColocationSettings(BaseModel):
    """Reclaimable node resources for koord-batch and koord-mid pods (issue 6; docs/colocation in the README)."""

    cpu_margin_fraction: float = Field(
        0.02,
        ge=0,
        lt=1,
        description=(
            "Safety margin kept free of batch pods, share of the node's allocatable CPU (chosen on the validation "
            "days of the --nodes backtest, docs/benchmarks.md)."
        ),
    )
    memory_margin_fraction: float = Field(
        0.12,
        ge=0,
        lt=1,
        description="Same for memory (not compressible: the smallest margin with no more violations than Koordinator on the validation days).",
    )
    cpu_forecast_only_margin_fraction: float = Field(
        0.13,
        ge=0,
        lt=1,
        description=(
            "Margin used instead of cpu_margin_fraction when no usage measurement younger than fresh_seconds floors "
            "the offer (what `serve` offers between trainings, and during metric outages), share of allocatable CPU: "
            "the forecast alone must absorb its own day-ahead error (chosen on the validation days of the --nodes "
            "backtest: no more violations than Koordinator's usage policy)."
        ),
    )
    memory_forecast_only_margin_fraction: float = Field(
        0.28,
        ge=0,
        lt=1,
        description="Same for memory (chosen the same way: Koordinator had no memory violation on the validation days, so it is wide).",
    )
    cpu_reclaim_ratio_margin_fraction: float = Field(
        0.02,
        ge=0,
        lt=1,
        description=(
            "Margin inside the node.koordinator.sh/cpu-reclaim-ratio label `recommender sync --reclaim-ratios` "
            "writes, share of allocatable: Koordinator then keeps this, the forecast rise and the node's largest "
            "5-minute rise of the week above its live usage (chosen on the validation days of the --nodes backtest: "
            "no more violations than Koordinator's default policy, with the most room)."
        ),
    )
    memory_reclaim_ratio_margin_fraction: float = Field(
        0.11, ge=0, lt=1, description="Same for the memory-reclaim-ratio label (chosen the same way)."
    )
    cpu_jump_quantile: float = Field(
        0.99,
        gt=0,
        le=1,
        description=(
            "Quantile of a node's 5-minute CPU usage rises (last 7 days) kept above its last measured usage: the "
            "climb possible before the next measurement."
        ),
    )
    memory_jump_quantile: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Same for memory: the largest rise of the week (memory is not compressible; chosen on the validation days).",
    )
    batch_window_seconds: int = Field(
        SECONDS_PER_HOUR,
        gt=0,
        description="The batch value offered is the smallest over this much of the short-term forecast, seconds (batch pods stay a while).",
    )
    fresh_seconds: int = Field(
        900,
        ge=0,
        description=(
            "A usage measurement older than this no longer floors the offer (the forecast carries on alone), seconds "
            "(Koordinator's degrade time: 15 min)."
        ),
    )
    stale_half_life_seconds: float = Field(
        SECONDS_PER_HOUR,
        gt=0,
        description=(
            "Once now is past the forecast's horizon (training stopped), trust in the forecast-based value halves "
            "every this many seconds: it decays toward the conservative, request-based value instead of dropping to "
            "0."
        ),
    )
    koordinator_cpu_reclaim_percent: float = Field(
        60.0,
        gt=0,
        le=100,
        description="Koordinator's cpuReclaimThresholdPercent, for the comparison values (default 60).",
    )
    koordinator_memory_reclaim_percent: float = Field(
        65.0, gt=0, le=100, description="Koordinator's memoryReclaimThresholdPercent (default 65)."
    )
    write_reclaim_ratios: bool = Field(
        False,
        description=(
            "`recommender sync`: write node.koordinator.sh/cpu-reclaim-ratio and memory-reclaim-ratio node labels "
            "from our batch values (opt-in)."
        ),
    )
    write_usage_thresholds: bool = Field(
        False,
        description="`recommender sync`: write the scheduling.koordinator.sh/usage-thresholds node annotation from the forecast peak (opt-in).",
    )
    usage_threshold_floor_percent: float = Field(
        30.0, gt=0, le=100, description="The written usage threshold never goes below this, percent of allocatable."
    )

    def of(self, resource: str) -> ResourceColocation:
        """The settings of one resource, so callers that loop over resources read one name, not a cpu/memory branch."""
        if resource not in ("cpu", "memory"):
            raise ValueError(f"no colocation settings for resource {resource!r} (cpu or memory)")
        return ResourceColocation(
            margin_fraction=getattr(self, f"{resource}_margin_fraction"),
            forecast_only_margin_fraction=getattr(self, f"{resource}_forecast_only_margin_fraction"),
            reclaim_ratio_margin_fraction=getattr(self, f"{resource}_reclaim_ratio_margin_fraction"),
            jump_quantile=getattr(self, f"{resource}_jump_quantile"),
            koordinator_reclaim_percent=getattr(self, f"koordinator_{resource}_reclaim_percent"),
        )


@dataclass(frozen=True)
class ResourceColocation:
    """`ColocationSettings` of one resource (see there for each field's meaning, unit and default)."""

    margin_fraction: float
    forecast_only_margin_fraction: float
    reclaim_ratio_margin_fraction: float
    jump_quantile: float
    koordinator_reclaim_percent: float


class AuthSettings(BaseModel):
    """Optional bearer-token authentication of everything that reveals a recommendation: /api/v1, /metrics, /docs,
    /openapi.json; the webhook and extender rely on mutual TLS (serve.client_ca_file) or a NetworkPolicy."""

    token_file: Path | None = Field(
        None,
        description="File holding a static bearer token; re-read when it changes. With neither this nor token_review the REST API is open.",
    )
    token_review: bool = Field(
        False,
        description="Also accept any token the API server authenticates (TokenReview, authentication.k8s.io/v1); for running in a cluster.",
    )
    api_server_url: str = Field(
        "https://kubernetes.default.svc", description="API server for TokenReview (in-cluster address)."
    )
    api_server_ca_file: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
        description="CA that signed the API server's certificate (in-cluster path).",
    )
    service_account_token_file: Path = Field(
        Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
        description="Our own credentials for creating TokenReviews (in-cluster path; needs RBAC create on tokenreviews).",
    )
    token_review_cache_seconds: float = Field(
        60.0,
        ge=0,
        description="How long an accepted token is reused without asking again, seconds (one API call per token per minute).",
    )
    token_review_failure_cache_seconds: float = Field(
        10.0,
        ge=0,
        description="How long a refused token is refused without asking again, seconds (bogus tokens cost one call each per 10 s).",
    )
    token_review_cache_entries: int = Field(
        10_000, ge=1, description="Tokens remembered at most (accepted and refused); the oldest is forgotten first."
    )
    token_review_rate_per_second: float = Field(
        10.0,
        gt=0,
        description="TokenReview (and SubjectAccessReview) calls per second at most, with a burst of as many; "
        "a token that would need one beyond it gets 429 (the API server is shared).",
    )
    token_review_concurrency: int = Field(
        4,
        ge=1,
        description="TokenReview calls in flight at once; they run on the event loop, never on the threads probes need.",
    )
    token_review_timeout_seconds: float = Field(
        2.0, gt=0, description="Timeout of one TokenReview call, seconds; a timeout refuses (not cached)."
    )
    audiences: list[str] = Field(
        [],
        description="Audiences sent with each TokenReview (JSON list); the token must be valid for one of them. Empty: the API server's own.",
    )
    allowed_groups: list[str] = Field(
        [],
        description="With TokenReview: the authenticated user must be in one of these groups (JSON list); empty: any group.",
    )
    authorization_path: str | None = Field(
        None,
        description="With TokenReview: the user must also be allowed `get` on this non-resource URL by a "
        "SubjectAccessReview (grant it with a ClusterRole's nonResourceURLs), e.g. /koord-recommender/read. Unset: no check.",
    )


class OverviewSettings(BaseModel):
    """What `recommender show` and the dashboard count as a risk: only differences that matter are flagged."""

    risk_shortfall_fraction: float = Field(
        0.10,
        ge=0,
        description="A request below the recommendation is a risk only when short by more than this share "
        "of the recommendation (10 %: VPA's updater leaves requests within 10 % of the target alone; a 14 Mi shortfall "
        "on 2 Gi is no risk).",
    )
    risk_usage_above_request_share: float = Field(
        0.01,
        ge=0,
        le=1,
        description="Usage above the request is a risk only in more than this share of the last "
        "day's steps (1 %: about 15 minutes at 5-minute steps, more than one stray sample).",
    )
    risk_throttled_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="CPU throttling is a risk only in more than this share of CFS periods (5 %).",
    )


class LiveSettings(BaseModel):
    """The live loop (`recommender live`): minute-by-minute updates of the latest version's lines from Prometheus."""

    interval_seconds: float = Field(
        60.0,
        gt=0,
        description="Time between two reads, seconds (1 minute, as VPA's recommender loop). Each read takes only the "
        "completed `prometheus.step_seconds` steps since the last one, so a step shorter than the training's 5 "
        "minutes (e.g. 60) is what makes the lines follow usage minute by minute.",
    )
    read_lag_seconds: float = Field(
        30.0,
        ge=0,
        description="A step is read only once it ended this long ago, seconds: the last scrape of it has arrived "
        "(a step read too early would be read again with other values after a restart).",
    )
    checkpoint_interval_seconds: float = Field(
        300.0,
        gt=0,
        description="Loop state written to the store at most this often, seconds (VPA: 10 minutes); a restart or "
        "a failover replays only the steps after it.",
    )
    max_gap_seconds: int = Field(
        86400,
        gt=0,
        description="Longest stretch a restart replays, seconds (a day: the CPU histogram's half-life, and the "
        "daily training reads anything older in full). A checkpoint older than this is dropped and the loop starts "
        "again from the latest version, reading at most this far back.",
    )
    retained_updates: int = Field(3, ge=1, description="Light updates kept beside a version; older ones are deleted.")
    leader_election: bool = Field(
        True,
        description="Hold a coordination.k8s.io/v1 Lease while writing, so two replicas never both write. Off (or "
        "no Kubernetes credentials): a single instance, said in the log.",
    )
    kubeconfig: Path | None = Field(
        None, description="Kubeconfig for the Lease; unset: in-cluster service account, then ~/.kube/config."
    )
    lease_name: str = Field("koord-recommender-live", description="Name of the Lease the replicas compete for.")
    lease_namespace: str | None = Field(
        None, description="Namespace of the Lease; unset: the pod's own namespace (service account), else default."
    )
    lease_duration_seconds: int = Field(
        15,
        ge=2,
        description="A leader that has not renewed for this long is replaced, seconds (client-go's default, 15 s); "
        "it renews every third of it and stops writing if it cannot renew in time.",
    )
    metrics_host: str = Field("0.0.0.0", description="Listen address of the loop's /metrics (Prometheus scrapes it).")
    metrics_port: int | None = Field(
        9091, ge=0, le=65535, description="Port of the loop's /metrics (0: any free port; unset: no endpoint)."
    )


class Settings(BaseSettings):
    """All settings, one group per concern."""

    model_config = SettingsConfigDict(env_prefix="KOORD_RECOMMENDER_", env_nested_delimiter="__", extra="forbid")

    histogram: HistogramSettings = HistogramSettings()
    policy: PolicySettings = PolicySettings()
    reservation: ReservationSettings = ReservationSettings()
    forecast: ForecastSettings = ForecastSettings()
    ingest: IngestSettings = IngestSettings()
    store: StoreSettings = StoreSettings()
    scale: ScaleSettings = ScaleSettings()
    serve: ServeSettings = ServeSettings()
    webhook: WebhookSettings = WebhookSettings()
    extender: ExtenderSettings = ExtenderSettings()
    colocation: ColocationSettings = ColocationSettings()
    auth: AuthSettings = AuthSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    sync: SyncSettings = SyncSettings()
    live: LiveSettings = LiveSettings()
    overview: OverviewSettings = OverviewSettings()


def markdown_reference() -> str:
    """docs/configuration.md, generated from the fields above so the two cannot drift (`make docs`)."""
    lines = [
        "# Configuration",
        "",
        "Generated from `recommender/settings.py` by `make docs`; do not edit by hand.",
        "",
        "Every setting has a default (VPA's or Koordinator's where one exists) and can be overridden by an environment",
        "variable `KOORD_RECOMMENDER_<GROUP>__<FIELD>` (upper case), for example",
        "`KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION=0.2`; dictionaries and lists are given as JSON. Command-line",
        "flags win over the environment. Invalid values stop the command with a clear message (exit code 2). The",
        "parameters a model version was trained with are recorded in its `manifest.json`.",
        "",
    ]
    for group, field in Settings.model_fields.items():
        model = field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        lines += [f"## `{group}`: {(model.__doc__ or '').strip().splitlines()[0]}", ""]
        lines += ["| environment variable | default | meaning |", "|---|---|---|"]
        for name, info in model.model_fields.items():
            default = info.get_default(call_default_factory=True)
            lines.append(f"| `KOORD_RECOMMENDER_{group.upper()}__{name.upper()}` | `{default}` | {info.description} |")
        lines.append("")
    return "\n".join(lines)
