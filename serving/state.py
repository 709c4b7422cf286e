"""What the service has loaded: one verified model version, swapped as a whole so no request sees half of one."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from models.store import LoadedVersion, ModelStore
from recommender.errors import ModelStoreError, UnknownWorkloadError
from recommender.identity import WorkloadKey
from recommender.placement import Timeline
from recommender.resources import WorkloadRecommendation

log = logging.getLogger(__name__)
#: Lines of a day at 5-minute steps: the shape used when no model is loaded (every line is then a constant).
DEFAULT_TIMELINE = Timeline(as_of=0, step_seconds=300, steps=288)


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of one loaded version with an index by workload key."""

    loaded: LoadedVersion
    by_key: dict[WorkloadKey, WorkloadRecommendation] = field(repr=False)

    @classmethod
    def of(cls, loaded: LoadedVersion) -> Snapshot:
        return cls(loaded, {r.key: r for r in loaded.recommendations.recommendations})

    def lookup(self, key: WorkloadKey) -> WorkloadRecommendation | None:
        return self.by_key.get(key)

    @property
    def version(self) -> str:
        return self.loaded.manifest.version


class ServiceState:
    """Holds the current snapshot; `refresh` loads the newest valid version and keeps the old one on failure."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.snapshot: Snapshot | None = None
        self.last_error: str | None = None
        self._attempted: str | None = None

    def refresh_if_published(self) -> bool:
        """Reload when `latest` names a version not yet tried (one small read per poll); True if a new one loaded.

        A `latest` that failed to load is not retried every poll; the next publish moves it and is tried.
        """
        latest = self.store.latest_name()
        if self.snapshot is not None and latest == self._attempted:
            return False
        before = self.snapshot
        self.refresh()
        self._attempted = latest
        return self.snapshot is not before

    def refresh(self) -> None:
        """Load the newest valid version; the new snapshot replaces the old in one assignment."""
        try:
            loaded, skipped = self.store.load_latest_valid()
        except ModelStoreError as error:
            self.last_error = str(error)
            log.warning("no model version loaded: %s", error)
            return
        for problem in skipped:
            log.warning("skipped a model version: %s", problem)
        if self.snapshot is None or self.snapshot.loaded.manifest.version != loaded.manifest.version:
            self.snapshot = Snapshot.of(loaded)
            log.info("loaded model version %s", loaded.manifest.version)
        self.last_error = "; ".join(skipped) or None

    def require(self) -> Snapshot:
        snapshot = self.snapshot
        if snapshot is None:
            raise ModelStoreError(self.last_error or "no model version loaded")
        return snapshot

    def recommendation(self, key: WorkloadKey) -> WorkloadRecommendation:
        found = self.require().by_key.get(key)
        if found is None:
            raise UnknownWorkloadError(f"no recommendation for {key}")
        return found


def timeline_of(snapshot: Snapshot | None) -> Timeline:
    """The time axis of a snapshot's lines (the default day when none is loaded), for building node views."""
    if snapshot is None:
        return DEFAULT_TIMELINE
    found = snapshot.loaded.recommendations
    steps = max(1, found.horizon_seconds // found.step_seconds)
    return Timeline(found.as_of, found.step_seconds, steps)
