"""The API's OpenAPI schema and its Swagger UI and ReDoc pages, behind the same bearer token as /api/v1: the schema
names every route, and the pages are how a person reads recommendations by hand.

The pages' scripts, stylesheet and icon are served from here (`/docs/assets/`), from the pinned `fastapi-offline`
package's bundled Swagger UI and ReDoc builds, so the pages work in a cluster without internet access: nothing is
fetched from a CDN, ReDoc loads no web fonts, Swagger UI calls no online validator, and a Content-Security-Policy
keeps the browser on this service for anything a build still links elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fastapi_offline
from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from serving.routes.auth import require_token

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_token)])
ASSETS_DIR = Path(fastapi_offline.__file__).resolve().parent / "static"
#: The files the pages load, and their types; nothing else under the package is served.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
ASSETS_URL = "/docs/assets"
#: The pages may load only from this service: ReDoc's build shows its maker's logo from a CDN, and this keeps the
#: browser from asking for it (the inline scripts are FastAPI's page set-up; ReDoc's search runs in a blob worker).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; frame-ancestors 'none'"
)


def _self_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return page


@router.get("/openapi.json")
def openapi(request: Request) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return schema


@router.get("/docs")
def swagger(request: Request) -> HTMLResponse:
    return _self_only(
        get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{request.app.title} - Swagger UI",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )
    )


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    return _self_only(
        get_redoc_html(
            openapi_url="/openapi.json",
            title=f"{request.app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
    )


@router.get(ASSETS_URL + "/{name}")
def asset(name: str) -> FileResponse:
    """One of the pages' files; they change only with the package, so browsers may keep them a day."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(status_code=404, detail=f"no documentation asset {name!r}")
    return FileResponse(ASSETS_DIR / name, media_type=media_type, headers={"Cache-Control": "public, max-age=86400"})
