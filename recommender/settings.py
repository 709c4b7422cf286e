"""The domain's settings groups: the parameters the core's rules and the models compute with, each field with its
unit, default and reason.

Each layer keeps its own groups beside it (`models/settings.py`, `pipelines/settings.py`, `serving/settings.py`,
`presentation/settings.py`) and takes only what it needs; the root `Settings` (`cli/settings.py`) is assembled from
them at the composition root and read once from the environment (`KOORD_RECOMMENDER_<GROUP>__<FIELD>`), then passed
down. Nothing reads settings from a global.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from recommender.units import MIB, SECONDS_PER_DAY, SECONDS_PER_HOUR


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
        "at the 5-minute step), counted by recent weight: each halves per 24 h of age before the container's newest "
        "(VPA's histogram half-life), so a workload resuming after a long gap is not sized from its old history and "
        "one new sample. VPA gives none without samples; below this a request would be read from a histogram that is "
        "empty or nearly so (the pod minimum, 25m), and the webhook would apply it.",
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
    calibration (issue 19; docs/models.md). Every choice below was settled on the development half of the data
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
    selection_max_containers: int = Field(
        0,
        ge=0,
        description="Containers the fleet's choice and calibration are made on, at most; 0 (the default): all of "
        "them. A bigger fleet then decides on this many (the smallest hashes of their names: the same ones each "
        "run and however the fleet is partitioned) and fits every other container with its burstiness group's "
        "choice and the fleet's factor. A trade for very large fleets: at 10,000 containers, 1,000 took a "
        "Prometheus pass from 102 s to 68 s and 3.4 to 2.2 GiB; on the judged half, deciding on 62 of 125 "
        "containers cost up to 4 % overprovision at a 5 % risk and 2-16 % at 1 % (docs/benchmarks.md).",
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
        "than the fleet's choice (10 %): a choice needs evidence; and keeps it only when it makes the fleet's "
        "pooled line at most this much dearer (the lines are calibrated and judged as one fleet).",
    )
    group_min_containers: int = Field(
        20,
        ge=1,
        description="Containers a group needs before it may choose its own candidate.",
    )
    validation_days: int = Field(
        2,
        ge=0,
        description="Last rolling origins (days) held out of the choice to check it: the choice made on the origins "
        "before them must beat the best of the baselines' flat rules on these days, or every container takes that "
        "flat rule (chosen on all origins). A choice is then one that also won on days it did not see. 0: no check.",
    )
    selection_min_containers: int = Field(
        30,
        ge=1,
        description="Containers with usage a fleet needs before it chooses among the candidates: a smaller fleet's "
        "costs are a few containers' luck (Google 2019's 14 tasks, NAB's 11 series), so each of its containers takes "
        "the flat quantile of its own last `history_days` at the asked level, uncalibrated: its lines depend on its "
        "own samples only.",
    )
    fairness_tolerance: float = Field(
        1.0,
        ge=0,
        description="A candidate is chosen only if its p90 container violation at the matched level is at "
        "most that of the flat quantile of `history_days` (KRR's shape) plus this x the target (1: one point at 1 %).",
    )
    choice_min_gain: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="Share of the reference's matched overprovision (the flat quantile of `history_days` at the asked "
        "level) a candidate must save to replace it, fraction: candidates closer than this are a tie that a few "
        "containers joining or leaving the fleet break either way, while one container's lines under them may differ "
        "10x (a 1-day and a 14-day max); 0: always the cheapest.",
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
        "its recommendation is marked stale, every line holds its current request flat instead of extrapolating, "
        "and `show` and the dashboard leave it out of their totals.",
    )
    cpu_pod_spread_half_life_seconds: float = Field(
        7 * 86400.0,
        ge=0,
        description="Workloads of several pods: the day-ahead lines are learned on each step's busiest pod, but a "
        "request holds for every pod and is judged on each pod's samples (as VPA's histograms count them). Each CPU "
        "line is scaled by the (1 - P) quantile of every pod's samples over that of the busiest pod's, both from "
        "decaying histograms of this half-life (7 days, seconds: half the `history_days` window the lines read; "
        "`models.pod_spread`). 0: the lines keep the busiest pod's level. On Google 2019's one long job (1 %) it "
        "brought the CPU request's violation from 0.22 % to 1.02 % (docs/benchmarks.md).",
    )
    memory_pod_spread_half_life_seconds: float = Field(
        0.0,
        ge=0,
        description="Same for memory; 0 (off): memory is not compressible, and on Google 2019's job, whose pods' "
        "working sets drift, counting pods took the memory request's violation from 1.3 % to 4.8 % at 1 % for no "
        "less room at the matched level.",
    )
    memory_peak_margin_fraction: float = Field(
        0.15,
        ge=0,
        description="Memory: without an OOM kill the request stays at most, and a limit we set at least, the "
        "observed peak of the `history_days` window x (1 + this) (15 %, KRR's memory buffer): a small fleet cannot "
        "inflate a request, and a limit never lands under a peak the container reached in the window the lines use.",
    )
    ceiling_near_limit_fraction: float = Field(
        0.95,
        gt=0,
        le=1,
        description="No line goes above max(current limit, highest sample of the last `history_days`) unless evidence "
        "says the container needs more (`recommender.ceiling`); usage at this share of its limit or more is such "
        "evidence (95 %: a working set or a CPU average that close to the limit was held back by it).",
    )
    ceiling_throttled_fraction: float = Field(
        0.05,
        ge=0,
        le=1,
        description="CPU throttled in more than this share of its CFS periods is evidence against the ceiling (5 %, "
        "the overview's throttling risk): its usage was held at the limit.",
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


class LiveLineSettings(BaseModel):
    """The learned short-term line of the live cadence (`models/live_line.py`, docs/cadences.md): one global
    quantile model fitted by `train`, applied by `live` every interval and by `replay` every `--every`, calibrated
    online. Its risk level is the short-term line's (`forecast.short_term_target_violation`). Every default below
    was chosen on the development half (docs/benchmarks.md, "The live short-term line")."""

    enabled: bool = Field(
        True, description="False: the short-term line is the day-ahead one alone (no learned line is fitted)."
    )
    horizon_seconds: int = Field(
        300,
        ge=300,
        le=86400,
        description="Seconds one issued line covers, and the block the model is fitted to forecast (300: the next "
        "5-minute step). The live loop re-issues the line every interval (60 s), so the next step is all it needs to "
        "reach, and the newest samples say most about it: on the development half, re-issued every step, the "
        "next step's model needed 63.9 / 205.3 % CPU / memory room at 1 % against 123.1 / 247.7 % for an hour's "
        "model, and 17.1 / 91.3 % at 5 % against 16.2 / 84.6 % with its misses spread more evenly over the "
        'containers in memory (docs/benchmarks.md, "The next step\'s line"). A loop that misses passes for longer '
        "than this serves the day-ahead line until its next pass. `replay` and `backtest` fit their model for the "
        "block each of their lines is held (`--every`), not this.",
    )
    training_days: int = Field(
        14, ge=1, le=60, description="Days of rolling origins the model is fitted on (14, the grid's history)."
    )
    origin_stride_seconds: int | None = Field(
        None,
        ge=300,
        description="Spacing of the training origins, seconds. Unset: the block a line covers (`horizon_seconds`), "
        "so the origins' blocks tile the training days and every step is a target once: hourly origins for an "
        "hour's line (neighbours added little), every step for the next step's line, which with hourly origins "
        "saw a twelfth of the steps (on the development half, re-issued every step: 75.0 / 213.4 % CPU / memory "
        "room at 1 % with hourly origins, 63.9 / 205.3 % with every step's).",
    )
    max_training_rows: int = Field(
        100_000,
        ge=1000,
        description="(origin, step) rows fitted at most, a random subset above it: a big fleet's fit costs no "
        "more than this (a few seconds per resource on 2 cores).",
    )
    min_history_steps: int = Field(
        288,
        ge=12,
        description="5-minute samples a container needs in its last week before the learned line serves it (a "
        "day); with fewer, or none in the last hour, the day-ahead line stands (cold start, a gap).",
    )
    quantile_trees: bool = Field(
        False,
        description="Add a quantile-tree forecast (scikit-learn's HistGradientBoostingRegressor, quantile loss, "
        "fitted out of fold by time) to the blend's inputs. Off: on the development half it helped at a 5 % risk "
        "and cost more at 1 %, for two extra fits (docs/benchmarks.md).",
    )
    trees_quantile: float = Field(
        0.95, gt=0, lt=1, description="The quantile the trees forecast (the blend rescales it to the risk level)."
    )
    max_iter: int = Field(100, ge=10, description="Boosting iterations of the quantile trees.")
    learning_rate: float = Field(0.1, gt=0, le=1, description="Shrinkage of the quantile trees.")
    max_leaf_nodes: int = Field(8, ge=2, description="Leaves per tree: few, the trees overfit the training days.")
    min_samples_leaf: int = Field(
        3000, ge=1, description="Rows a leaf needs: large, for the same reason (200 fitted the training days)."
    )
    fairness_tolerance: float = Field(
        0.005,
        ge=0,
        le=1,
        description="The blend may not buy the fleet's room by giving up on some containers: its p90 container "
        "violation at the matched level stays within this share (half a point) of its best single statistic's.",
    )
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Newest share of the training rows the blend is not fitted on but checked on: it is drawn "
        "toward its best single statistic (weights 1, 0.75, 0.5, 0.25, 0) until its p90 container violation there "
        "is within `fairness_tolerance` of the statistic's, so the misses fall more evenly over the containers, for "
        "more room at the same risk. 0 (off): the blend is fitted on every row and kept whole. A third moved the "
        "judged half at 5 % from 0.95x / 0.82x the best rolling line's room with a p90 2.0 / 2.7 points above it to "
        '1.00x / 1.09x with 0.0 / 0.7 points (CPU / memory; 1 %: level) (docs/benchmarks.md, "The live '
        'short-term line").',
    )
    fleet_adaptation_rate: float = Field(
        0.0025,
        ge=0,
        description="Online calibration (adaptive conformal inference): the fleet's log-factor moves by this x "
        "(observed violation share / the risk level - 1) per hour of every served pod's samples (a pass that saw "
        "less, that share), a miss relative to the level, so "
        "the level comes back as fast at 1 % as at 5 %; 0 keeps the fitted line as it is. The faster the factor "
        "moves the more room the lines need at the same risk. 0.0025 moves as the absolute rate 0.05 chosen on the "
        "development half did at 5 % (0.05 x (share - 5 %)), with the two per-container rates below; at 1 % it moves "
        "five times as fast as that did, which held the raw violation of the line re-issued every 5-minute step at "
        "0.82-0.92 % on the development VMs (0.56-0.74 % before) for the same room (docs/benchmarks.md).",
    )
    own_adaptation_rate: float = Field(
        0.02,
        ge=0,
        description="The same for each container's own log-factor while its share is above the risk level, so the "
        "misses do not gather on a few containers (0 here and in `own_sink_rate`: the fleet's factor alone). The "
        "three rates (0.05, 0.02, 0.08) were chosen on the development half among 0.05 / 0.1 / 0.2, 0.01 / 0.02 / "
        "0.03 and 1 / 2 / 4 x this, as the least CPU room at 5 % whose p90 container violation there was at least "
        "0.3 points under the max of the last hour's in both resources: 27.3 / 104.4 % room and 8.4 / 9.0 % p90 "
        "(CPU / memory) against 29.1 / 100.0 % and 8.6 / 9.5 % with 0.2, 0.01, 0.01 "
        '(docs/benchmarks.md, "The live short-term line").',
    )
    own_sink_rate: float = Field(
        0.08,
        ge=0,
        description="The rate of a container's own log-factor while its share is below the risk level (an hour "
        "without a miss lowers it by this x the level, before the mean move of all is taken out). Faster than it "
        "rises: at the same rate one hour of a burst raised a container for many, and one its line never reached "
        "gave its room back slowly; on the development half at 5 % it took CPU from 29.0 / 8.3 % (room / p90) with "
        "0.02 to 27.3 / 8.4 %.",
    )
    floor_at_last_step: bool = Field(
        True,
        description="A line issued is never below the newest step's usage (where it has a sample): a level the "
        "container is at is not forecast to vanish within the next step. A blend fitted on a fleet that follows its "
        "daily cycle can weigh the same time yesterday most, and after a step up it then forecast the old level "
        "(0.29 cores for a container that had just moved from 0.25 to 1 core), until the calibration caught up hours "
        'later. Cost on the development half: docs/benchmarks.md, "The next step\'s line".',
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


class MutationSettings(BaseModel):
    """What the admission webhook's pod mutation (`recommender.mutation`, `recommender.optin`) decides with: it always
    allows the pod; these shape the patch. `serving.settings.WebhookSettings` adds how the service watches the cluster."""

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
        description='Mode of a pod nothing else opts in (docs/webhook.md, "Opt-in modes"): Off recommends only, Initial '
        "sets requests at creation, Auto is the same for a webhook (it never evicts). Off: nothing changes unless asked.",
    )
    dry_run: bool = Field(
        False,
        description="Only annotate what would change (koord-recommender.io/would-apply), never change resources: "
        "for trying the webhook on a live cluster.",
    )


class PlacementSettings(BaseModel):
    """What placement on forecast load (`recommender.placement`) judges nodes with. `serving.settings.ExtenderSettings`
    adds where the scheduler extender reads the cluster from."""

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


class ColocationSettings(BaseModel):
    """Reclaimable node resources for koord-batch and koord-mid pods (issue 6; docs/node-colocation.md)."""

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
        0.29,
        ge=0,
        lt=1,
        description=(
            "Margin used instead of cpu_margin_fraction when no usage measurement younger than fresh_seconds floors "
            "the offer (what `serve` offers between trainings without the live loop, and during metric outages), "
            "share of allocatable CPU: the forecast alone must absorb its own day-ahead error (chosen on the "
            "validation days of the --nodes backtest on bitbrains-aug and on bitbrains-jul-aug's July days: the "
            "smallest with no more violations than Koordinator's usage policy on both)."
        ),
    )
    memory_forecast_only_margin_fraction: float = Field(
        0.21,
        ge=0,
        lt=1,
        description="Same for memory (chosen the same way: Koordinator had no memory violation on those days, so it is wide).",
    )
    cpu_reclaim_ratio_margin_fraction: float = Field(
        0.02,
        ge=0,
        lt=1,
        description=(
            "Margin inside the node.koordinator.sh/cpu-reclaim-ratio label `recommender sync --reclaim-ratios` "
            "writes, share of allocatable: Koordinator then keeps this, the forecast rise and the node's largest "
            "5-minute rise of the week above its live usage (chosen as the live margins are: the smallest with no "
            "more violations than Koordinator's usage policy on bitbrains-aug's validation days and on "
            "bitbrains-jul-aug's July days, the stricter of the two; docs/benchmarks.md)."
        ),
    )
    memory_reclaim_ratio_margin_fraction: float = Field(
        0.11, ge=0, lt=1, description="Same for the memory-reclaim-ratio label (chosen the same way)."
    )
    cpu_live_margin_fraction: float = Field(
        0.045,
        ge=0,
        lt=1,
        description=(
            "Margin of the node room served from live usage (`colocation.live_reclaimable`: the newest measured "
            "high-priority usage plus the node's largest 5-minute rise from about that level after as much activity, "
            "the live rise tables), share of allocatable CPU (chosen on the validation days of the --nodes backtest "
            "and bitbrains-jul-aug's July days: the smallest with no more violations than Koordinator's usage policy "
            "on both, the stricter: 4.5 % since the rise tables are split by activity, 2.5 % before; "
            "docs/benchmarks.md)."
        ),
    )
    memory_live_margin_fraction: float = Field(
        0.075,
        ge=0,
        lt=1,
        description="Same for memory (chosen with memory_live_climb_factor as memory_live_line_margin_fraction is).",
    )
    cpu_live_forecast_cap: bool = Field(
        False,
        description=(
            "Cap the rise reserved above the live CPU usage at the short-term forecast (a rise the forecast does not "
            "expect is not reserved for). Off: capped, the held-out and unseen-July violations were several times "
            "Koordinator's (--nodes backtest)."
        ),
    )
    memory_live_forecast_cap: bool = Field(
        False,
        description="Same for memory: off, since memory spikes past the forecast (chosen the same way).",
    )
    live_rise_band_fraction: float = Field(
        0.2,
        ge=0,
        le=1,
        description=(
            "Live rise table: a node's rise allowed above a level is the largest 5-minute rise it showed from a level "
            "within this share of its requests (Mondrian by level band; 0: the same 1 % bin only, 1: any level, the "
            "largest rise). Chosen on the validation days of the --nodes backtest (10-30 % tried)."
        ),
    )
    live_rise_activity_seconds: int = Field(
        1800,
        ge=0,
        description=(
            "Live rise table split by the node's recent activity, seconds: the largest 5-minute change of its pooled "
            "usage over this long before a level was measured, against the node's median; a level measured after "
            "calm keeps the rises seen after calm, one measured in activity those seen in activity (0: no split). "
            "30 min: the most room at the margin rule's violations on both parts of bitbrains-aug among 30 min, 1 h "
            "and 2 h (--nodes backtest; docs/benchmarks.md)."
        ),
    )
    live_line: bool = Field(
        True,
        description=(
            "Node room from the learned live line of the node's pooled high-priority usage (`models.live_line`, "
            "fitted on the node grid beside the node models): allocatable minus the live_line margin and the larger "
            "of the newest measured usage plus its rise (the live rise tables) and the line times live_line_factor. "
            "False, or no fitted line (cold start, a gap): the live rise tables' room alone (live margin)."
        ),
    )
    live_line_horizon_seconds: int = Field(
        3600,
        ge=300,
        le=86400,
        description=(
            "Seconds one issued node line covers (1 h, the containers' line's): the live loop re-issues the node "
            "room every pass; an hour's line reserves for a ramp before it starts, and gave more room at equal "
            "violations than a 5-minute line on the validation days of the --nodes backtest (docs/benchmarks.md)."
        ),
    )
    live_line_target_violation: float = Field(
        0.01,
        gt=0,
        lt=0.5,
        description=(
            "Share of the node's 5-minute steps the node line is fitted and calibrated online to be exceeded at "
            "(1 %: more room at equal violations on the validation days than 0.1 %; the factor, the margin and the "
            "rise tables below set the served risk)."
        ),
    )
    live_line_fleet_adaptation_rate: float = Field(
        0.002,
        ge=0,
        description=(
            "The node line's online calibration: its fleet log-factor moves by this x (observed violation share / "
            "the level - 1) per hour of samples (`live_line.fleet_adaptation_rate` for the nodes; no factor per node). "
            "0.002: at the node line's 1 % the moves of the absolute rate 0.2 (0.2 x (share - 1 %)) the factor, the "
            "margin and the rise tables below were chosen with."
        ),
    )
    cpu_live_line_factor: float = Field(
        0.9,
        gt=0,
        description=(
            "Factor on the node's learned CPU live line before it is reserved (with the margin below, the knobs of "
            "the node room's risk): the pair whose room on the --nodes backtest's validation days is the largest share "
            "above Koordinator's usage policy at as many violations (docs/benchmarks.md)."
        ),
    )
    memory_live_line_factor: float = Field(0.2, gt=0, description="Same for memory (chosen the same way).")
    cpu_live_line_margin_fraction: float = Field(
        0.045,
        ge=0,
        lt=1,
        description=(
            "Margin of the node room served from the learned live line and the rise tables, share of allocatable "
            "CPU (chosen with the factor on the validation days of the --nodes backtest; docs/benchmarks.md)."
        ),
    )
    memory_live_line_margin_fraction: float = Field(
        0.075,
        ge=0,
        lt=1,
        description="Same for memory (chosen the same way, with memory_live_climb_factor: 12 % without the climb).",
    )
    cpu_live_climb_factor: float = Field(
        0.0,
        ge=0,
        description=(
            "Live room: factor on the node's climb (how far its pooled CPU usage rose into the newest measurement "
            "from the one a step before; a fall counts 0) added to the rise kept above the level "
            "(`colocation.climbing_rise`): a node that has just started to climb may go on. 0 (off): on the "
            "validation days of the --nodes backtest every factor tried (0.25-2) gave less CPU room at the same "
            "violations (factor 1: +63.5 % against Koordinator's usage policy, +65.0 % without)."
        ),
    )
    memory_live_climb_factor: float = Field(
        2.25,
        ge=0,
        description=(
            "Same for memory: the fleet's memory bursts ramp over two or more 5-minute steps, so twice and a quarter "
            "the last step's climb is kept on top of the rise table, which let the flat margin fall from 12 % to "
            "7.5 % (chosen with memory_live_line_margin_fraction on the validation days of the --nodes backtest "
            "on bitbrains-aug, factors 0-4 by 0.25: the most room against Koordinator's usage policy at as many "
            "violations; docs/benchmarks.md)."
        ),
    )
    cpu_live_rise_history_days: int = Field(
        14,
        gt=0,
        description=(
            "Days of 5-minute CPU rises the live rise table learns from (chosen on the validation days: 14 kept fewer "
            "violations than 7)."
        ),
    )
    memory_live_rise_history_days: int = Field(
        7, gt=0, description="Same for memory (7: 14 days gave less room at the same violations)."
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
            live_margin_fraction=getattr(self, f"{resource}_live_margin_fraction"),
            live_line_factor=getattr(self, f"{resource}_live_line_factor"),
            live_line_margin_fraction=getattr(self, f"{resource}_live_line_margin_fraction"),
            live_climb_factor=getattr(self, f"{resource}_live_climb_factor"),
            live_forecast_cap=getattr(self, f"{resource}_live_forecast_cap"),
            live_rise_history_days=getattr(self, f"{resource}_live_rise_history_days"),
            jump_quantile=getattr(self, f"{resource}_jump_quantile"),
            koordinator_reclaim_percent=getattr(self, f"koordinator_{resource}_reclaim_percent"),
        )


@dataclass(frozen=True)
class ResourceColocation:
    """`ColocationSettings` of one resource (see there for each field's meaning, unit and default)."""

    margin_fraction: float
    forecast_only_margin_fraction: float
    reclaim_ratio_margin_fraction: float
    live_margin_fraction: float
    live_line_factor: float
    live_line_margin_fraction: float
    live_climb_factor: float
    live_forecast_cap: bool
    live_rise_history_days: int
    jump_quantile: float
    koordinator_reclaim_percent: float
