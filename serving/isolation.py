"""Keeping one hostile or heavy request from hurting the others: slow and oversized requests are cut off, and
CPU-heavy work runs on a few bounded worker threads instead of the event loop that answers probes.

- `guarded_protocol`: uvicorn's httptools protocol with a header timeout (from a connection's opening or a request's
  first byte to the end of its headers), a read timeout (to the end of its body) and a size limit on the request
  line and headers; uvicorn itself only times out idle keep-alive connections, so a client trickling bytes would
  hold a connection forever. It also puts the verified TLS client certificate's name in the scope (mutual TLS).
- `BodyLimit`: each route's body limit (serve.*_max_body_bytes); reading stops there. uvicorn's parser drops
  the rest of an answered request's body as it arrives, so the keep-alive connection stays usable.
- `WorkPool`: the worker threads, with a bound on the work queued for them; past it, `OverloadedError`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import ssl
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from recommender.errors import OverloadedError, RequestTooLargeError
from serving.settings import ServeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGI = Callable[[Scope, Receive, Send], Awaitable[None]]
#: How much of an oversized review is kept to find its uid in (the API server writes the uid first).
PREFIX_BYTES = 64 * 1024
_REQUEST = re.compile(rb'"request"\s*:\s*\{')
_UID = re.compile(rb'"uid"\s*:\s*"([^"\\]{1,256})"')


class HeaderTooLargeError(Exception):
    """Raised from a parser callback: httptools turns it into a parse error and uvicorn answers 400 and closes."""


def client_identity(transport: Any) -> dict[str, str]:
    """The ASGI TLS extension's fields we use: the verified client certificate's subject, if one was presented."""
    ssl_object = transport.get_extra_info("ssl_object")
    certificate = ssl_object.getpeercert() if isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket) else None
    if not certificate:
        return {}
    pairs = [
        (str(pair[0]), str(pair[1]))
        for rdn in certificate.get("subject", ())
        if isinstance(rdn, tuple)
        for pair in rdn
        if isinstance(pair, tuple) and len(pair) == 2
    ]
    name = ",".join(f"{key}={value}" for key, value in reversed(pairs))
    return {"client_cert_name": name, "client_common_name": dict(pairs).get("commonName", "")}


def guarded_protocol(serve: ServeSettings) -> type[HttpToolsProtocol]:
    """uvicorn's `http` protocol class with the header and read timeouts and the header size limit of `serve`."""

    class GuardedHttpProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._read_timer: asyncio.TimerHandle | None = None
            self._header_bytes = 0
            self._tls: dict[str, str] = {}

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._tls = client_identity(transport)
            self._header_timer = self.loop.call_later(serve.header_timeout_seconds, self._too_slow, "headers")

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timers()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._header_bytes = 0
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(serve.header_timeout_seconds, self._too_slow, "headers")
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self.loop.call_later(serve.read_timeout_seconds, self._too_slow, "body")
            if self._tls:
                tls: dict[object, object] = dict(self._tls.items())
                self.scope["extensions"] = {"tls": tls}

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value))
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None
            super().on_message_complete()

        def _count(self, size: int) -> None:
            self._header_bytes += size
            if self._header_bytes > serve.max_header_bytes:
                raise HeaderTooLargeError(f"request line and headers above {serve.max_header_bytes} bytes")

        def _cancel_timers(self) -> None:
            for timer in (self._header_timer, self._read_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._read_timer = None

        def _too_slow(self, what: str) -> None:
            log.warning(
                "closed a connection whose request %s did not arrive in time", what, extra={"client": self.client}
            )
            self._cancel_timers()
            if not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpProtocol


def body_limit(path: str, serve: ServeSettings) -> tuple[int, bool]:
    """A route's body limit, and whether the route answers a body past it itself (the webhook and the extender fail
    open from what they could read; every other route gets a plain 413)."""
    if path == "/mutate":
        return serve.webhook_max_body_bytes, True
    if path.startswith("/scheduler/"):
        return serve.extender_max_body_bytes, True
    return serve.max_body_bytes, False


class BodyLimit:
    """Stops reading a request body at its route's limit: the read that passes it raises `RequestTooLargeError`.

    A declared Content-Length above the limit is answered 413 at once, except on the webhook and extender routes,
    which answer it themselves (failing open) from what they could read.
    """

    def __init__(self, app: ASGI, serve: ServeSettings) -> None:
        self.app = app
        self.serve = serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        limit, own_answer = body_limit(path, self.serve)
        declared = next((value for name, value in scope["headers"] if name == b"content-length"), b"0")
        if not own_answer and declared.isdigit() and int(declared) > limit:
            await too_large(send, RequestTooLargeError(limit))
            return
        received = 0

        async def limited() -> Any:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise RequestTooLargeError(limit)
            return message

        await self.app(scope, limited, send)


async def too_large(send: Send, error: RequestTooLargeError) -> None:
    """Its status (413), closing the connection: the rest of the body is never read."""
    body = json.dumps({"error": type(error).__name__, "detail": str(error)}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"connection", b"close"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def review_uid(prefix: bytes) -> str | None:
    """The uid of an AdmissionReview from the start of its body, without parsing it: the first `uid` of `request`
    before its `object` (whose metadata has a uid of its own); None when it cannot be told."""
    start = _REQUEST.search(prefix)
    if start is None:
        return None
    rest = prefix[start.end() :]
    found = _UID.search(rest)
    if found is None or b'"object"' in rest[: found.start()]:
        return None
    try:
        return found.group(1).decode()
    except UnicodeDecodeError:
        return None


class WorkPool:
    """A few worker threads for CPU-heavy work, and at most `max_queued` calls waiting for or running on them."""

    def __init__(self, threads: int, max_queued: int) -> None:
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="heavy-work")
        self._max_queued = max_queued
        self._pending = 0  # changed on the event loop only

    async def run(self, work: Callable[[], T]) -> T:
        """`work()` on a worker thread; `OverloadedError` at once when the queue is full."""
        if self._pending >= self._max_queued:
            raise OverloadedError(f"{self._pending} heavy requests already queued")
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        finally:
            self._pending -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


async def read_body(receive: Receive) -> bytes:
    """The whole body (from the ASGI `receive`, as Starlette's `Request.stream` reads it); past the route's limit,
    `RequestTooLargeError` with the start of what was read; `ClientDisconnect` when the caller goes away."""
    chunks: list[bytes] = []
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)
    except RequestTooLargeError as error:
        raise RequestTooLargeError(error.limit, b"".join(chunks)[:PREFIX_BYTES]) from None
