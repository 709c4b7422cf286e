"""The resource model: what we tell the cluster about one workload container, and the JSON contract it travels in.

Koordinator's four lines per workload: limit (what was asked for), usage, short-term reservation (next hours,
from recent history) and long-term reservation (from a long history). Beside them, VPA-style request sizing
(target and bounds) and the forecast peak. CPU is in cores, memory in bytes, times in Unix seconds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from recommender.identity import WorkloadKey


class Peak(BaseModel):
    """The usage peak expected over the horizon, at or above the short-term reservation, and when it comes."""

    value: float = Field(
        description="Forecast peak (cores or bytes): the point forecast of the next day's maximum usage (about half "
        "the days peak above it), never below the short-term line's highest step (usage passes a line built for a risk "
        "of P at P of the steps); that step itself where there is no point forecast (a stale container, a rule's line)."
    )
    at: int | None = Field(
        description="Start (Unix seconds) of the first step at which the short-term line reaches its highest, always "
        "after the decision time and before the line falls again within the horizon; None where the line has no "
        "time of maximum: highest already at the decision time, or at its highest from there to the horizon's end "
        "(flat, a step up to a flat level, still rising)."
    )


class LineQuality(BaseModel):
    """How the chosen candidate of one line scored on the rolling-origin backtest of the last days."""

    cost: float | None = Field(
        description="The container's own pinball cost of the chosen candidate at its risk level, relative to its usage "
        "(usage above the line, unused room below it); lower is better; None when the history was too short."
    )
    next_best_cost: float | None = Field(
        None,
        description="The container's lowest cost among the candidates not chosen "
        "(the fleet chooses, so one may be lower for this container).",
    )
    fleet_overprovision: float | None = Field(
        None,
        description="Why it was chosen: the chosen candidate's overprovision over the whole fleet at the "
        "matched risk level on the backtest, alpha x sum(line) / sum(usage) - 1.",
    )
    calibration_factor: float = Field(description="Scale applied to the chosen line so its violations meet the target.")
    pod_factor: float = Field(
        1.0,
        description="Scale applied after it so the line holds for every pod's samples, not only each step's busiest "
        "pod's: the pods' (1 - P) quantile over the busiest pod's (`models.pod_spread`); 1 where the container ran one "
        "pod at a time, and for memory, which keeps the busiest pod's level.",
    )


class LineModels(BaseModel):
    """Which model produced each line (the candidate chosen for the container, or the rule it fell back to)."""

    target: str
    short_term: str
    long_term: str
    peak: str
    quality: dict[str, LineQuality] = Field(
        default_factory=dict,
        description="Backtest quality per line (target, short_term, long_term) drawn by a selected model; a line "
        "from a fallback rule has none.",
    )


class LineLevels(BaseModel):
    """The risk level each line was built for: the share of 5-minute samples it may be under."""

    target: float = Field(description="Request line (the `target`).")
    short_term: float
    long_term: float


class LiveLine(BaseModel):
    """The learned short-term line of the live cadence: what `short_term` holds from `issued_at` until `until`."""

    value: float = Field(description="The line over [issued_at, until) (cores or bytes).")
    issued_at: int = Field(description="Start of the block it covers: the step after the newest sample, Unix seconds.")
    until: int = Field(description="End of the block, Unix seconds; the day-ahead line follows it.")
    calibration_factor: float = Field(
        description="The online calibration's factor in the value: above 1 when recent lines were under-run more "
        "often than the risk level allows, below 1 when less."
    )
    model: str = Field(description="What drew it.")


class ResourceRecommendation(BaseModel):
    """One resource (CPU or memory) of one workload container."""

    target: float = Field(description="Recommended request (VPA's target, after the allowed range).")
    lower_bound: float = Field(description="Below this the request is too small (VPA's lower bound).")
    upper_bound: float = Field(description="Above this the request is wasteful (VPA's upper bound).")
    uncapped_target: float = Field(description="The target before the allowed range was applied.")
    short_term: list[float] = Field(description="Short-term reservation: one value per step over the horizon.")
    live_short_term: LiveLine | None = Field(
        None,
        description="Where the learned live line serves the container: its value, which the first steps of "
        "`short_term` hold, and the block it covers; None where the day-ahead line stands alone (cold start, a gap, "
        "a stale container, a risk level of its own, or a version trained without it).",
    )
    long_term: float = Field(description="Long-term reservation (Koordinator's mid rule).")
    peak: Peak
    levels: LineLevels | None = Field(
        None,
        description="The risk level of each line; None where the lines come from "
        "the foundation's rules (forecasting off).",
    )
    stale: bool = Field(
        False,
        description="No sample for `forecast.stale_after_seconds`: no fresh forecast was made; "
        "every line holds the current request flat (the limit where only a limit is set; the target where neither "
        "is: `models.short_term` says which); the webhook leaves such containers alone, and `show` and the overview "
        "leave them out of their totals.",
    )
    limit: float | None = Field(
        None,
        description="The limit we would set with this target for the container's current request and limit, on the "
        "quantity grid (whole millicores, MiB): what the webhook writes, the dashboard and every format show "
        "(`recommender.limits`). A missing or zero current request counts as the limit. None without a current "
        "limit: we never add one.",
    )
    limit_rule: str | None = Field(
        None,
        description="Which rule set `limit`: scaled with the request (VPA's rule), the "
        "request itself, or the observed peak (memory: + margin).",
    )
    limit_floor: float | None = Field(
        None,
        description="No limit we set goes below this: the highest usage of the history window "
        "(`forecast.history_days`), for memory x (1 + `forecast.memory_peak_margin_fraction`); None without usage.",
    )
    ceiling: float | None = Field(
        None,
        description="max(current limit, highest sample of the last `forecast.history_days`): without evidence that "
        "the container needs more (an OOM kill, usage at the limit, CPU throttling) no line goes above it "
        "(`recommender.ceiling`). None where nothing bounds the lines (forecasting off, or an older version).",
    )
    ceiling_rules: dict[str, str] = Field(
        default_factory=dict,
        description="Per line the ceiling touched (target, uncapped_target, upper_bound, short_term, "
        "live_short_term, long_term, peak): `capped at max(limit, highest sample)`, or the evidence that lets it "
        "stand above (`above max(limit, highest sample): 2 OOM kills in the history`). Empty: every line is below.",
    )
    models: LineModels | None = Field(default=None, description="Which model produced each line (optional).")
    policy: Literal["forecast", "vpa"] = Field(
        "forecast",
        description="The request policy that produced target and bounds: `forecast` (ours) or `vpa` (the "
        "VPA recommender's rules exactly: whole millicores and bytes). Versions before it read as forecast.",
    )


class CurrentResources(BaseModel):
    """What the workload asked for at its last sample (max over its pods); None where the data does not say."""

    cpu_request_cores: float | None = None
    cpu_limit_cores: float | None = None
    memory_request_bytes: float | None = None
    memory_limit_bytes: float | None = None
    cpu_throttled_fraction: float | None = Field(
        None, description="Share of CFS periods in which the CPU limit throttled the container (max over pods)."
    )


class History(BaseModel):
    """The data the recommendation was learned from."""

    first_sample: int = Field(description="Unix seconds.")
    last_sample: int = Field(description="Unix seconds.")
    pods: int = Field(description="Distinct pods pooled into this recommendation.")
    replicas: int | None = Field(
        None,
        description="Pods running at the newest sample (their newest sample within 15 minutes of it): what the "
        "savings are multiplied by. None in versions trained before it was recorded (then counted as 1).",
    )
    samples: int = Field(description="Usage rows used.")
    cpu_samples: int | None = Field(
        None, description="Rows with a CPU value (a recommendation needs `policy.min_samples`)."
    )
    memory_samples: int | None = Field(None, description="Rows with a memory value (the same minimum).")
    cpu_recent_samples: float | None = Field(
        None,
        description="The CPU rows counted by recent weight: each halves per day of age before the newest (VPA's "
        "24 h half-life). A recommendation needs `policy.min_samples` of these, so a container that resumes after a "
        "long gap gets none (null) until it has that much new data, however long its old history. None in versions "
        "from before it was recorded.",
    )
    memory_recent_samples: float | None = Field(None, description="Same for memory.")
    oom_kills: int = Field(0, description="OOM kills of the workload's containers seen in the history.")
    recent_cpu_cores: list[float | None] = Field(
        default_factory=list, description="Usage line: max over pods per step for the last day before as_of."
    )
    recent_memory_bytes: list[float | None] = Field(default_factory=list, description="Same for memory.")


class WorkloadRecommendation(BaseModel):
    """Everything we recommend for one (namespace, workload, container)."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    workload: str
    container: str
    kind: str | None = Field(
        None, description="Workload kind (Deployment, StatefulSet, DaemonSet, CronJob, Job, Pod) where the source says."
    )
    cpu: ResourceRecommendation | None = Field(
        description="None with fewer than `policy.min_samples` recent CPU samples (`history.cpu_recent_samples`)."
    )
    memory: ResourceRecommendation | None = Field(
        description="None with fewer than `policy.min_samples` recent memory samples (`history.memory_recent_samples`)."
    )
    current: CurrentResources = CurrentResources()
    history: History | None = None

    @property
    def key(self) -> WorkloadKey:
        return WorkloadKey(self.namespace, self.workload, self.container)


class NodePod(BaseModel):
    """A pod whose usage a node's lines were learned from."""

    namespace: str
    pod: str
    workload: str
    priority_class: str = Field(description="Koordinator priority class (koord-prod, ..., or none when unknown).")


class NodeResourceLines(BaseModel):
    """One resource of a node's high-priority pods, pooled: the forecast of their sum, not the sum of forecasts."""

    limit: float | None = Field(
        description="Sum of the high-priority pods' requests at the last sample (limits where no request); None if unknown."
    )
    last_usage: float | None = Field(description="Pooled high-priority usage at the newest step before as_of.")
    jump: float = Field(
        0.0,
        description="How far the pooled usage rises between two 5-minute measurements (a high quantile of the last week's rises).",
    )
    largest_jump: float | None = Field(
        None,
        description=(
            "The largest 5-minute rise of the last week: the reclaim-ratio labels keep it (Koordinator acts on a "
            "measurement up to a step old); None in versions from before it was stored (then `jump`)."
        ),
    )
    live_rise: list[float] | None = Field(
        None,
        description=(
            "The live room's rise table: per level bin (`colocation.LEVEL_BINS` of live_rise_reference), the largest "
            "5-minute rise of the pooled usage from about that level in the last days (`models.nodes.level_rise_table`); "
            "None in versions from before it was stored (then largest_jump)."
        ),
    )
    live_rise_reference: float | None = Field(
        None,
        description="The level live_rise is binned over (the pods' requests, else the peak usage), cores or bytes.",
    )
    live_rise_calm: list[float] | None = Field(
        None,
        description=(
            "live_rise learned from the steps after calm: a live_activity at or below live_activity_edge reads it "
            "(`models.nodes.activity_rise_tables`); None without the split."
        ),
    )
    live_rise_active: list[float] | None = Field(
        None, description="live_rise learned from the steps after activity: a live_activity above the edge."
    )
    live_activity_edge: float | None = Field(
        None,
        description="The node's median activity (largest 5-minute change over `colocation.live_rise_activity_seconds`), "
        "cores or bytes: what splits calm from active.",
    )
    live_activity: float | None = Field(
        None,
        description="The node's activity up to live_usage, from the live loop's measurements (None: unknown, "
        "live_rise is kept).",
    )
    live_climb: float | None = Field(
        None,
        description="How far the pooled usage rose into live_usage from the live loop's measurement a step before, "
        "cores or bytes (negative: a fall; None: not measured a step apart). The live room keeps "
        "live_climb_factor times it on top of the rise (`colocation.climbing_rise`).",
    )
    live_line: float | None = Field(
        None,
        description="The learned live line of the pooled usage over the next hour, issued by the live loop from the "
        "node's recent usage and calibrated online (`pipelines.live.NodeLiveLines`), cores or bytes: the live room "
        "reserves the larger of it (times live_line_factor) and live_usage plus its rise. None: no fitted line, a "
        "cold start or a gap (the rise tables alone).",
    )
    recent_usage: list[float | None] = Field(
        description="Pooled high-priority usage per step over the last day before as_of."
    )
    short_term: list[float] = Field(
        description="Short-term reservation: forecast of the pooled usage per step from as_of."
    )
    long_term: float = Field(description="Long-term reservation: steady forecast of the pooled usage over days.")
    live_usage: float | None = Field(
        None,
        description=(
            "Pooled high-priority usage at the live loop's newest read (a pod container without a sample there at its "
            "request, as Koordinator counts it), at the node's `live_sample`; None in a version or before a live read."
        ),
    )


class NodeForecast(BaseModel):
    """The pooled lines of one node's high-priority pods (learned when the usage says where pods ran)."""

    node: str
    last_sample: int = Field(description="Newest usage sample on the node, Unix seconds (for staleness).")
    live_sample: int | None = Field(
        None, description="When the live loop last measured the node (its resources' `live_usage`), Unix seconds."
    )
    cpu: NodeResourceLines | None
    memory: NodeResourceLines | None
    pods: list[NodePod]


class RecommendationSet(BaseModel):
    """The output of `recommender recommend` and the content of a model version's recommendations."""

    as_of: int = Field(description="Decision time, Unix seconds: only samples before it were used.")
    horizon_seconds: int
    step_seconds: int
    nodes: list[NodeForecast] = Field(
        default_factory=list, description="Per-node pooled lines (empty without node placement)."
    )
    # Last: distributed training streams this list into the JSON (`recommendation_set_chunks`).
    recommendations: list[WorkloadRecommendation]


def recommendation_set_chunks(header: RecommendationSet, fragments: Iterable[bytes]) -> Iterator[bytes]:
    """The JSON of `header` with its recommendations replaced by `fragments` (byte for byte what `model_dump_json`
    gives), each the comma-joined JSON of some recommendations in order: a fleet's set is written without holding
    its whole text (distributed training writes partitions' fragments, a single process one per recommendation)."""
    text = header.model_copy(update={"recommendations": []}).model_dump_json().encode()
    assert text.endswith(b"[]}"), "recommendations must stay the last field of RecommendationSet"
    yield text[:-2]
    first = True
    for fragment in fragments:
        if fragment:
            yield fragment if first else b"," + fragment
            first = False
    yield text[-2:]


#: How far a model's decision time may lie after the server's clock (the trainer's and the server's clocks differ).
CLOCK_SKEW_SECONDS = 600


def model_age_problem(as_of: float, now: float, max_age_seconds: float) -> str | None:
    """Why a model whose decision time is `as_of` must not be acted on at `now` ("... h old", or a decision time in
    the future: a clock or timestamp-unit error, which would otherwise read as a fresh model), else None."""
    age = now - as_of
    if age < -CLOCK_SKEW_SECONDS:
        return f"has its decision time {-age / 3600:.0f} h in the future (a clock or timestamp-unit error)"
    if age > max_age_seconds:
        return f"is {age / 3600:.0f} h old"
    return None
