"""Progress reporting: long jobs take a `Step` sink and call it with one line per stage, so the CLI can show the
lines on a terminal and in logs, and library callers can pass `quiet`. A `detail` line (one partition of a stage)
reports within the current stage without starting the next, so a stage count stays right whatever the partitions."""

from __future__ import annotations

from typing import Protocol


class Step(Protocol):
    """A progress sink: each call starts the next stage, or with `detail` reports within the current one."""

    def __call__(self, description: str, /, *, detail: bool = False) -> None: ...


def quiet(_: str, /, *, detail: bool = False) -> None:
    """Progress sink for callers that show none."""
