"""FastAPI application factory: settings and the model store are injected, routers per consumer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from models.store import ModelStore
from recommender import __version__
from recommender.errors import RecommenderError
from recommender.settings import Settings
from serving.routes import health, recommendations
from serving.state import ServiceState


def create_app(settings: Settings) -> FastAPI:
    """Build the service over the model store named in `settings.store`."""
    state = ServiceState(ModelStore(settings.store.path, settings.store.retention_versions))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.refresh()
        yield

    app = FastAPI(
        title="koord-recommender",
        version=__version__,
        summary="CPU and memory recommendations and Koordinator reservation lines for Kubernetes workloads.",
        lifespan=lifespan,
    )
    app.state.service = state

    @app.exception_handler(RecommenderError)
    async def recommender_error(request: Request, error: RecommenderError) -> JSONResponse:
        body: dict[str, Any] = {"error": type(error).__name__, "detail": str(error)}
        return JSONResponse(status_code=error.http_status, content=body)

    app.include_router(health.router)
    app.include_router(recommendations.router)
    return app
