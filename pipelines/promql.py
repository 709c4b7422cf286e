"""Every PromQL expression the pipeline sends is built here, from validated names and escaped label values.

Label values are user data (a namespace or pod may hold quotes, backslashes, newlines): they only ever enter a
query through `quote` (a PromQL string literal) or `regex_alternatives` (an RE2 alternation of literal values,
then quoted), so no name can change the shape of a query.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
#: RE2 metacharacters; everything else in a label value is literal inside a regex.
_RE2_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


def metric_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"{name!r} is not a valid Prometheus metric name")
    return name


def label_name(name: str) -> str:
    if not _LABEL.match(name):
        raise ValueError(f"{name!r} is not a valid Prometheus label name")
    return name


def quote(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly `value`."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )
    return f'"{escaped}"'


def regex_alternatives(values: Iterable[str]) -> str:
    """A quoted RE2 pattern that fully matches any of `values` literally (Prometheus anchors regex matchers)."""
    parts = sorted({_RE2_SPECIAL.sub(r"\\\1", v) for v in values})
    if not parts:
        raise ValueError("an alternation needs at least one value")
    return quote("|".join(parts))


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def render(self) -> str:
        if self.op not in {"=", "!=", "=~", "!~"}:
            raise ValueError(f"unknown matcher operator {self.op!r}")
        return f"{label_name(self.label)}{self.op}{self.value}"


def eq(label: str, value: str) -> Matcher:
    return Matcher(label, "=", quote(value))


def ne(label: str, value: str) -> Matcher:
    return Matcher(label, "!=", quote(value))


def one_of(label: str, values: Iterable[str]) -> Matcher:
    return Matcher(label, "=~", regex_alternatives(values))


def raw(label: str, op: str, pattern: str) -> Matcher:
    """A matcher with a regex pattern given by the operator (configuration), quoted as a string."""
    return Matcher(label, op, quote(pattern))


def selector(metric: str, matchers: Sequence[Matcher]) -> str:
    inner = ",".join(m.render() for m in matchers)
    return f"{metric_name(metric)}{{{inner}}}"


def by(labels: Sequence[str]) -> str:
    return "by (" + ",".join(label_name(label) for label in labels) + ")"


def duration(seconds: int) -> str:
    if seconds <= 0:
        raise ValueError("a PromQL duration must be positive")
    return f"{int(seconds)}s"
