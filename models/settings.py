"""The model layer's settings: where versions are stored, and the groups every fit takes (`ModelSettings`)."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field, field_validator

from recommender.settings import (
    ForecastSettings,
    HistogramSettings,
    LiveLineSettings,
    PolicySettings,
    ReservationSettings,
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


class ModelSettings(BaseModel):
    """The parameters of a fit: what `WorkloadRecommender.from_settings` and `NodeForecaster.from_settings` read."""

    histogram: HistogramSettings = HistogramSettings()
    policy: PolicySettings = PolicySettings()
    reservation: ReservationSettings = ReservationSettings()
    forecast: ForecastSettings = ForecastSettings()
    live_line: LiveLineSettings = LiveLineSettings()
