"""Scheduler extender: filter and prioritize on forecast load (see `recommender.placement`).

Bodies are the scheduler's `ExtenderArgs` ({Pod, Nodes | NodeNames}); Go's field names carry no JSON tags, so they
are matched case-insensitively as Go's decoder does, and answers use Go's names. Both verbs work with
`nodeCacheCapable: true` (names only; capacity from the nodes file) and false (full v1.Node objects). Anything we
cannot judge gets a neutral answer: the node passes the filter and gets the neutral score; a call we cannot read
at all (malformed, oversized, or while every worker thread is busy) gets 200 with an `Error` the scheduler ignores
(`ignorable: true`) or no scores. A call by node names (`serve.inline_extender_nodes`) is judged on the event loop,
whole nodes and larger calls on the worker threads. Nothing here returns 5xx, so the scheduler's keep-alive
connection stays open.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from recommender.errors import OverloadedError, RequestTooLargeError
from recommender.placement import Judgement, NodeCapacity, judge, neutral, node_capacity
from serving.cluster import ClusterView, Placement
from serving.isolation import WorkPool, read_body
from serving.metrics import Metrics
from serving.routes.auth import require_client_certificate
from serving.routes.deps import json_body, pod_containers
from serving.settings import ExtenderSettings, ServeSettings
from serving.state import ServiceState

log = logging.getLogger(__name__)
router = APIRouter(prefix="/scheduler", tags=["scheduler extender"], dependencies=[Depends(require_client_certificate)])
ARGS_BODY = json_body(
    "ExtenderArgs: {Pod, Nodes (v1.NodeList) | NodeNames} (names match case-insensitively).",
    {
        "Pod": {"type": "object"},
        "Nodes": {"type": "object"},
        "NodeNames": {"type": "array", "items": {"type": "string"}},
    },
)
MALFORMED = "koord-recommender: malformed ExtenderArgs"


def _field(args: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct without JSON tags: Go's decoder matches names case-insensitively."""
    lowered = name.lower()
    return next((v for k, v in args.items() if k.lower() == lowered), None)


def _name(node: Any) -> str | None:
    metadata = node.get("metadata") if isinstance(node, Mapping) else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else None


def _capacity(node: Mapping[str, Any], settings: ExtenderSettings) -> NodeCapacity | None:
    """The node's capacity as given, or None (judged from the nodes file, or neutrally) when it cannot be read."""
    try:
        return node_capacity(node, settings)
    except Exception:  # any annotation or status shape: this node is unknown, the others are still judged
        log.debug("unreadable node %s in an extender call", _name(node), exc_info=True)
        return None


def _candidates(
    args: Mapping[str, Any], settings: ExtenderSettings
) -> tuple[list[Any], dict[str, NodeCapacity], list[Any]]:
    """Node names (judging leaves out what is no string), capacity given in the call (full-node mode) and the node
    objects to echo back; nodes without a readable name are left out."""
    names = _field(args, "NodeNames")
    if isinstance(names, list):
        return names, {}, []
    node_list = _field(args, "Nodes")
    items = node_list.get("items") if isinstance(node_list, Mapping) else None
    nodes = [n for n in items if _name(n) is not None] if isinstance(items, list) else []
    given = {}
    for node in nodes:
        capacity = _capacity(node, settings)
        if capacity is not None:
            given[node["metadata"]["name"]] = capacity
    return [n["metadata"]["name"] for n in nodes], given, nodes


Judged = tuple[list[Any], Judgement, Placement]


def _judge(args: Mapping[str, Any], state: ServiceState, cluster: ClusterView, settings: ExtenderSettings) -> Judged:
    """The node objects of the call, the judgement of its candidates (on a worker thread) and the view it was made
    on; if judging fails, every node gets the neutral answer."""
    names, given, nodes = _candidates(args, settings)
    placement = cluster.placement
    try:
        pod = _field(args, "Pod")
        snapshot = state.snapshot
        lookup = snapshot.lookup if snapshot is not None else (lambda key: None)
        judgement = judge(
            placement.loads, pod if isinstance(pod, Mapping) else {}, names, given, lookup, settings, time.time()
        )
    except Exception:  # neutral: let the scheduler go on without our opinion
        log.exception("extender could not judge the pod; every node gets a neutral answer")
        judgement = neutral(placement.loads, names, settings)
    return nodes, judgement, placement


async def _judged(request: Request) -> tuple[Mapping[str, Any], Judged] | str:
    """The call and its judgement, or why there is none (the answer then says so, with 200)."""
    try:
        args = orjson.loads(await read_body(request))
    except ValueError:
        return MALFORMED
    except RequestTooLargeError as error:
        return f"koord-recommender: ExtenderArgs {error}"
    except ClientDisconnect:
        return "koord-recommender: the caller went away"
    if not isinstance(args, Mapping):
        return MALFORMED
    state: ServiceState = request.app.state.service
    cluster: ClusterView = request.app.state.cluster
    settings: ExtenderSettings = request.app.state.settings.extender
    serve: ServeSettings = request.app.state.settings.serve
    pool: WorkPool = request.app.state.work_pool
    try:
        names = _field(args, "NodeNames")
        if (
            isinstance(names, list)
            and len(names) <= serve.inline_extender_nodes
            and pod_containers(_field(args, "Pod")) <= serve.inline_review_containers
        ):
            return args, _judge(args, state, cluster, settings)
        return args, await pool.run(lambda: _judge(args, state, cluster, settings))
    except OverloadedError:
        return "koord-recommender: overloaded, no opinion"
    except Exception:  # a shape we did not foresee: no opinion rather than a 500 that closes the connection
        log.exception("extender call could not be read")
        return MALFORMED


def _json(payload: Any) -> Response:
    return _encoded(orjson.dumps(payload))


def _encoded(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _count(metrics: Metrics, verb: str, judgement: Judgement) -> None:
    metrics.extender_calls.labels(verb=verb).inc()
    unknown = len(judgement.known) - int(judgement.known.sum())
    failed = len(judgement.failed)
    for result, count in (("unknown", unknown), ("failed", failed), ("fit", len(judgement.nodes) - unknown - failed)):
        if count:
            metrics.extender_nodes.labels(verb=verb, result=result).inc(count)


@router.post(
    "/filter",
    summary="Extender filter: drop nodes whose forecast peak crosses the thresholds",
    response_class=Response,
    openapi_extra=ARGS_BODY,
)
async def filter_nodes(request: Request) -> Response:
    judged = await _judged(request)
    if isinstance(judged, str):
        return _json(
            {"NodeNames": None, "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": judged}
        )
    args, (nodes, judgement, _) = judged
    _count(request.app.state.metrics, "filter", judgement)
    passes = (~judgement.fails).tolist()
    result: dict[str, Any] = {"FailedNodes": judgement.failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
    if isinstance(_field(args, "NodeNames"), list):
        result.update(NodeNames=list(itertools.compress(judgement.nodes, passes)), Nodes=None)
    else:
        kept = list(itertools.compress(nodes, passes))
        result.update(Nodes={"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": kept}, NodeNames=None)
    return _json(result)


@router.post(
    "/prioritize",
    summary="Extender prioritize: 0-10, highest where the forecast peak stays lowest",
    response_class=Response,
    openapi_extra=ARGS_BODY,
)
async def prioritize_nodes(request: Request) -> Response:
    judged = await _judged(request)
    if isinstance(judged, str):
        return _json([])  # no scores: the scheduler weighs the other plugins alone
    _, (_, judgement, placement) = judged
    _count(request.app.state.metrics, "prioritize", judgement)
    return _encoded(placement.hosts.answer(judgement.nodes, judgement.rows, judgement.scores))
