"""REST: per-node lines of Koordinator's resource model, reclaimable batch/mid room, and a chart of both."""

from __future__ import annotations

import threading
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, Field

from recommender.errors import UnknownNodeError
from recommender.placement import NodeLoads, node_reclaimable
from recommender.resources import NodePod
from recommender.settings import ColocationSettings
from serving.cluster import ClusterView
from serving.isolation import WorkPool
from serving.routes.auth import require_token
from serving.routes.deps import charts, conditional

router = APIRouter(prefix="/api/v1", tags=["nodes"], dependencies=[Depends(require_token)])
#: pyplot keeps global state: one chart at a time.
_CHART_LOCK = threading.Lock()


def cluster(request: Request, response: Response) -> ClusterView:
    view: ClusterView = request.app.state.cluster
    conditional(request, response, f"nodes-{view.generation}-{int(time.time()) // 60}")
    return view


Cluster = Annotated[ClusterView, Depends(cluster)]


class KoordinatorReclaimable(BaseModel):
    """What Koordinator's own rules would offer on this node now (anchors.md section 1), for comparison."""

    usage: float = Field(
        description="Batch allocatable, policy usage: capacity x reclaim% - HP usage (0 on stale metrics)."
    )
    request: float | None = Field(
        None,
        description="Batch allocatable, policy request: HP requests instead of usage; memory only (null for CPU: "
        "Koordinator has no CPU request policy).",
    )
    max_usage_request: float = Field(description="Batch allocatable, policy maxUsageRequest: max(request, usage).")
    mid: float = Field(
        description="Mid allocatable: the smaller of per-pod and pooled HP requests - long-term peak x 1.1, capped by "
        "allocatable - peak and allocatable - usage (0 on stale metrics)."
    )


class Reclaimable(BaseModel):
    batch: float = Field(
        description=(
            "Our batch allocatable now. While the live loop's measurement of the node is at most fresh_seconds old "
            "(policy live): allocatable - live margin - the live high-priority usage plus the largest 5-minute rise "
            "the node showed from about that level (its live rise table), plus colocation.*_live_climb_factor times its climb into "
            "that measurement (colocation.climbing_rise, colocation.live_reclaimable). Otherwise "
            "allocatable - margin - the highest short-term reservation over the batch window, forecast-only with the "
            "wider forecast-only margin (colocation.*_forecast_only_margin_fraction) except within fresh_seconds of "
            "the training's last sample, where the measured usage + rise allowance floor it with the normal margin."
        )
    )
    mid: float = Field(
        description="Our mid allocatable: the same with the long-term reservation in place of the short-term one."
    )
    policy: str = Field(
        description="live (the live loop's fresh measurement), forecast (the node's pooled forecast) or per-pod lines "
        "(no node model: sum of pods' lines)."
    )
    stale: bool = Field(
        description="The forecast ran past its horizon (no new training): values decay toward the request-based ones."
    )
    koordinator: KoordinatorReclaimable


class NodeResourceLine(BaseModel):
    allocatable: float | None = Field(description="From the node list; None when the node is only known from pods.")
    threshold_percent: float | None = Field(
        description=(
            "The operator's usage threshold (the node's usage-thresholds annotation, else the default); a value our "
            "own writer lowered is not used, the forecast peak is judged against the operator's."
        )
    )
    limit: float | None = Field(description="Sum of the high-priority pods' requests; None when none states one.")
    usage: list[float | None] = Field(
        description="Pooled high-priority usage per step, the day before usage_start + len x step (empty without a node model)."
    )
    usage_start: int | None = Field(description="Unix seconds of the first usage value; None when there is no usage.")
    usage_step_seconds: int
    short_term_reservation: list[float] = Field(
        description=(
            "High-priority forecast per step from as_of: the pooled forecast plus pods placed since (else the sum of "
            "the pods' lines); borrowing pods excluded."
        )
    )
    long_term_reservation: float = Field(description="Steady forecast of the high-priority pods' usage.")
    system_usage: float | None = Field(description="Usage outside pods; None: not measured by this service.")
    reclaimable: Reclaimable | None = Field(description="None when the node's allocatable is unknown.")


class NodeLines(BaseModel):
    node: str
    as_of: int
    step_seconds: int
    cpu_cores: NodeResourceLine
    memory_bytes: NodeResourceLine
    pods: list[NodePod] = Field(
        description="Pods on the node now (from the pods file), else the pods the node model learned from."
    )


def node_lines_of(loads: NodeLoads, node: str, settings: ColocationSettings, now: float) -> NodeLines:
    """The NodeLines answer for a known node (UnknownNodeError otherwise)."""
    if node not in loads.index:
        raise UnknownNodeError(f"no node {node} in the cluster view")
    cpu_line, memory_line = loads.node_line(node, high_priority=True)
    capacity = loads.capacity.get(node)
    state = loads.states[node]
    step = loads.timeline.step_seconds

    def resource(name: str, line: list[float], allocatable: float | None, threshold: float | None) -> NodeResourceLine:
        pooled = getattr(state.forecast, name) if state.forecast is not None else None
        usage = pooled.recent_usage if pooled is not None else []
        found = node_reclaimable(loads, node, name, now, settings)
        return NodeResourceLine(
            allocatable=allocatable,
            threshold_percent=threshold,
            limit=state.limit[name],
            usage=usage,
            usage_start=loads.timeline.as_of - len(usage) * step if usage else None,
            usage_step_seconds=step,
            short_term_reservation=line,
            long_term_reservation=state.long_term[name],
            system_usage=None,
            reclaimable=None
            if found is None
            else Reclaimable(
                batch=found.batch,
                mid=found.mid,
                policy=found.policy,
                stale=found.stale,
                koordinator=KoordinatorReclaimable(**found.koordinator),
            ),
        )

    pods = state.pods or (state.forecast.pods if state.forecast is not None else [])
    return NodeLines(
        node=node,
        as_of=loads.timeline.as_of,
        step_seconds=step,
        cpu_cores=resource(
            "cpu", cpu_line, *((capacity.cpu_cores, capacity.cpu_threshold_percent) if capacity else (None, None))
        ),
        memory_bytes=resource(
            "memory",
            memory_line,
            *((capacity.memory_bytes, capacity.memory_threshold_percent) if capacity else (None, None)),
        ),
        pods=pods,
    )


@router.get(
    "/nodes",
    response_model=list[str],
    summary="Nodes the extender knows (from the nodes and pods files and the node model)",
)
def nodes(view: Cluster) -> list[str]:
    return list(view.loads.index)


@router.get(
    "/nodes/{node}/lines",
    response_model=NodeLines,
    summary="A node's four lines, allocatable and reclaimable batch/mid room",
)
def node_lines(node: str, view: Cluster, request: Request) -> NodeLines:
    return node_lines_of(view.loads, node, request.app.state.settings.colocation, time.time())


@router.get(
    "/nodes/{node}/chart.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "The node's lines and reclaimable room"}},
    summary="A node's lines as PNG",
)
async def node_chart(node: str, view: Cluster, request: Request) -> Response:
    plot = charts()

    def render() -> bytes:
        lines = node_lines_of(view.loads, node, request.app.state.settings.colocation, time.time())
        with _CHART_LOCK:
            png: bytes = plot.png_bytes(plot.node_lines_figure(lines.model_dump()))
            return png

    pool: WorkPool = request.app.state.work_pool  # rendering takes tens of milliseconds of CPU
    image = await pool.run(render)
    return Response(image, media_type="image/png")
