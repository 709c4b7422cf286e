"""Progress reporting: long jobs take a `Step` sink and call it with one line per stage, so the CLI can show the
lines on a terminal and in logs, and library callers can pass `quiet`."""

from __future__ import annotations

from collections.abc import Callable

Step = Callable[[str], None]


def quiet(_: str) -> None:
    """Progress sink for callers that show none."""
