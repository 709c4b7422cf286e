"""The limit the webhook writes beside a new request, computed here once: the JSON's `limit` (REST, `recommend`,
`show` in every format), the dashboard and `/mutate` all read this number, so no surface states a limit another
would not apply.

Requests and limits are on the grid of the quantities we write (`recommender.units.cpu_on_grid`,
`memory_on_grid`: rounded up to whole millicores, whole MiB), so the number shown is the number applied and, both
rounded the same way, a request never ends above its limit.
"""

from __future__ import annotations

import math
from typing import Literal

from recommender.units import cpu_on_grid, memory_on_grid

Resource = Literal["cpu", "memory"]

SCALED = "scaled with the request"
REQUEST = "the request"
#: The floor's rule: the history window's highest usage (memory: x (1 + margin), an OOM kill is at stake).
PEAK = {"cpu": "observed peak", "memory": "observed peak + margin"}
#: The smallest quantity Kubernetes holds, cores and bytes.
SMALLEST = {"cpu": 1e-9, "memory": 1.0}


def on_grid(resource: Resource, value: float) -> float:
    """`value` (cores or bytes) rounded up to the quantity we write for it."""
    return cpu_on_grid(value) if resource == "cpu" else memory_on_grid(value)


def recommended_limit(
    resource: Resource, request: float, request_now: float | None, limit_now: float | None, floor: float | None
) -> tuple[float | None, str | None]:
    """The limit written beside a new `request` and the rule that set it, on the grid: the current limit scaled by
    new / current request as VPA does, never below the request nor below `floor` (the history window's highest
    usage, for memory plus a margin; None or NaN: none): a limit under usage the container reached throttles it
    (CPU) or kills it (memory). A missing or zero current request counts as the limit, as Kubernetes
    defaults it and VPA reads it: the limit becomes the request. None without a current limit (we never add one;
    a limit of 0 is none, a container cannot run under it)."""
    if limit_now is None or not math.isfinite(limit_now) or limit_now <= 0:
        return None, None
    request = on_grid(resource, request)
    scaled = request
    if request_now is not None and math.isfinite(request_now) and 0 < request_now != limit_now:
        # Kubernetes holds no request below its smallest quantity (1n, 1 byte): nor is one scaled by more.
        scaled = limit_now * request / max(request_now, SMALLEST[resource])
    candidates = {REQUEST: request, SCALED: scaled}  # a tie (request = limit, as Kubernetes defaults it): the request
    if floor is not None and math.isfinite(floor):
        candidates[PEAK[resource]] = floor
    rule = max(candidates, key=lambda name: candidates[name])
    return on_grid(resource, candidates[rule]), rule
