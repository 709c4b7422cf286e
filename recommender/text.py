"""Text from the data (workload, namespace, container, file names) made safe to print on a terminal."""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with every control or format character (ESC, BEL, a line break, a bidi override) escaped visibly as
    Python writes it (`\\x1b`, `\\u202e`): a name in the data cannot move the cursor, retitle the terminal or hide
    what follows. Printable text, spaces included, is left as it is."""
    return "".join(c if c.isprintable() or c == " " else c.encode("unicode_escape").decode("ascii") for c in text)
