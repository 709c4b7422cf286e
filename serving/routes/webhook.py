"""Mutating admission webhook (`admission.k8s.io/v1`, pods, CREATE): size requests and limits, colocate.

It fails open: a malformed review, an unknown workload, a stale or missing model or any error gives
`allowed: true`, no patch and a warning saying why; it never answers 5xx. The patch is the JSON Patch difference
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
from fastapi import APIRouter, Request
from fastapi.responses import Response

from recommender.mutation import mutate, relevant_fields
from recommender.settings import WebhookSettings
from serving.metrics import Metrics
from serving.routes.deps import json_body
from serving.state import ServiceState

log = logging.getLogger(__name__)
router = APIRouter(tags=["webhook"])
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
    age = now - snapshot.loaded.recommendations.as_of
    if age > settings.max_model_age_seconds:
        return None, [f"koord-recommender: model {snapshot.version} is {age / 3600:.0f} h old, pod admitted unchanged"], "skipped"
    namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    view = relevant_fields(pod)
    mutation = mutate(view, namespace, snapshot.lookup, settings, snapshot.version)
    patch = jsonpatch.make_patch(view, mutation.pod).patch
    if mutation.workload is None:
        outcome = "skipped"
    else:
        outcome = "patched" if patch else "unchanged"
    return patch or None, mutation.warnings, outcome


@router.post(
    "/mutate",
    summary="Mutating admission webhook for pods (AdmissionReview admission.k8s.io/v1); always allows",
    response_class=Response,
    responses={200: {"content": {"application/json": {}}, "description": "AdmissionReview with the response set"}},
    openapi_extra=REVIEW_BODY,
)
async def admission(request: Request) -> Response:
    state: ServiceState = request.app.state.service
    settings: WebhookSettings = request.app.state.settings.webhook
    metrics: Metrics = request.app.state.metrics
    uid, review, problem = parse_review(await request.body())
    dry_run = bool(review and review.get("dryRun") is True)
    patch: list[dict[str, Any]] | None = None
    if review is None:
        warnings, outcome = [f"koord-recommender: {problem}, pod admitted unchanged"], "error"
    else:
        try:
            patch, warnings, outcome = decide(review, state, settings, time.time())
        except Exception:  # fail open: a bug here must never block a pod
            log.exception("admission review failed; pod admitted unchanged")
            patch, warnings, outcome = None, ["koord-recommender: internal error, pod admitted unchanged"], "error"
    metrics.webhook_decisions.labels(outcome=outcome, dry_run=str(dry_run).lower()).inc()
    log.log(
        logging.WARNING if outcome == "error" else logging.DEBUG, "admission review",
        extra={"uid": uid, "outcome": outcome, "dry_run": dry_run, "warnings": warnings},
    )
    return Response(_review(uid, patch, warnings), media_type="application/json")
