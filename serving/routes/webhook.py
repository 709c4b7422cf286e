"""Mutating admission webhook (`admission.k8s.io/v1`, pods, CREATE): size the requests and limits of opted-in pods
(`recommender.optin`: pod label or annotation, our VPA, namespace label, default Off), colocate.

It fails open: a malformed, oversized or unjudgeable review, an unknown workload, a stale or missing model, an
overload or any error gives `allowed: true`, no patch and a warning saying why; it never answers 5xx (an oversized
body whose uid cannot be read gets 413, and a caller without the client certificate mutual TLS asks for, 403). The patch is the JSON Patch difference
between the pod as sent and as mutated (python-json-patch, over the fields the mutation touches), so every path
exists and keys are escaped. A dry-run
review gets the same patch; nothing is recorded for it beyond the decision counter's `dry_run` label. In our own
dry-run (`webhook.dry_run`) the patch only adds the would-apply annotation. While the cluster caches (namespaces,
VPAs, HPAs) are not synced, pods are admitted unchanged with a warning saying so.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from recommender import optin
from recommender.errors import OverloadedError, RequestTooLargeError
from recommender.mutation import mutate, relevant_fields
from recommender.optin import OptIn
from recommender.resources import model_age_problem
from serving.isolation import PREFIX_BYTES, WorkPool, read_body, review_uid
from serving.kube_watch import OptInSources
from serving.metrics import Metrics
from serving.routes.auth import require_client_certificate
from serving.routes.deps import json_body, pod_containers
from serving.settings import ServingSettings
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


@dataclass
class Answer:
    """What one review is answered with, and what the route counts and logs about it."""

    uid: str
    patch: list[dict[str, Any]] | None
    warnings: list[str]
    outcome: str
    dry_run: bool = False
    #: resources left alone because an HPA scales the workload on them
    hpa_refused: list[str] = field(default_factory=list)


def opt_in(
    pod: Mapping[str, Any], namespace: str, settings: ServingSettings, sources: OptInSources | None
) -> OptIn | str:
    """The pod's opt-in, from the cluster caches when they run; a warning instead when they are not synced yet."""
    if sources is None:
        labels: dict[str, str] = {}
        vpas: list[dict[str, Any]] = []
        hpas: list[dict[str, Any]] = []
    else:
        problem = sources.problem()
        if problem is not None:
            return f"koord-recommender: {problem}, pod admitted unchanged"
        labels, vpas, hpas = (
            sources.namespace_labels(namespace),
            sources.vpas.values(namespace),
            sources.hpas.values(namespace),
        )
    return optin.decide(pod, labels, vpas, hpas, settings.webhook.default_mode, settings.sync.recommender_name)


def decide(
    request: Mapping[str, Any], state: ServiceState, settings: ServingSettings, sources: OptInSources | None, now: float
) -> Answer:
    """The answer to one review's request (uid left to the caller); raises only on bugs (the route catches them)."""
    pod = request.get("object")
    kind = request.get("kind") or {}
    if (
        request.get("operation") != "CREATE"
        or not isinstance(pod, Mapping)
        or kind.get("kind") != "Pod"
        or request.get("subResource")
    ):
        return Answer("", None, ["koord-recommender: only pod CREATE is mutated"], "skipped")
    snapshot = state.snapshot
    if snapshot is None:
        return Answer("", None, ["koord-recommender: no model version loaded, pod admitted unchanged"], "skipped")
    problem = model_age_problem(snapshot.loaded.recommendations.as_of, now, settings.webhook.max_model_age_seconds)
    if problem is not None:
        return Answer(
            "", None, [f"koord-recommender: model {snapshot.version} {problem}, pod admitted unchanged"], "skipped"
        )
    namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or "")
    view = relevant_fields(pod)
    decided = opt_in(view, namespace, settings, sources)
    if isinstance(decided, str):
        return Answer("", None, [decided], "not_synced")
    mutation = mutate(view, namespace, snapshot.lookup, settings.webhook, snapshot.revision, decided)
    patch = jsonpatch.make_patch(view, mutation.pod).patch
    if mutation.workload is None:
        outcome = "skipped"
    elif patch:
        outcome = "would_patch" if settings.webhook.dry_run else "patched"
    else:
        outcome = "unchanged" if decided.sizes else "off"
    return Answer("", patch or None, mutation.warnings, outcome, hpa_refused=mutation.hpa_refused)


def _containers(review: Mapping[str, Any] | None) -> int:
    """How many containers a review's pod has: what deciding it costs."""
    return pod_containers(review.get("object") if review is not None else None)


def answer(
    parsed: tuple[str, Mapping[str, Any] | None, str],
    state: ServiceState,
    settings: ServingSettings,
    sources: OptInSources | None,
    now: float,
) -> Answer:
    """The answer to a parsed review; never raises (fails open)."""
    uid, review, problem = parsed
    dry_run = bool(review and review.get("dryRun") is True)
    if review is None:
        return Answer(uid, None, [f"koord-recommender: {problem}, pod admitted unchanged"], "error", dry_run)
    containers, most = _containers(review), settings.serve.max_review_containers
    if containers > most:
        warning = f"koord-recommender: pod has {containers} containers, more than {most}, admitted unchanged"
        return Answer(uid, None, [warning], "too_large", dry_run)
    try:
        found = decide(review, state, settings, sources, now)
    except Exception:  # fail open: a bug here must never block a pod
        log.exception("admission review failed; pod admitted unchanged")
        found = Answer(uid, None, ["koord-recommender: internal error, pod admitted unchanged"], "error")
    found.uid, found.dry_run = uid, dry_run
    return found


async def _decided(body: bytes, request: Request) -> Answer:
    """Small reviews are decided on the event loop (about a millisecond); large ones on the worker threads, and
    when those are all taken the pod is admitted unchanged at once."""
    state: ServiceState = request.app.state.service
    settings: ServingSettings = request.app.state.settings
    sources: OptInSources | None = request.app.state.opt_in_sources
    pool: WorkPool = request.app.state.work_pool
    now = time.time()
    try:
        if len(body) <= INLINE_BYTES:
            parsed = parse_review(body)
            if _containers(parsed[1]) <= settings.serve.inline_review_containers:
                return answer(parsed, state, settings, sources, now)
            return await pool.run(lambda: answer(parsed, state, settings, sources, now))
        return await pool.run(lambda: answer(parse_review(body), state, settings, sources, now))
    except OverloadedError:
        warning = "koord-recommender: overloaded (every worker busy), pod admitted unchanged"
        return Answer(review_uid(body[:PREFIX_BYTES]) or "", None, [warning], "overloaded")


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
        found = await _decided(await read_body(request.receive), request)
    except RequestTooLargeError as error:
        uid = review_uid(error.prefix)
        if uid is None:
            raise  # nothing to answer the API server with: a plain 413
        found = Answer(uid, None, [f"koord-recommender: review {error}, pod admitted unchanged"], "too_large")
    except ClientDisconnect:
        return Response(status_code=400)  # nobody is left to read an answer
    metrics.webhook_decisions.labels(outcome=found.outcome, dry_run=str(found.dry_run).lower()).inc()
    for resource in found.hpa_refused:
        metrics.webhook_hpa_conflicts.labels(resource=resource).inc()
    log.log(
        logging.WARNING if found.outcome in ("error", "overloaded", "too_large", "not_synced") else logging.DEBUG,
        "admission review",
        extra={"uid": found.uid, "outcome": found.outcome, "dry_run": found.dry_run, "warnings": found.warnings},
    )
    return Response(_review(found.uid, found.patch, found.warnings), media_type="application/json")
