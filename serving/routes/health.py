"""Liveness and readiness: live while the process serves, ready only with a verified model version loaded.

Both run on the event loop itself (async, no thread), so a full thread pool or a heavy request on the worker
threads never delays a probe."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from serving.state import ServiceState

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: a valid model version is loaded", response_model=None)
async def readyz(request: Request) -> JSONResponse | dict[str, Any]:
    state: ServiceState = request.app.state.service  # not a sync dependency: those run on the thread pool
    snapshot = state.snapshot
    if snapshot is None:
        return JSONResponse(status_code=503, content={"status": "not ready", "detail": state.last_error})
    live = snapshot.live
    return {
        "status": "ready",
        "version": snapshot.loaded.manifest.version,
        # Which lines are served and how old they are: a live loop that cannot read Prometheus lets them age.
        "live_update": None if live is None else live.revision,
        "age_seconds": round(snapshot.age_seconds(), 3),
        **({"live_error": state.live_error} if state.live_error else {}),
    }
