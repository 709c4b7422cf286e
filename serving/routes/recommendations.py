"""REST: the recommendations of the loaded model version, in the JSON shape `recommender show` prints.

Every read answers from one snapshot (a new version published mid-request is seen by the next request), carries
the version as its ETag and answers 304 to a matching If-None-Match.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, Field

from models.store import DataWindow, LiveUpdate, Manifest
from recommender.errors import UnknownWorkloadError
from recommender.identity import WorkloadKey
from recommender.resources import WorkloadRecommendation
from serving.isolation import WorkPool
from serving.routes.auth import require_token
from serving.routes.deps import charts, snapshot
from serving.state import Snapshot

router = APIRouter(prefix="/api/v1", tags=["recommendations"], dependencies=[Depends(require_token)])
Loaded = Annotated[Snapshot, Depends(snapshot)]
#: pyplot keeps global state: one chart at a time.
_CHART_LOCK = threading.Lock()


class RecommendationList(BaseModel):
    """A model version's recommendations (optionally filtered); same shape as `recommender show --format json`."""

    version: str
    live_update: LiveUpdate | None = Field(
        None, description="The live loop's update these lines come from (None: the version's own, from training)."
    )
    age_seconds: float = Field(description="Now minus `as_of`: how old the served lines are.")
    as_of: int
    horizon_seconds: int
    step_seconds: int
    recommendations: list[WorkloadRecommendation]


class Provenance(BaseModel):
    """Which model produced the lines, from what data."""

    model: str = Field(description="Package and version that trained the model.")
    version: str = Field(description="Model version in the store.")
    created_at: str
    source: str
    data_window: DataWindow


class ResourceLines(BaseModel):
    """Koordinator's four lines of one resource (cores or bytes), and the recommended request beside them."""

    limit: float | None = Field(description="What the workload asked for (its limit), if known.")
    usage: list[float | None] = Field(description="Observed usage, one value per step before as_of (last 24 h).")
    short_term_reservation: list[float] = Field(description="Forecast, one value per step from as_of.")
    long_term_reservation: float
    request: float = Field(description="Recommended request (VPA target).")


class FourLines(BaseModel):
    namespace: str
    workload: str
    container: str
    as_of: int
    step_seconds: int
    cpu_cores: ResourceLines | None
    memory_bytes: ResourceLines | None
    provenance: Provenance


@router.get("/recommendations", response_model=RecommendationList, summary="List recommendations")
def list_recommendations(
    loaded: Loaded,
    namespace: Annotated[str | None, Query(description="Only this namespace.")] = None,
    workload: Annotated[str | None, Query(description="Only this workload.")] = None,
    container: Annotated[str | None, Query(description="Only this container.")] = None,
) -> dict[str, Any]:
    found = loaded.loaded.recommendations
    chosen = [
        r
        for r in found.recommendations
        if (namespace is None or r.namespace == namespace)
        and (workload is None or r.workload == workload)
        and (container is None or r.container == container)
    ]
    return {
        "version": loaded.version,
        "live_update": loaded.live,
        "age_seconds": round(loaded.age_seconds(), 3),
        "as_of": found.as_of,
        "horizon_seconds": found.horizon_seconds,
        "step_seconds": found.step_seconds,
        "recommendations": chosen,
    }


def _one(loaded: Snapshot, namespace: str, workload: str, container: str) -> WorkloadRecommendation:
    key = WorkloadKey(namespace, workload, container)
    found = loaded.lookup(key)
    if found is None:
        raise UnknownWorkloadError(f"no recommendation for {key}")
    return found


@router.get(
    "/recommendations/{namespace}/{workload}/{container}",
    response_model=WorkloadRecommendation,
    summary="One workload container: request sizing and its four lines",
)
def one_recommendation(namespace: str, workload: str, container: str, loaded: Loaded) -> WorkloadRecommendation:
    return _one(loaded, namespace, workload, container)


@router.get(
    "/recommendations/{namespace}/{workload}/{container}/lines",
    response_model=FourLines,
    summary="Koordinator's four lines (limit, usage, short-term and long-term reservation) with provenance",
)
def four_lines(namespace: str, workload: str, container: str, loaded: Loaded) -> FourLines:
    rec = _one(loaded, namespace, workload, container)
    manifest = loaded.loaded.manifest
    history = rec.history
    resources = {}
    for resource, limit, usage in (
        ("cpu", rec.current.cpu_limit_cores, history.recent_cpu_cores if history else []),
        ("memory", rec.current.memory_limit_bytes, history.recent_memory_bytes if history else []),
    ):
        learned = getattr(rec, resource)
        resources[resource] = (
            None
            if learned is None
            else ResourceLines(
                limit=limit,
                usage=usage,
                short_term_reservation=learned.short_term,
                long_term_reservation=learned.long_term,
                request=learned.target,
            )
        )
    return FourLines(
        namespace=namespace,
        workload=workload,
        container=container,
        as_of=loaded.loaded.recommendations.as_of,
        step_seconds=loaded.loaded.recommendations.step_seconds,
        cpu_cores=resources["cpu"],
        memory_bytes=resources["memory"],
        provenance=Provenance(
            model=f"koord-recommender {manifest.package_version}",
            version=manifest.version,
            created_at=manifest.created_at,
            source=manifest.source,
            data_window=manifest.data_window,
        ),
    )


@router.get(
    "/recommendations/{namespace}/{workload}/{container}/chart.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "The four-line chart"}},
    summary="The four-line chart as PNG",
)
async def chart(namespace: str, workload: str, container: str, loaded: Loaded, request: Request) -> Response:
    rec = _one(loaded, namespace, workload, container)

    plot = charts()

    def render() -> bytes:
        with _CHART_LOCK:
            png: bytes = plot.png_bytes(plot.four_lines_figure([rec], loaded.loaded.recommendations.step_seconds))
            return png

    pool: WorkPool = request.app.state.work_pool  # rendering takes tens of milliseconds of CPU
    image = await pool.run(render)
    return Response(image, media_type="image/png", headers={"ETag": f'"{loaded.revision}"'})


@router.get("/version", response_model=Manifest, summary="Manifest of the loaded model version")
def version(loaded: Loaded) -> Manifest:
    return loaded.loaded.manifest


@router.get(
    "/recommendations/{namespace}/{workload}",
    response_model=list[WorkloadRecommendation],
    summary="Every container of one workload",
)
def workload_recommendations(namespace: str, workload: str, loaded: Loaded) -> list[WorkloadRecommendation]:
    found = [r for key, r in loaded.by_key.items() if key.namespace == namespace and key.workload == workload]
    if not found:
        raise UnknownWorkloadError(f"no recommendation for workload {namespace}/{workload}")
    return found
