"""What the extender knows about the cluster: nodes and where pods run, read from `kubectl ... -o json` files.

The files are re-read when their modification time or size changes, and the forecast load matrices are rebuilt
when the files or the loaded model version change, together with each known node's record of the prioritize
answer (`HostRecords`, so a call writes its scores into them instead of encoding JSON); the new `Placement` replaces
the old in one assignment, so a call sees one consistent view. Nodes the model learned (usage with placement) start
from their pooled forecast. Keeping the files fresh is the job of a sidecar (docs/extender.md); this keeps the
service free of API-server watches and testable without a cluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from recommender.placement import NodeLoads
from serving.settings import ExtenderSettings
from serving.state import DEFAULT_TIMELINE, Snapshot, timeline_of

log = logging.getLogger(__name__)


def _stamp(path: Path | None) -> tuple[int, int] | None:
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def _items(path: Path | None) -> list[Mapping[str, Any]]:
    """The `items` of a Kubernetes list in a JSON file; empty (with a log line) when it is missing or malformed."""
    if path is None:
        return []
    try:
        document = json.loads(path.read_bytes())
        items = document.get("items") if isinstance(document, dict) else None
    except (OSError, ValueError) as error:
        log.warning("cannot read %s: %s", path, error)
        return []
    return [item for item in items or [] if isinstance(item, dict)]


#: The score slot of a record: two characters before its closing `},` (one digit is written after a space).
_SLOT = b"  },"
_TENS = np.frombuffer(b" 1", dtype=np.uint8)
_ONES = np.frombuffer(b"0123456789", dtype=np.uint8)


def _record(name: str) -> bytes:
    return b'{"Host":' + orjson.dumps(name) + b',"Score":' + _SLOT


class HostRecords:
    """The records `{"Host": name, "Score": NN}` of the prioritize answer (Go's HostPriorityList), one per known node
    and encoded once per cluster view: an answer is its candidates' records joined, with each score written into
    its two-character slot (" 5" or "10", valid JSON). Names we do not know are encoded per call."""

    def __init__(self, names: Sequence[str]) -> None:
        #: by the loads' column; the last (the column of unknown names) is encoded per call
        self.records = np.array([*map(_record, names), b""], dtype=object)
        self.lengths = np.array([len(r) for r in self.records], dtype=np.int64)

    def answer(self, names: Sequence[str], rows: npt.NDArray[np.int64], scores: npt.NDArray[np.int64]) -> bytes:
        """The JSON list of (name, score) for the candidates at `rows` (scores 0-10)."""
        if not len(names):
            return b"[]"
        records, lengths = self.records[rows], self.lengths[rows]
        for position in np.flatnonzero(rows == len(self.records) - 1).tolist():
            records[position] = _record(names[position])
            lengths[position] = len(records[position])
        answer = bytearray(b"[")
        answer += b"".join(records.tolist())
        ends = np.cumsum(lengths) + 1  # after each record's comma; "[" comes first
        written = np.frombuffer(answer, dtype=np.uint8)
        written[ends - 4], written[ends - 3] = _TENS[scores // 10], _ONES[scores % 10]
        written[-1] = ord("]")  # the last record's comma
        return bytes(answer)


@dataclass(frozen=True)
class Placement:
    """One consistent view for the extender: the loads and the answer records of the same nodes."""

    loads: NodeLoads
    hosts: HostRecords

    @classmethod
    def of(cls, loads: NodeLoads) -> Placement:
        return cls(loads, HostRecords(list(loads.index)))


class ClusterView:
    """The current `Placement`, rebuilt by `refresh` when its inputs change."""

    def __init__(self, settings: ExtenderSettings) -> None:
        self.settings = settings
        self.placement = Placement.of(NodeLoads.build([], [], lambda key: None, DEFAULT_TIMELINE, settings))
        self._inputs: object = None
        #: bumped on every rebuild; part of the ETag of the node reads
        self.generation = 0

    @property
    def loads(self) -> NodeLoads:
        return self.placement.loads

    def refresh(self, snapshot: Snapshot | None) -> None:
        inputs = (_stamp(self.settings.pods_file), _stamp(self.settings.nodes_file), snapshot and snapshot.revision)
        if inputs == self._inputs:
            return
        lookup = snapshot.lookup if snapshot is not None else (lambda key: None)
        forecasts = {n.node: n for n in snapshot.loaded.recommendations.nodes} if snapshot is not None else {}
        loads = NodeLoads.build(
            _items(self.settings.pods_file),
            _items(self.settings.nodes_file),
            lookup,
            timeline_of(snapshot),
            self.settings,
            forecasts,
        )
        self.placement = Placement.of(loads)
        self._inputs = inputs
        self.generation += 1
        log.info("cluster view: %d nodes, model %s", len(loads.index), inputs[2])
