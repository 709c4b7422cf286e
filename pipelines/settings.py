"""The pipelines' settings: reading usage (files, Prometheus), training at scale, and `TrainingSettings`, the one
group training, `recommend` and the backtests take (the root settings are one)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator

from models.settings import ModelSettings, StoreSettings
from recommender.settings import ColocationSettings
from recommender.units import GIB, SECONDS_PER_DAY, SECONDS_PER_HOUR


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


class ScaleSettings(BaseModel):
    """Training in partitions: on a Dask cluster each read and fitted by one task, or one after the other in this
    process (docs/scale-out.md)."""

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
    partition_containers: int | None = Field(
        None,
        ge=1,
        description="Workload containers per partition (a task's unit of work and memory); whole workloads stay "
        "together, a bigger one is a partition alone. Unset: 500 on a cluster; in one process, one partition (the whole "
        "fleet) from a file and `partition_samples` from Prometheus; set, the fit goes partition after partition so "
        "its memory follows the partition.",
    )
    partition_samples: int = Field(
        1_000_000,
        ge=1,
        description="Samples (containers x steps of the history) per partition of a Prometheus read in this process "
        "when `partition_containers` is unset, 1,000,000 by default (about 250 containers x 14 days at 5 minutes): "
        "the read streams partition by partition into the estimators, one partition read ahead while the one before "
        "it is fitted, so the rows held are about two partitions' (some 72 bytes a sample, names as codes; a few "
        "times that while the per-sample estimators fit) whatever the fleet; what outlives a partition is its compact state (histogram "
        "counts, the forecast grids of containers x steps). Whole namespaces: a bigger namespace is a partition alone.",
    )
    side_process_max_grid_mib: int = Field(
        128,
        ge=0,
        description="Largest memory usage grids (MiB, all partitions') whose forecasts a Prometheus run in this "
        "process chooses in its side process, beside CPU's, 128 by default (about 4,000 containers x 14 days): "
        "worth it where the choice's two threads wait on each other (1,000 containers: the choice 4.7 -> 3.8 s), "
        "not where numpy's long sorts already keep both cores busy (10,000: 42.9 -> 42.0 s, and the side process's "
        "own working memory on top of this one's). Above it, two threads; 0: never.",
    )
    failure_tolerance_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of partitions that may still fail (after retries, on a cluster) with the version published "
        "anyway (their workloads are named in the manifest's `skipped`). 0: any failure stops the publish. "
        "`--allow-partial` is about one partition's Prometheus read: with it a failed namespace batch is skipped and "
        "the partition goes on; without it the partition fails and counts here.",
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
        description="A run on a Dask cluster gives up after this long, seconds (6 h).",
    )


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
    concurrency: int = Field(
        2,
        gt=0,
        le=32,
        description="Range queries in flight at once, 2 by default: a batch's CPU, memory and throttling queries and "
        "their time chunks overlap, so Prometheus evaluates one while we decode another (docs/benchmarks.md: 24 % "
        "less wall than 1 at 1,000 containers on 2 cores, low load). Be kind to a shared Prometheus: its memory grows "
        "by about one answer (`max_points_per_query`) per query evaluating (`evaluating`), and less with each in "
        "flight (measured peaks: 145 MiB at 1, 173 MiB at 2, 211 MiB at 2 evaluating).",
    )
    evaluating: int = Field(
        1,
        gt=0,
        le=32,
        description="Of the queries in flight, how many Prometheus may be evaluating at once (a query counts until "
        "its answer starts to arrive; Prometheus builds a whole answer first): 1 by default, so Prometheus holds "
        "one answer being built (its memory as with one query in flight) while the others stream to us and are "
        "decoded. Raise it with `concurrency` for a Prometheus with cores to spare.",
    )
    compress_answers: bool = Field(
        False,
        description="Ask Prometheus for gzip answers. Off by default: Prometheus' gzip costs it about 6x the CPU of "
        "evaluating and encoding a usage answer and is slower than a ~200 Mbit/s link sends the plain bytes (7x "
        "more of them); turn on over a slow or metered link.",
    )
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
    scrape_watermark_query: str = Field(
        "min(timestamp(up))",
        description="Instant PromQL giving the newest time up to which every scrape has been written (Prometheus "
        "commits a scrape's samples and its `up` together); a step ending later is left for the next pass. Without "
        "it a scrape committed more than `read_lag_seconds` late (a loaded Prometheus) would be missing from the "
        "loop's read for good, though in every later read of the same step. Narrow it to the jobs the loop reads "
        '(`min(timestamp(up{job=~"kubelet|kube-state-metrics"}))`); empty: `read_lag_seconds` alone.',
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


class TrainingSettings(ModelSettings):
    """What training, the live loop, `recommend` and the backtests read: the model parameters, the input's bounds and sources, the
    store and (for node lines) the colocation rules."""

    ingest: IngestSettings = IngestSettings()
    store: StoreSettings = StoreSettings()
    scale: ScaleSettings = ScaleSettings()
    colocation: ColocationSettings = ColocationSettings()
    prometheus: PrometheusSettings = PrometheusSettings()
    live: LiveSettings = LiveSettings()
