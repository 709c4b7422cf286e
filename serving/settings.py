"""The service's and the cluster controllers' settings, and `ServingSettings`, the group `serve`, `sync` and
`cluster-files` take (the root settings are one)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from models.settings import StoreSettings
from presentation.settings import OverviewSettings
from recommender.settings import ColocationSettings, MutationSettings, PlacementSettings
from recommender.units import MIB, SECONDS_PER_DAY


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
    inline_extender_nodes: int = Field(
        5000,
        ge=0,
        description="A scheduler extender call naming at most this many nodes (nodeCacheCapable), for a pod of at "
        "most inline_review_containers containers, is judged on the event loop (about a millisecond at 5,000): "
        "a hop to a worker thread and back costs more than that on a busy node. Calls with whole nodes or more "
        "names go to the worker threads.",
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


class WebhookSettings(MutationSettings):
    """The mutating admission webhook (POST /mutate). It always allows the pod; these shape the patch."""

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


class ExtenderSettings(PlacementSettings):
    """The scheduler extender (POST /scheduler/filter, /scheduler/prioritize): placement on forecast load."""

    pods_file: Path | None = Field(
        None,
        description="Where pods run: `kubectl get pods -A -o json` output, re-read when it changes; none: nodes count as empty.",
    )
    nodes_file: Path | None = Field(
        None,
        description="Node allocatable and annotations: `kubectl get nodes -o json`; needed for nodeCacheCapable (name-only) calls.",
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
        description="How long an accepted token is reused without asking again, seconds (one API call per token per "
        "minute); it is re-reviewed in the background once half of it has passed, so a caller in use never waits.",
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
        description="TokenReview (and SubjectAccessReview) calls per second at most for tokens not accepted "
        "before, all clients together, with a burst of as many; a token that would need one beyond it gets 429 (the "
        "API server is shared).",
    )
    token_review_rate_per_source: float = Field(
        5.0,
        gt=0,
        description="The same, per client address, calls per second (burst as many): one address flooding unknown "
        "tokens spends its own budget first, not all of the one above.",
    )
    token_review_known_rate_per_second: float = Field(
        10.0,
        gt=0,
        description="Review calls per second at most for tokens accepted before (their refresh at half their cache "
        "time, or after it expired): a budget no other token spends, so a flood cannot lock a known caller out.",
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
    live_stale_after_seconds: float = Field(
        300.0,
        gt=0,
        description="A VPA's RecommendationStale condition turns True when the live update served was written longer "
        "ago than this, seconds (5 passes of the loop's 1-minute interval: the loop stalled, e.g. Prometheus down); "
        "only while live updates are served.",
    )
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


class ServingSettings(BaseModel):
    """What the HTTP service and the controllers read: the store they load, how they serve, mutate, place and write."""

    store: StoreSettings = StoreSettings()
    colocation: ColocationSettings = ColocationSettings()
    serve: ServeSettings = ServeSettings()
    webhook: WebhookSettings = WebhookSettings()
    extender: ExtenderSettings = ExtenderSettings()
    auth: AuthSettings = AuthSettings()
    sync: SyncSettings = SyncSettings()
    overview: OverviewSettings = OverviewSettings()
