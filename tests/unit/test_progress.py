"""The CLI's progress lines in a log: detail lines (one partition of a stage) do not advance the stage count."""

from __future__ import annotations

import re

import pytest

from cli.main import _progress

LINE = re.compile(r"^\d\d:\d\d:\d\d \[(\d+)/(\d+)\] (\s*)(.+) \(\d+\.\d s\)$")


def test_detail_lines_report_within_their_stage_and_the_count_never_passes_the_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _progress(3) as step:
        step("reading")
        for number in (1, 2, 3, 4):
            step(f"read and fitted {number} of 4 partitions", detail=True)
        step("choosing")
        step("publishing")
    lines = [m.groups() for m in map(LINE.match, capsys.readouterr().err.splitlines()) if m]
    assert [(int(k), int(n)) for k, n, _, _ in lines] == [(1, 3)] * 5 + [(2, 3), (3, 3)]
    assert [indent != "" for _, _, indent, _ in lines] == [False, True, True, True, True, False, False]
    assert lines[-1][3] == "publishing"
