"""Settings, grouped by concern. Every constant the recommender uses lives here, with its unit, default and reason.

Values come from (highest first) explicit arguments, environment variables `KOORD_RECOMMENDER_<GROUP>__<FIELD>`
(for example `KOORD_RECOMMENDER_POLICY__SAFETY_MARGIN_FRACTION=0.2`), then the defaults below. A `Settings`
object is built once at the edge (CLI, app factory) and passed down; nothing reads it from a global.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from recommender.units import MIB, SECONDS_PER_DAY, SECONDS_PER_HOUR


class HistogramSettings(BaseModel):
    """VPA's decaying exponential histograms (anchors.md section 2). Defaults are VPA's, so results match it."""

    bucket_growth_ratio: float = Field(
        0.05, gt=0, le=1, description="Each bucket is this fraction wider than the previous (VPA: 5 %); sets the resolution."
    )
    cpu_first_bucket_cores: float = Field(0.01, gt=0, description="Width of the first CPU bucket, cores (VPA: 0.01).")
    cpu_max_cores: float = Field(1000.0, gt=0, description="CPU value the last bucket starts at or above, cores (VPA: 1000).")
    memory_first_bucket_bytes: float = Field(1e7, gt=0, description="Width of the first memory bucket, bytes (VPA: 1e7).")
    memory_max_bytes: float = Field(1e12, gt=0, description="Memory value the last bucket starts at or above, bytes (VPA: 1e12).")
    epsilon: float = Field(
        1e-4, gt=0, description="Bucket weight below which a bucket counts as empty (VPA: 0.001 x min sample weight 0.1)."
    )
    cpu_half_life_seconds: float = Field(
        SECONDS_PER_DAY, gt=0, description="Age at which a CPU sample counts half, seconds (VPA: 24 h)."
    )
    memory_half_life_seconds: float = Field(
        SECONDS_PER_DAY, gt=0, description="Age at which a memory peak counts half, seconds (VPA: 24 h)."
    )
    cpu_sample_weight: float = Field(0.1, gt=0, description="Weight of one CPU sample (VPA: 0.1, no request weighting).")
    memory_peak_weight: float = Field(1.0, gt=0, description="Weight of one memory peak (VPA: 1.0).")
    memory_aggregation_interval_seconds: int = Field(
        SECONDS_PER_DAY, gt=0, description="Memory enters the histogram as one peak per pod per interval, seconds (VPA: 24 h)."
    )
    memory_aggregation_interval_count: int = Field(
        8, gt=0, description="How many of the newest peak intervals are kept (VPA: 8, i.e. 8 days of memory history)."
    )
    oom_min_bump_bytes: float = Field(
        100 * MIB, ge=0, description="An OOM kill records at least usage + this, bytes (VPA: 100 MiB)."
    )
    oom_bump_ratio: float = Field(1.2, ge=1, description="An OOM kill records at least usage x this (VPA: 1.2).")


class PolicySettings(BaseModel):
    """How histogram percentiles become a request recommendation (VPA's defaults, anchors.md section 2)."""

    target_percentile: float = Field(0.9, gt=0, le=1, description="Percentile the target is read at (VPA: p90).")
    lower_bound_percentile: float = Field(0.5, gt=0, le=1, description="Percentile of the lower bound (VPA: p50).")
    upper_bound_percentile: float = Field(0.95, gt=0, le=1, description="Percentile of the upper bound (VPA: p95).")
    safety_margin_fraction: float = Field(0.15, ge=0, description="Added on top of every percentile (VPA: 15 %).")
    lower_bound_confidence_multiplier: float = Field(
        0.001, ge=0, description="Lower bound x (1 + this/days)^exponent: shrinks it while history is short (VPA: 0.001)."
    )
    lower_bound_confidence_exponent: float = Field(-2.0, description="Exponent of the lower bound's factor (VPA: -2).")
    upper_bound_confidence_multiplier: float = Field(
        1.0, ge=0, description="Upper bound x (1 + this/days)^exponent: widens it while history is short (VPA: 1.0)."
    )
    upper_bound_confidence_exponent: float = Field(1.0, description="Exponent of the upper bound's factor (VPA: 1).")
    min_confidence_days: float = Field(
        1 / 24,
        gt=0,
        description="Floor of the history length used in the confidence factors, days. VPA divides by zero here and "
        "returns absurd bounds for new workloads; one hour keeps the upper bound finite.",
    )
    pod_min_cpu_cores: float = Field(0.025, ge=0, description="Smallest CPU recommendation per pod, cores (VPA: 25m).")
    pod_min_memory_bytes: float = Field(
        250 * MIB, ge=0, description="Smallest memory recommendation per pod, bytes (VPA: 250 MiB)."
    )
    min_allowed_cpu_cores: float | None = Field(None, ge=0, description="Cap the target from below, cores (none).")
    max_allowed_cpu_cores: float | None = Field(None, gt=0, description="Cap the target from above, cores (none).")
    min_allowed_memory_bytes: float | None = Field(None, ge=0, description="Cap the target from below, bytes (none).")
    max_allowed_memory_bytes: float | None = Field(None, gt=0, description="Cap the target from above, bytes (none).")

    @model_validator(mode="after")
    def _ordered(self) -> PolicySettings:
        if not self.lower_bound_percentile <= self.target_percentile <= self.upper_bound_percentile:
            raise ValueError("percentiles must satisfy lower_bound <= target <= upper_bound")
        return self


class ReservationSettings(BaseModel):
    """Koordinator's reservation lines: long-term (its mid rule, anchors.md section 1) and the short-term forecast."""

    long_term_cpu_percentile: float = Field(0.95, gt=0, le=1, description="Koordinator mid: p95 of CPU.")
    long_term_memory_percentile: float = Field(0.98, gt=0, le=1, description="Koordinator mid: p98 of memory.")
    long_term_margin_fraction: float = Field(0.10, ge=0, description="Koordinator mid: x 1.10 on both.")
    long_term_cpu_half_life_seconds: float = Field(12 * SECONDS_PER_HOUR, gt=0, description="Koordinator mid: 12 h.")
    long_term_memory_half_life_seconds: float = Field(24 * SECONDS_PER_HOUR, gt=0, description="Koordinator mid: 24 h.")
    step_seconds: int = Field(300, gt=0, description="Resolution of the short-term line, seconds (5 minutes).")
    recent_window_seconds: int = Field(
        SECONDS_PER_HOUR, gt=0, description="The short-term line never drops below the max of this last window (fast up)."
    )
    seasonal_days: int = Field(7, gt=0, description="How many past days at the same time of day the short-term line looks at.")
    slot_tolerance_seconds: int = Field(
        900, ge=0, description="Half-width of the time-of-day window: spikes recur a few minutes early or late."
    )


class ForecastSettings(BaseModel):
    """The forecast models, their per-container selection and calibration (issue 4; README "Models")."""

    short_term_target_violation: float = Field(
        0.01, gt=0, lt=0.5, description="Share of 5-minute samples the calibrated short-term line may be under (1 %)."
    )
    request_target_violation: float = Field(
        0.02, gt=0, lt=0.5, description="Same for the request line (2 %: VPA's request violates about 2.3 % on bitbrains)."
    )
    long_term_target_violation: float = Field(
        0.01, gt=0, lt=0.5, description="Same for the long-term line, judged on day-ahead rolling origins (1 %)."
    )
    selection_days: int = Field(
        7, ge=1, description="Rolling origins (days) each container's models are scored and calibrated on."
    )
    change_weight: float = Field(
        0.1, ge=0, description="Autopilot cost: weight of the line's changes against the pinball loss (0 = ignore changes)."
    )
    calibration_prior_samples: float = Field(
        1e6,
        gt=0,
        description="Samples at which a container's own calibration factor counts as much as the fleet's. Large: on "
        "bitbrains' validation days per-container factors chased single bursts and cost more than they fixed.",
    )
    calibration_factor_min: float = Field(
        0.8, gt=0, description="Smallest calibration factor: calibration is a gentle correction of the quantile level."
    )
    calibration_factor_max: float = Field(
        1.25, gt=0, description="Largest calibration factor, so one bursty day cannot blow every line up."
    )
    seasonal_days: int = Field(7, ge=1, description="Days of history the seasonal models look at (one week: weekday rhythm).")
    narrow_window_steps: int = Field(
        6, ge=0, description="Half-width of the narrow time-of-day window, steps (30 min: spikes come early or late)."
    )
    wide_window_steps: int = Field(36, ge=0, description="Half-width of the wide time-of-day window, steps (3 h).")
    seasonal_floor_fraction: float = Field(
        0.7, ge=0, description="Seasonal lines never drop below this fraction of the flat p99 (quiet slots still burst)."
    )
    recent_window_steps: int = Field(
        12, ge=1, description="Fast up: the first steps of a line never fall below the max of this many last steps (1 h)."
    )
    cold_start_factor: float = Field(
        1.5, ge=1, description="A container with under a day of samples gets this x its observed max."
    )
    enabled: bool = Field(
        True, description="False: the foundation's rules only (VPA target, Koordinator mid, seasonal max), as baselines."
    )
    use_stl: bool = Field(
        True, description="Include the statsmodels STL model among the short-term candidates (about 5 ms per container)."
    )


class StoreSettings(BaseModel):
    """Where model versions live and how many are kept."""

    path: Path = Field(Path("model-store"), description="Directory of the model store.")
    retention_versions: int = Field(10, ge=1, description="Published versions kept; older ones are deleted after a publish.")


class ServeSettings(BaseModel):
    """The HTTP service."""

    host: str = Field("127.0.0.1", description="Address to listen on; loopback unless you mean to expose it.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port (0 picks a free one).")
    tls_cert_file: Path | None = Field(None, description="PEM certificate; with the key, serve HTTPS (webhooks need it).")
    tls_key_file: Path | None = Field(None, description="PEM private key of the certificate.")

    @model_validator(mode="after")
    def _tls_pair(self) -> ServeSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self


class Settings(BaseSettings):
    """All settings, one group per concern."""

    model_config = SettingsConfigDict(env_prefix="KOORD_RECOMMENDER_", env_nested_delimiter="__", extra="forbid")

    histogram: HistogramSettings = HistogramSettings()
    policy: PolicySettings = PolicySettings()
    reservation: ReservationSettings = ReservationSettings()
    forecast: ForecastSettings = ForecastSettings()
    store: StoreSettings = StoreSettings()
    serve: ServeSettings = ServeSettings()
