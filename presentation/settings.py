"""What people read is shaped by: the risk thresholds of `show` and the dashboard's overview."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
