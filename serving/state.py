"""What the service has loaded: one verified model version, or the live loop's newest light update of it, swapped
as a whole so no request sees half of one."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from models.store import LiveUpdate, LoadedVersion, ModelStore
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
    #: The live loop's update whose recommendations `loaded` holds (None: the version's own).
    live: LiveUpdate | None = None

    @classmethod
    def of(cls, loaded: LoadedVersion, live: LiveUpdate | None = None) -> Snapshot:
        return cls(loaded, {r.key: r for r in loaded.recommendations.recommendations}, live)

    def lookup(self, key: WorkloadKey) -> WorkloadRecommendation | None:
        return self.by_key.get(key)

    @property
    def version(self) -> str:
        return self.loaded.manifest.version

    @property
    def revision(self) -> str:
        """The version, and the live update when one is served: what ETags and caches key on."""
        return self.live.revision if self.live is not None else self.version

    def age_seconds(self, now: float | None = None) -> float:
        """Now minus the decision time of the served lines (the live update's, else the version's)."""
        return (time.time() if now is None else now) - self.loaded.recommendations.as_of


class ServiceState:
    """Holds the current snapshot; `refresh` loads the newest valid version and keeps the old one on failure."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.snapshot: Snapshot | None = None
        self.last_error: str | None = None
        self.live_error: str | None = None
        self._attempted: str | None = None
        self._live_attempted: str | None = None

    def refresh_if_published(self) -> bool:
        """Reload when `latest` names a version not yet tried, or the live loop published a newer update of the
        loaded one (two small reads per poll); True if something new loaded.

        A `latest` that failed to load is not retried every poll; the next publish moves it and is tried.
        """
        latest = self.store.latest_name()
        before = self.snapshot
        if self.snapshot is None or latest != self._attempted:
            self.refresh()
            self._attempted = latest
        else:
            self._follow_live()
        return self.snapshot is not before

    def _follow_live(self) -> None:
        """Serve the newest light update when it continues the loaded version (an update of an older version is
        ignored: the newer version is what it would have continued); a broken one leaves the lines as they are."""
        snapshot = self.snapshot
        if snapshot is None:
            return
        try:
            update = self.store.live_update()
            if update is None or update.version != snapshot.version or update.revision == self._live_attempted:
                return
            self._live_attempted = update.revision
            recommendations = self.store.load_live(update)
        except ModelStoreError as error:
            self.live_error = str(error)
            log.warning("live update not loaded, serving the previous lines: %s", error)
            return
        self.live_error = None
        self.snapshot = Snapshot.of(replace(snapshot.loaded, recommendations=recommendations), update)
        log.debug("serving live update %s", update.revision)

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
            self._live_attempted = None
            log.info("loaded model version %s", loaded.manifest.version)
        self.last_error = "; ".join(skipped) or None
        self._follow_live()

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
