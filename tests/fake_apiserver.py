"""A stand-in for the API server's TokenReview and SubjectAccessReview endpoints, run by uvicorn in tests, asked
with one service-account token. It counts the TokenReviews it was asked for.

Tokens: `user-token` (group ops, any audience asked for, allowed by SubjectAccessReview), `other-group-token`
(group dev), `other-audience-token` (valid only for the audience `elsewhere`), `no-access-token` (group ops, denied
by SubjectAccessReview), `slow-*` (answered after SLOW_SECONDS, unauthenticated); anything else is unauthenticated.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

SERVICE_ACCOUNT_TOKEN = "sa-token"
USER_TOKEN = "user-token"
SLOW_SECONDS = 1.5
GRAFANA = "system:serviceaccount:ops:grafana"
USERS = {
    USER_TOKEN: (GRAFANA, ["ops"], None),
    "other-group-token": ("system:serviceaccount:dev:app", ["dev"], None),
    "other-audience-token": (GRAFANA, ["ops"], ["elsewhere"]),
    "no-access-token": ("system:serviceaccount:ops:nobody", ["ops"], None),
}
app = FastAPI()
reviews: list[str] = []


def _unauthorized(request: Request) -> JSONResponse | None:
    if request.headers.get("authorization") != f"Bearer {SERVICE_ACCOUNT_TOKEN}":
        return JSONResponse({"kind": "Status", "code": 401}, status_code=401)
    return None


@app.post("/apis/authentication.k8s.io/v1/tokenreviews")
async def token_review(request: Request) -> JSONResponse:
    if (refused := _unauthorized(request)) is not None:
        return refused
    body: dict[str, Any] = await request.json()
    token = body["spec"]["token"]
    reviews.append(token)
    if token.startswith("slow-"):
        await asyncio.sleep(SLOW_SECONDS)
    known = USERS.get(token)
    status: dict[str, Any] = {"authenticated": known is not None}
    if known is not None:
        username, groups, audiences = known
        status["user"] = {"username": username, "groups": groups}
        status["audiences"] = (
            audiences if audiences is not None else body["spec"].get("audiences", ["https://kubernetes.default.svc"])
        )
    return JSONResponse({**body, "status": status}, status_code=201)


@app.post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
async def access_review(request: Request) -> JSONResponse:
    if (refused := _unauthorized(request)) is not None:
        return refused
    body: dict[str, Any] = await request.json()
    spec = body["spec"]
    allowed = spec.get("user") == GRAFANA and spec.get("nonResourceAttributes", {}).get("verb") == "get"
    return JSONResponse({**body, "status": {"allowed": allowed}}, status_code=201)


@app.get("/reviews")
async def count() -> dict[str, int]:
    return {"reviews": len(reviews)}
