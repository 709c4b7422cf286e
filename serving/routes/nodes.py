"""REST: per-node lines, the forecast load the scheduler extender places pods against."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from recommender.errors import UnknownNodeError
from serving.cluster import ClusterView
from serving.routes.auth import require_token
from serving.routes.deps import conditional

router = APIRouter(prefix="/api/v1", tags=["nodes"], dependencies=[Depends(require_token)])


def cluster(request: Request, response: Response) -> ClusterView:
    view: ClusterView = request.app.state.cluster
    conditional(request, response, f"nodes-{view.generation}")
    return view


Cluster = Annotated[ClusterView, Depends(cluster)]


class NodeResourceLine(BaseModel):
    allocatable: float | None = Field(description="From the node list; None when the node is only known from pods.")
    threshold_percent: float | None = Field(description="Usage threshold (default or the node's annotation).")
    short_term_reservation: list[float] = Field(description="Sum of the node's pods' short-term lines, per step from as_of.")


class NodeLines(BaseModel):
    node: str
    as_of: int
    step_seconds: int
    cpu_cores: NodeResourceLine
    memory_bytes: NodeResourceLine


@router.get("/nodes", response_model=list[str], summary="Nodes the extender knows (from the nodes and pods files)")
def nodes(view: Cluster) -> list[str]:
    return list(view.loads.index)


@router.get("/nodes/{node}/lines", response_model=NodeLines, summary="A node's forecast load lines against allocatable")
def node_lines(node: str, view: Cluster) -> NodeLines:
    loads = view.loads
    if node not in loads.index:
        raise UnknownNodeError(f"no node {node} in the cluster view")
    cpu_line, memory_line = loads.node_line(node)
    capacity = loads.capacity.get(node)
    return NodeLines(
        node=node,
        as_of=loads.timeline.as_of,
        step_seconds=loads.timeline.step_seconds,
        cpu_cores=NodeResourceLine(
            allocatable=capacity and capacity.cpu_cores, threshold_percent=capacity and capacity.cpu_threshold_percent,
            short_term_reservation=cpu_line,
        ),
        memory_bytes=NodeResourceLine(
            allocatable=capacity and capacity.memory_bytes, threshold_percent=capacity and capacity.memory_threshold_percent,
            short_term_reservation=memory_line,
        ),
    )
