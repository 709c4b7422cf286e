"""What the extender knows about the cluster: nodes and where pods run, read from `kubectl ... -o json` files.

The files are re-read when their modification time or size changes, and the forecast load matrices are rebuilt
when the files or the loaded model version change; the new `NodeLoads` replaces the old in one assignment, so a
call sees one consistent view. Nodes the model learned (usage with placement) start from their pooled forecast.
Keeping the files fresh is the job of a sidecar (docs/extender.md); this keeps the
service free of API-server watches and testable without a cluster.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


class ClusterView:
    """The current `NodeLoads`, rebuilt by `refresh` when its inputs change."""

    def __init__(self, settings: ExtenderSettings) -> None:
        self.settings = settings
        self.loads = NodeLoads.build([], [], lambda key: None, DEFAULT_TIMELINE, settings)
        self._inputs: object = None
        #: bumped on every rebuild; part of the ETag of the node reads
        self.generation = 0

    def refresh(self, snapshot: Snapshot | None) -> None:
        inputs = (_stamp(self.settings.pods_file), _stamp(self.settings.nodes_file), snapshot and snapshot.revision)
        if inputs == self._inputs:
            return
        lookup = snapshot.lookup if snapshot is not None else (lambda key: None)
        forecasts = {n.node: n for n in snapshot.loaded.recommendations.nodes} if snapshot is not None else {}
        self.loads = NodeLoads.build(
            _items(self.settings.pods_file),
            _items(self.settings.nodes_file),
            lookup,
            timeline_of(snapshot),
            self.settings,
            forecasts,
        )
        self._inputs = inputs
        self.generation += 1
        log.info("cluster view: %d nodes, model %s", len(self.loads.index), inputs[2])
