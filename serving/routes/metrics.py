"""Prometheus exposition of the app's registry, behind the same bearer token as /api/v1."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving.routes.auth import require_token

# Every container's target is in here: with auth on, Prometheus scrapes with a bearer token (docs/security.md).
router = APIRouter(tags=["health"], dependencies=[Depends(require_token)])


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
