"""The reference endpoint: a bare ASGI app on the same uvicorn and TLS, echoing the request body (POST) or
returning `?bytes=N` bytes (GET), so a ratio against it isolates what our handlers cost."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs


async def app(
    scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    size = int(parse_qs(scope["query_string"].decode()).get("bytes", ["1000"])[0])
    payload = body if scope["method"] == "POST" else b"x" * size
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": payload})
