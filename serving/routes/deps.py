"""Request-scoped access to the service state (set on the app by the factory)."""

from __future__ import annotations

from fastapi import Request

from serving.state import ServiceState


def service_state(request: Request) -> ServiceState:
    state: ServiceState = request.app.state.service
    return state
