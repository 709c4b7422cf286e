"""A stand-in for the API server's TokenReview endpoint, run by uvicorn in tests: it authenticates one user token
when asked with one service-account token, and counts the reviews it was asked for."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

SERVICE_ACCOUNT_TOKEN = "sa-token"
USER_TOKEN = "user-token"
app = FastAPI()
reviews: list[str] = []


@app.post("/apis/authentication.k8s.io/v1/tokenreviews")
async def token_review(request: Request) -> JSONResponse:
    if request.headers.get("authorization") != f"Bearer {SERVICE_ACCOUNT_TOKEN}":
        return JSONResponse({"kind": "Status", "code": 401}, status_code=401)
    body: dict[str, Any] = await request.json()
    token = body["spec"]["token"]
    reviews.append(token)
    status = {"authenticated": token == USER_TOKEN, "user": {"username": "system:serviceaccount:ops:grafana"}}
    return JSONResponse({**body, "status": status}, status_code=201)


@app.get("/reviews")
async def count() -> dict[str, int]:
    return {"reviews": len(reviews)}
