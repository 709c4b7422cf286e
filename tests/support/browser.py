"""Debian's Chromium, headless, through Playwright: what the browser tests drive and `make docs-images` shoots."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def chromium(executable: str, wait_ms: int) -> Iterator[Any]:
    """A browser context with a fresh profile and a 1400 x 1000 viewport; every wait in it is bounded by `wait_ms`."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as profile, sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=executable,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(wait_ms)
        try:
            yield context
        finally:
            context.close()
