"""Names from the data printed safely: no control or format character reaches the terminal, printable text stays."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from recommender.text import printable


def test_escapes_are_visible() -> None:
    assert printable("w\x1b[2J\x1b]0;t\x07\u202ex\ty\n") == "w\\x1b[2J\\x1b]0;t\\x07\\u202ex\\ty\\n"
    assert printable("café api-7 [bold]") == "café api-7 [bold]"


@given(st.text())
def test_no_control_or_format_character_survives(text: str) -> None:
    shown = printable(text)
    assert not any(unicodedata.category(c)[0] in "CZ" and c != " " for c in shown)
    if text.isprintable():
        assert shown == text
