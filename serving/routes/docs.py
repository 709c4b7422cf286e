"""The API's OpenAPI schema and its Swagger UI and ReDoc pages, behind the same bearer token as /api/v1: the schema
names every route, and the pages are how a person reads recommendations by hand."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse

from serving.routes.auth import require_token

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_token)])


@router.get("/openapi.json")
def openapi(request: Request) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return schema


@router.get("/docs")
def swagger(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} - Swagger UI")


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - ReDoc")
