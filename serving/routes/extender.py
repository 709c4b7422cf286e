"""Scheduler extender: filter and prioritize on forecast load (see `recommender.placement`).

Bodies are the scheduler's `ExtenderArgs` ({Pod, Nodes | NodeNames}); Go's field names carry no JSON tags, so they
are matched case-insensitively as Go's decoder does, and answers use Go's names. Both verbs work with
`nodeCacheCapable: true` (names only; capacity from the nodes file) and false (full v1.Node objects). Anything we
cannot judge gets a neutral answer: the node passes the filter and gets the neutral score; a malformed call passes
every node it names. Nothing here returns 5xx.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from recommender.placement import Judgement, NodeCapacity, judge, neutral, node_capacity
from recommender.settings import ExtenderSettings
from serving.cluster import ClusterView
from serving.metrics import Metrics
from serving.routes.deps import json_body
from serving.state import ServiceState

log = logging.getLogger(__name__)
router = APIRouter(prefix="/scheduler", tags=["scheduler extender"])
ARGS_BODY = json_body(
    "ExtenderArgs: {Pod, Nodes (v1.NodeList) | NodeNames} (names match case-insensitively).",
    {"Pod": {"type": "object"}, "Nodes": {"type": "object"}, "NodeNames": {"type": "array", "items": {"type": "string"}}},
)


def _field(args: Mapping[str, Any], name: str) -> Any:
    """A field of a Go struct without JSON tags: Go's decoder matches names case-insensitively."""
    lowered = name.lower()
    return next((v for k, v in args.items() if k.lower() == lowered), None)


def _candidates(args: Mapping[str, Any], settings: ExtenderSettings) -> tuple[list[str], dict[str, NodeCapacity], list[Any]]:
    """Node names, capacity given in the call (full-node mode) and the node objects to echo back."""
    names = _field(args, "NodeNames")
    if isinstance(names, list):
        return [n for n in names if isinstance(n, str)], {}, []
    node_list = _field(args, "Nodes")
    items = node_list.get("items") if isinstance(node_list, Mapping) else None
    nodes = [n for n in items or [] if isinstance(n, Mapping) and isinstance((n.get("metadata") or {}).get("name"), str)]
    given = {}
    for node in nodes:
        capacity = node_capacity(node, settings)
        if capacity is not None:
            given[node["metadata"]["name"]] = capacity
    return [n["metadata"]["name"] for n in nodes], given, nodes


def _judge(args: Mapping[str, Any], request: Request) -> tuple[list[str], list[Any], Judgement]:
    """Candidates and their judgement; if judging fails, every node gets the neutral answer."""
    state: ServiceState = request.app.state.service
    cluster: ClusterView = request.app.state.cluster
    settings: ExtenderSettings = request.app.state.settings.extender
    names, given, nodes = _candidates(args, settings)
    try:
        pod = _field(args, "Pod")
        snapshot = state.snapshot
        lookup = snapshot.lookup if snapshot is not None else (lambda key: None)
        judgement = judge(cluster.loads, pod if isinstance(pod, Mapping) else {}, names, given, lookup, settings, time.time())
    except Exception:  # neutral: let the scheduler go on without our opinion
        log.exception("extender could not judge the pod; every node gets a neutral answer")
        judgement = neutral(names, settings)
    return names, nodes, judgement


async def _args(request: Request) -> Mapping[str, Any] | None:
    try:
        args = orjson.loads(await request.body())
    except ValueError:
        return None
    return args if isinstance(args, Mapping) else None


MALFORMED = "koord-recommender: malformed ExtenderArgs"


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


def _count(metrics: Metrics, verb: str, judgement: Judgement) -> None:
    metrics.extender_calls.labels(verb=verb).inc()
    unknown = judgement.known.count(False)
    failed = len(judgement.failed)
    for result, count in (("unknown", unknown), ("failed", failed), ("fit", len(judgement.nodes) - unknown - failed)):
        if count:
            metrics.extender_nodes.labels(verb=verb, result=result).inc(count)


@router.post("/filter", summary="Extender filter: drop nodes whose forecast peak crosses the thresholds", response_class=Response, openapi_extra=ARGS_BODY)
async def filter_nodes(request: Request) -> Response:
    args = await _args(request)
    if args is None:
        return _json({"NodeNames": None, "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": MALFORMED})
    names, nodes, judgement = _judge(args, request)
    _count(request.app.state.metrics, "filter", judgement)
    failed = judgement.failed
    result: dict[str, Any] = {"FailedNodes": failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
    if isinstance(_field(args, "NodeNames"), list):
        result.update(NodeNames=[n for n in names if n not in failed], Nodes=None)
    else:
        kept = [n for n in nodes if n["metadata"]["name"] not in failed]
        result.update(Nodes={"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": kept}, NodeNames=None)
    return _json(result)


@router.post("/prioritize", summary="Extender prioritize: 0-10, highest where the forecast peak stays lowest", response_class=Response, openapi_extra=ARGS_BODY)
async def prioritize_nodes(request: Request) -> Response:
    args = await _args(request)
    if args is None:
        return _json([])
    names, _, judgement = _judge(args, request)
    _count(request.app.state.metrics, "prioritize", judgement)
    return _json([{"Host": name, "Score": score} for name, score in zip(names, judgement.scores, strict=True)])
