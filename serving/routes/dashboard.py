"""The web dashboard: its static page under /ui (no build step, no CDN) and the two reads made for it.

The page reads only the REST API, like any other client: /api/v1/status (is a model loaded, how old is it),
/api/v1/overview (every container's request against our recommendation, risks, totals), then the per-workload
and per-node reads that already exist.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse
from pydantic import BaseModel, Field

from models.store import DataWindow
from presentation.overview import Overview, overview
from presentation.settings import OverviewSettings
from recommender.resources import model_age_problem
from serving.routes.auth import require_token
from serving.routes.deps import service_state, snapshot
from serving.state import ServiceState, Snapshot

#: The page's HTML, JavaScript and CSS, shipped as package data.
STATIC_DIR = Path(__file__).resolve().parent.parent / "ui"

router = APIRouter(prefix="/api/v1", tags=["dashboard"], dependencies=[Depends(require_token)])
root = APIRouter(include_in_schema=False)


class ModelStatus(BaseModel):
    """The loaded model version and whether it is recent enough to trust."""

    version: str
    created_at: str
    package_version: str
    source: str
    data_window: DataWindow
    as_of: int = Field(description="Decision time of the recommendations, Unix seconds.")
    age_seconds: float = Field(description="Now minus as_of, seconds.")
    stale_after_seconds: int = Field(description="serve.stale_model_age_seconds.")
    stale: bool = Field(
        description="age_seconds > stale_after_seconds (a training run has been missed), or as_of in the future beyond "
        "the clock skew allowed (a clock or timestamp-unit error)."
    )
    workload_containers: int


class OverviewCache:
    """The overview of the last version asked for: computed once per model version, not once per request."""

    def __init__(self, settings: OverviewSettings) -> None:
        self.settings = settings
        self._entry: tuple[str, Overview] | None = None

    def get(self, loaded: Snapshot) -> Overview:
        entry = self._entry
        if entry is None or entry[0] != loaded.revision:
            entry = (loaded.revision, overview(loaded.loaded.recommendations, self.settings))
            self._entry = entry
        return entry[1]


@router.get("/status", response_model=ModelStatus, summary="The loaded model version, its age and whether it is stale")
def status(request: Request, state: Annotated[ServiceState, Depends(service_state)]) -> ModelStatus:
    # No ETag: the age changes with every second even when the version does not.
    loaded = state.require().loaded
    stale_after = request.app.state.settings.serve.stale_model_age_seconds
    now = time.time()
    age = now - loaded.recommendations.as_of
    manifest = loaded.manifest
    return ModelStatus(
        version=manifest.version,
        created_at=manifest.created_at,
        package_version=manifest.package_version,
        source=manifest.source,
        data_window=manifest.data_window,
        as_of=loaded.recommendations.as_of,
        age_seconds=age,
        stale_after_seconds=stale_after,
        stale=model_age_problem(loaded.recommendations.as_of, now, stale_after) is not None,
        workload_containers=len(loaded.recommendations.recommendations),
    )


@router.get(
    "/overview",
    response_model=Overview,
    summary="Every container's current request against the recommendation, its risks, and totals per namespace",
)
def overview_of_version(request: Request, loaded: Annotated[Snapshot, Depends(snapshot)]) -> Overview:
    cache: OverviewCache = request.app.state.overview_cache
    return cache.get(loaded)


@root.get("/")
def to_dashboard() -> RedirectResponse:
    return RedirectResponse("/ui/", status_code=307)
