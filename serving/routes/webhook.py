"""Mutating admission webhook (`admission.k8s.io/v1`, pods, CREATE): size requests and limits, colocate.

It fails open: a malformed, oversized or unjudgeable review, an unknown workload, a stale or missing model, an
overload or any error gives `allowed: true`, no patch and a warning saying why; it never answers 5xx (an oversized
body whose uid cannot be read gets 413, and a caller without the client certificate mutual TLS asks for, 403). The patch is the JSON Patch difference
between the pod as sent and as mutated (python-json-patch, over the fields the mutation touches), so every path
exists and keys are escaped. A dry-run
review gets the same patch; nothing is recorded for it beyond the decision counter's `dry_run` label.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from typing import Any

import jsonpatch
import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from recommender.errors import OverloadedError, RequestTooLargeError
from recommender.mutation import mutate, relevant_fields
from recommender.resources import model_age_problem
from recommender.settings import Settings, WebhookSettings
from serving.isolation import PREFIX_BYTES, WorkPool, read_body, review_uid
from serving.metrics import Metrics
from serving.routes.auth import require_client_certificate
from serving.routes.deps import json_body
from serving.state import ServiceState

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhook"], dependencies=[Depends(require_client_certificate)])
#: Bodies up to this size are parsed on the event loop (orjson: well under a millisecond).
INLINE_BYTES = 64 * 1024
REVIEW_BODY = json_body(
    "AdmissionReview (admission.k8s.io/v1) with request {uid, kind, namespace, operation, object, dryRun}.",
    {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "request": {"type": "object"}},
)


def _review(uid: str, patch: list[dict[str, Any]] | None, warnings: list[str]) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        response["warnings"] = warnings
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})


def parse_review(body: bytes) -> tuple[str, Mapping[str, Any] | None, str]:
    """(uid, request, problem): the request is None when the body is not an AdmissionReview we can read. Never
    raises, so that every answer, even to a review we fail on later, carries the uid the API server expects."""
    try:
        request = orjson.loads(body)["request"]
        uid = request["uid"]
    except (ValueError, KeyError, TypeError) as error:
        return "", None, f"malformed AdmissionReview ({type(error).__name__})"
    if not isinstance(uid, str):
        return "", None, "malformed AdmissionReview (uid)"
    return uid, request, ""


def decide(request: Mapping[str, Any], state: ServiceState, settings: WebhookSettings, now: float) -> tuple[list[dict[str, Any]] | None, list[str], str]:
    """(patch, warnings, outcome) for one review's request; raises only on bugs (the route catches them)."""
    pod = request.get("object")
    kind = request.get("kind") or {}
    if request.get("operation") != "CREATE" or not isinstance(pod, Mapping) or kind.get("kind") != "Pod" or request.get("subResource"):
        return None, ["koord-recommender: only pod CREATE is mutated"], "skipped"
    snapshot = state.snapshot
    if snapshot is None:
        return None, ["koord-recommender: no model version loaded, pod admitted unchanged"], "skipped"
    problem = model_age_problem(snapshot.loaded.recommendations.as_of, now, settings.max_model_age_seconds)
    if problem is not None:
        return None, [f"koord-recommender: model {snapshot.version} {problem}, pod admitted unchanged"], "skipped"
    namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    view = relevant_fields(pod)
    mutation = mutate(view, namespace, snapshot.lookup, settings, snapshot.version)
    patch = jsonpatch.make_patch(view, mutation.pod).patch
    if mutation.workload is None:
        outcome = "skipped"
    else:
        outcome = "patched" if patch else "unchanged"
    return patch or None, mutation.warnings, outcome


def _containers(review: Mapping[str, Any] | None) -> int:
    """How many containers a review's pod has: what deciding it costs."""
    pod = review.get("object") if review is not None else None
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0
    return sum(len(part) for part in (spec.get("containers"), spec.get("initContainers")) if isinstance(part, list))


Answer = tuple[str, list[dict[str, Any]] | None, list[str], str, bool]


def answer(parsed: tuple[str, Mapping[str, Any] | None, str], state: ServiceState, settings: Settings, now: float) -> Answer:
    """(uid, patch, warnings, outcome, dry_run) of a parsed review; never raises (fails open)."""
    uid, review, problem = parsed
    dry_run = bool(review and review.get("dryRun") is True)
    if review is None:
        return uid, None, [f"koord-recommender: {problem}, pod admitted unchanged"], "error", dry_run
    containers, most = _containers(review), settings.serve.max_review_containers
    if containers > most:
        warning = f"koord-recommender: pod has {containers} containers, more than {most}, admitted unchanged"
        return uid, None, [warning], "too_large", dry_run
    try:
        patch, warnings, outcome = decide(review, state, settings.webhook, now)
    except Exception:  # fail open: a bug here must never block a pod
        log.exception("admission review failed; pod admitted unchanged")
        patch, warnings, outcome = None, ["koord-recommender: internal error, pod admitted unchanged"], "error"
    return uid, patch, warnings, outcome, dry_run


async def _decided(body: bytes, request: Request) -> Answer:
    """Small reviews are decided on the event loop (about a millisecond); large ones on the worker threads, and
    when those are all taken the pod is admitted unchanged at once."""
    state: ServiceState = request.app.state.service
    settings: Settings = request.app.state.settings
    pool: WorkPool = request.app.state.work_pool
    now = time.time()
    try:
        if len(body) <= INLINE_BYTES:
            parsed = parse_review(body)
            if _containers(parsed[1]) <= settings.serve.inline_review_containers:
                return answer(parsed, state, settings, now)
            return await pool.run(lambda: answer(parsed, state, settings, now))
        return await pool.run(lambda: answer(parse_review(body), state, settings, now))
    except OverloadedError:
        warning = "koord-recommender: overloaded (every worker busy), pod admitted unchanged"
        return review_uid(body[:PREFIX_BYTES]) or "", None, [warning], "overloaded", False


@router.post(
    "/mutate",
    summary="Mutating admission webhook for pods (AdmissionReview admission.k8s.io/v1); always allows",
    response_class=Response,
    responses={200: {"content": {"application/json": {}}, "description": "AdmissionReview with the response set"}},
    openapi_extra=REVIEW_BODY,
)
async def admission(request: Request) -> Response:
    metrics: Metrics = request.app.state.metrics
    try:
        uid, patch, warnings, outcome, dry_run = await _decided(await read_body(request), request)
    except RequestTooLargeError as error:
        found = review_uid(error.prefix)
        if found is None:
            raise  # nothing to answer the API server with: a plain 413
        uid, patch, warnings, outcome, dry_run = found, None, [f"koord-recommender: review {error}, pod admitted unchanged"], "too_large", False
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is left to read an answer
    metrics.webhook_decisions.labels(outcome=outcome, dry_run=str(dry_run).lower()).inc()
    log.log(
        logging.WARNING if outcome in ("error", "overloaded", "too_large") else logging.DEBUG, "admission review",
        extra={"uid": uid, "outcome": outcome, "dry_run": dry_run, "warnings": warnings},
    )
    return Response(_review(uid, patch, warnings), media_type="application/json")
