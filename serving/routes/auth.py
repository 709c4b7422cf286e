"""Optional bearer-token authentication of the REST API, against a token file re-read when it changes."""

from __future__ import annotations

import hmac
from pathlib import Path

from fastapi import HTTPException, Request


class TokenFile:
    """The expected bearer token, cached until the file's modification time or size changes (rotation)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._token = b""

    def token(self) -> bytes:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._stamp:
            self._token = self.path.read_bytes().strip()
            self._stamp = stamp
        return self._token

    def accepts(self, authorization: str | None) -> bool:
        if not authorization or not authorization.startswith("Bearer "):
            return False
        try:
            expected = self.token()
        except OSError:
            return False  # no readable token file: nobody gets in rather than everybody
        return bool(expected) and hmac.compare_digest(authorization[len("Bearer ") :].strip().encode(), expected)


def require_token(request: Request) -> None:
    """Dependency of /api/v1: a 401 unless auth is off or the request carries the token."""
    tokens: TokenFile | None = request.app.state.tokens
    if tokens is not None and not tokens.accepts(request.headers.get("authorization")):
        raise HTTPException(status_code=401, detail="bearer token required", headers={"WWW-Authenticate": "Bearer"})
