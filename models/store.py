"""The model store: versioned, atomically published training results that training writes and serving reads.

Layout under the store root:
    versions/<version>/manifest.json        what was trained on, with what, and checksums of the files below
    versions/<version>/recommendations.json the RecommendationSet at the end of the training window
    versions/<version>/model.joblib         the fitted WorkloadRecommender (for incremental training)
    versions/<version>/nodes.joblib         the fitted NodeForecaster, when the usage said where pods ran
    latest                                  the name of the newest published version

A version is written under `versions/.incoming-*`, flushed, and renamed into place; only then does `latest` move
(itself an atomic replace). A crash at any point leaves the previous version as it was. Loading verifies every
checksum and refuses a corrupt or partial version with an error that says which file is wrong.
It lives in `models/` because both the training pipeline (writer) and the service (reader) use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import joblib
from pydantic import BaseModel, Field, ValidationError

from models.nodes import NodeForecaster
from models.workload import WorkloadRecommender
from recommender import __version__
from recommender.atomic import atomic_write_bytes, atomic_write_text, fsync_directory
from recommender.errors import ModelStoreError
from recommender.resources import RecommendationSet

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
RECOMMENDATIONS = "recommendations.json"
MODEL = "model.joblib"
NODE_MODEL = "nodes.joblib"
INCOMING_PREFIX = ".incoming-"
#: An unfinished publish older than this is a crashed run's leftover and is removed.
STALE_INCOMING_SECONDS = 3600


class FileEntry(BaseModel):
    sha256: str
    bytes: int


class DataWindow(BaseModel):
    first_sample: int = Field(description="Oldest sample used, Unix seconds.")
    last_sample: int = Field(description="Newest sample used, Unix seconds.")
    as_of: int = Field(description="Decision time of the stored recommendations, Unix seconds.")


class Manifest(BaseModel):
    """Everything needed to trust, reproduce and compare a version."""

    schema_version: int
    version: str
    created_at: str
    package_version: str
    source: str = Field(description="Where the usage came from (file path or Prometheus URL).")
    data_window: DataWindow
    parameters: dict[str, Any] = Field(description="The settings the models were fitted with.")
    row_counts: dict[str, int]
    fit_metrics: dict[str, float]
    parent_version: str | None = Field(None, description="Version this one continued from (incremental training).")
    read_metrics: dict[str, float] = Field(default_factory=dict, description="Cost of reading the data (queries, bytes).")
    skipped: dict[str, str] = Field(default_factory=dict, description="Workload groups that could not be read, and why.")
    files: dict[str, FileEntry]


@dataclass(frozen=True)
class LoadedVersion:
    manifest: Manifest
    recommendations: RecommendationSet
    path: Path


class ModelStore:
    """Publish and load model versions under one directory."""

    def __init__(self, root: Path, retention_versions: int = 10) -> None:
        if retention_versions < 1:
            raise ValueError("retention_versions must be at least 1")
        self.root = Path(root)
        self.retention_versions = retention_versions

    @property
    def versions_dir(self) -> Path:
        return self.root / "versions"

    def versions(self) -> list[str]:
        """Published version names, oldest first (names sort by creation time)."""
        if not self.versions_dir.is_dir():
            return []
        return sorted(p.name for p in self.versions_dir.iterdir() if p.is_dir() and not p.name.startswith("."))

    def latest_name(self) -> str | None:
        pointer = self.root / "latest"
        if not pointer.is_file():
            return None
        name = pointer.read_text(encoding="utf-8").strip()
        return name or None

    def publish(
        self,
        recommendations: RecommendationSet,
        model: WorkloadRecommender,
        *,
        source: str,
        parameters: dict[str, Any],
        row_counts: dict[str, int],
        fit_metrics: dict[str, float],
        data_window: DataWindow,
        parent_version: str | None = None,
        read_metrics: dict[str, float] | None = None,
        skipped: dict[str, str] | None = None,
        node_model: NodeForecaster | None = None,
    ) -> Manifest:
        """Write a new version and move `latest` to it; returns its manifest. Old versions beyond retention go."""
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_incoming()
        name = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ") + "-" + secrets.token_hex(3)
        incoming = self.versions_dir / (INCOMING_PREFIX + name)
        incoming.mkdir()
        try:
            files = {
                RECOMMENDATIONS: self._write(incoming / RECOMMENDATIONS, recommendations.model_dump_json().encode()),
                MODEL: self._write_model(incoming / MODEL, model),
            }
            if node_model is not None:
                files[NODE_MODEL] = self._write_model(incoming / NODE_MODEL, node_model)
            manifest = Manifest(
                schema_version=SCHEMA_VERSION,
                version=name,
                created_at=datetime.now(UTC).isoformat(timespec="seconds"),
                package_version=__version__,
                source=source,
                data_window=data_window,
                parameters=parameters,
                row_counts=row_counts,
                fit_metrics=fit_metrics,
                parent_version=parent_version,
                read_metrics=read_metrics or {},
                skipped=skipped or {},
                files=files,
            )
            self._write(incoming / MANIFEST, manifest.model_dump_json(indent=2).encode())
            fsync_directory(incoming)
            os.rename(incoming, self.versions_dir / name)
            fsync_directory(self.versions_dir)
        except BaseException:
            shutil.rmtree(incoming, ignore_errors=True)
            raise
        atomic_write_text(self.root / "latest", name + "\n")
        self._prune(keep=name)
        return manifest

    @staticmethod
    def _write(path: Path, data: bytes) -> FileEntry:
        atomic_write_bytes(path, data)
        return FileEntry(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))

    def _write_model(self, path: Path, model: WorkloadRecommender | NodeForecaster) -> FileEntry:
        buffer = io.BytesIO()
        joblib.dump(model, buffer, compress=3)
        return self._write(path, buffer.getvalue())

    def _prune(self, keep: str) -> None:
        names = self.versions()
        for old in names[: max(0, len(names) - self.retention_versions)]:
            if old != keep:
                shutil.rmtree(self.versions_dir / old, ignore_errors=True)

    def _remove_stale_incoming(self) -> None:
        now = time.time()
        for path in self.versions_dir.glob(INCOMING_PREFIX + "*"):
            if now - path.stat().st_mtime > STALE_INCOMING_SECONDS:
                shutil.rmtree(path, ignore_errors=True)

    def _version_path(self, name: str | None) -> Path:
        if name is None:
            name = self.latest_name()
            if name is None:
                raise ModelStoreError(f"{self.root}: no model version published yet (run `recommender train`)")
        if "/" in name or name.startswith("."):
            raise ModelStoreError(f"{self.root}: {name!r} is not a version name")
        path = self.versions_dir / name
        if not path.is_dir():
            raise ModelStoreError(f"{path}: version {name} does not exist")
        return path

    def manifest(self, name: str | None = None) -> Manifest:
        """The verified manifest of a version (latest by default)."""
        path = self._version_path(name)
        manifest_path = path / MANIFEST
        try:
            manifest = Manifest.model_validate_json(manifest_path.read_bytes())
        except FileNotFoundError:
            raise ModelStoreError(f"{manifest_path}: missing; the version is partial") from None
        except ValidationError as error:
            raise ModelStoreError(f"{manifest_path}: not a valid manifest: {error.errors()[0]['msg']}") from None
        if manifest.schema_version != SCHEMA_VERSION:
            raise ModelStoreError(
                f"{manifest_path}: schema version {manifest.schema_version}, this release reads {SCHEMA_VERSION}"
            )
        return manifest

    def _verified_bytes(self, path: Path, manifest: Manifest, filename: str) -> bytes:
        entry = manifest.files.get(filename)
        if entry is None:
            raise ModelStoreError(f"{path}: the manifest lists no {filename}")
        try:
            data = (path / filename).read_bytes()
        except FileNotFoundError:
            raise ModelStoreError(f"{path / filename}: missing; the version is partial") from None
        if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise ModelStoreError(f"{path / filename}: checksum does not match the manifest; the file is corrupt")
        return data

    def load(self, name: str | None = None) -> LoadedVersion:
        """Load and verify one version's recommendations (latest by default)."""
        path = self._version_path(name)
        manifest = self.manifest(path.name)
        data = self._verified_bytes(path, manifest, RECOMMENDATIONS)
        try:
            recommendations = RecommendationSet.model_validate_json(data)
        except ValidationError as error:
            raise ModelStoreError(f"{path / RECOMMENDATIONS}: not a valid recommendation set: {error}") from None
        return LoadedVersion(manifest=manifest, recommendations=recommendations, path=path)

    def load_latest_valid(self) -> tuple[LoadedVersion, list[str]]:
        """The newest version that verifies, and the problems of any newer ones skipped on the way."""
        problems: list[str] = []
        latest = self.latest_name()
        candidates = [latest] if latest else []
        candidates += [n for n in reversed(self.versions()) if n != latest]
        for name in candidates:
            try:
                return self.load(name), problems
            except ModelStoreError as error:
                problems.append(str(error))
        raise ModelStoreError("; ".join(problems) or f"{self.root}: no model version published yet (run `recommender train`)")

    def load_model(self, name: str | None = None) -> WorkloadRecommender:
        """The fitted estimator of a version, after its checksum is verified (for incremental training)."""
        path = self._version_path(name)
        manifest = self.manifest(path.name)
        self._verified_bytes(path, manifest, MODEL)
        model = joblib.load(path / MODEL)
        if not isinstance(model, WorkloadRecommender):
            raise ModelStoreError(f"{path / MODEL}: holds a {type(model).__name__}, not a WorkloadRecommender")
        return model

    def load_node_model(self, name: str | None = None) -> NodeForecaster | None:
        """The fitted node model of a version (None when it has none), after its checksum is verified."""
        path = self._version_path(name)
        manifest = self.manifest(path.name)
        if NODE_MODEL not in manifest.files:
            return None
        self._verified_bytes(path, manifest, NODE_MODEL)
        model = joblib.load(path / NODE_MODEL)
        if not isinstance(model, NodeForecaster):
            raise ModelStoreError(f"{path / NODE_MODEL}: holds a {type(model).__name__}, not a NodeForecaster")
        return model


def manifest_summary(manifest: Manifest) -> dict[str, Any]:
    """The manifest as plain JSON data (for `show --format json` and the API)."""
    result: dict[str, Any] = json.loads(manifest.model_dump_json())
    return result
