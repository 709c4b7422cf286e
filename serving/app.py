"""FastAPI application factory: settings and the model store are injected, routers per consumer.

The lifespan loads the newest valid model version, then polls the store's `latest` pointer (and the extender's
cluster files, and the TLS files when a reloader is given) in the background; each reload builds a new immutable
snapshot off the event loop and swaps it in with one assignment, so a request sees one whole version.
CPU-heavy handlers run on a bounded pool of worker threads (serving.isolation), and bodies are limited per route.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager, suppress
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from models.store import ModelStore
from recommender import __version__
from recommender.errors import RecommenderError
from serving.cluster import ClusterView
from serving.isolation import BodyLimit, WorkPool
from serving.kube import api_client
from serving.kube_watch import OptInSources
from serving.metrics import Metrics
from serving.routes import dashboard, docs, extender, health, metrics, nodes, recommendations, webhook
from serving.routes.auth import TokenReviewer, authenticators
from serving.settings import ServingSettings
from serving.state import ServiceState
from serving.tls import CertificateReloader

log = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class LatencyMiddleware:
    """Observes each request's latency under its route template (pure ASGI: no body buffering, little overhead)."""

    def __init__(self, app: ASGI, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(
        self, scope: Scope, receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.latency.labels(scope["method"], route, str(status[0])).observe(time.perf_counter() - started)


def settle_heap() -> None:
    """After a model version is loaded: collect what the old one left, then exempt the survivors (the model, the
    libraries) from future collections. Without it a full collection walks every object of the loaded model, and
    the allocations of one 1 MB review trigger one: a 130 ms pause of the whole process, probes included."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


async def _every(seconds: float, check: Callable[[], Any]) -> None:
    """Run `check` in a worker thread every `seconds`, logging (never propagating) its failures."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await asyncio.to_thread(check)
        except Exception:
            log.exception("background reload failed; keeping what is loaded")


def opt_in_sources(settings: ServingSettings) -> OptInSources | None:
    """The watches of namespaces, VPAs and HPAs the webhook's opt-in reads, when `webhook.watch_api` asks for them
    (auto: in a cluster, or with a kubeconfig); None: only pod labels and the default mode apply."""
    webhook = settings.webhook
    wanted = webhook.watch_api == "on" or (
        webhook.watch_api == "auto" and (webhook.kubeconfig is not None or "KUBERNETES_SERVICE_HOST" in os.environ)
    )
    return OptInSources(api_client(webhook.kubeconfig), webhook) if wanted else None


def create_app(settings: ServingSettings, tls: CertificateReloader | None = None) -> FastAPI:
    """Build the service over the model store named in `settings.store`; `tls` rotates the serving certificate."""
    state = ServiceState(ModelStore(settings.store.path, settings.store.retention_versions))
    cluster = ClusterView(settings.extender)
    app_metrics = Metrics(state)
    work_pool = WorkPool(settings.serve.worker_threads, settings.serve.max_queued_work)
    sources = opt_in_sources(settings)
    for informer in sources.informers if sources is not None else []:
        app_metrics.watch_synced.labels(kind=informer.name).set_function(informer.synced.is_set)
        app_metrics.watch_objects.labels(kind=informer.name).set_function(informer.__len__)

    def reload_model_and_cluster() -> None:
        if state.refresh_if_published():
            app_metrics.reloads.labels(what="model").inc()
            settle_heap()
        cluster.refresh(state.snapshot)

    def reload_tls() -> None:
        if tls is not None and tls.check():
            app_metrics.reloads.labels(what="tls").inc()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(reload_model_and_cluster)
        if sources is not None:
            sources.start()
        tasks = [asyncio.create_task(_every(settings.serve.store_poll_seconds, reload_model_and_cluster))]
        if tls is not None:
            tasks.append(asyncio.create_task(_every(settings.serve.tls_poll_seconds, reload_tls)))
        yield
        for task in tasks:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
        work_pool.close()
        if sources is not None:
            await asyncio.to_thread(sources.stop)
        for authenticator in app.state.authenticators:
            if isinstance(authenticator, TokenReviewer):
                await authenticator.close()

    app = FastAPI(
        title="koord-recommender",
        version=__version__,
        summary="CPU and memory recommendations and Koordinator reservation lines for Kubernetes workloads: "
        "REST API, dashboard (/ui/), mutating admission webhook and scheduler extender.",
        lifespan=lifespan,
        # Served by serving.routes.docs, behind the bearer token.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.service = state
    app.state.cluster = cluster
    app.state.settings = settings
    app.state.metrics = app_metrics
    app.state.authenticators = authenticators(settings.auth)
    app.state.work_pool = work_pool
    app.state.opt_in_sources = sources
    app.state.overview_cache = dashboard.OverviewCache(settings.overview)

    @app.exception_handler(RecommenderError)
    async def recommender_error(request: Request, error: RecommenderError) -> JSONResponse:
        body: dict[str, Any] = {"error": type(error).__name__, "detail": str(error)}
        return JSONResponse(status_code=error.http_status, content=body)

    # The machine consumers first: a request is matched against the routes in this order, and theirs have budgets.
    for router in (
        webhook.router,
        extender.router,
        health.router,
        metrics.router,
        recommendations.router,
        nodes.router,
        dashboard.router,
        dashboard.root,
        docs.router,
    ):
        app.include_router(router)
    # The dashboard is public static files; every piece of data it shows comes from /api/v1 under its token.
    app.mount("/ui", StaticFiles(directory=dashboard.STATIC_DIR, html=True), name="ui")
    # The extender's calls skip FastAPI's layers; inside the two below, they keep their body cap and latency metric.
    app.add_middleware(extender.FastPath, state=app.state)
    app.add_middleware(BodyLimit, serve=settings.serve)
    app.add_middleware(LatencyMiddleware, metrics=app_metrics)
    return app
