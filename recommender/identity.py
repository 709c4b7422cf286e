"""Workload identity: the key one recommendation is made for."""

from __future__ import annotations

from typing import NamedTuple

#: Columns of a tidy frame that identify the container a recommendation is for (pods are pooled, as VPA does).
KEY_COLUMNS: tuple[str, str, str] = ("namespace", "workload", "container")


class WorkloadKey(NamedTuple):
    """A (namespace, workload, container) triple; every pod of the workload shares its recommendation."""

    namespace: str
    workload: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.workload}/{self.container}"
