"""What the extender knows about the cluster: nodes and where pods run, read from `kubectl ... -o json` files.

The files are re-read when their modification time or size changes, and the forecast load matrices are rebuilt
when the files or the loaded model version change, together with each known node's record of the prioritize
answer (`HostRecords`, so a call writes its scores into them instead of encoding JSON); the new `Placement` replaces
the old in one assignment, so a call sees one consistent view. Nodes the model learned (usage with placement) start
from their pooled forecast. Keeping the files fresh is the job of a sidecar (docs/extender.md); this keeps the
service free of API-server watches and testable without a cluster.

A view also remembers the candidate lists it was called with (`CandidateLists`), so a scheduler that sends the same
list again is answered without reading and looking up its names again; a new view starts with none, so nothing
remembered outlives the view it was resolved on.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
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

    def layout(self, names: Sequence[str], rows: npt.NDArray[np.int64]) -> Layout:
        """The answer for the candidates at `rows` with every score slot blank, and where each record ends."""
        records, lengths = self.records[rows], self.lengths[rows]
        for position in np.flatnonzero(rows == len(self.records) - 1).tolist():
            records[position] = _record(names[position])
            lengths[position] = len(records[position])
        return b"[" + b"".join(records.tolist()), np.cumsum(lengths) + 1  # after each record's comma


Layout = tuple[bytes, npt.NDArray[np.int64]]


def scored(layout: Layout, scores: npt.NDArray[np.int64]) -> bytes:
    """The JSON list of (name, score) of a layout's candidates, with their scores (0-10) written into its slots."""
    blank, ends = layout
    if not len(ends):
        return b"[]"
    answer = bytearray(blank)
    written = np.frombuffer(answer, dtype=np.uint8)
    written[ends - 4], written[ends - 3] = _TENS[scores // 10], _ONES[scores % 10]
    written[-1] = ord("]")  # the last record's comma
    return bytes(answer)


class Candidates:
    """A candidate list as a view resolved it: the names (all strings), their columns in the loads and, on the first
    prioritize, the layout of its answer."""

    def __init__(self, names: Sequence[str], rows: npt.NDArray[np.int64], hosts: HostRecords) -> None:
        self.names = names
        self.rows = rows
        self.rows.flags.writeable = False  # shared by every call that sends this list
        self._hosts = hosts

    @cached_property
    def layout(self) -> Layout:
        return self._hosts.layout(self.names, self.rows)


#: How many candidate names a view remembers at most (about 120 bytes each, with the answer's layout): 10 lists of
#: 5,000 nodes, or one of 50,000.
MAX_REMEMBERED_NAMES = 50_000
#: How many lists sent once a view keeps track of (by hash), to remember one when it comes again.
MAX_SIGHTED_LISTS = 256


class CandidateLists:
    """The candidate lists a view was called with, by the text of the list in the call; the least recently used go
    first. A list is remembered the second time it comes: a scheduler whose lists always differ (kube-scheduler's
    parallel filter returns the feasible nodes in a new order each cycle) pays a hash per call, not the building
    and dropping of an entry. Calls judged on the worker threads use it too, hence the lock."""

    def __init__(self) -> None:
        self._lists: OrderedDict[bytes, Candidates] = OrderedDict()
        self._names = 0
        self._sighted: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: bytes) -> Candidates | None:
        with self._lock:
            found = self._lists.get(text)
            if found is not None:
                self._lists.move_to_end(text)
            return found

    def sent_before(self, text: bytes) -> bool:
        """Whether a list of this text came before (and was not remembered then); notes that it came now."""
        key = hash(text)
        with self._lock:
            if key in self._sighted:
                return True
            self._sighted[key] = None
            while len(self._sighted) > MAX_SIGHTED_LISTS:
                self._sighted.popitem(last=False)
            return False

    def remember(self, text: bytes, candidates: Candidates) -> None:
        if len(candidates.names) > MAX_REMEMBERED_NAMES:
            return
        with self._lock:
            if text in self._lists:
                return
            self._lists[text] = candidates
            self._names += len(candidates.names)
            while self._names > MAX_REMEMBERED_NAMES:
                self._names -= len(self._lists.popitem(last=False)[1].names)


@dataclass(frozen=True)
class Placement:
    """One consistent view for the extender: the loads and the answer records of the same nodes, and the candidate
    lists resolved on them."""

    loads: NodeLoads
    hosts: HostRecords
    candidates: CandidateLists = field(default_factory=CandidateLists, compare=False)

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
