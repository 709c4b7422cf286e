"""Scheduler extender: filter and prioritize on forecast load (see `recommender.placement`).

Bodies are the scheduler's `ExtenderArgs` ({Pod, Nodes | NodeNames}); Go's field names carry no JSON tags, so they
are matched case-insensitively as Go's decoder does, and answers use Go's names. Both verbs work with
`nodeCacheCapable: true` (names only; capacity from the nodes file) and false (full v1.Node objects). Anything we
cannot judge gets a neutral answer: the node passes the filter and gets the neutral score; a call we cannot read
at all (malformed, oversized, or while every worker thread is busy) gets 200 with an `Error` the scheduler ignores
(`ignorable: true`) or no scores. A call by node names (`serve.inline_extender_nodes`) is judged on the event loop,
whole nodes and larger calls on the worker threads. Nothing here returns 5xx, so the scheduler's keep-alive
connection stays open.

Both routes are answered by `FastPath`, a plain ASGI layer inside the app's latency and body-limit middlewares: it
skips FastAPI's routing, dependency solving and exception layers, a fixed cost per call that the scheduler pays
on every pod. The routes stay declared, for their OpenAPI documents and for the calls the client-certificate check
refuses (left to them, so they are refused as before), and answer through the same functions. A call whose
candidate list the cluster view remembers (the same text, sent before) takes that list's names, columns and answer
layout as resolved then instead of reading and looking up its names again (`serving.cluster.CandidateLists`);
kube-scheduler's parallel filter returns the feasible nodes in a new order each cycle, so its calls mostly take
the full path.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.datastructures import State
from starlette.requests import ClientDisconnect

from recommender.errors import ClientCertificateError, OverloadedError, RequestTooLargeError
from recommender.placement import Judgement, NodeCapacity, judge, neutral, node_capacity
from serving.cluster import Candidates, Placement, scored
from serving.isolation import ASGI, Receive, Scope, Send, WorkPool, read_body
from serving.metrics import Metrics
from serving.routes.auth import check_client_certificate, require_client_certificate
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
#: Where a candidate list is looked for in a call's text: Go writes the field under its own name.
_NAMES_KEY = b'"NodeNames"'
_NAMES_OPEN = re.compile(rb"\s*:\s*\[")
#: Stands in for the candidate list while the rest of a call is read; unguessable, so no call holds it itself.
_STAND_IN = secrets.token_hex(16)
_STAND_IN_JSON = orjson.dumps(_STAND_IN)


def _key(args: Mapping[str, Any], name: str) -> str | None:
    """The key of a Go struct's field without JSON tags: Go's decoder matches names case-insensitively."""
    lowered = name.lower()
    return next((k for k in args if k.lower() == lowered), None)


def _field(args: Mapping[str, Any], name: str) -> Any:
    key = _key(args, name)
    return None if key is None else args[key]


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


@dataclass(frozen=True)
class Call:
    """A call as read: its ExtenderArgs, the cluster view it is judged on, and its candidate list as that view
    resolved it before, else the list's text to remember it by (None when the list is not plainly in the text)."""

    args: Any
    placement: Placement
    seen: Candidates | None
    names_text: bytes | None


def _read(body: bytes, placement: Placement) -> Call:
    """The call in `body` (ValueError when it is no JSON).

    The text after `"NodeNames":` up to its first `]` is the call's candidate list exactly when the rest of the
    call, read with a stand-in there, has the stand-in as its NodeNames: the list is then read (and looked up) only
    if this view has not remembered that text."""
    start = body.find(_NAMES_KEY)
    opened = _NAMES_OPEN.match(body, start + len(_NAMES_KEY)) if start >= 0 else None
    end = body.find(b"]", opened.end()) + 1 if opened is not None else 0
    if opened is None or not end:
        return Call(orjson.loads(body), placement, None, None)
    begin = opened.end() - 1
    text = body[begin:end]
    seen = placement.candidates.get(text)
    if seen is None and not placement.candidates.sent_before(text):
        return Call(orjson.loads(body), placement, None, None)
    try:
        rest = orjson.loads(body[:begin] + _STAND_IN_JSON + body[end:])
    except ValueError:
        rest = None
    key = _key(rest, "NodeNames") if isinstance(rest, dict) else None
    if rest is None or key is None or rest[key] != _STAND_IN:
        return Call(orjson.loads(body), placement, None, None)
    if seen is None:
        return Call(orjson.loads(body), placement, None, text)
    rest[key] = seen.names
    return Call(rest, placement, seen, None)


Judged = tuple[list[Any], Judgement, Candidates | None]


def _judge(call: Call, state: ServiceState, settings: ExtenderSettings) -> Judged:
    """The node objects of the call, the judgement of its candidates (on a worker thread) and its candidate list as
    resolved on the view (remembered for the next call that sends it); if judging fails, every node gets the
    neutral answer."""
    names, given, nodes = _candidates(call.args, settings)
    loads, seen = call.placement.loads, call.seen
    columns = (seen.names, seen.rows) if seen is not None else loads.columns(names)
    try:
        pod = _field(call.args, "Pod")
        snapshot = state.snapshot
        lookup = snapshot.lookup if snapshot is not None else (lambda key: None)
        judgement = judge(
            loads, pod if isinstance(pod, Mapping) else {}, names, given, lookup, settings, time.time(), columns
        )
    except Exception:  # neutral: let the scheduler go on without our opinion
        log.exception("extender could not judge the pod; every node gets a neutral answer")
        judgement = neutral(loads, names, settings, columns)
    # Only lists of names alone: read on its own, such a list reads as it does inside the call (nothing nested).
    if seen is None and call.names_text is not None and len(columns[0]) == len(names):
        seen = Candidates(columns[0], columns[1], call.placement.hosts)
        call.placement.candidates.remember(call.names_text, seen)
    return nodes, judgement, seen


async def _judged(app: State, receive: Receive) -> tuple[Call, Judged] | str:
    """The call and its judgement, or why there is none (the answer then says so, with 200)."""
    try:
        call = _read(await read_body(receive), app.cluster.placement)
    except ValueError:
        return MALFORMED
    except RequestTooLargeError as error:
        return f"koord-recommender: ExtenderArgs {error}"
    except ClientDisconnect:
        return "koord-recommender: the caller went away"
    args = call.args
    if not isinstance(args, Mapping):
        return MALFORMED
    state: ServiceState = app.service
    settings: ExtenderSettings = app.settings.extender
    serve: ServeSettings = app.settings.serve
    pool: WorkPool = app.work_pool
    try:
        names = _field(args, "NodeNames")
        if (
            isinstance(names, list)
            and len(names) <= serve.inline_extender_nodes
            and pod_containers(_field(args, "Pod")) <= serve.inline_review_containers
        ):
            return call, _judge(call, state, settings)
        return call, await pool.run(lambda: _judge(call, state, settings))
    except OverloadedError:
        return "koord-recommender: overloaded, no opinion"
    except Exception:  # a shape we did not foresee: no opinion rather than a 500 that closes the connection
        log.exception("extender call could not be read")
        return MALFORMED


def _encoded(body: bytes) -> Response:
    return Response(body, media_type="application/json")


def _count(metrics: Metrics, verb: str, judgement: Judgement) -> None:
    metrics.extender_calls.labels(verb=verb).inc()
    unknown = len(judgement.known) - int(judgement.known.sum())
    failed = len(judgement.failed)
    for result, count in (("unknown", unknown), ("failed", failed), ("fit", len(judgement.nodes) - unknown - failed)):
        if count:
            metrics.extender_nodes.labels(verb=verb, result=result).inc(count)


async def _filter(app: State, receive: Receive) -> bytes:
    judged = await _judged(app, receive)
    if isinstance(judged, str):
        return orjson.dumps(
            {"NodeNames": None, "Nodes": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": judged}
        )
    call, (nodes, judgement, _) = judged
    _count(app.metrics, "filter", judgement)
    passes = (~judgement.fails).tolist()
    result: dict[str, Any] = {"FailedNodes": judgement.failed, "FailedAndUnresolvableNodes": {}, "Error": ""}
    if isinstance(_field(call.args, "NodeNames"), list):
        result.update(NodeNames=list(itertools.compress(judgement.nodes, passes)), Nodes=None)
    else:
        kept = list(itertools.compress(nodes, passes))
        result.update(Nodes={"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": kept}, NodeNames=None)
    return orjson.dumps(result)


async def _prioritize(app: State, receive: Receive) -> bytes:
    judged = await _judged(app, receive)
    if isinstance(judged, str):
        return b"[]"  # no scores: the scheduler weighs the other plugins alone
    call, (_, judgement, seen) = judged
    _count(app.metrics, "prioritize", judgement)
    layout = seen.layout if seen is not None else call.placement.hosts.layout(judgement.nodes, judgement.rows)
    return scored(layout, judgement.scores)


@router.post(
    "/filter",
    summary="Extender filter: drop nodes whose forecast peak crosses the thresholds",
    response_class=Response,
    openapi_extra=ARGS_BODY,
)
async def filter_nodes(request: Request) -> Response:
    return _encoded(await _filter(request.app.state, request.receive))


@router.post(
    "/prioritize",
    summary="Extender prioritize: 0-10, highest where the forecast peak stays lowest",
    response_class=Response,
    openapi_extra=ARGS_BODY,
)
async def prioritize_nodes(request: Request) -> Response:
    return _encoded(await _prioritize(request.app.state, request.receive))


ANSWERS: dict[str, Callable[[State, Receive], Awaitable[bytes]]] = {
    "/scheduler/filter": _filter,
    "/scheduler/prioritize": _prioritize,
}


class FastPath:
    """Answers POST /scheduler/filter and /scheduler/prioritize as their routes do, without FastAPI's routing,
    dependencies and exception layers; every other request, and a call whose client certificate is refused, goes
    on to the app. Sits inside the latency middleware, which it gives the route (for its label)."""

    def __init__(self, app: ASGI, state: State) -> None:
        self.app = app
        self.state = state
        self.routes = {r.path: r for r in router.routes if isinstance(r, APIRoute)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = ANSWERS.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if answer is None:
            await self.app(scope, receive, send)
            return
        try:
            check_client_certificate(scope, self.state.settings.serve)
        except ClientCertificateError:  # the route's dependency refuses it, with the app's error answer
            await self.app(scope, receive, send)
            return
        scope["route"] = self.routes[scope["path"]]
        await _encoded(await answer(self.state, receive))(scope, receive, send)
