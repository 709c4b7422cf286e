"""REST: the recommendations of the loaded model version, in the JSON shape `recommender show` prints."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from models.store import Manifest
from recommender.errors import UnknownWorkloadError
from recommender.identity import WorkloadKey
from recommender.resources import WorkloadRecommendation
from serving.routes.deps import service_state
from serving.state import ServiceState

router = APIRouter(prefix="/api/v1", tags=["recommendations"])
State = Annotated[ServiceState, Depends(service_state)]


class RecommendationList(BaseModel):
    """A model version's recommendations (optionally filtered); same shape as `recommender show --format json`."""

    version: str
    as_of: int
    horizon_seconds: int
    step_seconds: int
    recommendations: list[WorkloadRecommendation]


@router.get("/recommendations", response_model=RecommendationList, summary="List recommendations")
def list_recommendations(
    state: State,
    namespace: Annotated[str | None, Query(description="Only this namespace.")] = None,
    workload: Annotated[str | None, Query(description="Only this workload.")] = None,
    container: Annotated[str | None, Query(description="Only this container.")] = None,
) -> dict[str, Any]:
    snapshot = state.require()
    chosen = [
        r
        for r in snapshot.loaded.recommendations.recommendations
        if (namespace is None or r.namespace == namespace)
        and (workload is None or r.workload == workload)
        and (container is None or r.container == container)
    ]
    found = snapshot.loaded.recommendations
    return {
        "version": snapshot.loaded.manifest.version,
        "as_of": found.as_of,
        "horizon_seconds": found.horizon_seconds,
        "step_seconds": found.step_seconds,
        "recommendations": chosen,
    }


@router.get(
    "/recommendations/{namespace}/{workload}/{container}",
    response_model=WorkloadRecommendation,
    summary="One workload container: request sizing and its four lines",
)
def one_recommendation(namespace: str, workload: str, container: str, state: State) -> WorkloadRecommendation:
    return state.recommendation(WorkloadKey(namespace, workload, container))


@router.get("/version", response_model=Manifest, summary="Manifest of the loaded model version")
def version(state: State) -> Manifest:
    return state.require().loaded.manifest


@router.get(
    "/recommendations/{namespace}/{workload}",
    response_model=list[WorkloadRecommendation],
    summary="Every container of one workload",
)
def workload_recommendations(namespace: str, workload: str, state: State) -> list[WorkloadRecommendation]:
    found = [r for key, r in state.require().by_key.items() if key.namespace == namespace and key.workload == workload]
    if not found:
        raise UnknownWorkloadError(f"no recommendation for workload {namespace}/{workload}")
    return found
