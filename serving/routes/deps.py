"""Request-scoped access to what the factory put on the app: the service state and one snapshot per request."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from fastapi import HTTPException, Request, Response

from recommender.errors import missing_extra
from serving.state import ServiceState, Snapshot


def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state


def conditional(request: Request, response: Response, tag: str) -> None:
    """Answer 304 when the client already holds `tag` (If-None-Match), else send it as the ETag."""
    etag = f'"{tag}"'
    wanted = {t.strip() for t in request.headers.get("if-none-match", "").split(",")}
    if etag in wanted or f"W/{etag}" in wanted or "*" in wanted:
        raise HTTPException(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag


def snapshot(request: Request, response: Response) -> Snapshot:
    """The loaded version (503 without one), fixed for the whole request; its version is the ETag of every read."""
    found = service_state(request).require()
    conditional(request, response, found.revision)
    return found


def pod_containers(pod: Any) -> int:
    """How many containers (init containers included) a pod of any shape has: what judging or sizing it costs."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0
    return sum(len(part) for part in (spec.get("containers"), spec.get("initContainers")) if isinstance(part, list))


def json_body(description: str, properties: dict[str, Any]) -> dict[str, Any]:
    """`openapi_extra` documenting a JSON object body that the handler reads raw (so no body can make it fail)."""
    schema = {"type": "object", "description": description, "properties": properties}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def charts() -> ModuleType:
    """`presentation.charts`, imported when a PNG is first asked for: matplotlib is the `charts` extra, which the
    serving image may leave out (the route then answers 501 naming it)."""
    try:
        return importlib.import_module("presentation.charts")
    except ModuleNotFoundError as error:
        raise missing_extra(error, "chart.png") or error from None
